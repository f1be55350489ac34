"""The NFA^b runtime (SIGMOD 2008 §4): runs, dispatch, negation, output policy.

Runs live in buckets keyed by NFA state and partition key.  An event visits
only the states that can react to it: states whose begin/take/proceed edges
test its type (or any type), strict-contiguity states (every event moves or
kills their runs) and partition-contiguity states (every event of the run's
partition does) — and within a state only the bucket of the event's key.
Matches are stored once in the shared versioned :class:`MatchBuffer`.

The runtime is organised around states, not queries: a state belongs to a
query plan today; a shared NFA can hand it states serving many queries
without changing the runtime's interface.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left, bisect_right
from collections import defaultdict
from dataclasses import dataclass, field
from itertools import count
from typing import Any, Iterable

from yfpp.events import MISSING, Event
from yfpp.match_buffer import MatchBuffer, Version
from yfpp.nfa_compiler import ComponentPlan, NegationPlan, QueryPlan, State
from yfpp.pattern import Contiguity
from yfpp.predicates import kleene_start, kleene_take

STRICT, PARTITION, STNM, STAM = (
    Contiguity.STRICT,
    Contiguity.PARTITION,
    Contiguity.SKIP_TILL_NEXT,
    Contiguity.SKIP_TILL_ANY,
)


class Run:
    """One partial match: where it waits, what it has bound, where its events are."""

    __slots__ = ("state", "vec", "entry", "version", "first_ts", "first_seq", "key", "tick", "ptick", "blocked")

    def __init__(self, state, vec, entry, version, first_ts, first_seq, key, tick=0, ptick=0):
        self.state: State = state
        self.vec: tuple = vec
        self.entry = entry
        self.version: Version = version
        self.first_ts: float = first_ts
        self.first_seq: int = first_seq
        self.key: Any = key
        self.tick: int = tick  # engine tick of the last begin/take into a Kleene component
        self.ptick: int = ptick  # partition tick at that moment
        self.blocked: bool = False  # ignored an event the next component could begin with


@dataclass
class Pending:
    """A match waiting for its trailing-negation deadline."""

    plan: QueryPlan
    key: Any
    vec: tuple
    last_seq: int
    deadline: float
    match: dict
    killed: bool = False


@dataclass
class Counters:
    events: int = 0
    runs_created: int = 0
    runs_touched: int = 0
    live_runs: int = 0
    peak_runs: int = 0
    peak_buffer: int = 0
    matches: dict[str, int] = field(default_factory=lambda: defaultdict(int))


def partition_key(ev: Event, attrs: tuple[str, ...]) -> Any:
    """The equivalence-key value of ``ev`` (``None`` if it lacks one of ``attrs``)."""
    if not attrs:
        return None
    if len(attrs) == 1:
        v = ev.get(attrs[0])
        return None if v is MISSING else v
    vals = tuple(ev.get(a) for a in attrs)
    return None if MISSING in vals else vals


def _type_ok(t: str | None, ev: Event) -> bool:
    return t is None or t == ev.type


class Runtime:
    """Runs queries compiled to NFA^b plans over one ordered event stream."""

    SWEEP_EVERY = 256

    def __init__(self) -> None:
        self.plans: dict[QueryPlan, str] = {}
        self.buffer = MatchBuffer()
        self.buckets: dict[State, dict[Any, list[Run]]] = {}
        self.neg_store: dict[NegationPlan, dict[Any, tuple[list[int], list[Event]]]] = {}
        self.pending: dict[QueryPlan, dict[Any, list[Pending]]] = {}
        self.deadlines: list[tuple[float, int, Pending]] = []
        self.pticks: dict[tuple[str, ...], dict[Any, int]] = {}
        self.counters = Counters()
        self.tick = 0
        self.now = float("-inf")
        self._roots = count()
        self._branches = count(1)
        self._order = count()
        self._dispatch: dict[str, list[tuple[State, bool]]] = {}
        self._starters: dict[str, list[QueryPlan]] = {}
        self._negs: dict[str, list[tuple[QueryPlan, NegationPlan]]] = {}

    # --- registration ---------------------------------------------------------------

    def add(self, plan: QueryPlan) -> None:
        self.plans[plan] = plan.name
        for st in plan.states:
            self.buckets[st] = {}
        for neg in plan.negations:
            if neg.upper is not None:
                self.neg_store[neg] = {}
        if plan.trailing is not None:
            self.pending[plan] = {}
        if plan.partition_by and any(c.kleene and c.next and c.next.contiguity is PARTITION for c in plan.comps):
            self.pticks.setdefault(plan.partition_by, {})
        self._dispatch.clear()

    def remove(self, plan: QueryPlan) -> None:
        del self.plans[plan]
        for st in plan.states:
            self.counters.live_runs -= sum(len(b) for b in self.buckets.pop(st).values())
        for neg in plan.negations:
            self.neg_store.pop(neg, None)
        for group in self.pending.pop(plan, {}).values():
            for p in group:
                p.killed = True
        for c in plan.comps:
            self.buffer.drop(c)
        self._dispatch.clear()

    def _build_dispatch(self, etype: str) -> None:
        states: list[tuple[State, bool]] = []
        for st in self.buckets:
            c = st.contiguity
            if c is STRICT or (c is PARTITION and not st.plan.partition_by):
                states.append((st, True))
            elif c is PARTITION or etype in st.move_types or None in st.move_types:
                states.append((st, False))
        self._dispatch[etype] = states
        self._starters[etype] = [p for p in self.plans if _type_ok(p.first.event_type, _TypeProbe(etype))]
        self._negs[etype] = [(p, n) for p in self.plans for n in p.negations if _type_ok(n.event_type, _TypeProbe(etype))]

    # --- the per-event step -----------------------------------------------------------

    def process(self, ev: Event) -> list[dict]:
        """Advance every run by one event (already in stream order); return completed matches."""
        self.tick += 1
        self.now = ev.ts
        cnt = self.counters
        cnt.events += 1
        out: list[dict] = self._expire(ev.ts) if self.deadlines else []
        etype = ev.type
        if etype not in self._dispatch:
            self._build_dispatch(etype)
        keys: dict[tuple[str, ...], Any] = {}

        def key_of(attrs: tuple[str, ...]) -> Any:
            k = keys.get(attrs, keys)
            if k is keys:
                k = keys[attrs] = partition_key(ev, attrs)
            return k

        for attrs, ticks in self.pticks.items():
            k = key_of(attrs)
            if k is not None:
                ticks[k] = ticks.get(k, 0) + 1
        for plan, neg in self._negs[etype]:
            self._see_negated(plan, neg, ev, key_of(plan.partition_by))

        fresh: list[Run] = []
        accepted: list[tuple[QueryPlan, Any, dict]] = []
        for st, touch_all in self._dispatch[etype]:
            plan = st.plan
            ek = key_of(plan.partition_by)
            buckets = self.buckets[st]
            if touch_all:
                runs = [r for b in buckets.values() for r in b]
                buckets.clear()
            else:
                if plan.partition_by and ek is None:
                    continue
                runs = buckets.pop(ek, None)
                if not runs:
                    continue
            cnt.runs_touched += len(runs)
            cnt.live_runs -= len(runs)
            for r in runs:
                self._step(r, ev, ek, fresh, accepted)
        for plan in self._starters[etype]:
            ek = key_of(plan.partition_by)
            if plan.partition_by and ek is None:
                continue
            comp = plan.first
            if self._begins(comp, plan.empty_vec, ev.ts, ek, ev, ek):
                base = Run(None, plan.empty_vec, None, (next(self._roots),), ev.ts, ev.seq, ek)
                self._enter(comp, base, base.version, ev, fresh, accepted)

        if accepted:
            out.extend(self._accept(accepted, fresh))
        for r in fresh:
            b = self.buckets[r.state]
            lst = b.get(r.key)
            if lst is None:
                b[r.key] = [r]
            else:
                lst.append(r)
        cnt.runs_created += len(fresh)
        cnt.live_runs += len(fresh)
        if cnt.live_runs > cnt.peak_runs:
            cnt.peak_runs = cnt.live_runs
        if self.tick % self.SWEEP_EVERY == 0:
            self.sweep()
        return out

    def _begins(self, comp: ComponentPlan, vec: tuple, first_ts: float, rkey: Any, ev: Event, ek: Any) -> bool:
        """The begin condition of ``comp`` (type, equivalence, window, predicates) — no negation."""
        if comp.event_type is not None and comp.event_type != ev.type:
            return False
        if rkey is not None and ek != rkey:
            return False
        w = comp.plan.window
        if w is not None and ev.ts - first_ts > w:
            return False
        for p in comp.begin:
            if not p(ev, vec):
                return False
        return True

    def _step(self, r: Run, ev: Event, ek: Any, fresh: list[Run], accepted: list) -> None:
        st = r.state
        comp = st.comp
        w = st.plan.window
        if w is not None and ev.ts - r.first_ts > w:
            return  # pruned by the window: no move can hold any more
        moves: list[tuple[str, Any]] = []
        if st.mode == "wait":
            begin = self._begins(comp, r.vec, r.first_ts, r.key, ev, ek)
            if begin:
                moves.append(("begin", comp))
            if _ignores(comp.contiguity, begin, ek, r.key):
                moves.append(("stay", False))
        else:
            take = self._takes(comp, r, ev, ek)
            ignore = _ignores(comp.inner, take, ek, r.key)
            if take:
                moves.append(("take", None))
            nxt = comp.next
            blocked = r.blocked
            if nxt is not None:
                check_stnm = ignore and nxt.contiguity is STNM and not r.blocked
                can_proceed = self._retro_ok(r, nxt, ek) and self._final_ok(comp, r.vec)
                if can_proceed or check_stnm:
                    bq = self._begins(nxt, r.vec, r.first_ts, r.key, ev, ek)
                    if check_stnm and bq:
                        blocked = True
                    if can_proceed:
                        if bq:
                            moves.append(("begin", nxt))
                        elif not take and not ignore and _ignores(nxt.contiguity, False, ek, r.key):
                            moves.append(("wait", nxt))
            if ignore:
                moves.append(("stay", blocked))
        if not moves:
            return
        # Dewey versions: one branch (the run that stays, else the take) keeps the
        # run's version; every other branch gets it extended by a fresh number.
        keeper = len(moves) - 1 if moves[-1][0] == "stay" else 0
        for j, (kind, arg) in enumerate(moves):
            version = r.version if j == keeper else r.version + (next(self._branches),)
            if kind == "stay":
                r.version = version
                r.blocked = arg
                fresh.append(r)
            elif kind == "begin":
                self._enter(arg, r, version, ev, fresh, accepted)
            elif kind == "take":
                self._take(comp, r, version, ev, fresh, accepted)
            else:  # opportunistic move: wait at the next component, which ignores ev
                fresh.append(Run(arg.wait, r.vec, r.entry, version, r.first_ts, r.first_seq, r.key))

    def _takes(self, comp: ComponentPlan, r: Run, ev: Event, ek: Any) -> bool:
        if comp.event_type is not None and comp.event_type != ev.type:
            return False
        if r.key is not None and ek != r.key:
            return False
        w = comp.plan.window
        if w is not None and ev.ts - r.first_ts > w:
            return False
        vec = r.vec
        for p in comp.take:
            if not p(ev, vec):
                return False
        return True

    def _retro_ok(self, r: Run, nxt: ComponentPlan, ek: Any) -> bool:
        """Were all events the run ignored inside its Kleene ignorable by ``nxt``'s contiguity?"""
        c = nxt.contiguity
        if c is STAM:
            return True
        if c is STNM:
            return not r.blocked
        plan = r.state.plan
        if c is STRICT or not plan.partition_by:
            return self.tick - 1 == r.tick
        seen = self.pticks[plan.partition_by].get(r.key, 0)
        return seen - (1 if ek == r.key else 0) == r.ptick

    @staticmethod
    def _final_ok(comp: ComponentPlan, vec: tuple) -> bool:
        for p in comp.final:
            if not p(None, vec):
                return False
        return True

    def _negation_ok(self, negs: list[NegationPlan], vec: tuple, key: Any) -> bool:
        for neg in negs:
            bucket = self.neg_store[neg].get(key)
            if not bucket:
                continue
            seqs, events = bucket
            lo = _last_seq(vec[neg.lower])
            hi = _first_seq(vec[neg.upper])
            for i in range(bisect_right(seqs, lo), bisect_left(seqs, hi)):
                x = events[i]
                if all(p(x, vec) for p in neg.cross_preds):
                    return False
        return True

    def _enter(self, comp: ComponentPlan, r: Run, version: Version, ev: Event, fresh: list[Run], accepted: list) -> None:
        """Begin ``comp`` with ``ev`` (from a wait state, a proceed, or a new run)."""
        entry = self.buffer.add(comp, comp.index, ev, version, r.entry)
        i = comp.index
        val = kleene_start(ev, comp.agg_slots, comp.keep_events) if comp.kleene else ev
        vec = r.vec[:i] + (val,) + r.vec[i + 1 :]
        if comp.neg_at_begin and not self._negation_ok(comp.neg_at_begin, vec, r.key):
            return
        if comp.kleene:
            self._arrive_inside(comp, vec, entry, version, r, fresh, accepted)
        elif comp.next is None:
            self._complete(comp.plan, vec, entry, version, r, accepted)
        else:
            fresh.append(Run(comp.next.wait, vec, entry, version, r.first_ts, r.first_seq, r.key))

    def _take(self, comp: ComponentPlan, r: Run, version: Version, ev: Event, fresh: list[Run], accepted: list) -> None:
        entry = self.buffer.add(comp, comp.index, ev, version, r.entry)
        i = comp.index
        vec = r.vec[:i] + (kleene_take(r.vec[i], ev, comp.agg_slots),) + r.vec[i + 1 :]
        self._arrive_inside(comp, vec, entry, version, r, fresh, accepted)

    def _arrive_inside(self, comp, vec, entry, version, r: Run, fresh: list[Run], accepted: list) -> None:
        plan = comp.plan
        ptick = 0
        if comp.next is not None and comp.next.contiguity is PARTITION and plan.partition_by:
            ptick = self.pticks[plan.partition_by].get(r.key, 0)
        fresh.append(Run(comp.inside, vec, entry, version, r.first_ts, r.first_seq, r.key, self.tick, ptick))
        if comp.next is None and self._final_ok(comp, vec):
            if not comp.neg_at_final or self._negation_ok(comp.neg_at_final, vec, r.key):
                self._complete(plan, vec, entry, version, r, accepted)

    def _complete(self, plan: QueryPlan, vec, entry, version, r: Run, accepted: list) -> None:
        """A run reached the final state."""
        match = self._match(plan, entry, version, vec)
        if plan.trailing is not None:
            last = entry.event
            p = Pending(plan, r.key, vec, last.seq, r.first_ts + plan.window, match)
            self.pending[plan].setdefault(r.key, []).append(p)
            heapq.heappush(self.deadlines, (p.deadline, next(self._order), p))
            return
        accepted.append((plan, r.key, match))

    def _match(self, plan: QueryPlan, entry, version: Version, vec: tuple) -> dict:
        binds: dict[str, list[int]] = {c.var: [] for c in plan.comps}
        names = [c.var for c in plan.comps]
        start = end = None
        for unit, e in MatchBuffer.extract(entry, version):
            binds[names[unit]].append(e.seq)
            if start is None:
                start = e.ts
            end = e.ts
        m = {"query": plan.name, "bindings": binds, "start": start, "end": end}
        if plan.emit is not None:
            etype, attrs = plan.emit
            m["emit"] = {"type": etype, "attrs": {k: _plain(g(None, vec)) for k, g in attrs}}
        return m

    # --- negation, deadlines, policy --------------------------------------------------

    def _see_negated(self, plan: QueryPlan, neg: NegationPlan, ev: Event, ek: Any) -> None:
        if plan.partition_by and ek is None:
            return
        if not all(p(ev, ()) for p in neg.self_preds):
            return
        if neg.upper is not None:
            store = self.neg_store[neg]
            b = store.get(ek)
            if b is None:
                b = store[ek] = ([], [])
            b[0].append(ev.seq)
            b[1].append(ev)
            return
        for p in self.pending[plan].get(ek, ()):
            if not p.killed and ev.seq > p.last_seq and ev.ts <= p.deadline:
                if all(c(ev, p.vec) for c in neg.cross_preds):
                    p.killed = True

    def _expire(self, now: float, everything: bool = False) -> list[dict]:
        out = []
        while self.deadlines and (everything or self.deadlines[0][0] < now):
            _, _, p = heapq.heappop(self.deadlines)
            group = self.pending.get(p.plan, {}).get(p.key)
            if group is not None:
                group.remove(p)
                if not group:
                    del self.pending[p.plan][p.key]
            if not p.killed:
                out.append(p.match)
                self.counters.matches[p.plan.name] += 1
        return out

    def _accept(self, accepted: list[tuple[QueryPlan, Any, dict]], fresh: list[Run]) -> list[dict]:
        out = []
        chosen: dict[tuple[QueryPlan, Any], dict] = {}
        for plan, key, m in accepted:
            if plan.policy == "non_overlapping":
                cur = chosen.get((plan, key))
                if cur is None or _overlap_rank(plan, m) < _overlap_rank(plan, cur):
                    chosen[(plan, key)] = m
            else:
                out.append(m)
                self.counters.matches[plan.name] += 1
        for (plan, key), m in chosen.items():
            out.append(m)
            self.counters.matches[plan.name] += 1
            self._discard(plan, key, fresh)
        return out

    def _discard(self, plan: QueryPlan, key: Any, fresh: list[Run]) -> None:
        """non_overlapping: drop every run of ``plan``'s partition ``key`` (all began at or before now)."""
        for st in plan.states:
            b = self.buckets[st]
            if plan.partition_by:
                self.counters.live_runs -= len(b.pop(key, ()))
            else:
                self.counters.live_runs -= sum(len(x) for x in b.values())
                b.clear()
        fresh[:] = [r for r in fresh if r.state.plan is not plan or (plan.partition_by and r.key != key)]

    def advance_time(self, ts: float) -> list[dict]:
        """The stream time moves to ``ts`` with no event: deadlines before it fire."""
        if ts > self.now:
            self.now = ts
        return self._expire(ts)

    def flush(self) -> list[dict]:
        """End of input: every pending trailing-negation match is decided."""
        return self._expire(0, everything=True)

    # --- pruning ----------------------------------------------------------------------

    def sweep(self) -> None:
        """Drop runs past their window; prune buffer stacks and negation stores no run can reach."""
        now = self.now
        oldest: dict[QueryPlan, int] = {}
        live = 0
        for st, buckets in self.buckets.items():
            w = st.plan.window
            floor = oldest.get(st.plan, _NO_RUN)
            for k in list(buckets):
                runs = buckets[k]
                if w is not None:
                    runs = [r for r in runs if now - r.first_ts <= w]
                    if runs:
                        buckets[k] = runs
                    else:
                        del buckets[k]
                        continue
                live += len(runs)
                floor = min(floor, min(r.first_seq for r in runs))
            oldest[st.plan] = floor
        self.counters.live_runs = live
        self.counters.peak_buffer = max(self.counters.peak_buffer, self.buffer.size)
        for plan in self.plans:
            floor = oldest.get(plan, _NO_RUN)
            for c in plan.comps:
                self.buffer.prune_before(c, floor)
            for neg in plan.negations:
                if neg.upper is None:
                    continue
                store = self.neg_store[neg]
                for k in list(store):
                    seqs, events = store[k]
                    cut = bisect_left(seqs, floor)
                    if cut:
                        del seqs[:cut], events[:cut]
                    if not seqs:
                        del store[k]

    def state_count(self) -> int:
        return len(self.buckets)


# --- helpers ------------------------------------------------------------------------


class _TypeProbe:
    __slots__ = ("type",)

    def __init__(self, t: str):
        self.type = t


_NO_RUN = 1 << 62  # seq floor when a plan has no live run


def _ignores(c: Contiguity, moved: bool, ek: Any, rkey: Any) -> bool:
    if c is STAM:
        return True
    if c is STNM:
        return not moved
    if c is PARTITION:
        return ek != rkey
    return False


def _last_seq(v) -> int:
    return v.seq if isinstance(v, Event) else v.last.seq


def _first_seq(v) -> int:
    return v.seq if isinstance(v, Event) else v.first.seq


def _overlap_rank(plan: QueryPlan, m: dict) -> tuple:
    lists = [m["bindings"][c.var] for c in plan.comps]
    flat = sorted(s for lst in lists for s in lst)
    return (flat[0], flat, lists)


def _plain(v: Any) -> Any:
    return None if v is MISSING else v

