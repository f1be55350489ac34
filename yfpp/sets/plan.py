"""A set query's plan (docs/event_sets.md): its sets, conditions, partition attributes and the bits
that say which variables an event may bind."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from yfpp.input.events import MISSING, Event
from yfpp.language.pattern import (
    Aggregate,
    Compare,
    Contiguity,
    Index,
    Kind,
    Length,
    Pattern,
    Ref,
    variables,
    walk,
)
from yfpp.nfa.compiler import make_scope, structure
from yfpp.nfa.predicates import (
    AggSlot,
    Check,
    Place,
    compile_check,
    compile_value,
)
from yfpp.runtime.match_id import match_id_of
from yfpp.runtime.runs import PLAIN_KEYS, usable_key



Binding = list[list[Event]]  # per variable (pattern order), its events in stream order


# --- compilation ----------------------------------------------------------------------------


@dataclass(eq=False)
class SetPlan:
    """A set pattern compiled for :func:`search`; variable ``i`` owns bit ``1 << (m-1-i)``.

    Bits are numbered as the paper writes its bit vectors: the first
    variable is the leftmost bit (``ē1 = 100`` for ``{c, p+}, {b}``).
    """

    name: str | int
    pattern: Pattern
    vars: tuple[str, ...]
    kleene: tuple[bool, ...]
    types: tuple[str | None, ...]
    blocks: tuple[tuple[int, ...], ...]
    block_of: tuple[int, ...]
    bit: tuple[int, ...]
    block_mask: tuple[int, ...]  # bits of the variables of Bi
    prev_mask: tuple[int, ...]  # the paper's b̄i: bits of the variables of Bi-1 (0 for B1)
    props: tuple[tuple[Check, ...], ...]  # per variable: conjuncts on its own event alone
    chains: tuple[tuple[Check, ...], ...]  # per Kleene variable: prev(v.x) conjuncts on v alone
    relations: tuple[tuple[tuple[Check, tuple[int, ...]], ...], ...]  # per variable: comparisons with others
    iter_final: tuple[tuple[int, Check], ...]  # prev() conjuncts that also read other variables
    final: tuple[Check, ...]  # everything else, on the whole substitution
    agg_slots: tuple[tuple[AggSlot, ...], ...]
    window: float
    partition_by: tuple[str, ...]
    policy: str
    emit: tuple[str, tuple[tuple[str, Callable], ...]] | None
    negations: tuple["SetNegation", ...] = ()
    eq_attrs: tuple[str, ...] = ()  # Definition 6's X, derived from equality relationships
    eq_groups: tuple[tuple[tuple[str, tuple[int, ...]], ...], ...] = ()  # per variable: (A, its Θ+eq group)
    full_events: bool = False  # matches list their bound events in full (``Engine(full_events=True)``)
    ident: Callable = field(init=False, repr=False)  # a match's id from its seqs (``yfpp.runtime.match_id.match_id_of``)

    def __post_init__(self) -> None:
        self.ident = match_id_of(self.name, self.vars)

    @property
    def m(self) -> int:
        return len(self.vars)

    @property
    def middle(self) -> tuple["SetNegation", ...]:
        """The negations between two sets."""
        return tuple(n for n in self.negations if n.after < len(self.blocks) - 1)

    @property
    def trailing(self) -> tuple["SetNegation", ...]:
        """The negations after the last set: no witness after its match's last event, within τ of its first."""
        return tuple(n for n in self.negations if n.after == len(self.blocks) - 1)


@dataclass(frozen=True)
class SetNegation:
    """``~n`` between sets ``after`` and ``after + 1``: no such event between them (docs/semantics.md §5)."""

    after: int
    event_type: str | None
    own: tuple[Check, ...]  # conjuncts on n alone
    cross: tuple[Check, ...]  # conjuncts on n and bound variables

    def witness(self, ev: Event) -> bool:
        """Could ``ev`` be a witness, whatever the bindings?"""
        return (self.event_type is None or self.event_type == ev.type) and all(c(ev, ()) for c in self.own)


def windowable(pattern: Pattern) -> bool:
    """Can an ordinary pattern run as a set pattern of one-variable sets?

    True when its NFA^b matches are Definition 2's: single variables only,
    skip_till_any_match between them, no negation, a window, policy ``all``.
    """
    return (
        not pattern.has_sets
        and not pattern.feedback
        and pattern.window is not None
        and pattern.policy == "all"
        and all(c.kind is Kind.SINGLE for c in pattern.components)
        and all(c.contiguity is Contiguity.SKIP_TILL_ANY for c in pattern.components[1:])
    )


