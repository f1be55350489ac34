"""The SASE+ front end: query text → Pattern IR, and its error messages."""

from __future__ import annotations

import builtins
from pathlib import Path

import pytest

import yfpp.language.sase_parser
from yfpp.errors import PatternError, QuerySyntaxError
from yfpp.language.pattern import (
    Aggregate,
    And,
    Arith,
    Component,
    Compare,
    Contiguity,
    Emit,
    Index,
    Kind,
    Length,
    Literal,
    Neg,
    Not,
    Or,
    Pattern,
    Ref,
)
from yfpp.language.sase_parser import parse_sase
from xpath_ext.parser import parse_xpath

NEXT, ANY, STRICT, PARTITION = (
    Contiguity.SKIP_TILL_NEXT,
    Contiguity.SKIP_TILL_ANY,
    Contiguity.STRICT,
    Contiguity.PARTITION,
)


def ref(var: str, attr: str, index: Index = Index.EACH) -> Ref:
    return Ref(var, attr, index)


def cmp(op: str, left, right) -> Compare:
    return Compare(op, left, right)


def where_of(body: str, decl: str = "SEQ(A a, B+ b[], C c)") -> tuple:
    """The WHERE conjuncts of a query over three variables (a, Kleene b, c)."""
    return parse_sase(f"PATTERN {decl} WHERE {body}").where


# --- exact IR ----------------------------------------------------------------


def test_spec_example_with_return() -> None:
    text = """PATTERN SEQ(shelf a, ~register b, exit c)
WHERE skip_till_next_match(a, b, c) { [tag_id] AND a.zone = 'Z1' }
WITHIN 12 hours
RETURN alert(tag_id = a.tag_id, at = c.ts)"""
    p = parse_sase(text)
    assert p == Pattern(
        components=(
            Component("a", "shelf", Kind.SINGLE, NEXT),
            Component("b", "register", Kind.NEGATED, NEXT),
            Component("c", "exit", Kind.SINGLE, NEXT),
        ),
        where=(cmp("=", ref("a", "zone"), Literal("Z1")),),
        partition_by=("tag_id",),
        window=43200,
        policy="all",
        emit=Emit("alert", (("tag_id", ref("a", "tag_id")), ("at", ref("c", "ts")))),
    )
    assert p.source == text


def test_sigmod_figure1_q1_negation_in_parentheses() -> None:
    p = parse_sase("""PATTERN SEQ(Shelf a, ~(Register b), Exit c)
WHERE skip_till_next_match(a, b, c) {
    a.tag_id = b.tag_id
    and a.tag_id = c.tag_id
    /* equivalently, [tag_id] */ }
WITHIN 12 hours""")
    assert p.components == (
        Component("a", "Shelf"),
        Component("b", "Register", Kind.NEGATED),
        Component("c", "Exit"),
    )
    assert p.where == (
        cmp("=", ref("a", "tag_id"), ref("b", "tag_id")),
        cmp("=", ref("a", "tag_id"), ref("c", "tag_id")),
    )
    assert p.partition_by == ()
    assert p.window == 12 * 3600
    assert p.emit is None


def test_sigmod_figure1_q2_kleene_and_keyword_like_attributes() -> None:
    p = parse_sase("""PATTERN SEQ(Alert a, Shipment+ b[ ])
WHERE skip_till_any_match(a, b[ ]) {
    a.type = 'contaminated'
    and b[1].from = a.site
    and b[i].from = b[i-1].to }
WITHIN 3 hours""")
    assert p.components == (
        Component("a", "Alert", Kind.SINGLE, ANY),
        Component("b", "Shipment", Kind.KLEENE, ANY, None),
    )
    assert p.where == (
        cmp("=", ref("a", "type"), Literal("contaminated")),
        cmp("=", ref("b", "from", Index.FIRST), ref("a", "site")),
        cmp("=", ref("b", "from"), ref("b", "to", Index.PREV)),
    )
    assert p.window == 3 * 3600


