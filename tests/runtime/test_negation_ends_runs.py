"""A middle-negation candidate ends at once the runs it would reject at every completion (``NegationStores.ends``).

Property: the engine still agrees with the reference on streams with many runs per key and negation candidates
between them, window edges included, alone and beside queries that share the positive prefix without the
negation (whose runs must live on), with and without run merging."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.generators import CONTIGUITIES, streams
from tests.test_engine_vs_reference import check
from yfpp.engine import Engine
from yfpp.language.pattern import Compare, Component, Kind, Literal, Pattern, Ref


@st.composite
def middle_negations(draw) -> list[Pattern]:
    """SEQ(A a, ~B b, <c>[, <d>]) with own and sometimes cross predicates on b, and maybe a query sharing its
    positive components with another negation or none."""
    contig = draw(st.sampled_from(CONTIGUITIES))
    a = Component("a", "A", draw(st.sampled_from([Kind.SINGLE, Kind.SINGLE, Kind.KLEENE])), contig)
    b = Component("b", "B", Kind.NEGATED)
    c = Component("c", draw(st.sampled_from(["C", "C", "B", None])), draw(st.sampled_from([Kind.SINGLE, Kind.KLEENE])),
                  contig)
    positives = [a, c]
    if draw(st.booleans()):
        positives.append(Component("d", draw(st.sampled_from(["A", "C"])), Kind.SINGLE, contig))
    keyed = ("k",) if draw(st.booleans()) else ()
    window = draw(st.sampled_from([None, 0, 1, 2, 3, 5]))
    policy = draw(st.sampled_from(["all", "all", "non_overlapping"]))

    def negation_preds() -> tuple:
        options = [Compare("=", Ref("b", "x"), Literal(draw(st.integers(0, 3)))),
                   Compare("!=", Ref("b", "y"), Literal(1)),
                   Compare("=", Ref("b", "x"), Ref("a", "x"))]  # a cross predicate: the run must live on
        return tuple(draw(st.lists(st.sampled_from(options), max_size=2, unique=True)))

    pats = [Pattern((a, b, *positives[1:]), negation_preds(), keyed, window, policy).validate()]
    other = draw(st.sampled_from(["none", "no negation", "other negation"]))
    if other == "no negation":
        pats.append(Pattern(tuple(positives), (), keyed, window, policy).validate())
    elif other == "other negation":
        pats.append(Pattern((a, b, *positives[1:]), negation_preds(), keyed, window, policy).validate())
    return pats


@settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
@given(middle_negations(), streams(max_events=16), st.booleans())
def test_ending_runs_at_a_candidate_matches_reference(pats, events, merge_runs):
    check(pats, events, merge_runs=merge_runs)


def test_a_candidate_ends_the_runs_of_its_key_only_where_every_query_has_the_negation():
    shoplifting = "PATTERN SEQ(shelf a, ~register b, exit c) WHERE skip_till_next_match(a, b, c) { [tag_id] } WITHIN 10"
    eng = Engine()
    eng.register(shoplifting, name="theft")
    for ev in [("shelf", 1, 7), ("shelf", 2, 7), ("shelf", 3, 8), ("register", 4, 7)]:
        eng.process({"type": ev[0], "ts": ev[1], "tag_id": ev[2]})
    assert eng.stats.live_runs == 1  # tag 7's two runs ended by its register, tag 8's lives on
    assert [m["bindings"] for m in eng.process({"type": "exit", "ts": 5, "tag_id": 8})] == [{"a": [2], "c": [4]}]
    assert eng.process({"type": "exit", "ts": 6, "tag_id": 7}) == []

    eng = Engine()  # a query sharing shelf → exit without the negation keeps the runs alive
    eng.register(shoplifting, name="theft")
    eng.register("PATTERN SEQ(shelf a, exit c) WHERE skip_till_next_match(a, c) { [tag_id] } WITHIN 10", name="out")
    for ev in [("shelf", 1, 7), ("register", 2, 7)]:
        eng.process({"type": ev[0], "ts": ev[1], "tag_id": ev[2]})
    assert eng.stats.live_runs == 1
    assert [m["query"] for m in eng.process({"type": "exit", "ts": 3, "tag_id": 7})] == ["out"]
