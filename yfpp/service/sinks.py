"""Where a subscription's results go: a bounded outbox per destination, written without blocking the loop.

The engine thread never waits for a destination: it hands results to the event
loop, which appends them to each destination's :class:`Outbox`.  An outbox holds
at most ``size`` results; when full, ``drop_oldest`` (the default) discards the
oldest queued result and ``drop_newest`` the arriving one, and either is counted
in ``dropped``.

A TCP sink is written from the loop itself, with no task per result: the first
result queued in a loop turn schedules one ``flush`` of the sink, which writes
everything queued (in chunks of :data:`CHUNK` results, one ``write`` each) to one
persistent connection, opened lazily (at its first result); it stops taking
results while the connection's send buffer is above :data:`HIGH_WATER`, so a slow
reader only fills its own outbox.  A webhook and a file sink send from a task of
their own, a batch at a time (a webhook up to :data:`BATCH` results per POST, a
file up to :data:`CHUNK` per write); a file sink opens and writes its file in a
thread of its own, so a file that blocks (a FIFO with no reader, or one that
does not read) holds up that sink only.  On an error, whatever it is (an
unexpected one too: a sink never dies of it), a sink records ``last_error`` and
retries with exponential backoff (0.1 s doubling to 10 s), keeping what is
queued: a failed batch goes back to the front of its outbox.
"""

from __future__ import annotations

import asyncio
import dataclasses
import ipaddress
import json
import logging
import queue
import re
import threading
import time
from collections import deque
from typing import Any, Callable
from urllib.parse import urlsplit
from xml.sax.saxutils import escape, quoteattr

import orjson

from yfpp.service.latency import Latency
from yfpp.service.sink_policy import CONNECT_FAILED, SinkPolicy, shown

log = logging.getLogger("yfpp.service.sinks")

BATCH = 256  #: results per webhook POST (and per pull-stream take)
CHUNK = 1024  #: results per write on a TCP or file sink
HIGH_WATER = 256 * 1024  #: bytes buffered on a TCP connection before its sink stops taking results
CONNECT_TIMEOUT = 5.0  #: seconds a TCP connect may take


@dataclasses.dataclass(eq=False)
class Counters:
    """The counts of one subscription's push sink, or of its pull streams (their ``delivered`` and ``dropped``),
    since this process registered it: what ``GET /subscriptions/{id}`` and the metrics show. Each count goes
    to ``totals`` too, the service's counts over all subscriptions (deleted ones included)."""

    totals: "Counters | None" = None
    matches: int = 0
    delivered: int = 0
    dropped: int = 0
    sink_errors: int = 0  #: failed connects, lost connections, failed writes or POSTs
    last_error: str | None = None
    last_error_at: float | None = None  #: Unix time
    #: where ``key`` (its subscription's id) is put at each change: the subscriptions whose counts a checkpoint
    #: writes again (``yfpp.service.counts_kept``)
    moved: set[str] | None = dataclasses.field(default=None, repr=False)
    key: str = ""

    def add(self, count: str, n: int = 1) -> None:
        """``n`` more of ``count`` (matches, delivered, dropped or sink_errors), here and in ``totals``."""
        setattr(self, count, getattr(self, count) + n)
        if self.moved is not None:
            self.moved.add(self.key)
        if self.totals is not None:
            self.totals.add(count, n)

    def touch(self) -> None:
        """Its subscription's outbox took a result not counted here (one the counts restored or an isolation
        engine counted): a checkpoint looks at it again."""
        if self.moved is not None:
            self.moved.add(self.key)

    def error(self, text: str) -> None:
        """A failure of the destination: counted, and its text kept as ``last_error``."""
        self.add("sink_errors")
        self.last_error, self.last_error_at = text, time.time()


