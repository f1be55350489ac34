"""One shared NFA: the union of each query alone, sharing, live add/remove, indexes."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tests.generators import patterns, streams
from yfpp.engine import Engine
from yfpp.input.events import Event
from yfpp.language.pattern import Pattern, variables

ROOT = Path(__file__).resolve().parents[2]

SETTINGS = settings(max_examples=600, deadline=None, suppress_health_check=list(HealthCheck))


def _canon(m: dict) -> tuple:
    return (m["query"], tuple((k, tuple(v)) for k, v in m["bindings"].items()))


def alone(pattern: Pattern, name: str, events: list[Event]) -> list[tuple]:
    eng = Engine()
    eng.register(pattern, name=name)
    return [_canon(m) for m in _feed(eng, events)]


def _feed(eng: Engine, events: list[Event], actions: dict | None = None) -> list[dict]:
    out = []
    for e in events:
        for act in (actions or {}).get(e.seq, ()):
            act(eng)
        out += eng.process(Event(e.type, e.ts, dict(e.attrs), e.seq))
    return out + eng.flush()


@st.composite
def query_families(draw) -> list[Pattern]:
    """Patterns that share a prefix with a base pattern and differ after it, or in window/negation/policy."""
    base = draw(patterns(max_positives=3))
    family = [base]
    for _ in range(draw(st.integers(1, 4))):
        other = draw(patterns(max_positives=3))
        cut = draw(st.integers(1, len(base.components)))
        comps = base.components[:cut] + tuple(c for c in other.components if c.var not in {b.var for b in base.components[:cut]})
        if not comps[-1].positive and (base.window is None and other.window is None):
            comps = comps[:-1]
        names = {c.var for c in comps}
        where = tuple(w for w in base.where + other.where if variables(w) <= names)
        window = draw(st.sampled_from([base.window, other.window, None, 3]))
        if not comps[-1].positive and window is None:
            window = 4
        policy = draw(st.sampled_from(["all", base.policy]))
        if not comps[-1].positive:
            policy = "all"
        try:
            family.append(Pattern(comps, where, base.partition_by, window, policy).validate())
        except Exception:
            continue
    return family


def _valid(p: Pattern) -> bool:
    try:
        Engine().register(p)
        return True
    except Exception:
        return False


@SETTINGS
@given(query_families(), streams(max_events=10))
def test_shared_engine_gives_the_union_of_each_query_alone(family, events):
    family = [p for p in family if _valid(p)]
    eng = Engine()
    want: Counter = Counter()
    for i, p in enumerate(family):
        eng.register(p, name=f"q{i}")
        want.update(alone(p, f"q{i}", events))
    got = Counter(_canon(m) for m in _feed(eng, events))
    assert got == want


@SETTINGS
@given(query_families(), streams(max_events=10), st.data())
def test_queries_added_and_removed_mid_stream(family, events, data):
    family = [p for p in family if _valid(p)]
    n = len(events)
    plan = [(data.draw(st.integers(0, n)), data.draw(st.integers(0, n + 1))) for _ in family]
    actions: dict[int, list] = {}
    ids: dict[int, int] = {}
    for i, (add_at, remove_at) in enumerate(plan):
        remove_at = max(add_at, remove_at)

        def add(eng, i=i):
            ids[i] = eng.register(family[i], name=f"q{i}")

        def remove(eng, i=i):
            eng.unregister(ids[i])

        actions.setdefault(add_at, []).append(add)
        if remove_at < n:
            actions.setdefault(remove_at, []).append(remove)
    got = Counter(_canon(m) for m in _feed(Engine(), events, actions))
    want: Counter = Counter()
    for i, p in enumerate(family):
        add_at, remove_at = plan[i]
        remove_at = max(add_at, remove_at)
        window = [e for e in events if add_at <= e.seq < remove_at] if remove_at < n else [e for e in events if e.seq >= add_at]
        for q, binds in alone(p, f"q{i}", window):
            if remove_at < n and not p.components[-1].positive:
                continue  # trailing negation: its deadline may fall after the removal
            want[(q, binds)] += 1
    trailing = {f"q{i}" for i, p in enumerate(family) if not p.components[-1].positive and plan[i][1] < n}
    got = Counter({k: v for k, v in got.items() if k[0] not in trailing})
    assert got == want


def test_identical_prefixes_share_nodes_and_runs():
    eng = Engine()
    for q in ["[id]/a/b", "[id]/a/c", "[id]/a/!b/c", "[id]/a//!b/c", "[id]/a/*/c", "[id]/a//c", "[id]/a/*/*/c", "[id]/a/b/c"]:
        eng.register(q)
    nfa = eng.runtime.nfa
    assert len(nfa.roots) == 1
    # a; after a: /b /c /* //c; after /b: /c; after /*: /c /*; after /*/*: /c
    assert len(list(nfa.nodes())) == 9
    eng.process({"type": "a", "ts": 0, "id": 1})
    # one run per wait state after a: the partition-contiguity children (b, c, *) share one,
    # the skip-till-any child (c) has another — not one run per query
    assert eng.stats.live_runs == 2

def test_equality_and_range_indexes_find_the_one_subscription():
    eng = Engine()
    for k in range(2000):
        eng.register(f"[tag_id]&&//shelf[@zone='Z{k}']//exit[@door='D{k}']&&(1 hour)", name=f"x{k}")
        eng.register(f"PATTERN SEQ(shelf a, exit c) WHERE {{ [tag_id] AND a.zone = 'Z{k}' AND c.door = 'D{k}' }} WITHIN 1 hour", name=f"s{k}")
        eng.register(f"PATTERN SEQ(shelf a, exit c) WHERE {{ [tag_id] AND a.level > {k} AND c.door = 'D{k}' }} WITHIN 1 hour", name=f"r{k}")
    out = eng.process({"type": "shelf", "ts": 0, "tag_id": 1, "zone": "Z17", "level": 3})
    assert out == [] and eng.stats.runs_created == 2 + 3  # Z17 twice; level > 0, 1, 2
    out = eng.process({"type": "exit", "ts": 5, "tag_id": 1, "door": "D17"})
    assert sorted(m["query"] for m in out) == ["s17", "x17"]
    out = eng.process({"type": "exit", "ts": 6, "tag_id": 1, "door": "D2"})
    assert [m["query"] for m in out] == ["r2"]


def test_explain_prints_the_shared_nfa_and_writes_dot(tmp_path, capsys):
    from yfpp.cli import main

    dot = tmp_path / "nfa.dot"
    assert main(["explain", "-q", str(ROOT / "queries/sharing.xpe"), "--dot", str(dot)]) == 0
    out = capsys.readouterr().out
    assert "accepts q2, q3, q4" in out and "8 queries, 20 components → 9 NFA nodes" in out
    text = dot.read_text()
    assert text.startswith("digraph yfpp {") and text.count("->") == 9


def test_xpath_equality_index_reads_the_xml_attribute_text():
    import io

    from yfpp.input.readers import read_events

    eng = Engine()
    for z in ["07", "7", "Z1"]:
        eng.register(f"[tag]//shelf[@zone='{z}']//exit", name=z)
    xml = b'<s><shelf ts="1" tag="1" zone="07"/><shelf ts="2" tag="1"><zone>7</zone></shelf><exit ts="3" tag="1"/></s>'
    out = [m for e in read_events(io.BytesIO(xml), "xml") for m in eng.process(e)]
    # "07" is typed 7 as an attribute value, but @zone reads the text; a child element is no attribute
    assert [m["query"] for m in out] == ["07"]


NUMBER_TEXTS = ["7", "07", " 7 ", "7.0", "7e0", "+7", "-7", "-0", "0", "0.0", "INF", "NaN", "nan", "1_000", "1000",
                "x", "", "9007199254740993", "9007199254740992", "1e400", "\xa07"]


@settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
@given(values=st.lists(st.sampled_from([7, 7, "'7'", "' 7 '", 0, 1000, 9007199254740993, 9007199254740992, "'x'", "''"]),
                       min_size=1, max_size=4),
       texts=st.lists(st.one_of(st.none(), st.sampled_from(NUMBER_TEXTS)), min_size=1, max_size=6),
       source=st.sampled_from(["xml", "json", "children", "children"]), step=st.sampled_from(["@x", "x"]),
       op=st.sampled_from(["=", "=", "<", "<=", ">", ">="]), flipped=st.booleans(),
       kids=st.lists(st.sampled_from(["7", "7", " 7 ", "7.0", "x", "", "<y>7</y>", "7<!--c-->", "1000"] + NUMBER_TEXTS),
                     max_size=3))
def test_xpath_indexes_find_what_the_predicate_finds(values, texts, source, step, op, flipped, kids):
    """``@x = 12``, ``@x = 'text'``, ``x = 12``, ``x = 'text'`` are looked up in hash indexes (by the text, or
    the text cast as elementpath casts it), ``@x > 12``, ``12 <= x``… in range indexes: the same matches as the
    same predicate in parentheses, which no index reads (every node of the type evaluates it)."""
    import io

    from lxml import etree

    from yfpp.input.readers import read_events

    def event(i: int, t: str | None) -> Event:
        el = etree.Element("a", {} if t is None else {"x": t})
        for k in kids[i % 2:]:  # children x: leaves of the texts, one not a leaf, one holding a comment
            el.append(etree.fromstring(f"<x>{k}</x>"))
        return Event("a", float(i), {}, -1, el)

    def run(template: str) -> list:
        eng = Engine()
        for i, v in enumerate(values):
            eng.register(template.format(step=step, value=v), name=f"q{i}")
        if source == "xml":
            lines = "".join(f'<a ts="{i}"' + ("" if t is None else f' x="{t}"') + "/>" for i, t in enumerate(texts))
            events = list(read_events(io.BytesIO(f"<s>{lines}</s>".encode()), "xml"))
        elif source == "json":
            events = [Event("a", float(i), {} if t is None else {"x": t}, -1) for i, t in enumerate(texts)]
        else:
            events = [event(i, t) for i, t in enumerate(texts)]
        return sorted(_canon(m) for ev in events for m in eng.process(ev))

    predicate = "{value} " + op + " {step}" if flipped else "{step} " + op + " {value}"
    indexed = run("//a[" + predicate + "]")
    assert run("//a[(" + predicate + ")]") == indexed


def test_xpath_equalities_take_their_indexes():
    eng = Engine()
    keys = {q: [n.index_key for n in eng.queries[eng.register(q)].nodes]
            for q in ["//a[(@x = 7)]", "//a[@x = 7]", "//a[@x='7']", "//a[x = 7]", "//a[x = \"7\"]", "//a[@x = 1e3]",
                      "//a[@x > 7]", "//a[7 >= x]", "//a[@x > 7.5]"]}
    assert keys == {"//a[(@x = 7)]": [None], "//a[@x = 7]": [("xnum", "x", 7)], "//a[@x='7']": [("xeq", "x", "7")],
                    "//a[x = 7]": [("cnum", "x", 7)], '//a[x = "7"]': [("ceq", "x", "7")], "//a[@x = 1e3]": [None],
                    "//a[@x > 7]": [("xrange", "xnum", "x", ">", 7)], "//a[7 >= x]": [("xrange", "cnum", "x", "<=", 7)],
                    "//a[@x > 7.5]": [None]}


def test_equivalent_negations_share_one_candidate_store():
    eng = Engine()
    ids = [eng.register(f"PATTERN SEQ(shelf a, ~register b, exit c) WHERE [tag_id] WITHIN {10 + i} hours", name=f"q{i}")
           for i in range(5)]
    ids.append(eng.register("PATTERN SEQ(shelf x, ~register y, exit z) WHERE [tag_id] AND y.register = 1 WITHIN 1 hour",
                            name="own"))
    assert len(eng.runtime.negations.stores) == 2  # the five equal negations share one store; `own` filters its own
    out = []
    for ev in ({"type": "shelf", "ts": 0, "tag_id": 7}, {"type": "register", "ts": 1, "tag_id": 7, "register": 2},
               {"type": "exit", "ts": 2, "tag_id": 7}):
        out += eng.process(ev)
    assert [m["query"] for m in out] == ["own"]
    for qid in ids:
        eng.unregister(qid)
    assert not eng.runtime.negations.stores and not any(eng.runtime.negations.by_type.values())


INDEXED_FORMS = [  # {p}: the variable or step the predicate reads; every form is found through an index
    "PATTERN SEQ(a e, b f) WHERE skip_till_any_match(e, f) {{ f.x >= {lo} AND f.x < {hi} }}",
    "PATTERN SEQ(a e, b f) WHERE skip_till_any_match(e, f) {{ e.x > {lo} AND e.x <= {hi} AND e.y = {v} }}",
    "PATTERN SEQ(a e, b f) WHERE skip_till_any_match(e, f) {{ (f.x = {v} OR f.x = {w}) AND f.y < {hi} }}",
    "PATTERN SEQ(a e) WHERE (e.x = '{s}' OR e.x = {w})",
    "//a[@x = {v} and @y > {lo}]//b",
    "//a//b[@x >= {lo} and @x < {hi}]",
    "//a//b[@x > {lo}][@x <= {hi}]",
    "//a[x >= {lo} and {hi} > x]",
    "//a//b[@x = {v} or @x = {w}]",
    "//a[(@x = '{s}' or @x = {w}) and @y >= {lo}]",
    "//a//b[starts-with(@x, '{s}')]",
    "//a[starts-with(x, '{s}') and @y < {hi}]",
]
INDEX_VALUES = [0, 1, 2, 3, 5, 7, 7.5, -1, "7", "7x", "x", "x7", "", None]


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(forms=st.lists(st.tuples(st.sampled_from(INDEXED_FORMS), st.integers(-1, 6), st.integers(0, 4),
                                st.integers(-1, 8), st.integers(0, 8), st.sampled_from(["7", "x", "x7", "1"])),
                      min_size=1, max_size=6),
       events=st.lists(st.tuples(st.sampled_from("ab"), st.sampled_from(INDEX_VALUES),
                                 st.sampled_from(INDEX_VALUES)), max_size=8))
@example(forms=[(INDEXED_FORMS[10], 0, 0, 0, 0, "x"), (INDEXED_FORMS[11], 0, 0, 0, 0, "7")],
         events=[("a", "x7", None), ("b", "x7", None), ("a", "7x", -1)])
@example(forms=[(INDEXED_FORMS[0], 2, 3, 0, 0, "x"), (INDEXED_FORMS[5], 2, 0, 0, 0, "x")],
         events=[("a", 0, None), ("b", 2, None), ("b", 5, None), ("b", 1, None)])
def test_interval_anyof_prefix_and_conjunct_indexes_match_the_reference(forms, events):
    """Ranges with both bounds (interval index), ``or`` of equalities (several hash keys), ``starts-with`` (prefix
    index) and ``and`` in one XPath bracket, in many subscriptions at once: the matches of each are the
    reference evaluator's for it alone."""
    from yfpp.language.query_text import parse_query
    from yfpp.reference.oracle import reference_matches

    stream = [Event(t, float(i), {k: v for k, v in (("x", x), ("y", y)) if v is not None}, i)
              for i, (t, x, y) in enumerate(events)]
    eng = Engine()
    want: Counter = Counter()
    for i, (form, lo, width, v, w, s) in enumerate(forms):
        pattern = parse_query(form.format(lo=lo, hi=lo + width, v=v, w=w, s=s))
        eng.register(pattern, name=f"q{i}")
        want.update((f"q{i}", tuple((k, tuple(b)) for k, b in binds.items()))
                    for binds, _ in reference_matches(pattern, stream))
    assert Counter(_canon(m) for m in _feed(eng, stream)) == want


