"""Reordering (issue 8 items 1-2): with max_delay, "between" and ordering go by stream order (ts, seq)."""

from __future__ import annotations

import io
import json
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.generators import patterns, streams
from yfpp.cli import main
from yfpp.input.dead_letters import DeadLetters
from yfpp.engine import Engine
from yfpp.errors import YfppError
from yfpp.input.events import Event
from yfpp.language.query_text import load_queries

ROOT = Path(__file__).resolve().parents[2]
DELAY = 3


def matches(pats, events, max_delay: float, rename: dict[int, int] | None = None) -> Counter:
    """The matches of feeding ``events`` (their seq as given), bindings renamed by ``rename``."""
    eng = Engine(max_delay=max_delay, dead_letters=DeadLetters())
    for i, p in enumerate(pats):
        eng.register(p, name=f"q{i}")
    out = []
    for e in events:
        out += eng.process(Event(e.type, e.ts, dict(e.attrs), e.seq))
    out += eng.flush()
    assert eng.dead_letters.count == 0
    rename = rename or {}
    return Counter(
        (m["query"], json.dumps({v: [rename.get(s, s) for s in seqs] for v, seqs in m["bindings"].items()})) for m in out
    )


@st.composite
def arrivals(draw, events: list[Event]) -> list[Event]:
    """The events in an arrival order where none comes ``DELAY`` or more after one with a later ts,
    numbered in that order (as a reader numbers what it reads)."""
    jitter = [draw(st.floats(0, DELAY - 0.01)) for _ in events]
    order = sorted(range(len(events)), key=lambda i: (events[i].ts + jitter[i], draw(st.integers(0, 9))))
    return [Event(events[i].type, events[i].ts, dict(events[i].attrs), n) for n, i in enumerate(order)]


@settings(max_examples=600, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.data(), st.lists(patterns(), min_size=1, max_size=2), streams(max_events=12))
def test_shuffled_feed_within_max_delay_gives_the_sorted_feeds_matches(data, pats, events):
    arrived = data.draw(arrivals(events))
    in_order = sorted(arrived, key=lambda e: (e.ts, e.seq))  # what the reorder buffer must release
    sorted_seq = {e.seq: n for n, e in enumerate(in_order)}
    renumbered = [Event(e.type, e.ts, dict(e.attrs), n) for n, e in enumerate(in_order)]
    assert matches(pats, arrived, DELAY, sorted_seq) == matches(pats, renumbered, 0)


def test_negation_uses_stream_order_not_arrival():
    # the repro: register arrives first but has a later ts than the shelf
    eng = Engine(max_delay=5)
    [q] = load_queries([str(ROOT / "queries/shoplifting.sase")])
    eng.register(q.text, name="shop")
    feed = [{"type": "register", "ts": 2, "tag_id": 7}, {"type": "shelf", "ts": 1, "tag_id": 7}, {"type": "exit", "ts": 3, "tag_id": 7}]
    assert [m for r in feed for m in eng.process(r)] + eng.flush() == []


def test_trailing_negation_killed_by_an_event_that_arrived_early():
    eng = Engine(max_delay=5)
    eng.register("PATTERN SEQ(shelf a, ~register b) WHERE [tag_id] WITHIN 10", name="lost")
    feed = [{"type": "register", "ts": 4, "tag_id": 1}, {"type": "shelf", "ts": 3, "tag_id": 1}]
    assert [m for r in feed for m in eng.process(r)] + eng.flush() == []


def test_non_overlapping_ranks_by_stream_order():
    recs = [{"type": "b", "ts": 2, "k": 1}, {"type": "a", "ts": 1.5, "k": 1}, {"type": "a", "ts": 1, "k": 1}, {"type": "c", "ts": 9, "k": 1}]
    eng = Engine(max_delay=5, policy="non_overlapping")
    eng.register("PATTERN SEQ(a x, b y) WHERE skip_till_any_match(x, y) { [k] }", name="q")
    out = [m for r in recs for m in eng.process(r)] + eng.flush()
    assert [m["bindings"] for m in out] == [{"x": [2], "y": [0]}]  # the a at ts 1 (seq 2) is the earliest first event


def test_cli_repro_prints_no_theft(tmp_path, capsys):
    feed = tmp_path / "feed.jsonl"
    feed.write_text('{"type":"register","ts":2,"tag_id":7}\n{"type":"shelf","ts":1,"tag_id":7}\n{"type":"exit","ts":3,"tag_id":7}\n')
    assert main(["run", "-q", str(ROOT / "queries/shoplifting.sase"), "-i", str(feed), "--max-delay", "5"]) == 0
    assert capsys.readouterr().out == ""


