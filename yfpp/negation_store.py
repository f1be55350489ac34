"""Candidates of middle negations (SASE+ ``~b`` between two components), kept per key in stream order.

A candidate is an event of the negated type that passed the negation's own
predicates; a match of the query is dropped when a candidate of its key lies
strictly between the events bound to the components around ``~b`` and passes
the negation's predicates on the match's bindings.  Trailing negations, which
wait for a deadline instead, are ``yfpp.deadlines``'.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections import defaultdict
from typing import Any

from yfpp.events import Event
from yfpp.nfa_compiler import NegationPlan, QueryPlan
from yfpp.runs import NO_RUN
from yfpp.shared_nfa import Node


class NegationStores:
    """Every registered negation by the event type it tests, and the candidate store of each middle one."""

    def __init__(self) -> None:
        self.by_type: dict[str | None, list[tuple[QueryPlan, NegationPlan]]] = defaultdict(list)
        self.store: dict[NegationPlan, dict[Any, tuple[list[int], list[Event]]]] = {}
        self.root: dict[NegationPlan, Node] = {}  # the trie branch whose runs a store serves

    def add(self, plan: QueryPlan) -> None:
        for neg in plan.negations:
            self.by_type[neg.event_type].append((plan, neg))
            if neg.upper is not None:
                self.store[neg] = {}
                self.root[neg] = plan.nodes[0]

    def remove(self, plan: QueryPlan) -> None:
        for neg in plan.negations:
            self.by_type[neg.event_type].remove((plan, neg))
            self.store.pop(neg, None)
            self.root.pop(neg, None)

    def record(self, negated: list[tuple[NegationPlan, Any]], ev: Event) -> None:
        """Store ``ev`` as a candidate of each (negation, key) in ``negated`` (the commit of an event)."""
        for neg, ek in negated:
            b = self.store[neg].get(ek)
            if b is None:
                b = self.store[neg][ek] = ([], [])
            b[0].append(ev.pos)
            b[1].append(ev)

    def allows(self, plan: QueryPlan, vec: tuple, key: Any) -> bool:
        """No candidate of ``plan``'s middle negations lies between the components around it in ``vec``."""
        for neg in plan.negations:
            if neg.upper is None:
                continue
            bucket = self.store[neg].get(key)
            if not bucket:
                continue
            positions, events = bucket
            lo = _last_pos(vec[neg.lower])
            hi = _first_pos(vec[neg.upper])
            for i in range(bisect_right(positions, lo), bisect_left(positions, hi)):
                x = events[i]
                if all(p(x, vec) for p in neg.cross_preds):
                    return False
        return True

    def prune(self, floor: dict[Node, int], only: Node | None = None) -> int:
        """Drop candidates before the first event of every live run of their branch; return the buckets left."""
        buckets = 0
        for neg, store in self.store.items():
            root = self.root[neg]
            if only is not None and root is not only:
                continue
            cut_pos = floor.get(root, NO_RUN)
            for k in list(store):
                positions, events = store[k]
                cut = bisect_left(positions, cut_pos)
                if cut:
                    del positions[:cut], events[:cut]
                if not positions:
                    del store[k]
            buckets += len(store)
        return buckets


def _last_pos(v) -> int:
    return v.pos if isinstance(v, Event) else v.last.pos


def _first_pos(v) -> int:
    return v.pos if isinstance(v, Event) else v.first.pos
