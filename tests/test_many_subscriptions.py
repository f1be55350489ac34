"""Many subscriptions in one engine: batch registration, query shapes parsed once, the cap on queries, and
subscriptions added and removed between events against the reference evaluator."""

from __future__ import annotations

from collections import Counter
from unittest.mock import patch

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tests.generators import patterns, streams
from yfpp.runtime import runtime
from yfpp.engine import Engine
from yfpp.errors import QueryError, YfppError
from yfpp.input.events import Event
from yfpp.language.query_text import QueryShapes, parse_query
from yfpp.reference.oracle import reference_matches

TEMPLATES = [  # what subscribers write, constants in braces
    "PATTERN SEQ(a e, b f) WHERE skip_till_any_match(e, f) {{ [k] AND e.x = {v} AND f.y > {t} }} WITHIN {w}",
    "PATTERN SEQ(a e, ~c g, b f) WHERE skip_till_next_match(e, g, f) {{ [k] AND e.x >= {t} AND e.x < {u} }}"
    " WITHIN {w}",
    "PATTERN SEQ(a e, b f, ~c g) WHERE skip_till_next_match(e, f, g) {{ [k] AND (f.x = {v} OR f.x = '{s}') }}"
    " WITHIN {w}",
    "PATTERN SEQ(b+ e[], a f) WHERE skip_till_next_match(e[], f) {{ [k] AND e[1].y > {t} AND f.x = '{s}' }}"
    " WITHIN {w}",
    "PATTERN SEQ(a e) WHERE e.x = '{s}' AND e.y <= {t}",
    "[k]&&//a[@x = '{s}' and @y > {t}]//b&&({w})",
    "[k]&&//a[@x >= {t}][@x < {u}]//!c//b[@y = {v} or @y = '{s}']&&({w})",
    "[k]&&//a[starts-with(@x, '{s}')]//b[y >= {t}]&&({w})",
    "[k]&&//a[@x = '{s}']//b[@y = \"{s}1\"]&&({w})",
    "[k]&&//a[@x = '{s}' or @x = 'x{v}']//!c//b[@y > {t}]&&({w})",
    "[k]&&//a[x = '{s}']//b[@y = {v} and not(starts-with(@x, '{s}'))]&&({w})",
    ("PATTERN SEQ(a e, b+ f[]) WHERE skip_till_next_match(e, f[]) {{ [k] AND NOT (e.x = '{s}' OR e.y < {t}) AND "
     "f[i].y >= f[i-1].y + {v} AND f[f.len].x = '{s}' AND max(f[..].y) <= {t} }} WITHIN {w}"),
    ("PATTERN SEQ(b+ e[], a f) WHERE skip_till_any_match(e[], f) {{ [k] AND (e.x = '{s}' OR e.y > {v}) AND "
     "f.y <= {t} }} WITHIN {w}"),
    "PATTERN SEQ(a e, b f) WHERE skip_till_any_match(e, f) {{ [k] AND (e.x = '{s}' OR e.x = 'x{v}') }} WITHIN {w}",
]
VALUES = [0, 1, 2, 3, 5, "1", "x", "x1", "", None]


def text(template: int, t: int, width: int, v: int, s: str, w: int) -> str:
    return TEMPLATES[template].format(t=t, u=t + width, v=v, s=s, w=w)


subscriptions = st.tuples(st.integers(0, len(TEMPLATES) - 1), st.integers(-1, 4), st.integers(0, 3),
                          st.integers(0, 5), st.sampled_from(["1", "x", "x1", "2"]), st.integers(1, 6))


@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(subscriptions, min_size=1, max_size=8))
def test_a_shape_parsed_once_gives_the_pattern_parsing_gives(subs):
    """The pattern of a query parsed from its shape (constants substituted) is the pattern parsing its text
    gives: the same components, predicates, window, source text and component positions."""
    shapes = QueryShapes()
    for sub in subs:
        q = text(*sub)
        got, want = shapes.parse(q), parse_query(q)
        assert got == want
        assert (got.source, got.positions) == (want.source, want.positions)


def test_shapes_keep_what_is_not_a_constant_and_refuse_what_they_cannot_place():
    shapes = QueryShapes()
    for q in ["PATTERN SEQ(a e) WHERE e.x = 'p' /* 'a comment' */", "PATTERN SEQ(a e) WHERE e.x > 1 + 2",
              "[k]&&//a[@x = 'it''s']//b&&(5)", "PATTERN SEQ(a e) WHERE e.x > -3 AND e.y = 80%",
              "PATTERN SEQ(a e) WHERE e.x = 'q' WITHIN 12"]:
        assert shapes.parse(q) == parse_query(q)
        assert shapes.parse(q.replace("'p'", "'pp'")) == parse_query(q.replace("'p'", "'pp'"))
    with pytest.raises(QueryError) as err:
        shapes.parse("PATTERN SEQ(a e) WHERE e.x = 'p' AND")
    assert "line 1" in str(err.value)


def test_register_many_registers_the_good_queries_and_returns_each_bad_ones_error():
    eng = Engine()
    got = eng.register_many(["PATTERN SEQ(a e) WHERE e.x = 'k'", ("//a[@x = 'j']", "j"), "PATTERN SEQ(a e WHERE",
                             ("//a[@x = 'i']", "j"), 7])
    assert got[:2] == [0, 1]
    assert isinstance(got[2], QueryError) and "column 17" in str(got[2])
    assert isinstance(got[3], YfppError) and "already registered" in str(got[3])
    assert isinstance(got[4], YfppError)
    assert sorted(eng.queries) == [0, 1]
    assert [m["query"] for m in eng.process({"type": "a", "ts": 1, "x": "j"})] == ["j"]


