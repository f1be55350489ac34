"""Recursive feedback (yfpp.runtime.feedback): result events re-enter the stream, in order, within the loop guards."""

from __future__ import annotations

import io
import json
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, example, given, reject, settings
from hypothesis import strategies as st

from tests.generators import TYPES, patterns, set_patterns, streams
from yfpp.cli import main
from yfpp.input.dead_letters import DeadLetters
from yfpp.engine import Engine
from yfpp.errors import PatternError, QuerySyntaxError
from yfpp.input.events import Event
from yfpp.runtime.match_id import match_id
from yfpp.language.pattern import Arith, Contiguity, Emit, Index, Kind, Literal, Pattern, Ref
from yfpp.language.query_text import load_queries, parse_query
from yfpp.input.readers import read_events
from yfpp.reference.evaluator import _NOVALUE, Env, value
from yfpp.reference.oracle import StreamTooLong, reference_feedback, reference_matches

ROOT = Path(__file__).resolve().parents[2]


def engine(**opts) -> tuple[Engine, io.StringIO]:
    sink = io.StringIO()
    return Engine(dead_letters=DeadLetters(sink), **opts), sink


def dead(sink: io.StringIO) -> list[dict]:
    return [json.loads(line) for line in sink.getvalue().splitlines()]


# --- the paper's count example (YFilter++ §6.2) ------------------------------------------


def test_count_example_fires_at_the_51st_shelf_with_total_51():
    eng, sink = engine(full_events=True)
    for q in load_queries([str(ROOT / "queries/count.xpe")]):
        eng.register(q.text, name=q.name)
    events = list(read_events(str(ROOT / "yfpp/data/count_shelves.xml"), dead_letters=DeadLetters()))
    assert events[0].type == "count" and events[0].attrs == {"total": 0}
    first = None
    steps = 0
    for ev in events:
        for m in eng.process(ev):
            steps += m["query"] == "count_step"
            if m["query"] == "count_over_50" and first is None:
                first = (ev, m)
    ev, m = first
    assert (ev.seq, ev.type, ev.ts) == (51, "shelf", 255)  # the 51st shelf event completes the count past 50
    (count,) = m["events"]["e1"]
    assert count["type"] == "count" and count["attrs"] == {"total": 51} and count["ts"] == 255
    assert count["from"] == {"query": "count_step", "events": [count["from"]["events"][0], 51]}
    assert m["bindings"] == {"e1": [count["seq"]]} and isinstance(count["seq"], str)
    assert steps == 60 and eng.flush() == [] and sink.getvalue() == ""


def test_count_example_in_batches_gives_the_same_matches_in_the_same_order():
    """``Engine.process_batch`` with a feedback query (events and plain records mixed): the matches, in the
    order ``process`` one event at a time gives them."""
    outs = []
    for batched in (False, True):
        eng, sink = engine()
        for q in load_queries([str(ROOT / "queries/count.xpe")]):
            eng.register(q.text, name=q.name)
        events: list = list(read_events(str(ROOT / "yfpp/data/count_shelves.xml"), dead_letters=DeadLetters()))
        events[7] = {"type": events[7].type, "ts": events[7].ts, **events[7].attrs}  # a record, not an Event
        out: list[dict] = []
        if batched:
            for i in range(0, len(events), 16):
                eng.process_batch(events[i:i + 16], out)
        else:
            for ev in events:
                out += eng.process(ev)
        outs.append((out + eng.flush(), sink.getvalue()))
    assert outs[0] == outs[1] and len(outs[0][0]) == 70  # 60 count steps, 10 counts over 50


def test_count_example_from_the_command_line(capsys):
    assert main(["run", "-q", str(ROOT / "queries/count.xpe"), "-i", str(ROOT / "yfpp/data/count_shelves.xml")]) == 0
    out = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    over = [m for m in out if m["query"] == "count_over_50"]
    steps = {m["id"]: m for m in out if m["query"] == "count_step"}
    assert len(over) == 10 and len(steps) == 60
    # a derived event's id is the id of the match that built it
    assert steps[over[0]["bindings"]["e1"][0]]["emit"] == {"type": "count", "attrs": {"total": 51}}
    assert steps[over[0]["bindings"]["e1"][0]]["bindings"]["e2"] == [51]


# --- syntax and API ------------------------------------------------------------------------


