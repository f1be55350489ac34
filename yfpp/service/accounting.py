"""Each subscription's cost (docs/service.md, "Security"): what ``GET /subscriptions/{id}`` shows as ``usage``
and the metrics as ``yfpp_subscription_runs`` / ``yfpp_subscription_cpu_seconds``.

The engine thread samples once a second (less often when a sample would take
more than 1 % of its time: ``server.USAGE_SHARE``), holding ``engine_lock``: each
pattern query's live runs (those of its shared-NFA branch: the queries of one
branch share its runs) and its branch's buffered events, the runs shed by the engine's caps counted against
it, and an estimate of the engine CPU it took, the engine thread's CPU time
since the last sample shared out by live runs (evenly among a branch's
queries; evenly among all queries while none has runs). The loop reads the
last sample (:meth:`Usage.of`). :meth:`Usage.sample` also names the queries
whose share of the engine thread's CPU over the last interval is over a bound
(the service moves them to isolation engines, or suspends them).

A query moved to an isolation engine reports its own usage (its child's runs
and CPU, ``engine`` ``isolated``: :attr:`Usage.elsewhere`); the sample takes it
in :attr:`Usage.parts` as well, so the per-key quotas count a key's runs,
buffered events and CPU wherever its queries run: a part's CPU share is of the
engines' CPU over the interval, the engine thread's and the isolation engines'
together.
"""

from __future__ import annotations

import threading
import time
from collections import Counter, defaultdict
from collections.abc import Mapping
from typing import Any, Callable, Iterator, Sequence

from yfpp.engine import Engine


BUSY = 0.1  #: a query is over its CPU share only while the engine thread is busy this fraction of the time at least

Part = tuple[float, float, float]  #: a query's part of a sample: runs, CPU share, buffered events (:attr:`Usage.parts`)


def buffered_by_branch(engine: Engine) -> Counter:
    """The events each shared-NFA branch (by its root) holds in the match buffer for its runs."""
    rt = engine.runtime
    sizes: Counter = Counter()
    for node in rt.buffer.stacks():
        sizes[node.root] += rt.buffer.count_from(node, 0)
    return sizes


