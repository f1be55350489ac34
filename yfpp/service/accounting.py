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

A query moved to an isolation engine reports its own usage (its child's runs
and CPU, ``engine`` ``isolated``: :attr:`Usage.elsewhere`); the sample takes it
in :attr:`Usage.parts` as well, so the per-key quotas count a key's runs and CPU
wherever its queries run: a part's CPU share is of the engines' CPU over the
interval, the engine thread's and the isolation engines' together.
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
        #: each query's part of the last sample: its runs (in the main engine its branch's, shared evenly among
        #: the branch's queries) and its fraction of the CPU the engines spent over the interval, the engine
        #: thread's and the isolation engines' (0 while they were not busy: :data:`BUSY`)
        self.parts: dict[str, tuple[float, float]] = {}
        self._cpu: defaultdict[str, float] = defaultdict(float)
        self._cpu_at: float | None = None
        self._wall_at = time.monotonic()
        self._child_cpu: dict[str, float] = {}  # each isolated query's child's CPU seconds at the last sample
        #: the usage of the queries that run in isolation engines (yfpp.service.isolation), by name
        self.elsewhere: Callable[[], dict[str, dict[str, Any]]] = dict

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
                parts[str(name)] = (n / len(group), share / spent if live and spent > 0 else 0.0)
                if max_share is not None and busy and len(names) > 1 and share > max_share * spent:
                    over.append(str(name))
        for gone in set(self._cpu) - set(names):  # (deleted queries)
            del self._cpu[gone]
        self.by_name, self.parts = sample, self._across(parts, spent, interval)
        return over

    def _across(self, parts: dict[str, tuple[float, float]], spent: float,
                interval: float) -> dict[str, tuple[float, float]]:
        """``parts`` of the main engine (CPU as a fraction of the engine thread's ``spent``; 0 while no runs say
        whose it was) with the isolated queries' added, every CPU share now a fraction of the engines' CPU
        together over the ``interval``."""
        children = self.elsewhere()
        spent_by = {name: max(0.0, u["cpu_s"] - self._child_cpu.get(name, 0.0)) for name, u in children.items()}
        self._child_cpu = {name: u["cpu_s"] for name, u in children.items()}
        total = spent + sum(spent_by.values())
        busy = total >= BUSY * interval > 0
        main = spent / total if busy else 0.0
        out = {name: (runs, share * main) for name, (runs, share) in parts.items()}
        for name, u in children.items():
            out[name] = (u["runs"], spent_by[name] / total if busy else 0.0)
        return out

    def of(self, name: str) -> dict[str, Any]:
        """The last sample of query ``name`` (zeros before the first, and for an event-set query); ``engine`` says
        where it runs (``main``, or ``isolated`` with the child's ``pid``)."""
        return self.elsewhere().get(name) or self.by_name.get(name, {"runs": 0, "runs_shed": 0, "cpu_s": 0.0,
                                                                     "engine": "main"})
