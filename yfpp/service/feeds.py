"""Feeds in: TCP listeners (XML or JSON lines), files / stdin, HTTP bodies — all read by ``yfpp.input.readers``.

Each source is read in its own thread by the same readers as ``yfpp run`` (so
the same dead letters), and every event goes into the service's one inbox; the
engine thread merges them in arrival order and its ``max_delay`` reorder
buffer puts them in ts order.  Seq numbers are the engine's (global arrival
order), not the reader's per-source record index.
"""

from __future__ import annotations

import io
import logging
import os
import socket
import socketserver
import sys
import threading
import time
from typing import Any, Callable

from yfpp.input.dead_letters import DeadLetters
from yfpp.errors import YfppError
from yfpp.input.events import Event
from yfpp.input.readers import read_events

log = logging.getLogger("yfpp.service.feeds")


LOST_LOG_EVERY = 60.0  #: seconds between two log lines about a failing dead-letter output


class SharedDeadLetters(DeadLetters):
    """The service's dead-letter output: reports from several threads, one whole line each; a file is
    appended to, so a restart keeps what the earlier runs reported.

    A report the output cannot take (a full disk, a closed pipe) never raises: it is
    counted in ``count`` and ``lost``, and logged once per :data:`LOST_LOG_EVERY` seconds.
    ``count`` goes on from a restored checkpoint's; ``reported`` and ``lost`` count this process's reports.
    """

    def __init__(self, out: Any):
        try:
            super().__init__(out, append=True)
        except OSError as e:
            raise YfppError(f"dead-letter file {out}: {e.strerror or e}") from e
        self._lock = threading.Lock()
        self.reported = 0  #: reports taken since this process started
        self.lost = 0  #: reports counted but not written
        self.failing: str | None = None  #: the output's last error, while writing fails
        self._logged_at = float("-inf")

    def report(self, seq: int, position: str, reason: str, raw: str | None = None) -> None:
        with self._lock:
            self.reported += 1
            try:
                super().report(seq, position, reason, raw)
            except (OSError, ValueError) as e:  # ValueError: the stream was closed
                self._lost(e)
                return
            if self.failing is not None:
                self.failing = None
                log.warning("dead-letter output recovered", extra={"lost": self.lost})

    def _lost(self, error: Exception) -> None:
        self.lost += 1
        self.failing = (error.strerror if isinstance(error, OSError) else None) or str(error)
        now = time.monotonic()
        if now - self._logged_at >= LOST_LOG_EVERY:
            self._logged_at = now
            log.error("dead-letter output failing: reports are counted but not written",
                      extra={"lost": self.lost, "error": self.failing})

    def close(self) -> None:
        with self._lock:
            try:
                super().close()
            except (OSError, ValueError) as e:  # what was buffered could not be written
                self._lost(e)


class SourceDeadLetters(DeadLetters):
    """One source's dead letters: counted here and forwarded with the source's name in the position."""

    def __init__(self, source: str, shared: DeadLetters):
        super().__init__(None)
        self.source = source
        self.shared = shared

    def report(self, seq: int, position: str, reason: str, raw: str | None = None) -> None:
        super().report(seq, position, reason, raw)
        self.shared.report(seq, f"{self.source} {position}", reason, raw)


Put = Callable[[list[Event]], None]  #: hands a batch to the engine thread; raises FeedClosed when the service stops

BATCH = 256  #: events handed over at once (fewer when the source has nothing more to read yet)


class FeedClosed(Exception):
    """The service is stopping: the feed stops reading."""


class _FlushBeforeRead(io.RawIOBase):
    """A raw stream over ``source`` that calls ``before_read`` each time it is about to read (and maybe wait).

    Under a BufferedReader this is exactly "the buffered bytes are used up", so a
    feed hands over its partial batch before it waits for more input: batching
    never delays an event on a quiet feed.
    """

    def __init__(self, source: Any, before_read: Callable[[], None]):
        self._read = getattr(source, "readinto1", None) or source.readinto
        self._before_read = before_read
        self.name = getattr(source, "name", "")

    def readable(self) -> bool:
        return True

    def readinto(self, buf: Any) -> int:
        self._before_read()
        return self._read(buf)