class Usage:
    """The samples. Only the queries of branches with live runs are looked at one by one: the others' runs are 0
    and, while no query has runs, the CPU shared evenly among all is kept once, as :attr:`_even` (a sample that
    walked every query took 0.45 s of the engine thread at 100,000 of them); every query's name is read only
    after queries came or went (60 ms at 100,000)."""

    def __init__(self) -> None:
        #: each query's part of the last sample, of those on a branch with live runs (the others': 0, 0, 0) and
        #: those in isolation engines: its runs (in the main engine its branch's, shared evenly among the branch's
        #: queries), its fraction of the CPU the engines spent over the interval, the engine thread's and the
        #: isolation engines' (0 while they were not busy: :data:`BUSY`), and its buffered events (shared as its runs)
        self.parts: dict[str, Part] = {}
        self._runs: dict[str, int] = {}  # the live runs of each query's branch at the last sample (if not 0)
        self._buffered: dict[str, int] = {}  # the buffered events of each of those queries' branch
        self._shed: dict[str, int] = {}  # the runs shed, by query, at the last sample
        self._cpu: defaultdict[str, float] = defaultdict(float)  # the CPU attributed to a query by its runs
        self._even = 0.0  # the CPU each query was attributed while no query had runs, since the first sample
        self._joined: dict[str, float] = {}  # each query sampled: ``_even`` when it was first sampled
        self._queries_seen: tuple[Any, int] | None = None  # the runtime and its ``queries_changed`` at the last sample
        self._cpu_at: float | None = None
        self._wall_at = time.monotonic()
        self._child_cpu: dict[str, float] = {}  # each isolated query's child's CPU seconds at the last sample
        self._came: list[str] = []  # the queries first sampled at the last sample
        self._went: list[str] = []  # the queries gone since the sample before
        self._moved: set[str] = set()  # the queries whose runs, shed runs or own CPU moved at the last sample
        self.spent = 0.0  #: the engine thread's CPU seconds over the samples (what a child reports it spent)
        #: the usage of the queries that run in isolation engines (yfpp.service.isolation), by name
        self.elsewhere: Callable[[], dict[str, dict[str, Any]]] = dict
        #: the worker engines' children's last reports (yfpp.service.worker_engines), one per child
        self.shares: Callable[[], Sequence[Reported]] = tuple

    def sample(self, engine: Engine, max_share: float | None = None) -> list[str]:
        """(engine thread, holding ``engine_lock``) Take a sample; return the queries attributed more than
        ``max_share`` of the engine thread's CPU time since the last sample, while it was busy (:data:`BUSY`) and
        there are several queries to protect."""
        now, wall = time.thread_time(), time.monotonic()
        spent, self._cpu_at = (now - self._cpu_at if self._cpu_at is not None else 0.0), now
        interval, self._wall_at = wall - self._wall_at, wall
        self.spent += spent
        rt = engine.runtime
        hot = [(root, [str(p.name) for p in plans]) for root, plans in rt.branch_queries.items() if root.live]
        live = sum(root.live for root, _ in hot)
        joined = self._joined
        self._went, self._came = [], []
        if (rt, rt.queries_changed) != self._queries_seen:  # (the names of every query: only after a change)
            self._queries_seen = (rt, rt.queries_changed)
            names = {str(p.name) for plans in rt.branch_queries.values() for p in plans}
            self._went = list(joined.keys() - names)
            for gone in self._went:  # (deleted queries)
                del joined[gone]
                self._cpu.pop(gone, None)
            even = self._even
            self._came = list(names - joined.keys())
            for name in self._came:  # (new ones: from now on)
                joined[name] = even
        if not live and joined:
            self._even += spent / len(joined)
        over: list[str] = []
        runs: dict[str, int] = {}
        buffered: dict[str, int] = {}
        sizes = buffered_by_branch(engine) if hot else Counter()
        parts: dict[str, Part] = {}
        busy = bool(live) and spent >= BUSY * interval > 0
        for root, group in hot:
            n = root.live
            share = spent * n / live / len(group)
            for name in group:
                self._cpu[name] += share
                runs[name] = n
                buffered[name] = sizes[root]
                parts[name] = (n / len(group), share / spent if busy else 0.0, sizes[root] / len(group))
                if max_share is not None and busy and len(joined) > 1 and share > max_share * spent:
                    over.append(name)
        shed = {str(k): n for k, n in rt.counters.shed_runs.items()}
        self._moved = runs.keys() | self._runs.keys() | {k for k, n in shed.items() if self._shed.get(k) != n}
        self._runs, self._shed, self._buffered = runs, shed, buffered
        self.parts = self._across(parts, spent, interval)
        return over

    def _across(self, parts: dict[str, Part], spent: float, interval: float) -> dict[str, Part]:
        """``parts`` of the main engine (CPU as a fraction of the engine thread's ``spent``; 0 while no runs say
        whose it was) with the isolated queries' added and the worker children's that changed, every CPU share now
        a fraction of the engines' CPU together over the ``interval``."""
        children = self.elsewhere()
        spent_by = {name: max(0.0, u["cpu_s"] - self._child_cpu.get(name, 0.0)) for name, u in children.items()}
        self._child_cpu = {name: u["cpu_s"] for name, u in children.items()}
        shares = [share.changes() for share in self.shares()]
        total = spent + sum(spent_by.values()) + sum(cpu for cpu, _ in shares)
        busy = total >= BUSY * interval > 0
        main = spent / total if busy else 0.0
        out = {name: (runs, share * main, buffered) for name, (runs, share, buffered) in parts.items()}
        for name, u in children.items():
            out[name] = (u["runs"], spent_by[name] / total if busy else 0.0, u["buffered"])
        for _, changed in shares:
            for name, (runs, cpu, buffered) in changed.items():
                out[name] = (runs, cpu / total if busy else 0.0, buffered)
        return out

    def of(self, name: str) -> dict[str, Any]:
        """The last sample of query ``name`` (zeros before the first, and for an event-set query); ``engine`` says
        where it runs (``main``, or ``isolated`` with the child's ``pid``)."""
        elsewhere = self.elsewhere().get(name)
        if elsewhere:
            return elsewhere
        for share in self.shares():
            if name in share:
                return share[name]
        joined = self._joined.get(name)  # (None: not a query of the last sample)
        if joined is None:
            return {"runs": 0, "runs_shed": 0, "buffered": 0, "cpu_s": 0.0, "engine": "main"}
        return {"runs": self._runs.get(name, 0), "runs_shed": self._shed.get(name, 0),
                "buffered": self._buffered.get(name, 0),
                "cpu_s": round(self._cpu.get(name, 0.0) + self._even - joined, 3), "engine": "main"}

    def report(self) -> tuple[float, dict[str, float], list[str], dict[str, tuple[int, int, float, int]], float]:
        """What a worker engine's child sends of the last sample (:class:`Reported` takes it), costing only the
        queries that came, went or moved (their runs, shed runs or own CPU), not one step per query: the CPU shared
        evenly so far, the queries first sampled (with the even share when they came), those gone, the moved
        ones' ``(runs, runs_shed, own CPU, buffered events)``, and the CPU spent over the samples."""
        joined, cpu = self._joined, self._cpu
        moved = {name: (self._runs.get(name, 0), self._shed.get(name, 0), cpu.get(name, 0.0), self._buffered.get(name, 0))
                 for name in self._moved if name in joined}
        return self._even, {name: joined[name] for name in self._came}, self._went, moved, self.spent


