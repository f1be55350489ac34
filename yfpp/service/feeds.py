"""Feeds in: TCP listeners (XML or JSON lines), files / stdin, HTTP bodies — all read by ``yfpp.readers``.

Each source is read in its own thread by the same readers as ``yfpp run`` (so
the same dead letters), and every event goes into the service's one inbox; the
engine thread merges them in arrival order and its ``max_delay`` reorder
buffer puts them in ts order.  Seq numbers are the engine's (global arrival
order), not the reader's per-source record index.
"""

from __future__ import annotations

import logging
import socket
import socketserver
import threading
from typing import Any, Callable

from yfpp.dead_letters import DeadLetters
from yfpp.errors import YfppError
from yfpp.events import Event
from yfpp.readers import read_events

log = logging.getLogger("yfpp.service.feeds")


class SharedDeadLetters(DeadLetters):
    """The service's dead-letter output: reports from several threads, one whole line each."""

    def __init__(self, out: Any):
        super().__init__(out)
        self._lock = threading.Lock()

    def report(self, seq: int, position: str, reason: str, raw: str | None = None) -> None:
        with self._lock:
            super().report(seq, position, reason, raw)


class SourceDeadLetters(DeadLetters):
    """One source's dead letters: counted here and forwarded with the source's name in the position."""

    def __init__(self, source: str, shared: DeadLetters):
        super().__init__(None)
        self.source = source
        self.shared = shared

    def report(self, seq: int, position: str, reason: str, raw: str | None = None) -> None:
        super().report(seq, position, reason, raw)
        self.shared.report(seq, f"{self.source} {position}", reason, raw)


Put = Callable[[Event], None]  #: hands an event to the engine thread; raises FeedClosed when the service stops


class FeedClosed(Exception):
    """The service is stopping: the feed stops reading."""


def pump(source: Any, fmt: str | None, name: str, put: Put, shared: DeadLetters, read_opts: dict[str, Any]) -> tuple[int, int]:
    """Read every event of ``source`` into ``put``; return (events, dead letters). Never raises for bad input."""
    dl = SourceDeadLetters(name, shared)
    n = 0
    try:
        for ev in read_events(source, fmt, dead_letters=dl, **read_opts):
            put(ev)
            n += 1
    except YfppError as e:  # unreadable input (InputError): one dead letter for the rest of the source
        dl.report(-1, "input", f"unreadable input: {e}")
    except FeedClosed:
        pass
    except OSError as e:  # the connection broke
        log.info("feed ended", extra={"feed": name, "error": str(e)})
    return n, dl.count


class TcpFeed(socketserver.ThreadingTCPServer):
    """A TCP listener: every connection is one stream of ``fmt`` read into ``put`` (a thread each)."""

    daemon_threads = True
    block_on_close = False
    allow_reuse_address = True

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
            n, bad = pump(self.rfile, srv.fmt, name, srv.put, srv.shared, srv.read_opts)
            log.info("feed closed", extra={"feed": name, "events": n, "dead_letters": bad})
        finally:
            with srv._lock:
                srv._open.discard(self.connection)
            srv._slots.release()


def start_input(path: str, fmt: str | None, put: Put, shared: DeadLetters, read_opts: dict[str, Any]) -> threading.Thread:
    """Read a file (or ``-``, stdin) once, in a thread."""
    def run() -> None:
        n, bad = pump(path, fmt, f"input {path}", put, shared, read_opts)
        log.info("input read", extra={"feed": path, "events": n, "dead_letters": bad})

    t = threading.Thread(target=run, name=f"input {path}", daemon=True)
    t.start()
    return t