def test_sigmod_figure1_q3_aggregate_percent_last() -> None:
    p = parse_sase("""PATTERN SEQ(Stock+ a[ ], Stock b)
WHERE skip_till_next_match(a[ ], b) {
    [symbol]
    and a[1].volume > 1000
    and a[i].price > avg(a[..i-1].price)
    and b.volume < 80%*a[a.len].volume }
WITHIN 1 hour""")
    assert p.components == (Component("a", "Stock", Kind.KLEENE), Component("b", "Stock"))
    assert p.partition_by == ("symbol",)
    assert p.where == (
        cmp(">", ref("a", "volume", Index.FIRST), Literal(1000)),
        cmp(">", ref("a", "price"), Aggregate("avg", "a", "price", upto_prev=True)),
        cmp("<", ref("b", "volume"), Arith("*", Literal(0.8), ref("a", "volume", Index.LAST))),
    )
    assert p.window == 3600


@pytest.mark.parametrize(
    ("rise", "expected"),
    [
        ("a[i].price > a[i-1].price", cmp(">", ref("a", "price"), ref("a", "price", Index.PREV))),
        ("a[i].price > min(a[..i-1].price)", cmp(">", ref("a", "price"), Aggregate("min", "a", "price"))),
    ],
)
def test_stock_template(rise: str, expected: Compare) -> None:
    p = parse_sase(
        "PATTERN SEQ(stock+ a[], stock b) WHERE partition_contiguity(a, b) "
        f"{{ [symbol] AND a[1].price % 500 = 0 AND {rise} AND b.volume < 150 }} WITHIN 500"
    )
    assert p.components == (
        Component("a", "stock", Kind.KLEENE, PARTITION),
        Component("b", "stock", Kind.SINGLE, PARTITION),
    )
    assert p.where == (
        cmp("=", Arith("%", ref("a", "price", Index.FIRST), Literal(500)), Literal(0)),
        expected,
        cmp("<", ref("b", "volume"), Literal(150)),
    )
    assert p.partition_by == ("symbol",)
    assert p.window == 500 and isinstance(p.window, int)


# --- components ---------------------------------------------------------------


def test_component_forms() -> None:
    p = parse_sase("PATTERN SEQ(A a, B+ b, C+ c[], ANY d, ~E e, G g, ~(ANY f)) WITHIN 5")
    assert p.components == (
        Component("a", "A"),
        Component("b", "B", Kind.KLEENE),
        Component("c", "C", Kind.KLEENE),
        Component("d", None),
        Component("e", "E", Kind.NEGATED),
        Component("g", "G"),
        Component("f", None, Kind.NEGATED),
    )


def test_single_component_without_seq() -> None:
    assert parse_sase("PATTERN shelf a") == Pattern(components=(Component("a", "shelf"),))


def test_type_names_are_case_sensitive() -> None:
    p = parse_sase("PATTERN SEQ(Shelf a, shelf b)")
    assert [c.event_type for c in p.components] == ["Shelf", "shelf"]


# --- WHERE forms and strategies ------------------------------------------------------


@pytest.mark.parametrize(
    ("clause", "contiguity", "where"),
    [
        ("", NEXT, ()),
        ("WHERE strict_contiguity(a, b)", STRICT, ()),
        ("WHERE skip_till_any_match(a, b) { }", ANY, ()),
        ("WHERE { a.x = 1 }", NEXT, (cmp("=", ref("a", "x"), Literal(1)),)),
        ("WHERE a.x = 1", NEXT, (cmp("=", ref("a", "x"), Literal(1)),)),
        ("WHERE partition_contiguity() {}", PARTITION, ()),
    ],
)
def test_where_forms(clause: str, contiguity: Contiguity, where: tuple) -> None:
    p = parse_sase(f"PATTERN SEQ(A a, B+ b[], ~C c, D d) {clause} WITHIN 3")
    assert [c.contiguity for c in p.positives] == [contiguity] * 3
    assert p.component("c").contiguity is NEXT  # negations keep the default
    assert p.component("b").inner_contiguity is None
    assert p.where == where


