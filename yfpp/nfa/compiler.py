"""Pattern IR → one query's NFA^b plan (SIGMOD 2008 §3.2, steps 1–6).

The passes, in order (each a small function below):

1. ``structure``          one component spec per positive component: a single
                           component is a state waiting to *begin* it, a Kleene
                           component adds a state *in* it (take / ignore / proceed);
2. ``place_predicates``   each WHERE conjunct goes to the edge of its last
                           identifier: begin, Kleene take (first / later
                           iterations) or Kleene proceed (``final``);
3. ignore formulas        by contiguity, per component (runtime ``_ignores``);
4. window                 on the final edge and pushed onto every begin/take
                           (runtime: runs die past their node's window);
5. constrain proceed      a proceed edge peeks at the next begin condition
                           (runtime ``_step``);
6. ``place_negations``    each negated component becomes a check made when the
                           query accepts (YFilter++ §6.4 post-processing); a
                           trailing one is a deadline on the match.

A component spec carries its *signature*: everything that decides which runs
pass through it (type test, kind, contiguity, canonical predicates with
variables renamed by position, equivalence key, Kleene state layout).  Specs
with equal signature chains are merged into one node of the shared NFA
(``yfpp.nfa.shared_nfa``); what may differ between queries sharing nodes — window,
negations, RETURN, variable names, registration time — lives in the
:class:`QueryPlan` and is checked at acceptance.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, is_dataclass
from enum import Enum
from typing import Any, Callable, Hashable, Sequence

from yfpp.errors import PatternError
from yfpp.language.pattern import (
    Aggregate,
    Compare,
    Contiguity,
    Expr,
    Index,
    Kind,
    Length,
    Literal,
    Pattern,
    Ref,
    XPathTest,
    children,
    rebuilt,
    variables,
    walk,
)
from yfpp.nfa.predicates import AggSlot, Check, Place, Scope, compile_check, compile_value, quantified_vars


@dataclass(eq=False, slots=True)
class NegationPlan:
    """A negated component ``~T n``: no qualifying event between its neighbours."""

    var: str
    event_type: str | None
    self_preds: tuple[Check, ...]  # mention only n: filter candidates once, on arrival
    cross_preds: tuple[Check, ...]  # mention bound positives too: checked per match
    lower: int  # positive index before the negation; events strictly after its last event
    upper: int | None  # positive index after it (None: trailing); strictly before its first event
    signature: Hashable = None  # type and own predicates, the variable renamed: equal ones share a candidate store
    check_signature: Hashable = None  # and the per-match check: equal ones (at one node) give the same answer


@dataclass(eq=False, slots=True)
class ComponentSpec:
    """One positive component of one query: its formulas by edge, and its signature."""

    index: int
    var: str
    event_type: str | None
    kleene: bool
    contiguity: Contiguity
    inner: Contiguity
    # (lists while the passes place predicates, tuples after: a plan holds what it needs, no spare room)
    begin: Sequence[tuple[Expr, Check]] = field(default_factory=list)  # single: begin; Kleene: first iteration
    take: Sequence[tuple[Expr, Check]] = field(default_factory=list)  # Kleene iterations i >= 2
    final: Sequence[tuple[Expr, Check]] = field(default_factory=list)  # Kleene proceed / accept (ev is None)
    agg_slots: tuple[AggSlot, ...] = ()
    keep_events: bool = False
    # made from a shape's plan (yfpp.nfa.shape_plans): the expression keys (key_set) of begin, take and final and
    # the shared NFA's index key, which are otherwise read from the canonical expressions (then None in the conjuncts)
    keys: tuple[Hashable, Hashable, Hashable, tuple | None] | None = None
    # made from a shape's plan: what the component is (:meth:`kind`), the shape's, found once
    what: tuple | None = None
    # made from a shape's plan and holding no constant: its node signature (:meth:`signature`, no private runs), one
    # tuple for the nodes of every query of the shape (a node's signature is an object the cyclic collector walks)
    shared_signature: Hashable = None

    def signature(self, partition_by: tuple[str, ...], private: object | None) -> Hashable:
        """What must be equal for two queries to share this component's runs: what the component is, one tuple
        object for every component alike, then its predicates' keys and the query when it keeps its runs private
        (as few objects per node as may be: a million subscriptions make a million nodes)."""
        keys = self.keys
        if keys is None:
            keys = tuple(key_set([expr_key(e) for e, _ in c]) for c in (self.begin, self.take, self.final))
        what = self.what
        if what is None or what[6] != partition_by:
            what = self.kind(partition_by)
        if keys[1] == () and keys[2] == () and private is None:  # (no take or final edge: the commonest)
            return what, keys[0]
        return what, keys[0], keys[1], keys[2], private

    def kind(self, partition_by: tuple[str, ...]) -> tuple:
        """What the component is, as the first item of its signature: one tuple object for every one alike."""
        what = (self.event_type, self.kleene, self.contiguity if self.index else None,
                self.inner if self.kleene else None, self.agg_slots, self.keep_events, partition_by)
        return _SIGNATURES.setdefault(what, what)


_SIGNATURES: dict[tuple, tuple] = {}  # one object per kind of component (a few per query shape)


def key_set(keys: list[str]) -> Hashable:
    """The expression keys of a component's conjuncts on one edge, in any order: the key itself when there is
    one, else the sorted tuple of them."""
    return keys[0] if len(keys) == 1 else tuple(sorted(keys))


@dataclass(eq=False, slots=True)
class QueryPlan:
    """One registered query: its component chain and its acceptance checks."""

    name: str | int
    # its pattern, or for a query made from its shape's plan (yfpp.nfa.shape_plans, `shape`) the query's text, from
    # which `pattern` is made when asked: most subscriptions of a big engine are never asked
    source: Pattern | str
    # its component specs while it registers (None after: see `specs`)
    compiled_specs: list[ComponentSpec] | None
    negations: Sequence[NegationPlan]  # (a tuple when there are none)
    trailing: NegationPlan | None
    partition_by: tuple[str, ...]
    window: float | None
    policy: str
    emit: tuple[str, tuple[tuple[str, Callable], ...]] | None
    var_names: tuple[str, ...] = ()
    since_tick: int = 0  # only runs born later count: the runtime tick at registration, raised by a shed (yfpp.runtime.caps)
    negation_key: Hashable = ()  # its middle negations' check signatures: equal keys, equal answers at a node
    last: Any = None  # the last shared-NFA node it passes through (yfpp.nfa.shared_nfa.SharedNFA.add): see `nodes`
    feedback: bool = False  # its result events go back into the stream (its pattern's FEEDBACK)
    shape: Any = None  # the shape's plan it was made from (yfpp.nfa.shape_plans.ShapePlan), else None

    @property
    def pattern(self) -> Pattern:
        """Its pattern (made again from its shape's plan and its text for a query made so)."""
        if self.shape is not None:
            return self.shape.pattern(self.source)
        return self.source  # type: ignore[return-value]

    @property
    def nodes(self) -> tuple:
        """The shared-NFA nodes it passes through, first to last (the path up from its last node: a query keeps
        no list of them)."""
        out = []
        node = self.last
        while node is not None:
            out.append(node)
            node = node.parent
        return tuple(reversed(out))

    @property
    def specs(self) -> list[ComponentSpec]:
        """Its component specs: those it was compiled with until :meth:`release_specs`, else compiled again from
        its pattern (their canonical predicates are what differs between queries of one shape: a registered query
        keeps only its nodes' checks, and ``yfpp explain`` or run merging, which read the predicates, remake them)."""
        if self.compiled_specs is not None:
            return self.compiled_specs
        return _compile_pattern(self.pattern, self.name, None).compiled_specs  # type: ignore[return-value]

    def release_specs(self) -> None:
        """Drop the specs once the query's nodes hold what the runtime needs of them."""
        self.compiled_specs = None


def expr_key(expr: Any) -> str:
    """A canonical expression as compact text, equal for equal expressions only (a constant by its ``repr``:
    ``1``, ``1.0``, ``True`` and ``'1'`` differ): what node signatures keep of predicates, about a third of
    the ``repr`` of the expression."""
    common = _COMMON_KEYS.get(type(expr))
    if common is not None:
        return common(expr)
    names = _FIELDS.get(type(expr))
    if names is None:
        if isinstance(expr, Enum):
            return expr.name
        if isinstance(expr, tuple):
            return "(" + ",".join([expr_key(x) for x in expr]) + ")"
        if not is_dataclass(expr):
            return repr(expr)
        names = _FIELDS[type(expr)] = tuple(f.name for f in fields(expr))
    return type(expr).__name__ + "(" + ",".join([expr_key(getattr(expr, n)) for n in names]) + ")"


_FIELDS: dict[type, tuple[str, ...]] = {}  # a dataclass's field names, for expr_key
# the commonest, written short (a million subscriptions keep a million of them): ``=($'#0''zone'EACH,@'Z1')`` for
# ``Compare('=', Ref('#0', 'zone', EACH), Literal('Z1'))``; no other key begins with ``@``, ``$`` or an operator
_COMMON_KEYS: dict[type, Callable[[Any], str]] = {
    Literal: lambda e: f"@{e.value!r}",
    Ref: lambda e: f"${e.var!r}{e.attr!r}{e.index.name}",
    Compare: lambda e: f"{e.op}({expr_key(e.left)},{expr_key(e.right)})",
}


# --- passes ---------------------------------------------------------------------


def compile_pattern(pattern: Pattern, name: str | int, xpath_compiler: Callable | None = None) -> QueryPlan:
    """The NFA^b plan of a validated pattern; a :class:`PatternError` is placed in the pattern's source."""
    try:
        return _compile_pattern(pattern, name, xpath_compiler)
    except PatternError as err:
        raise pattern.locate(err) from None


def _compile_pattern(pattern: Pattern, name: str | int, xpath_compiler: Callable | None) -> QueryPlan:
    specs = structure(pattern)
    scope = make_scope(pattern, specs)
    place_predicates(pattern, specs, scope, xpath_compiler)
    negations, trailing = place_negations(pattern, specs, scope, xpath_compiler)
    for spec in specs:
        spec.begin, spec.take, spec.final = tuple(spec.begin), tuple(spec.take), tuple(spec.final)
    emit = None
    if pattern.emit is not None:
        bound = Place(None, "bound")
        for _, e in pattern.emit.attrs:
            for n in walk(e):
                if isinstance(n, Ref) and n.var in scope.kleene and n.index is Index.EACH:
                    specs[scope.slot_of[n.var]].keep_events = True
        emit = (pattern.emit.event_type, tuple((k, compile_value(e, bound, scope)) for k, e in pattern.emit.attrs))
    return QueryPlan(
        name=name,
        source=pattern,
        compiled_specs=specs,
        negations=negations,
        trailing=trailing,
        partition_by=pattern.partition_by,
        window=pattern.window,
        policy=pattern.policy,
        emit=emit,
        var_names=tuple(s.var for s in specs),
        negation_key=tuple(n.check_signature for n in negations if n.upper is not None),
        feedback=pattern.feedback,
    )


def structure(pattern: Pattern) -> list[ComponentSpec]:
    return [
        ComponentSpec(
            index=i,
            var=c.var,
            event_type=c.event_type,
            kleene=c.kind is Kind.KLEENE,
            contiguity=c.contiguity,
            inner=c.inner,
        )
        for i, c in enumerate(pattern.positives)
    ]


def make_scope(pattern: Pattern, specs: list[ComponentSpec]) -> Scope:
    kleene = {c.var for c in specs if c.kleene}
    slots: dict[str, list[AggSlot]] = {v: [] for v in kleene}
    exprs = (list(pattern.where) + ([e for _, e in pattern.emit.attrs] if pattern.emit else [])) if kleene else []
    for expr in exprs:
        for n in walk(expr):
            if isinstance(n, Aggregate) and AggSlot(n.func, n.attr) not in slots[n.var]:
                slots[n.var].append(AggSlot(n.func, n.attr))
    for c in specs:
        if c.kleene:
            c.agg_slots = tuple(slots[c.var])
    return Scope({c.var: c.index for c in specs}, kleene, {v: tuple(s) for v, s in slots.items()})


def canonical(expr: Expr, slot_of: dict[str, int]) -> Expr:
    """``expr`` with variables renamed by position (``#0``, ``#1``, …) — comparable across queries."""
    if hasattr(expr, "var") and expr.var in slot_of:
        expr = rebuilt(expr, var=f"#{slot_of[expr.var]}")
    subs = children(expr)
    if not subs:
        return expr
    new = tuple(canonical(s, slot_of) for s in subs)
    if hasattr(expr, "operands"):
        return rebuilt(expr, operands=new)
    if hasattr(expr, "operand"):
        return rebuilt(expr, operand=new[0])
    return rebuilt(expr, left=new[0], right=new[1])


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
            raise PatternError(f"a predicate mixes {var}[i-1] with {var}.len / {var}[{var}.len] / {var}[..]", var=var)
        return "final"
    if "prev" in kinds or {"each", "first"} <= kinds:
        return "take"
    if "first" in kinds:
        return "first"
    return "every"


def place_predicates(pattern: Pattern, specs: list[ComponentSpec], scope: Scope, xc: Callable | None) -> None:
    """Step 2: each non-negation conjunct on the edge of its last identifier."""
    negated = {c.var for c in pattern.components if not c.positive}
    for conj in pattern.where:
        vs = variables(conj)
        if vs & negated:
            continue
        spec = specs[max((scope.slot_of[v] for v in vs), default=0)]
        canon = canonical(conj, scope.slot_of)
        if not spec.kleene:
            spec.begin.append((canon, _compile(conj, Place(spec.var, "event"), scope, specs, xc)))
            continue
        cls = _iteration_class(conj, spec.var)
        if cls == "final":
            spec.final.append((canon, _compile(conj, Place(spec.var, "bound"), scope, specs, xc)))
            continue
        check = _compile(conj, Place(spec.var, "iter"), scope, specs, xc)
        if cls in ("first", "every"):
            spec.begin.append((canon, check))
        if cls in ("take", "every"):
            spec.take.append((canon, check))


def _compile(expr: Expr, place: Place, scope: Scope, specs: list[ComponentSpec], xc: Callable | None) -> Check:
    for v in quantified_vars(expr, place, scope):
        specs[scope.slot_of[v]].keep_events = True
    return compile_check(expr, place, scope, xc)


def place_negations(
    pattern: Pattern, specs: list[ComponentSpec], scope: Scope, xc: Callable | None
) -> tuple[list[NegationPlan], NegationPlan | None]:
    """Step 6: negations are checked on the finished match (post-processing)."""
    negs: list[NegationPlan] = []
    trailing = None
    positives_before = 0
    conjuncts_of: dict[str, list[tuple[Expr, bool]]] = {c.var: [] for c in pattern.components if not c.positive}
    for w in pattern.where:  # a conjunct mentions at most one negated variable (Pattern.validate)
        vs = variables(w)
        for v in vs & conjuncts_of.keys():
            conjuncts_of[v].append((w, vs == {v}))
    for c in pattern.components:
        if c.positive:
            positives_before += 1
            continue
        own = conjuncts_of[c.var]
        place = Place(c.var, "event")
        renamed = {**scope.slot_of, c.var: "n"}
        signature = (c.event_type, tuple(sorted(repr(canonical(w, renamed)) for w, alone in own if alone)))
        plan = NegationPlan(
            var=c.var,
            event_type=c.event_type,
            self_preds=tuple(_compile(w, place, scope, specs, xc) for w, alone in own if alone),
            cross_preds=tuple(_compile(w, place, scope, specs, xc) for w, alone in own if not alone),
            lower=positives_before - 1,
            upper=positives_before if positives_before < len(specs) else None,
            signature=signature,
        )
        plan.check_signature = (signature, plan.lower, plan.upper,
                                tuple(sorted(repr(canonical(w, renamed)) for w, alone in own if not alone)))
        negs.append(plan)
        if plan.upper is None:
            trailing = plan
    return negs, trailing
