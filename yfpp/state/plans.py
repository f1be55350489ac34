"""A checkpoint's references to the compiled queries, resolved and checked (docs/operations.md, "What restore checks").

``yfpp.state.schema`` has checked the JSON shape; the queries are now
registered again.  :class:`Plans` turns ``[query id, component index]`` into
shared-NFA nodes and states, and checks what restore builds on them against
the plans, so that the runtime, which checks nothing per event, never meets
a value of the wrong kind: a run's vector holds an event per single
component and a Kleene state (with the node's aggregates) per Kleene
component, its buffer entries lead back through labels its version extends,
an event-set binding has one event per single variable… A failure is a
:class:`YfppError` ``corrupt checkpoint: <where>: …``.
"""

from __future__ import annotations

from typing import Any

from yfpp.state.schema import corrupt
from yfpp.input.events import MISSING, Event
from yfpp.runtime.match_buffer import Entry
from yfpp.language.pattern import Contiguity
from yfpp.nfa.predicates import KleeneState, is_number
from yfpp.runtime.runs import Run


class Plans:
    """The restored engine's queries, as the checkpoint's references reach them."""

    def __init__(self, engine) -> None:
        self.engine = engine

    def node(self, ref: list, where: str):
        plan = self.engine.queries.get(ref[0])
        if plan is None or not 0 <= ref[1] < len(plan.nodes):
            raise corrupt(where, f"no component {ref[1]} of a pattern query {ref[0]}")
        return plan.nodes[ref[1]]

    def state(self, ref: list, where: str):
        """``[node, "in"]`` or ``[node, "wait", contiguity, child or null]``."""
        node = self.node(ref[0], where)
        st = node.inside if ref[1] == "in" else node.waits.get(
            self.node(ref[3], where).id if ref[3] is not None else Contiguity(ref[2]))
        if st is None:
            raise corrupt(where, f"component {ref[0][1]} of query {ref[0][0]} has no such state")
        return st

    def plan(self, qid: int, where: str):
        plan = self.engine.queries.get(qid)
        if plan is None:
            raise corrupt(where, f"no pattern query {qid}")
        return plan

    def run(self, r: Run, where: str) -> None:
        """``r``'s vector, key and last entry fit its state's node."""
        node = r.state.node
        chain = _chain(node)
        _vec(chain, r.vec, where)
        if (r.key is None) != (not node.partition_by):
            raise corrupt(where, "a run's key must be null exactly when its component has no equivalence list")
        if r.entry is None:
            if node.index or node.kleene:
                raise corrupt(where, "a run past its first single event needs an entry")
        elif r.entry.unit != node.index or not _reaches(r.entry, r.version):
            raise corrupt(where, "a run's entry must be its component's, labelled with a prefix of its version")

    def pending(self, plan, vec: tuple, match: dict, where: str) -> None:
        """A match held for a trailing-negation deadline: its query has one, its vec the query's slots."""
        if plan.trailing is None:
            raise corrupt(where, f"query {plan.name!r} has no trailing negation")
        _vec(plan.nodes, vec + (None,), where)
        if match["query"] != plan.name or ("emit" in match) != (plan.emit is not None):
            raise corrupt(where, f"the match is not one of query {plan.name!r}")

    def negation(self, ref: list, where: str):
        plan = self.plan(ref[0], where)
        if not 0 <= ref[1] < len(plan.negations) or plan.negations[ref[1]].upper is None:
            raise corrupt(where, f"query {ref[0]} has no middle negation {ref[1]}")
        return plan.negations[ref[1]]

    def matcher(self, qid: int, state: dict, where: str):
        """The set query ``qid``, of the strategy ``state`` was saved by."""
        m = self.engine.set_queries.get(qid)
        if m is None:
            raise corrupt(where, f"no event-set query {qid}")
        if ("windows" in state) != hasattr(m, "windows") or (state["held"] is None) != (m.held is None):
            raise corrupt(where, "the state is not of this query's strategy and policy")
        return m


def _chain(node) -> list:
    """The nodes from the root down to ``node``."""
    out = []
    while node is not None:
        out.append(node)
        node = node.parent
    return out[::-1]


def _vec(nodes: list, vec: tuple, where: str) -> None:
    """Slot i of ``vec``: an Event for a single component, a KleeneState of its layout for a Kleene one; then
    None (the slot of the component a run may begin next)."""
    if len(vec) != len(nodes) + 1 or vec[-1] is not None:
        raise corrupt(where, f"vec must have {len(nodes) + 1} slots, the last one null")
    for i, (node, x) in enumerate(zip(nodes, vec)):
        if not (_kleene(node, x) if node.kleene else isinstance(x, Event)):
            raise corrupt(where, f"vec[{i}] must be {'a Kleene state of its aggregates' if node.kleene else 'an event'}")


def _kleene(node, x: Any) -> bool:
    if not isinstance(x, KleeneState) or type(x.aggs) is not tuple or len(x.aggs) != len(node.agg_slots):
        return False
    if (x.events is None) == node.keep_events or (x.events is not None and len(list(x.iter_events())) != x.n):
        return False
    return all(_aggregate(s.func, a) for s, a in zip(node.agg_slots, x.aggs))


def _aggregate(func: str, acc: Any) -> bool:
    """A running aggregate as ``yfpp.nfa.predicates`` keeps it."""
    if func == "count":
        return type(acc) is int
    if acc is MISSING:
        return True
    if func == "avg":
        return type(acc) is tuple and len(acc) == 2 and is_number(acc[0]) and type(acc[1]) is int and acc[1] > 0
    return is_number(acc)


def check_entries(entries: list[Entry]) -> None:
    """Every predecessor pointer leads to an entry of an earlier unit or the same, labelled with a prefix of its
    label: reading a match back from any run whose version extends its entry's label then always succeeds."""
    for i, e in enumerate(entries):
        for v, p in e.pointers():
            if p is not None and (p.unit > e.unit or not _reaches(p, v)):
                raise corrupt(f"entries[{i}]", "a predecessor must be of an earlier unit, labelled with a prefix")


def _reaches(entry: Entry, version: tuple) -> bool:
    """Has ``entry`` a pointer labelled with a prefix of ``version`` (what reading a match back takes there)?"""
    try:
        entry.back(version)
    except AssertionError:
        return False
    return True


def check_stack(node, entries: list[Entry], where: str) -> None:
    """A buffer stack: its node's entries, in stream order."""
    if any(e.unit != node.index for e in entries) or any(a.event.pos >= b.event.pos for a, b in zip(entries, entries[1:])):
        raise corrupt(where, "a stack holds its component's entries in stream order")


def check_binding(plan, binding: list, where: str) -> None:
    """An event-set binding: per variable its events, exactly one for a single variable."""
    if len(binding) != plan.m or any(not plan.kleene[i] and len(events) != 1 for i, events in enumerate(binding)):
        raise corrupt(where, f"a binding has one list of events per variable ({plan.m}), one event for a single one")


def check_bits(plan, bits: int, where: str) -> None:
    if not 0 <= bits < 1 << plan.m:
        raise corrupt(where, f"bits must be below {1 << plan.m}")
