"""A run that has bound only its first event, a single one, has no buffer entry (``Runtime._start``): its vector
holds the event, and the entry is made (``Runtime._first_entry``) only when a later event needs one to point back to.

Property: the engine agrees with the reference when such runs go on into a component that needs the entry — also
one that a query registered later adds below the first component, so runs started before it are extended — and
across a checkpoint restored with run merging switched on or off (merging combines runs without entries)."""

from __future__ import annotations

import json
from collections import Counter

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.generators import CONTIGUITIES, TYPES, patterns, streams
from yfpp.input.dead_letters import DeadLetters
from yfpp.engine import Engine
from yfpp.input.events import Event
from yfpp.language.pattern import Component, Kind, Pattern
from yfpp.reference.oracle import reference_matches

SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))


@st.composite
def extended(draw) -> tuple[Pattern, Pattern]:
    """A pattern and the same pattern with one more component (sharing its nodes with it in the shared NFA)."""
    short = draw(patterns(max_positives=2))
    n = sum(c.positive for c in short.components)
    kind = draw(st.sampled_from([Kind.SINGLE, Kind.KLEENE]))
    contig = draw(st.sampled_from(CONTIGUITIES))
    more = Component(f"v{n}", draw(st.sampled_from(TYPES + [None])), kind, contig)
    long = Pattern((*short.components, more), short.where, short.partition_by, short.window, short.policy).validate()
    return short, long


def _matches(eng: Engine, events: list[Event]) -> list[dict]:
    return [m for e in events for m in eng.process(Event(e.type, e.ts, dict(e.attrs), e.seq))]


def _found(matches: list[dict]) -> Counter:
    return Counter((m["query"], json.dumps(m["bindings"], sort_keys=True)) for m in matches)


def _wanted(pattern: Pattern, name: str, events: list[Event]) -> Counter:
    return Counter((name, json.dumps(b, sort_keys=True)) for b, _ in reference_matches(pattern, events))


@SETTINGS
@given(extended(), streams(max_events=12), st.data(), st.booleans())
def test_runs_started_before_a_longer_query_was_registered_go_on_into_it(pair, events, data, merge_runs):
    short, long = pair
    cut = data.draw(st.integers(0, len(events)))
    eng = Engine(dead_letters=DeadLetters(), merge_runs=merge_runs)
    eng.register(short, name="short")
    out = _matches(eng, events[:cut])
    eng.register(long, name="long")  # it sees only the events from now on
    out += _matches(eng, events[cut:]) + eng.flush()
    assert _found(out) == _wanted(short, "short", events) + _wanted(long, "long", events[cut:])


@SETTINGS
@given(extended(), streams(max_events=12), st.data(), st.booleans())
def test_a_checkpoint_restored_with_or_without_merging_goes_on_exactly(pair, events, data, merge_runs):
    short, long = pair
    cut = data.draw(st.integers(0, len(events)))
    first = Engine(dead_letters=DeadLetters(), merge_runs=merge_runs)
    first.register(short, name="short")
    first.register(long, name="long")
    out = _matches(first, events[:cut])
    snapshot = json.loads(json.dumps(first.snapshot()))
    restored = Engine.restore(snapshot, dead_letters=DeadLetters(), merge_runs=not merge_runs)
    out += _matches(restored, events[cut:]) + restored.flush()
    assert _found(out) == _wanted(short, "short", events) + _wanted(long, "long", events)


def test_a_first_event_is_held_by_its_run_and_shared_by_the_runs_that_go_on_from_it():
    eng = Engine(dead_letters=DeadLetters())
    eng.register("PATTERN SEQ(a x, b+ y[], c z) WHERE skip_till_any_match(x, y, z)", name="q")
    eng.process({"type": "a", "ts": 0})
    assert eng.runtime.buffer.size == 0 and eng.stats.live_runs == 1  # the a is in the run's vector
    out = [m for t in "bbbc" for m in eng.process({"type": t, "ts": 1})]
    assert len(out) == 7  # every non-empty subset of the three b's
    runs = [r for store in eng.runtime._stores() for lst in store.values() for r in lst]
    waiting = [r for r in runs if r.state.node.index == 0]
    assert len(waiting) == 1 and waiting[0].entry is not None  # made when the first b needed it, then kept
    firsts = {id(e) for r in runs if r.state.node.index == 1 for e in _chain(r.entry)[:1]}
    assert firsts == {id(waiting[0].entry)}  # every run through the b's points back to that one entry
    assert eng.runtime.buffer.size == 3  # one entry per b (begun or taken, by every run) — none for the a


def _chain(entry) -> list:
    """The entries from the first back to ``entry`` along first pointers."""
    out = []
    while entry is not None:
        out.append(entry)
        entry = entry.pred
    return out[::-1]