class Outbox:
    """A bounded queue of results with a documented overflow policy (loop thread only).

    ``wake`` is called after each result queued: by default it wakes :meth:`take`;
    a loop-written sink replaces it with its own (cheap, idempotent) scheduling.
    Beside each result it keeps when its event arrived, for ``latency`` (recorded at :meth:`delivered`), and,
    with ``max_bytes``, its size as a JSON line: the queue holds at most ``size`` results and ``max_bytes`` bytes.
    A pull stream's queues hold each result encoded once for all of them (:func:`as_sse_event`), offered with
    that size.
    """

    def __init__(self, size: int, overflow: str, counters: Counters, latency: Latency | None = None,
                 max_bytes: int | None = None):
        self.size = size
        self.max_bytes = max_bytes
        self.bytes = 0  #: the queued results' size as JSON lines (counted with max_bytes only)
        self.sizes: deque[int] = deque()  #: each queued result's (with max_bytes)
        self.overflow = overflow
        self.counters = counters
        self.latency = latency
        self.items: deque[Any] = deque()  #: the results (dicts; a pull stream's: their events, bytes)
        self.arrivals: deque[float] = deque()  #: the ``time.monotonic()`` of each queued result's event
        self.taken: list[float] = []  #: the arrivals of the results taken last
        self.in_flight = 0  #: results taken by a sender and not yet delivered or given back
        self.sending: list[dict] = []  #: those results (a checkpoint keeps them with the queued ones)
        #: results counted delivered that may not have left the process yet (a TCP connection's send buffer)
        self.unsent: Callable[[], list[dict]] = list
        self._ready = asyncio.Event()
        self.wake: Callable[[], None] = self._ready.set

    def offer(self, result: Any, arrived: float | None = None, size: int | None = None) -> None:
        """Queue ``result``, whose event arrived at ``arrived`` (default: now); ``size``: its JSON line's length
        (default: encoded here, when ``max_bytes`` counts it)."""
        if self.max_bytes is not None:
            self._offer_sized(result, arrived, len(as_json_line(result)) if size is None else size)
            return
        if len(self.items) >= self.size:
            self.counters.add("dropped")
            if self.overflow == "drop_newest":
                return
            self.items.popleft()
            self.arrivals.popleft()
        self.items.append(result)
        self.arrivals.append(time.monotonic() if arrived is None else arrived)
        self.wake()

    def _offer_sized(self, result: Any, arrived: float | None, n: int) -> None:
        """:meth:`offer` under ``max_bytes`` as well, of a result of ``n`` bytes: the oldest results make room
        (or, with drop_newest, the new one is dropped); a result larger than the whole queue is dropped."""
        items, limit = self.items, self.max_bytes
        assert limit is not None
        if n > limit:
            self.counters.add("dropped")
            return
        while items and (len(items) >= self.size or self.bytes + n > limit):
            self.counters.add("dropped")
            if self.overflow == "drop_newest":
                return
            items.popleft()
            self.arrivals.popleft()
            self.bytes -= self.sizes.popleft()
        items.append(result)
        self.arrivals.append(time.monotonic() if arrived is None else arrived)
        self.sizes.append(n)
        self.bytes += n
        self.wake()

    def take_now(self, most: int) -> list[dict]:
        """Up to ``most`` queued results, oldest first (possibly none)."""
        items, arrivals = self.items, self.arrivals
        n = min(most, len(items))
        self.taken = [arrivals.popleft() for _ in range(n)]
        if self.max_bytes is not None:
            self.bytes -= sum(self.sizes.popleft() for _ in range(n))
        return [items.popleft() for _ in range(n)]

    def delivered(self) -> None:
        """The results taken last were delivered: counted, and their latency recorded."""
        self.counters.add("delivered", len(self.taken))
        if self.latency is not None:
            self.latency.record(time.monotonic(), self.taken)

    async def take(self, most: int = BATCH) -> list[dict]:
        """Wait for at least one result; return up to ``most``, oldest first."""
        self.done()
        while not self.items:
            self._ready.clear()
            await self._ready.wait()
        batch = self.take_now(most)
        self.in_flight = len(batch)
        self.sending = batch
        return batch

    def done(self) -> None:
        """The batch :meth:`take` gave is delivered."""
        self.in_flight = 0
        self.sending = []

    def held(self) -> list[dict]:
        """What may not have reached the destination (a copy, oldest first): what was written but may still be
        in the process (:attr:`unsent`), the batch being sent, the queue."""
        return [*self.unsent(), *self.sending, *self.items]

    def give_back(self, batch: list[dict]) -> None:
        """Put an unsent batch back in front; what no longer fits is dropped and counted."""
        self.done()
        room = self.size - len(self.items)
        keep = batch[-room:] if room > 0 else []
        self.counters.add("dropped", len(batch) - len(keep))
        self.items.extendleft(reversed(keep))
        self.arrivals.extendleft(reversed(self.taken[len(self.taken) - len(keep):]))
        if self.max_bytes is not None:  # (back in front whatever their size: they were queued once)
            sizes = [len(as_json_line(r)) for r in keep]
            self.sizes.extendleft(reversed(sizes))
            self.bytes += sum(sizes)


