"""The matcher A: every Definition 2 substitution binding a given first or last event, the accept test
and the match dict of a binding."""

from __future__ import annotations

from typing import Any, Iterator

from yfpp.input.events import MISSING, Event
from yfpp.nfa.predicates import KleeneState, compare_fn, kleene_start, kleene_take
from yfpp.sets.plan import Binding, SetPlan, key_of

_equal = compare_fn("=")



# --- the matcher A: every substitution over a list of events ----------------------------------


def window_passed(now: float, first_ts: float, tau: float) -> bool:
    """Has the stream passed first_ts + τ?  Written as the window test ``ts − first.ts > τ``
    everywhere, so that float rounding cannot let the two disagree."""
    return now == float("inf") or now - first_ts > tau


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
    """The computation-state vector ``yfpp.nfa.predicates`` reads: an Event or a KleeneState per variable."""
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
                and not window_passed(ev.ts, first_ts, plan.window)
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
