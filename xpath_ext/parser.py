"""Extended XPath (YFilter++, docs/semantics.md §9) → :class:`yfpp.language.pattern.Pattern`.

``[tag_id]&&//shelf//!register//exit&&(12 hours)`` compiles to::

    e1 shelf · n1 ~register · e2 exit (skip_till_any), partition_by=(tag_id,), window=43200

- Positive steps bind ``e1, e2, …`` in order; negated components are named
  ``n1, n2, …`` in order.
- Every component's contiguity is its own step's axis: ``//`` →
  skip_till_any; ``/`` → partition with an equivalence list, else strict.
  The first step's axis constrains nothing (docs/semantics.md §9: the engine ignores the
  first component's contiguity).  A negated step's axis is irrelevant: the
  next positive step's axis joins it to the previous positive step, so a
  negation before a ``/`` step is vacuous (the two are adjacent).
- ``name+`` is Kleene, its iterations joined by the step's axis too.
- Each ``[…]`` after a step is one :class:`XPathTest` conjunct in ``where``.
- Consecutive negated steps (``//b//!c//!d//e``: no c and no d between b and
  e) are consecutive negated components, as in SASE+.
- A trailing axis (``//shelf-sensor//``, the paper's Table 1 row A) adds
  nothing.
- ``=> type(name = expr, …) [feedback]`` last: the result event, the SASE+
  ``RETURN`` clause with the steps' variables (``e1.total + 1``); parsed by
  :func:`yfpp.language.sase_parser.parse_result`.
- ``//{C, P+}//B`` is an event-set pattern (docs/event_sets.md): the members
  of ``{…}`` bind ``e1, e2, …`` in the order written, then the steps after
  it; every axis of such a path must be ``//`` and negation is refused.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from importlib import resources
from typing import NoReturn

from elementpath import ElementPathError
from lark import Token, Tree
from lark.exceptions import UnexpectedCharacters, UnexpectedEOF, UnexpectedInput, UnexpectedToken

from xpath_ext.xpath_predicates import error_location, parse_expression
from yfpp.errors import QuerySyntaxError
from yfpp.language.lark_tables import lalr_parser
from yfpp.language.pattern import Component, Contiguity, Emit, Expr, Kind, Pattern, XPathTest
from yfpp.language.query_limits import check_text, deepest, finite_number, finite_window, line_column, too_deep
from yfpp.language.sase_parser import parse_result
from yfpp.language.units import UNIT_SECONDS, bare_window, window_seconds

GRAMMAR = resources.files("xpath_ext") / "xpath_grammar.lark"  # (a path, or a zip member on a Spark executor)
LARK_OPTIONS = {"maybe_placeholders": True}
_LARK = lalr_parser(GRAMMAR, **LARK_OPTIONS)

_TERMINALS = {
    "SLASH": "'/'", "DSLASH": "'//'", "BANG": "'!'", "PLUS": "'+'", "STAR": "'*'",
    "NAME": "a name", "NUMBER": "a number", "PREDICATE": "'[' predicate ']'",
    "LSQB": "'['", "RSQB": "']'", "LESSTHAN": "'<'", "MORETHAN": "'>'", "COMMA": "','",
    "LPAR": "'('", "RPAR": "')'", "_SEP": "'&&'", "RESULT": "'=>' result event", "$END": "end of query",
}  # fmt: skip


@dataclass(frozen=True)
class _Step:
    axis: str
    negated: bool
    event_type: str | None
    kleene: bool
    predicates: tuple[str, ...]
    line: int
    column: int
    set_id: int | None = None


def parse_xpath(text: str, ts_unit: str = "s") -> Pattern:
    """Parse and compile an extended-XPath query (a window without a unit is in ``ts_unit``); raise
    QuerySyntaxError or PatternError."""
    check_text(text)
    try:
        tree = _LARK.parse(text)
    except UnexpectedInput as err:
        raise _syntax_error(err, text) from None
    partition_by: tuple[str, ...] = ()
    window: float | None = None
    steps: list[_Step] = []
    result: tuple[Emit, bool] = (None, False)  # type: ignore[assignment]
    for part in tree.children:
        if part.data == "equivalence":
            partition_by = tuple(str(name) for name in part.children)
        elif part.data == "window":
            window = _window(part, text, ts_unit)
        elif part.data == "result":
            result = parse_result(text, part.children[0].start_pos + 2)
        else:
            steps = _steps([c for c in part.children if isinstance(c, Tree) and c.data in ("step", "set_step")], text)
    pattern = _compile(steps, partition_by, window, text)
    return replace(pattern, emit=result[0], feedback=result[1]).validate()


def _window(tree: Tree, text: str, ts_unit: str) -> float:
    number, unit = tree.children
    value = finite_number(number, text, number.line, number.column)
    if unit is None:
        return float(value) if ts_unit == "s" else finite_window(bare_window(number, ts_unit), text, number.line, number.column)
    if unit.lower() not in UNIT_SECONDS:
        _fail(f"unknown time unit {str(unit)!r}", text, unit, [repr(u) for u in UNIT_SECONDS] + ["')'"])
    return finite_window(window_seconds(number, unit), text, number.line, number.column)


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
            out.append(replace(step, negated=False, set_id=set_id))
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
        line=axis.children[0].line,
        column=axis.children[0].column,
    )


def _check_predicate(tok: Token, text: str) -> str:
    """The XPath text inside ``[…]``; its syntax errors are located in ``text``."""
    source = tok.value[1:-1]

    def position(line: int, column: int) -> tuple[int, int]:
        lines = source.split("\n")
        return line_column(text, tok.start_pos + 1 + sum(len(s) + 1 for s in lines[: line - 1]) + column - 1)

    try:
        token = parse_expression(source)
    except ElementPathError as err:
        message, line, column = error_location(err)
        raise QuerySyntaxError(f"invalid XPath predicate: {message}", text, *position(line, column)) from None
    except RecursionError:
        raise too_deep(text, tok.line, tok.column) from None
    deep = deepest(token, list)
    if deep is not None:
        raise too_deep(text, *position(*deep.position))
    return source


def _compile(steps: list[_Step], partition_by: tuple[str, ...], window: float | None, text: str) -> Pattern:
    slash = Contiguity.PARTITION if partition_by else Contiguity.STRICT
    if any(s.set_id is not None for s in steps):
        slash = Contiguity.SKIP_TILL_ANY  # '/' was refused in _steps except before the first step
    components: list[Component] = []
    where: list[Expr] = []
    positions: list[tuple[str, int, int]] = []
    counts = {True: 0, False: 0}  # positive / negated components so far
    for step in steps:
        c = Contiguity.SKIP_TILL_ANY if step.axis == "//" else slash
        counts[not step.negated] += 1
        var = f"n{counts[False]}" if step.negated else f"e{counts[True]}"
        if step.negated:
            components.append(Component(var, step.event_type, Kind.NEGATED, c))
        else:
            kind = Kind.KLEENE if step.kleene else Kind.SINGLE
            components.append(Component(var, step.event_type, kind, c, c if step.kleene else None, step.set_id))
        where.extend(XPathTest(var, p) for p in step.predicates)
        positions.append((var, step.line, step.column))
    return Pattern(tuple(components), tuple(where), partition_by, window, "all", source=text, positions=tuple(positions))


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
        line, column = line_column(text, len(text))
    else:
        line, column = err.line, err.column
    return QuerySyntaxError(f"unexpected {found}", text, line, column, [_TERMINALS.get(t, t) for t in expected])
