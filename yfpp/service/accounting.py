"""Each subscription's cost (docs/service.md, "Security"): what ``GET /subscriptions/{id}`` shows as ``usage``
and the metrics as ``yfpp_subscription_runs`` / ``yfpp_subscription_cpu_seconds``.

The engine thread samples once a second (less often when a sample would take
more than 1 % of its time: ``server.USAGE_SHARE``), holding ``engine_lock``: each
pattern query's live runs (those of its shared-NFA branch: the queries of one
branch share its runs), the runs shed by the engine's caps counted against
it, and an estimate of the engine CPU it took, the engine thread's CPU time
since the last sample shared out by live runs (evenly among a branch's
queries; evenly among all queries while none has runs). The loop reads the
last sample, a dict replaced whole. :meth:`Usage.sample` also names the queries
whose share of the last interval is over a bound (the service suspends them).
"""

from __future__ import annotations

import time
from collections import defaultdict
from typing import Any

from yfpp.engine import Engine


class Usage:
    def __init__(self) -> None:
        self.by_name: dict[str, dict[str, Any]] = {}  #: the last sample, by query name
        self._cpu: defaultdict[str, float] = defaultdict(float)
        self._cpu_at: float | None = None
        self._wall_at = time.monotonic()

    def sample(self, engine: Engine, max_share: float | None = None) -> list[str]:
        """(engine thread, holding ``engine_lock``) Take a sample; return the queries attributed more than
        ``max_share`` of the wall time since the last sample (when there are several queries to protect)."""
        now, wall = time.thread_time(), time.monotonic()
        spent, self._cpu_at = (now - self._cpu_at if self._cpu_at is not None else 0.0), now
        interval, self._wall_at = wall - self._wall_at, wall
        over: list[str] = []
        rt = engine.runtime
        branches = [(root.live, [p.name for p in plans]) for root, plans in rt.branch_queries.items()]
        live = sum(n for n, _ in branches)
        names = [name for _, group in branches for name in group]
        sample: dict[str, dict[str, Any]] = {}
        for n, group in branches:
            share = spent * n / live / len(group) if live else spent / len(names)
            for name in group:
                self._cpu[name] += share
                sample[str(name)] = {"runs": n, "runs_shed": rt.counters.shed_runs.get(name, 0),
                                     "cpu_s": round(self._cpu[name], 3)}
                if max_share is not None and len(names) > 1 and interval > 0 and share > max_share * interval:
                    over.append(str(name))
        for gone in set(self._cpu) - set(names):  # (deleted queries)
            del self._cpu[gone]
        self.by_name = sample
        return over

    def of(self, name: str) -> dict[str, Any]:
        """The last sample of query ``name`` (zeros before the first, and for an event-set query)."""
        return self.by_name.get(name, {"runs": 0, "runs_shed": 0, "cpu_s": 0.0})