def test_every_predicate_form_takes_an_index():
    eng = Engine()
    keys = {q: eng.queries[eng.register(q)].nodes[-1].index_key
            for q in ["//a[@x = 'k' and @y > 3]", "//a[@y > 3 and @x = 'k']", "//a[@x >= 1 and @x < 5]",
                      "//a[@x >= 1][@x < 5]", "//a[@x = 'k' or @x = 'j']", "//a[starts-with(@x, 'k-')]",
                      "//a[@x = 'k' or @y = 'j']", "PATTERN SEQ(a e) WHERE e.x >= 1 AND e.x < 5",
                      "PATTERN SEQ(a e) WHERE e.x = 'k' OR e.x = 'j'"]}
    assert keys == {
        "//a[@x = 'k' and @y > 3]": ("xeq", "x", "k"), "//a[@y > 3 and @x = 'k']": ("xeq", "x", "k"),
        "//a[@x >= 1 and @x < 5]": ("interval", "xnum", "x", 1, True, 5, False),
        "//a[@x >= 1][@x < 5]": ("interval", "xnum", "x", 1, True, 5, False),
        "//a[@x = 'k' or @x = 'j']": ("anyof", (("xeq", "x", "k"), ("xeq", "x", "j"))),
        "//a[starts-with(@x, 'k-')]": ("prefix", "xeq", "x", "k-"),
        "//a[@x = 'k' or @y = 'j']": None,  # (two attributes: no one table holds it)
        "PATTERN SEQ(a e) WHERE e.x >= 1 AND e.x < 5": ("interval", None, "x", 1, True, 5, False),
        "PATTERN SEQ(a e) WHERE e.x = 'k' OR e.x = 'j'": ("anyof", (("eq", "x", "k"), ("eq", "x", "j"))),
    }