def as_json_line(result: dict) -> bytes:
    """One compact JSON line (orjson; the standard library for what orjson refuses, such as huge integers)."""
    try:
        return orjson.dumps(result, option=orjson.OPT_APPEND_NEWLINE)
    except (TypeError, orjson.JSONEncodeError):
        return (json.dumps(result, separators=(",", ":")) + "\n").encode()


def as_sse_event(result: dict) -> tuple[bytes, int]:
    """A result as one Server-Sent Event (its ``id``, its JSON line as ``data``) and its JSON line's length."""
    line = as_json_line(result)
    return b"id: %b\ndata: %b\n\n" % (str(result["id"]).encode(), line[:-1]), len(line)


def as_xml_element(result: dict) -> bytes:
    """``<match query=".." id=".." start=".." end=".."><bind var="a" seq="0"/>…</match>`` and a newline.

    Scalar fields become attributes, ``bindings`` ``bind`` children; any other
    structured field (``emit``, ``events``) is a child element holding its JSON text.
    """
    attrs, children = [], []
    for key, value in result.items():
        if key == "bindings":
            for var, seqs in value.items():
                children.extend(f"<bind var={quoteattr(str(var))} seq={quoteattr(str(s))}/>" for s in seqs)
        elif isinstance(value, (dict, list)):
            children.append(f"<{key}>{escape(json.dumps(value, separators=(',', ':')))}</{key}>")
        elif value is not None:
            attrs.append(f" {key}={quoteattr(str(value))}")
    return f"<match{''.join(attrs)}>{''.join(children)}</match>\n".encode()


ENCODERS = {"json": as_json_line, "xml": as_xml_element}


class Backoff:
    """Exponential backoff between reconnect attempts: 0.1 s doubling to ``most``."""

    def __init__(self, first: float = 0.1, most: float = 10.0):
        self.first, self.most, self.delay = first, most, first

    def next(self) -> float:
        """The delay to wait now (and double the one after)."""
        delay, self.delay = self.delay, min(self.delay * 2, self.most)
        return delay

    async def wait(self) -> None:
        await asyncio.sleep(self.next())

    def reset(self) -> None:
        self.delay = self.first


class PushSink:
    """A push destination of one subscription: its outbox, its failure bookkeeping and backoff; with a
    ``policy``, it reaches only what the policy allows (checked at each connection or open)."""

    def __init__(self, url: str, encode: Callable[[dict], bytes], policy: SinkPolicy | None = None):
        self.url = url
        self.encode = encode
        self.policy = policy
        self.backoff = Backoff()
        self.failing = False
        self.outbox: Outbox | None = None

    def start(self, outbox: Outbox) -> None:
        """Begin delivering what ``outbox`` receives (on the running loop)."""
        self.outbox = outbox

    async def stop(self) -> None:
        """Stop delivering and release the connection or file."""

    def failed(self, error: str) -> None:
        assert self.outbox is not None
        self.outbox.counters.error(f"{shown(self.url)}: {error}")
        if not self.failing:
            log.warning("sink failing", extra={"sink": self.url, "error": self.outbox.counters.last_error})
        self.failing = True

    def recovered(self) -> None:
        self.backoff.reset()
        if self.failing:
            log.info("sink recovered", extra={"sink": self.url})
            self.failing = False