def test_strategy_argument_list_is_only_checked_with_one_call() -> None:
    p = parse_sase("PATTERN SEQ(A a, B b, C c) WHERE strict_contiguity(a)")
    assert [c.contiguity for c in p.components] == [STRICT] * 3


def test_mixed_strategies_extension() -> None:
    p = parse_sase("PATTERN SEQ(A a, B+ b[], C c, D d) WHERE strict_contiguity(a, b[]) skip_till_any_match(c) {}")
    assert [c.contiguity for c in p.components] == [STRICT, STRICT, ANY, NEXT]


def test_equivalence_tests_collect_in_order_without_duplicates() -> None:
    p = parse_sase("PATTERN SEQ(A a, B b) WHERE [x, y] AND a.v > 1 AND ([y] AND [z, x])")
    assert p.partition_by == ("x", "y", "z")
    assert p.where == (cmp(">", ref("a", "v"), Literal(1)),)
    assert parse_sase("PATTERN SEQ(A a, B b) WHERE [type, from]").partition_by == ("type", "from")


# --- expressions ------------------------------------------------------------------------


def test_arithmetic_precedence_and_unary_minus() -> None:
    assert where_of("a.x + c.y * 2 - -3 >= -a.z / (c.w % 4)") == (
        cmp(
            ">=",
            Arith("-", Arith("+", ref("a", "x"), Arith("*", ref("c", "y"), Literal(2))), Literal(-3)),
            Arith("/", Neg(ref("a", "z")), Arith("%", ref("c", "w"), Literal(4))),
        ),
    )


def test_boolean_operators() -> None:
    assert where_of("a.x = 1 OR NOT c.y <> 2 AND (a.z < 1.5 or c.z > 2e3)") == (
        Or((
            cmp("=", ref("a", "x"), Literal(1)),
            And((
                Not(cmp("!=", ref("c", "y"), Literal(2))),
                Or((cmp("<", ref("a", "z"), Literal(1.5)), cmp(">", ref("c", "z"), Literal(2000.0)))),
            )),
        )),
    )


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("'it\\'s'", "it's"),
        ('"double"', "double"),
        ("true", True),
        ("FALSE", False),
        ("42", 42),
        ("4.5", 4.5),
        ("80%", 0.8),
        ("12.5%", 0.125),
    ],
)
def test_literals(text: str, value: object) -> None:
    (pred,) = where_of(f"a.x = {text}")
    assert pred == cmp("=", ref("a", "x"), Literal(value))
    assert type(pred.right.value) is type(value)


def test_percent_versus_modulo() -> None:
    assert where_of("a.x = 10%3") == (cmp("=", ref("a", "x"), Arith("%", Literal(10), Literal(3))),)
    assert where_of("a.x = 10 % a.y") == (cmp("=", ref("a", "x"), Arith("%", Literal(10), ref("a", "y"))),)
    assert where_of("a.x < 50% * c.y") == (cmp("<", ref("a", "x"), Arith("*", Literal(0.5), ref("c", "y"))),)
    # a keyword after the `%` ends the operand: the `%` is a percent sign
    assert where_of("a.x > 80% AND c.y = 1") == (cmp(">", ref("a", "x"), Literal(0.8)), cmp("=", ref("c", "y"), Literal(1)))
    assert where_of("a.x > 80% or (c.y = 1)") == (Or((cmp(">", ref("a", "x"), Literal(0.8)), cmp("=", ref("c", "y"), Literal(1)))),)
    pattern = parse_sase("PATTERN SEQ(A a, C c) WHERE a.x > 80% WITHIN 5 RETURN r(v = 10%)")
    assert pattern.where == (cmp(">", ref("a", "x"), Literal(0.8)),) and pattern.window == 5
    assert pattern.emit.attrs == (("v", Literal(0.1)),)
    # …unless it names a variable
    pattern = parse_sase("PATTERN SEQ(A and, C c) WHERE c.x = 10 % and.y")
    assert pattern.where == (cmp("=", ref("c", "x"), Arith("%", Literal(10), ref("and", "y"))),)