class Reported(Mapping):
    """A worker engine child's queries' last samples (as :meth:`Usage.of` gives them, with ``engine`` and ``pid``),
    by name, kept up to date from its reports (:meth:`Usage.report`): only what a report names is touched. The
    reports are taken in the child's reader thread, :meth:`changes` in the engine thread."""

    def __init__(self, engine: str, pid: int) -> None:
        self.engine, self.pid = engine, pid
        self._even = 0.0
        self._joined: dict[str, float] = {}  # each query's even share when it came
        self._moved: dict[str, tuple[int, int, float, int]] = {}  # (runs, runs_shed, own CPU, buffered) of those that ever moved
        self._sets: dict[str, dict[str, Any]] = {}  # the event-set queries' (no runs: zeros)
        self._spent = self._spent_seen = 0.0  # the child's CPU over its samples: reported, and at the last changes()
        self._live: set[str] = set()  # the queries with runs at the child's last sample
        self._touched: set[str] = set()  # the queries a report named as moved since the last changes()
        self._seen: dict[str, float] = {}  # each query's own CPU at the last changes() that named it
        self._lock = threading.Lock()  # (take and changes on their two threads: a report is seen whole or not yet)

    def take(self, report: tuple, sets: list[str] | None) -> None:
        """A child's report; ``sets``: its event-set queries' names (None: the same as before)."""
        with self._lock:
            even, came, went, moved, self._spent = report
            self._even = even
            for name in went:
                self._joined.pop(name, None)
                self._moved.pop(name, None)
                self._live.discard(name)
                self._seen.pop(name, None)
            self._joined.update(came)
            self._moved.update(moved)
            for name, (runs, *_) in moved.items():
                (self._live.add if runs else self._live.discard)(name)
            self._touched.update(moved)
            if sets is not None:
                self._sets = {name: {"runs": 0, "runs_shed": 0, "buffered": 0, "cpu_s": 0.0, "engine": self.engine,
                                     "pid": self.pid}
                              for name in sets}

    def changes(self) -> tuple[float, dict[str, tuple[int, float, int]]]:
        """The child's CPU seconds since the last call and, of its queries with live runs or whose own CPU moved
        since then, ``(runs, own CPU seconds since then, buffered events)``: only those are looked at."""
        with self._lock:
            spent = self._spent
            spent, self._spent_seen = spent - self._spent_seen, spent
            touched, self._touched = self._touched, set()
            out: dict[str, tuple[int, float, int]] = {}
            for name in touched | self._live:
                runs, _, cpu, buffered = self._moved.get(name, (0, 0, 0.0, 0))
                moved = max(0.0, cpu - self._seen.get(name, 0.0))
                self._seen[name] = cpu
                if runs or moved:
                    out[name] = (runs, moved, buffered)
            return spent, out

    def __getitem__(self, name: str) -> dict[str, Any]:
        joined = self._joined.get(name)
        if joined is None:
            return self._sets[name]
        runs, shed, cpu, buffered = self._moved.get(name, (0, 0, 0.0, 0))
        return {"runs": runs, "runs_shed": shed, "buffered": buffered, "cpu_s": round(cpu + self._even - joined, 3),
                "engine": self.engine, "pid": self.pid}

    def __contains__(self, name: object) -> bool:  # (not Mapping's: a KeyError raised and caught per miss)
        return name in self._joined or name in self._sets

    def __iter__(self) -> Iterator[str]:  # (an event-set query is no pattern query: the names are apart)
        yield from self._sets
        yield from self._joined

    def __len__(self) -> int:
        return len(self._sets) + len(self._joined)