def test_feedback_clause_in_both_languages_and_as_register_flag():
    sase = "PATTERN SEQ(count c, shelf s) RETURN count(total = c.total + 1) FEEDBACK"
    xpath = "//count/shelf && => count(total = e1.total + 1) feedback"
    for text in (sase, xpath):
        eng, _ = engine()
        eng.register(text, name="step")
        assert eng.queries[0].pattern.feedback and eng.queries[0].pattern.emit.event_type == "count"
    eng, _ = engine()
    eng.register("[zone]&&//theft//door&&(10 min)&&=> alarm(zone = e1.zone)", name="plain")
    assert not eng.queries[0].pattern.feedback
    eng.register("//a => b", name="flagged", feedback=True)
    assert eng.queries[1].pattern.feedback
    with pytest.raises(PatternError, match="feedback query needs a result event"):
        eng.register("//a//b", feedback=True)
    with pytest.raises(PatternError, match="unknown variable 'e3'"):
        eng.register("//a//b => c(x = e3.x)")
    with pytest.raises(QuerySyntaxError, match="column 14: unexpected '\\)'"):
        eng.register("//a => c(x = )")
    with pytest.raises(PatternError, match="equivalence test"):
        eng.register("//a => c(x = [y])")
    for text, column in (("PATTERN SEQ(a x, b y) RETURN r(ts = y.ts + 100) FEEDBACK", 32), ("//a//b => r(seq = 1) feedback", 13)):
        with pytest.raises(PatternError, match="would hide the fed-back event's own") as refused:
            eng.register(text)
        assert (refused.value.line, refused.value.column) == (1, column)  # at the attribute
    with pytest.raises(PatternError, match="RETURN attribute 'type' would hide"):
        eng.register("//a => r(type = 'x')", feedback=True)
    eng.register("//a//b => r(ts = e2.ts)", name="output_only")  # not fed back: nothing hidden


def test_emit_without_feedback_is_output_only():
    eng, _ = engine()
    eng.register("[zone]&&//theft//door&&(10 min)&&=> alarm(zone = e1.zone, at = e2.ts)", name="alarm")
    eng.register("//alarm", name="sees_alarm")
    eng.process({"type": "theft", "ts": 0, "zone": "Z1"})
    (m,) = eng.process({"type": "door", "ts": 60, "zone": "Z1"})
    assert m["emit"] == {"type": "alarm", "attrs": {"zone": "Z1", "at": 60}}
    assert eng.flush() == []


def test_derived_events_follow_registration_order_before_the_next_input():
    eng, _ = engine()
    eng.register("//a => b(n = 1) feedback", name="first")
    eng.register("//a => c(n = 2) feedback", name="second")
    eng.register("//b/c", name="b_then_c")  # strict: c directly after b
    eng.register("//c/b", name="c_then_b")
    eng.register("//c/x", name="c_then_input")  # the next input event comes after both derived events
    out = eng.process({"type": "a", "ts": 3})
    assert [m["query"] for m in out] == ["first", "second", "b_then_c"]
    assert out[2]["bindings"] == {"e1": [out[0]["id"]], "e2": [out[1]["id"]]}
    assert [m["query"] for m in eng.process({"type": "x", "ts": 4})] == ["c_then_input"]


def test_derived_events_are_seen_by_predicates_negations_and_windows():
    eng, _ = engine()
    eng.register("PATTERN SEQ(shelf a, exit c) WHERE [tag_id] WITHIN 100 RETURN out(tag_id = a.tag_id, zone = a.zone) FEEDBACK", name="out")
    eng.register("[tag_id]&&//out[@zone='Z1']", name="z1")
    eng.register("[tag_id]&&//shelf//!out//audit&&(1000)", name="unaudited_exit_free")
    eng.process({"type": "shelf", "ts": 0, "tag_id": 1, "zone": "Z1"})
    out = eng.process({"type": "exit", "ts": 5, "tag_id": 1})
    assert [m["query"] for m in out] == ["out", "z1"]
    assert eng.process({"type": "audit", "ts": 6, "tag_id": 1}) == []  # the derived out event lies between


