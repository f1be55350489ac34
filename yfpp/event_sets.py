"""Event-set patterns (docs/event_sets.md; Cadonna, Gamper, Böhlen, "Efficient event
pattern matching with match windows", Definitions 1–6) — see docs/event_sets.md.

A set pattern ``⟨B1, …, Bk⟩`` with duration τ matches per Definition 2: each
variable binds one event (a Kleene variable one or more, in stream order),
no event twice, every event of ``Bi`` before every event of ``Bi+1``, the
WHERE conjuncts hold for every combination of bound events (``prev(v.x)``:
for every two consecutive events of ``v``), and all events lie within τ.

Set queries do not run on the shared NFA; the Engine hands every event to one
matcher per set query, built by :func:`set_matcher` for its strategy, after
the runtime gave it its stream position ``pos`` ("before" and "between" go by
``pos``, as in the runtime; ``seq`` is only the identity in the output):

* :class:`DirectMatcher` — an event that can bind a variable of ``Bk``
  searches for the matches it completes among the earlier events of its
  partition (Definition 6) within τ, and returns them at once;
* :class:`MatchWindowMatcher` — the paper's two-phase strategy (§4–5):
  events are filtered by the union of properties, partitioned by the
  attributes of the transitive closure of equality relationships, and
  buffered in a match window of duration τ; when the stream passes the
  window's end, the necessary match conditions (Theorem 2) are checked with
  the bit-vector summary statistics (Definition 5, Theorem 3), and only a
  candidate window is searched for the matches that start at its first event.

Both return exactly the same matches (tests/test_event_sets.py).
"""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator

from yfpp.errors import YfppError
from yfpp.events import MISSING, Event
from yfpp.match_id import match_id_of
from yfpp.nfa_compiler import make_scope, structure
from yfpp.pattern import (
    Aggregate,
    Compare,
    Contiguity,
    Index,
    Kind,
    Length,
    Pattern,
    STRATEGIES,
    Ref,
    variables,
    walk,
)
from yfpp.predicates import (
    AggSlot,
    Check,
    KleeneState,
    Place,
    compare_fn,
    compile_check,
    compile_value,
    kleene_start,
    kleene_take,
)
from yfpp.runs import PLAIN_KEYS, usable_key

if TYPE_CHECKING:
    from yfpp.engine import MatchOut as Out  # where matches go as they are made: a list, a writer (``out.extend``)

_equal = compare_fn("=")

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
    ident: Callable = field(init=False, repr=False)  # a match's id from its seqs (``yfpp.match_id.match_id_of``)

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


# --- the matcher A: every substitution over a list of events ----------------------------------


class OverBudget(Exception):
    """A search visited more partial substitutions than its budget (``max_runs_per_query``)."""