def test_references_length_and_aggregates() -> None:
    assert where_of(
        "b.len > 2 AND b[1].len = 0 AND c.x > sum(b[..].v) AND count(b[..i-1].v) < MAX(b[..].w) AND b[b.len].v = b.v"
    ) == (
        cmp(">", Length("b"), Literal(2)),
        cmp("=", ref("b", "len", Index.FIRST), Literal(0)),
        cmp(">", ref("c", "x"), Aggregate("sum", "b", "v", upto_prev=False)),
        cmp("<", Aggregate("count", "b", "v"), Aggregate("max", "b", "w", upto_prev=False)),
        cmp("=", ref("b", "v", Index.LAST), ref("b", "v")),
    )


def test_keyword_like_attribute_names() -> None:
    assert where_of("a.and = c.where AND a.within = c.seq") == (
        cmp("=", ref("a", "and"), ref("c", "where")),
        cmp("=", ref("a", "within"), ref("c", "seq")),
    )


# --- WITHIN, OUTPUT, RETURN -------------------------------------------------------------


@pytest.mark.parametrize(
    ("window", "seconds"),
    [
        ("250 ms", 0.25),
        ("3 s", 3),
        ("3 sec", 3),
        ("1 second", 1),
        ("3 seconds", 3),
        ("1.5 min", 90),
        ("2 minutes", 120),
        ("1 h", 3600),
        ("1 HOUR", 3600),
        ("2 hours", 7200),
        ("1 d", 86400),
        ("2 Days", 172800),
        ("42", 42),
        ("0.5", 0.5),
    ],
)
def test_window_units(window: str, seconds: float) -> None:
    assert parse_sase(f"PATTERN SEQ(A a, B b) WITHIN {window}").window == seconds


@pytest.mark.parametrize("ts_unit, seconds", [("s", 500), ("ms", 0.5), ("us", 0.0005), ("ns", 5e-7), ("min", 30000), ("h", 1800000)])
def test_a_window_without_a_unit_is_in_the_timestamp_unit(ts_unit: str, seconds: float) -> None:
    assert parse_sase("PATTERN SEQ(A a, B b) WITHIN 500", ts_unit).window == seconds
    assert parse_xpath("//A//B(500)", ts_unit).window == seconds
    assert parse_sase("PATTERN SEQ(A a, B b) WITHIN 500 ms", ts_unit).window == 0.5  # a unit says its own


def test_dotted_attribute_names_from_nested_json() -> None:
    """``{"o": {"p": 1}}`` is read as attribute ``o.p``: SASE+ names it ``x.o.p``, in every form of reference."""
    p = parse_sase("PATTERN SEQ(A+ a[], B b) WHERE [o.p, k] AND a[i].o.p > a[i-1].o.p AND b.q.r > avg(a[..i-1].o.p) "
                   "AND b.s = prev(a.o.p) AND b.t = a[a.len].o.p")
    assert p.partition_by == ("o.p", "k")
    refs = {(r.var, r.attr) for c in p.where for r in (c.left, c.right) if isinstance(r, (Ref, Aggregate))}
    assert refs == {("a", "o.p"), ("b", "q.r"), ("b", "s"), ("b", "t")}
    with pytest.raises(QuerySyntaxError):
        parse_sase("PATTERN SEQ(A a, B b) WHERE a.o. = 1")


def test_output_policy_and_bare_return() -> None:
    p = parse_sase("PATTERN SEQ(A a, B b) WITHIN 5 OUTPUT non_overlapping RETURN done")
    assert p.policy == "non_overlapping"
    assert p.emit == Emit("done", ())
    assert parse_sase("PATTERN SEQ(A a, B b) OUTPUT ALL").policy == "all"
    assert parse_sase("PATTERN SEQ(A a, B b) RETURN done()").emit == Emit("done", ())