def test_trailing_negation_matches_feed_back_at_their_deadline():
    eng, _ = engine(full_events=True)
    eng.register("PATTERN SEQ(shelf a, ~register b) WHERE [tag_id] WITHIN 10 RETURN lost(tag_id = a.tag_id) FEEDBACK", name="lost")
    eng.register("PATTERN SEQ(lost l, register r) WHERE [tag_id]", name="found_late")
    eng.register("PATTERN SEQ(shelf a, ~lost b) WHERE [tag_id] WITHIN 30", name="never_lost")
    eng.process({"type": "shelf", "ts": 0, "tag_id": 1})
    out = eng.advance_time(11)
    assert [m["query"] for m in out] == ["lost"]
    assert eng.process({"type": "register", "ts": 12, "tag_id": 1})[0]["events"]["l"][0]["ts"] == 10  # the deadline
    eng.process({"type": "shelf", "ts": 20, "tag_id": 2})
    eng.process({"type": "shelf", "ts": 21, "tag_id": 3})
    eng.process({"type": "register", "ts": 22, "tag_id": 3})
    # lost fires at 30 for tag 2 and its derived event kills never_lost of tag 2 (deadline 50), as the
    # one at 10 killed tag 1's; tag 3 was registered in time, so never_lost fires for it
    out = eng.flush()
    assert [(m["query"], m["bindings"]) for m in out] == [("lost", {"a": [2]}), ("never_lost", {"a": [3]})]


DEADLINE_RANK_QUERIES = [
    ("q1", "PATTERN SEQ(A a, B+ m[], C b, ~X nz) WHERE skip_till_any_match(a, m, b, nz) WITHIN 10 "
           "RETURN D(n = m.len) FEEDBACK"),
    ("q2", "PATTERN SEQ(C c, D d) WHERE skip_till_next_match(c, d)"),
]
DEADLINE_RANK_FEED = [("A", 0), ("B", 1), ("B", 2), ("C", 3), ("Z", 20)]


def _deadline_rank_run(snapshot_after: int | None = None) -> list[dict]:
    eng, _ = engine()
    for name, text in DEADLINE_RANK_QUERIES:
        eng.register(text, name=name)
    out: list[dict] = []
    for i, (t, ts) in enumerate(DEADLINE_RANK_FEED):
        out += eng.process(Event(t, ts, {}, i))
        if i == snapshot_after:
            eng = Engine.restore(json.loads(json.dumps(eng.snapshot())), dead_letters=DeadLetters(io.StringIO()))
    return out + eng.flush()


@pytest.mark.parametrize("snapshot_after", [None, 3], ids=["one run", "restored before the deadline"])
def test_a_deadlines_derived_events_go_in_match_order(snapshot_after):
    """Three q1 matches released by one deadline (m = [1], [2], [1, 2]) feed back in match order, the
    order of their bound events' stream positions: m = [1, 2] first, so q2 binds its D (also after a
    checkpoint taken while the matches were held)."""
    out = _deadline_rank_run(snapshot_after)
    ids = {tuple(m["bindings"]["m"]): m["id"] for m in out if m["query"] == "q1"}
    assert sorted(ids) == [(1,), (1, 2), (2,)]
    assert [m["bindings"] for m in out if m["query"] == "q2"] == [{"c": [3], "d": [ids[(1, 2)]]}]


@st.composite
def deadline_feeder_and_consumer(draw) -> tuple[tuple[str, Pattern], tuple[str, Pattern]]:
    """A feedback query ending in a negation (its matches released at deadlines, several at one) over the
    input types only, and a query over the input types and its derived ``D`` events."""
    feeder = draw(patterns(max_positives=3, trailing=True))
    skip = {Contiguity.STRICT: Contiguity.SKIP_TILL_ANY, Contiguity.PARTITION: Contiguity.SKIP_TILL_ANY}
    comps = tuple(replace(c, contiguity=skip.get(c.contiguity, c.contiguity),
                          inner_contiguity=c.inner_contiguity and skip.get(c.inner_contiguity, c.inner_contiguity))
                  for c in feeder.components)
    assume(all(c.event_type is not None for c in comps))  # ignores D events, which never reach its runs
    if draw(st.integers(0, 3)) > 0:  # negations mostly of X, a rarer type: more matches survive to their deadline
        comps = tuple(replace(c, event_type="X") if not c.positive else c for c in comps)
    pos = [c for c in comps if c.positive]

    def ref(c, attr):
        return Ref(c.var, attr, Index.FIRST if c.kind is Kind.KLEENE else Index.EACH)

    attrs = (("x", ref(pos[0], "x")), ("k", ref(pos[-1], "k")))
    # often without its predicates: more matches, several released by one deadline
    where = feeder.where if draw(st.booleans()) else ()
    feeder = replace(feeder, components=comps, where=where, emit=Emit("D", attrs), feedback=True).validate()
    consumer = draw(patterns(max_positives=2, allow_negation=False))
    assume(len(consumer.positives) == 2)  # a run begun by an input event waits for the D events
    last = consumer.positives[-1]
    # mostly one D after skip-till-next, which binds the first D in stream order: the order is what is checked
    first_d = last.kind is Kind.SINGLE and draw(st.integers(0, 3)) > 0
    d = replace(last, event_type="D", **({"contiguity": Contiguity.SKIP_TILL_NEXT} if first_d else {}))
    cs = tuple(d if c is last else c for c in consumer.components)
    return ("q1", feeder), ("q2", replace(consumer, components=cs).validate())


