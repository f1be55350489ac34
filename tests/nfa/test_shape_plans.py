"""One compiled plan per query shape (``yfpp.nfa.shape_plans``): a query made from its shape's plan is the query
compiled on its own — the same nodes (signatures, index keys), checks that answer alike — and a shape whose
constants stand where the plan cannot put them compiles query by query."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.test_many_subscriptions import TEMPLATES, VALUES, text
from yfpp.engine import Engine
from yfpp.input.events import Event
from yfpp.language.query_text import QueryShapes, parse_query
from yfpp.nfa.compiler import expr_key
from yfpp.nfa.rebind import same
from yfpp.nfa.shape_plans import ShapePlans, _Remade
from yfpp.nfa.shared_nfa import atom_key as conjunct_atom_key, conjunct_keys

constants = st.tuples(st.integers(-1, 4), st.integers(0, 3), st.integers(0, 5), st.sampled_from(["1", "x", "x1", "2"]),
                      st.integers(1, 6))
EVENTS = [Event(t, 1.0, {"x": x, "y": y, "k": 1}, 0) for t in "abc" for x in VALUES for y in (0, 1, 3, "x", None)
          if x is not None]


def _nodes(eng: Engine, qid: int) -> list[tuple]:
    """What a query's nodes are: signature, index key, and its begin checks' answers over ``EVENTS``."""
    vec = (None,) * 4
    return [(n.signature, n.index_key, [[bool(c(ev, vec)) for c in n.begin] for ev in EVENTS])
            for n in eng.queries[qid].nodes]


@settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck))
@given(template=st.integers(0, len(TEMPLATES) - 1), subs=st.lists(constants, min_size=1, max_size=6),
       policy=st.sampled_from([None, "all"]))
def test_a_query_made_from_its_shape_is_the_query_compiled_alone(template, subs, policy):
    texts = [text(template, *c) for c in subs]
    shaped, alone = Engine(reports=None), Engine(reports=None)
    batch = shaped.register_many(texts, policy=policy)
    for qid, q in zip(batch, texts):
        assert isinstance(qid, int), qid
        mine = alone.register(parse_query(q), policy=policy)
        assert _nodes(shaped, qid) == _nodes(alone, mine)
        made, compiled = shaped.queries[qid], alone.queries[mine]
        assert (made.window, made.policy, made.partition_by, made.var_names, made.negation_key) == \
            (compiled.window, compiled.policy, compiled.partition_by, compiled.var_names, compiled.negation_key)
        assert [(n.var, n.lower, n.upper, n.signature) for n in made.negations] == \
            [(n.var, n.lower, n.upper, n.signature) for n in compiled.negations]
        assert made.pattern == compiled.pattern


def test_shapes_of_attribute_comparisons_have_a_plan_and_the_rest_compile_alone():
    shapes, plans = QueryShapes(), ShapePlans(lambda pattern: True)
    has_plan = {}
    for i in range(len(TEMPLATES)):
        shape, _ = shapes.shape_of(text(i, 1, 2, 3, "x", 5))
        has_plan[i] = shape is not None and plans.get(shape, None, False) is not None
    # every template: comparisons, ranges, an OR of equalities, a Kleene's first iteration, XPath `and`, `or`,
    # starts-with, child elements and numbers (the conjuncts no rebound check takes are compiled alone: _Remade)
    assert all(has_plan.values()), has_plan
    for q in ("[k]&&//a[@x = 'p']//b[@y = \"q\"]&&(5)", "PATTERN SEQ(a e) WHERE e.y - 1 > 3",
              "//a[@x = 'p' and @y = 'q']", "//a[@x = 2.5 or @y = 'q']"):
        shape, _ = shapes.shape_of(q)
        assert plans.get(shape, None, False) is not None, q
    shape, _ = shapes.shape_of("PATTERN SEQ(a e, ~b g, c f) WHERE g.x = 'p' AND f.y = 2")
    assert plans.get(shape, None, False) is None  # a negated component's constant
    shape, consts = shapes.shape_of("PATTERN SEQ(a e) WHERE e.x = 'p' AND e.y <= 3")
    made = plans.get(shape, "all", False).plan(consts, "q", "PATTERN SEQ(a e) WHERE e.x = 'p' AND e.y <= 3")
    assert made.pattern == parse_query("PATTERN SEQ(a e) WHERE e.x = 'p' AND e.y <= 3")
    assert plans.get(shape, "non_overlapping", False).template.policy == "non_overlapping"


def test_queries_of_one_shape_match_as_when_compiled_alone():
    feed = [Event(t, float(i), {"x": i % 4, "y": i % 3, "k": i % 2}, i) for i, t in enumerate("abab" * 6 + "ca")]
    qs = [text(0, t, 1, v, "x", 6) for t in range(3) for v in range(4)]
    shaped, alone = Engine(reports=None), Engine(reports=None)
    shaped.register_many(qs[: len(qs) // 2])
    for q in qs[len(qs) // 2:]:
        shaped.register(q)
    for q in qs:
        alone.register(parse_query(q))
    assert shaped.process_all(list(feed)) and list(shaped.process_all(feed)) == list(alone.process_all(feed))


@settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck))
@given(template=st.integers(0, len(TEMPLATES) - 1), subs=st.lists(constants, min_size=1, max_size=6),
       events=st.lists(st.tuples(st.sampled_from("abc"), st.sampled_from(VALUES), st.sampled_from(VALUES),
                                 st.sampled_from([1, 2])), max_size=10))
def test_queries_made_from_their_shape_give_the_matches_of_the_queries_compiled_alone(template, subs, events):
    """Random constants and feeds: the queries of a shape registered in a batch (made from the shape's plan) give
    exactly the matches, in order, of the same queries each compiled alone from its pattern."""
    texts = [text(template, *c) for c in subs]
    feed = [Event(t, float(i), {k: v for k, v in (("x", x), ("y", y), ("k", key)) if v is not None}, i)
            for i, (t, x, y, key) in enumerate(events)]
    shaped, alone = Engine(reports=None), Engine(reports=None)
    assert all(isinstance(q, int) for q in shaped.register_many([(q, f"q{j}") for j, q in enumerate(texts)]))
    for j, q in enumerate(texts):
        alone.register(parse_query(q), f"q{j}")
    assert list(shaped.process_all(list(feed))) == list(alone.process_all(list(feed)))


def test_one_string_equality_is_keyed_by_its_index_key_however_written():
    """A component whose condition is one equality of its attribute with a string is the same node however the
    equality is written; a number keeps its own key (``1`` and ``1.0`` are other expressions)."""
    eng = Engine(reports=None)
    same = [eng.register(q) for q in ("PATTERN SEQ(a e, b f) WHERE [k] AND e.x = 'p' AND f.y = 'q'",
                                      "PATTERN SEQ(a e, b f) WHERE [k] AND 'p' = e.x AND f.y = 'q' WITHIN 5",
                                      "PATTERN SEQ(a e, b f) WHERE [k] AND e.x = \"p\" AND 'q' = f.y")]
    assert len({eng.queries[q].last for q in same}) == 1
    first = eng.queries[same[0]].nodes[0]
    assert first.signature[1] is first.index_key == ("eq", "x", "p")
    xpath = [eng.register(q) for q in ("[k]&&//a[@x='p']//b[y = \"q\"]", "[k]&&//a[ @x = \"p\" ]//b[y='q']")]
    assert eng.queries[xpath[0]].last is eng.queries[xpath[1]].last
    numbers = [eng.register(f"PATTERN SEQ(a e) WHERE e.x = {v}") for v in ("1", "1.0")]
    assert eng.queries[numbers[0]].last is not eng.queries[numbers[1]].last


def test_the_fields_built_by_position_keep_their_order() -> None:
    """``SharedNFA._new_node``, ``ShapePlan.plan`` and ``shape_plans._copied`` build nodes, specs, plans and negation
    plans from positional arguments (a million subscriptions make millions of them): a field inserted or moved among
    these must fail here, not put values in the wrong fields."""
    import dataclasses

    from yfpp.nfa.compiler import ComponentSpec, NegationPlan, QueryPlan
    from yfpp.nfa.shared_nfa import Node

    def names(cls: type, n: int) -> list[str]:
        return [f.name for f in dataclasses.fields(cls)][:n]

    assert names(Node, 20) == ["parent", "signature", "index", "event_type", "kleene", "contiguity", "inner", "begin",
                               "take", "final", "partition_by", "index_key", "root", "id", "children", "waits",
                               "inside", "accepts", "users", "window"]
    assert names(ComponentSpec, 13) == ["index", "var", "event_type", "kleene", "contiguity", "inner", "begin", "take",
                                         "final", "agg_slots", "keep_events", "keys", "what"]
    assert names(QueryPlan, 15) == ["name", "source", "compiled_specs", "negations", "trailing", "partition_by",
                                    "window", "policy", "emit", "var_names", "since_tick", "negation_key", "last",
                                    "feedback", "shape"]
    assert names(NegationPlan, 8) == ["var", "event_type", "self_preds", "cross_preds", "lower", "upper", "signature",
                                      "check_signature"]


def test_a_one_equality_component_keeps_its_index_key_as_its_check() -> None:
    """A component of a shape's query whose begin condition is ``ev.attr = 'text'`` alone holds one object as its
    signature's key, its index key and its check (``EqualityKey``), which answers as the compiled check does."""
    from yfpp.nfa.predicates import EqualityKey, compare_fn
    from yfpp.nfa.shared_nfa import Node

    eng = Engine()
    text = "PATTERN SEQ(shelf a, exit c) WHERE skip_till_any_match(a, c) {{ [tag_id] AND a.zone = '{z}' AND c.door = 'D1' }}"
    first, second = (eng.register(text.format(z=z)) for z in ("Z1", "Z2"))  # (both made from the shape's plan)
    node: Node = eng.queries[second].nodes[0]
    assert type(node.index_key) is EqualityKey and node.begin == (node.index_key,) and node.signature[1] is node.index_key
    assert eng.queries[first].nodes[0].index_key == ("eq", "zone", "Z1")
    equal = compare_fn("=")  # (what the compiled check of `a.zone = 'Z2'` calls)
    for value in ("Z2", "Z1", "z2", 2, 2.0, None, True, ["Z2"]):
        assert node.index_key(Event("shelf", 0.0, {"zone": value}, 0), ()) == equal(value, "Z2")
    assert node.index_key(Event("shelf", 0.0, {}, 0), ()) is False


XPATH_TEXTS = ["Z1", "Z2", "z1", "07", "7", "", " Z1", "Z 1", "é"]
XPATH_CONSTANTS = ["Z1", "Z2", "07", "7", "Z 1", "é"]


def _xpath_events(source: str, rows: list[tuple[str, str | None, str | None]]) -> list[Event]:
    """Events of ``rows`` (type, zone, door; None: absent): from an XML document, JSON-like attributes, or an XML
    element whose zone and door are child elements (which ``@zone`` does not read)."""
    import io

    from lxml import etree

    from yfpp.input.readers import read_events

    if source == "xml":
        items = "".join(f'<{t} ts="{i}" tag="1"' + "".join(f' {a}="{v}"' for a, v in (("zone", z), ("door", d))
                                                            if v is not None) + "/>"
                        for i, (t, z, d) in enumerate(rows))
        return list(read_events(io.BytesIO(f"<s>{items}</s>".encode()), "xml"))
    if source == "json":
        return [Event(t, float(i), {"tag": 1, **{a: v for a, v in (("zone", z), ("door", d)) if v is not None}}, i)
                for i, (t, z, d) in enumerate(rows)]
    events = []
    for i, (t, z, d) in enumerate(rows):
        el = etree.Element(t, {"tag": "1"})
        for a, v in (("zone", z), ("door", d)):
            if v is not None:
                etree.SubElement(el, a).text = v
        events.append(Event(t, float(i), {"tag": 1}, i, el))
    return events


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(subs=st.lists(st.tuples(st.sampled_from(XPATH_CONSTANTS), st.sampled_from(XPATH_CONSTANTS)), min_size=1,
                     max_size=6),
       rows=st.lists(st.tuples(st.sampled_from(["shelf", "exit"]), st.one_of(st.none(), st.sampled_from(XPATH_TEXTS)),
                               st.one_of(st.none(), st.sampled_from(XPATH_TEXTS))), max_size=8),
       source=st.sampled_from(["xml", "json", "children"]), batched=st.booleans())
def test_xpath_equality_steps_made_from_their_shape_match_as_compiled_alone(subs, rows, source, batched):
    """XPath steps ``[@a='text']`` made from their shape's plan (each step's index key is its test:
    ``AttributeEquality``) give exactly the matches, in order, of the same queries each compiled alone, over
    random constants and attribute texts from XML, JSON and child elements."""
    texts = [f"[tag]&&//shelf[@zone='{z}']//exit[@door='{d}']&&(1 hour)" for z, d in subs]
    shaped, alone = Engine(reports=None), Engine(reports=None)
    if batched:
        assert all(isinstance(q, int) for q in shaped.register_many([(q, f"q{j}") for j, q in enumerate(texts)]))
    else:
        for j, q in enumerate(texts):
            shaped.register(q, f"q{j}")
    for j, q in enumerate(texts):
        alone.register(parse_query(q), f"q{j}")
    feed = _xpath_events(source, rows)
    assert list(shaped.process_all(list(feed))) == list(alone.process_all(list(feed)))


def test_an_xpath_equality_step_keeps_its_index_key_as_its_test() -> None:
    """A step of a shape's query whose predicate is ``@a = 'text'`` alone holds one object as its signature's key,
    its index key, its shared-atom key and its test (``AttributeEquality``), which answers as the compiled test."""
    from xpath_ext.xpath_predicates import AttributeEquality, compile_xpath_test
    from yfpp.nfa.predicates import atom_key
    from yfpp.nfa.shared_nfa import Node

    eng = Engine()
    first, second = (eng.register(f"[tag]&&//shelf[@zone='{z}']//exit[@door='D1']&&(1 hour)") for z in ("Z1", "Z2"))
    node: Node = eng.queries[second].nodes[0]
    key = node.index_key
    assert type(key) is AttributeEquality and node.begin == (key,) and node.signature[1] is key
    assert atom_key(key) is key and eng.queries[first].nodes[0].index_key == ("xeq", "zone", "Z1")
    compiled = compile_xpath_test("@zone='Z2'")
    for source in ("xml", "json", "children"):
        for ev in _xpath_events(source, [("shelf", z, None) for z in [*XPATH_TEXTS, None]]):
            assert key(ev, ()) is compiled(ev)
    for value in ("Z2", 2, 2.0, True, ["Z2"]):  # (attributes from JSON that are no text)
        ev = Event("shelf", 0.0, {"zone": value}, 0)
        assert key(ev, ()) is compiled(ev)


REMADE = TEMPLATES + [  # conjuncts no rebound check takes: an OR, XPath and/or/starts-with/children, a Kleene's first
    "[k]&&//a[starts-with(@x, '{s}-')]//b[@y = {v}]&&({w})",
    "[k]&&//a[@x='{s}' or @x='x{s}']//b[@y > {t}]&&({w})",
    "PATTERN SEQ(b+ e[], a f) WHERE skip_till_next_match(e[], f) {{ [k] AND e[1].x = '{s}' AND e[1].y > {t} }}",
]
odd_texts = st.text(st.sampled_from(["x", "1", "'", '"', "\ue000", "\u0661", " ", "-", "é"]), max_size=4)


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(template=st.integers(0, len(REMADE) - 1),
       subs=st.lists(st.tuples(st.integers(0, 99), st.integers(0, 4), odd_texts), min_size=1, max_size=6))
def test_a_conjunct_remade_for_a_query_is_what_compiling_it_gives(template, subs):
    """A conjunct holding constants that no rebound check takes is remade for each query: its check rebound to the
    query's constants (yfpp.nfa.rebind) is the check compiling it gives, object for object, and its expression key,
    index keys and atom key, made from its shape's without an expression (yfpp.nfa.rebound_keys), are those read from
    the expression compiling gives; a constant it cannot rebind (a quote, a stand-in's mark, a digit not ASCII) is
    compiled; so is a conjunct whose check holds closures."""
    shapes, plans = QueryShapes(), ShapePlans(lambda pattern: True)
    rebound = 0
    for t, v, s in subs:
        q = REMADE[template].format(t=t, u=t + 3, v=v, s=s, w=5)
        shape, constants = shapes.shape_of(q)
        splan = shape and plans.get(shape, None, False)
        if not splan:
            continue
        literals, texts = shape.literals(constants), list(zip(shape.sentinels, constants))
        for maker in splan.made:
            for _, _, items in maker.edges:
                for remade in {item[0] for item in items or () if type(item[0]) is _Remade}:
                    made = remade.made(literals, texts)
                    expr, check = remade._compiled(literals, texts)
                    assert made.expr is None or made.expr == expr  # (None: its keys made from its shape's)
                    me = remade.place.current
                    assert (made.key(), made.found(me), made.atom(me)) == \
                        (expr_key(expr), conjunct_keys(expr, me), conjunct_atom_key(expr, me)), q
                    if remade.check is not None:  # (else both compiled: each its own closures)
                        assert same(made.check, check), q
                        rebound += 1
    if template >= len(TEMPLATES) and all(s.isalnum() and s.isascii() for _, _, s in subs):
        assert rebound  # (these shapes' conjuncts are rebound)


@pytest.mark.parametrize("query", [
    "PATTERN SEQ(a x, b y) WHERE skip_till_any_match(x, y) {{ [k] AND (x.v = {0} OR x.v = {1}) }}",
    "[k]&&//a[@v = {0} or @v = {1}]//b&&(5)",
])
def test_a_remade_conjunct_of_equal_constants_has_the_keys_of_its_expression(query):
    """An ``or`` of two equal constants has one index key where its shape's has two: its keys are read from its
    expression, not made from its shape's (``'a'`` and ``"a"``, ``7`` and ``07`` are equal constants)."""
    shapes, plans = QueryShapes(), ShapePlans(lambda pattern: True)
    for a, b in (("'p'", "'q'"), ("'a'", "'a'"), ("'a'", '"a"'), ("7", "07"), ("7", "8")):
        shape, constants = shapes.shape_of(query.format(a, b))
        (remade,) = [i[0] for m in plans.get(shape, None, False).made for _, _, items in m.edges for i in items or ()
                     if type(i[0]) is _Remade]
        literals, texts = shape.literals(constants), list(zip(shape.sentinels, constants))
        made, (expr, _) = remade.made(literals, texts), remade._compiled(literals, texts)
        me = remade.place.current
        assert (made.key(), made.found(me)) == (expr_key(expr), conjunct_keys(expr, me))
        assert (made.expr is None) == (a != b and {a, b} != {"'a'", '"a"'} and b != "07")


@pytest.mark.parametrize("first, query", [
    ("[k]&&//a[@x >= 1][@x < 4]//b&&(5)", "[k]&&//a[@x >= 987654321001][@x < 987654321004]//b&&(5)"),
    ("[k]&&//a[@x = 1 or @x = 2]//b&&(5)", "[k]&&//a[@x = 987654321001 or @x = 5]//b&&(5)"),
])
def test_a_constant_that_reads_as_another_stand_in_stays_itself(first, query):
    """A query's constant may read as a stand-in of its shape (``987654321001``): it is put in once, not read again
    as a stand-in, so the query's pattern and its nodes' signatures are those of the query compiled alone."""
    shaped, alone = Engine(), Engine()
    shaped.register(first)
    qid, lone = shaped.register(query), alone.register(parse_query(query))
    assert shaped.sources[qid][0].where == parse_query(query).where
    assert [n.signature for n in shaped.queries[qid].nodes] == [n.signature for n in alone.queries[lone].nodes]


def test_a_check_rebound_shares_what_holds_no_constant():
    shapes, plans = QueryShapes(), ShapePlans(lambda pattern: True)
    checks = []
    for s in ("p", "q"):
        q = f"[k]&&//a[starts-with(@x, '{s}-')]//b&&(5)"
        shape, constants = shapes.shape_of(q)
        (remade,) = [i[0] for m in plans.get(shape, None, False).made for _, _, items in m.edges for i in items or ()
                     if type(i[0]) is _Remade]
        checks.append(remade.made(shape.literals(constants), list(zip(shape.sentinels, constants))).check)
    a, b = checks
    assert a is not b and not same(a, b)
    assert a.fast.values is b.fast.values  # (the attribute read: no constant in it)
    assert (a.fast.literal, b.fast.literal, a.source, b.source) == ("p-", "q-", "starts-with(@x, 'p-')",
                                                                    "starts-with(@x, 'q-')")