class LoopSink(PushSink):
    """A sink written from the loop: at most one ``flush`` scheduled at a time, however many results arrive."""

    def __init__(self, url: str, encode: Callable[[dict], bytes], policy: SinkPolicy | None = None):
        super().__init__(url, encode, policy)
        self.loop: asyncio.AbstractEventLoop | None = None
        self._scheduled = False

    def start(self, outbox: Outbox) -> None:
        super().start(outbox)
        self.loop = asyncio.get_running_loop()
        outbox.wake = self.wake

    def wake(self) -> None:
        if not self._scheduled:
            self._scheduled = True
            self.loop.call_soon(self._flush)  # type: ignore[union-attr]

    def _flush(self) -> None:
        self._scheduled = False
        if self.outbox is not None and self.outbox.items:
            self.flush()

    def flush(self) -> None:
        """Write what is queued, as far as the destination takes it now."""
        raise NotImplementedError

    def encoded(self, batch: list[dict]) -> bytes:
        return b"".join(map(self.encode, batch))


class _Connection(asyncio.Protocol):
    """One TCP connection of a :class:`TcpSink` (a listener's data is ignored; its EOF ends the connection)."""

    def __init__(self, sink: "TcpSink"):
        self.sink = sink

    def pause_writing(self) -> None:
        self.sink.paused = True

    def resume_writing(self) -> None:
        self.sink.paused = False
        self.sink.wake()

    def data_received(self, data: bytes) -> None:
        pass

    def eof_received(self) -> bool:
        return False  # close: the listener is going away

    def connection_lost(self, exc: Exception | None) -> None:
        self.sink.lost(self, exc)


class TcpSink(LoopSink):
    """``tcp://HOST:PORT``: one persistent client connection, opened at the first result, one line per result."""

    def __init__(self, url: str, encode: Callable[[dict], bytes], policy: SinkPolicy | None = None):
        super().__init__(url, encode, policy)
        parts = urlsplit(url)
        self.host, self.port = parts.hostname, parts.port
        self.transport: asyncio.WriteTransport | None = None
        self.connection: _Connection | None = None
        self.paused = False
        self.connecting: asyncio.Task | None = None
        self.stopped = False
        self.written: deque[tuple[int, list[dict]]] = deque()  # the last batches written, while their bytes may be buffered
        self.written_bytes = 0

    def start(self, outbox: Outbox) -> None:
        super().start(outbox)
        outbox.unsent = self.unsent

    def unsent(self) -> list[dict]:
        """The results written whose bytes may still be in the connection's buffer, in this process (at a
        crash they would be lost, though counted delivered: a checkpoint keeps them, at least once)."""
        self._forget_sent()
        return [r for _, batch in self.written for r in batch]

    def _forget_sent(self) -> None:
        """Forget the batches written whose bytes have all left the connection's buffer."""
        buffered = self.transport.get_write_buffer_size() if self.transport is not None else 0
        while self.written and self.written_bytes - self.written[0][0] >= buffered:
            self.written_bytes -= self.written.popleft()[0]

    def flush(self) -> None:
        outbox = self.outbox
        assert outbox is not None
        if self.transport is None or self.transport.is_closing():
            if self.connecting is None and not self.stopped:
                self.connecting = self.loop.create_task(self._connect(), name=f"connect {self.url}")  # type: ignore[union-attr]
            return
        while outbox.items and not self.paused:  # pause_writing (from write) sets paused above HIGH_WATER
            batch = outbox.take_now(CHUNK)
            outbox.in_flight = len(batch)  # (queued until counted delivered: the counts agree, read from any thread)
            try:
                data = self.encoded(batch)
                self.transport.write(data)
            except Exception as e:  # the transport reports socket errors in connection_lost: this is something else
                outbox.give_back(batch)
                self._abandon(e)
                return
            outbox.delivered()
            outbox.done()
            self.written.append((len(data), batch))
            self.written_bytes += len(data)
            self._forget_sent()

    def _abandon(self, error: Exception) -> None:
        """Drop the connection after an error writing to it; what is queued goes to the next one, after backoff."""
        transport, self.transport, self.connection = self.transport, None, None
        transport.abort()  # type: ignore[union-attr]
        self.failed(reason(error))
        self.wake()

    async def _connect(self) -> None:
        try:
            while not self.stopped:
                if self.failing:
                    await self.backoff.wait()
                try:
                    host = await self.policy.resolve(self.host, self.port) if self.policy else self.host  # type: ignore[arg-type]
                    transport, connection = await asyncio.wait_for(
                        self.loop.create_connection(lambda: _Connection(self), host, self.port),  # type: ignore[union-attr]
                        CONNECT_TIMEOUT)
                except (OSError, asyncio.TimeoutError):  # refused, unreachable, a timeout: one text for all
                    self.failed(CONNECT_FAILED)
                    continue
                except Exception as e:  # a host the resolver cannot encode; one the policy does not allow now
                    self.failed(reason(e))
                    continue
                if transport.get_extra_info("sockname") == transport.get_extra_info("peername"):
                    # nothing listens on a port of the ephemeral range and the kernel picked that very
                    # port for this socket: TCP connected it to itself; that is no destination
                    transport.abort()
                    self.failed("connection refused (the socket connected to itself)")
                    continue
                transport.set_write_buffer_limits(high=HIGH_WATER)
                self.transport, self.connection, self.paused = transport, connection, False  # type: ignore[assignment]
                self.recovered()
                break
        finally:
            self.connecting = None
        self.wake()

    def lost(self, connection: _Connection, exc: Exception | None) -> None:
        """The connection ended; the next result (or what is queued now) reconnects, after backoff."""
        if connection is not self.connection:
            return
        self.transport = self.connection = None
        self.paused = False
        if not self.stopped:
            self.failed(str(exc) if exc else "connection closed by the listener")
            if self.outbox is not None and self.outbox.items:
                self.wake()

    async def stop(self) -> None:
        self.stopped = True
        if self.connecting is not None:
            self.connecting.cancel()
            await asyncio.gather(self.connecting, return_exceptions=True)
        transport, self.transport, self.connection = self.transport, None, None
        if transport is not None:
            transport.close()  # sends what is buffered, then closes; abort a reader that never takes it
            self.loop.call_later(1.0, transport.abort)  # type: ignore[union-attr]