def compile_sets(pattern: Pattern, name: str | int) -> SetPlan:
    """The :class:`SetPlan` of a validated set pattern."""
    specs = structure(pattern)
    scope = make_scope(pattern, specs)
    comps = pattern.positives
    slot = {c.var: i for i, c in enumerate(comps)}
    m = len(comps)
    blocks = tuple(tuple(slot[c.var] for c in b) for b in pattern.blocks)
    block_of = [0] * m
    for b, members in enumerate(blocks):
        for i in members:
            block_of[i] = b
    bit = tuple(1 << (m - 1 - i) for i in range(m))
    block_mask = tuple(sum(bit[i] for i in b) for b in blocks)
    props: list[list[Check]] = [[] for _ in comps]
    chains: list[list[Check]] = [[] for _ in comps]
    relations: list[list[tuple[Check, tuple[int, ...]]]] = [[] for _ in comps]
    iter_final: list[tuple[int, Check]] = []
    final: list[Check] = []
    negated = {c.var: c for c in pattern.components if not c.positive}
    for conj in pattern.where:
        vs = variables(conj)
        if vs & set(negated):
            continue  # a negation's test, below
        nodes = list(walk(conj))
        prev = {n.var for n in nodes if isinstance(n, Ref) and n.index is Index.PREV}
        indexed = any(isinstance(n, (Length, Aggregate)) or (isinstance(n, Ref) and n.index is not Index.EACH) for n in nodes)
        if prev:
            (v,) = prev
            check = compile_check(conj, Place(v, "iter"), scope)
            first = any(isinstance(n, Ref) and n.index is Index.FIRST for n in nodes)
            if vs == {v} and not first:
                chains[slot[v]].append(check)
            else:
                iter_final.append((slot[v], check))
        elif len(vs) == 1 and not indexed:
            (v,) = vs
            props[slot[v]].append(compile_check(conj, _own(comps[slot[v]]), scope))
        elif _equality_link(conj) is not None:
            continue  # vi.A = vj.A: search's Θ+eq test (eq_groups) holds it — every event of the group has one A
        elif isinstance(conj, Compare) and len(vs) > 1 and not indexed:
            # ∀ over every combination of events = one check per event, against the others' events
            for v in vs:
                others = tuple(sorted(slot[u] for u in vs if u != v))
                relations[slot[v]].append((compile_check(conj, _own(comps[slot[v]]), scope), others))
        else:
            final.append(compile_check(conj, Place(None, "bound"), scope))
    negations = []
    for k, c in enumerate(pattern.components):
        if c.positive:
            continue
        before = [x for x in pattern.components[:k] if x.positive][-1]
        tests = [conj for conj in pattern.where if c.var in variables(conj)]
        negations.append(
            SetNegation(
                after=block_of[slot[before.var]],
                event_type=c.event_type,
                own=tuple(compile_check(t, Place(c.var, "event"), scope) for t in tests if variables(t) == {c.var}),
                cross=tuple(compile_check(t, Place(c.var, "event"), scope) for t in tests if variables(t) != {c.var}),
            )
        )
    emit = None
    if pattern.emit is not None:
        bound = Place(None, "bound")
        emit = (pattern.emit.event_type, tuple((k, compile_value(e, bound, scope)) for k, e in pattern.emit.attrs))
    return SetPlan(
        name=name,
        pattern=pattern,
        vars=tuple(c.var for c in comps),
        kleene=tuple(c.kind is Kind.KLEENE for c in comps),
        types=tuple(c.event_type for c in comps),
        blocks=blocks,
        block_of=tuple(block_of),
        bit=bit,
        block_mask=block_mask,
        prev_mask=(0,) + block_mask[:-1],
        props=tuple(map(tuple, props)),
        chains=tuple(map(tuple, chains)),
        relations=tuple(map(tuple, relations)),
        iter_final=tuple(iter_final),
        final=tuple(final),
        agg_slots=tuple(scope.agg_slots.get(c.var, ()) for c in comps),
        window=float(pattern.window),  # type: ignore[arg-type]  # validate_sets requires one
        partition_by=pattern.partition_by,
        policy=pattern.policy,
        emit=emit,
        negations=tuple(negations),
        eq_attrs=partition_attributes(pattern),
        eq_groups=tuple(
            tuple(
                (a, tuple(sorted(slot[u] for u in g if u in slot)))
                for a, gs in equality_components(pattern).items()
                for g in gs
                if c.var in g
            )
            for c in comps
        ),
    )


