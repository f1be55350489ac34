"""An isolation engine's own delivery (docs/service.md, "Isolation engines"): in the child process, its query's
results go to the subscription's push sink themselves, so that the service's process only sees counts.

A child whose subscription has a TCP, webhook or file sink, or none (:func:`delivered_here`), is given the
subscription's :class:`Delivery` when it is forked: it runs the sink's own classes (:func:`sink_for`, the
same :class:`~yfpp.service.sink_policy.SinkPolicy`, checked at each connection or open, the same bounded
:class:`~yfpp.service.sinks.Outbox` and overflow) on an event loop in a thread of its own
(:class:`ChildDelivery`), and keeps the push counts (matches, delivered, dropped, sink errors) and the
latencies; the service applies them to the subscription once a second (``Subscription.tally``). A
subscription with pull-stream readers (``want``) still has its results sent to the service too, for those
readers only. An MQTT sink stays in the service (the child sends every result back, as before).

What the child holds and has not delivered is never lost by the move of delivery: at a checkpoint it is
handed back with the counts at that very point (kept in the registry with the service's own queued results,
at least once); at a stop of the child (delete, change, suspension, the service's stop) the child delivers
for up to :data:`DRAIN` seconds and hands back the rest, queued again in the service's own outbox of the
subscription. If the child dies, what it had queued is counted ``dropped``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import threading
import time
from typing import Any
from urllib.parse import urlsplit

from yfpp.service.latency import Latency
from yfpp.service.sink_policy import SinkPolicy
from yfpp.service.sink_urls import sink_for
from yfpp.service.sinks import Counters, Outbox, PushSink

DRAIN = 1.0  #: seconds a stopping child delivers what it holds before it hands the rest back
COUNTED = ("matches", "delivered", "dropped", "sink_errors")  #: the counts a child reports (cumulative)


@dataclasses.dataclass(frozen=True)
class Delivery:
    """What a child needs to deliver a subscription's results itself."""

    sid: str  #: the subscription's id (its counts and held results go back under it, whatever its name)
    sink: str | None  #: the push sink's URL (None: pull streams only)
    fmt: str
    policy: SinkPolicy | None
    queue: int
    queue_bytes: int | None
    overflow: str
    want: bool  #: pull-stream readers listen now: the results go back to the service for them too


def delivered_here(sink: str | None) -> bool:
    """Whether a child can deliver to ``sink`` itself (TCP, webhook, file, or none); MQTT stays in the service."""
    return sink is None or urlsplit(sink).scheme in ("tcp", "http", "https", "file")


class ChildDelivery:
    """(the child) A subscription's push sink run by an event loop in a thread of the child's own; every
    method but those named ``_…`` is called from the child's main thread."""

    def __init__(self, delivery: Delivery):
        self.delivery = delivery
        self.want = delivery.want
        self.counters = Counters()
        self.latency = Latency()
        self.outbox: Outbox | None = None
        self.sink: PushSink | None = None
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="delivery", daemon=True)
        self._thread.start()
        self._call(self._start([]))

    def _call(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    async def _start(self, held: list[dict]) -> None:
        d = self.delivery
        if d.sink is not None:
            self.outbox = Outbox(d.queue, d.overflow, self.counters, self.latency, d.queue_bytes)
            self.sink = sink_for(d.sink, d.fmt, d.policy)
            self.sink.start(self.outbox)
        for result in held:  # (counted as matches already)
            if self.outbox is not None:
                self.outbox.offer(result)
            else:
                self.counters.add("dropped")

    def offer(self, results: list[dict], arrived: float | None) -> None:
        """The query's results of one message (their event arrived at ``arrived``), counted and queued as
        ``Subscription.deliver`` does, with the readers wanted as of this point of the stream."""
        self.loop.call_soon_threadsafe(self._offer, results, arrived, self.want)

    def _offer(self, results: list[dict], arrived: float | None, want: bool) -> None:
        self.counters.add("matches", len(results))
        if self.outbox is not None:
            for result in results:
                self.outbox.offer(result, arrived)
        else:
            self.counters.add("delivered" if want else "dropped", len(results))

    def report(self) -> dict[str, Any]:
        """The counts so far and the latencies since the last report (for ``Subscription.tally``)."""
        return self._call(self._report())

    async def _report(self) -> dict[str, Any]:
        lat, self.latency = self.latency, Latency()
        if self.outbox is not None:
            self.outbox.latency = self.latency
        return {**self._counts(), "latency": (list(lat.recent), lat.buckets, lat.count, lat.sum)}

    def _counts(self) -> dict[str, Any]:
        c, box = self.counters, self.outbox
        return {**{k: getattr(c, k) for k in COUNTED}, "pid": os.getpid(), "last_error": c.last_error,
                "last_error_at": c.last_error_at,
                "queued": len(box.items) + box.in_flight if box is not None else 0}

    def snapshot(self) -> tuple[dict[str, Any], list[dict]]:
        """(at a checkpoint) The counts and what the sink holds, at this point: results written whose bytes
        may still be in the process are held, so not counted delivered (as the service's own sinks' are)."""
        return self._call(self._snapshot())

    async def _snapshot(self) -> tuple[dict[str, Any], list[dict]]:
        counts, box = self._counts(), self.outbox
        if box is None:
            return counts, []
        counts["delivered"] -= len(box.unsent())
        return counts, box.held()

    def change(self, delivery: Delivery) -> None:
        """The subscription's sink changed: what the old one held goes to the new one (or is dropped, counted,
        with no push sink now)."""
        self._call(self._change(delivery))

    async def _change(self, delivery: Delivery) -> None:
        counts, held = await self._snapshot()
        self.counters.delivered = counts["delivered"]  # (not delivered for sure: sent again)
        if self.sink is not None:
            await self.sink.stop()
        self.delivery, self.outbox, self.sink = delivery, None, None  # (the readers wanted stay as they are)
        await self._start(held)

    def close(self) -> tuple[dict[str, Any], list[dict]]:
        """Deliver for up to :data:`DRAIN` seconds, then stop the sink: the counts and what it still held."""
        return self._call(self._close())

    async def _close(self) -> tuple[dict[str, Any], list[dict]]:
        end = time.monotonic() + DRAIN
        box = self.outbox
        while box is not None and (box.items or box.in_flight) and time.monotonic() < end:
            await asyncio.sleep(0.02)
        out = await self._snapshot()
        out[0].update(queued=0, latency=(await self._report())["latency"])  # (what it held is handed back)
        if self.sink is not None:
            await self.sink.stop()
        self.loop.call_soon(self.loop.stop)
        return out