class TaskSink(PushSink):
    """A sink sending from a task of its own, up to ``most`` results at a time: a batch that fails goes back
    to the front of the outbox, then the sink resets and waits its backoff."""

    most = BATCH

    def __init__(self, url: str, encode: Callable[[dict], bytes], policy: SinkPolicy | None = None):
        super().__init__(url, encode, policy)
        self._task: asyncio.Task | None = None

    def start(self, outbox: Outbox) -> None:
        super().start(outbox)
        self._task = asyncio.get_running_loop().create_task(self._run(outbox), name=f"sink {self.url}")

    async def _run(self, outbox: Outbox) -> None:
        while True:
            batch = await outbox.take(self.most)
            try:
                await self.send(batch)
            except asyncio.CancelledError:  # stopped while sending: the batch may or may not have arrived; kept
                outbox.give_back(batch)
                raise
            except Exception as e:  # a status, an OSError, or what httpx raises unwrapped (InvalidURL, a group)
                outbox.give_back(batch)
                self.failed(reason(e))
                await self.reset()
                await self.backoff.wait()
                continue
            outbox.delivered()
            outbox.done()
            self.recovered()

    async def send(self, batch: list[dict]) -> None:
        """Deliver ``batch`` (raise if it was not)."""
        raise NotImplementedError

    async def reset(self) -> None:
        """Drop the connection or file after a failure (and at stop)."""

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        await self.reset()


class SinkThread:
    """A daemon thread running one sink's blocking calls in turn: a call that blocks for ever holds up this
    thread alone (and, a daemon, not the process's exit either). Started at the first call."""

    def __init__(self, name: str):
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._work, name=name, daemon=True)

    def submit(self, call: Callable[[], None]) -> asyncio.Future:
        """Run ``call`` after those submitted before; a future (of the running loop) of its end."""
        loop = asyncio.get_running_loop()
        done = loop.create_future()
        if self._thread.ident is None:
            self._thread.start()
        self._jobs.put((call, loop, done))
        return done

    def end(self) -> None:
        """End the thread once the calls submitted so far are done."""
        self._jobs.put(None)

    def _work(self) -> None:
        while (job := self._jobs.get()) is not None:
            call, loop, done = job
            error: Exception | None = None
            try:
                call()
            except Exception as e:
                error = e
            try:
                loop.call_soon_threadsafe(_settle, done, error)
            except RuntimeError:  # the loop is closed: nobody waits any more
                return


def _settle(done: asyncio.Future, error: Exception | None) -> None:
    if done.cancelled():
        return
    if error is None:
        done.set_result(None)
    else:
        done.set_exception(error)


