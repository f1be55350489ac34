"""The engine agrees with the reference evaluator on generated patterns and streams."""

from __future__ import annotations

from collections import Counter

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.generators import patterns, streams
from yfpp.engine import Engine
from yfpp.input.events import Event
from yfpp.reference.oracle import reference_matches

SETTINGS = settings(max_examples=1500, deadline=None, suppress_health_check=list(HealthCheck))


def _canon(bindings: dict[str, list[int]]) -> tuple:
    return tuple((k, tuple(v)) for k, v in bindings.items())


def run_engine(pats, events: list[Event], **engine_opts):
    """Feed events one by one; return [(query, bindings, seq of the call that returned it or None)]."""
    eng = Engine(**engine_opts)
    for i, p in enumerate(pats):
        eng.register(p, name=f"q{i}")
    got = []
    for e in events:
        fresh = Event(e.type, e.ts, dict(e.attrs), e.seq)
        for m in eng.process(fresh):
            got.append((m["query"], _canon(m["bindings"]), e.seq))
    for m in eng.flush():
        got.append((m["query"], _canon(m["bindings"]), None))
    return got


def check(pats, events, **engine_opts):
    got = run_engine(pats, events, **engine_opts)
    want = []
    for i, p in enumerate(pats):
        trailing = not p.components[-1].positive
        for binds, done_at in reference_matches(p, events):
            want.append((f"q{i}", _canon(binds), None if trailing else done_at))
    if not any(not p.components[-1].positive for p in pats):
        assert Counter(got) == Counter(want)
    else:  # trailing negation: emitted when the deadline passes, not at completion
        assert Counter(g[:2] for g in got) == Counter(w[:2] for w in want)


@SETTINGS
@given(patterns(), streams())
def test_single_query_matches_reference(pattern, events):
    check([pattern], events)


@settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(patterns(max_positives=2), min_size=2, max_size=3), streams(max_events=9))
def test_several_queries_in_one_engine(pats, events):
    check(pats, events)


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(patterns(allow_negation=False), streams(max_events=14, types=["A", "B"]))
def test_longer_streams_without_negation(pattern, events):
    check([pattern], events)


def test_trailing_negation_emits_when_deadline_passes():
    eng = Engine()
    eng.register("PATTERN SEQ(shelf a, ~register b) WHERE [tag_id] WITHIN 10", name="lost")
    assert eng.process({"type": "shelf", "ts": 0, "tag_id": 1}) == []
    assert eng.process({"type": "shelf", "ts": 1, "tag_id": 2}) == []
    assert eng.process({"type": "register", "ts": 5, "tag_id": 2}) == []
    assert eng.process({"type": "other", "ts": 10, "tag_id": 9}) == []  # ts == deadline: not passed yet
    out = eng.advance_time(10.5)
    assert [m["bindings"] for m in out] == [{"a": [0]}]
    assert eng.flush() == []


def _negations_in_a_row(p) -> bool:
    return any(not a.positive and not b.positive for a, b in zip(p.components, p.components[1:]))


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(patterns().filter(_negations_in_a_row), streams(max_events=12))
def test_consecutive_negations_match_reference(pattern, events):
    check([pattern], events)


def test_consecutive_negations_in_both_languages():
    """docs/semantics.md §5: no B and no C between a and d (SASE+ `~B b, ~C c`, XPath `!B//!C`)."""
    feed = [("A", 0), ("B", 1), ("D", 2), ("A", 3), ("C", 4), ("D", 5), ("A", 6), ("X", 7), ("D", 8)]
    events = [Event(t, ts, {}, seq) for seq, (t, ts) in enumerate(feed)]
    for text in ("PATTERN SEQ(A a, ~B b, ~C c, D d)", "//A//!B//!C//D"):
        eng = Engine()
        eng.register(text, name="q")
        got = [list(m["bindings"].values()) for m in eng.process_all(Event(e.type, e.ts, {}, e.seq) for e in events)]
        assert got == [[[6], [8]]], text
