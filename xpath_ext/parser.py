"""Extended XPath (YFilter++, SPEC §3.2) → :class:`yfpp.pattern.Pattern`.

``[tag_id]&&//shelf//!register//exit&&(12 hours)`` compiles to::

    e1 shelf · n1 ~register · e2 exit (skip_till_any), partition_by=(tag_id,), window=43200

- Positive steps bind ``e1, e2, …`` in order; negated components are named
  ``n1, n2, …`` in order.
- Every component's contiguity is its own step's axis: ``//`` →
  skip_till_any; ``/`` → partition with an equivalence list, else strict.
  The first step's axis constrains nothing (SPEC: the engine ignores the
  first component's contiguity).  A negated step's axis is irrelevant: the
  next positive step's axis joins it to the previous positive step, so a
  negation before a ``/`` step is vacuous (the two are adjacent).
- ``name+`` is Kleene, its iterations joined by the step's axis too.
- Each ``[…]`` after a step is one :class:`XPathTest` conjunct in ``where``.
- Consecutive negated steps (``//b//!c//!d//e``: no c and no d between b and
  e) merge into one negated component of any type whose ``where`` conjunct is
  the disjunction of the steps' tests, the type test written as
  ``local-name() = 'c'`` (SPEC §2 allows no two negations in a row).
- A trailing axis (``//shelf-sensor//``, the paper's Table 1 row A) adds
  nothing.
- ``//{C, P+}//B`` is an event-set pattern (docs/event_sets.md): the members
  of ``{…}`` bind ``e1, e2, …`` in the order written, then the steps after
  it; every axis of such a path must be ``//`` and negation is refused.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NoReturn

from elementpath import ElementPathError
from lark import Lark, Token, Tree
from lark.exceptions import UnexpectedCharacters, UnexpectedEOF, UnexpectedInput, UnexpectedToken

from xpath_ext.xpath_predicates import error_location, parse_expression
from yfpp.errors import QuerySyntaxError
from yfpp.pattern import And, Component, Contiguity, Expr, Kind, Or, Pattern, XPathTest
from yfpp.units import UNIT_SECONDS, window_seconds

_LARK = Lark.open("xpath_grammar.lark", rel_to=__file__, parser="lalr", maybe_placeholders=True)

_TERMINALS = {
    "SLASH": "'/'", "DSLASH": "'//'", "BANG": "'!'", "PLUS": "'+'", "STAR": "'*'",
    "NAME": "a name", "NUMBER": "a number", "PREDICATE": "'[' predicate ']'",
    "LSQB": "'['", "RSQB": "']'", "LESSTHAN": "'<'", "MORETHAN": "'>'", "COMMA": "','",
    "LPAR": "'('", "RPAR": "')'", "_SEP": "'&&'", "$END": "end of query",
}  # fmt: skip


@dataclass(frozen=True)
class _Step:
    axis: str
    negated: bool
    event_type: str | None
    kleene: bool
    predicates: tuple[str, ...]
    set_id: int | None = None


def parse_xpath(text: str) -> Pattern:
    """Parse and compile an extended-XPath query; raise QuerySyntaxError or PatternError."""
    try:
        tree = _LARK.parse(text)
    except UnexpectedInput as err:
        raise _syntax_error(err, text) from None
    partition_by: tuple[str, ...] = ()
    window: float | None = None
    steps: list[_Step] = []
    for part in tree.children:
        if part.data == "equivalence":
            partition_by = tuple(str(name) for name in part.children)
        elif part.data == "window":
            window = _window(part, text)
        else:
            steps = _steps([c for c in part.children if isinstance(c, Tree) and c.data in ("step", "set_step")], text)
    return _compile(steps, partition_by, window, text).validate()


def _window(tree: Tree, text: str) -> float:
    number, unit = tree.children
    if unit is None:
        return float(number)
    if unit.lower() not in UNIT_SECONDS:
        _fail(f"unknown time unit {str(unit)!r}", text, unit, [repr(u) for u in UNIT_SECONDS] + ["')'"])
    return window_seconds(number, unit)


def _steps(trees: list[Tree], text: str) -> list[_Step]:
    """The path's steps; the members of a set step share a set id."""
    if any(t.data == "set_step" for t in trees):
        for t in trees[1:]:
            axis = t.children[0].children[0]
            if axis == "/":
                _fail("an event-set path joins its steps with '//' (every combination): '/' has no meaning here", text, axis)
    out: list[_Step] = []
    for set_id, tree in enumerate(trees):
        if tree.data == "step":
            out.append(_step(tree, text))
            continue
        axis, *members = tree.children
        for member in members:
            bang = member.children[0]
            if bang is not None:
                _fail("a negated step cannot be inside an event set: a set's events have no order", text, bang)
            step = _step(Tree("step", [axis, *member.children]), text)
            out.append(_Step(step.axis, False, step.event_type, step.kleene, step.predicates, set_id))
    return out


