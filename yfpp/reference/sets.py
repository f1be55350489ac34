"""The reference evaluator of event-set patterns (docs/event_sets.md) — a test oracle.

Definition 2 of the match-windows paper, read literally: try every way of
giving each event in stream order to one variable or to none, keep the
assignments in which every variable got an event, the sets come one after
another and all events lie within τ, then interpret every WHERE conjunct
over the whole substitution.  It shares the expression interpreter of
``yfpp.reference.evaluator`` and nothing of the engine.  Exponential on purpose.
"""

from __future__ import annotations

from typing import Any

from yfpp.input.events import Event
from yfpp.language.pattern import Aggregate, Index, Length, Kind, Pattern, Ref, variables, walk
from yfpp.reference.evaluator import Env, holds, non_overlapping, partition_of

Seqs = dict[str, list[int]]


def _substitutions(p: Pattern, events: list[Event]) -> list[dict[str, list[Event]]]:
    comps = p.positives
    block = {c.var: b for b, members in enumerate(p.blocks) for c in members}
    out: list[dict[str, list[Event]]] = []

    def key(e: Event) -> Any:
        return partition_of(e, p.partition_by)

    def go(i: int, binds: dict[str, list[Event]], current: int) -> None:
        if i == len(events):
            if len(binds) == len(comps):
                out.append(binds)
            return
        go(i + 1, binds, current)
        e = events[i]
        flat = [x for es in binds.values() for x in es]
        if flat and e.ts - min(x.ts for x in flat) > p.window:
            return
        if p.partition_by and (key(e) is None or (flat and key(e) != key(flat[0]))):
            return
        for c in comps:
            if c.event_type is not None and c.event_type != e.type:
                continue
            if c.var in binds and c.kind is not Kind.KLEENE:
                continue
            b = block[c.var]
            done = all(m.var in binds for m in p.blocks[current]) if current >= 0 else True
            if b == current or (b == current + 1 and done):
                go(i + 1, {**binds, c.var: binds.get(c.var, []) + [e]}, b)

    go(0, {}, -1)
    return out


def _holds_everywhere(p: Pattern, binds: dict[str, list[Event]]) -> bool:
    """Condition 1: a property (one variable, each of its events) holds for every event of its
    variable; prev(v.x) for every two consecutive events of v; any other conjunct with each
    comparison ∀ over Kleene events (docs/semantics.md §4)."""
    kleene = {c.var for c in p.positives if c.kind is Kind.KLEENE}
    negated = {c.var for c in p.components if not c.positive}
    for conj in p.where:
        if variables(conj) & negated:
            continue
        prev = {n.var for n in walk(conj) if isinstance(n, Ref) and n.index is Index.PREV}
        vs = variables(conj)
        each = all(getattr(n, "index", Index.EACH) is Index.EACH and not isinstance(n, (Length, Aggregate)) for n in walk(conj))
        if len(vs) == 1 and each:
            (v,) = vs
            if not all(holds(conj, Env(binds, kleene, v, x, iterating=True)) for x in binds[v]):
                return False
            continue
        if not prev:
            if not holds(conj, Env(binds, kleene)):
                return False
            continue
        (v,) = prev
        for n in range(1, len(binds[v])):
            env = Env({**binds, v: binds[v][:n]}, kleene, v, binds[v][n], iterating=True)
            if not holds(conj, env):
                return False
    return True


def _witnessed(p: Pattern, binds: dict[str, list[Event]], events: list[Event]) -> bool:
    """docs/semantics.md §5 between sets: an event after the last of the set before ~n and before the
    first of the set after it (after the last set: within τ of the match's first event), of n's
    type, in the match's partition, satisfying n's conjuncts."""
    kleene = {c.var for c in p.positives if c.kind is Kind.KLEENE}
    block = {c.var: b for b, members in enumerate(p.blocks) for c in members}
    first = min((e for es in binds.values() for e in es), key=lambda e: e.seq)
    key = partition_of(first, p.partition_by)
    for k, n in enumerate(p.components):
        if n.positive:
            continue
        b = block[[c for c in p.components[:k] if c.positive][-1].var]
        lo = max(e.seq for c in p.blocks[b] for e in binds[c.var])
        hi = min(e.seq for c in p.blocks[b + 1] for e in binds[c.var]) if b + 1 < len(p.blocks) else float("inf")
        conjs = [c for c in p.where if n.var in variables(c)]
        for x in events:
            if not lo < x.seq < hi or (n.event_type is not None and x.type != n.event_type):
                continue
            if x.ts - first.ts > p.window:
                continue
            if partition_of(x, p.partition_by) != key:
                continue
            if all(holds(c, Env(binds, kleene, n.var, x)) for c in conjs):
                return True
    return False


def _earliest_maximal(p: Pattern, found: list[Seqs]) -> list[Seqs]:
    kleene = [c.var for c in p.positives if c.kind is Kind.KLEENE]
    out = []
    for g in found:
        start = min(s for v in g.values() for s in v)
        group = [h for h in found if min(s for v in h.values() for s in v) == start]
        earlier = any(
            h != g and all(h[v][0] <= g[v][0] for v in g) and any(h[v][0] < g[v][0] for v in g) for h in group
        )
        longer = any(
            all(h[u] == g[u] for u in g if u != v) and len(h[v]) == len(g[v]) + 1 and set(g[v]) <= set(h[v])
            for h in group
            for v in kleene
        )
        if not earlier and not longer:
            out.append(g)
    return out


def set_reference_matches(p: Pattern, events: list[Event]) -> list[tuple[Seqs, int]]:
    """(bindings as seq lists, seq of the last event) of every match of set pattern ``p``."""
    found = [
        {c.var: [e.seq for e in binds[c.var]] for c in p.positives}
        for binds in _substitutions(p, events)
        if _holds_everywhere(p, binds) and not _witnessed(p, binds, events)
    ]
    if p.policy == "earliest_maximal":
        found = _earliest_maximal(p, found)
    done = [(g, max(s for v in g.values() for s in v)) for g in found]
    if p.policy == "non_overlapping":
        first = {e.seq: e for e in events}
        keyed = [(g, at, partition_of(first[min(min(v) for v in g.values())], p.partition_by)) for g, at in done]
        return non_overlapping(keyed, [c.var for c in p.positives])
    return done
