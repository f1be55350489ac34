"""Event-set patterns (docs/event_sets.md): the engine's strategies agree with the reference on generated cases."""

from __future__ import annotations

from collections import Counter

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.generators import patterns, set_patterns, streams
from yfpp.engine import Engine
from yfpp.input.events import Event
from yfpp.reference.oracle import reference_matches

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


@st.composite
def skip_till_any_sequences(draw):
    """Ordinary patterns that --strategy match-window evaluates as one-variable sets."""
    from tests.generators import TYPES, _single_preds
    from yfpp.language.pattern import Component, Contiguity, Pattern

    comps, where = [], []
    for i in range(draw(st.integers(1, 4))):
        c = Component(f"v{i}", draw(st.sampled_from(TYPES + [None])), contiguity=Contiguity.SKIP_TILL_ANY)
        where += _single_preds(draw, c.var, comps)
        comps.append(c)
    keyed = draw(st.booleans())
    return Pattern(tuple(comps), tuple(where), ("k",) if keyed else (), draw(st.integers(0, 6))).validate()


@SETTINGS
@given(skip_till_any_sequences(), streams(max_events=9))
def test_match_window_runs_skip_till_any_sequences_like_the_nfa(pattern, events):
    from yfpp.sets.plan import windowable

    assert windowable(pattern)
    want = Counter(w[:2] for w in expected([pattern], events))
    assert Counter(g[:2] for g in run([pattern], events, "match-window")) == want
    assert Counter(g[:2] for g in run([pattern], events, "direct")) == want  # the shared NFA


# --- languages, errors, CLI ------------------------------------------------------------------

import json  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

from yfpp.cli import main  # noqa: E402
from yfpp.errors import PatternError, QuerySyntaxError, YfppError  # noqa: E402
from yfpp.language.query_text import parse_query  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def test_sase_and_xpath_set_patterns_are_the_same_ir():
    sase = parse_query("PATTERN SEQ({C e1, P+ e2[]}, B e3) WHERE [PID] WITHIN 15 days")
    xpath = parse_query("[PID]//{C, P+}//B(15 days)")
    assert sase.components == xpath.components and sase.partition_by == xpath.partition_by
    assert [[c.var for c in b] for b in xpath.blocks] == [["e1", "e2"], ["e3"]]


@pytest.mark.parametrize(
    "query, where",
    [
        ("PATTERN SEQ({C c, ~P p}, B b) WITHIN 3", "line 1, column 22: negation ~p cannot be inside an event set"),
        ("PATTERN SEQ({C c, P p}, B b)\nWHERE strict_contiguity(c, p, b) WITHIN 3", "line 2, column 7: strict_contiguity has no meaning"),
        ("PATTERN SEQ({C c, {P p}}, B b) WITHIN 3", "line 1, column 22: event sets do not nest"),
        ("PATTERN SEQ(C c, B b) WHERE next(b.x) > 1", "line 1, column 29: unknown function 'next'"),
        ("PATTERN SEQ({C c, P p}, B b)", "needs a duration τ (WITHIN)"),
        ("PATTERN SEQ({C c, P p}, ~X x) WITHIN 3 RETURN y(a = c.a) FEEDBACK", "a feedback event-set query cannot end in a negation"),
        ("PATTERN SEQ({C c, P p}, B b) WITHIN 3 OUTPUT earliest_maximal RETURN y(a = c.a) FEEDBACK", "cannot use earliest_maximal"),
        ("PATTERN SEQ({C c, P p}, ~X x) WITHIN 3 OUTPUT non_overlapping", "trailing negation cannot be combined with the non_overlapping"),
        ("PATTERN SEQ(C c, B b) WITHIN 3 OUTPUT earliest_maximal", "the earliest_maximal output policy is for event-set queries only"),
        ("PATTERN SEQ({C c, P+ p[]}, B b) WHERE sum(p[..i-1].x) > 1 WITHIN 3", "is not defined in an event-set pattern"),
        ("//{C, !P}//B(3)", "line 1, column 7: a negated step cannot be inside an event set"),
        ("//{C, P}/B(3)", "line 1, column 9: an event-set path joins its steps with '//'"),
    ],
)
def test_what_has_no_clear_meaning_is_refused_with_a_position(query, where):
    with pytest.raises((PatternError, QuerySyntaxError)) as err:
        parse_query(query)
    assert where in str(err.value)


def test_prev_is_previous_iteration_in_ordinary_patterns_too():
    assert parse_query("PATTERN SEQ(A a, B+ b[]) WHERE prev(b.x) < b.x") == parse_query(
        "PATTERN SEQ(A a, B+ b[]) WHERE b[i-1].x < b.x"
    )