def staged_consumer_matches(feeder: tuple[str, Pattern], consumer: tuple[str, Pattern],
                            events: list[Event]) -> list[tuple[str, dict[str, list]]]:
    """The consumer's matches staged by hand: the feeder alone by the reference, each match a ``D`` event at
    its deadline (first ts + W), placed after every input event at or before it and, at one deadline, in
    match order (docs/semantics.md, "Result events and feedback"); then the consumer over that stream."""
    name, p = feeder
    found = [b for b, _ in reference_matches(p, events)]
    derived = []
    for b in found:
        bound = sorted(s for v in b.values() for s in v)
        deadline = events[bound[0]].ts + p.window
        env = Env({v: [events[s] for s in lst] for v, lst in b.items()}, {c.var for c in p.positives if c.kind is Kind.KLEENE})
        attrs = {k: v for k, v in ((k, value(x, env)) for k, x in p.emit.attrs) if v is not _NOVALUE and v is not None}
        mid = match_id(name, {v: list(lst) for v, lst in b.items()}, events[bound[0]].ts, events[bound[-1]].ts)
        rank = (bound, [b[c.var] for c in p.positives])
        derived.append((deadline, rank, Event("D", deadline, attrs), mid))
    derived.sort(key=lambda d: (d[0], d[1]))
    stream: list[tuple[Event, object]] = []
    i = 0
    for e in events:
        while i < len(derived) and derived[i][0] < e.ts:
            stream.append((derived[i][2], derived[i][3]))
            i += 1
        stream.append((e, e.seq))
    stream += [(d[2], d[3]) for d in derived[i:]]
    positioned = [Event(e.type, e.ts, e.attrs, n) for n, (e, _) in enumerate(stream)]
    cname, q = consumer
    return [(cname, {v: [stream[s][1] for s in lst] for v, lst in b.items()}) for b, _ in reference_matches(q, positioned)]


MAX_DERIVED_COMPARED = 6  #: derived events of one stream at most, in the staged comparison below


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(deadline_feeder_and_consumer(), streams(max_events=8, types=TYPES + ["X"], min_events=4))
@example(tuple((n, parse_query(t)) for n, t in DEADLINE_RANK_QUERIES),
         [Event(t, ts, {}, i) for i, (t, ts) in enumerate(DEADLINE_RANK_FEED)])
def test_deadline_released_feedback_matches_a_staged_evaluation(queries, events):
    """The consumer of a trailing-negation query's derived events binds them in the documented order."""
    feeder, consumer = queries
    # A consumer's Kleene under skip-till-any over the input and every derived event makes 2^(events + derived)
    # runs: past max_runs_per_query the engine sheds (as documented), which the staged reference does not model
    # (and enumerates for minutes). Kept to where the exact comparison holds.
    assume(len(reference_matches(feeder[1], events)) <= MAX_DERIVED_COMPARED)
    want = staged_consumer_matches(feeder, consumer, events)
    eng, _ = engine(max_feedback_depth=3, max_derived_per_event=1_000)
    for name, p in queries:
        eng.register(p, name=name)
    got = [m for e in events for m in eng.process(Event(e.type, e.ts, dict(e.attrs), e.seq))] + eng.flush()

    def canon(q, b):
        return (q, tuple((k, tuple(v)) for k, v in b.items()))

    assert Counter(canon(m["query"], m["bindings"]) for m in got if m["query"] == "q2") == Counter(
        canon(q, b) for q, b in want)


