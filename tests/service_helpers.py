"""Loopback helpers for the service tests: a TCP result listener, feeding, waiting — all bounded in time."""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.request
from typing import Any, Callable

import pytest

TIMEOUT = 10.0


class LineListener:
    """A TCP listener on 127.0.0.1 collecting the lines every connection sends (``read=False``: never reads;
    ``listen=False``: its port refuses connections until :meth:`listen`)."""

    def __init__(self, read: bool = True, rcvbuf: int | None = None, listen: bool = True):
        self.sock = socket.socket()
        if rcvbuf:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.read = read
        self.lines: list[bytes] = []
        self.conns: list[socket.socket] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        if listen:
            self.listen()

    def listen(self) -> None:
        self.sock.listen()
        self._thread.start()

    @property
    def url(self) -> str:
        return f"tcp://127.0.0.1:{self.port}"

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except (socket.timeout, OSError):
                continue
            self.conns.append(conn)
            if self.read:
                threading.Thread(target=self._read, args=(conn,), daemon=True).start()

    def _read(self, conn: socket.socket) -> None:
        conn.settimeout(0.2)
        buf = b""
        while not self._stop.is_set():
            try:
                data = conn.recv(65536)
            except socket.timeout:
                continue
            except OSError:
                return
            if not data:
                return
            buf += data
            *done, buf = buf.split(b"\n")
            self.lines.extend(done)

    def drain(self, timeout: float = TIMEOUT) -> list[bytes]:
        """(``read=False``) Every line its connections hold, read until each peer has closed."""
        end = time.monotonic() + timeout
        lines: list[bytes] = []
        for conn in list(self.conns):
            conn.settimeout(max(0.1, end - time.monotonic()))
            buf = b""
            while data := conn.recv(65536):
                buf += data
            lines += buf.split(b"\n")[:-1]
        return lines

    def results(self) -> list[dict]:
        return [json.loads(x) for x in list(self.lines)]

    def wait_lines(self, n: int, timeout: float = TIMEOUT) -> list[bytes]:
        wait_for(lambda: len(self.lines) >= n, timeout, f"{n} lines (have {len(self.lines)})")
        return list(self.lines)

    def close(self) -> None:
        self._stop.set()
        if self._thread.ident is not None:
            self._thread.join(2)
        for c in self.conns:
            c.close()
        self.sock.close()


def wait_for(cond: Callable[[], Any], timeout: float = TIMEOUT, what: str = "condition") -> Any:
    end = time.monotonic() + timeout
    while True:
        v = cond()
        if v:
            return v
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.02)


def checkpoint_between(svc: Any, client: Any, events: list, cut: int, end: int) -> None:
    """Post ``events[:cut]``, take a periodic checkpoint once the service has them, then post
    ``events[cut:end]`` and wait until it has them too (a stop then checkpoints after that)."""
    client.post_events(jsonl(events[:cut]))
    wait_for(lambda: svc.events_in == cut, what="the first events taken")
    assert svc.save_checkpoint()  # (a periodic checkpoint: each child writes its share at the same point)
    client.post_events(jsonl(events[cut:end]))
    wait_for(lambda: svc.events_in == end, what="the next events taken")


def send(port: int, data: bytes, close: bool = True) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT)
    s.sendall(data)
    if close:
        s.close()
    return s


def jsonl(records: list[dict]) -> bytes:
    return b"".join(json.dumps(r).encode() + b"\n" for r in records)


def scrape(port: int) -> dict[str, float]:
    """``GET /metrics`` of the service on ``port``: each sample (name with its labels) and its value."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=TIMEOUT) as r:
        text = r.read().decode()
    return {name: float(value) for name, value in
            (line.rsplit(" ", 1) for line in text.splitlines() if line and not line.startswith("#"))}


@pytest.fixture
def listeners():
    """``listeners(**kw)`` makes a :class:`LineListener`; all are closed after the test (import the fixture)."""
    made: list[LineListener] = []

    def make(**kw) -> LineListener:
        made.append(LineListener(**kw))
        return made[-1]

    yield make
    for x in made:
        x.close()