def test_unknown_strategy_is_an_error():
    with pytest.raises(YfppError, match="unknown evaluation strategy 'lazy'"):
        Engine(strategy="lazy")


def test_unregister_set_query_and_late_registration():
    eng = Engine()
    qid = eng.register("PATTERN {A a, B b} WITHIN 10", name="ab")
    assert eng.process({"type": "B", "ts": 0}) == []
    assert [m["bindings"] for m in eng.process({"type": "A", "ts": 1})] == [{"a": [1], "b": [0]}]
    eng.unregister(qid)
    assert eng.process({"type": "B", "ts": 2}) == []
    eng.register("PATTERN {A a, B b} WITHIN 10", name="later")
    assert eng.process({"type": "B", "ts": 3}) == []  # the A at ts 1 came before it was added
    assert [m["query"] for m in eng.process({"type": "A", "ts": 4})] == ["later"]


def test_cli_strategy_and_stats(capsys):
    q, feed = str(ROOT / "queries" / "chemo_q1.sase"), str(ROOT / "yfpp" / "data" / "chemo.jsonl")
    outs = {}
    for strategy in ("direct", "match-window"):
        assert main(["run", "-q", q, "-i", feed, "--strategy", strategy, "--stats"]) == 0
        out, err = capsys.readouterr()
        outs[strategy] = sorted(json.loads(line)["id"] for line in out.splitlines())
    assert len(outs["direct"]) == 11 and outs["direct"] == outs["match-window"]
    assert "windows seen 13, candidate windows 3, matcher calls 3" in err


def test_match_window_takes_only_windowable_ordinary_queries():
    eng = Engine(strategy="match-window")
    seq = eng.register("PATTERN SEQ(A a, B b) WHERE skip_till_any_match(a, b) { [k] } WITHIN 5")
    nfa = eng.register("PATTERN SEQ(A a, B b) WHERE [k] WITHIN 5")  # skip_till_next_match: stays on the NFA
    assert seq in eng.set_queries and nfa in eng.queries


@pytest.mark.parametrize("strategy", ["direct", "match-window"])
def test_return_builds_an_event_from_a_set_match(strategy):
    eng = Engine(strategy=strategy)
    eng.register("PATTERN SEQ({A a, B+ b[]}, C c) WITHIN 10 RETURN alert(n = b.len, xs = b.x, top = max(b[..].x), ax = a.x)")
    feed = [("B", 1), ("A", 7), ("B", 3), ("C", 0)]
    out = [m for i, (t, x) in enumerate(feed) for m in eng.process({"type": t, "ts": i, "x": x})] + eng.flush()
    emits = {tuple(m["bindings"]["b"]): m["emit"] for m in out}
    assert set(emits) == {(0,), (2,), (0, 2)}
    assert emits[(0, 2)] == {"type": "alert", "attrs": {"n": 2, "xs": [1, 3], "top": 3, "ax": 7}}


@pytest.mark.parametrize("query, feed", [("chemo_q1.sase", "chemo.jsonl"), ("nyse_p_nyse.sase", "trades_sample.jsonl")])
def test_sample_queries_give_the_same_matches_under_both_strategies(query, feed, capsys):
    ids = {}
    for strategy in ("direct", "match-window"):
        args = ["run", "-q", str(ROOT / "queries" / query), "-i", str(ROOT / "yfpp" / "data" / feed), "--strategy", strategy]
        assert main(args) == 0
        ids[strategy] = sorted(json.loads(line)["id"] for line in capsys.readouterr()[0].splitlines())
    assert ids["direct"] and ids["direct"] == ids["match-window"]


def test_a_conjunct_without_variables_still_counts():
    eng = Engine()
    eng.register("PATTERN {A a, B b} WHERE 1 = 2 WITHIN 5")
    eng.process({"type": "A", "ts": 0})
    assert eng.process({"type": "B", "ts": 1}) == []


def test_window_edge_under_float_rounding_is_the_same_for_both_strategies():
    # 19.5597 - 19.5297 > 0.03 in floats, while 19.5297 + 0.03 == 19.5597: one test for both
    events = [Event("G", 19.5297, {}, 0), Event("A", 19.5349, {}, 1), Event("I", 19.5597, {}, 2)]
    pattern = parse_query("PATTERN SEQ({A a, G g}, I i) WITHIN 30 ms")
    assert reference_matches(pattern, events) == []
    assert run([pattern], events, "direct") == run([pattern], events, "match-window") == []