def test_a_deadline_past_every_float_fires_at_the_end_with_a_feedback_query_registered():
    eng, _ = engine()
    eng.register("PATTERN SEQ(a x, ~b y) WITHIN 1e308 RETURN c() FEEDBACK", name="quiet")  # 1e308 + 1e308: inf
    eng.register("PATTERN SEQ(c z)", name="derived")
    assert eng.process({"type": "a", "ts": 1e308}) == [] and eng.advance_time(1.7e308) == []
    assert [m["query"] for m in eng.flush()] == ["quiet", "derived"]  # (flush looped for ever)


# --- loop guards ---------------------------------------------------------------------------


def test_a_chain_of_deadlines_rearmed_by_their_own_derived_events_is_stopped_by_the_depth_guard():
    """Each deadline's match binds the event the last deadline derived: its own goes one deeper, so the chain
    ends at max_feedback_depth (flush used to loop for ever, each deadline starting again at depth 1)."""
    eng, sink = engine(max_feedback_depth=3)
    eng.register("PATTERN SEQ(x a, ~y b) WITHIN 1 RETURN x(n = a.n + 1) FEEDBACK", name="tick")
    eng.process({"type": "x", "ts": 0, "n": 0})
    assert [m["emit"]["attrs"]["n"] for m in eng.flush()] == [1, 2, 3, 4]  # the 4th match's event is dropped
    assert "feedback depth limit: query 'tick' derived an event at depth 4 > max_feedback_depth 3" in sink.getvalue()
    eng, _ = engine(max_feedback_depth=1)  # independent deadlines of input events: each derives at depth 1
    eng.register("PATTERN SEQ(x a, ~y b) WITHIN 1 RETURN z() FEEDBACK", name="alone")
    eng.register("PATTERN SEQ(z c)", name="seen")
    out = [m for t in range(0, 50, 10) for m in eng.process({"type": "x", "ts": t})] + eng.advance_time(100)
    assert Counter(m["query"] for m in out) == {"alone": 5, "seen": 5}



def test_self_feeding_query_is_stopped_by_the_depth_guard():
    eng, sink = engine(max_feedback_depth=5)
    eng.register("//x => x(n = e1.n + 1) feedback", name="loop")
    out = eng.process({"type": "x", "ts": 0, "n": 0})
    assert [m["emit"]["attrs"]["n"] for m in out] == [1, 2, 3, 4, 5, 6]  # the 6th result is dropped
    (report,) = dead(sink)
    assert report["reason"].startswith("feedback depth limit: query 'loop' derived an event at depth 6 > max_feedback_depth 5; 1 dropped; chain: seq 0 (x) → x ")
    assert report["reason"].count("by 'loop'") == 6 and report["position"] == "after seq 0"
    assert report["seq"] == out[-1]["id"]
    assert len(eng.process({"type": "x", "ts": 1, "n": 0})) == 6  # the engine goes on
    assert eng.feedback.dropped == 2 and eng.dead_letters.by_reason["feedback depth limit"] == 2


def test_fan_out_is_stopped_by_the_per_event_cap():
    eng, sink = engine(max_derived_per_event=50, max_feedback_depth=1000)
    eng.register("//x//x => x feedback", name="fan")  # every pair of x events makes one more
    eng.process({"type": "x", "ts": 0})
    eng.process({"type": "x", "ts": 1})
    (report,) = dead(sink)
    assert report["reason"].startswith("feedback limit: query 'fan' derived more than max_derived_per_event 50 events for one input event;")
    assert eng.feedback.derived == 50
    assert eng.process({"type": "y", "ts": 2}) == []


def test_guards_from_the_command_line(tmp_path, capsys):
    feed = tmp_path / "x.jsonl"
    feed.write_text('{"type": "x", "ts": 0, "n": 0}\n')
    assert main(["run", "-q", "//x => x(n = e1.n + 1) feedback", "-i", str(feed), "--max-feedback-depth", "3",
                 "--dead-letters", str(tmp_path / "dead.jsonl"), "--events"]) == 0
    out = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(out) == 4 and out[1]["events"]["e1"][0]["from"] == {"query": "q", "events": [0]}
    (report,) = [json.loads(line) for line in (tmp_path / "dead.jsonl").read_text().splitlines()]
    assert "depth 4 > max_feedback_depth 3" in report["reason"]