# --- advance_time (item 2) --------------------------------------------------------------


def test_advance_time_moves_the_late_event_watermark():
    sink = io.StringIO()
    eng = Engine(dead_letters=DeadLetters(sink))
    eng.register("PATTERN SEQ(a x, b y)", name="q")
    eng.process({"type": "a", "ts": 1, "id": 5})
    eng.advance_time(10)
    assert eng.process({"type": "b", "ts": 9}) == []  # below the watermark: late
    assert [m["bindings"] for m in eng.process({"type": "b", "ts": 10})] == [{"x": [0], "y": [2]}]
    letter = json.loads(sink.getvalue())
    assert letter["seq"] == 1 and letter["reason"].startswith("late event")
    assert json.loads(letter["raw"]) == {"type": "b", "ts": 9.0}  # the record, to replay


def test_advance_time_with_max_delay_keeps_held_events_and_their_promises():
    sink = io.StringIO()
    eng = Engine(max_delay=5, dead_letters=DeadLetters(sink))
    eng.register("PATTERN SEQ(shelf a, ~register b) WHERE [tag_id] WITHIN 10", name="lost")
    assert eng.process({"type": "shelf", "ts": 0, "tag_id": 1}) == []
    assert eng.process({"type": "register", "ts": 10, "tag_id": 1}) == []  # held: could kill the match
    # the deadline (ts 10) has passed, but the buffer still holds a register at ts 10: nothing fires
    assert eng.advance_time(12) == []
    assert eng.held == 1
    assert eng.advance_time(16) == [] and eng.flush() == []  # the register killed it
    # the watermark is 16 - 5 = 11: an event at ts 10.5 is late, one at 11 is not
    assert eng.process({"type": "x", "ts": 10.5}) == [] and eng.dead_letters.count == 1
    eng.process({"type": "x", "ts": 11})
    assert eng.dead_letters.count == 1


def test_advance_time_fires_the_deadline_once_the_buffer_cannot_kill_it():
    eng = Engine(max_delay=5, dead_letters=DeadLetters())
    eng.register("PATTERN SEQ(shelf a, ~register b) WHERE [tag_id] WITHIN 10", name="lost")
    eng.process({"type": "shelf", "ts": 0, "tag_id": 1})
    assert eng.advance_time(15) == []  # watermark 10: the deadline 10 has not passed
    assert [m["bindings"] for m in eng.advance_time(15.5)] == [{"a": [0]}]


@st.composite
def disordered(draw, events: list[Event]) -> list[tuple[str, object]]:
    """``events`` with ts pulled back or repeated, seqs unassigned, repeated, backwards or derived-like strings,
    ints for ts, and advance_time calls between them: ("event", Event) or ("advance", ts)."""
    out: list[tuple[str, object]] = []
    for e in events:
        ts = e.ts - draw(st.sampled_from([0, 0, 0, 1, 3]))
        ts = float(ts) if draw(st.booleans()) else ts
        seq = draw(st.sampled_from([e.seq, e.seq, -1, max(e.seq - 2, 0), f"d{e.seq}"]))
        out.append(("event", Event(e.type, ts, dict(e.attrs), seq)))
        if draw(st.integers(0, 5)) == 0:
            out.append(("advance", e.ts + draw(st.sampled_from([-1, 0, 0.5]))))
    return out