def test_registration_beyond_max_queries_is_refused():
    eng = Engine(max_queries=2)
    assert eng.register_many(["//a[@x = 1]", "//a[@x = 2]"]) == [0, 1]
    with pytest.raises(YfppError, match="max_queries=2"):
        eng.register("//a[@x = 3]")
    eng.unregister(0)
    assert eng.register("//a[@x = 3]") == 2


CHURN_EXAMPLES = {"subs": st.lists(subscriptions, min_size=1, max_size=10),
                  "events": st.lists(st.tuples(st.sampled_from("abc"), st.sampled_from(VALUES), st.sampled_from(VALUES),
                                               st.sampled_from([1, 2])), max_size=10),
                  "cuts": st.lists(st.tuples(st.integers(0, 10), st.integers(0, 11)), min_size=10, max_size=10)}


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(**CHURN_EXAMPLES)
@example(subs=[(1, 2, 2, 0, "1", 5), (7, 1, 1, 0, "x", 5), (6, 1, 1, 1, "1", 5)],
         events=[("a", 2, 1, 1), ("b", "x1", 1, 1), ("a", 1, 1, 1), ("b", 1, 1, 1)],
         cuts=[(0, 11)] * 10).via("the bounds of intervals, a prefix, an or")
def test_subscriptions_added_and_removed_between_events_match_the_reference(subs, events, cuts):
    """Churn: each subscription is registered (in batches, through its shape) before some event and unregistered
    before a later one; it gives exactly the reference evaluator's matches over the events it saw, as one query
    alone (but a removed query ending in a negation: its deadlines may fall after the removal)."""
    check_churn(subs, events, cuts)


@settings(max_examples=80, deadline=None, suppress_health_check=list(HealthCheck))
@given(**CHURN_EXAMPLES)
def test_churn_with_negations_found_through_live_state_matches_the_reference(subs, events, cuts):
    """The churn property with every negation found through the live indexes, which registration keeps up to
    date in place (``TypeNegations``), and the ends of the stores of a changed branch made again."""
    with patch.object(runtime, "WIDE", 0):
        check_churn(subs, events, cuts)


@settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck))
@given(**CHURN_EXAMPLES, singles=st.lists(st.booleans(), min_size=10, max_size=10), restore_at=st.integers(0, 11))
def test_churn_with_single_registrations_and_a_restore_matches_the_reference(subs, events, cuts, singles,
                                                                              restore_at):
    """The churn property with some subscriptions registered one at a time (the others in batches) and the
    engine replaced by its snapshot restored before one event: nodes, wait states and index entries of one
    query and of several come and go (a node's only child or wait state held as itself, ``append_to``) and survive a
    restore."""
    check_churn(subs, events, cuts, singles, restore_at)


def check_churn(subs: list, events: list, cuts: list, singles: list | None = None,
                restore_at: int | None = None) -> None:
    """Register and unregister ``subs`` between ``events`` at ``cuts``; compare with the reference per query.
    ``singles[j]``: subscription ``j`` is registered alone (else in a batch); ``restore_at``: the engine is
    restored from its snapshot before that event."""
    stream = [Event(t, float(i), {k: v for k, v in (("x", x), ("y", y), ("k", key)) if v is not None}, i)
              for i, (t, x, y, key) in enumerate(events)]
    n = len(stream)
    spans = [(min(a, n), max(min(a, n), min(b, n + 1))) for a, b in cuts[:len(subs)]]  # (added, removed) before
    eng = Engine()
    ids: dict[int, int] = {}
    got: Counter = Counter()

    def canon(m: dict) -> tuple:
        return (m["query"], tuple((k, tuple(v)) for k, v in m["bindings"].items()))

    for i in range(n + 1):
        if i == restore_at:
            eng = Engine.restore(eng.snapshot())
        batch = [j for j, (start, _) in enumerate(spans) if start == i]
        for j in [j for j in batch if singles and singles[j]]:
            ids[j] = eng.register(text(*subs[j]), f"q{j}")
        batch = [j for j in batch if j not in ids]
        for j, qid in zip(batch, eng.register_many([(text(*subs[j]), f"q{j}") for j in batch])):
            assert isinstance(qid, int), qid
            ids[j] = qid
        for j, (_, stop) in enumerate(spans):
            if stop == i:
                eng.unregister(ids.pop(j))
        if i < n:
            e = stream[i]
            got.update(canon(m) for m in eng.process(Event(e.type, e.ts, dict(e.attrs), e.seq)))
    got.update(canon(m) for m in eng.flush())
    want: Counter = Counter()
    for j, (start, stop) in enumerate(spans):
        pattern = parse_query(text(*subs[j]))
        seen = stream[start:stop]
        for binds, _ in reference_matches(pattern, seen):
            want[(f"q{j}", tuple((k, tuple(b)) for k, b in binds.items()))] += 1
    trailing = {f"q{j}" for j, (_, stop) in enumerate(spans) if stop <= n
                and not parse_query(text(*subs[j])).components[-1].positive}
    assert Counter({k: c for k, c in got.items() if k[0] not in trailing}) == \
        Counter({k: c for k, c in want.items() if k[0] not in trailing})


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(patterns(max_positives=3), min_size=1, max_size=3), streams(max_events=9))
def test_negations_found_through_live_state_match_the_reference(pats, events):
    """Over ``runtime.WIDE`` negations of a type, an event finds the candidate stores and trailing negations
    that matter through the branches and queries holding state (``Runtime._live_negs``): here with every
    negation so found, the matches are the reference's."""
    from tests.test_engine_vs_reference import check

    with patch.object(runtime, "WIDE", 0):
        check(pats, events)
