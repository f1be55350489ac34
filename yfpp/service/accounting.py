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
whose share of the engine thread's CPU over the last interval is over a bound
(the service moves them to isolation engines, or suspends them).
"""

from __future__ import annotations

import time
from collections import defaultdict
from typing import Any, Callable

from yfpp.engine import Engine


BUSY = 0.1  #: a query is over its CPU share only while the engine thread is busy this fraction of the time at least


class Usage:
    def __init__(self) -> None:
        self.by_name: dict[str, dict[str, Any]] = {}  #: the last sample, by query name
        #: each query's part of the last sample: its branch's runs shared evenly among the branch's queries, and
        #: its fraction of the engine thread's CPU (0 while the thread was not busy: :data:`BUSY`)
        self.parts: dict[str, tuple[float, float]] = {}
        self._cpu: defaultdict[str, float] = defaultdict(float)
        self._cpu_at: float | None = None
        self._wall_at = time.monotonic()
        #: the usage of a query that runs in an isolation engine (yfpp.service.isolation), else None
        self.elsewhere: Callable[[str], dict[str, Any] | None] = lambda name: None

    def sample(self, engine: Engine, max_share: float | None = None) -> list[str]:
        """(engine thread, holding ``engine_lock``) Take a sample; return the queries attributed more than
        ``max_share`` of the engine thread's CPU time since the last sample, while it was busy (:data:`BUSY`) and
        there are several queries to protect."""
        now, wall = time.thread_time(), time.monotonic()
        spent, self._cpu_at = (now - self._cpu_at if self._cpu_at is not None else 0.0), now
        interval, self._wall_at = wall - self._wall_at, wall
        over: list[str] = []
        rt = engine.runtime
        branches = [(root.live, [p.name for p in plans]) for root, plans in rt.branch_queries.items()]
        live = sum(n for n, _ in branches)
        names = [name for _, group in branches for name in group]
        sample: dict[str, dict[str, Any]] = {}
        parts: dict[str, tuple[float, float]] = {}
        busy = bool(live) and spent >= BUSY * interval > 0
        for n, group in branches:
            share = spent * n / live / len(group) if live else spent / len(names)
            for name in group:
                self._cpu[name] += share
                sample[str(name)] = {"runs": n, "runs_shed": rt.counters.shed_runs.get(name, 0),
                                     "cpu_s": round(self._cpu[name], 3), "engine": "main"}
                parts[str(name)] = (n / len(group), share / spent if busy else 0.0)
                if max_share is not None and busy and len(names) > 1 and share > max_share * spent:
                    over.append(str(name))
        for gone in set(self._cpu) - set(names):  # (deleted queries)
            del self._cpu[gone]
        self.by_name, self.parts = sample, parts
        return over

    def of(self, name: str) -> dict[str, Any]:
        """The last sample of query ``name`` (zeros before the first, and for an event-set query); ``engine`` says
        where it runs (``main``, or ``isolated`` with the child's ``pid``)."""
        return self.elsewhere(name) or self.by_name.get(name, {"runs": 0, "runs_shed": 0, "cpu_s": 0.0, "engine": "main"})
