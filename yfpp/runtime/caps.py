"""Per-branch caps on live runs and buffered events, and shedding the oldest runs over a cap.

A branch is the part of the shared NFA under one first component: the
queries in it share its runs, so a run is counted once, in its branch, and
shedding it affects every query of the branch (all are named in the report).
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

from yfpp.runtime.pruning import drop_empty_keys
from yfpp.runtime.runs import NO_RUN, Run
from yfpp.nfa.shared_nfa import Node, State

if TYPE_CHECKING:
    from yfpp.runtime.runtime import Runtime


def shed(rt: Runtime, root: Node, what: str, cap: int) -> None:
    """Over a cap: drop the runs of the branch's oldest start events until it is at 3/4 of the cap.

    Runs go by start event, oldest first, all runs of one start together:
    every match still reported is a true match, and the matches lost are
    exactly those starting at the shed events.
    """
    if rt.merger is not None:
        rt.merger.split_branch(rt, root)  # merged runs back into their members: shedding goes by start event
    where = _branch_runs(rt, root)
    starts = sorted({r.first_pos for store, st in where for r in store[st]})
    target = cap * 3 // 4
    if what == "runs":
        by_start = Counter(r.first_pos for store, st in where for r in store[st])
        left, cut = root.live, 0
        for p in starts:
            if left <= target:
                break
            left -= by_start[p]
            cut = p + 1
    else:  # buffer: drop start events until the branch's buffer (pruned to the new floor) fits
        cut = 0
        for p in starts + [NO_RUN]:
            cut = p
            if _buffered(rt, root, cut) <= target:
                break
    gone = 0
    for store, st in where:
        runs = store[st]
        kept = [r for r in runs if r.first_pos >= cut]
        gone += len(runs) - len(kept)
        if kept:
            store[st] = kept
        else:
            del store[st]
    drop_empty_keys(rt)
    root.live -= gone
    rt.counters.live_runs -= gone
    new_floor = min((r.first_pos for store, st in where if st in store for r in store[st]), default=NO_RUN)
    for node in rt.buffer.stacks():
        if node.root is root:
            rt.buffer.prune_before(node, new_floor)
    rt.negations.prune({root: new_floor}, only=root)
    if not gone:
        return
    plans = rt.branch_queries.get(root, [])
    for plan in plans:
        rt.counters.shed_runs[plan.name] += gone
    if not root.shed:
        names = ", ".join(repr(str(p.name)) for p in plans)
        limit = f"max_runs_per_query={cap:,}" if what == "runs" else f"max_buffer_per_query={cap:,}"
        rt.report(f"query {names}: over {limit}; shed {gone:,} runs (the oldest start events); "
                  "matches starting at shed events are lost (counted in the stats)")
    root.shed += gone


def check_buffer_caps(rt: Runtime) -> None:
    """Shed in every branch whose buffered events are over ``max_buffer``."""
    cap = rt.max_buffer
    sizes: Counter = Counter()
    for node in rt.buffer.stacks():
        sizes[node.root] += rt.buffer.count_from(node, 0)
    for root, n in sizes.items():
        if n > cap:
            shed(rt, root, "buffer", cap)


def _branch_runs(rt: Runtime, root: Node) -> list[tuple[dict[State, list[Run]], State]]:
    """The stores and states of ``root``'s branch that hold runs."""
    found = []
    for store in rt._stores():
        for st in store:
            if st.node.root is root:
                found.append((store, st))
    return found


def _buffered(rt: Runtime, root: Node, floor: int = 0) -> int:
    """Buffer entries of ``root``'s branch at stream position ``floor`` or later."""
    return sum(rt.buffer.count_from(node, floor) for node in rt.buffer.stacks() if node.root is root)
