"""The direct strategy: an event that can end a match searches its partition for the matches it completes."""

from __future__ import annotations

import heapq
from collections import deque
from typing import TYPE_CHECKING, Any

from yfpp.input.events import MISSING, Event
from yfpp.sets.matcher import (
    Held,
    Limits,
    Matcher,
    PendingMatch,
    position,
    rank,
    window_passed,
)
from yfpp.sets.plan import Binding, SetPlan, event_bits, key_of
from yfpp.sets.search import earliest_maximal, keeps, state_vector

if TYPE_CHECKING:
    from yfpp.engine import (
        MatchOut as Out,  # where matches go as they are made: a list, a writer (``out.extend``)
    )



class DirectMatcher(Matcher):
    """Eager evaluation: search at every event that can end a match.

    Events are kept per partition of Definition 6's attributes (exact, as a
    match's events share them), so the search never mixes partitions.  A
    match of a pattern with a trailing negation waits, as in the runtime,
    until the stream passes its first event's τ; an event that witnesses the
    negation before then kills it.  ``non_overlapping``: of the matches an
    event completes in its partition, the first by :func:`rank`, if it starts
    after the previous chosen match of that partition ended.
    """

    SWEEP_EVERY = 1024

    def __init__(self, plan: SetPlan, limits: Limits | None = None):
        super().__init__(plan, limits)
        self.held = Held(plan) if plan.policy == "earliest_maximal" else None
        self.buffers: dict[Any, deque[tuple[Event, int]]] = {}
        self.size = 0  # events buffered, in all partitions
        self._events = 0
        self._swept = 0  # _events at the last sweep
        self.cuts: dict[Any, tuple[int, float]] = {}  # non_overlapping: partition -> (pos, ts) of the last chosen match's end
        self.pending: dict[Any, list[PendingMatch]] = {}  # trailing negations: matches by partition
        self.deadlines: list[tuple[float, int, PendingMatch]] = []  # (first.ts, order, pending)
        self.next_order = 0

    def process(self, ev: Event, out: Out | None = None) -> Out:
        """Take ``ev``: its matches (and those whose trailing negation's τ it passes) into ``out`` (None: a new
        list), returned."""
        self._position(ev)
        if out is None:
            out = []
        plan = self.plan
        self._events += 1
        if self._events % self.SWEEP_EVERY == 0:
            self._sweep(ev.ts)
        found = self._expire(ev.ts) if self.deadlines else []
        if self.pending:
            self._kill(ev)
        bits = event_bits(plan, ev)
        if not keeps(plan, ev, bits):
            return self._emit(found, ev.ts, out)
        key = key_of(ev, plan.eq_attrs)
        if key is MISSING:
            return self._emit(found, ev.ts, out)  # lacks an attribute every event of a match must share
        buf = self.buffers.get(key)
        if buf is None:
            buf = self.buffers[key] = deque()
        while buf and ev.ts - buf[0][0].ts > plan.window:
            buf.popleft()
            self.size -= 1
        if bits & plan.block_mask[-1]:
            new = self._complete(ev, bits, buf)
            if plan.trailing:
                self._pend(new)
            else:
                found += new
        buf.append((ev, bits))
        self.size += 1
        if self.limits is not None and self.size > self.limits.max_buffer:
            cap = self.limits.max_buffer
            if self._events - self._swept >= cap // 4:  # events older than τ first: they count for nothing
                self._sweep(ev.ts)  # (a pass over the partitions: at most once per quarter cap of events)
            if self.size > cap:
                self._shed_buffer()
        return self._emit(found, ev.ts, out)

    def _emit(self, bindings: list[Binding], now: float, out: Out) -> Out:
        """``bindings`` into ``out`` — under ``earliest_maximal`` through the holding area, whose groups
        ``now`` completes go out, one group at a time."""
        if self.held is None:
            if bindings:
                self._put(bindings, out)
            return out
        self.held.add(bindings)
        cap = self.limits.max_runs if self.limits is not None else None
        if cap is not None and self.held.size > cap:
            n = self.held.shed(cap * 3 // 4)
            self._shed(n, f"over max_runs_per_query={cap:,}; dropped {n:,} matches held for earliest_maximal "
                          "(those of the oldest first events)")
        while (group := self.held.pop_due(now)) is not None:
            self._put(earliest_maximal(self.plan, group), out)
        return out

    def _complete(self, ev: Event, bits: int, buf: deque) -> list[Binding]:
        """The matches ``ev`` completes, by policy."""
        entries = [(ev, bits)] + list(reversed(buf))
        if self.plan.policy != "non_overlapping":
            return self._search(entries, forward=False)
        pkey = key_of(ev, self.plan.partition_by)
        cut = self.cuts.get(pkey, (-1, 0.0))[0]
        found = self._search([e for e in entries if e[0].pos > cut], forward=False)
        if not found:
            return []
        self.cuts[pkey] = (ev.pos, ev.ts)
        return [min(found, key=rank)]

    def _pend(self, bindings: list[Binding]) -> None:
        plan = self.plan
        for b in bindings:
            flat = [e for events in b for e in events]
            first, last = min(flat, key=position), max(flat, key=position)
            p = PendingMatch(b, state_vector(plan, b), key_of(first, plan.partition_by), last.pos, first.ts)
            self.pending.setdefault(p.key, []).append(p)
            heapq.heappush(self.deadlines, (first.ts, self.next_order, p))
            self.next_order += 1
        if self.limits is not None and len(self.deadlines) > self.limits.max_runs:
            self._shed_pending()

    def _shed_pending(self) -> None:
        """Over ``max_runs_per_query`` matches waiting for a trailing negation's τ: drop the oldest (by first
        event), down to three quarters of the cap."""
        cap = self.limits.max_runs  # type: ignore[union-attr]
        n = 0
        while len(self.deadlines) > cap * 3 // 4:
            p = heapq.heappop(self.deadlines)[2]
            group = self.pending[p.key]
            group.remove(p)
            if not group:
                del self.pending[p.key]
            n += 1
        self._shed(n, f"over max_runs_per_query={cap:,}; dropped {n:,} matches waiting for the trailing negation's "
                      "window (the oldest)")

    def _kill(self, ev: Event) -> None:
        """``ev`` witnesses a trailing negation of the pending matches of its partition it follows within τ."""
        plan = self.plan
        for neg in plan.trailing:
            if not neg.witness(ev):
                continue
            for p in self.pending.get(key_of(ev, plan.partition_by), ()):
                if (not p.killed and ev.pos > p.last_pos and not window_passed(ev.ts, p.first_ts, plan.window)
                        and all(c(ev, p.vec) for c in neg.cross)):
                    p.killed = True

    def _expire(self, now: float) -> list[Binding]:
        """The pending matches whose deadline ``now`` passed, and not killed."""
        out = []
        while self.deadlines and window_passed(now, self.deadlines[0][0], self.plan.window):
            p = heapq.heappop(self.deadlines)[2]
            group = self.pending[p.key]
            group.remove(p)
            if not group:
                del self.pending[p.key]
            if not p.killed:
                out.append(p.binding)
        return out

    def advance_time(self, ts: float, out: Out | None = None) -> Out:
        return self._emit(self._expire(ts), ts, [] if out is None else out)

    def flush(self, out: Out | None = None) -> Out:
        return self._emit(self._expire(float("inf")), float("inf"), [] if out is None else out)

    def _sweep(self, now: float) -> None:
        """Forget the buffered events older than τ before ``now`` (no later match can use them)."""
        self._swept = self._events
        window = self.plan.window
        for key in list(self.buffers):
            buf = self.buffers[key]
            while buf and now - buf[0][0].ts > window:
                buf.popleft()
                self.size -= 1
            if not buf:
                del self.buffers[key]
        for key in [k for k, (_, ts) in self.cuts.items() if now - ts > self.plan.window]:
            del self.cuts[key]  # every later match starts after it

    def _shed_buffer(self) -> None:
        """Over ``max_buffer_per_query``: drop the oldest buffered events, down to three quarters of the cap."""
        cap = self.limits.max_buffer  # type: ignore[union-attr]
        positions = sorted(ev.pos for buf in self.buffers.values() for ev, _ in buf)
        cut = positions[len(positions) - cap * 3 // 4 - 1]
        n = 0
        for key in list(self.buffers):
            buf = self.buffers[key]
            while buf and buf[0][0].pos <= cut:
                buf.popleft()
                n += 1
            if not buf:
                del self.buffers[key]
        self.size -= n
        self._shed(n, f"over max_buffer_per_query={cap:,}; shed {n:,} buffered events (the oldest); "
                      "matches that would have used them are lost")

    def stats(self) -> dict[str, int]:
        return {"matcher calls": self.counters["matcher_calls"]}
