"""Per-query caps on live runs and buffered events, and shedding a query's oldest runs over a cap.

Queries that begin alike share a branch of the shared NFA and the runs in
it, but the caps belong to each query: a query's matches never depend on
which other queries share its prefix.  A query *counts* a run when the run
waits in a state that leads to the query (inside one of its Kleene nodes,
or after one of its nodes for its next one), was born after the query's
``since_tick`` and is within its window; a run shared by several queries
counts once for each.  Those are exactly the runs the query would have
alone, so its count, and what is shed of it, is the same alone or beside
other queries.

Shedding goes by start event, oldest first, all runs of one start
together: a query over a cap gives up its runs born before a cut by raising
its ``since_tick`` to the cut (``Runtime._complete`` takes no match of a run
born at or before it), and a run is dropped when no query of its state
still counts it; a run another query still counts stays for that query.
Every match still reported is a true match, and the matches a query lost
are exactly those starting at the events shed for it.

The hot path counts the runs of a whole branch (``Node.live`` on its root):
a query counts no more than its branch holds, so a branch at or under the
cap has no query over it.  When the branch is over, :func:`shed` counts per
query; each run a query counts was created since (``Counters.runs_created``),
so until ``cap - most`` more runs are created (``most``: the largest count
left) no query can be over, and the branch is not counted again before.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

from yfpp.language.pattern import Contiguity
from yfpp.nfa.compiler import QueryPlan
from yfpp.nfa.shared_nfa import Node, State
from yfpp.runtime.pruning import drop_empty_keys
from yfpp.runtime.runs import NO_RUN, Run

if TYPE_CHECKING:
    from yfpp.runtime.runtime import Runtime

Store = dict[State, list[Run]]


def shed(rt: Runtime, root: Node, what: str, cap: int) -> None:
    """``root``'s branch is over ``cap`` (``what``: "runs" or "buffer"): shed each query of it over the cap to 3/4 of it.

    Over the runs cap, a query's oldest start events are given up until it counts at most 3/4 of the cap; over
    the buffer cap, until the buffer entries of its nodes from its oldest start left on are at most that."""
    if what == "runs" and rt.counters.runs_created < root.cap_check:
        return  # no query of the branch can be over the cap yet (see the module's docstring)
    if rt.merger is not None:
        rt.merger.split_branch(rt, root)  # merged runs back into their members: shedding goes by start event
    where = _branch_runs(rt, root)
    plans = rt.branch_queries.get(root, [])
    borns = _counted(rt, plans, where)
    target = cap * 3 // 4
    most = 0
    cuts: dict[QueryPlan, tuple[int, int]] = {}  # query -> (cut, runs it gives up)
    for plan in plans:
        mine = borns[plan]
        cut = _runs_cut(mine, cap, target) if what == "runs" else _buffer_cut(rt, plan, mine, cap, target)
        gone = sum(1 for b in mine if b < cut)
        if gone:
            cuts[plan] = (cut, gone)
        most = max(most, len(mine) - gone)
    if what == "runs":
        root.cap_check = rt.counters.runs_created + cap - most + 1
    if not cuts:
        return
    for plan, (cut, _) in cuts.items():
        plan.since_tick = max(plan.since_tick, min(cut - 1, rt.tick))
    _drop(rt, root, plans, where)
    for plan, (_, gone) in cuts.items():
        first = not rt.counters.shed_runs.get(plan.name)
        rt.counters.shed_runs[plan.name] += gone
        if first:
            limit = f"max_runs_per_query={cap:,}" if what == "runs" else f"max_buffer_per_query={cap:,}"
            rt.report(f"query {str(plan.name)!r}: over {limit}; shed {gone:,} runs (the oldest start events); "
                      "matches starting at shed events are lost (counted in the stats)")


def check_buffer_caps(rt: Runtime) -> None:
    """Shed in every branch whose buffered events are over ``max_buffer`` (its queries' are then counted)."""
    cap = rt.max_buffer
    sizes: Counter = Counter()
    for node in rt.buffer.stacks():
        sizes[node.root] += rt.buffer.count_from(node, 0)
    for root, n in sizes.items():
        if n > cap:
            shed(rt, root, "buffer", cap)


def _runs_cut(borns: list[int], cap: int, target: int) -> int:
    """The first start position kept when ``borns`` (a query's runs, sorted) are over ``cap``: they are cut to
    ``target`` runs (0: not over, none go)."""
    if len(borns) <= cap:
        return 0
    return borns[len(borns) - target - 1] + 1  # the runs born at that position go too, all together


def _buffer_cut(rt: Runtime, plan: QueryPlan, borns: list[int], cap: int, target: int) -> int:
    """The first start position kept so that the buffer entries of ``plan``'s nodes from it on are at most
    ``target`` (0: the query is not over ``cap``, none go)."""
    nodes = plan.nodes  # (a walk up the plan's parents: once)

    def buffered(floor: int) -> int:
        return sum(rt.buffer.count_from(node, floor) for node in nodes)

    floor = borns[0] if borns else NO_RUN
    if buffered(floor) <= cap:
        return 0
    for p in sorted(set(borns)) + [NO_RUN]:
        if buffered(p) <= target:
            return p
    return NO_RUN  # (not reached: nothing is buffered from NO_RUN on)


def _counted(rt: Runtime, plans: list[QueryPlan], where: list[tuple[Store, State]]) -> dict[QueryPlan, list[int]]:
    """The birth ticks of the runs each query counts (sorted)."""
    served = _served(plans)
    now = rt.now
    borns: dict[QueryPlan, list[int]] = {plan: [] for plan in plans}
    for store, st in where:
        runs = store[st]
        for plan in served.get(st, ()):
            floor, w, mine = plan.since_tick, plan.window, borns[plan]
            if w is None:
                mine.extend(r.born for r in runs if r.born > floor)
            else:
                mine.extend(r.born for r in runs if r.born > floor and now - r.first_ts <= w)
    for mine in borns.values():
        mine.sort()
    return borns


def _drop(rt: Runtime, root: Node, plans: list[QueryPlan], where: list[tuple[Store, State]]) -> None:
    """Drop the branch's runs no query of their state counts any more by birth; prune what they alone reached."""
    served = _served(plans)
    gone = 0
    for store, st in where:
        floor = min((p.since_tick for p in served.get(st, ())), default=None)
        if floor is None:
            continue  # a state no query leads to any more (its runs go at the next sweep)
        runs = store[st]
        kept = [r for r in runs if r.born > floor]
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


def _served(plans: list[QueryPlan]) -> dict[State, list[QueryPlan]]:
    """The queries each state of their branch leads to: a Kleene node's inside to every query through the node,
    a wait state to every query whose next node it waits for."""
    served: dict[State, list[QueryPlan]] = {}
    for plan in plans:
        nodes = plan.nodes
        for i, node in enumerate(nodes):
            if node.inside is not None:
                served.setdefault(node.inside, []).append(plan)
            if i + 1 < len(nodes):
                nxt = nodes[i + 1]
                wait = node.waits[nxt.id if nxt.contiguity is Contiguity.SKIP_TILL_NEXT else nxt.contiguity]
                served.setdefault(wait, []).append(plan)
    return served


def _branch_runs(rt: Runtime, root: Node) -> list[tuple[Store, State]]:
    """The stores and states of ``root``'s branch that hold runs."""
    found = []
    for store in rt._stores():
        for st in store:
            if st.node.root is root:
                found.append((store, st))
    return found
