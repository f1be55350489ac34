"""SASE+ front end (docs/semantics.md §8): query text → :class:`yfpp.language.pattern.Pattern`.

The grammar (``sase_grammar.lark``) is parsed with lark's LALR parser and the
tree is turned into the IR by a :class:`lark.Transformer`; no text is ever
evaluated.  Documented extensions beyond the SIGMOD 2008 syntax:

* ``OUTPUT all | non_overlapping`` after ``WITHIN`` sets the output policy;
* ``RETURN name`` without parentheses emits an event with no attributes;
* ``RETURN name(…) FEEDBACK`` routes the result event back into the stream
  (``yfpp.runtime.feedback``);
* ``{A a, B+ b[]}`` is an event set (docs/event_sets.md) and
  ``prev(b.x)`` means ``b[i-1].x``; ``OUTPUT earliest_maximal`` keeps the
  match-windows paper's earliest and maximal matches of a set pattern;
* several strategy calls mix strategies, e.g.
  ``WHERE strict_contiguity(a, b) skip_till_any_match(c) {…}``: each call sets
  the contiguity of the components it lists (a listed Kleene variable also
  gets it as inner contiguity); unlisted ones keep skip_till_next_match.
  With a single call its argument list is only checked, and the strategy
  applies to every positive component.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, replace
from decimal import Decimal
from importlib import resources
from typing import Any, NamedTuple

from lark import Token, Transformer, Tree, v_args
from lark.exceptions import UnexpectedCharacters, UnexpectedInput, UnexpectedToken, VisitError
from lark.lexer import PatternStr

from yfpp.errors import PatternError, QuerySyntaxError
from yfpp.language.lark_tables import lalr_parser
from yfpp.language.pattern import (
    AGGREGATE_FUNCS,
    Aggregate,
    And,
    Arith,
    Component,
    Compare,
    Contiguity,
    Emit,
    Expr,
    Index,
    Kind,
    Length,
    Literal,
    Neg,
    Not,
    Or,
    Pattern,
    Ref,
    conjuncts,
    walk,
)
from yfpp.input.events import PSEUDO_ATTRS
from yfpp.language.query_limits import check_text, deepest, finite_number, finite_window, too_deep
from yfpp.language.units import bare_window, window_seconds

GRAMMAR = resources.files("yfpp.language") / "sase_grammar.lark"  # (a path, or a zip member on a Spark executor)
LARK_OPTIONS = {"start": ["start", "result"], "propagate_positions": True}  # tree positions for PatternError messages
_PARSER = lalr_parser(GRAMMAR, **LARK_OPTIONS)

_STRATEGIES = {
    "strict_contiguity": Contiguity.STRICT,
    "partition_contiguity": Contiguity.PARTITION,
    "skip_till_next_match": Contiguity.SKIP_TILL_NEXT,
    "skip_till_any_match": Contiguity.SKIP_TILL_ANY,
}
_TERMINAL_TEXT = {
    "NAME": "a name",
    "NUMBER": "a number",
    "PERCENT": "a percentage",
    "STRING": "a string",
    "UNIT": "a time unit (ms, s, min, h, d)",
    "$END": "end of query",
}


def parse_sase(text: str, ts_unit: str = "s") -> Pattern:
    """Parse a SASE+ query into a validated :class:`Pattern`; a window without a unit is in ``ts_unit``.

    Raises :class:`QuerySyntaxError` for text that does not parse and
    :class:`PatternError` for a well-formed but invalid pattern.
    """
    check_text(text)
    try:
        tree = _PARSER.parse(text, start="start")
    except UnexpectedInput as e:
        raise _syntax_error(e, text) from None
    _check_depth(tree, text)
    _check_conditions(tree, text)
    builder = _Builder(text, ts_unit)
    try:
        pattern: Pattern = builder.transform(tree)
    except VisitError as e:
        raise e.orig_exc from None
    _check_uses(pattern, builder.uses, text)
    return replace(pattern, source=text, positions=tuple(builder.positions)).validate()


def parse_result(text: str, offset: int = 0) -> tuple[Emit, bool]:
    """A result-event clause ``type(name = expr, …) [FEEDBACK]`` written at ``offset`` of query ``text``.

    Extended XPath's ``=> …`` clause: the same rule as SASE+ ``RETURN``, so
    both languages share one expression syntax. Variables are checked by
    :meth:`Pattern.validate`; errors are located in the whole ``text``.
    """
    padded = "".join(c if c == "\n" else " " for c in text[:offset]) + text[offset:]
    try:
        tree = _PARSER.parse(padded, start="result")
    except UnexpectedInput as e:
        raise _syntax_error(e, text) from None
    _check_depth(tree, text)
    try:
        return _Builder(text).transform(tree)
    except VisitError as e:
        raise e.orig_exc from None


def _check_depth(tree: Tree, text: str) -> None:
    """A parse tree nested over the cap is a positioned syntax error (not a RecursionError later)."""
    deep = deepest(tree, lambda t: [c for c in t.children if isinstance(c, Tree)])
    if deep is not None:
        raise too_deep(text, *((1, 1) if deep.meta.empty else (deep.meta.line, deep.meta.column)))


_CONDITION_PLACES = {"where", "and_expr", "or_expr", "not_"}  # rules whose operands are conditions
_VALUE_KINDS = {"number": "a number", "percent": "a number", "string": "a string", "arith": "arithmetic",
                "neg": "a negative value", "aggregate": "an aggregate"}


def _check_conditions(tree: Tree, text: str) -> None:
    """A condition that can never be true (``WHERE 1``, ``NOT x.v + 1``, ``b.len``) is refused with its
    position: only a comparison, ``true``/``false``, an attribute holding a boolean and their
    ``AND``/``OR``/``NOT`` are conditions (Esper and FlinkCEP refuse the rest too)."""
    for node in tree.iter_subtrees():
        if node.data not in _CONDITION_PLACES:
            continue
        for child in node.children:
            if not isinstance(child, Tree):
                continue
            kind = _VALUE_KINDS.get(child.data)
            if kind is None and child.data == "attr_ref" and [str(n).lower() for n in child.children[1].children] == ["len"]:
                kind = "a length"
            if kind is not None:
                raise _error(text, child, f"this is {kind}, not a condition: compare it, e.g. `… > 0`")


# --- errors ----------------------------------------------------------------


def _describe(name: str) -> str:
    """A readable form of a lark terminal name: ``RPAR`` → ``')'``."""
    if name in _TERMINAL_TEXT:
        return _TERMINAL_TEXT[name]
    pattern = _PARSER.get_terminal(name).pattern
    return f"'{pattern.value}'" if isinstance(pattern, PatternStr) else name


def _syntax_error(e: UnexpectedInput, text: str) -> QuerySyntaxError:
    """Turn a lark error into a :class:`QuerySyntaxError` with position and expectations."""
    if isinstance(e, UnexpectedCharacters):
        return QuerySyntaxError(
            f"unexpected character {text[e.pos_in_stream]!r}",
            text, e.line, e.column, [_describe(t) for t in e.allowed or ()],
        )
    assert isinstance(e, UnexpectedToken)
    expected = [_describe(t) for t in e.accepts or e.expected]
    token = e.token
    if token.type == "$END":
        body = text.rstrip()
        line, column = body.count("\n") + 1, len(body) - body.rfind("\n")
        return QuerySyntaxError("unexpected end of query", text, line, column, expected)
    message = f"unexpected {token.value!r}"
    keywords = [x.strip("'") for x in expected if x.startswith("'") and x[1:2].isalpha()]
    guess = difflib.get_close_matches(token.value.upper(), [k.upper() for k in keywords], n=1)
    if token.type == "NAME" and guess:
        message += f" (did you mean {guess[0]}?)"
    else:
        message += _call_hint(text[: token.end_pos or len(text)])
    return QuerySyntaxError(message, text, token.line, token.column, expected)


_CALLS = {c.lower(): c for c in ["SEQ", *_STRATEGIES, *sorted(AGGREGATE_FUNCS)]}
_CALL = re.compile(r"([A-Za-z_]\w*)\s*\(")


def _call_hint(before: str) -> str:
    """`` (did you mean skip_till_next_match?)`` when the last ``name(`` before an error misspells SEQ, a strategy or an aggregate."""
    names = _CALL.findall(before)
    if not names or names[-1].lower() in _CALLS:
        return ""
    guess = difflib.get_close_matches(names[-1].lower(), list(_CALLS), n=1, cutoff=0.75)
    return f" (did you mean {_CALLS[guess[0]]}?)" if guess else ""


def _error(text: str, token: Token | Tree, message: str) -> PatternError:
    """A :class:`PatternError` placed at ``token`` (or a tree with positions) in ``text``."""
    where = token if isinstance(token, Token) else token.meta
    return PatternError(message, text, where.line, where.column)


# --- tree → IR -------------------------------------------------------------


class _Strategy(NamedTuple):
    contiguity: Contiguity
    args: list[Token]
    token: Token | None = None


@dataclass(frozen=True)
class _EventSet:
    """``{c1, c2, …}`` in SEQ: flattened by ``pattern`` into components sharing a set id."""

    members: tuple[Component, ...]


@dataclass(frozen=True)
class _Equiv:
    """An equivalence test ``[a1, …]``: only valid as a conjunct of WHERE."""

    attrs: tuple[str, ...]
    token: Token


@v_args(inline=True)
class _Builder(Transformer[Token, Pattern]):
    """Builds the IR; ``uses`` records where each variable reference was written."""

    def __init__(self, text: str, ts_unit: str = "s") -> None:
        super().__init__()
        self.text = text
        self.ts_unit = ts_unit  # of a window written without a unit
        self.uses: list[tuple[Ref | Length | Aggregate, Token, bool]] = []
        self.positions: list[tuple[str, int, int]] = []  # where each component's variable is written

    def _use(self, node: Any, var: Token, indexed: bool = False) -> Any:
        self.uses.append((node, var, indexed))
        return node

    # query structure
    def start(
        self,
        components: list[Component],
        where: tuple[list[_Strategy], Expr | None] | None,
        window: float | None,
        policy: str | None,
        emit: tuple[Emit, bool] | None,
    ) -> Pattern:
        emit, feedback = emit or (None, False)
        strategies, body = where or ([], None)
        if any(c.set_id is not None for c in components):
            components = _set_strategies(components, strategies, self.text)
        else:
            components = _apply_strategies(components, strategies, self.text)
        partition_by: list[str] = []
        preds: list[Expr] = []
        for conjunct in conjuncts(body) if body is not None else []:
            if isinstance(conjunct, _Equiv):
                partition_by += [a for a in conjunct.attrs if a not in partition_by]
            else:
                preds.append(conjunct)
        _no_equivalence(self.text, preds)
        return Pattern(
            components=tuple(components),
            where=tuple(preds),
            partition_by=tuple(partition_by),
            window=window,
            policy=policy or "all",
            emit=emit,
            feedback=feedback,
        )

    def pattern(self, *items: Component | _EventSet) -> list[Component]:
        out: list[Component] = []
        for set_id, item in enumerate(items):
            if isinstance(item, _EventSet):
                out += [replace(c, set_id=set_id) for c in item.members]
            else:
                out.append(item)
        return out

    @v_args(inline=False)
    def event_set(self, members: list[Component | _EventSet]) -> _EventSet:
        for c in members:
            if isinstance(c, _EventSet):
                raise self._error_at(c.members[0].var, "event sets do not nest")
            if not c.positive:
                raise self._error_at(c.var, f"negation ~{c.var} cannot be inside an event set: "
                                            "a set's events have no order, so there is no 'between'")
        return _EventSet(tuple(members))

    def _error_at(self, var: str, message: str) -> PatternError:
        """A :class:`PatternError` placed at the (last) declaration of ``var``."""
        line, column = next((ln, col) for v, ln, col in reversed(self.positions) if v == var)
        return PatternError(message, self.text, line, column)

    def single(self, event_type: str | None, var: Token) -> Component:
        self.positions.append((str(var), var.line, var.column))
        return Component(str(var), event_type and str(event_type))

    def kleene(self, event_type: str | None, var: Token) -> Component:
        self.positions.append((str(var), var.line, var.column))
        return Component(str(var), event_type and str(event_type), Kind.KLEENE)

    def negated(self, component: Component) -> Component:
        return replace(component, kind=Kind.NEGATED)

    def any_type(self) -> None:
        return None

    def where(self, *items: _Strategy | Expr | None) -> tuple[list[_Strategy], Expr | None]:
        strategies = [i for i in items if isinstance(i, _Strategy)]
        bodies = [i for i in items if not isinstance(i, _Strategy)]
        return strategies, bodies[0] if bodies else None

    def strategy(self, name: Token, *args: Token) -> _Strategy:
        return _Strategy(_STRATEGIES[name.lower()], list(args), name)

    def strategy_name(self, token: Token) -> Token:
        return token

    def within(self, number: Token, unit: Token | None) -> float:
        value = finite_number(number, self.text, number.line, number.column)
        if unit is None and self.ts_unit == "s":
            return value
        seconds = window_seconds(number, unit) if unit is not None else bare_window(number, self.ts_unit)
        return finite_window(seconds, self.text, number.line, number.column)

    def policy(self, token: Token) -> str:
        return token.lower()

    def emit(self, result: tuple[Emit, bool]) -> tuple[Emit, bool]:
        return result

    def result(self, name: Token, *rest: Any) -> tuple[Emit, bool]:
        *attrs, feedback = rest
        _no_equivalence(self.text, [e for _, e in attrs])
        if feedback is not None:
            for attr, _ in attrs:
                if attr in PSEUDO_ATTRS:  # (Pattern.validate says it too, unplaced, for a Pattern built in Python)
                    raise _error(self.text, attr, f"RETURN attribute {str(attr)!r} would hide the fed-back event's own "
                                                  f"{attr} (x.{attr} reads an attribute before the field): give it another name")
        return Emit(str(name), tuple((str(attr), e) for attr, e in attrs)), feedback is not None

    def feedback(self, token: Token) -> Token:
        return token

    def emit_attr(self, name: Token, expr: Expr) -> tuple[Token, Expr]:
        return name, expr

    # expressions
    def or_expr(self, *operands: Expr) -> Or:
        return Or(operands)

    def and_expr(self, *operands: Expr) -> And:
        return And(operands)

    def not_(self, operand: Expr) -> Not:
        return Not(operand)

    def equiv(self, *attrs: Token) -> _Equiv:
        return _Equiv(tuple(dict.fromkeys(map(str, attrs))), attrs[0])

    def compare(self, left: Expr, op: str, right: Expr) -> Compare:
        return Compare("!=" if op == "<>" else op, left, right)

    def arith(self, left: Expr, op: str, right: Expr) -> Arith:
        return Arith(op, left, right)

    def comp_op(self, token: Token) -> str:
        return str(token)

    add_op = mul_op = comp_op

    def neg(self, operand: Expr) -> Expr:
        if isinstance(operand, Literal) and isinstance(operand.value, (int, float)):
            return Literal(-operand.value)
        return Neg(operand)

    def number(self, token: Token) -> Literal:
        return Literal(finite_number(token, self.text, token.line, token.column))

    def percent(self, token: Token) -> Literal:
        finite_number(token[:-1], self.text, token.line, token.column)
        return Literal(float(Decimal(token[:-1]) / 100))

    def string(self, token: Token) -> Literal:
        return Literal(re.sub(r"\\(.)", r"\1", token[1:-1], flags=re.S))

    def true(self) -> Literal:
        return Literal(True)

    def false(self) -> Literal:
        return Literal(False)

    def attr(self, *names: Token) -> Token:
        """A dotted attribute name as one token, placed at its first part."""
        return names[0] if len(names) == 1 else Token.new_borrow_pos("NAME", ".".join(names), names[0])

    def attr_ref(self, var: Token, attr: Token) -> Ref | Length:
        node = Length(str(var)) if attr.lower() == "len" else Ref(str(var), str(attr))
        return self._use(node, var)

    def prev_ref(self, func: Token, var: Token, attr: Token) -> Ref:
        if func.lower() != "prev":
            raise _error(self.text, func, f"unknown function {str(func)!r}: prev(v.attr) is the previous event of Kleene v")
        return self._use(Ref(str(var), str(attr), Index.PREV), var, indexed=True)

    def indexed_ref(self, var: Token, index: Tree, attr: Token) -> Ref:
        return self._use(Ref(str(var), str(attr), _index(var, index, self.text)), var, indexed=True)

    def aggregate(self, func: Token, var: Token, upto: Tree | None, attr: Token) -> Aggregate:
        if func.lower() not in AGGREGATE_FUNCS:
            known = ", ".join(sorted(AGGREGATE_FUNCS))
            raise _error(self.text, func, f"unknown aggregate {str(func)!r}: use one of {known}")
        if upto is not None:
            i, one = upto.children
            if i.lower() != "i" or one != "1":
                raise _error(self.text, i, f"aggregate range {var}[..{i}-{one}] is not supported: use {var}[..i-1] or {var}[..]")
        return self._use(Aggregate(func.lower(), str(var), str(attr), upto is not None), var)


def _index(var: Token, index: Tree, text: str) -> Index:
    """The :class:`Index` of ``var[index]``: 1, i, i-1 or var.len."""
    parts = [str(t) for t in index.children]
    if index.data == "index_number" and parts == ["1"]:
        return Index.FIRST
    if index.data == "index_name" and parts[0].lower() == "i":
        return Index.EACH
    if index.data == "index_prev" and parts[0].lower() == "i" and parts[1] == "1":
        return Index.PREV
    if index.data == "index_last" and parts[0] == var and parts[1].lower() == "len":
        return Index.LAST
    written = {"index_prev": "-", "index_last": "."}.get(index.data, "").join(parts)
    raise _error(text, index, f"unsupported index {var}[{written}]: use {var}[1], {var}[i], {var}[i-1] or {var}[{var}.len]")


def _no_equivalence(text: str, exprs: list[Expr]) -> None:
    for expr in exprs:
        for node in walk(expr):
            if isinstance(node, _Equiv):
                raise _error(text, node.token, "an equivalence test [...] must be a conjunct of WHERE (joined with AND)")


def _apply_strategies(components: list[Component], strategies: list[_Strategy], text: str) -> list[Component]:
    """Set each positive component's contiguity from the WHERE strategy call(s)."""
    declared = [c.var for c in components]
    for strategy in strategies:
        for arg in strategy.args:
            if arg not in declared:
                names = ", ".join(declared)
                raise _error(text, arg, f"unknown variable {str(arg)!r} in strategy arguments (declared: {names})")
    if len(strategies) <= 1:
        chosen = strategies[0].contiguity if strategies else Contiguity.SKIP_TILL_NEXT
        by_var = dict.fromkeys(declared, chosen)
    else:
        by_var = {}
        for strategy in strategies:
            for arg in strategy.args:
                if arg in by_var:
                    raise _error(text, arg, f"variable {str(arg)!r} is given two strategies")
                by_var[str(arg)] = strategy.contiguity
    return [
        replace(c, contiguity=by_var.get(c.var, Contiguity.SKIP_TILL_NEXT)) if c.positive else c
        for c in components
    ]


def _set_strategies(components: list[Component], strategies: list[_Strategy], text: str) -> list[Component]:
    """Event-set patterns match every combination (Definition 2): only skip_till_any_match says that."""
    for strategy in strategies:
        if strategy.contiguity is not Contiguity.SKIP_TILL_ANY:
            raise _error(
                text,
                strategy.token,
                f"{str(strategy.token).lower()} has no meaning in an event-set pattern: its matches are every "
                "combination (Definition 2), i.e. skip_till_any_match; OUTPUT earliest_maximal keeps the paper's subset",
            )
    stam = Contiguity.SKIP_TILL_ANY
    return [
        replace(c, contiguity=stam, inner_contiguity=stam if c.kind is Kind.KLEENE else None) if c.positive else c
        for c in components
    ]


def _check_uses(pattern: Pattern, uses: list[tuple[Any, Token, bool]], text: str) -> None:
    """Reject references to undeclared variables and iteration syntax on single variables, with positions."""
    kinds = {c.var: c.kind for c in pattern.components}
    for node, var, indexed in uses:
        if var not in kinds:
            raise _error(text, var, f"unknown variable {str(var)!r} (declared: {', '.join(kinds)})")
        if kinds[var] is Kind.KLEENE:
            continue
        if indexed:
            raise _error(
                text,
                var,
                f"{var}[…] indexes single-event variable {str(var)!r}: "
                f"only Kleene variables (TYPE+ {var}[]) have iterations",
            )
        if isinstance(node, Length):
            raise _error(text, var, f"{var}.len needs a Kleene variable; {str(var)!r} binds a single event")
        if isinstance(node, Aggregate):
            raise _error(text, var, f"{node.func}({var}[..]) needs a Kleene variable; {str(var)!r} binds a single event")
