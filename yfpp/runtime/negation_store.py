"""Candidates of middle negations (SASE+ ``~b`` between two components), kept per key in stream order.

A candidate is an event of the negated type that passed the negation's own
predicates (those that mention only the negated variable); a match of the
query is dropped when a candidate of its key lies strictly between the events
bound to the components around ``~b`` and passes the negation's other
predicates on the match's bindings.  Trailing negations, which wait for a
deadline instead, are ``yfpp.runtime.deadlines``'.

Equivalent negations share one store: same negated type, same own predicates
(compared with the variable renamed), same equivalence list and same branch
of the shared NFA (whose oldest run bounds what the store must keep).  A
hundred queries with the same ``~register b`` keep one list of register
events, filtered once per event.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections import defaultdict
from typing import Any, Hashable

from yfpp.input.events import Event
from yfpp.nfa.compiler import NegationPlan, QueryPlan
from yfpp.nfa.predicates import Check
from yfpp.runtime.runs import NO_RUN
from yfpp.nfa.shared_nfa import Node


class CandidateStore:
    """The candidates of one class of equivalent middle negations: key → (stream positions, events)."""

    __slots__ = ("signature", "self_preds", "partition_by", "root", "buckets", "users", "holding")

    def __init__(self, signature: Hashable, self_preds: tuple[Check, ...], partition_by: tuple[str, ...], root: Node,
                 holding: set["CandidateStore"]):
        self.signature = signature
        self.self_preds = self_preds
        self.partition_by = partition_by
        self.root = root
        self.buckets: dict[Any, tuple[list[int], list[Event]]] = {}
        self.users = 0
        self.holding = holding  # NegationStores.holding: this store joins it with its first bucket

    def hold(self, key: Any, tick: int, ev: Event) -> None:
        """Keep ``ev`` (at stream position ``tick``) as a candidate for the runs of ``key``."""
        bucket = self.buckets.get(key)
        if bucket is None:
            self.buckets[key] = ([tick], [ev])
            self.holding.add(self)
        else:
            bucket[0].append(tick)
            bucket[1].append(ev)


class NegationStores:
    """Every registered negation by the event type it tests, and the shared candidate stores of middle ones.

    ``by_type[type]`` lists what an event of that type (``None``: any type) may
    be a candidate for: ``(store, None)`` once per shared store, ``(plan, neg)``
    per trailing negation (its pending matches are per query).
    """

    def __init__(self) -> None:
        self.by_type: dict[str | None, list[tuple[Any, NegationPlan | None]]] = defaultdict(list)
        self.stores: dict[Hashable, CandidateStore] = {}
        self.of: dict[NegationPlan, CandidateStore] = {}
        # the stores that may hold a candidate (each holding one is here): what pruning visits, however many
        # stores are registered
        self.holding: set[CandidateStore] = set()

    def add(self, plan: QueryPlan) -> None:
        for neg in plan.negations:
            if neg.upper is None:
                self.by_type[neg.event_type].append((plan, neg))
                continue
            sig = (neg.signature, plan.partition_by, plan.nodes[0].root)
            store = self.stores.get(sig)
            if store is None:
                store = self.stores[sig] = CandidateStore(sig, neg.self_preds, plan.partition_by, plan.nodes[0].root,
                                                           self.holding)
                self.by_type[neg.event_type].append((store, None))
            store.users += 1
            self.of[neg] = store

    def remove(self, plan: QueryPlan) -> None:
        for neg in plan.negations:
            if neg.upper is None:
                self.by_type[neg.event_type].remove((plan, neg))
                continue
            store = self.of.pop(neg)
            store.users -= 1
            if not store.users:
                del self.stores[store.signature]
                self.holding.discard(store)
                self.by_type[neg.event_type].remove((store, None))

    def allows(self, plan: QueryPlan, vec: tuple, key: Any) -> bool:
        """No candidate of ``plan``'s middle negations lies between the components around it in ``vec``."""
        for neg in plan.negations:
            if neg.upper is None:
                continue
            bucket = self.of[neg].buckets.get(key)
            if not bucket:
                continue
            positions, events = bucket
            v = vec[neg.lower]
            lo = v.pos if isinstance(v, Event) else v.last.pos
            v = vec[neg.upper]
            hi = v.pos if isinstance(v, Event) else v.first.pos
            lo = bisect_right(positions, lo)
            hi = bisect_left(positions, hi, lo)
            if lo == hi:
                continue
            cross = neg.cross_preds
            if not cross:
                return False
            for i in range(lo, hi):
                x = events[i]
                for p in cross:
                    if not p(x, vec):
                        break
                else:
                    return False
        return True

    def held(self) -> bool:
        """Does any store hold a candidate?"""
        holding = self.holding
        for store in [s for s in holding if not s.buckets]:
            holding.discard(store)
        return bool(holding)

    def prune(self, floor: dict[Node, int], only: Node | None = None) -> int:
        """Drop candidates before the first event of every live run of their branch; return the buckets left."""
        buckets = 0
        for store in list(self.holding):
            if only is not None and store.root is not only:
                continue
            cut_pos = floor.get(store.root, NO_RUN)
            by_key = store.buckets
            for k in list(by_key):
                positions, events = by_key[k]
                cut = bisect_left(positions, cut_pos)
                if cut:
                    del positions[:cut], events[:cut]
                if not positions:
                    del by_key[k]
            if not by_key:
                self.holding.discard(store)
            buckets += len(by_key)
        return buckets

