"""Feeds in: TCP listeners (XML or JSON lines), files / stdin, HTTP bodies — all read by ``yfpp.input.readers``.

Each source is read in its own thread by the same readers as ``yfpp run`` (so
the same dead letters), and every event goes into the service's one inbox; the
engine thread merges them in arrival order and its ``max_delay`` reorder
buffer puts them in ts order.  Seq numbers are the engine's (global arrival
order), not the reader's per-source record index.
"""

from __future__ import annotations

import dataclasses
import io
import logging
import os
import socket
import ssl
import socketserver
import sys
import threading
import time
from collections import Counter
from typing import TYPE_CHECKING, Any, Callable

from yfpp.input.dead_letters import DeadLetters
from yfpp.errors import YfppError
from yfpp.input.events import Event
from yfpp.input.readers import read_events

if TYPE_CHECKING:
    from yfpp.service.auth import Keys

log = logging.getLogger("yfpp.service.feeds")


LOST_LOG_EVERY = 60.0  #: seconds between two log lines about a failing dead-letter output


class SharedDeadLetters(DeadLetters):
    """The service's dead-letter output: reports from several threads, one whole line each; a file is
    appended to, so a restart keeps what the earlier runs reported.

    A report the output cannot take (a full disk, a closed pipe) never raises: it is
    counted in ``count`` and ``lost``, and logged once per :data:`LOST_LOG_EVERY` seconds.
    ``count`` goes on from a restored checkpoint's; ``reported`` and ``lost`` count this process's reports.
    At most ``per_second`` reports a second are written (a burst of as many; the others are counted in
    ``suppressed``), and a file (created readable by its owner only) that reaches ``max_bytes`` is renamed
    FILE.1 (replacing the one before) and started again.
    """

    def __init__(self, out: Any, per_second: float = float("inf"), max_bytes: int | None = None):
        self.path = out if isinstance(out, (str, os.PathLike)) else None
        try:
            if self.path is not None:
                os.close(os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600))
            super().__init__(out, append=True)
        except OSError as e:
            raise YfppError(f"dead-letter file {out}: {e.strerror or e}") from e
        self._lock = threading.Lock()
        self.reported = 0  #: reports taken since this process started
        self.lost = 0  #: reports counted but not written
        self.suppressed = 0  #: reports counted but not written, over the rate
        self.failing: str | None = None  #: the output's last error, while writing fails
        self._logged_at = float("-inf")
        self.per_second, self.max_bytes = per_second, max_bytes
        self._tokens, self._filled_at = min(per_second, 1e9), time.monotonic()

    def _allowed(self) -> bool:
        """Whether the rate lets one more report be written now (a token bucket of ``per_second``)."""
        now = time.monotonic()
        self._tokens = min(self.per_second, self._tokens + (now - self._filled_at) * self.per_second)
        self._filled_at = now
        if self._tokens >= 1:
            self._tokens -= 1
            return True
        return False

    def report(self, seq: int, position: str, reason: str, raw: str | None = None) -> None:
        with self._lock:
            self.reported += 1
            if not self._allowed():
                self.suppressed += 1
                out, self._out = self._out, None  # counted as any report, not written
                try:
                    super().report(seq, position, reason, raw)
                finally:
                    self._out = out
                return
            try:
                super().report(seq, position, reason, raw)
                self._rotate()
            except (OSError, ValueError) as e:  # ValueError: the stream was closed
                self._lost(e)
                return
            if self.failing is not None:
                self.failing = None
                log.warning("dead-letter output recovered", extra={"lost": self.lost})

    def _rotate(self) -> None:
        """A file at ``max_bytes`` or more becomes FILE.1; a new FILE follows."""
        if self.path is None or self.max_bytes is None or self._out is None or self._out.tell() < self.max_bytes:
            return
        self._out.close()
        os.replace(self.path, f"{os.fspath(self.path)}.1")
        os.close(os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600))
        self._out = open(self.path, "a", encoding="utf-8", errors="backslashreplace")

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
        self.first: str | None = None  #: the first one's position and reason

    def report(self, seq: int, position: str, reason: str, raw: str | None = None) -> None:
        super().report(seq, position, reason, raw)
        if self.first is None:
            self.first = f"{position}: {reason}"
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
         read_opts: dict[str, Any], dl: SourceDeadLetters | None = None) -> tuple[int, int, bool]:
    """Read every event of ``source`` (a path, ``-`` or a binary stream) into ``put`` in batches; return
    (events ``put`` took, the first of the source in order; dead letters; whether the service stopped the
    reading). Never raises for bad input. ``dl``: the source's dead letters (default: made here)."""
    dl = dl if dl is not None else SourceDeadLetters(name, shared)
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


@dataclasses.dataclass
class FeedLimits:
    """The bounds of a feed port: connections at once, of them per key, and seconds a connection may be quiet."""

    connections: int = 64
    per_key: int = 8
    idle_timeout: float = 300.0


AUTH_TIMEOUT = 5.0  #: seconds a connection has to send its AUTH line
AUTH_LINE = 512  #: bytes an AUTH line may have


