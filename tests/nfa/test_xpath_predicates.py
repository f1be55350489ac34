"""XPath 2.0 predicates: the fast path agrees with elementpath on the element."""

from __future__ import annotations

import elementpath
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from lxml import etree

from xpath_ext.xpath_fast_path import boolean as _boolean
from xpath_ext.xpath_predicates import compile_xpath_test, parse_expression
from yfpp.errors import QuerySyntaxError
from yfpp.input.events import Event

_ERRORS = (elementpath.ElementPathError, ArithmeticError, TypeError, ValueError)


def oracle(source: str, element: etree._Element) -> bool:
    """The predicate ``[source]`` on ``element`` by plain elementpath; an error is false."""
    try:
        return bool(elementpath.select(element, f"self::*[{source}]", fragment=True))
    except _ERRORS:
        return False


def agree(source: str, ev: Event) -> None:
    """compile_xpath_test gives the oracle's answer, or rejects (a static error in a
    constant part, e.g. ``0 = '7'``) what could never be true."""
    try:
        test = compile_xpath_test(source)
    except QuerySyntaxError:
        assert not oracle(source, ev.element)
        return
    assert test(ev) == oracle(source, ev.element)


def event(attrs: dict[str, str], typed: dict | None = None, children: list[tuple[str, str]] = ()) -> Event:
    element = etree.Element("e", attrs)
    for name, markup in children:
        element.append(etree.fromstring(f"<{name}>{markup}</{name}>"))
    return Event("e", 0.0, typed if typed is not None else dict(attrs), 0, element)


# --- generated predicates and attribute values ------------------------------

NAMES = ("a", "b", "c")
TRICKY = (
    "7", "07", "-3", "+5", " 7 ", "\t8\n", "3.5", ".5", "5.", "1e3", "1E-2", "2.5e+1", "INF", "-INF", "+INF",
    "NaN", "inf", "nan", "Infinity", "1_000", "\xa05", "", "true", "abc", "Z1", "1-2", "0", "-0", "0.0",
    "9007199254740993", "1e400", "x y",
)  # fmt: skip
values = st.one_of(
    st.sampled_from(TRICKY),
    st.integers(-1000, 1000).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.text(alphabet="ab 0123456789.-+eE", max_size=5),
)
attributes = st.dictionaries(st.sampled_from(NAMES), values)

literals = st.one_of(
    st.integers(-20, 20).map(str).filter(lambda s: not s.startswith("-")),
    st.sampled_from(["0", "3", "7", "1000", "9007199254740993"]),
    st.sampled_from(["3.5", "0.5", ".5", "7.0", "0.0", "1.0"]),
    st.sampled_from(["1e3", "7E0", "0.5e1", "1e400"]),
    st.sampled_from(["'7'", "'07'", "'abc'", "''", "'Z1'", "\"3.5\"", "'NaN'"]),
)
attribute = st.sampled_from(NAMES).map(lambda n: "@" + n)
child = st.sampled_from(NAMES)  # a child step: the children named so
#: child elements: (name, content) — leaves holding a value (or nothing), and ones the fast path leaves to
#: elementpath (an element, a comment, CDATA inside)
children = st.lists(st.tuples(st.sampled_from(NAMES), st.one_of(
    values.map(lambda v: v.replace("&", "&amp;").replace("<", "&lt;")), st.sampled_from([" 7 ", "7", "x y", "abc"]),
    st.sampled_from(["", "<x>1</x>", "<x>1</x>2", "<!--c-->5", "<![CDATA[7]]>", "<x/>"]))), max_size=4)


