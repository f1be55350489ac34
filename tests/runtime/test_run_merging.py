"""Run merging (SIGMOD 2008 §5.2.2, ``Engine(merge_runs=True)``): the same matches, fewer runs stepped."""

from __future__ import annotations

import dataclasses
import json
from collections import Counter

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.generators import patterns, streams
from tests.state.test_checkpoint import feed, finish
from tests.test_engine_vs_reference import check
from yfpp.input.dead_letters import DeadLetters
from yfpp.engine import Engine
from yfpp.input.events import Event
from yfpp.input.generate import generate_stock

FAST = settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
STOCK_P2_S3 = ("PATTERN SEQ(stock+ a[], stock b) WHERE skip_till_next_match(a, b) { [symbol] AND a[1].price % 500 = 0 "
               "AND a[i].price > a[i-1].price AND b.volume < 150 } WITHIN 1000")


def merging_engine(pats, **opts) -> Engine:
    eng = Engine(merge_runs=True, dead_letters=DeadLetters(), **opts)
    for i, p in enumerate(pats):
        eng.register(p, name=f"q{i}")
    return eng


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(patterns(), streams(max_events=14, types=["A", "B"]))
def test_one_query_with_merging_matches_reference(pattern, events):
    check([pattern], events, merge_runs=True)


@FAST
@given(st.lists(patterns(max_positives=2), min_size=2, max_size=3), streams(max_events=12, types=["A", "B"]))
def test_several_queries_in_one_engine_with_merging(pats, events):
    check(pats, events, merge_runs=True)


@FAST
@given(patterns(), st.lists(st.one_of(st.none(), st.integers(0, 6)), min_size=1, max_size=2),
       streams(max_events=14, types=["A", "B"]))
def test_queries_sharing_nodes_with_other_windows(pattern, windows, events):
    """The same pattern under other windows shares its nodes: merged runs split by the windows their starts pass."""
    trailing = not pattern.components[-1].positive  # needs a window
    pats = [pattern] + [dataclasses.replace(pattern, window=w if w is not None or not trailing else 3).validate()
                        for w in windows]
    check(pats, events, merge_runs=True)


@FAST
@given(st.lists(patterns(), min_size=1, max_size=2), streams(max_events=14, types=["A", "B"]), st.data())
def test_restore_mid_stream_with_merging(pats, events, data):
    """A checkpoint of a merging engine (merged runs stored as their members) goes on exactly as without merging."""
    plain = Engine(dead_letters=DeadLetters())
    for i, p in enumerate(pats):
        plain.register(p, name=f"q{i}")
    want = feed(plain, events) + finish(plain)
    cut = data.draw(st.integers(0, len(events)))
    first = merging_engine(pats)
    before = feed(first, events[:cut])
    restored = Engine.restore(json.loads(json.dumps(first.snapshot())), dead_letters=DeadLetters())
    assert restored.runtime.merger is not None  # the option travels with the checkpoint
    after = feed(restored, events[cut:]) + finish(restored)
    assert Counter(before + after) == Counter(want)


def _live_runs(eng: Engine) -> Counter:
    """Every live run (merged runs as their members) by state, key, start and the events it bound."""
    from yfpp.state.checkpoint import NodeRefs, _state_ref
    from yfpp.runtime.run_merging import as_plain_runs

    rt = eng.runtime
    refs = NodeRefs(eng)  # states named as checkpoints name them: the same in both engines
    out: Counter = Counter()
    for store in rt._stores():
        for state, runs in store.items():
            where = repr(_state_ref(state, refs))
            for r in (x for run in runs for x in as_plain_runs(run)):
                binds = tuple((u, e.pos) for u, e in rt.bound(r))
                out[(where, repr(r.key), r.first_pos, r.born, binds, len(r.blocked))] += 1
    return out