def search(plan: SetPlan, entries: list[tuple[Event, int]], forward: bool, check_keys: bool = False,
           budget: int | None = None) -> list[Binding]:
    """Every match (Definition 2) whose events are among ``entries`` and that binds ``entries[0]``.

    ``entries`` are ``(event, bits)`` in stream order when ``forward`` (then
    ``entries[0]`` is the match's first event), in reverse stream order
    otherwise (``entries[0]`` is its last event); the caller keeps them within
    τ of ``entries[0]``.  A state binds events in list order, so each
    substitution is reached once; moving on to the next set needs the current
    one complete (Condition 2).  ``check_keys``: the entries may mix
    partitions of the equivalence list.  ``budget``: raise :class:`OverBudget` once
    the partial substitutions tried plus the events of the matches found reach
    it; ``forward`` searches (complete windows) also
    check the trailing negations among ``entries``.
    """
    k = len(plan.blocks)
    start, end, step = (0, k - 1, 1) if forward else (k - 1, 0, -1)
    binds: Binding = [[] for _ in plan.vars]
    out: list[Binding] = []
    n = len(entries)
    left = [budget if budget is not None else -1]

    def spend(n: int = 1) -> None:
        left[0] -= n
        if budget is not None and left[0] <= 0:
            raise OverBudget

    def full(b: int) -> bool:
        return all(binds[i] for i in plan.blocks[b])

    def takes(i: int, ev: Event) -> bool:
        for attr, group in plan.eq_groups[i]:  # Θ+eq: one bound event of the group stands for all
            for o in group:
                if binds[o]:
                    if not _equal(ev.get(attr), binds[o][0].get(attr)):
                        return False
                    break
        bound = binds[i]
        if bound:
            if not plan.kleene[i]:
                return False
            before, after = (bound[-1], ev) if forward else (ev, bound[-1])
            if plan.chains[i]:
                vec = [None] * plan.m
                vec[i] = KleeneState(before, before, 1, (), None)
                t = tuple(vec)
                if not all(c(after, t) for c in plan.chains[i]):
                    return False
        for check, others in plan.relations[i]:
            if all(binds[o] for o in others):
                vec = [None] * plan.m
                for o in others:
                    vec[o] = _state(plan, o, binds[o])
                if not check(ev, tuple(vec)):
                    return False
        return True

    def reached(j0: int, b: int) -> Iterator[tuple[int, int, int]] | None:
        """Record the substitution if it is a match; then the frame of what extends it (None: nothing can)."""
        here = full(b)
        if b == end and here:
            binding = [list(x) for x in binds] if forward else [x[::-1] for x in binds]
            if accepts(plan, binding, check_keys, entries, trailing=forward):
                spend(sum(map(len, binding)))  # its copy costs as much as its events
                out.append(binding)
        nb = b + step
        move = here and 0 <= nb < k
        # the variables that can take one more event: those of this set but a bound single one (``takes``
        # refuses it anything), and those of the next set; none (e.g. a complete match of single
        # variables): no frame, no scan of the entries left
        closed = 0
        for i in plan.blocks[b]:
            if binds[i] and not plan.kleene[i]:
                closed |= plan.bit[i]
        mask = (plan.block_mask[b] & ~closed) | (plan.block_mask[nb] if move else 0)
        return extensions(j0, b, nb, move, mask) if mask else None

    def extensions(j0: int, b: int, nb: int, move: bool, mask: int) -> Iterator[tuple[int, int, int]]:
        """Every (variable, entry, set) after entry ``j0`` that extends the substitution: a variable of
        ``mask`` in set ``b``, or (``move``) in the next set ``nb``."""
        for j in range(j0 + 1, n):
            ev, bits = entries[j]
            bits &= mask
            if not bits:
                continue
            for block in (b, nb) if move else (b,):  # stay in this set, or begin the next one
                for i in plan.blocks[block]:
                    if bits & plan.bit[i] and takes(i, ev):  # binds are as this frame left them
                        yield i, j, block

    def roots() -> Iterator[tuple[int, int, int]]:
        ev, bits = entries[0]
        for i in plan.blocks[start]:
            if bits & plan.bit[i] and takes(i, ev):
                yield i, 0, start

    everyone = (1 << plan.m) - 1
    seen = 0
    for _, bits in entries:
        seen |= bits
    # depth first, on an explicit stack: a Kleene variable may bind every entry (no recursion limit);
    # not at all when some variable has no event to bind
    stack: list[Iterator[tuple[int, int, int]]] = [roots()] if entries and seen & everyone == everyone else []
    bound: list[int] = []  # the variable each frame above the root appended to
    while stack:
        step_ = next(stack[-1], None)
        if step_ is None:
            stack.pop()
            if bound:
                binds[bound.pop()].pop()
            continue
        i, j, block = step_
        spend()
        binds[i].append(entries[j][0])
        frame = reached(j, block)
        if frame is None:
            binds[i].pop()
        else:
            bound.append(i)
            stack.append(frame)
    return out


def _state(plan: SetPlan, i: int, events: list[Event]) -> Any:
    """Variable i's slot of the computation-state vector: its Event, or a KleeneState keeping its events."""
    if not plan.kleene[i]:
        return events[0]
    ks = kleene_start(events[0], plan.agg_slots[i], True)
    for e in events[1:]:
        ks = kleene_take(ks, e, plan.agg_slots[i])
    return ks


def state_vector(plan: SetPlan, binding: Binding) -> tuple:
    """The computation-state vector ``yfpp.predicates`` reads: an Event or a KleeneState per variable."""
    return tuple(_state(plan, i, events) for i, events in enumerate(binding))


