"""Pattern IR → NFA^b plan (SIGMOD 2008 §3.2, steps 1–6).

The passes, in order (each a small function below):

1. ``structure``          one component plan per positive component; a single
                           component is a state waiting to *begin* it, a Kleene
                           component adds a state *in* it (take / ignore / proceed);
2. ``place_predicates``   each WHERE conjunct goes to the edge of its last
                           identifier: begin, Kleene take (first / later
                           iterations) or Kleene proceed (``final``);
3. ignore formulas        by contiguity, per component (runtime ``ignores``);
4. window                 on the final edge and pushed onto every begin/take
                           (runtime ``within``);
5. ``constrain_proceed``  a proceed edge peeks at the next begin condition
                           (runtime ``step_in``);
6. ``place_negations``    each negated component becomes a check on the
                           positive component whose begin (or proceed) first
                           binds everything it mentions; a trailing one is a
                           deadline on the match.

The plan is data: states with compiled predicate closures, ready for
``yfpp.runtime``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import count
from typing import Callable

from yfpp.errors import PatternError
from yfpp.pattern import (
    Aggregate,
    Contiguity,
    Expr,
    Index,
    Kind,
    Length,
    Pattern,
    Ref,
    XPathTest,
    variables,
    walk,
)
from yfpp.predicates import AggSlot, Check, Place, Scope, compile_check, compile_value, quantified_vars

_state_ids = count()


@dataclass(eq=False)
class NegationPlan:
    """A negated component ``~T n`` checked on runs or pending matches."""

    var: str
    event_type: str | None
    self_preds: tuple[Check, ...]  # mention only n: filter candidates once, on arrival
    cross_preds: tuple[Check, ...]  # mention bound positives too: checked per run
    lower: int  # positive index before the negation; events strictly after its last event
    upper: int | None  # positive index after it (None: trailing); strictly before its first event


@dataclass(eq=False)
class ComponentPlan:
    """One positive component: its formulas, by edge."""

    index: int
    var: str
    event_type: str | None
    kleene: bool
    contiguity: Contiguity
    inner: Contiguity
    begin: tuple[Check, ...] = ()  # single: begin; Kleene: first iteration
    take: tuple[Check, ...] = ()  # Kleene iterations i >= 2
    final: tuple[Check, ...] = ()  # Kleene proceed / accept (ev is None)
    neg_at_begin: list[NegationPlan] = field(default_factory=list)
    neg_at_final: list[NegationPlan] = field(default_factory=list)
    agg_slots: tuple[AggSlot, ...] = ()
    keep_events: bool = False
    plan: "QueryPlan | None" = None
    wait: "State | None" = None
    inside: "State | None" = None
    next: "ComponentPlan | None" = None

    @property
    def last(self) -> bool:
        return self.next is None


@dataclass(eq=False)
class State:
    """An NFA^b state where runs wait: ``wait`` (to begin ``comp``) or ``in`` (Kleene ``comp``)."""

    plan: "QueryPlan"
    comp: ComponentPlan
    mode: str  # "wait" | "in"
    id: int = field(default_factory=lambda: next(_state_ids))

    @property
    def contiguity(self) -> Contiguity:
        return self.comp.contiguity if self.mode == "wait" else self.comp.inner

    @property
    def move_types(self) -> set[str | None]:
        """Event types that can begin/take/proceed here (``None`` = any type)."""
        types = {self.comp.event_type}
        if self.mode == "in" and self.comp.next is not None:
            types.add(self.comp.next.event_type)
        return types

    def __repr__(self) -> str:
        return f"<{self.plan.name}:{self.mode}:{self.comp.var}>"


@dataclass(eq=False)
class QueryPlan:
    name: str
    pattern: Pattern
    comps: list[ComponentPlan]
    negations: list[NegationPlan]
    trailing: NegationPlan | None
    partition_by: tuple[str, ...]
    window: float | None
    policy: str
    emit: tuple[str, tuple[tuple[str, Callable], ...]] | None
    states: list[State] = field(default_factory=list)

    @property
    def empty_vec(self) -> tuple:
        """The computation-state vector of a run that has bound nothing yet."""
        return (None,) * len(self.comps)

    @property
    def first(self) -> ComponentPlan:
        return self.comps[0]


# --- passes ---------------------------------------------------------------------


def compile_pattern(pattern: Pattern, name: str, xpath_compiler: Callable | None = None) -> QueryPlan:
    """The NFA^b plan of a validated pattern."""
    comps = structure(pattern)
    scope = make_scope(pattern, comps)
    place_predicates(pattern, comps, scope, xpath_compiler)
    negations, trailing = place_negations(pattern, comps, scope, xpath_compiler)
    emit = None
    if pattern.emit is not None:
        bound = Place(None, "bound")
        for _, e in pattern.emit.attrs:
            for n in walk(e):
                if isinstance(n, Ref) and n.var in scope.kleene and n.index is Index.EACH:
                    comps[scope.slot_of[n.var]].keep_events = True
        emit = (pattern.emit.event_type, tuple((k, compile_value(e, bound, scope)) for k, e in pattern.emit.attrs))
    plan = QueryPlan(
        name=name,
        pattern=pattern,
        comps=comps,
        negations=negations,
        trailing=trailing,
        partition_by=pattern.partition_by,
        window=pattern.window,
        policy=pattern.policy,
        emit=emit,
    )
    for c in comps:
        c.plan = plan
    make_states(plan)
    return plan


def structure(pattern: Pattern) -> list[ComponentPlan]:
    comps = [
        ComponentPlan(
            index=i,
            var=c.var,
            event_type=c.event_type,
            kleene=c.kind is Kind.KLEENE,
            contiguity=c.contiguity,
            inner=c.inner,
        )
        for i, c in enumerate(pattern.positives)
    ]
    for a, b in zip(comps, comps[1:]):
        a.next = b
    return comps


def make_scope(pattern: Pattern, comps: list[ComponentPlan]) -> Scope:
    kleene = {c.var for c in comps if c.kleene}
    slots: dict[str, list[AggSlot]] = {v: [] for v in kleene}
    exprs = list(pattern.where) + ([e for _, e in pattern.emit.attrs] if pattern.emit else [])
    for expr in exprs:
        for n in walk(expr):
            if isinstance(n, Aggregate) and AggSlot(n.func, n.attr) not in slots[n.var]:
                slots[n.var].append(AggSlot(n.func, n.attr))
    for c in comps:
        if c.kleene:
            c.agg_slots = tuple(slots[c.var])
    return Scope({c.var: c.index for c in comps}, kleene, {v: tuple(s) for v, s in slots.items()})


def _iteration_class(expr: Expr, var: str) -> str:
    """Which edge of Kleene ``var`` a conjunct whose last identifier is ``var`` belongs to."""
    kinds = set()
    for n in walk(expr):
        if getattr(n, "var", None) != var:
            continue
        if isinstance(n, Length) or (isinstance(n, Ref) and n.index is Index.LAST):
            kinds.add("final")
        elif isinstance(n, Aggregate):
            kinds.add("prev" if n.upto_prev else "final")
        elif isinstance(n, Ref):
            kinds.add(n.index.value)
        elif isinstance(n, XPathTest):
            kinds.add("each")
    if "final" in kinds:
        if "prev" in kinds:
            raise PatternError(f"a predicate mixes {var}[i-1] with {var}.len / {var}[{var}.len] / {var}[..]")
        return "final"
    if "prev" in kinds or {"each", "first"} <= kinds:
        return "take"
    if "first" in kinds:
        return "first"
    return "every"


def place_predicates(pattern: Pattern, comps: list[ComponentPlan], scope: Scope, xc: Callable | None) -> None:
    """Step 2: each non-negation conjunct on the edge of its last identifier."""
    negated = {c.var for c in pattern.components if not c.positive}
    for conj in pattern.where:
        vs = variables(conj)
        if vs & negated:
            continue
        comp = comps[max((scope.slot_of[v] for v in vs), default=0)]
        if not comp.kleene:
            comp.begin += (_compile(conj, Place(comp.var, "event"), scope, comps, xc),)
            continue
        cls = _iteration_class(conj, comp.var)
        if cls == "final":
            comp.final += (_compile(conj, Place(comp.var, "bound"), scope, comps, xc),)
            continue
        check = _compile(conj, Place(comp.var, "iter"), scope, comps, xc)
        if cls in ("first", "every"):
            comp.begin += (check,)
        if cls in ("take", "every"):
            comp.take += (check,)


def _compile(expr: Expr, place: Place, scope: Scope, comps: list[ComponentPlan], xc: Callable | None) -> Check:
    for v in quantified_vars(expr, place, scope):
        comps[scope.slot_of[v]].keep_events = True
    return compile_check(expr, place, scope, xc)


def place_negations(
    pattern: Pattern, comps: list[ComponentPlan], scope: Scope, xc: Callable | None
) -> tuple[list[NegationPlan], NegationPlan | None]:
    """Step 6: a negation is checked where everything it mentions is bound."""
    negs: list[NegationPlan] = []
    trailing = None
    positives_before = 0
    for c in pattern.components:
        if c.positive:
            positives_before += 1
            continue
        lower = positives_before - 1
        upper = positives_before if positives_before < len(comps) else None
        own = [w for w in pattern.where if c.var in variables(w)]
        place = Place(c.var, "event")
        self_preds = tuple(_compile(w, place, scope, comps, xc) for w in own if variables(w) == {c.var})
        cross = [w for w in own if variables(w) != {c.var}]
        plan = NegationPlan(
            var=c.var,
            event_type=c.event_type,
            self_preds=self_preds,
            cross_preds=tuple(_compile(w, place, scope, comps, xc) for w in cross),
            lower=lower,
            upper=upper,
        )
        negs.append(plan)
        if upper is None:
            trailing = plan
            continue
        mentioned = [scope.slot_of[v] for w in cross for v in variables(w) if v in scope.slot_of]
        at = comps[max([upper, *mentioned])]
        if at.kleene and _reads_beyond_first(cross, at.var):
            at.neg_at_final.append(plan)
        else:
            at.neg_at_begin.append(plan)
    return negs, trailing


def _reads_beyond_first(exprs: list[Expr], var: str) -> bool:
    for e in exprs:
        for n in walk(e):
            if getattr(n, "var", None) == var and not (isinstance(n, Ref) and n.index is Index.FIRST):
                return True
    return False


def make_states(plan: QueryPlan) -> None:
    """The NFA^b states where runs can wait (no run waits to begin the first component)."""
    for c in plan.comps:
        if c.index > 0:
            c.wait = State(plan, c, "wait")
            plan.states.append(c.wait)
        if c.kleene:
            c.inside = State(plan, c, "in")
            plan.states.append(c.inside)