def pump(source: Any, fmt: str | None, name: str, put: Put, shared: DeadLetters,
         read_opts: dict[str, Any]) -> tuple[int, int, bool]:
    """Read every event of ``source`` (a path, ``-`` or a binary stream) into ``put`` in batches; return
    (events ``put`` took, the first of the source in order; dead letters; whether the service stopped the
    reading). Never raises for bad input."""
    dl = SourceDeadLetters(name, shared)
    batch: list[Event] = []
    n = 0

    def hand_over() -> None:
        nonlocal n
        if batch:
            put(batch[:])
            n += len(batch)
            batch.clear()

    if source == "-":
        source = sys.stdin.buffer
    if not isinstance(source, (str, os.PathLike)):
        source = io.BufferedReader(_FlushBeforeRead(source, hand_over), 65536)
    try:
        try:
            for ev in read_events(source, fmt, dead_letters=dl, **read_opts):
                batch.append(ev)
                if len(batch) >= BATCH:
                    hand_over()
        except YfppError as e:  # unreadable input (InputError): one dead letter for the rest of the source
            dl.report(-1, "input", f"unreadable input: {e}")
        except OSError as e:  # the connection broke
            log.info("feed ended", extra={"feed": name, "error": str(e)})
        hand_over()  # the events read before the end, or before the error
    except FeedClosed:
        return n, dl.count, True
    return n, dl.count, False


class TcpFeed(socketserver.ThreadingTCPServer):
    """A TCP listener: every connection is one stream of ``fmt`` read into ``put`` (a thread each)."""

    daemon_threads = True
    block_on_close = False
    allow_reuse_address = True
    request_queue_size = 128  #: connections the kernel holds until accepted (socketserver's default, 5, stalls bursts)

    def __init__(self, host: str, port: int, fmt: str, put: Put, shared: DeadLetters, read_opts: dict[str, Any],
                 max_connections: int):
        self.fmt, self.put, self.shared, self.read_opts = fmt, put, shared, read_opts
        self._slots = threading.BoundedSemaphore(max_connections)
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        try:
            super().__init__((host, port), _FeedHandler)
        except OSError as e:
            raise YfppError(f"cannot listen for {fmt} feeds on {host}:{port}: {e.strerror or e}") from e
        self.thread = threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.2},
                                       name=f"{fmt} feed :{self.port}", daemon=True)

    @property
    def port(self) -> int:
        return self.server_address[1]

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        """Stop accepting, and end the open connections (their readers see end of input)."""
        self.shutdown()
        self.server_close()
        with self._lock:
            for s in self._open:
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass


class _FeedHandler(socketserver.StreamRequestHandler):
    server: TcpFeed

    def handle(self) -> None:
        srv = self.server
        peer = "%s:%s" % self.client_address[:2]
        if not srv._slots.acquire(blocking=False):
            self.wfile.write(b"yfpp: too many feed connections\n")
            log.warning("feed refused: too many connections", extra={"feed": f"tcp {peer}"})
            return
        with srv._lock:
            srv._open.add(self.connection)
        try:
            name = f"{srv.fmt} feed {peer}"
            log.info("feed connected", extra={"feed": name})
            n, bad, _ = pump(self.connection.makefile("rb", buffering=0), srv.fmt, name, srv.put, srv.shared, srv.read_opts)
            log.info("feed closed", extra={"feed": name, "events": n, "dead_letters": bad})
        finally:
            with srv._lock:
                srv._open.discard(self.connection)
            srv._slots.release()


def start_input(path: str, fmt: str | None, put: Put, shared: DeadLetters, read_opts: dict[str, Any]) -> threading.Thread:
    """Read a file (or ``-``, stdin) once, in a thread."""
    def run() -> None:
        n, bad, _ = pump(path, fmt, f"input {path}", put, shared, read_opts)
        log.info("input read", extra={"feed": path, "events": n, "dead_letters": bad})

    t = threading.Thread(target=run, name=f"input {path}", daemon=True)
    t.start()
    return t