# --- against the reference ------------------------------------------------------------------


@st.composite
def feedback_queries(draw, sets: bool = False) -> list[tuple[str, Pattern]]:
    """Queries (``sets``: event-set queries among them) of which the first and maybe others feed back."""
    kinds = st.one_of(patterns(max_positives=2), set_patterns(max_vars=3)) if sets else patterns(max_positives=2)
    pats = draw(st.lists(kinds, min_size=1, max_size=3))
    assume(all(p.components[-1].positive for p in pats))
    out = []
    for i, p in enumerate(pats):
        if p.policy == "earliest_maximal":  # decided τ after a match's first event: the reference re-evaluates prefixes
            p = replace(p, policy="all")
        if i == 0 or draw(st.booleans()):
            pos = p.positives

            def ref(c, attr):
                return Ref(c.var, attr, Index.FIRST if c.kind is Kind.KLEENE else Index.EACH)

            options = [("x", ref(pos[0], "x")), ("x", Arith("+", ref(pos[-1], "x"), Literal(1))),
                       ("k", ref(pos[0], "k")), ("y", ref(pos[-1], "y"))]
            attrs = draw(st.lists(st.sampled_from(options), max_size=3, unique_by=lambda a: a[0]))
            # bias the result type towards the first component of some query: derived events begin runs
            firsts = [q.components[0].event_type for q in pats if q.components[0].event_type is not None]
            etype = draw(st.sampled_from(firsts + TYPES))
            p = replace(p, emit=Emit(etype, tuple(attrs)), feedback=True).validate()
        out.append((f"q{i}", p))
    return out


@settings(max_examples=250, deadline=None, suppress_health_check=list(HealthCheck))
@given(feedback_queries(), streams(max_events=6))
def test_feedback_matches_reference(queries, events):
    check_feedback(queries, events)


@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
@given(feedback_queries(sets=True), streams(max_events=5))
def test_feedback_with_set_queries_matches_reference(queries, events):
    # fewer derived events: the set reference is exponential in the events within τ
    check_feedback(queries, events, max_derived=2)


def test_a_null_return_attribute_is_left_out_of_the_derived_event_by_engine_and_reference():
    """``y`` is None on the input event (given from Python): the derived R has no ``y``, so count() is 0
    (a soak found the reference keeping ``y = None``, which count() counted)."""
    queries = [("make", parse_query("PATTERN SEQ(A a) RETURN R(y = a.y) FEEDBACK")),
               ("no_y", parse_query("PATTERN SEQ(R+ r[]) WHERE count(r[..].y) = 0"))]
    check_feedback(queries, [Event("A", 1.0, {"y": None}, 0)])
    eng = Engine()
    for name, q in queries:
        eng.register(q, name=name)
    assert sorted(m["query"] for m in eng.process_all([Event("A", 1.0, {"y": None}, 0)])) == ["make", "no_y"]


#: Inputs and derived events the reference evaluates at most (a Kleene query over 36 once took hours).
MAX_STREAM = 16


def check_feedback(queries, events, max_derived: int = 5):
    try:  # the reference re-evaluates the whole stream at every step: exponential past a few dozen events
        want = reference_feedback(queries, events, max_depth=3, max_derived=max_derived, max_stream=MAX_STREAM)
    except StreamTooLong:  # (first: on such a stream a skip-till-any Kleene query has exponentially many
        reject()           # matches, which took the engine minutes to list before the example was rejected)
    eng, _ = engine(max_feedback_depth=3, max_derived_per_event=max_derived)
    for name, p in queries:
        eng.register(p, name=name)
    got = [m for e in events for m in eng.process(Event(e.type, e.ts, dict(e.attrs), e.seq))] + eng.flush()

    def canon(q, b):
        return (q, tuple((k, tuple(v)) for k, v in b.items()))

    assert Counter(canon(m["query"], m["bindings"]) for m in got) == Counter(canon(q, b) for q, b in want)
    # the union of each query alone, "alone" being with the feedback queries it may feed on
    feeders = [(n, p) for n, p in queries if p.feedback]
    for name, p in queries:
        if p.feedback:
            continue
        solo, _ = engine(max_feedback_depth=3, max_derived_per_event=max_derived)
        for n, q in feeders + [(name, p)]:
            solo.register(q, name=n)
        mine = [m for e in events for m in solo.process(Event(e.type, e.ts, dict(e.attrs), e.seq))] + solo.flush()
        assert Counter(canon(name, m["bindings"]) for m in mine if m["query"] == name) == Counter(
            canon(name, m["bindings"]) for m in got if m["query"] == name)