def test_return_expressions() -> None:
    p = parse_sase("PATTERN SEQ(A a, B+ b[]) RETURN r(n = b.len, gap = b[b.len].ts - a.ts, tag = 'x')")
    assert p.emit == Emit(
        "r",
        (
            ("n", Length("b")),
            ("gap", Arith("-", ref("b", "ts", Index.LAST), ref("a", "ts"))),
            ("tag", Literal("x")),
        ),
    )


# --- lexical ---------------------------------------------------------------------------


def test_keywords_are_case_insensitive() -> None:
    query = (
        "{pattern} {seq}(A a, B+ b[]) {where} {strategy}(a, b) {{ [k] {and_} ({not_} a.x = {true} {or_} b.y > 1) }}"
        " {within} 2 {hours} {output} {all_} {return_} r(v = a.x)"
    )
    values = "PATTERN SEQ WHERE SKIP_TILL_ANY_MATCH AND NOT TRUE OR WITHIN HOURS OUTPUT ALL RETURN".split()
    words = "pattern seq where strategy and_ not_ true or_ within hours output all_ return_".split()
    upper = parse_sase(query.format(**dict(zip(words, values))))
    lower = parse_sase(query.format(**dict(zip(words, (v.lower() for v in values)))))
    mixed = parse_sase(query.format(**dict(zip(words, (v.title() for v in values)))))
    assert upper == lower == mixed
    assert [c.contiguity for c in upper.components] == [ANY, ANY]
    assert upper.partition_by == ("k",) and upper.window == 7200


def test_comments_anywhere() -> None:
    plain = parse_sase("PATTERN SEQ(A a, B b) WHERE strict_contiguity(a, b) { a.x = b.x } WITHIN 5 h")
    commented = parse_sase(
        "/* head */ PATTERN /* c */ SEQ(A /* type */ a, B b) /* x */\n"
        "WHERE strict_contiguity(a, /* arg */ b) { a.x /* l */ = /* r */\n b.x /* multi\nline */ }\n"
        "WITHIN 5 /* unit */ h /* tail */"
    )
    assert commented == plain


# --- syntax errors ---------------------------------------------------------------------------


def syntax_error(text: str) -> QuerySyntaxError:
    with pytest.raises(QuerySyntaxError) as info:
        parse_sase(text)
    return info.value


def test_missing_closing_parenthesis() -> None:
    e = syntax_error("PATTERN SEQ(A a, B b\nWHERE a.x = 1")
    assert (e.line, e.column) == (2, 1)
    assert e.expected == ["')'", "','"]
    message = str(e)
    assert "line 2, column 1: unexpected 'WHERE'" in message
    assert "\n  WHERE a.x = 1\n  ^\n" in message
    assert "expected one of: ')', ','" in message


def test_misspelled_keyword() -> None:
    e = syntax_error("PATTERN SEQ(A a, B b)\nWHERE a.x = 1\nWTHIN 3 hours")
    assert (e.line, e.column) == (3, 1)
    assert "did you mean WITHIN?" in str(e)
    assert {"'WITHIN'", "'RETURN'", "'OUTPUT'", "'AND'", "'OR'", "end of query"} <= set(e.expected)
    e = syntax_error("PATERN SEQ(A a)")
    assert (e.line, e.column, e.expected) == (1, 1, ["'PATTERN'"])


def test_unexpected_end_of_query() -> None:
    e = syntax_error("PATTERN SEQ(A a, B b)\nWHERE { a.x = 1\n")
    assert (e.line, e.column) == (2, 16)  # just after the last character
    assert "unexpected end of query" in str(e)
    assert e.expected == ["'}'"]


