"""Selection policies among matches completing on the same event (docs/semantics.md §6).

``all`` (the default) emits every match.  ``non_overlapping`` emits, per query
and key, the first match in the order of :func:`overlap_rank` and drops every
run of that query and key: the next match starts after this one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from yfpp.input.events import Event
from yfpp.nfa.compiler import QueryPlan
from yfpp.runtime.runs import Run

if TYPE_CHECKING:
    from yfpp.runtime.runtime import Runtime


def accept(rt: Runtime, accepted: list[tuple[QueryPlan, Any, dict, list]], fresh: list[Run]) -> list[dict]:
    """The matches ``accepted`` on one event that their queries' policies emit."""
    out: list[dict] = []
    chosen: dict[tuple[int, Any], tuple[QueryPlan, dict, tuple, list]] = {}
    for plan, key, m, binds in accepted:
        if plan.policy == "non_overlapping":
            rank = overlap_rank(len(plan.var_names), binds)
            cur = chosen.get((id(plan), key))
            if cur is None or rank < cur[2]:
                chosen[(id(plan), key)] = (plan, m, rank, binds)
        else:
            rt._emitted(plan, m, binds, out)
    for (_, key), (plan, m, _, binds) in chosen.items():
        rt._emitted(plan, m, binds, out)
        _discard(rt, plan, key, fresh)
    return out


def _discard(rt: Runtime, plan: QueryPlan, key: Any, fresh: list[Run]) -> None:
    """non_overlapping: drop every run of ``plan``'s partition ``key`` (all began at or before now).

    Such a query's nodes are private to it (its signature includes the query)."""
    nodes = set(plan.nodes)
    root = plan.last.root
    gone = 0
    for st, runs in list(rt.strict.items()):
        if st.node in nodes:
            kept = [r for r in runs if plan.partition_by and r.key != key]
            gone += len(runs) - len(kept)
            rt.strict[st] = kept
    if plan.partition_by:
        states = rt.keyed[plan.partition_by].get(key, {})
        for st in [s for s in states if s.node in nodes]:
            gone += len(states.pop(st))
    else:
        for st in [s for s in rt.unkeyed if s.node in nodes]:
            gone += len(rt.unkeyed.pop(st))
    rt.counters.live_runs -= gone
    root.live -= gone
    fresh[:] = [r for r in fresh if r.state.node not in nodes or (plan.partition_by and r.key != key)]


def overlap_rank(n_vars: int, binds: list[tuple[int, Event]]) -> tuple:
    """docs/semantics.md §6's order among matches completing together, by stream position (binds are in stream order)."""
    flat = [e.pos for _, e in binds]
    lists: list[list[int]] = [[] for _ in range(n_vars)]
    for unit, e in binds:
        lists[unit].append(e.pos)
    return (flat[0], flat, lists)
