"""What both set matchers share: caps (``Limits``), held and pending matches, and emitting matches
in chunks, ranked for feedback."""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterable

from yfpp.input.events import Event
from yfpp.sets.plan import Binding, SetPlan
from yfpp.sets.search import OverBudget, search, to_match, window_passed

if TYPE_CHECKING:
    from yfpp.engine import (
        MatchOut as Out,  # where matches go as they are made: a list, a writer (``out.extend``)
    )



# --- strategies ------------------------------------------------------------------------------


def position(e: Event) -> int:
    return e.pos


def rank(binding: Binding) -> tuple:
    """docs/semantics.md §6's order among matches completing together: by their events' stream positions."""
    flat = sorted(e.pos for events in binding for e in events)
    return (flat, [[e.pos for e in events] for events in binding])


@dataclass
class Limits:
    """A set query's caps (docs/operations.md) and what it tells the Engine: ``max_runs`` partial
    substitutions per search and matches held for ``earliest_maximal``, ``max_buffer`` buffered events;
    ``shed(query, n, report)`` counts what a cap dropped (``report``: a line to print, or None),
    ``matched(query, n)`` the matches it put out."""

    max_runs: int
    max_buffer: int
    shed: Callable[[Any, int, str | None], None]
    matched: Callable[[Any, int], None] | None = None


#: Matches made into dicts and handed to ``out.extend`` at once: what a matcher holds of a release beyond
#: the bindings of one search (which ``max_runs_per_query`` bounds) — not the event's whole release.
EMIT_CHUNK = 1024


class Held:
    """Matches waiting until the stream passes their first event's τ (earliest_maximal)."""

    def __init__(self, plan: SetPlan):
        self.plan = plan
        self.groups: dict[int, list[Binding]] = {}  # by the pos of their first event
        self.heap: list[tuple[float, int]] = []
        self.size = 0  # matches held

    def add(self, bindings: Iterable[Binding]) -> None:
        for b in bindings:
            first = min((e for events in b for e in events), key=position)
            if first.pos not in self.groups:
                self.groups[first.pos] = []
                heapq.heappush(self.heap, (first.ts, first.pos))
            self.groups[first.pos].append(b)
            self.size += 1

    def pop_due(self, now: float) -> list[Binding] | None:
        """The earliest group whose window ended before ``now`` (``inf``: any), taken out; None if there is none."""
        if not (self.heap and window_passed(now, self.heap[0][0], self.plan.window)):
            return None
        _, pos = heapq.heappop(self.heap)
        group = self.groups.pop(pos)
        self.size -= len(group)
        return group

    def shed(self, target: int) -> int:
        """Drop the groups of the oldest first events until at most ``target`` matches are held."""
        n = 0
        while self.size > target:
            _, pos = heapq.heappop(self.heap)
            group = self.groups.pop(pos)
            self.size -= len(group)
            n += len(group)
        return n


@dataclass
class PendingMatch:
    """A match waiting for its trailing negations' deadline (first.ts + τ)."""

    binding: Binding
    vec: tuple
    key: Any  # the partition (equivalence list) of its events
    last_pos: int
    first_ts: float
    killed: bool = False


class Matcher:
    """What both strategies share: the plan, caps, counters, putting matches out."""

    held: Held | None  # earliest_maximal matches waiting for their first event's τ (DirectMatcher)

    def __init__(self, plan: SetPlan, limits: Limits | None = None):
        self.plan = plan
        self.limits = limits
        self.counters: dict[str, int] = {"matcher_calls": 0}
        self.reported = False  # the first shed of this query is reported
        self.tick = 0  # positions given to events fed without an Engine
        self.fed: list[tuple[dict, tuple]] = []  # a feedback query's matches and their rank, drained by the Engine

    def _position(self, ev: Event) -> None:
        """Events through an Engine have their stream position from its runtime; number the others."""
        if ev.pos < 0:
            self.tick += 1
            ev.pos = self.tick

    def _search(self, entries: list[tuple[Event, int]], forward: bool, check_keys: bool = False) -> list[Binding]:
        """:func:`search` within ``max_runs_per_query`` partial substitutions; over it, none of its matches."""
        self.counters["matcher_calls"] += 1
        budget = self.limits.max_runs if self.limits is not None else None
        try:
            return search(self.plan, entries, forward, check_keys, budget)
        except OverBudget:
            at = entries[0][0].seq
            self._shed(budget, f"over max_runs_per_query={budget:,}; gave up the search for the matches "  # type: ignore[arg-type]
                               f"{'starting' if forward else 'ending'} at seq {at} after {budget:,} steps (partial matches tried, "
                               "events of the matches found)")
            return []

    def _shed(self, n: int, why: str) -> None:
        assert self.limits is not None
        line = None
        if not self.reported:
            self.reported = True
            line = f"query {self.plan.name!r}: {why}; those matches are lost (counted in the stats)"
        self.limits.shed(self.plan.name, n, line)

    def _put(self, bindings: list[Binding], out: Out) -> None:
        """``bindings`` as matches into ``out``, :data:`EMIT_CHUNK` at a time (counted, and kept for feedback)."""
        plan, limits = self.plan, self.limits
        for i in range(0, len(bindings), EMIT_CHUNK):
            part = bindings[i:i + EMIT_CHUNK] if len(bindings) > EMIT_CHUNK else bindings
            ms = [to_match(plan, b) for b in part]
            if plan.pattern.feedback:
                self.fed += zip(ms, map(rank, part))
            if limits is not None and limits.matched is not None:
                limits.matched(plan.name, len(ms))
            out.extend(ms)