def test_unexpected_character_and_readable_terminals() -> None:
    e = syntax_error("PATTERN SEQ(A a, B b) WHERE a.x = $1")
    assert (e.line, e.column) == (1, 35)
    assert "unexpected character '$'" in str(e)
    assert {"a number", "a string", "a name"} <= set(e.expected)
    e = syntax_error("PATTERN SEQ(A a, B b) WITHIN 3 hourz")
    assert "a time unit (ms, s, min, h, d)" in e.expected
    e = syntax_error("PATTERN SEQ(A a, B b) OUTPUT some")
    assert e.expected == ["'all'", "'earliest_maximal'", "'non_overlapping'"]


# --- structural errors -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("PATTERN SEQ(A a, B b)\nWHERE a.x = 1\n  AND z.y = 2", "line 3, column 7: unknown variable 'z'"),
        ("PATTERN SEQ(A a, B b) RETURN r(v = q.x)", "line 1, column 36: unknown variable 'q'"),
        ("PATTERN SEQ(A a, B b) WHERE strict_contiguity(a, q)", "line 1, column 50: unknown variable 'q' in strategy"),
        ("PATTERN SEQ(A a, B b) WHERE b[i].x = a.x", "line 1, column 29: b[…] indexes single-event variable 'b'"),
        ("PATTERN SEQ(A a, B b) WHERE b[1].x = a.x", "line 1, column 29: b[…] indexes single-event variable 'b'"),
        ("PATTERN SEQ(A a, B b) WHERE b.len > 1", "line 1, column 29: b.len needs a Kleene variable"),
        ("PATTERN SEQ(A a, B b) WHERE avg(b[..].x) > 1", "line 1, column 33: avg(b[..]) needs a Kleene variable"),
        ("PATTERN SEQ(A a, B+ b[]) WHERE median(b[..].x) > 1", "line 1, column 32: unknown aggregate 'median'"),
        ("PATTERN SEQ(A a, B+ b[]) WHERE b[2].x > 1", "line 1, column 34: unsupported index b[2]"),
        ("PATTERN SEQ(A a, B+ b[]) WHERE b[a.len].x > 1", "unsupported index b[a.len]"),
        ("PATTERN SEQ(A a, B+ b[]) WHERE sum(b[..i-2].x) > 1", "aggregate range b[..i-2] is not supported"),
        ("PATTERN SEQ(A a, B b) WHERE a.x = 1 OR [k]", "line 1, column 41: an equivalence test"),
        ("PATTERN SEQ(A a, B b) WHERE strict_contiguity(a) skip_till_any_match(a)", "'a' is given two strategies"),
        ("PATTERN SEQ(A a, ~B b)", "trailing negation ~b needs a window (WITHIN)"),
        ("PATTERN SEQ(~A a, B b)", "leading negation"),
        ("PATTERN SEQ(A a, B a)", "variable 'a' is declared twice"),
    ],
)
def test_pattern_errors(text: str, message: str) -> None:
    with pytest.raises(PatternError) as info:
        parse_sase(text)
    assert message in str(info.value)


def test_trailing_negation_with_window_is_fine() -> None:
    p = parse_sase("PATTERN SEQ(A a, ~B b) WITHIN 10 s")
    assert p.components[-1].kind is Kind.NEGATED and p.window == 10


# --- no eval / exec ---------------------------------------------------------------------------


def test_no_text_goes_through_eval_or_exec(monkeypatch: pytest.MonkeyPatch) -> None:
    def forbidden(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("eval/exec called")

    monkeypatch.setattr(builtins, "eval", forbidden)
    monkeypatch.setattr(builtins, "exec", forbidden)
    code = "__import__('os').system('true')"
    p = parse_sase(f'PATTERN SEQ(A a, B b) WHERE a.x = "{code}" RETURN r(v = 1 + 2)')
    assert p.where == (cmp("=", ref("a", "x"), Literal(code)),)
    assert p.emit == Emit("r", (("v", Arith("+", Literal(1), Literal(2))),))
    with pytest.raises(QuerySyntaxError):
        parse_sase(f"PATTERN SEQ(A a, B b) WHERE a.x = {code}")
    source = Path(yfpp.language.sase_parser.__file__).read_text()
    assert "eval(" not in source and "exec(" not in source
