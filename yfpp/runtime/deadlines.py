"""Matches of queries ending in a negation (``SEQ(a, b, ~c)``), held until their deadline ``first.ts + W``.

A held match is emitted when stream time passes its deadline unless an event of
the negated type, after its last bound event and within the deadline, killed it.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from itertools import count
from typing import Any

from yfpp.input.events import Event
from yfpp.nfa.compiler import NegationPlan, QueryPlan


@dataclass
class Pending:
    """A match waiting for its trailing-negation deadline."""

    plan: QueryPlan
    key: Any
    vec: tuple
    last_pos: int
    deadline: float
    match: dict
    killed: bool = False
    depth: int = 0  #: the deepest derived event the match binds: its own derived event goes one deeper
    rank: tuple | None = None  #: a feedback query's match order among those its deadline releases (overlap_rank)


class Deadlines:
    """Held matches by query and key, and a heap of their deadlines."""

    def __init__(self) -> None:
        self.pending: dict[QueryPlan, dict[Any, list[Pending]]] = {}
        self.heap: list[tuple[float, int, Pending]] = []
        self.order = count()  # ties between equal deadlines go by holding order
        self.waiting: set[QueryPlan] = set()  # the queries holding matches (pending, or killed not yet expired)

    def add(self, plan: QueryPlan) -> None:
        if plan.trailing is not None:
            self.pending[plan] = {}

    def remove(self, plan: QueryPlan) -> None:
        self.waiting.discard(plan)
        for group in self.pending.pop(plan, {}).values():
            for p in group:
                p.killed = True

    def earliest(self) -> float | None:
        return self.heap[0][0] if self.heap else None

    def hold(self, p: Pending) -> None:
        self.pending[p.plan].setdefault(p.key, []).append(p)
        self.waiting.add(p.plan)
        heapq.heappush(self.heap, (p.deadline, next(self.order), p))

    def killed_by(self, plan: QueryPlan, neg: NegationPlan, ev: Event, ek: Any, kills: list[Pending]) -> None:
        """Add to ``kills`` the held matches of ``plan`` and key ``ek`` that ``ev`` (a candidate of ``neg``) kills."""
        for p in self.pending[plan].get(ek, ()):
            if not p.killed and ev.pos > p.last_pos and ev.ts <= p.deadline:
                if all(c(ev, p.vec) for c in neg.cross_preds):
                    kills.append(p)

    def expire(self, now: float, everything: bool = False) -> list[Pending]:
        """Take out the held matches whose deadline is before ``now`` (all: ``everything``); return the live ones."""
        out = []
        heap = self.heap
        while heap and (everything or heap[0][0] < now):
            _, _, p = heapq.heappop(heap)
            group = self.pending.get(p.plan, {}).get(p.key)
            if group is not None:
                group.remove(p)
                if not group:
                    del self.pending[p.plan][p.key]
                    if not self.pending[p.plan]:
                        self.waiting.discard(p.plan)
            if not p.killed:
                out.append(p)
        return out