def _fed(pats, steps, max_delay: float, how: str) -> tuple:
    """The outputs of ``steps``, each event through ``Engine.process``, (``checked``) straight through the checked
    path that ``process`` takes when its fast path does not apply, or (``batch``) the events between two
    ``advance_time`` calls in one ``Engine.process_batch``."""
    sink = io.StringIO()
    eng = Engine(max_delay=max_delay, dead_letters=DeadLetters(sink))
    for i, p in enumerate(pats):
        eng.register(p, name=f"q{i}")
    out: list[dict] = []
    batch: list[Event] = []
    for kind, x in [*steps, ("end", None)]:
        if kind == "event":
            ev = Event(x.type, x.ts, dict(x.attrs), x.seq)
            if how == "batch":
                batch.append(ev)
            else:
                out += eng._in_order(ev) if how == "checked" else eng.process(ev)
            continue
        if batch:
            eng.process_batch(batch, out)
            batch = []
        if kind == "advance":
            out += eng.advance_time(x)
    out += eng.flush()
    return out, sink.getvalue(), eng._mark, eng._next_seq


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.data(), st.lists(patterns(), min_size=1, max_size=2), streams(max_events=12), st.sampled_from([0, 0, 2]))
def test_process_fast_path_agrees_with_the_checked_path(data, pats, events, max_delay):
    """Late, repeated, unassigned and derived-like seqs, equal and int timestamps, advance_time between events:
    the same matches, dead letters, watermark and next seq whether or not ``process`` takes its fast path, and
    whether the events go one by one or in batches (``process_batch``)."""
    steps = data.draw(disordered(events))
    one_by_one = _fed(pats, steps, max_delay, "process")
    assert one_by_one == _fed(pats, steps, max_delay, "checked")
    assert one_by_one == _fed(pats, steps, max_delay, "batch")


def test_the_reorder_buffer_holds_at_most_max_held_events():
    """Over max_held the oldest held event goes at once (reported); what arrives behind it is late."""
    reports = io.StringIO()
    eng = Engine(max_delay=100, max_held=3, dead_letters=DeadLetters(), reports=reports)
    eng.register("PATTERN SEQ(a x, b y)", name="q")
    found = [m for ts, t in [(5, "a"), (3, "a"), (4, "b"), (6, "b"), (7, "b")] for m in eng.process({"type": t, "ts": ts})]
    assert eng.held == 3 and eng.released_early == 2 and eng._mark == (4.0, 2)
    assert [m["bindings"] for m in found] == [{"x": [1], "y": [2]}]  # a@3 then b@4 left early, in stream order
    assert "reorder buffer is over max_held=3" in reports.getvalue() and reports.getvalue().count("\n") == 1
    assert eng.process({"type": "a", "ts": 2}) == [] and eng.dead_letters.count == 1  # behind the watermark: late
    rest = [m["bindings"] for m in eng.flush()]
    assert rest == [{"x": [0], "y": [3]}]
    with pytest.raises(YfppError, match="max_held must be an integer >= 1"):
        Engine(max_held=0)


def test_process_batch_hands_each_events_matches_to_any_extend():
    """``yfpp run`` passes its writer: each event's matches reach it as the event completes them."""
    class Writer:
        def __init__(self):
            self.calls: list[list[dict]] = []

        def extend(self, matches):
            self.calls.append(list(matches))

    events = [Event("a", 1, {}), Event("b", 2, {}), Event("x", 3, {}), Event("b", 4, {})]
    eng = Engine()
    eng.register("PATTERN SEQ(a x, b y) WHERE skip_till_any_match(x, y)", name="q")
    writer = eng.process_batch(events, Writer())
    assert [[m["bindings"] for m in call] for call in writer.calls] == [[{"x": [0], "y": [1]}], [{"x": [0], "y": [3]}]]


def test_process_batch_left_by_ctrl_c_keeps_the_matches_so_far_and_the_watermark():
    """An exception that escapes the runtime (Ctrl-C) in the middle of a batch: ``out`` holds the matches of the
    events before it and the watermark is where one ``process`` call per event would have left it; the stream
    then goes on as it would have."""
    feed = [("shelf", 1, 1), ("exit", 2, 1), ("shelf", 3, 2), ("boom", 4, 0), ("exit", 5, 2), ("exit", 3, 2)]

    def fed(batched: bool) -> tuple:
        eng = Engine(dead_letters=DeadLetters(io.StringIO()))
        eng.register("PATTERN SEQ(shelf a, exit c) WHERE [tag_id] WITHIN 1 hour", name="q")

        def boom(*_):
            raise KeyboardInterrupt

        eng.runtime._route("boom").step = boom
        events = [Event(t, float(ts), {"tag_id": k}, i) for i, (t, ts, k) in enumerate(feed)]
        out: list[dict] = []
        with pytest.raises(KeyboardInterrupt):
            if batched:
                eng.process_batch(events, out)
            else:
                for ev in events:
                    out += eng.process(ev)
        state = ([m["bindings"] for m in out], eng._mark, eng._next_seq)
        rest: list[dict] = []
        eng.process_batch(events[4:], rest)
        return state, [m["bindings"] for m in rest]

    assert fed(True) == fed(False) == (([{"a": [0], "c": [1]}], (4.0, 3), 4), [{"a": [2], "c": [4]}])
