"""Each subscription's result latency (docs/service.md, "Metrics"): the time from the arrival at the service of
the event that completed a result (when its feed handed it, in its batch, to the engine thread's inbox) to the
result's delivery (written to the push sink's connection or file, acknowledged by the broker or the webhook,
or written to a pull stream). A result released by the clock (``advance_idle``) counts from that release.

Kept per subscription, bounded: the last :data:`WINDOW` latencies (for the p50 and p99 that ``GET
/subscriptions/{id}`` and the dashboard show) and a count per bucket of :data:`BOUNDS` since the subscription
was registered here (the metrics' histogram ``yfpp_subscription_latency_seconds``). Loop thread only.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections import deque
from itertools import groupby, repeat
from typing import Any, Iterable

WINDOW = 1024  #: latencies kept for the percentiles (the last ones delivered)
BOUNDS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)  #: histogram buckets, seconds


class Latency:
    def __init__(self) -> None:
        self.recent: deque[float] = deque(maxlen=WINDOW)
        self.buckets = [0] * (len(BOUNDS) + 1)  #: results per bucket (the last: above the largest bound)
        self.count = 0
        self.sum = 0.0

    def record(self, now: float, arrivals: Iterable[float]) -> None:
        """Results delivered at ``now`` (``time.monotonic()``) whose events arrived at ``arrivals``."""
        recent, buckets = self.recent, self.buckets
        for at, same in groupby(arrivals):  # (the results of one batch of events share its arrival)
            k = sum(1 for _ in same)
            seconds = now - at
            recent.extend(repeat(seconds, k))
            buckets[bisect_left(BOUNDS, seconds)] += k
            self.count += k
            self.sum += seconds * k

    def merge(self, recent: list[float], buckets: list[int], count: int, total: float) -> None:
        """Latencies recorded elsewhere (an isolation engine delivering itself: its :class:`Latency`'s fields)."""
        self.recent.extend(recent)
        for i, n in enumerate(buckets):
            self.buckets[i] += n
        self.count += count
        self.sum += total

    def info(self) -> dict[str, Any]:
        """p50 and p99 of the window, in milliseconds (None before any delivery), and how many it holds."""
        window = sorted(self.recent)
        if not window:
            return {"p50_ms": None, "p99_ms": None, "window": 0}
        return {"p50_ms": round(_quantile(window, 0.5) * 1000, 3), "p99_ms": round(_quantile(window, 0.99) * 1000, 3),
                "window": len(window)}

    def cumulative(self) -> list[tuple[str, int]]:
        """The histogram's buckets as Prometheus has them: ``(le, results at most that)``, ``+Inf`` last."""
        out, running = [], 0
        for bound, n in zip((*map(str, BOUNDS), "+Inf"), self.buckets):
            running += n
            out.append((bound, running))
        return out


def _quantile(ordered: list[float], q: float) -> float:
    """The nearest-rank ``q`` quantile of a sorted, non-empty list."""
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]
