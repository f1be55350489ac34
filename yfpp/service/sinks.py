"""Where a subscription's results go: a bounded outbox per destination and one sender task each.

The engine thread never waits for a destination: it hands results to the event
loop, which appends them to each destination's :class:`Outbox`.  An outbox holds
at most ``size`` results; when full, ``drop_oldest`` (the default) discards the
oldest queued result and ``drop_newest`` the arriving one, and either is counted
in ``dropped``.  A sender task takes batches from its outbox and writes them; on
an error it records ``last_error``, puts the batch back and retries with
exponential backoff (0.1 s doubling to 10 s), so a dead or slow destination
only ever fills its own outbox.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import time
from collections import deque
from typing import Any
from urllib.parse import urlsplit
from xml.sax.saxutils import escape, quoteattr

log = logging.getLogger("yfpp.service.sinks")

BATCH = 256  #: results written per send


@dataclasses.dataclass
class Counters:
    """What ``GET /subscriptions/{id}`` and the metrics show for one subscription."""

    matches: int = 0
    delivered: int = 0
    dropped: int = 0
    last_error: str | None = None
    last_error_at: float | None = None  #: Unix time

    def error(self, text: str) -> None:
        self.last_error, self.last_error_at = text, time.time()


class Outbox:
    """A bounded queue of results with a documented overflow policy (loop thread only)."""

    def __init__(self, size: int, overflow: str, counters: Counters):
        self.size = size
        self.overflow = overflow
        self.counters = counters
        self.items: deque[dict] = deque()
        self.in_flight = 0  #: results taken by the sender and not yet delivered or given back
        self._ready = asyncio.Event()

    def offer(self, result: dict) -> None:
        if len(self.items) >= self.size:
            self.counters.dropped += 1
            if self.overflow == "drop_newest":
                return
            self.items.popleft()
        self.items.append(result)
        self._ready.set()

    async def take(self, most: int = BATCH) -> list[dict]:
        """Wait for at least one result; return up to ``most``, oldest first."""
        self.in_flight = 0
        while not self.items:
            self._ready.clear()
            await self._ready.wait()
        batch = [self.items.popleft() for _ in range(min(most, len(self.items)))]
        self.in_flight = len(batch)
        return batch

    def give_back(self, batch: list[dict]) -> None:
        """Put an unsent batch back in front; what no longer fits is dropped and counted."""
        self.in_flight = 0
        room = self.size - len(self.items)
        keep = batch[-room:] if room > 0 else []
        self.counters.dropped += len(batch) - len(keep)
        self.items.extendleft(reversed(keep))


def as_json_line(result: dict) -> bytes:
    return (json.dumps(result, separators=(",", ":")) + "\n").encode()


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

    async def wait(self) -> None:
        await asyncio.sleep(self.delay)
        self.delay = min(self.delay * 2, self.most)

    def reset(self) -> None:
        self.delay = self.first


class Sender:
    """Base of the push destinations: the take → send → count / retry loop."""

    def __init__(self, url: str, encode: Any):
        self.url = url
        self.encode = encode
        self.backoff = Backoff()

    async def run(self, outbox: Outbox) -> None:
        counters = outbox.counters
        failing = False
        try:
            while True:
                batch = await outbox.take()
                try:
                    await self.send(batch)
                except (OSError, asyncio.TimeoutError, _SendError) as e:
                    outbox.give_back(batch)
                    counters.error(f"{self.url}: {e or type(e).__name__}")
                    if not failing:
                        log.warning("sink failing", extra={"sink": self.url, "error": counters.last_error})
                    failing = True
                    await self.reset()
                    await self.backoff.wait()
                    continue
                counters.delivered += len(batch)
                outbox.in_flight = 0
                self.backoff.reset()
                if failing:
                    log.info("sink recovered", extra={"sink": self.url})
                    failing = False
        finally:
            await self.reset()

    async def send(self, batch: list[dict]) -> None:
        raise NotImplementedError

    async def reset(self) -> None:
        """Drop the connection (after an error, or when the task ends)."""


class _SendError(Exception):
    """A destination that answered but refused (HTTP status ≥ 300)."""


class TcpSender(Sender):
    """``tcp://HOST:PORT``: a client connection writing one line per result."""

    def __init__(self, url: str, encode: Any):
        super().__init__(url, encode)
        parts = urlsplit(url)
        self.host, self.port = parts.hostname, parts.port
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def send(self, batch: list[dict]) -> None:
        if self._writer is not None and self._reader is not None and self._reader.at_eof():
            await self.reset()  # the listener went away: reconnect rather than write into the void
        if self._writer is None:
            self._reader, self._writer = await asyncio.wait_for(asyncio.open_connection(self.host, self.port), 5.0)
        self._writer.write(b"".join(self.encode(r) for r in batch))
        await self._writer.drain()

    async def reset(self) -> None:
        writer, self._writer, self._reader = self._writer, None, None
        if writer is not None:
            writer.close()
            try:
                await asyncio.wait_for(writer.wait_closed(), 1.0)
            except (OSError, asyncio.TimeoutError):
                pass


class WebhookSender(Sender):
    """``http(s)://…``: POST each batch, one result per line (JSON lines, or XML elements); any 2xx is delivered."""

    def __init__(self, url: str, encode: Any):
        super().__init__(url, encode)
        self._client: Any = None

    async def send(self, batch: list[dict]) -> None:
        import httpx

        if self._client is None:
            self._client = httpx.AsyncClient(timeout=10.0)
        try:
            kind = "application/x-ndjson" if self.encode is as_json_line else "application/xml"
            r = await self._client.post(self.url, content=b"".join(self.encode(x) for x in batch),
                                        headers={"content-type": kind})
        except httpx.HTTPError as e:
            raise _SendError(f"{type(e).__name__}: {e}") from e
        if not 200 <= r.status_code < 300:
            raise _SendError(f"HTTP {r.status_code}")

    async def reset(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()


class FileSender(Sender):
    """``file:PATH``: append one line per result, flushed after each batch."""

    def __init__(self, url: str, encode: Any):
        super().__init__(url, encode)
        self.path = url[len("file://"):] if url.startswith("file://") else url[len("file:"):]
        self._f: Any = None

    async def send(self, batch: list[dict]) -> None:
        if self._f is None:
            self._f = open(self.path, "ab")
        self._f.write(b"".join(self.encode(r) for r in batch))
        self._f.flush()

    async def reset(self) -> None:
        f, self._f = self._f, None
        if f is not None:
            f.close()


def check_sink(url: str) -> str:
    """The sink URL if it is one of the supported forms, else ValueError saying which are."""
    parts = urlsplit(url)
    if parts.scheme == "tcp":
        try:
            port = parts.port
        except ValueError:
            port = None
        if parts.hostname and port:
            return url
    elif parts.scheme in ("http", "https") and parts.hostname:
        return url
    elif parts.scheme == "file" and url[len("file:"):].lstrip("/"):
        return url
    raise ValueError(f"sink must be tcp://HOST:PORT, http(s)://… (webhook) or file:PATH, got {url!r}")


def sender_for(url: str, fmt: str) -> Sender:
    scheme = urlsplit(url).scheme
    cls = {"tcp": TcpSender, "http": WebhookSender, "https": WebhookSender, "file": FileSender}[scheme]
    return cls(url, ENCODERS[fmt])