def _own(c) -> Place:
    """Where a check on one event of ``c`` runs: that event is ``ev``, not ∀ over ``c``'s events."""
    return Place(c.var, "iter" if c.kind is Kind.KLEENE else "event")


def equality_components(pattern: Pattern) -> dict[str, list[set[str]]]:
    """Per attribute A, the positive variables linked by relationships ``vi.A = vj.A`` between two of them
    (top-level WHERE conjuncts), grouped by the transitive closure: within a group every bound event has
    the same A (Example 12's Θ+eq).  A link through a negated variable links nothing (``a.x = n.x AND
    n.x = b.x`` is a test of the negation's witness, not ``a.x = b.x``)."""
    positive = {c.var for c in pattern.components if c.positive}
    return {attr: groups for attr, pairs in _equality_links(pattern).items()
            if (groups := _connected([], [(a, b) for a, b in pairs if a in positive and b in positive]))}


def _equality_links(pattern: Pattern) -> dict[str, list[tuple[str, str]]]:
    """Per attribute A, the pairs of variables of the relationships ``vi.A = vj.A`` (i ≠ j)."""
    links: dict[str, list[tuple[str, str]]] = {}
    for conj in pattern.where:
        link = _equality_link(conj)
        if link is not None:
            links.setdefault(link[0], []).append(link[1:])
    return links


def _connected(nodes: list[str], pairs: list[tuple[str, str]]) -> list[set[str]]:
    """The groups of ``nodes`` and of the variables of ``pairs`` that ``pairs`` connect."""
    parent: dict[str, str] = {}

    def root(v: str) -> str:
        parent.setdefault(v, v)
        while parent[v] != v:
            v = parent[v]
        return v

    for v in nodes:
        root(v)
    for a, b in pairs:
        parent[root(a)] = root(b)
    groups: dict[str, set[str]] = {}
    for v in parent:
        groups.setdefault(root(v), set()).add(v)
    return list(groups.values())


def _equality_link(conj) -> tuple[str, str, str] | None:
    """``(A, vi, vj)`` for a relationship ``vi.A = vj.A`` of two variables, else None (``v.A = v.A`` is a
    property of each event of ``v``)."""
    if (
        isinstance(conj, Compare)
        and conj.op == "="
        and isinstance(conj.left, Ref)
        and isinstance(conj.right, Ref)
        and conj.left.attr == conj.right.attr
        and conj.left.index is Index.EACH
        and conj.right.index is Index.EACH
        and conj.left.var != conj.right.var
    ):
        return conj.left.attr, conj.left.var, conj.right.var
    return None


def partition_attributes(pattern: Pattern) -> tuple[str, ...]:
    """Definition 6's X: the equivalence list plus every attribute whose equality relationships connect all
    positive variables among themselves — so every event of a match has one value of it, and an event
    without one binds nothing (a variable alone has no such relationship: its events may differ, or lack
    the attribute) — and link each negated variable to a positive one (so a witness shares the attribute
    with the match it would kill: else it may lie in another partition)."""
    positive = [c.var for c in pattern.components if c.positive]
    negated = [c.var for c in pattern.components if not c.positive]
    out = list(pattern.partition_by)
    for attr, pairs in _equality_links(pattern).items():
        inner = [(a, b) for a, b in pairs if a in positive and b in positive]
        witnessed = {v for a, b in pairs for v, other in ((a, b), (b, a)) if other in positive}
        if inner and len(_connected(positive, inner)) == 1 and witnessed.issuperset(negated) and attr not in out:
            out.append(attr)
    return tuple(out)


def event_bits(plan: SetPlan, ev: Event) -> int:
    """The paper's ē: the bits of the variables whose type and properties ``ev`` satisfies.

    An event that lacks an attribute of the equivalence list can bind nothing.
    """
    for a in plan.partition_by:
        if ev.get(a) is MISSING:
            return 0
    bits = 0
    for i, checks in enumerate(plan.props):
        t = plan.types[i]
        if (t is None or t == ev.type) and all(c(ev, ()) for c in checks):
            bits |= plan.bit[i]
    return bits


def key_of(ev: Event, attrs: tuple[str, ...]) -> Any:
    """The values of ``attrs`` (``MISSING`` when the event is in no partition: see :func:`usable_key`)."""
    vals = tuple(ev.get(a) for a in attrs)
    if PLAIN_KEYS.issuperset(map(type, vals)):
        return vals
    return MISSING if any(usable_key(v) is None for v in vals) else vals
