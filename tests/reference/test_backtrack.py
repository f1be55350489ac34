"""The backtrack baseline (SIGMOD §5.3) finds exactly the reference evaluator's matches."""

from __future__ import annotations

from collections import Counter

from hypothesis import HealthCheck, given, settings

from tests.generators import patterns, streams
from yfpp.reference.backtrack import Backtrack, BreadthFirst
from yfpp.input.events import Event
from yfpp.reference.oracle import reference_matches
from yfpp.language.sase_parser import parse_sase


def _canon(found) -> Counter:
    return Counter((tuple((k, tuple(v)) for k, v in b.items()), at) for b, at in found)


@settings(max_examples=600, deadline=None, suppress_health_check=list(HealthCheck))
@given(patterns(), streams())
def test_backtrack_equals_reference(pattern, events):
    want = _canon(reference_matches(pattern, events))
    assert _canon(Backtrack(pattern).matches(events)) == want
    assert _canon(BreadthFirst(pattern).matches(events)) == want


def test_backtracking_rereads_events_the_breadth_first_order_reads_once():
    """Figure 7's shape: a Kleene run that splits, fails, and is resumed from the stack."""
    q = parse_sase("PATTERN SEQ(A+ a[], B b) WHERE skip_till_any_match(a, b) { [k] } WITHIN 10")
    events = [Event(t, i, {"k": 0}, i) for i, t in enumerate("AABAB")]
    bfs, dfs = BreadthFirst(q), Backtrack(q)
    assert _canon(dfs.matches(events)) == _canon(bfs.matches(events)) == _canon(reference_matches(q, events))
    assert dfs.steps == bfs.steps  # the same run tree, explored in another order
    assert bfs.rereads == 0 and dfs.rereads > 0 and dfs.backtracks > 0
