"""Event-set patterns (SPEC §2.5): the engine's strategies agree with the reference on generated cases."""

from __future__ import annotations

from collections import Counter

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.generators import patterns, set_patterns, streams
from yfpp.engine import Engine
from yfpp.events import Event
from yfpp.reference import reference_matches

SETTINGS = settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))


def _canon(bindings: dict[str, list[int]]) -> tuple:
    return tuple((k, tuple(v)) for k, v in bindings.items())


def run(pats, events: list[Event], strategy: str) -> list[tuple]:
    """[(query, bindings, seq of the call that returned it or None at flush)]."""
    eng = Engine(strategy=strategy)
    for i, p in enumerate(pats):
        eng.register(p, name=f"q{i}")
    got = []
    for e in events:
        for m in eng.process(Event(e.type, e.ts, dict(e.attrs), e.seq)):
            got.append((m["query"], _canon(m["bindings"]), e.seq))
    got += [(m["query"], _canon(m["bindings"]), None) for m in eng.flush()]
    return got


def expected(pats, events: list[Event]) -> list[tuple]:
    return [(f"q{i}", _canon(b), at) for i, p in enumerate(pats) for b, at in reference_matches(p, events)]


def check(pats, events: list[Event]) -> None:
    want = expected(pats, events)
    direct = run(pats, events, "direct")
    if all(p.policy == "all" and p.components[-1].positive for p in pats):  # returned when completed
        assert Counter(direct) == Counter(want)
    else:
        assert Counter(g[:2] for g in direct) == Counter(w[:2] for w in want)
    windowed = run(pats, events, "match-window")  # returned once τ after its first event has passed
    assert Counter(g[:2] for g in windowed) == Counter(w[:2] for w in want)


@SETTINGS
@given(set_patterns(), streams(max_events=8))
def test_set_pattern_matches_reference(pattern, events):
    check([pattern], events)


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(set_patterns(types=["A", "B"]), streams(max_events=9, types=["A", "B"]))
def test_set_pattern_matches_reference_two_types(pattern, events):
    check([pattern], events)


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(st.one_of(set_patterns(max_vars=3), patterns(max_positives=2)), min_size=2, max_size=3), streams(max_events=8))
def test_set_and_ordinary_queries_share_one_engine(pats, events):
    check(pats, events)