def test_explain_names_set_queries(capsys):
    assert main(["explain", "-q", str(ROOT / "queries" / "chemo_q1.sase")]) == 0
    assert "chemo_q1: event-set query, evaluated by its own matcher" in capsys.readouterr()[0]


@pytest.mark.parametrize("strategy", ["direct", "match-window"])
def test_negation_between_sets(strategy):
    eng = Engine(strategy=strategy)
    eng.register("PATTERN SEQ({A a, B b}, ~N n, C c) WHERE [k] AND n.x > a.x WITHIN 10")
    feed = [("B", 0, 1), ("A", 0, 1), ("N", 1, 0), ("N", 1, 5), ("C", 0, 0), ("A", 0, 1), ("C", 0, 0)]
    out = [m for i, (t, k, x) in enumerate(feed) for m in eng.process({"type": t, "ts": i, "k": k, "x": x})] + eng.flush()
    # seq 3 (N, k=1) is in another partition and seq 2 fails n.x > a.x: both C's match with a=1, b=0;
    # a=5 with b=0 and the second C has no N between either
    assert sorted(tuple(m["bindings"].values()) for m in out) == [([1], [0], [4]), ([1], [0], [6]), ([5], [0], [6])]


@pytest.mark.parametrize("strategy", ["direct", "match-window"])
def test_reorder_buffer_gives_the_matches_of_the_sorted_feed(strategy):
    query = "PATTERN SEQ({A a, B+ b[]}, C c) WHERE prev(b.x) < b.x WITHIN 6"
    feed = [("B", 2, 1), ("A", 1, 0), ("B", 3, 2), ("C", 6, 0), ("B", 5, 3), ("C", 7, 0)]

    def matches(events, **opts):
        eng = Engine(strategy=strategy, **opts)
        eng.register(query, name="q")
        out = [m for t, ts, x in events for m in eng.process({"type": t, "ts": ts, "x": x})] + eng.flush()
        return sorted(str({v: [events[i][1] for i in seqs] for v, seqs in m["bindings"].items()}) for m in out)

    by_ts = sorted(feed, key=lambda r: r[1])
    assert matches(feed, max_delay=2) == matches(by_ts) != []


@pytest.mark.parametrize("strategy", ["direct", "match-window"])
def test_full_events_lists_the_bound_events_of_set_matches_too(strategy):
    ordinary = Engine(full_events=True)
    ordinary.register("PATTERN SEQ(A a, B b) WHERE skip_till_any_match(a, b) WITHIN 5", name="q")
    for query in ("PATTERN {A a, B b} WITHIN 5", "PATTERN SEQ(A a, B b) WHERE skip_till_any_match(a, b) WITHIN 5"):
        eng = Engine(full_events=True, strategy=strategy)
        eng.register(query, name="q")
        feed = [{"type": "A", "ts": 0, "z": 1}, {"type": "B", "ts": 3}]
        got = [m for r in feed for m in eng.process(r)] + eng.flush()
        want = [m for r in feed for m in ordinary.process(dict(r))] + ordinary.flush() if query.startswith("PATTERN SEQ") else got
        assert got and all(m["events"]["a"] == [{"seq": 0, "type": "A", "ts": 0.0, "attrs": {"z": 1}}] for m in got)
        assert got == want


def test_restoring_set_queries_under_another_strategy_is_a_clear_error():
    eng = Engine(strategy="match-window")
    eng.register("PATTERN {A a, B b} WITHIN 5", name="q")
    eng.process({"type": "A", "ts": 1})
    with pytest.raises(YfppError, match="evaluated with strategy 'match-window': restore it with that strategy"):
        Engine.restore(eng.snapshot(), strategy="direct")
    back = Engine.restore(eng.snapshot(), strategy="match-window")
    assert back.process({"type": "B", "ts": 2}) + back.flush() == eng.process({"type": "B", "ts": 2}) + eng.flush()


@pytest.mark.parametrize("strategy", ["direct", "match-window"])
def test_a_search_tries_each_event_once_per_partial_match_not_per_match(strategy, monkeypatch):
    # a complete match of single variables has nothing left to bind: the search used to scan every later
    # (direct: earlier) event of the window after each match anyway, n³ work for n² matches (a window of
    # 1,200 A/B events, 185,103 matches: 18.5 CPU s, against 1.1 for the same matches on the shared NFA)
    from yfpp.sets import search

    compared = []
    real = search._equal
    monkeypatch.setattr(search, "_equal", lambda x, y: compared.append(1) or real(x, y))
    eng = Engine(strategy=strategy)
    eng.register("PATTERN SEQ({A a}, {B b}) WHERE a.k = b.k WITHIN 100", name="q")
    out = [m for i in range(120) for m in eng.process({"type": "AB"[i % 2], "ts": i / 2, "k": 1})] + eng.flush()
    assert len(out) == 60 * 61 // 2
    assert len(compared) == len(out)  # each (a, b) pair tried once: a's event against b's, nothing more


