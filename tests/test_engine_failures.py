"""An event whose processing raises loses nothing (issue 8 item 3), and bad API input gets clear errors (item 10)."""

from __future__ import annotations

import io
import json
import math
from decimal import Decimal
from fractions import Fraction

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.generators import patterns, streams
from yfpp.input.dead_letters import DeadLetters
from yfpp.engine import Engine
from yfpp.errors import YfppError
from yfpp.input.events import Event


class Boom(Exception):
    pass


def _failing(check, bad: int):
    def wrapped(ev, vec):
        if ev is not None and ev.seq == bad:
            raise Boom(f"predicate failed on seq {bad}")
        return check(ev, vec)

    return wrapped


def inject(eng: Engine, bad: int) -> None:
    """Every compiled predicate of the engine raises on the event with seq ``bad``."""
    for node in eng.runtime.nfa.nodes():
        node.begin = tuple(_failing(c, bad) for c in node.begin)
        node.take = tuple(_failing(c, bad) for c in node.take)
    for plan in eng.queries.values():
        for neg in plan.negations:
            neg.self_preds = tuple(_failing(c, bad) for c in neg.self_preds) + (_failing(lambda ev, vec: True, bad),)
            neg.cross_preds = tuple(_failing(c, bad) for c in neg.cross_preds)
    for store in eng.runtime.negations.stores.values():  # middle negations' shared candidate filters
        store.self_preds = tuple(_failing(c, bad) for c in store.self_preds) + (_failing(lambda ev, vec: True, bad),)


def run(pats, events, bad: int | None = None, skip: int | None = None):
    """The engine's output and state; the event with seq ``bad`` fails, the one with seq ``skip`` is
    replaced by a bare time advance to its ts."""
    eng = Engine(dead_letters=DeadLetters())
    for i, p in enumerate(pats):
        eng.register(p, name=f"q{i}")
    if bad is not None:
        inject(eng, bad)
    out = []
    for e in events:
        if e.seq == skip:
            out += eng.advance_time(e.ts)
        else:
            out += eng.process(Event(e.type, e.ts, dict(e.attrs), e.seq))
    state = (eng.stats.live_runs, eng.runtime.buffer.size, eng.stats.events, dict(eng.stats.matches))
    out += eng.flush()
    stored = sum(len(runs) for store in eng.runtime._stores() for runs in store.values())
    assert stored == eng.stats.live_runs or eng.stats.live_runs == 0 and not stored
    return sorted(json.dumps(m, sort_keys=True) for m in out), state, eng.dead_letters.count


@settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.data(), st.lists(patterns(), min_size=1, max_size=2), streams(max_events=10))
def test_a_failing_predicate_costs_only_its_record(data, pats, events):
    if not events:
        return
    bad = data.draw(st.sampled_from(events)).seq
    got, state, letters = run(pats, events, bad)
    if letters:  # the failure hit: exactly as if the record had only moved stream time to its ts
        assert letters == 1
        want, want_state, _ = run(pats, events, skip=bad)
    else:  # no predicate saw it
        want, want_state, _ = run(pats, events)
    assert got == want and state == want_state


class Uncomparable:
    """An attribute value of the caller's whose comparisons raise."""

    def __lt__(self, other):
        raise TypeError("cannot compare")

    def __str__(self):
        return "uncomparable"


def test_failure_is_a_dead_letter_with_the_record_and_the_stream_goes_on():
    sink = io.StringIO()
    eng = Engine(dead_letters=DeadLetters(sink))
    eng.register("PATTERN SEQ(a x, b y) WHERE skip_till_any_match(x, y) { [k] AND x.v < y.v }", name="q")
    out = eng.process({"type": "a", "ts": 1, "k": 1, "v": Uncomparable()})
    out += eng.process({"type": "b", "ts": 2, "k": 1, "v": Uncomparable()})  # the predicate raises
    out += eng.process({"type": "a", "ts": 3, "k": 1, "v": 1})
    out += eng.process({"type": "b", "ts": 4, "k": 1, "v": 2})
    assert [m["bindings"] for m in out] == [{"x": [2], "y": [3]}]
    letter = json.loads(sink.getvalue())
    assert letter["seq"] == 1 and letter["reason"] == "event failed: TypeError: cannot compare"
    assert json.loads(letter["raw"]) == {"type": "b", "ts": 2.0, "k": 1, "v": "uncomparable"}
    assert eng.stats.failed == 1 and eng.stats.events == 3 and eng.stats.live_runs == 2


def test_an_unhashable_key_puts_the_event_in_no_partition():
    """A list as the key of an event that would begin a run: no run, no failure (it used to be stored at commit
    under that key, outside the rollback)."""
    sink = io.StringIO()
    eng = Engine(dead_letters=DeadLetters(sink))
    eng.register("PATTERN SEQ(a x, b y) WHERE skip_till_next_match(x, y) { [k] }", name="q")
    out = eng.process({"type": "a", "ts": 1, "k": [1]})
    out += eng.process({"type": "a", "ts": 2, "k": 1})
    out += eng.process({"type": "b", "ts": 3, "k": 1})
    assert [m["bindings"] for m in out] == [{"x": [1], "y": [2]}]
    assert sink.getvalue() == "" and eng.stats.failed == 0 and eng.stats.runs_started == 1