def test_feedback_queries_share_the_nfa():
    eng, _ = engine()
    for q in ["[id]/a/b", "[id]/a/b => x(id = e1.id) feedback", "[id]/a/c => y(id = e1.id) feedback"]:
        eng.register(q)
    assert len(eng.runtime.nfa.roots) == 1 and len(list(eng.runtime.nfa.nodes())) == 3
    out = eng.process({"type": "a", "ts": 0, "id": 1}) + eng.process({"type": "b", "ts": 1, "id": 1})
    assert [m["query"] for m in out] == [0, 1]


def test_composite_break_in_example(capsys):
    assert main(["run", "-q", str(ROOT / "queries/break_in.xpe"), "-i", str(ROOT / "yfpp/data/break_in.xml"), "--events"]) == 0
    out = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    by_id = {m["id"]: m for m in out}
    (alert,) = [m for m in out if m["query"] == "break_in"]
    forced, theft = by_id[alert["bindings"]["e1"][0]], by_id[alert["bindings"]["e2"][0]]
    assert (forced["query"], theft["query"]) == ("door_forced", "theft")
    assert alert["emit"] == {"type": "break_in", "attrs": {"zone": "Z2", "door": "D2", "tag_id": 8}}
    assert alert["events"]["e2"][0]["from"] == {"query": "theft", "events": theft["bindings"]["e1"] + theft["bindings"]["e2"]}
    # a theft in Z1 without a forced door, and one in Z3 too long after its door was forced, make no alert
    assert sorted(m["emit"]["attrs"]["zone"] for m in out if m["query"] == "theft") == ["Z1", "Z2", "Z3"]


def test_a_kleene_attribute_feeds_back_as_a_list_and_a_space_separated_xml_attribute():
    eng, _ = engine()
    eng.register("//a+/b => c(xs = e1.x) feedback", name="k")
    eng.register("//c[tokenize(@xs, ' ') = '1']", name="has_1")
    out = [m for i, t in enumerate("aab") for m in eng.process({"type": t, "ts": i, "x": i + 1})]
    assert [m["emit"]["attrs"]["xs"] for m in out if m["query"] == "k"] == [[1, 2], [2]]
    assert [m["bindings"]["e1"] for m in out if m["query"] == "has_1"] == [[out[0]["id"]]]


@pytest.mark.parametrize("strategy", ["direct", "match-window"])
def test_a_set_query_consumes_derived_events_and_feeds_back_itself(strategy):
    """Recursive: a theft (derived from shelf, exit) and a register reading in any order, then an
    alarm, make a set match; its result event feeds a set query again."""
    eng, sink = engine(strategy=strategy)
    eng.register("[tag]&&//shelf//exit&&(10)&&=> theft(tag = e1.tag) feedback", name="theft")
    eng.register("PATTERN SEQ({theft t, register r}, alarm a) WHERE [tag] WITHIN 10 RETURN case(tag = t.tag) FEEDBACK",
                 name="case")
    eng.register("PATTERN {case c, alarm a} WHERE [tag] WITHIN 10", name="case_and_alarm")
    feed = [("register", 0), ("shelf", 1), ("exit", 2), ("alarm", 3)]
    out = [m for i, (t, ts) in enumerate(feed) for m in eng.process({"type": t, "ts": ts, "tag": 7})] + eng.flush()
    by_query = {m["query"]: m for m in out}
    theft_id, case_id = by_query["theft"]["id"], by_query["case"]["id"]
    assert by_query["theft"]["bindings"] == {"e1": [1], "e2": [2]}
    assert by_query["case"]["bindings"] == {"t": [theft_id], "r": [0], "a": [3]}
    assert by_query["case_and_alarm"]["bindings"] == {"c": [case_id], "a": [3]}
    assert len(out) == 3 and not sink.getvalue()
