"""The match-window strategy (the paper's §4–5): filter, partition, buffer events in windows of τ,
check the summary statistics (Definition 5, Theorems 2–3), search only candidate windows."""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterator

from yfpp.input.events import MISSING, Event
from yfpp.sets.matcher import Limits, Matcher, window_passed
from yfpp.sets.plan import Binding, SetPlan, event_bits, key_of
from yfpp.sets.search import earliest_maximal, keeps

if TYPE_CHECKING:
    from yfpp.engine import (
        MatchOut as Out,  # where matches go as they are made: a list, a writer (``out.extend``)
    )



class SummaryStatistics:
    """Definition 5's counters over a match window, kept as in the paper's §5.

    ``cnt[i]`` counts the window's events that satisfy variable i's properties
    and, for i in Bj (j > 1), arrived while every variable of Bj-1 had a
    non-zero counter.  ``s`` is the paper's s̄ (bit 1: counter zero); an event
    counts for i when ``s & prev_mask[block(i)] == 0``.  Dequeuing the first
    event decrements what it counted; a counter of Bj that drops to zero
    resets those of every later set (their events can no longer follow one of
    Bj).  The counters never undercount, so "all counters > 0" (``s == 0``) is
    a necessary condition for a match (Theorem 3), also when they overcount.
    """

    def __init__(self, plan: SetPlan):
        self.plan = plan
        self.cnt = [0] * plan.m
        self.s = (1 << plan.m) - 1
        self.epoch = [0] * len(plan.blocks)

    def add(self, bits: int) -> tuple[tuple[int, int], ...]:
        """Count an enqueued event; return what it counted, as (variable, epoch of its set)."""
        plan, s0 = self.plan, self.s
        counted = []
        for i in range(plan.m):
            if bits & plan.bit[i]:
                b = plan.block_of[i]
                if not s0 & plan.prev_mask[b]:
                    self.cnt[i] += 1
                    self.s &= ~plan.bit[i]
                    counted.append((i, self.epoch[b]))
        return tuple(counted)

    def remove(self, counted: tuple[tuple[int, int], ...]) -> None:
        """Uncount a dequeued event."""
        plan = self.plan
        for i, epoch in counted:
            b = plan.block_of[i]
            if epoch != self.epoch[b]:
                continue  # reset since it was counted
            self.cnt[i] -= 1
            if self.cnt[i] == 0:
                self.s |= plan.bit[i]
                for later in range(b + 1, len(plan.blocks)):
                    self.epoch[later] += 1
                    for j in plan.blocks[later]:
                        self.cnt[j] = 0
                        self.s |= plan.bit[j]

    def counters(self) -> dict[str, int]:
        return dict(zip(self.plan.vars, self.cnt))


@dataclass
class MatchWindow:
    """One partition's buffered events within τ of the first, with their summary statistics."""

    stats: SummaryStatistics
    entries: deque = field(default_factory=deque)  # (event, bits, counted)
    due: int = -1  # the order of its entry in the matcher's deadline heap

    def add(self, ev: Event, bits: int) -> None:
        self.entries.append((ev, bits, self.stats.add(bits)))

    def pop(self) -> None:
        self.stats.remove(self.entries.popleft()[2])

    def conditions(self, plan: SetPlan) -> tuple[bool, bool, bool]:
        """Theorem 2 for the first event: (4) |W| ≥ m, (5) it can bind a variable
        of B1, (6)+(7) by Theorem 3: every summary counter is above zero."""
        return len(self.entries) >= plan.m, bool(self.entries[0][1] & plan.block_mask[0]), self.stats.s == 0