def arithmetic(operand: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    op = st.sampled_from(["+", "-", "*", "div", "mod", "idiv"])
    return st.tuples(operand, op, operand).map(lambda t: f"({t[0]} {t[1]} {t[2]})")


numeric = st.recursive(st.one_of(attribute, literals, child), arithmetic, max_leaves=4)
comparison = st.tuples(numeric, st.sampled_from(["=", "!=", "<", "<=", ">", ">=", "eq", "lt"]), numeric).map(
    lambda t: f"{t[0]} {t[1]} {t[2]}"
)


def connectives(operand: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    return st.one_of(
        st.tuples(operand, st.sampled_from(["and", "or"]), operand).map(lambda t: f"{t[0]} {t[1]} {t[2]}"),
        operand.map(lambda s: f"not({s})"),
        operand.map(lambda s: f"({s})"),
    )


predicates = st.recursive(st.one_of(comparison, attribute, child), connectives, max_leaves=5)


def compares_two_sequences(source: str) -> bool:
    """Is ``[source]`` refused for comparing two child steps (``a = b``: its cost has no bound)?"""
    try:
        parse_expression(source)
    except elementpath.ElementPathError as err:
        return "the cost is the product" in str(err)
    return False


@settings(max_examples=1500, deadline=None)
@given(predicates, attributes, children)
def test_compiled_predicate_agrees_with_elementpath(source: str, attrs: dict[str, str], kids: list) -> None:
    assume(not compares_two_sequences(source))  # (tested in test_what_has_no_cost_bound_is_refused…)
    agree(source, event(attrs, children=kids))


general = st.sampled_from(["=", "!=", "<", "<=", ">", ">="])
texts = st.sampled_from(["' 7 '", "'7'", "'x y'", "''", "'12'"])  # (a child's text is compared as it is, spaces and all)
few = st.sampled_from(["a", "a", "b"])  # children and steps of fewer names: the steps find children more often
child_comparison = st.one_of(
    st.tuples(few, general, st.one_of(literals, texts, attribute)).map(" ".join),
    st.tuples(st.one_of(literals, texts, attribute), general, few).map(" ".join),
)
string_test = st.tuples(st.sampled_from(["contains", "starts-with", "ends-with"]), st.one_of(few, attribute),
                        st.sampled_from(["''", "'7'", "' '", "'x y'", "'a'", "'1'"])).map(lambda t: f"{t[0]}({t[1]}, {t[2]})")
child_predicates = st.recursive(st.one_of(child_comparison, few, string_test), connectives, max_leaves=3)
few_children = st.lists(st.tuples(few, st.one_of(
    st.sampled_from([" 7 ", "7", "12", "x y", "abc", "", "-3", "NaN"]),
    st.sampled_from(["<x>1</x>2", "<x>1</x>", "<!--c-->5", "<x/>", "1<x/>"]))), max_size=3)


@settings(max_examples=800, deadline=None)
@given(st.tuples(st.one_of(attribute, literals, texts), general, st.one_of(attribute, literals, texts)).map(" ".join),
       attributes | st.dictionaries(st.sampled_from(NAMES), st.sampled_from(TRICKY), min_size=2))
def test_one_comparison_agrees_with_elementpath(source: str, attrs: dict[str, str]) -> None:
    """``@a op literal`` and ``literal op @a`` (the commonest predicates, which take a path of their own)."""
    assume(not source.startswith(("'", *"0123456789.")) or "@" in source)  # (two literals: a static error)
    agree(source, event(attrs))


@settings(max_examples=1000, deadline=None)
@given(child_predicates, attributes, few_children)
def test_child_steps_agree_with_elementpath(source: str, attrs: dict[str, str], kids: list) -> None:
    """Child steps compared (``reading > 30``): the fast path reads leaf children; one that is not a
    leaf sends the event to elementpath."""
    agree(source, event(attrs, children=kids))


@settings(max_examples=300, deadline=None)
@given(numeric, attributes)
def test_numeric_predicates_are_positional(source: str, attrs: dict[str, str]) -> None:
    agree(source, event(attrs))


# --- which forms take the fast path -----------------------------------------

FAST = [
    "@a = 'x'", "@a > 3", "3 < @a", "@a >= 2.5", "@a = 1e3", "@a != @b", "@a < @b",
    "@a + @b > 10", "(@a - 1) * 2 div @b <= 0", "@a", "not(@a)", "@a and (@b or not(@c = 'z'))",
    "qty > 5", "'x' = name", "qty", "not(qty = @min) and @a",
    "starts-with(@id, 'RFID-')", "contains(note, 'x')", "ends-with(@a, '')",
]  # fmt: skip
SLOW = ["count(@*) = 2", "@a eq 3", "-@a > 1", "@a mod 2 = 0", "1 + 2 = @a", "2", "@a + 1", "local-name() = 'e'", "@*",
        "qty + 1 > 5", "item/qty = 1", "* = 1", "qty eq 5", "contains(@a, @b)",
        "contains(@a, 1)", "starts-with(concat(@a, @b), 'x')"]


@pytest.mark.parametrize("source", FAST)
def test_common_forms_take_the_fast_path(source: str) -> None:
    assert _boolean(parse_expression(source)) is not None


@pytest.mark.parametrize("source", SLOW)
def test_other_forms_fall_back_to_elementpath(source: str) -> None:
    assert _boolean(parse_expression(source)) is None


# --- the comparison rules, spelt out ---------------------------------------

CASES = [
    ("@a = '07'", {"a": "07"}, True),  # string literal: compare the raw text
    ("@a = '7'", {"a": "07"}, False),
    ("@a = 7", {"a": "07"}, True),  # numeric literal: cast the text to xs:double
    ("@a > 3", {"a": "abc"}, False),  # cast error: the predicate is false …
    ("not(@a > 3)", {"a": "abc"}, False),  # … as a whole, not just the comparison
    ("@b or @a > 3", {"a": "abc", "b": ""}, True),  # `or` stops at a true left operand
    ("@a > 3", {}, False),  # missing attribute: empty sequence
    ("not(@a > 3)", {}, True),
    ("@a + @b > 1", {"a": "abc"}, False),  # empty operand: empty result, no cast
    ("@a < @b", {"a": "10", "b": "9"}, False),  # elementpath orders two attributes as numbers
    ("@a = @b", {"a": "1.0", "b": "1"}, False),  # … and equates them as strings
    ("@a", {"a": ""}, True),  # existence
    ("@a div 0 > 1", {"a": "2"}, True),  # xs:double division: INF
    ("@a = 'x'", {"a": " x"}, False),
    ("@a > 3", {"a": " 7 "}, True),
]


@pytest.mark.parametrize(("source", "attrs", "expected"), CASES)
def test_comparison_rules(source: str, attrs: dict[str, str], expected: bool) -> None:
    ev = event(attrs)
    assert compile_xpath_test(source)(ev) is expected
    assert oracle(source, ev.element) is expected


def test_the_element_text_counts_not_the_typed_attribute() -> None:
    ev = event({"a": "07"}, typed={"a": 7})
    assert compile_xpath_test("@a = '07'")(ev)
    assert not compile_xpath_test("@a = '7'")(ev)


def test_attributes_only_not_child_elements() -> None:
    element = etree.fromstring("<shelf><qty>5</qty></shelf>")
    ev = Event("shelf", 0.0, {"qty": 5}, 0, element)
    assert not compile_xpath_test("@qty = 5")(ev)
    assert compile_xpath_test("qty = 5")(ev)


def test_child_steps_on_events_read_from_lines_and_from_json() -> None:
    """An XML event that keeps only its attribute texts has no children; a JSON event's children are the
    ``<attr name=…>`` elements its built element would have (attributes whose names are not XML names)."""
    import io

    from yfpp.input.readers import read_xml
    from yfpp.input.xml_element import element_for

    line_event, _ = read_xml(io.BytesIO(b'<shelf ts="1" qty="5"/>\n<shelf ts="2"/>\n'))
    assert line_event.texts is not None
    json_event = Event("shelf", 1.0, {"qty": 5, "1x": "v"}, 0)
    for source in ["qty = 5", "qty", "not(qty)", "attr = 'v'", "attr", "@qty = 5"]:
        test = compile_xpath_test(source)
        assert test(line_event) == oracle(source, line_event.element), source
        assert test(json_event) == oracle(source, element_for(json_event)), source
    assert compile_xpath_test("attr = 'v'")(json_event) and not compile_xpath_test("qty")(json_event)


def test_a_default_element_namespace_leaves_child_steps_to_elementpath() -> None:
    element = etree.fromstring('<e xmlns="urn:x"><a>1</a></e>')
    ev = Event("e", 0.0, {}, 0, element)
    assert _boolean(parse_expression("a = 1", (("", "urn:x"),))) is None
    assert compile_xpath_test("a = 1", (("", "urn:x"),))(ev)
    assert not compile_xpath_test("a = 1")(ev)  # no namespace: {urn:x}a is not a


def test_compiled_once_per_source() -> None:
    assert compile_xpath_test("@a > 1") is compile_xpath_test("@a > 1")


def test_namespaces() -> None:
    element = etree.Element("e", {"{urn:x}a": "1"})
    ev = Event("e", 0.0, {}, 0, element)
    assert compile_xpath_test("@x:a = 1", (("x", "urn:x"),))(ev)
    with pytest.raises(QuerySyntaxError):
        compile_xpath_test("@x:a = 1")


@pytest.mark.parametrize(("source", "line", "column"), [("@a ==3", 1, 5), ("@a and\n (@b ?)", 2, 6), ("foo(@a)", 1, 1)])
def test_syntax_errors(source: str, line: int, column: int) -> None:
    with pytest.raises(QuerySyntaxError) as info:
        compile_xpath_test(source)
    assert (info.value.line, info.value.column) == (line, column)


@pytest.mark.parametrize(("source", "column", "what"), [
    ("count(1 to 100000000000) > 1", 9, "a range in an event predicate is two integer literals at most 10,000 apart"),
    ("(1 to 100000000)[. = 3]", 4, "a range"),
    ("@a = (1 to @b)", 9, "a range"),
    ("count(for $i in 1 to 10, $j in 1 to 10 return 1) > 0", 7, "a for expression is not allowed"),
    ("some $x in @* satisfies $x = 1", 1, "a some expression is not allowed"),
    ("every $x in @* satisfies $x = 1", 1, "an every expression is not allowed"),
    ("matches(@a, '^(a+)+$')", 1, "matches() takes a literal pattern without quantifiers"),
    ("matches(@a, @b)", 1, "matches() takes a literal pattern"),
    ("tokenize(@a, ',+')", 1, "tokenize() takes a literal pattern"),
    ("@b and fn:replace(@a, 'a', 'b') = 'b'", 11, "replace() is not allowed"),
    ("(1 to 3000) = (5001 to 8000)", 13, "may not compare two sequences"),
    ("tokenize(@s, ',') = tokenize(@t, ',')", 19, "may not compare two sequences"),
    ("* = *", 3, "may not compare two sequences"),
    ("//*[. = //*]", 4, "filter a sequence by another"),
    ("tokenize(@s, ',')[. = (1 to 10)]", 18, "filter a sequence by another"),
    ("distinct-values((1 to 10)) = 1", 1, "distinct-values() is not allowed"),
    ("string-length(string-join(tokenize(@s, 'x'), @s)) > 5", 15, "string-join() takes a literal separator"),
    ("compare(@a, 'b', 'http://www.w3.org/2013/collation/UCA') = -1", 1, "compare() takes no collation argument"),
    ("contains(@a, 'b', 'http://www.w3.org/2005/xpath-functions/collation/codepoint')", 1, "takes no collation"),
    ("@x = $y", 6, "an event predicate has no variables"),
])
def test_what_has_no_cost_bound_is_refused_before_anything_is_evaluated(source: str, column: int, what: str) -> None:
    """A range, a loop or a regular expression could cost any time or memory per event (or at registration,
    where elementpath evaluates constant parts): a subscriber's predicate must not stall every other one."""
    with pytest.raises(QuerySyntaxError) as info:
        compile_xpath_test(source)
    assert what in str(info.value) and (info.value.line, info.value.column) == (1, column)


@pytest.mark.parametrize(("source", "attrs", "expected"), [
    ("@a = (1 to 10)", {"a": "7"}, True), ("@a = (-5 to -1)", {"a": "-3"}, True), ("@a = (1 to 10000)", {"a": "0"}, False),
    ("contains(@a, 'bc')", {"a": "abcd"}, True), ("starts-with(@a, 'x')", {"a": "abcd"}, False),
    ("matches(@a, '^a.c')", {"a": "abcd"}, True), ("tokenize(@a, ' ') = '2'", {"a": "1 2 3"}, True),
    ("count(tokenize(@a, ' ')) = count(tokenize(@b, ','))", {"a": "1 2", "b": "x,y"}, True),
    ("tokenize(@a, ' ')[. = '2'] = '2'", {"a": "1 2 3"}, True), ("string-join(tokenize(@a, ' '), '-') = '1-2'", {"a": "1 2"}, True),
    ("compare(@a, 'b') = -1", {"a": "a"}, True), ("@a = xs:QName('p:q')", {"a": "p:q"}, False),
])
def test_bounded_ranges_and_string_functions_still_work(source: str, attrs: dict[str, str], expected: bool) -> None:
    ev = event(attrs)
    assert compile_xpath_test(source)(ev) is expected and oracle(source, ev.element) is expected


json_values = st.dictionaries(
    st.sampled_from(NAMES),
    st.one_of(st.integers(-10, 10), st.floats(allow_nan=False, allow_infinity=False, width=32), st.sampled_from(TRICKY), st.booleans()),
)


@settings(max_examples=600, deadline=None)
@given(predicates, json_values)
def test_events_without_an_element_read_what_their_built_element_would_say(source: str, attrs: dict) -> None:
    """JSON events take the fast path on their typed values, with no element built; the
    answer must be elementpath's on the element ``Event.element`` would build."""
    from yfpp.input.xml_element import element_for

    ev = Event("e", 1.0, dict(attrs), 0)
    try:
        test = compile_xpath_test(source)
    except QuerySyntaxError:
        return
    got = test(ev)
    assert got == oracle(source, element_for(Event("e", 1.0, dict(attrs), 0)))


def test_the_child_element_example_matches_its_sase_equivalent() -> None:
    """queries/overheating.xpe compares child elements; SASE+ on the attributes the reader makes of the
    same leaf children gives the same matches."""
    from pathlib import Path

    from yfpp.engine import Engine
    from yfpp.language.query_text import load_queries
    from yfpp.input.readers import read_events

    root = Path(__file__).resolve().parents[2]
    events = list(read_events(str(root / "yfpp/data/sensor_readings.xml")))
    assert [e.attrs for e in events[:1]] == [{"sensor": "T1", "room": "lab", "celsius": 21.5}]

    def bindings(*queries: str) -> list:
        engine = Engine()
        for q in queries:
            engine.register(q)
        found = [m for ev in events for m in engine.process(ev)] + engine.flush()
        return [(m["bindings"]["e1" if "e1" in m["bindings"] else "a"], m["bindings"]["e2" if "e2" in m["bindings"] else "b"])
                for m in found]

    xpath = bindings(*(q.text for q in load_queries([str(root / "queries/overheating.xpe")])))
    sase = bindings("PATTERN SEQ(reading a, ~reading n, reading b) WHERE skip_till_any_match(a, n, b) "
                    "{ [sensor] AND a.celsius > 30 AND n.celsius < 25 AND b.celsius > 30 } WITHIN 10 minutes")
    assert xpath == sase == [([2], [4]), ([5], [7])]


#: predicates with the stand-ins of a query shape's constants (``{s}``, ``{s2}`` strings, ``{n}`` an integer)
TEMPLATED = ["@a = {s} and @b > {n}", "starts-with(@a, {s})", "a = {s}", "@a = {s} or @a = {s2}", "@b = {n}",
             "not(contains(@c, {s})) or b >= {n}", "(@a + {n}) > @b", "{n} <= @b and ends-with(c, {s2})"]
STAND_INS = {"s": "'\ue0000\ue001'", "s2": "'\ue0001\ue001'", "n": "987654321002"}


@settings(max_examples=400, deadline=None)
@given(st.sampled_from(TEMPLATED), st.sampled_from(["7", "07", "abc", "", "Z1", "x y", "3.5"]),
       st.sampled_from(["7", "abc", "Z", "-1"]), st.sampled_from(["0", "3", "7", "1000", "9007199254740993"]),
       attributes, children)
def test_a_test_made_from_its_template_is_the_test_compiled(template: str, s: str, s2: str, n: str,
                                                             attrs: dict[str, str], kids: list) -> None:
    """``TestTemplate``: a shape's predicate parsed once, remade with a query's constants, answers as the
    predicate with those constants compiled (``compile_xpath_test``)."""
    from xpath_ext.xpath_predicates import TestTemplate

    made = TestTemplate(template.format(**STAND_INS), (), {"\ue0000\ue001": "s", "\ue0001\ue001": "s2",
                                                           987654321002: "n"})
    source = template.format(s=repr(s), s2=repr(s2), n=n)
    test = made.test({"s": s, "s2": s2, "n": n}, source)
    again = made.test({"s": "other", "s2": "other", "n": "1"}, template.format(s="'other'", s2="'other'", n="1"))
    ev = event(attrs, children=kids)
    assert test(ev) == compile_xpath_test(source)(ev)
    assert again(ev) == compile_xpath_test(template.format(s="'other'", s2="'other'", n="1"))(ev)