def test_a_nodes_only_child_and_wait_state_stand_for_their_mappings():
    """A node's only child and only wait state are kept as themselves (no mapping object), a second makes a dict,
    removing goes back; windows that differ, the branch's queries and the transition table's size read the same
    whatever the form; the engine matches, restores and explains as with dicts."""
    from yfpp.nfa.shared_nfa import Node, State, child_at, children_of

    eng = Engine()
    text = "PATTERN SEQ(shelf a, exit c) WHERE skip_till_any_match(a, c) {{ [tag_id] AND a.zone = 'Z1' AND c.door = '{d}' }} WITHIN {w}"
    first = eng.register(text.format(d="D1", w="1 hour"))
    root = eng.queries[first].nodes[0]
    only = root.children
    assert type(only) is Node and list(children_of(root)) == [only] and child_at(root, only.signature) is only
    assert child_at(root, ("no", "such")) is None
    wait = root.waits
    assert type(wait) is State and len(root.waits) == 1 and list(root.waits.values()) == [wait]
    assert root.waits[wait.key] is wait and root.waits.get(wait.key) is wait and root.waits.get("other") is None
    assert wait.table.size() == 1 and root.window == 3600 and root.books is None
    second = eng.register(text.format(d="D2", w="2 hours"))
    assert type(root.children) is dict and len(root.children) == 2 and wait.table.size() == 2
    assert root.window == 7200 and root.books.windows == {3600: 1, 7200: 1}
    assert type(root.waits) is State  # (one contiguity: one wait state for both children)
    assert list(eng.runtime.branch_queries[root]) == [eng.queries[first], eng.queries[second]]
    events = [Event("shelf", 0.0, {"tag_id": 1, "zone": "Z1"}, 0), Event("exit", 5000.0, {"tag_id": 1, "door": "D2"}, 1),
              Event("exit", 5001.0, {"tag_id": 1, "door": "D1"}, 2)]
    restored = Engine.restore(eng.snapshot())
    assert [m["query"] for m in _feed(eng, events)] == [second] == [m["query"] for m in _feed(restored, events)]
    from yfpp.output.explain import nfa_graph

    assert {root.id, *(c.id for c in children_of(root))} <= set(nfa_graph(eng).nodes)
    eng.unregister(second)
    assert root.window == 3600 and root.books.windows is None and wait.table.size() == 1
    assert list(eng.runtime.branch_queries[root]) == [eng.queries[first]]
    eng.unregister(first)
    assert not eng.runtime.branch_queries and not eng.runtime.nfa.roots