class FileSink(TaskSink):
    """``file:PATH``: opened and written by a thread of its own, kept open, appended up to :data:`CHUNK`
    results per write, flushed after each write."""

    most = CHUNK

    def __init__(self, url: str, encode: Callable[[dict], bytes], policy: SinkPolicy | None = None):
        super().__init__(url, encode, policy)
        self.path = url[len("file://"):] if url.startswith("file://") else url[len("file:"):]
        self._opener = policy.opener(url) if policy else None  # (inside the policy's directory, no symlink followed)
        self._f: Any = None
        self._thread = SinkThread(f"sink {url}")

    async def send(self, batch: list[dict]) -> None:
        await self._thread.submit(lambda: self._write(batch))

    def _write(self, batch: list[dict]) -> None:
        """(the sink's thread) An OSError, or a ValueError for a path open() refuses, is the caller's."""
        if self._f is None:
            self._f = open(self.path, "ab", opener=self._opener)
        self._f.write(b"".join(map(self.encode, batch)))
        self._f.flush()

    def _close(self) -> None:
        f, self._f = self._f, None
        if f is not None:
            try:
                f.close()
            except OSError:  # what was buffered could not be written: that batch was given back
                pass

    async def reset(self) -> None:
        self._thread.submit(self._close)  # after the write in progress, if any; never waited for: it may block

    async def stop(self) -> None:
        await super().stop()
        self._thread.end()


class WebhookSink(TaskSink):
    """``http(s)://…``: a task POSTing each batch, one result per line (JSON lines, or XML elements); any 2xx is delivered."""

    def __init__(self, url: str, encode: Callable[[dict], bytes], policy: SinkPolicy | None = None):
        super().__init__(url, encode, policy)
        self._client: Any = None

    async def send(self, batch: list[dict]) -> None:
        import httpx

        if self._client is None:
            self._client = httpx.AsyncClient(timeout=10.0)
        kind = "application/x-ndjson" if self.encode is as_json_line else "application/xml"
        url, headers, extensions = self.url, {"content-type": kind}, {}
        if self.policy is not None:  # to the address just checked, under the URL's own host name (Host, TLS SNI)
            parts = urlsplit(url)
            port = parts.port or (443 if parts.scheme == "https" else 80)
            address = await self.policy.resolve(parts.hostname or "", port)
            literal = f"[{address}]" if ":" in address else address
            userinfo = parts.netloc.rpartition("@")[0]
            url = parts._replace(netloc=(userinfo + "@" if userinfo else "") + f"{literal}:{port}").geturl()
            headers["host"] = parts.netloc.rpartition("@")[2]
            extensions["sni_hostname"] = parts.hostname
        try:
            r = await self._client.post(url, content=b"".join(map(self.encode, batch)), headers=headers,
                                        extensions=extensions)
        except (httpx.ConnectError, httpx.ConnectTimeout):
            raise Refused(CONNECT_FAILED) from None
        if not 200 <= r.status_code < 300:
            raise Refused(f"HTTP {r.status_code}")

    async def reset(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()


class Refused(Exception):
    """A destination that refused a delivery (a webhook answering with a status ≥ 300)."""


def reason(error: Exception) -> str:
    """The ``last_error`` text of an error: an OS error's or a refusal's message, else the error's type and message."""
    text = (error.strerror if isinstance(error, OSError) else None) or str(error)
    if text and isinstance(error, (OSError, Refused)):
        return text
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


_LABEL = re.compile(r"[a-z0-9_-]{1,63}\Z", re.IGNORECASE)  #: one label of a hostname, IDNA-encoded


def check_host(host: str) -> None:
    """ValueError unless ``host`` is an IP address or a hostname (labels of up to 63 letters, digits, '-', '_')."""
    try:
        ipaddress.ip_address(host)
        return
    except ValueError:
        pass
    try:
        name = host.encode("idna").decode("ascii").removesuffix(".")
    except UnicodeError:  # a label empty or longer than 63 characters
        name = ""
    if len(name) > 253 or not all(map(_LABEL.match, name.split("."))):
        raise ValueError(f"sink host {host!r} is not a hostname or IP address")