def accepts(plan: SetPlan, binding: Binding, check_keys: bool = False, entries: list[tuple[Event, int]] = (),
            trailing: bool = False) -> bool:
    """Condition 1 for what :func:`search` has not checked on the way, and the negations
    (no witness among ``entries`` between their two sets; ``trailing``: also none after
    the last set within τ of the first event — ``entries`` then hold every such event)."""
    if check_keys and plan.partition_by:
        keys = {key_of(e, plan.partition_by) for events in binding for e in events}
        if len(keys) > 1:
            return False
    negations = plan.negations if trailing else plan.middle
    if not plan.final and not plan.iter_final and not negations:
        return True
    vec = state_vector(plan, binding)
    if not all(c(None, vec) for c in plan.final):
        return False
    for i, check in plan.iter_final:
        events = binding[i]
        for n in range(1, len(events)):
            cut = list(vec)
            cut[i] = KleeneState(events[0], events[n - 1], n, (), None)
            if not check(events[n], tuple(cut)):
                return False
    first_ts = min(e.ts for events in binding for e in events)
    for neg in negations:
        lo = max(e.pos for i in plan.blocks[neg.after] for e in binding[i])
        if neg.after + 1 < len(plan.blocks):
            hi = min(e.pos for i in plan.blocks[neg.after + 1] for e in binding[i])
        else:
            hi = float("inf")
        key = key_of(binding[0][0], plan.partition_by)
        for ev, _ in entries:
            if (
                lo < ev.pos < hi
                and not _passed(ev.ts, first_ts, plan.window)
                and neg.witness(ev)
                and key_of(ev, plan.partition_by) == key
                and all(c(ev, vec) for c in neg.cross)
            ):
                return False
    return True


def keeps(plan: SetPlan, ev: Event, bits: int) -> bool:
    """Must ``ev`` be buffered: can it bind a variable or witness a negation?"""
    return bool(bits) or any(n.witness(ev) for n in plan.negations)


def to_match(plan: SetPlan, binding: Binding) -> dict:
    """A match in the docs/semantics.md §10 form."""
    seqs = {}
    ints = True  # every seq an int (an input event's)
    first = last = binding[0][0]
    for v, events in zip(plan.vars, binding):
        seqs[v] = got = []
        for e in events:
            s = e.seq
            got.append(s)
            if type(s) is not int:
                ints = False
            if e.pos < first.pos:
                first = e
            elif e.pos > last.pos:
                last = e
    m = {"query": plan.name, "id": plan.ident(seqs, ints, first.ts, last.ts), "bindings": seqs, "start": first.ts,
         "end": last.ts}
    if plan.emit is not None:
        vec = state_vector(plan, binding)
        etype, attrs = plan.emit
        m["emit"] = {"type": etype, "attrs": {k: _plain(g(None, vec)) for k, g in attrs}}
    if plan.full_events:
        m["events"] = {v: [e.describe() for e in events] for v, events in zip(plan.vars, binding)}
    return m


def _plain(v: Any) -> Any:
    return None if v is MISSING else v


def earliest_maximal(plan: SetPlan, group: list[Binding]) -> list[Binding]:
    """The paper's earliest and maximal matches among ``group``: all matches with one first event.

    Earliest: no match of the group binds every variable's first event at or
    before this one's and one strictly before.  Maximal: no match of the group
    equals this one but for one Kleene variable that has one event more.
    """
    seqs = [tuple(tuple(e.pos for e in events) for events in b) for b in group]
    firsts = [tuple(s[0] for s in g) for g in seqs]
    present = set(seqs)
    out = []
    for b, g, f in zip(group, seqs, firsts):
        if any(o != f and all(x <= y for x, y in zip(o, f)) for o in firsts):
            continue
        if _extendable(plan, g, present):
            continue
        out.append(b)
    return out


def _extendable(plan: SetPlan, g: tuple, present: set) -> bool:
    for i, mine in enumerate(g):
        if not plan.kleene[i]:
            continue
        for h in present:
            if len(h[i]) == len(mine) + 1 and set(mine) <= set(h[i]) and all(h[j] == g[j] for j in range(len(g)) if j != i):
                return True
    return False


# --- strategies ------------------------------------------------------------------------------


def _passed(now: float, first_ts: float, tau: float) -> bool:
    """Has the stream passed first_ts + τ?  Written as the window test ``ts − first.ts > τ``
    everywhere, so that float rounding cannot let the two disagree."""
    return now == float("inf") or now - first_ts > tau


def _pos(e: Event) -> int:
    return e.pos


def rank(binding: Binding) -> tuple:
    """docs/semantics.md §6's order among matches completing together: by their events' stream positions."""
    flat = sorted(e.pos for events in binding for e in events)
    return (flat, [[e.pos for e in events] for events in binding])


@dataclass
class Limits:
    """A set query's caps (docs/operations.md) and what it tells the Engine: ``max_runs`` partial
    substitutions per search and matches held for ``earliest_maximal``, ``max_buffer`` buffered events;
    ``shed(query, n, report)`` counts what a cap dropped (``report``: a line to print, or None),
    ``matched(query, n)`` the matches it put out."""

    max_runs: int
    max_buffer: int
    shed: Callable[[Any, int, str | None], None]
    matched: Callable[[Any, int], None] | None = None


