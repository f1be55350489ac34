"""The runtime's periodic sweep: runs past their window or of removed queries go, and what no run can reach.

A sweep visits every stored run, and only what is stored (branches, buffer
stacks and negation stores that hold nothing are not looked at, however many
subscriptions are registered), so it is amortised: the next one waits at
least as many events as this one visited objects (``Runtime.SWEEP_EVERY`` at
the least).  It also reports branches without a window whose state keeps
growing (each doubling from ``Runtime.GROWTH_REPORT``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from yfpp.runtime.runs import NO_RUN
from yfpp.nfa.shared_nfa import Node

if TYPE_CHECKING:
    from yfpp.runtime.runtime import Runtime


def sweep(rt: Runtime) -> None:
    """Drop runs of removed states and past their window; prune what no run can reach."""
    now = rt.now
    floor: dict[Node, int] = {}
    per_root: dict[Node, int] = {}  # every branch that held a run before the sweep: its runs after it
    live = 0
    dead, merger = rt.dead, rt.merger
    for store in rt._stores():
        for st in list(store):
            if st in dead:
                del store[st]
                per_root.setdefault(st.node.root, 0)
                continue
            runs = store[st]
            w = st.node.window
            if w is not None:
                runs = [r for r in runs if now - r.first_ts <= w]
                if merger is not None:
                    runs = merger.trim(runs, now, w)  # a merged run's members expire one by one
                store[st] = runs
            root = st.node.root
            if not runs:
                del store[st]
                per_root.setdefault(root, 0)
                continue
            n = len(runs)
            live += n
            per_root[root] = per_root.get(root, 0) + n
            first = min([r.first_pos for r in runs]) if n > 1 else runs[0].first_pos
            if first < floor.get(root, NO_RUN):
                floor[root] = first
    drop_empty_keys(rt)
    dead.clear()
    counters = rt._counters
    counters.live_runs = live
    for root, n in per_root.items():  # (a branch holding no run has none to count: Node.live is exact)
        root.live = n
    stacks = rt.buffer.stacks()  # only stacks that hold entries: the cost follows live state
    buffered: dict[Node, int] = {}
    for node in stacks:
        root = node.root
        buffered[root] = buffered.get(root, 0) + rt.buffer.prune_before(node, floor.get(root, NO_RUN))
    buckets = rt.negations.prune(floor)
    if rt.buffer.size > counters.peak_buffer:
        counters.peak_buffer = rt.buffer.size
    _report_growth(rt, per_root, buffered)
    # amortised: the next sweep waits at least as many events as this one visited objects
    stores = len(rt.strict) + len(rt.unkeyed) + sum(len(b) for b in rt.keyed.values())
    work = live + stores + len(stacks) + len(rt.negations.holding) + buckets
    rt._next_sweep = rt.tick + max(rt.SWEEP_EVERY, work)


def drop_empty_keys(rt: Runtime) -> None:
    """Forget keys whose runs are all gone."""
    for by_key in rt.keyed.values():
        for k in [k for k, s in by_key.items() if not s]:
            del by_key[k]


def _report_growth(rt: Runtime, per_root: dict[Node, int], buffered: dict[Node, int]) -> None:
    """Say so when a branch some query of which has no window keeps growing (each doubling): the branches
    holding runs or buffered events are looked at, not every registered one."""
    for root in sorted(per_root.keys() | buffered.keys(), key=lambda n: n.id):  # (in the order they were made)
        plans = rt.branch_queries.get(root)
        if plans is None or root.window is not None:
            continue
        size = per_root.get(root, 0) + buffered.get(root, 0)
        if size < max(rt.GROWTH_REPORT, 2 * root.reported):
            continue
        root.reported = size
        names = ", ".join(repr(str(p.name)) for p in plans if p.window is None)
        rt.report(
            f"query {names} has no window (WITHIN) and its state is growing: {per_root.get(root, 0):,} runs, "
            f"{buffered.get(root, 0):,} buffered events; at max_runs_per_query={rt.max_runs:,} or "
            f"max_buffer_per_query={rt.max_buffer:,} its oldest runs will be shed"
        )
