"""Compiled predicates are slotted objects, not closures (``yfpp.nfa.check_objects``, ``xpath_ext.xpath_fast_path``):
what a registered subscription holds is walked by Python's cyclic collector for as long as it is registered, and a
closure is a function, a tuple of cells and a cell per variable."""

import gc
import types
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from yfpp.engine import Engine
from yfpp.input.events import Event
from yfpp.nfa.check_objects import AttrOfPicked, CompareWith, FirstAttrCompare, FirstOrEvent, compare_with
from yfpp.nfa.predicates import compare_fn

SHAPES = (
    "[tag_id]&&//shelf[@zone='Z{j}' and @weight > 50]//exit&&(30 min)",
    "[device]&&//reading[starts-with(@sensor, 'S{j}-')]//alarm[@level = 3]&&(5 min)",
    "[device]&&//reading[@device='U{j}' or @device='U{j}1']//alarm[@level > 2]&&(5 seconds)",
    "[tag_id]&&//shelf[zone='Z{j}']//!register//exit&&(1 hour)",
    "PATTERN SEQ(reading r, alarm x) WHERE skip_till_any_match(r, x) "
    "{{ [device] AND (r.device = 'U{j}' OR NOT r.device = 'V{j}') AND x.level > 2 }} WITHIN 10 minutes",
    "PATTERN SEQ(reading+ r[], alarm x) WHERE skip_till_next_match(r[], x) "
    "{{ [device] AND r[1].device = 'U{j}' AND r[1].celsius > 40 AND x.level = 3 }} WITHIN 30 seconds",
)


@pytest.mark.parametrize("shape", SHAPES)
def test_a_subscription_holds_no_closure(shape: str) -> None:
    eng = Engine(reports=None)
    eng.register_many([(shape.format(j=j), None) for j in range(5)])  # (the shape's plan, lazy imports)
    gc.collect()
    before = {id(o) for o in gc.get_objects()}
    ids = eng.register_many([(shape.format(j=j), None) for j in range(100, 120)])
    assert all(isinstance(i, int) for i in ids)
    gc.collect()
    after = gc.get_objects()  # (taken before the comprehension below: in Python 3.11 that is a function object, new
    made = [o for o in after if id(o) not in before]  # unless it happens to reuse the id of the one making `before`)
    assert [o for o in made if isinstance(o, (types.FunctionType, types.CellType))] == []


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(["=", "!=", "<", "<=", ">", ">="]), st.one_of(st.none(), st.integers(0, 5)),
       st.integers(0, 5), st.one_of(st.integers(0, 5), st.text("ab", max_size=1)), st.booleans())
def test_first_attr_compare_is_the_chain_it_fuses(op: str, first: int | None, current: int, lit, bound: bool) -> None:
    """``v[1].attr op constant`` in ``v``'s iterations is one ``FirstAttrCompare``, deciding as the three objects
    it fuses (the attribute missing included)."""
    cmp = compare_fn(op)
    get = AttrOfPicked(FirstOrEvent(1), "x")
    fused = compare_with(cmp, get, lit)
    assert type(fused) is FirstAttrCompare
    ev = Event("r", 2.0, {"x": current})
    vec = (None, SimpleNamespace(first=Event("r", 1.0, {} if first is None else {"x": first})) if bound else None)
    assert fused(ev, vec) == CompareWith(cmp, get, lit)(ev, vec)