#: Matches made into dicts and handed to ``out.extend`` at once: what a matcher holds of a release beyond
#: the bindings of one search (which ``max_runs_per_query`` bounds) — not the event's whole release.
EMIT_CHUNK = 1024


class _Held:
    """Matches waiting until the stream passes their first event's τ (earliest_maximal)."""

    def __init__(self, plan: SetPlan):
        self.plan = plan
        self.groups: dict[int, list[Binding]] = {}  # by the pos of their first event
        self.heap: list[tuple[float, int]] = []
        self.size = 0  # matches held

    def add(self, bindings: Iterable[Binding]) -> None:
        for b in bindings:
            first = min((e for events in b for e in events), key=_pos)
            if first.pos not in self.groups:
                self.groups[first.pos] = []
                heapq.heappush(self.heap, (first.ts, first.pos))
            self.groups[first.pos].append(b)
            self.size += 1

    def pop_due(self, now: float) -> list[Binding] | None:
        """The earliest group whose window ended before ``now`` (``inf``: any), taken out; None if there is none."""
        if not (self.heap and _passed(now, self.heap[0][0], self.plan.window)):
            return None
        _, pos = heapq.heappop(self.heap)
        group = self.groups.pop(pos)
        self.size -= len(group)
        return group

    def shed(self, target: int) -> int:
        """Drop the groups of the oldest first events until at most ``target`` matches are held."""
        n = 0
        while self.size > target:
            _, pos = heapq.heappop(self.heap)
            group = self.groups.pop(pos)
            self.size -= len(group)
            n += len(group)
        return n


@dataclass
class PendingMatch:
    """A match waiting for its trailing negations' deadline (first.ts + τ)."""

    binding: Binding
    vec: tuple
    key: Any  # the partition (equivalence list) of its events
    last_pos: int
    first_ts: float
    killed: bool = False


class _Matcher:
    """What both strategies share: the plan, caps, counters, putting matches out."""

    held: _Held | None  # earliest_maximal matches waiting for their first event's τ (DirectMatcher)

    def __init__(self, plan: SetPlan, limits: Limits | None = None):
        self.plan = plan
        self.limits = limits
        self.counters: dict[str, int] = {"matcher_calls": 0}
        self.reported = False  # the first shed of this query is reported
        self.tick = 0  # positions given to events fed without an Engine
        self.fed: list[tuple[dict, tuple]] = []  # a feedback query's matches and their rank, drained by the Engine

    def _position(self, ev: Event) -> None:
        """Events through an Engine have their stream position from its runtime; number the others."""
        if ev.pos < 0:
            self.tick += 1
            ev.pos = self.tick

    def _search(self, entries: list[tuple[Event, int]], forward: bool, check_keys: bool = False) -> list[Binding]:
        """:func:`search` within ``max_runs_per_query`` partial substitutions; over it, none of its matches."""
        self.counters["matcher_calls"] += 1
        budget = self.limits.max_runs if self.limits is not None else None
        try:
            return search(self.plan, entries, forward, check_keys, budget)
        except OverBudget:
            at = entries[0][0].seq
            self._shed(budget, f"over max_runs_per_query={budget:,}; gave up the search for the matches "  # type: ignore[arg-type]
                               f"{'starting' if forward else 'ending'} at seq {at} after {budget:,} steps (partial matches tried, "
                               "events of the matches found)")
            return []

    def _shed(self, n: int, why: str) -> None:
        assert self.limits is not None
        line = None
        if not self.reported:
            self.reported = True
            line = f"query {self.plan.name!r}: {why}; those matches are lost (counted in the stats)"
        self.limits.shed(self.plan.name, n, line)

    def _put(self, bindings: list[Binding], out: Out) -> None:
        """``bindings`` as matches into ``out``, :data:`EMIT_CHUNK` at a time (counted, and kept for feedback)."""
        plan, limits = self.plan, self.limits
        for i in range(0, len(bindings), EMIT_CHUNK):
            part = bindings[i:i + EMIT_CHUNK] if len(bindings) > EMIT_CHUNK else bindings
            ms = [to_match(plan, b) for b in part]
            if plan.pattern.feedback:
                self.fed += zip(ms, map(rank, part))
            if limits is not None and limits.matched is not None:
                limits.matched(plan.name, len(ms))
            out.extend(ms)