@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(patterns(), min_size=1, max_size=2), streams(max_events=16, types=["A", "B"]))
def test_merged_runs_stand_for_exactly_the_runs_without_merging(pats, events):
    """After every event, the merged runs' members are the runs an engine without merging holds, and the matches agree."""
    plain = Engine(dead_letters=DeadLetters())
    for i, p in enumerate(pats):
        plain.register(p, name=f"q{i}")
    merged = merging_engine(pats)
    for e in events:
        assert sorted(feed(merged, [e])) == sorted(feed(plain, [e]))
        assert _live_runs(merged) == _live_runs(plain)
    assert sorted(finish(merged)) == sorted(finish(plain))


def test_members_leave_a_merged_run_when_their_window_passes():
    """Two A runs merge waiting for B; the older one expires first and takes no more B."""
    q = "PATTERN SEQ(A a, B b) WHERE skip_till_any_match(a, b) WITHIN 3"
    rows = [("A", 0), ("A", 1), ("B", 2), ("B", 3), ("B", 4), ("B", 5)]
    events = [Event(t, float(ts), {}, i) for i, (t, ts) in enumerate(rows)]
    plain = Engine(dead_letters=DeadLetters())
    plain.register(q, name="q0")
    merged = merging_engine([q])
    sizes = []
    for e in events:
        assert feed(merged, [e]) == feed(plain, [e])
        assert _live_runs(merged) == _live_runs(plain)
        sizes.append([len(r.members or ()) for runs in merged.runtime.unkeyed.values() for r in runs])
    assert sizes[2:5] == [[2], [2], [0]]  # merged at the first B; at ts 4 only the younger A is left


def _stock(n: int) -> list[Event]:
    return [Event(r["type"], r["ts"], {k: v for k, v in r.items() if k not in ("type", "ts")}, seq)
            for seq, r in enumerate(generate_stock(n, symbols=2, p_up=1 / 3, seed=3))]


def test_stock_query_merges_runs_and_keeps_every_match():
    """p2/s3 of the stock workload: the same match dicts, far fewer runs touched per event."""
    events = _stock(4000)
    out = {}
    for merge in (False, True):
        eng = Engine(merge_runs=merge, dead_letters=DeadLetters())
        eng.register(STOCK_P2_S3, name="p2s3")
        out[merge] = (sorted(feed(eng, events) + finish(eng)), eng.stats.runs_touched)
    assert out[True][0] == out[False][0] and out[True][0]
    assert out[True][1] < out[False][1] / 2


def test_return_values_and_negation_intervals_keep_merged_runs_apart():
    """RETURN reads an aggregate and a negation cuts at a's last event: runs differing there never merge."""
    q = ("PATTERN SEQ(A+ a[], ~N n, B b) WHERE skip_till_any_match(a, b) { [k] AND n.x = a[a.len].x } "
         "WITHIN 8 RETURN R(total = sum(a[..].x), length = a.len)")
    rows = [("A", 1), ("A", 2), ("A", 1), ("N", 1), ("A", 2), ("B", 0), ("A", 1), ("N", 2), ("B", 0), ("B", 3)]
    events = [Event(t, float(i), {"k": 0, "x": x}, i) for i, (t, x) in enumerate(rows)]
    got = {}
    for merge in (False, True):
        eng = Engine(merge_runs=merge, dead_letters=DeadLetters())
        eng.register(q, name="r")
        got[merge] = sorted(feed(eng, events) + finish(eng))
    assert got[True] == got[False] and got[True]


def test_cli_merge_runs_flag(tmp_path):
    from yfpp.cli import main

    feed_file = tmp_path / "ticks.jsonl"
    feed_file.write_text("".join(json.dumps({"type": e.type, "ts": e.ts, **e.attrs}) + "\n" for e in _stock(4000)))
    outs = []
    for flag in ("--merge-runs", "--no-merge-runs"):
        out = tmp_path / f"{flag}.jsonl"
        assert main(["run", "-q", STOCK_P2_S3, "-i", str(feed_file), flag, "-o", str(out), "--progress", "never"]) == 0
        outs.append(sorted(out.read_text().splitlines()))
    assert outs[0] == outs[1] and outs[0]
