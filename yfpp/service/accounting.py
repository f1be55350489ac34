"""Each subscription's cost (docs/service.md, "Security"): what ``GET /subscriptions/{id}`` shows as ``usage``
and the metrics as ``yfpp_subscription_runs`` / ``yfpp_subscription_cpu_seconds``.

The engine thread samples once a second (less often when a sample would take
more than 1 % of its time: ``server.USAGE_SHARE``), holding ``engine_lock``: each
pattern query's live runs (those of its shared-NFA branch: the queries of one
branch share its runs), the runs shed by the engine's caps counted against
it, and an estimate of the engine CPU it took, the engine thread's CPU time
since the last sample shared out by live runs (evenly among a branch's
queries; evenly among all queries while none has runs). The loop reads the
last sample (:meth:`Usage.of`). :meth:`Usage.sample` also names the queries
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
    """The samples. Only the queries of branches with live runs are looked at one by one: the others' runs are 0
    and, while no query has runs, the CPU shared evenly among all is kept once, as :attr:`_even` (a sample that
    walked every query took 0.45 s of the engine thread at 100,000 of them)."""

    def __init__(self) -> None:
        #: each query's part of the last sample, of those on a branch with live runs (the others': 0, 0) and those
        #: in isolation engines: its runs (in the main engine its branch's, shared evenly among the branch's
        #: queries) and its fraction of the CPU the engines spent over the interval, the engine thread's and the
        #: isolation engines' (0 while they were not busy: :data:`BUSY`)
        self.parts: dict[str, tuple[float, float]] = {}
        self._runs: dict[str, int] = {}  # the live runs of each query's branch at the last sample (if not 0)
        self._shed: dict[str, int] = {}  # the runs shed, by query, at the last sample
        self._cpu: defaultdict[str, float] = defaultdict(float)  # the CPU attributed to a query by its runs
        self._even = 0.0  # the CPU each query was attributed while no query had runs, since the first sample
        self._joined: dict[str, float] = {}  # each query sampled: ``_even`` when it was first sampled
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
        rt = engine.runtime
        names = {str(p.name) for plans in rt.branch_queries.values() for p in plans}
        hot = [(root.live, [str(p.name) for p in plans]) for root, plans in rt.branch_queries.items() if root.live]
        live = sum(n for n, _ in hot)
        joined = self._joined
        for gone in joined.keys() - names:  # (deleted queries)
            del joined[gone]
            self._cpu.pop(gone, None)
        even = self._even
        for name in names - joined.keys():  # (new ones: from now on)
            joined[name] = even
        if not live and names:
            self._even += spent / len(names)
        over: list[str] = []
        runs: dict[str, int] = {}
        parts: dict[str, tuple[float, float]] = {}
        busy = bool(live) and spent >= BUSY * interval > 0
        for n, group in hot:
            share = spent * n / live / len(group)
            for name in group:
                self._cpu[name] += share
                runs[name] = n
                parts[name] = (n / len(group), share / spent if busy else 0.0)
                if max_share is not None and busy and len(names) > 1 and share > max_share * spent:
                    over.append(name)
        self._runs, self._shed = runs, {str(k): n for k, n in rt.counters.shed_runs.items()}
        self.parts = self._across(parts, spent, interval)
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
        elsewhere = self.elsewhere().get(name)
        if elsewhere:
            return elsewhere
        joined = self._joined.get(name)  # (None: not a query of the last sample)
        if joined is None:
            return {"runs": 0, "runs_shed": 0, "cpu_s": 0.0, "engine": "main"}
        return {"runs": self._runs.get(name, 0), "runs_shed": self._shed.get(name, 0),
                "cpu_s": round(self._cpu.get(name, 0.0) + self._even - joined, 3), "engine": "main"}

    def sampled(self) -> dict[str, dict[str, Any]]:
        """Every query's last sample (:meth:`of`), by name: what a worker engine's child reports."""
        return {name: self.of(name) for name in self._joined}
