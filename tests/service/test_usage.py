"""The service's usage samples (``yfpp.service.accounting.Usage``) against a plain account of them: every query's
runs, runs shed, buffered events, CPU share and the queries over their share, through registrations, deletions, runs and quiet
times; a sample looks one by one only at the queries of branches with live runs, and so does a worker engine
child's report of it (``Usage.report``), which the service's ``Reported`` turns back into every query's sample."""

from __future__ import annotations

import types
from collections import defaultdict

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("fastapi", reason="the service needs pip install -e '.[serve]' in yfpp's clone")

from yfpp.engine import Engine  # noqa: E402
from yfpp.service import accounting  # noqa: E402
from yfpp.service.accounting import BUSY, Reported, Usage, buffered_by_branch  # noqa: E402

QUERIES = ["PATTERN SEQ(a x, b y) WHERE skip_till_any_match(x, y) {{ x.k = {k} }} WITHIN 100",
           "PATTERN SEQ(a x, c y) WITHIN 100", "PATTERN SEQ(b x, c y) WHERE x.k = y.k WITHIN 5",
           "PATTERN SEQ(a x, b+ y, c z) WITHIN 100"]


class Account:
    """Each query's CPU share added up one by one, as a sample of every query makes it."""

    def __init__(self) -> None:
        self.cpu: defaultdict[str, float] = defaultdict(float)
        self.by_name: dict[str, dict] = {}
        self.parts: dict[str, tuple[float, float, float]] = {}
        self.first = True

    def sample(self, engine: Engine, spent: float, interval: float, max_share: float | None) -> list[str]:
        """``spent``: the engine thread's CPU seconds in the ``interval`` since the last sample (the first
        sample's: none)."""
        spent, self.first = (0.0 if self.first else spent), False
        rt = engine.runtime
        branches = [(root.live, [str(p.name) for p in plans], root) for root, plans in rt.branch_queries.items()]
        live = sum(n for n, _, _ in branches)
        names = [name for _, group, _ in branches for name in group]
        busy = bool(live) and spent >= BUSY * interval > 0
        over, self.by_name, self.parts = [], {}, {}
        sizes = buffered_by_branch(engine)
        for n, group, root in branches:
            share = spent * n / live / len(group) if live else spent / len(names)
            for name in group:
                self.cpu[name] += share
                buffered = sizes[root] if n else 0  # (a branch without runs is not looked at)
                self.by_name[name] = {"runs": n, "runs_shed": rt.counters.shed_runs.get(name, 0), "buffered": buffered,
                                      "cpu_s": self.cpu[name]}
                self.parts[name] = (n / len(group), share / spent if busy else 0.0, buffered / len(group))
                if max_share is not None and busy and len(names) > 1 and share > max_share * spent:
                    over.append(name)
        for gone in set(self.cpu) - set(names):
            del self.cpu[gone]
        return over


steps = st.lists(st.one_of(
    st.tuples(st.just("register"), st.integers(0, len(QUERIES) - 1), st.integers(0, 3)),
    st.tuples(st.just("unregister"), st.integers(0, 20)),
    st.tuples(st.just("events"), st.lists(st.tuples(st.sampled_from("abc"), st.integers(0, 3)), max_size=12)),
    st.tuples(st.just("sample"), st.integers(0, 16).map(lambda n: n / 8), st.integers(1, 40).map(lambda n: n / 8),
              st.sampled_from([None, 0.2, 0.6]))),  # (the clock's seconds in eighths: exact sums)
    max_size=30)



class Driven:
    """An engine put through a script's steps other than samples: registrations, deletions, events."""

    def __init__(self, eng: Engine) -> None:
        self.eng, self.made, self.ts = eng, 0, 0.0

    def apply(self, step: tuple) -> None:
        eng = self.eng
        if step[0] == "register":
            self.made += 1
            eng.register(QUERIES[step[1]].format(k=step[2]), name=f"q{self.made}")
        elif step[0] == "unregister" and eng.sources:
            eng.unregister(sorted(eng.sources)[step[1] % len(eng.sources)])
        elif step[0] == "events":
            for etype, k in step[1]:
                self.ts += 1
                eng.process({"type": etype, "ts": self.ts, "k": k})

