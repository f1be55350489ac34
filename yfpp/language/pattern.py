"""Pattern IR (docs/semantics.md §2–5): the plain data both query languages compile to.

A :class:`Pattern` is a sequence of :class:`Component` s plus global WHERE
conjuncts, an equivalence list, a window and an output policy.  Predicates
are expression trees (:data:`Expr`); they are compiled to callables by
``yfpp.nfa.predicates`` and never evaluated from text.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Union

from yfpp.errors import PatternError
from yfpp.input.events import PSEUDO_ATTRS
from yfpp.language.query_limits import MAX_COMPONENTS, line_column


class Contiguity(str, Enum):
    """Event selection strategy between two positive components (docs/semantics.md §2–5)."""

    STRICT = "strict"
    PARTITION = "partition"
    SKIP_TILL_NEXT = "skip_till_next"
    SKIP_TILL_ANY = "skip_till_any"


class Kind(str, Enum):
    SINGLE = "single"
    KLEENE = "kleene"
    NEGATED = "negated"


class Index(str, Enum):
    """Which bound event(s) of a variable a reference reads.

    ``EACH`` is ``v.attr`` / ``v[i].attr``: the current iteration inside the
    variable's own Kleene component, every bound event outside it.
    """

    EACH = "each"
    FIRST = "first"  # v[1]
    PREV = "prev"  # v[i-1]
    LAST = "last"  # v[v.len]


# --- expressions -----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Literal:
    value: Any


@dataclass(frozen=True, slots=True)
class Ref:
    """``var[index].attr``; ``attr`` may be an attribute or ``ts``/``type``/``seq``."""

    var: str
    attr: str
    index: Index = Index.EACH


@dataclass(frozen=True, slots=True)
class Length:
    """``v.len``: number of events bound to a Kleene variable."""

    var: str


@dataclass(frozen=True, slots=True)
class Aggregate:
    """``func(v[..i-1].attr)`` (``upto_prev``) or ``func(v[..].attr)``."""

    func: str  # avg min max sum count
    var: str
    attr: str
    upto_prev: bool = True


@dataclass(frozen=True, slots=True)
class Arith:
    op: str  # + - * / %
    left: Expr
    right: Expr


@dataclass(frozen=True, slots=True)
class Neg:
    operand: Expr


@dataclass(frozen=True, slots=True)
class Compare:
    op: str  # = != < <= > >=
    left: Expr
    right: Expr


@dataclass(frozen=True, slots=True)
class And:
    operands: tuple[Expr, ...]


@dataclass(frozen=True, slots=True)
class Or:
    operands: tuple[Expr, ...]


@dataclass(frozen=True, slots=True)
class Not:
    operand: Expr


@dataclass(frozen=True, slots=True)
class XPathTest:
    """An XPath 2.0 predicate evaluated on the element of ``var``'s event.

    ``source`` is the XPath text (the bracket content), compiled once by
    ``xpath_ext`` through elementpath or its fast path.
    """

    var: str
    source: str
    namespaces: tuple[tuple[str, str], ...] = ()


Expr = Union[Literal, Ref, Length, Aggregate, Arith, Neg, Compare, And, Or, Not, XPathTest]

AGGREGATE_FUNCS = frozenset({"avg", "min", "max", "sum", "count"})
COMPARE_OPS = frozenset({"=", "!=", "<", "<=", ">", ">="})
ARITH_OPS = frozenset({"+", "-", "*", "/", "%"})


def children(expr: Expr) -> tuple[Expr, ...]:
    """The direct sub-expressions of ``expr``."""
    if isinstance(expr, (Arith, Compare)):
        return (expr.left, expr.right)
    if isinstance(expr, (And, Or)):
        return expr.operands
    if isinstance(expr, (Not, Neg)):
        return (expr.operand,)
    return ()


def rebuilt(obj: Any, **changes: Any) -> Any:
    """``dataclasses.replace`` for the pattern's frozen dataclasses, without running ``__init__`` again (they
    check nothing there): a copy with ``changes``."""
    new = object.__new__(type(obj))
    for name in type(obj).__slots__:
        object.__setattr__(new, name, changes[name] if name in changes else getattr(obj, name))
    return new


def walk(expr: Expr):
    """Pre-order iteration over every node of ``expr``."""
    stack = [expr]
    while stack:
        node = stack.pop()
        yield node
        stack.extend(reversed(children(node)))


def variables(expr: Expr) -> set[str]:
    """The variables an expression mentions."""
    return {n.var for n in walk(expr) if isinstance(n, (Ref, Length, Aggregate, XPathTest))}


def conjuncts(expr: Expr) -> list[Expr]:
    """Split a top-level conjunction into its conjuncts."""
    if isinstance(expr, And):
        out: list[Expr] = []
        for op in expr.operands:
            out.extend(conjuncts(op))
        return out
    return [expr]


# --- pattern ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Component:
    """One pattern component.  ``event_type`` ``None`` is the any-type."""

    var: str
    event_type: str | None
    kind: Kind = Kind.SINGLE
    contiguity: Contiguity = Contiguity.SKIP_TILL_NEXT
    inner_contiguity: Contiguity | None = None
    #: Event sets (docs/event_sets.md): consecutive components with the same ``set_id``
    #: form one set; a pattern with any ``set_id`` is an event-set pattern.
    set_id: int | None = None

    @property
    def inner(self) -> Contiguity:
        return self.inner_contiguity or self.contiguity

    @property
    def positive(self) -> bool:
        return self.kind is not Kind.NEGATED


@dataclass(frozen=True, slots=True)
class Emit:
    """``RETURN type(name = expr, …)``: the event a match builds."""

    event_type: str
    attrs: tuple[tuple[str, Expr], ...]


@dataclass(frozen=True, slots=True)
class Pattern:
    components: tuple[Component, ...]
    where: tuple[Expr, ...] = ()
    partition_by: tuple[str, ...] = ()
    window: float | None = None
    policy: str = "all"
    emit: Emit | None = None
    feedback: bool = False  # the RETURN event is fed back into the engine's stream (yfpp.runtime.feedback)
    source: str = field(default="", compare=False)
    #: ``(var, line, column)``: where each component is written in ``source``
    positions: tuple[tuple[str, int, int], ...] = field(default=(), compare=False)

    @property
    def positives(self) -> tuple[Component, ...]:
        return tuple(c for c in self.components if c.positive)

    @property
    def has_sets(self) -> bool:
        """An event-set pattern (docs/event_sets.md), matched by Definition 2 of the match-windows paper."""
        return any(c.set_id is not None for c in self.components)

    @property
    def blocks(self) -> tuple[tuple[Component, ...], ...]:
        """The sets B1, …, Bk in order; a component outside braces is a set of its own."""
        out: list[list[Component]] = []
        last: object = object()
        for c in self.positives:
            if c.set_id is None or c.set_id != last:
                out.append([])
            out[-1].append(c)
            last = c.set_id
        return tuple(tuple(b) for b in out)

    def component(self, var: str) -> Component:
        for c in self.components:
            if c.var == var:
                return c
        raise PatternError(f"unknown variable {var!r}")

    def validate(self) -> "Pattern":
        """Check the structural rules of docs/semantics.md §2–5; raise :class:`PatternError` (placed in ``source``)."""
        try:
            validate(self)
        except PatternError as err:
            raise self.locate(err) from None
        return self

    def locate(self, err: PatternError) -> PatternError:
        """``err`` placed in ``source``: at the component it is about, else where the query starts."""
        if err.line is not None or not self.source.strip():
            return err
        where = {var: (line, column) for var, line, column in self.positions}
        if err.var in where:
            return err.at(self.source, *where[err.var])
        return err.at(self.source, *line_column(self.source, len(self.source) - len(self.source.lstrip())))


POLICIES = ("all", "non_overlapping")
SET_POLICIES = ("all", "non_overlapping", "earliest_maximal")
#: Evaluation strategies of event-set queries (docs/event_sets.md).
STRATEGIES = ("direct", "match-window")


def validate(p: Pattern) -> None:
    if not p.components:
        raise PatternError("a pattern needs at least one component")
    if len(p.components) > MAX_COMPONENTS:
        raise PatternError(
            f"a pattern has at most {MAX_COMPONENTS:,} components, this one {len(p.components):,}",
            var=p.components[MAX_COMPONENTS].var,
        )
    by_var: dict[str, Component] = {}
    for c in p.components:
        if c.var in by_var:
            raise PatternError(f"variable {c.var!r} is declared twice", var=c.var)
        by_var[c.var] = c
    first, last = p.components[0], p.components[-1]
    if not first.positive:
        raise PatternError(
            f"leading negation ~{first.var} is not supported: a pattern must start with a positive component",
            var=first.var,
        )
    if not last.positive:
        if p.window is None:
            raise PatternError(
                f"trailing negation ~{last.var} needs a window (WITHIN): without one it could never be decided",
                var=last.var,
            )
        if p.policy == "non_overlapping":
            raise PatternError("a trailing negation cannot be combined with the non_overlapping policy", var=last.var)
    if p.has_sets:
        validate_sets(p)
    elif p.policy in SET_POLICIES and p.policy not in POLICIES:
        raise PatternError(f"the {p.policy} output policy is for event-set queries only (docs/event_sets.md); "
                           f"this query takes {' or '.join(POLICIES)}")
    elif p.policy not in POLICIES:
        raise PatternError(f"unknown output policy {p.policy!r} (expected one of {', '.join(POLICIES)})")
    if p.window is not None and not p.window >= 0:
        raise PatternError("the window must not be negative")
    kleene = {c.var for c in p.components if c.kind is Kind.KLEENE}
    exprs = list(p.where) + ([e for _, e in p.emit.attrs] if p.emit else [])
    for expr in exprs:
        for node in walk(expr):
            if isinstance(node, (Ref, Length, Aggregate, XPathTest)):
                if node.var not in by_var:
                    raise PatternError(f"unknown variable {node.var!r} in predicate")
            if isinstance(node, Ref) and node.index is not Index.EACH and node.var not in kleene:
                raise PatternError(
                    f"{node.var}[…] indexes a single-event variable: only Kleene variables (declared with +) have iterations",
                    var=node.var,
                )
            if isinstance(node, (Length, Aggregate)) and node.var not in kleene:
                what = f"{node.var}.len" if isinstance(node, Length) else f"{node.func}({node.var}[..])"
                raise PatternError(f"{what} needs a Kleene variable; {node.var!r} binds a single event", var=node.var)
            if isinstance(node, Aggregate) and node.func not in AGGREGATE_FUNCS:
                raise PatternError(f"unknown aggregate {node.func!r}", var=node.var)
            if isinstance(node, (Compare, Arith)) and node.op not in (COMPARE_OPS if isinstance(node, Compare) else ARITH_OPS):
                raise PatternError(f"unknown operator {node.op!r}")
    for expr in p.where:
        negs = sorted(v for v in variables(expr) if not by_var[v].positive)
        if len(negs) > 1:
            raise PatternError(f"a predicate may mention one negated variable, not {negs}", var=negs[1])
    if p.feedback and p.emit is None:
        raise PatternError("a feedback query needs a result event: RETURN type(…) in SASE+, => type(…) in extended XPath")
    if p.emit:
        for name, expr in p.emit.attrs:
            if p.feedback and name in PSEUDO_ATTRS:
                raise PatternError(f"RETURN attribute {name!r} would hide the fed-back event's own {name} "
                                   f"(x.{name} reads an attribute before the field): give it another name")
            for v in sorted(variables(expr)):
                if not by_var[v].positive:
                    raise PatternError(f"RETURN attribute {name!r} refers to negated variable {v!r}", var=v)


def validate_sets(p: Pattern) -> None:
    """The extra rules of event-set patterns (docs/event_sets.md)."""
    for c in p.components:
        if not c.positive:
            if c.set_id is not None:
                raise PatternError(f"negation ~{c.var} cannot be inside an event set: a set's events have no order", var=c.var)
            if c is p.components[-1] and p.feedback:
                raise PatternError(
                    f"a feedback event-set query cannot end in a negation (~{c.var}): its matches are known only τ "
                    "after their first event, not at an event that could be fed back", var=c.var)
            continue
        if c.contiguity is not Contiguity.SKIP_TILL_ANY or c.inner is not Contiguity.SKIP_TILL_ANY:
            raise PatternError(
                f"an event-set pattern matches by Definition 2 (every combination, like skip_till_any_match); "
                f"{c.var!r} has contiguity {c.contiguity.value}",
                var=c.var,
            )
    if p.window is None:
        raise PatternError("an event-set pattern needs a duration τ (WITHIN): Definition 1 of the match-windows paper")
    if p.policy not in SET_POLICIES:
        raise PatternError(
            f"output policy {p.policy!r} is not defined for event-set patterns (use one of {', '.join(SET_POLICIES)})"
        )
    if p.feedback and p.policy == "earliest_maximal":
        raise PatternError("a feedback event-set query cannot use earliest_maximal: whether a match is earliest and "
                           "maximal is known only τ after its first event, not at an event that could be fed back")
    for expr in p.where:
        prevs = {n.var for n in walk(expr) if isinstance(n, Ref) and n.index is Index.PREV}
        if len(prevs) > 1:
            raise PatternError(f"a predicate may use prev() of one variable, not {sorted(prevs)}")
        for node in walk(expr):
            if isinstance(node, Aggregate) and node.upto_prev:
                raise PatternError(
                    f"{node.func}({node.var}[..i-1]) is not defined in an event-set pattern: a set's events have no "
                    f"binding order; use {node.func}({node.var}[..]) over all of {node.var}"
                )
            if prevs and isinstance(node, (Length, Aggregate)) and node.var in prevs:
                raise PatternError(f"a predicate with prev({node.var}…) cannot also use {node.var}.len or an aggregate of {node.var}")
            if prevs and isinstance(node, Ref) and node.var in prevs and node.index is Index.LAST:
                raise PatternError(f"a predicate with prev({node.var}…) cannot also use {node.var}[{node.var}.len]")