def test_keyboard_interrupt_rolls_back_and_propagates():
    eng = Engine(dead_letters=DeadLetters())
    eng.register("PATTERN SEQ(a x, b y) WHERE skip_till_any_match(x, y) { x.v < y.v }", name="q")
    eng.process({"type": "a", "ts": 1, "v": 1})
    node = next(n for n in eng.runtime.nfa.nodes() if n.index == 1)
    real = node.begin

    def interrupt(ev, vec):
        raise KeyboardInterrupt

    node.begin = (interrupt,)
    with pytest.raises(KeyboardInterrupt):
        eng.process({"type": "b", "ts": 2, "v": 5})
    node.begin = real
    # the a's run as before; its one event is in its vector, not in the buffer (Runtime._start)
    assert eng.stats.live_runs == 1 and eng.runtime.buffer.size == 0
    assert [m["bindings"] for m in eng.process({"type": "b", "ts": 3, "v": 5})] == [{"x": [0], "y": [2]}]


# --- the Python API refuses bad input clearly (item 10) ---------------------------------


def test_bad_api_input_raises_yfpp_errors():
    eng = Engine()
    with pytest.raises(YfppError, match="Event or a mapping"):
        eng.process(42)
    with pytest.raises(YfppError, match="query text or a Pattern"):
        eng.register(None)
    eng.register("PATTERN SEQ(a x, b y)", name="q")
    with pytest.raises(YfppError, match="already registered"):
        eng.register("PATTERN SEQ(a x, c y)", name="q")
    for bad in (math.nan, -1, math.inf, "5"):
        with pytest.raises(YfppError, match="max_delay"):
            Engine(max_delay=bad)
    with pytest.raises(YfppError, match="max_runs_per_query"):
        Engine(max_runs_per_query=0)
    with pytest.raises(YfppError, match="advance_time"):
        eng.advance_time(math.nan)


def test_bad_records_are_dead_letters_with_a_clear_reason():
    sink = io.StringIO()
    eng = Engine(dead_letters=DeadLetters(sink))
    eng.register("PATTERN SEQ(a x, b y)", name="q")
    for rec in ({"type": "a", "ts": math.inf}, {"type": "", "ts": 1}, {"type": "a", "ts": math.nan}, {"type": "a", "ts": True}):
        assert eng.process(rec) == []
    assert eng.process(Event("a", math.inf)) == []
    reasons = [json.loads(x)["reason"] for x in sink.getvalue().splitlines()]
    assert reasons == [
        "malformed record: non-finite ts inf",
        "malformed record: empty type",
        "malformed record: non-finite ts nan",
        "malformed record: missing or non-numeric ts",
        "malformed record: non-finite ts inf",
    ]


def test_ts_accepts_any_real_number():
    eng = Engine()
    eng.register("PATTERN SEQ(a x, b y) WITHIN 1", name="q")
    eng.process({"type": "a", "ts": Decimal("1.5")})
    out = eng.process({"type": "b", "ts": Fraction(5, 2)})
    assert [(m["start"], m["end"]) for m in out] == [(1.5, 2.5)]
    np = pytest.importorskip("numpy")
    eng.process({"type": "a", "ts": np.int64(3)})
    out = eng.process({"type": "b", "ts": np.float32(3.5)})
    assert [(m["start"], m["end"]) for m in out] == [(3.0, 3.5)] and type(out[0]["end"]) is float


def test_a_failing_record_still_moves_stream_time():
    """The deadline a failing record's ts passed fires then, as at any later event, not at the next good one."""
    eng = Engine(dead_letters=DeadLetters())
    eng.register("PATTERN SEQ(A a, ~A n) WITHIN 1", name="q")
    inject(eng, bad=1)
    assert eng.process(Event("A", 0, {}, 0)) == []
    out = eng.process(Event("A", 5, {}, 1))
    assert [(m["query"], m["bindings"]) for m in out] == [("q", {"a": [0]})] and eng.dead_letters.count == 1
    assert eng.stats.failed == 1 and eng.flush() == []


def test_a_failing_record_holds_no_trailing_negation_match():
    """A trailing-negation match the failing record completed (before another query's predicate raised) is
    rolled back with it: it never fires."""
    eng = Engine(dead_letters=DeadLetters())
    eng.register("PATTERN SEQ(B b, ~A n) WITHIN 1", name="held")
    eng.register("PATTERN SEQ(B b) WHERE b.x > 0", name="raises")
    inject(eng, bad=0)
    assert eng.process(Event("B", 0, {"x": 1}, 0)) == [] and eng.flush() == []
    assert eng.dead_letters.count == 1 and eng.stats.failed == 1