@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(steps)
def test_a_sample_says_what_a_sample_of_every_query_says(monkeypatch, script):
    clock = types.SimpleNamespace(cpu=0.0, wall=0.0)
    monkeypatch.setattr(accounting, "time", types.SimpleNamespace(thread_time=lambda: clock.cpu,
                                                                  monotonic=lambda: clock.wall))
    eng = Engine(max_runs_per_query=3)  # (a cap: some runs are shed)
    usage, account = Usage(), Account()
    reported = Reported("worker 1", 7)  # (what a worker engine's child's reports leave in the service)
    driven = Driven(eng)
    for step in script:
        driven.apply(step)
        if step[0] == "sample":
            _, spent, interval, max_share = step
            clock.cpu += spent
            clock.wall += interval
            assert usage.sample(eng, max_share) == account.sample(eng, spent, interval, max_share)
            assert usage.parts == {name: part for name, part in account.parts.items() if part[0]}
            reported.take(usage.report(), [])
            assert dict(reported) == {name: {**usage.of(name), "engine": "worker 1", "pid": 7} for name in account.by_name}
            for name in {f"q{i}" for i in range(driven.made + 2)}:
                got = usage.of(name)
                want = account.by_name.get(name, {"runs": 0, "runs_shed": 0, "buffered": 0, "cpu_s": 0.0})
                assert (got["runs"], got["runs_shed"], got["buffered"], got["engine"]) == (
                    want["runs"], want["runs_shed"], want["buffered"], "main")
                assert got["cpu_s"] == pytest.approx(round(want["cpu_s"], 3), abs=1.001e-3)


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(steps, st.lists(st.booleans(), max_size=30))
def test_a_sample_takes_of_a_worker_child_only_its_changed_queries(monkeypatch, script, reports):
    """The main engine's sample with a worker engine's child (its reports, some of them taken only after the main
    engine's next sample: ``reports``): the child's queries with runs, or whose own CPU moved since the last sample, with their
    runs and that CPU over the engines' together — what walking every child query's own CPU gives."""
    clock = types.SimpleNamespace(cpu=0.0, wall=0.0)
    monkeypatch.setattr(accounting, "time", types.SimpleNamespace(thread_time=lambda: clock.cpu,
                                                                  monotonic=lambda: clock.wall))
    child_engine, main_engine = Engine(max_runs_per_query=3), Engine()
    child, main = Usage(), Usage()
    reported = Reported("worker 1", 7)
    main.shares = lambda: [reported]
    own: defaultdict[str, float] = defaultdict(float)  # each child query's CPU while its runs said whose
    seen: dict[str, float] = {}  # ... at the main engine's last sample
    runs: dict[str, tuple[int, int]] = {}  # each child query's branch's runs and buffered events at the child's last report taken
    child_spent = seen_spent = 0.0
    pending: list[tuple] = []  # the child's reports not taken yet
    driven, first = Driven(child_engine), True
    for step, take in zip(script, reports + [True] * len(script)):
        driven.apply(step)
        if step[0] == "sample":
            _, spent, interval, _ = step
            clock.cpu += spent
            clock.wall += interval
            child.sample(child_engine)  # (the child's and the main's thread clocks: the same fake one)
            pending.append(child.report())
            rt = child_engine.runtime
            branches = [(root.live, [str(p.name) for p in plans], root) for root, plans in rt.branch_queries.items()]
            live = sum(n for n, _, _ in branches)
            if not first:
                for n, group, _ in branches:
                    for name in group:
                        own[name] += spent * n / live / len(group) if n else 0.0
            if take:
                for report in pending:
                    reported.take(report, [])
                pending.clear()
                sizes = buffered_by_branch(child_engine)
                runs = {name: (n, sizes[root] if n else 0) for n, group, root in branches for name in group}
                child_spent = child.spent
                for gone in set(own) - runs.keys():  # (deleted queries: gone once a report says so)
                    del own[gone]
                    seen.pop(gone, None)
            main.sample(main_engine)
            total = 0.0 if first else spent + child_spent - seen_spent
            busy = total >= BUSY * interval > 0
            want = {}
            for name, (n, buffered) in runs.items():
                moved = own[name] - seen.get(name, 0.0) if take else 0.0
                if n or moved:
                    want[name] = (n, moved / total if busy else 0.0, buffered)
            if take:
                seen.update({name: own[name] for name in runs})
            seen_spent, first = child_spent, False
            assert main.parts.keys() == want.keys()
            for name, (n, share, buffered) in want.items():
                assert main.parts[name][0] == n and main.parts[name][1] == pytest.approx(share, abs=1e-9)
                assert main.parts[name][2] == buffered
                assert main.of(name) == reported[name]


def test_a_sample_reads_every_query_s_name_only_after_queries_came_or_went():
    """(reading every query's name took 60 ms of the engine thread a sample at 100,000 queries)"""
    read: list[str] = []

    class Name(str):
        def __str__(self) -> str:
            read.append(self)
            return str.__str__(self)

    engine = Engine()
    for k in range(3):
        engine.register(QUERIES[1], name=Name(f"q{k}"))
    usage = Usage()
    usage.sample(engine)
    assert sorted(read) == ["q0", "q1", "q2"] and sorted(usage.report()[1]) == ["q0", "q1", "q2"]
    read.clear()
    usage.sample(engine)
    assert read == [] and usage.report()[1:3] == ({}, [])
    engine.register(QUERIES[2], name=Name("q3"))
    engine.unregister(next(qid for qid, plan in engine.queries.items() if plan.name == "q0"))
    usage.sample(engine)
    assert sorted(read) == ["q1", "q2", "q3"] and list(usage.report()[1]) == ["q3"] and usage.report()[2] == ["q0"]