def test_set_match_ids_are_the_defined_ones():
    from yfpp.runtime.match_id import match_id

    eng = Engine()
    eng.register("PATTERN SEQ({A a, B b}) WITHIN 5 RETURN pair(x = a.x) FEEDBACK", name='q"1')
    eng.register("PATTERN {pair p, C c} WITHIN 5")  # binds derived events: string seqs; an int name
    out = [m for i, t in enumerate("ABAC") for m in eng.process({"type": t, "ts": i, "x": i})] + eng.flush()
    derived = [s for m in out if m["query"] == 1 for s in m["bindings"]["p"]]
    assert {m["query"] for m in out} == {'q"1', 1} and derived and all(type(s) is str for s in derived)
    assert all(m["id"] == match_id(m["query"], m["bindings"], m["start"], m["end"]) for m in out)


@pytest.mark.parametrize("strategy", ["direct", "match-window"])
def test_equality_relationships_are_checked_once_through_their_group(strategy):
    # vi.A = vj.A is what the search's Θ+eq test checks as each event binds: no ∀ check over the bound events
    # (a Kleene variable's state rebuilt per candidate event) on top of it
    from yfpp.sets.plan import compile_sets

    query = "PATTERN SEQ({C c, P+ p[]}, B b) WHERE c.PID = p.PID AND p.PID = b.PID AND c.V < p.V WITHIN 15"
    plan = compile_sets(parse_query(query), "q")
    assert [[others for _, others in r] for r in plan.relations] == [[(1,)], [(0,)], []]  # c.V < p.V only
    feed = [("C", 1, 5), ("P", 1, 6), ("P", 2, 7), ("P", 1.0, 8), ("P", "1", 9), ("B", 2, 0), ("B", 1, 0)]
    events = [Event(t, float(i), {"PID": pid, "V": v}, i) for i, (t, pid, v) in enumerate(feed)]
    want = Counter(w[:2] for w in expected([parse_query(query)], events))
    assert want and Counter(g[:2] for g in run([parse_query(query)], events, strategy)) == want


@pytest.mark.parametrize("strategy", ["direct", "match-window"])
@pytest.mark.parametrize("query, events, want", [
    # a.x = n.x AND n.x = b.x says which N witnesses the negation, not that a.x = b.x
    ("PATTERN SEQ({A a}, ~N n, {B b}) WHERE a.x = n.x AND n.x = b.x WITHIN 10",
     [("A", 0, 1), ("N", 0.5, 1), ("B", 1, 2)], [{"a": [0], "b": [2]}]),
    # v.x = v.x holds for each event of v: no reason to split p's events by x
    ("PATTERN {P+ p[]} WHERE p.x = p.x WITHIN 10", [("P", 0, 1), ("P", 1, 2)], [{"p": [0]}, {"p": [0, 1]}, {"p": [1]}]),
    # a Kleene variable linked only to a negation: its events need not share x
    ("PATTERN SEQ({A+ a[]}, ~N n) WHERE n.x = a.x WITHIN 10", [("A", 0, 1), ("A", 0, 2)], [{"a": [0]}, {"a": [0, 1]}, {"a": [1]}]),
    # nor is a single variable's event without x kept out of the match (the link only says which N witnesses)
    ("PATTERN SEQ({A a}, ~N n) WHERE n.x = a.x WITHIN 10", [("A", 0, None), ("N", 1, 2)], [{"a": [0]}]),
])
def test_equality_links_that_do_not_make_a_partition(strategy, query, events, want):
    """Found by the match-window audit and the generators: each of these was split into partitions by x, and lost matches."""
    from yfpp.sets.plan import partition_attributes
    from yfpp.reference.sets import set_reference_matches

    p = parse_query(query)
    evs = [Event(t, float(ts), {"x": x}, i) for i, (t, ts, x) in enumerate(events)]
    assert sorted(map(str, (b for b, _ in set_reference_matches(p, evs)))) == sorted(map(str, want))
    eng = Engine(strategy=strategy)
    eng.register(query)
    assert sorted(str(m["bindings"]) for m in eng.process_batch(evs, []) + eng.flush()) == sorted(map(str, want))
    assert partition_attributes(p) == ()
