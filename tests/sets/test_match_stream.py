"""Matches go out as they are made (docs/operations.md, "Memory caps"): ``process_batch`` / ``flush`` /
``advance_time`` into an ``out`` give the list forms' matches in the same order, a search at a time, so
what one event releases — every match window it completes — is never held at once."""

from __future__ import annotations

import tracemalloc

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.generators import patterns, set_patterns, streams
from yfpp.sets import matcher
from yfpp.cli import write_matches
from yfpp.input.dead_letters import DeadLetters
from yfpp.engine import Engine
from yfpp.sets.matcher import EMIT_CHUNK
from yfpp.input.events import Event

FEEDBACK = "PATTERN {A a, B b} WITHIN 3 RETURN D(x = a.x) FEEDBACK"  # its derived D events reach untyped variables


class Sink:
    """An ``out`` that keeps the matches' ids in order and checks each ``extend`` is one chunk at most."""

    def __init__(self, keep: bool = True):
        self.ids: list[tuple] = []
        self.keep = keep
        self.count = 0

    def extend(self, matches):
        matches = list(matches)
        assert len(matches) <= EMIT_CHUNK
        self.count += len(matches)
        if self.keep:
            self.ids += [(m["query"], m["id"]) for m in matches]


def engine(pats, strategy: str, feedback: bool, delay: float, cap: int | None) -> Engine:
    caps = {} if cap is None else {"max_runs_per_query": cap, "max_buffer_per_query": cap}
    eng = Engine(strategy=strategy, max_delay=delay, reports=None, dead_letters=DeadLetters(), **caps)
    for i, p in enumerate(pats):
        eng.register(p, name=f"q{i}")
    if feedback:
        eng.register(FEEDBACK, name="fb")
    return eng


def copies(events: list[Event]) -> list[Event]:
    return [Event(e.type, e.ts, dict(e.attrs), e.seq) for e in events]


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(st.one_of(set_patterns(), patterns(max_positives=2)), min_size=1, max_size=3), streams(max_events=12),
       st.sampled_from(["direct", "match-window"]), st.booleans(), st.sampled_from([0, 0, 2]), st.sampled_from([None, 4]))
def test_streamed_and_list_forms_give_the_same_matches_in_the_same_order(pats, events, strategy, feedback, delay, cap):
    listed = engine(pats, strategy, feedback, delay, cap)
    want = []
    for i, e in enumerate(copies(events)):
        want += listed.process(e)
        if i % 4 == 3:
            want += listed.advance_time(e.ts + 1)
    want += listed.flush()
    streamed = engine(pats, strategy, feedback, delay, cap)
    out = Sink()
    evs = copies(events)
    for i in range(0, len(evs), 4):
        streamed.process_batch(evs[i:i + 4], out)
        streamed.advance_time(evs[i + 3].ts + 1, out) if i + 3 < len(evs) else None
    assert streamed.flush(out) is out
    assert out.ids == [(m["query"], m["id"]) for m in want]
    assert streamed.stats.matches == listed.stats.matches and streamed.stats.shed_runs == listed.stats.shed_runs


def windows_feed(partitions: int, per_type: int, closer: bool = True) -> list[dict]:
    """``partitions`` partitions of ``per_type`` A and B events within one τ; then (``closer``) an X
    far later, which completes every match window at once."""
    feed = [{"type": "AB"[i % 2], "ts": i, "k": k} for i in range(2 * per_type) for k in range(partitions)]
    return feed + ([{"type": "X", "ts": 1000, "k": 0}] if closer else [])


SEQ_AB = "PATTERN SEQ(A a, B b) WHERE skip_till_any_match(a, b) { [k] } WITHIN 100"
SET_AB = "PATTERN {A a, B+ b[]} WHERE [k] WITHIN 100"


@pytest.mark.parametrize("query", [SEQ_AB, SET_AB])
@pytest.mark.parametrize("at_the_end", [False, True])
def test_the_matches_one_event_releases_are_not_held_at_once(query, at_the_end):
    """One event (or the end of the input) completes 150 match windows with 6,000 matches in all: the
    list form holds them all at once, the streamed form one window's search."""

    def peak(streamed: bool) -> tuple[int, int]:
        eng = Engine(strategy="match-window", reports=None, dead_letters=DeadLetters())
        eng.register(query, name="q")
        feed = [Event(r["type"], float(r["ts"]), {"k": r["k"]}) for r in windows_feed(150, 5 if "+" in query else 8, not at_the_end)]
        last = [] if at_the_end else [feed.pop()]
        for ev in feed:
            assert eng.process(ev) == []
        tracemalloc.start()
        try:
            if streamed:
                n = eng.flush(eng.process_batch(last, Sink(keep=False))).count
            else:
                found = [m for ev in last for m in eng.process(ev)] + eng.flush()
                n = len(found)
            return tracemalloc.get_traced_memory()[1], n
        finally:
            tracemalloc.stop()

    (listed, n), (streamed, n_streamed) = peak(False), peak(True)
    assert n == n_streamed > 4000
    assert streamed * 10 < listed, (streamed, listed)


def test_yfpp_run_writes_the_matches_of_the_windows_one_event_completes_as_they_are_made(monkeypatch):
    """``yfpp run``'s loop (``write_matches``): at no time are more than one search's matches made and not
    yet written — at the event that completes every window, and at the end of the input."""
    made = []
    real = matcher.to_match
    monkeypatch.setattr(matcher, "to_match", lambda plan, b: made.append(1) or real(plan, b))

    class Writer(Sink):
        most = 0

        def extend(self, matches):
            Writer.most = max(Writer.most, len(made) - self.count)  # made and not yet written, this chunk's included
            super().extend(matches)

        def flush(self):
            pass

    for closer in (True, False):
        made.clear()
        eng = Engine(strategy="match-window", reports=None, dead_letters=DeadLetters())
        eng.register(SEQ_AB, name="q")
        feed = [Event(r["type"], float(r["ts"]), {"k": r["k"]}, i) for i, r in enumerate(windows_feed(100, 8, closer))]
        out = Writer(keep=False)
        write_matches(eng, [feed[:500], feed[500:]], out, None)
        assert out.count == len(made) == 100 * 36
    assert Writer.most <= 36  # one window's search: the matches that start at one A


def test_match_window_earliest_maximal_releases_complete_windows_without_holding_them():
    """Every window one event completes has all its matches: under ``earliest_maximal`` they go out
    then, rather than being held (and, over ``max_runs_per_query`` in all, dropped as the oldest)."""
    feed = windows_feed(40, 3)
    query = SET_AB + " OUTPUT earliest_maximal"

    def run(**caps) -> tuple[list, Engine]:
        eng = Engine(strategy="match-window", reports=None, dead_letters=DeadLetters(), **caps)
        eng.register(query, name="q")
        return [m["id"] for r in feed for m in eng.process(r)] + [m["id"] for m in eng.flush()], eng

    free, _ = run()
    capped, eng = run(max_runs_per_query=50)  # far above one window's search, below the 40 windows' matches
    assert len(free) > 50 and capped == free and not eng.stats.shed_runs