class MatchWindowMatcher(Matcher):
    """The two-phase strategy; ``filtering``, ``partitioning`` and ``conditions`` switch its prunings."""

    def __init__(self, plan: SetPlan, *, filtering: bool = True, partitioning: bool = True, conditions: bool = True,
                 limits: Limits | None = None):
        super().__init__(plan, limits)
        self.filtering = filtering
        self.conditions = conditions
        self.key_attrs = plan.eq_attrs if partitioning else ()
        self.windows: dict[Any, MatchWindow] = {}
        self.deadlines: list[tuple[float, int, Any]] = []  # (first.ts of a window, order, key)
        self.next_order = 0
        self.size = 0  # events buffered, in all windows
        self.counters.update(windows_seen=0, candidate_windows=0, events_filtered=0)
        self.trace: list[tuple[list[Event], tuple[bool, bool, bool]]] | None = None  # set to a list to record windows
        # a window's search finds every match that starts at its first event: earliest_maximal is applied to
        # them then, and nothing is held
        self.held = None
        self.maximal = plan.policy == "earliest_maximal"

    def process(self, ev: Event, out: Out | None = None) -> Out:
        """Take ``ev``: the matches of the windows it completes into ``out`` (None: a new list), returned."""
        self._position(ev)
        if out is None:
            out = []
        self._close(ev.ts, out)
        bits = event_bits(self.plan, ev)
        key = key_of(ev, self.key_attrs)
        if (self.filtering and not keeps(self.plan, ev, bits)) or key is MISSING:
            self.counters["events_filtered"] += 1
            return out
        w = self.windows.get(key)
        if w is None:
            w = self.windows[key] = MatchWindow(SummaryStatistics(self.plan))
        if not w.entries:
            self._schedule(w, ev.ts, key)
        w.add(ev, bits)
        self.size += 1
        if self.limits is not None and self.size > self.limits.max_buffer:
            self._shed_buffer()
        return out

    def _schedule(self, w: MatchWindow, first_ts: float, key: Any) -> None:
        w.due = self.next_order
        self.next_order += 1
        heapq.heappush(self.deadlines, (first_ts, w.due, key))

    def advance_time(self, ts: float, out: Out | None = None) -> Out:
        out = [] if out is None else out
        self._close(ts, out)
        return out

    def flush(self, out: Out | None = None) -> Out:
        return self.advance_time(float("inf"), out)

    def _close(self, now: float, out: Out) -> None:
        """Complete every window whose τ ended before ``now``, one first event at a time: the matches that
        start at it (its search's) go into ``out`` before the next one is searched, so a release holds one
        search's matches, however many windows ``now`` completes."""
        tau = self.plan.window
        due: list[tuple[Any, MatchWindow]] = []
        while self.deadlines and window_passed(now, self.deadlines[0][0], tau):
            _, order, key = heapq.heappop(self.deadlines)
            w = self.windows.get(key)
            if w is not None and w.due == order:  # (else its window was shed over a cap)
                due.append((key, w))
        if not due:
            return
        try:
            for w in self._firsts([w for _, w in due], now):
                found = self._complete(w)
                w.pop()
                self.size -= 1
                if found:
                    self._put(earliest_maximal(self.plan, found) if self.maximal else found, out)
        finally:  # (also when out.extend raised: each window is left whole, what it has left still due)
            for key, w in due:
                if w.entries:
                    self._schedule(w, w.entries[0][0].ts, key)
                else:
                    del self.windows[key]

    def _firsts(self, windows: list[MatchWindow], now: float) -> Iterator[MatchWindow]:
        """Each due window once per first event to complete (the caller pops it), in output order: window
        after window, in deadline order; under ``earliest_maximal``, the first events in stream order
        (ts, then position) across the windows."""
        tau = self.plan.window

        def first_due(w: MatchWindow) -> bool:
            return bool(w.entries) and window_passed(now, w.entries[0][0].ts, tau)

        if not self.maximal:
            for w in windows:
                while first_due(w):
                    yield w
            return
        heap = [(w.entries[0][0].ts, w.entries[0][0].pos, i) for i, w in enumerate(windows) if first_due(w)]
        heapq.heapify(heap)
        while heap:
            i = heapq.heappop(heap)[2]
            w = windows[i]
            yield w
            if first_due(w):
                heapq.heappush(heap, (w.entries[0][0].ts, w.entries[0][0].pos, i))

    def _complete(self, w: MatchWindow) -> list[Binding]:
        c = self.counters
        c["windows_seen"] += 1
        met = w.conditions(self.plan)
        if self.trace is not None:
            self.trace.append(([ev for ev, _, _ in w.entries], met))
        if self.conditions and not all(met):
            return []
        c["candidate_windows"] += 1
        entries = [(ev, bits) for ev, bits, _ in w.entries]
        return self._search(entries, forward=True, check_keys=not set(self.plan.partition_by) <= set(self.key_attrs))

    def _shed_buffer(self) -> None:
        """Over ``max_buffer_per_query``: drop the oldest buffered events (uncompleted), down to three quarters of the cap."""
        cap = self.limits.max_buffer  # type: ignore[union-attr]
        positions = sorted(ev.pos for w in self.windows.values() for ev, _, _ in w.entries)
        cut = positions[len(positions) - cap * 3 // 4 - 1]
        n = 0
        for key in list(self.windows):
            w = self.windows[key]
            before = len(w.entries)
            while w.entries and w.entries[0][0].pos <= cut:
                w.pop()
            n += before - len(w.entries)
            if not w.entries:
                del self.windows[key]
            elif len(w.entries) < before:
                self._schedule(w, w.entries[0][0].ts, key)  # its old deadline is stale now
        self.size -= n
        self._shed(n, f"over max_buffer_per_query={cap:,}; shed {n:,} buffered events (the oldest); "
                      "matches that would have used them are lost")

    def stats(self) -> dict[str, int]:
        c = self.counters
        return {
            "windows seen": c["windows_seen"],
            "candidate windows": c["candidate_windows"],
            "matcher calls": c["matcher_calls"],
            "events filtered": c["events_filtered"],
        }