def _step(tree: Tree, text: str) -> _Step:
    """One step of the parse tree, its `+` placement and predicates checked."""
    axis, bang, nodetest, *suffix = tree.children
    plus = [i for i, tok in enumerate(suffix) if tok.type == "PLUS"]
    if len(plus) > 1:
        _fail("a step takes one '+'", text, suffix[plus[1]])
    if plus and plus[0] not in (0, len(suffix) - 1):
        _fail("'+' stands right after the name or after the last predicate", text, suffix[plus[0]])
    if plus and bang is not None:
        _fail("a negated step cannot be repeated with '+'", text, suffix[plus[0]])
    predicates = tuple(_check_predicate(tok, text) for tok in suffix if tok.type == "PREDICATE")
    name = nodetest.children[0]
    return _Step(
        axis=str(axis.children[0]),
        negated=bang is not None,
        event_type=None if name.type == "STAR" else str(name),
        kleene=bool(plus),
        predicates=predicates,
    )


def _check_predicate(tok: Token, text: str) -> str:
    """The XPath text inside ``[…]``; its syntax errors are located in ``text``."""
    source = tok.value[1:-1]
    try:
        parse_expression(source)
    except ElementPathError as err:
        message, line, column = error_location(err)
        lines = source.split("\n")
        offset = tok.start_pos + 1 + sum(len(s) + 1 for s in lines[: line - 1]) + column - 1
        raise QuerySyntaxError(f"invalid XPath predicate: {message}", text, *_line_column(text, offset)) from None
    return source


def _compile(steps: list[_Step], partition_by: tuple[str, ...], window: float | None, text: str) -> Pattern:
    slash = Contiguity.PARTITION if partition_by else Contiguity.STRICT
    if any(s.set_id is not None for s in steps):
        slash = Contiguity.SKIP_TILL_ANY  # '/' was refused in _steps except before the first step
    components: list[Component] = []
    where: list[Expr] = []
    negated: list[_Step] = []

    def contiguity(step: _Step) -> Contiguity:
        return Contiguity.SKIP_TILL_ANY if step.axis == "//" else slash

    def flush_negated() -> None:
        if not negated:
            return
        var = f"n{sum(not c.positive for c in components) + 1}"
        first = negated[0]
        if len(negated) == 1:
            components.append(Component(var, first.event_type, Kind.NEGATED, contiguity(first)))
            where.extend(XPathTest(var, p) for p in first.predicates)
        else:
            components.append(Component(var, None, Kind.NEGATED, contiguity(first)))
            alternatives = [_alternative(var, step) for step in negated]
            if all(alternatives):
                where.append(Or(tuple(_conjunction(a) for a in alternatives)))
        negated.clear()

    for step in steps:
        if step.negated:
            negated.append(step)
            continue
        flush_negated()
        var = f"e{sum(c.positive for c in components) + 1}"
        c = contiguity(step)
        kind = Kind.KLEENE if step.kleene else Kind.SINGLE
        components.append(Component(var, step.event_type, kind, c, c if step.kleene else None, step.set_id))
        where.extend(XPathTest(var, p) for p in step.predicates)
    flush_negated()
    return Pattern(tuple(components), tuple(where), partition_by, window, "all", source=text)


def _alternative(var: str, step: _Step) -> list[Expr]:
    """The tests one merged negated step puts on the event (empty: any event)."""
    tests: list[Expr] = [XPathTest(var, p) for p in step.predicates]
    if step.event_type is not None:
        tests.insert(0, XPathTest(var, f"local-name() = '{step.event_type}'"))
    return tests


def _conjunction(tests: list[Expr]) -> Expr:
    return tests[0] if len(tests) == 1 else And(tuple(tests))


def _line_column(text: str, offset: int) -> tuple[int, int]:
    line = text.count("\n", 0, offset) + 1
    return line, offset - (text.rfind("\n", 0, offset) + 1) + 1


def _fail(message: str, text: str, tok: Token, expected: list[str] | None = None) -> NoReturn:
    raise QuerySyntaxError(message, text, tok.line, tok.column, expected)


def _syntax_error(err: UnexpectedInput, text: str) -> QuerySyntaxError:
    """A lark error as QuerySyntaxError, the expected terminals spelt out."""
    if isinstance(err, UnexpectedCharacters):
        found = repr(text[err.pos_in_stream])
        expected = set(err.allowed)
    elif isinstance(err, UnexpectedToken):
        expected = set(err.accepts or err.expected)
        found = "end of query" if err.token.type == "$END" else repr(str(err.token))
    else:
        assert isinstance(err, UnexpectedEOF)
        expected, found = set(err.expected), "end of query"
    if found == "'['" and "PREDICATE" in expected:
        found += " (an unbalanced '[' or an unclosed quote in a predicate?)"
    if found == "end of query" or err.line is None or err.line < 1:
        line, column = _line_column(text, len(text))
    else:
        line, column = err.line, err.column
    return QuerySyntaxError(f"unexpected {found}", text, line, column, [_TERMINALS.get(t, t) for t in expected])