class TcpFeed(socketserver.ThreadingTCPServer):
    """A TCP listener: every connection is one stream of ``fmt`` read into ``put`` (a thread each). With
    ``keys`` enabled, a connection first sends ``AUTH <feed key>`` and a newline (docs/service.md, "Security");
    with ``tls``, it speaks TLS (the handshake in the connection's thread, bounded by :data:`AUTH_TIMEOUT`)."""

    daemon_threads = True
    block_on_close = False
    allow_reuse_address = True
    request_queue_size = 128  #: connections the kernel holds until accepted (socketserver's default, 5, stalls bursts)

    def __init__(self, host: str, port: int, fmt: str, put: Put, shared: DeadLetters, read_opts: dict[str, Any],
                 limits: FeedLimits, keys: "Keys | None" = None, tls: ssl.SSLContext | None = None):
        self.fmt, self.put, self.shared, self.read_opts = fmt, put, shared, read_opts
        self.limits, self.keys, self.tls = limits, keys, tls
        self._slots = threading.BoundedSemaphore(limits.connections)
        self._open: dict[socket.socket, str] = {}  # each open connection and its key id
        self._per_key: Counter[str] = Counter()
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

    def get_request(self) -> tuple[socket.socket, Any]:
        """An accepted connection, wrapped for TLS when the feed has it (no handshake yet: see :meth:`secure`)."""
        conn, addr = super().get_request()
        if self.tls is not None:
            conn = self.tls.wrap_socket(conn, server_side=True, do_handshake_on_connect=False)
        return conn, addr

    def secure(self, conn: socket.socket) -> bool:
        """The TLS handshake of a connection (True without TLS); False when it fails or takes too long."""
        if not isinstance(conn, ssl.SSLSocket):
            return True
        conn.settimeout(AUTH_TIMEOUT)
        try:
            conn.do_handshake()
        except (OSError, ValueError):  # (ssl.SSLError is an OSError)
            return False
        return True

    def stop(self) -> None:
        """Stop accepting, and end the open connections (their readers see end of input)."""
        self.shutdown()
        self.server_close()
        self._end(lambda kid: True)

    def drop(self, kid: str) -> None:
        """End the connections of key ``kid`` (revoked)."""
        self._end(lambda k: k == kid)

    def _end(self, which: Callable[[str], bool]) -> None:
        with self._lock:
            for s, kid in self._open.items():
                if which(kid):
                    try:
                        s.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass

    def authenticate(self, conn: socket.socket) -> str | None:
        """The key id of a connection (``admin`` when the service is open), read from its AUTH line; None if it
        sent none, a wrong one, or a key that is not a feed key."""
        if self.keys is None or not self.keys.enabled:
            return "admin"
        conn.settimeout(AUTH_TIMEOUT)
        line = bytearray()
        try:
            while len(line) < AUTH_LINE and not line.endswith(b"\n"):
                byte = conn.recv(1)  # (one at a time: what follows the line is the feed's, read by pump)
                if not byte:
                    return None
                line += byte
        except OSError:
            return None
        word, _, key = bytes(line).strip().partition(b" ")
        if word != b"AUTH":
            return None
        who = self.keys.authenticate(key.decode("ascii", "replace").strip())
        return who.key_id if who is not None and who.may("feed") else None


class _FeedHandler(socketserver.StreamRequestHandler):
    server: TcpFeed

    def handle(self) -> None:
        srv = self.server
        peer = "%s:%s" % self.client_address[:2]
        if not srv.secure(self.connection):
            log.warning("feed refused: no TLS handshake", extra={"feed": f"tcp {peer}"})
            return
        kid = srv.authenticate(self.connection)
        if kid is None:
            self.wfile.write(b"yfpp: unauthorised: send 'AUTH <feed key>' and a newline first\n")
            log.warning("feed refused: not authenticated", extra={"feed": f"tcp {peer}"})
            return
        with srv._lock:
            crowded = srv._per_key[kid] >= srv.limits.per_key and kid != "admin"
            if not crowded:
                srv._per_key[kid] += 1
        if crowded:
            self.wfile.write(b"yfpp: too many feed connections of this key\n")
            log.warning("feed refused: too many connections of one key", extra={"feed": f"tcp {peer}", "key": kid})
            return
        if not srv._slots.acquire(blocking=False):
            with srv._lock:
                srv._per_key[kid] -= 1
            self.wfile.write(b"yfpp: too many feed connections\n")
            log.warning("feed refused: too many connections", extra={"feed": f"tcp {peer}"})
            return
        self.connection.settimeout(srv.limits.idle_timeout)  # a quiet connection ends (pump sees a timeout)
        with srv._lock:
            srv._open[self.connection] = kid
        try:
            name = f"{srv.fmt} feed {peer}"
            log.info("feed connected", extra={"feed": name})
            n, bad, _ = pump(self.connection.makefile("rb", buffering=0), srv.fmt, name, srv.put, srv.shared, srv.read_opts)
            log.info("feed closed", extra={"feed": name, "events": n, "dead_letters": bad})
        finally:
            with srv._lock:
                srv._open.pop(self.connection, None)
                srv._per_key[kid] -= 1
            srv._slots.release()


def start_input(path: str, fmt: str | None, put: Put, shared: DeadLetters, read_opts: dict[str, Any]) -> threading.Thread:
    """Read a file (or ``-``, stdin) once, in a thread."""
    def run() -> None:
        n, bad, _ = pump(path, fmt, f"input {path}", put, shared, read_opts)
        log.info("input read", extra={"feed": path, "events": n, "dead_letters": bad})

    t = threading.Thread(target=run, name=f"input {path}", daemon=True)
    t.start()
    return t