class DirectMatcher(_Matcher):
    """Eager evaluation: search at every event that can end a match.

    Events are kept per partition of Definition 6's attributes (exact, as a
    match's events share them), so the search never mixes partitions.  A
    match of a pattern with a trailing negation waits, as in the runtime,
    until the stream passes its first event's τ; an event that witnesses the
    negation before then kills it.  ``non_overlapping``: of the matches an
    event completes in its partition, the first by :func:`rank`, if it starts
    after the previous chosen match of that partition ended.
    """

    SWEEP_EVERY = 1024

    def __init__(self, plan: SetPlan, limits: Limits | None = None):
        super().__init__(plan, limits)
        self.held = _Held(plan) if plan.policy == "earliest_maximal" else None
        self.buffers: dict[Any, deque[tuple[Event, int]]] = {}
        self.size = 0  # events buffered, in all partitions
        self._events = 0
        self._swept = 0  # _events at the last sweep
        self.cuts: dict[Any, tuple[int, float]] = {}  # non_overlapping: partition -> (pos, ts) of the last chosen match's end
        self.pending: dict[Any, list[PendingMatch]] = {}  # trailing negations: matches by partition
        self.deadlines: list[tuple[float, int, PendingMatch]] = []  # (first.ts, order, pending)
        self.next_order = 0

    def process(self, ev: Event, out: Out | None = None) -> Out:
        """Take ``ev``: its matches (and those whose trailing negation's τ it passes) into ``out`` (None: a new
        list), returned."""
        self._position(ev)
        if out is None:
            out = []
        plan = self.plan
        self._events += 1
        if self._events % self.SWEEP_EVERY == 0:
            self._sweep(ev.ts)
        found = self._expire(ev.ts) if self.deadlines else []
        if self.pending:
            self._kill(ev)
        bits = event_bits(plan, ev)
        if not keeps(plan, ev, bits):
            return self._emit(found, ev.ts, out)
        key = key_of(ev, plan.eq_attrs)
        if key is MISSING:
            return self._emit(found, ev.ts, out)  # lacks an attribute every event of a match must share
        buf = self.buffers.get(key)
        if buf is None:
            buf = self.buffers[key] = deque()
        while buf and ev.ts - buf[0][0].ts > plan.window:
            buf.popleft()
            self.size -= 1
        if bits & plan.block_mask[-1]:
            new = self._complete(ev, bits, buf)
            if plan.trailing:
                self._pend(new)
            else:
                found += new
        buf.append((ev, bits))
        self.size += 1
        if self.limits is not None and self.size > self.limits.max_buffer:
            cap = self.limits.max_buffer
            if self._events - self._swept >= cap // 4:  # events older than τ first: they count for nothing
                self._sweep(ev.ts)  # (a pass over the partitions: at most once per quarter cap of events)
            if self.size > cap:
                self._shed_buffer()
        return self._emit(found, ev.ts, out)

    def _emit(self, bindings: list[Binding], now: float, out: Out) -> Out:
        """``bindings`` into ``out`` — under ``earliest_maximal`` through the holding area, whose groups
        ``now`` completes go out, one group at a time."""
        if self.held is None:
            if bindings:
                self._put(bindings, out)
            return out
        self.held.add(bindings)
        cap = self.limits.max_runs if self.limits is not None else None
        if cap is not None and self.held.size > cap:
            n = self.held.shed(cap * 3 // 4)
            self._shed(n, f"over max_runs_per_query={cap:,}; dropped {n:,} matches held for earliest_maximal "
                          "(those of the oldest first events)")
        while (group := self.held.pop_due(now)) is not None:
            self._put(earliest_maximal(self.plan, group), out)
        return out

    def _complete(self, ev: Event, bits: int, buf: deque) -> list[Binding]:
        """The matches ``ev`` completes, by policy."""
        entries = [(ev, bits)] + list(reversed(buf))
        if self.plan.policy != "non_overlapping":
            return self._search(entries, forward=False)
        pkey = key_of(ev, self.plan.partition_by)
        cut = self.cuts.get(pkey, (-1, 0.0))[0]
        found = self._search([e for e in entries if e[0].pos > cut], forward=False)
        if not found:
            return []
        self.cuts[pkey] = (ev.pos, ev.ts)
        return [min(found, key=rank)]

    def _pend(self, bindings: list[Binding]) -> None:
        plan = self.plan
        for b in bindings:
            flat = [e for events in b for e in events]
            first, last = min(flat, key=_pos), max(flat, key=_pos)
            p = PendingMatch(b, state_vector(plan, b), key_of(first, plan.partition_by), last.pos, first.ts)
            self.pending.setdefault(p.key, []).append(p)
            heapq.heappush(self.deadlines, (first.ts, self.next_order, p))
            self.next_order += 1
        if self.limits is not None and len(self.deadlines) > self.limits.max_runs:
            self._shed_pending()

    def _shed_pending(self) -> None:
        """Over ``max_runs_per_query`` matches waiting for a trailing negation's τ: drop the oldest (by first
        event), down to three quarters of the cap."""
        cap = self.limits.max_runs  # type: ignore[union-attr]
        n = 0
        while len(self.deadlines) > cap * 3 // 4:
            p = heapq.heappop(self.deadlines)[2]
            group = self.pending[p.key]
            group.remove(p)
            if not group:
                del self.pending[p.key]
            n += 1
        self._shed(n, f"over max_runs_per_query={cap:,}; dropped {n:,} matches waiting for the trailing negation's "
                      "window (the oldest)")

    def _kill(self, ev: Event) -> None:
        """``ev`` witnesses a trailing negation of the pending matches of its partition it follows within τ."""
        plan = self.plan
        for neg in plan.trailing:
            if not neg.witness(ev):
                continue
            for p in self.pending.get(key_of(ev, plan.partition_by), ()):
                if (not p.killed and ev.pos > p.last_pos and not _passed(ev.ts, p.first_ts, plan.window)
                        and all(c(ev, p.vec) for c in neg.cross)):
                    p.killed = True

    def _expire(self, now: float) -> list[Binding]:
        """The pending matches whose deadline ``now`` passed, and not killed."""
        out = []
        while self.deadlines and _passed(now, self.deadlines[0][0], self.plan.window):
            p = heapq.heappop(self.deadlines)[2]
            group = self.pending[p.key]
            group.remove(p)
            if not group:
                del self.pending[p.key]
            if not p.killed:
                out.append(p.binding)
        return out

    def advance_time(self, ts: float, out: Out | None = None) -> Out:
        return self._emit(self._expire(ts), ts, [] if out is None else out)

    def flush(self, out: Out | None = None) -> Out:
        return self._emit(self._expire(float("inf")), float("inf"), [] if out is None else out)

    def _sweep(self, now: float) -> None:
        """Forget the buffered events older than τ before ``now`` (no later match can use them)."""
        self._swept = self._events
        window = self.plan.window
        for key in list(self.buffers):
            buf = self.buffers[key]
            while buf and now - buf[0][0].ts > window:
                buf.popleft()
                self.size -= 1
            if not buf:
                del self.buffers[key]
        for key in [k for k, (_, ts) in self.cuts.items() if now - ts > self.plan.window]:
            del self.cuts[key]  # every later match starts after it

    def _shed_buffer(self) -> None:
        """Over ``max_buffer_per_query``: drop the oldest buffered events, down to three quarters of the cap."""
        cap = self.limits.max_buffer  # type: ignore[union-attr]
        positions = sorted(ev.pos for buf in self.buffers.values() for ev, _ in buf)
        cut = positions[len(positions) - cap * 3 // 4 - 1]
        n = 0
        for key in list(self.buffers):
            buf = self.buffers[key]
            while buf and buf[0][0].pos <= cut:
                buf.popleft()
                n += 1
            if not buf:
                del self.buffers[key]
        self.size -= n
        self._shed(n, f"over max_buffer_per_query={cap:,}; shed {n:,} buffered events (the oldest); "
                      "matches that would have used them are lost")

    def stats(self) -> dict[str, int]:
        return {"matcher calls": self.counters["matcher_calls"]}


class SummaryStatistics:
    """Definition 5's counters over a match window, kept as in the paper's §5.

    ``cnt[i]`` counts the window's events that satisfy variable i's properties
    and, for i in Bj (j > 1), arrived while every variable of Bj-1 had a
    non-zero counter.  ``s`` is the paper's s̄ (bit 1: counter zero); an event
    counts for i when ``s & prev_mask[block(i)] == 0``.  Dequeuing the first
    event decrements what it counted; a counter of Bj that drops to zero
    resets those of every later set (their events can no longer follow one of
    Bj).  The counters never undercount, so "all counters > 0" (``s == 0``) is
    a necessary condition for a match (Theorem 3), also when they overcount.
    """

    def __init__(self, plan: SetPlan):
        self.plan = plan
        self.cnt = [0] * plan.m
        self.s = (1 << plan.m) - 1
        self.epoch = [0] * len(plan.blocks)

    def add(self, bits: int) -> tuple[tuple[int, int], ...]:
        """Count an enqueued event; return what it counted, as (variable, epoch of its set)."""
        plan, s0 = self.plan, self.s
        counted = []
        for i in range(plan.m):
            if bits & plan.bit[i]:
                b = plan.block_of[i]
                if not s0 & plan.prev_mask[b]:
                    self.cnt[i] += 1
                    self.s &= ~plan.bit[i]
                    counted.append((i, self.epoch[b]))
        return tuple(counted)

    def remove(self, counted: tuple[tuple[int, int], ...]) -> None:
        """Uncount a dequeued event."""
        plan = self.plan
        for i, epoch in counted:
            b = plan.block_of[i]
            if epoch != self.epoch[b]:
                continue  # reset since it was counted
            self.cnt[i] -= 1
            if self.cnt[i] == 0:
                self.s |= plan.bit[i]
                for later in range(b + 1, len(plan.blocks)):
                    self.epoch[later] += 1
                    for j in plan.blocks[later]:
                        self.cnt[j] = 0
                        self.s |= plan.bit[j]

    def counters(self) -> dict[str, int]:
        return dict(zip(self.plan.vars, self.cnt))


@dataclass
class MatchWindow:
    """One partition's buffered events within τ of the first, with their summary statistics."""

    stats: SummaryStatistics
    entries: deque = field(default_factory=deque)  # (event, bits, counted)
    due: int = -1  # the order of its entry in the matcher's deadline heap

    def add(self, ev: Event, bits: int) -> None:
        self.entries.append((ev, bits, self.stats.add(bits)))

    def pop(self) -> None:
        self.stats.remove(self.entries.popleft()[2])

    def conditions(self, plan: SetPlan) -> tuple[bool, bool, bool]:
        """Theorem 2 for the first event: (4) |W| ≥ m, (5) it can bind a variable
        of B1, (6)+(7) by Theorem 3: every summary counter is above zero."""
        return len(self.entries) >= plan.m, bool(self.entries[0][1] & plan.block_mask[0]), self.stats.s == 0


class MatchWindowMatcher(_Matcher):
    """The two-phase strategy; ``filtering``, ``partitioning`` and ``conditions`` switch its prunings."""

    def __init__(self, plan: SetPlan, *, filtering: bool = True, partitioning: bool = True, conditions: bool = True,
                 limits: Limits | None = None):
        super().__init__(plan, limits)
        self.filtering = filtering
        self.conditions = conditions
        self.key_attrs = plan.eq_attrs if partitioning else ()
        self.windows: dict[Any, MatchWindow] = {}
        self.deadlines: list[tuple[float, int, Any]] = []  # (first.ts of a window, order, key)
        self.next_order = 0
        self.size = 0  # events buffered, in all windows
        self.counters.update(windows_seen=0, candidate_windows=0, events_filtered=0)
        self.trace: list[tuple[list[Event], tuple[bool, bool, bool]]] | None = None  # set to a list to record windows
        # a window's search finds every match that starts at its first event: earliest_maximal is applied to
        # them then, and nothing is held
        self.held = None
        self.maximal = plan.policy == "earliest_maximal"

    def process(self, ev: Event, out: Out | None = None) -> Out:
        """Take ``ev``: the matches of the windows it completes into ``out`` (None: a new list), returned."""
        self._position(ev)
        if out is None:
            out = []
        self._close(ev.ts, out)
        bits = event_bits(self.plan, ev)
        key = key_of(ev, self.key_attrs)
        if (self.filtering and not keeps(self.plan, ev, bits)) or key is MISSING:
            self.counters["events_filtered"] += 1
            return out
        w = self.windows.get(key)
        if w is None:
            w = self.windows[key] = MatchWindow(SummaryStatistics(self.plan))
        if not w.entries:
            self._schedule(w, ev.ts, key)
        w.add(ev, bits)
        self.size += 1
        if self.limits is not None and self.size > self.limits.max_buffer:
            self._shed_buffer()
        return out

    def _schedule(self, w: MatchWindow, first_ts: float, key: Any) -> None:
        w.due = self.next_order
        self.next_order += 1
        heapq.heappush(self.deadlines, (first_ts, w.due, key))

    def advance_time(self, ts: float, out: Out | None = None) -> Out:
        out = [] if out is None else out
        self._close(ts, out)
        return out

    def flush(self, out: Out | None = None) -> Out:
        return self.advance_time(float("inf"), out)

    def _close(self, now: float, out: Out) -> None:
        """Complete every window whose τ ended before ``now``, one first event at a time: the matches that
        start at it (its search's) go into ``out`` before the next one is searched, so a release holds one
        search's matches, however many windows ``now`` completes."""
        tau = self.plan.window
        due: list[tuple[Any, MatchWindow]] = []
        while self.deadlines and _passed(now, self.deadlines[0][0], tau):
            _, order, key = heapq.heappop(self.deadlines)
            w = self.windows.get(key)
            if w is not None and w.due == order:  # (else its window was shed over a cap)
                due.append((key, w))
        if not due:
            return
        try:
            for w in self._firsts([w for _, w in due], now):
                found = self._complete(w)
                w.pop()
                self.size -= 1
                if found:
                    self._put(earliest_maximal(self.plan, found) if self.maximal else found, out)
        finally:  # (also when out.extend raised: each window is left whole, what it has left still due)
            for key, w in due:
                if w.entries:
                    self._schedule(w, w.entries[0][0].ts, key)
                else:
                    del self.windows[key]

    def _firsts(self, windows: list[MatchWindow], now: float) -> Iterator[MatchWindow]:
        """Each due window once per first event to complete (the caller pops it), in output order: window
        after window, in deadline order; under ``earliest_maximal``, the first events in stream order
        (ts, then position) across the windows."""
        tau = self.plan.window

        def first_due(w: MatchWindow) -> bool:
            return bool(w.entries) and _passed(now, w.entries[0][0].ts, tau)

        if not self.maximal:
            for w in windows:
                while first_due(w):
                    yield w
            return
        heap = [(w.entries[0][0].ts, w.entries[0][0].pos, i) for i, w in enumerate(windows) if first_due(w)]
        heapq.heapify(heap)
        while heap:
            i = heapq.heappop(heap)[2]
            w = windows[i]
            yield w
            if first_due(w):
                heapq.heappush(heap, (w.entries[0][0].ts, w.entries[0][0].pos, i))

    def _complete(self, w: MatchWindow) -> list[Binding]:
        c = self.counters
        c["windows_seen"] += 1
        met = w.conditions(self.plan)
        if self.trace is not None:
            self.trace.append(([ev for ev, _, _ in w.entries], met))
        if self.conditions and not all(met):
            return []
        c["candidate_windows"] += 1
        entries = [(ev, bits) for ev, bits, _ in w.entries]
        return self._search(entries, forward=True, check_keys=not set(self.plan.partition_by) <= set(self.key_attrs))

    def _shed_buffer(self) -> None:
        """Over ``max_buffer_per_query``: drop the oldest buffered events (uncompleted), down to three quarters of the cap."""
        cap = self.limits.max_buffer  # type: ignore[union-attr]
        positions = sorted(ev.pos for w in self.windows.values() for ev, _, _ in w.entries)
        cut = positions[len(positions) - cap * 3 // 4 - 1]
        n = 0
        for key in list(self.windows):
            w = self.windows[key]
            before = len(w.entries)
            while w.entries and w.entries[0][0].pos <= cut:
                w.pop()
            n += before - len(w.entries)
            if not w.entries:
                del self.windows[key]
            elif len(w.entries) < before:
                self._schedule(w, w.entries[0][0].ts, key)  # its old deadline is stale now
        self.size -= n
        self._shed(n, f"over max_buffer_per_query={cap:,}; shed {n:,} buffered events (the oldest); "
                      "matches that would have used them are lost")

    def stats(self) -> dict[str, int]:
        c = self.counters
        return {
            "windows seen": c["windows_seen"],
            "candidate windows": c["candidate_windows"],
            "matcher calls": c["matcher_calls"],
            "events filtered": c["events_filtered"],
        }


SetMatcher = DirectMatcher | MatchWindowMatcher


def set_matcher(pattern: Pattern, name: str | int, strategy: str = "direct", limits: Limits | None = None,
                **switches: bool) -> SetMatcher:
    """The matcher of a set query for an evaluation strategy (``direct`` or ``match-window``).

    A feedback or ``non_overlapping`` query is evaluated directly under either
    strategy: its output depends on the event at which each match completes.
    """
    if strategy not in STRATEGIES:
        raise YfppError(f"unknown evaluation strategy {strategy!r} (expected one of {', '.join(STRATEGIES)})")
    plan = compile_sets(pattern, name)
    if strategy == "direct" or pattern.feedback or pattern.policy == "non_overlapping":
        return DirectMatcher(plan, limits)
    return MatchWindowMatcher(plan, limits=limits, **switches)
