"""The NFA^b runtime over the shared NFA (SIGMOD 2008 §4, YFilter++ §6).

Runs wait in states of the shared NFA (``yfpp.shared_nfa``) and are stored so
that an event touches only runs it can move:

* ``keyed``   — runs of keyed states, by equivalence attributes → key value →
                state: an event looks up its own key, then keeps the states
                that react to its type (partition-contiguity states always do);
* ``unkeyed`` — runs of states without an equivalence list, by state; an
                event visits the states that react to its type;
* ``strict``  — strict-contiguity states: every event moves or kills their runs.

Starting runs goes through the root level's transition table (type, then
indexed predicates).  Matches are stored once in the shared versioned
:class:`MatchBuffer`; what differs between queries that share a node —
window, negations, RETURN, registration time — is checked when a run reaches
a node where queries accept (post-processing, YFilter++ §6.4–§6.5).
"""

from __future__ import annotations

import heapq
from bisect import bisect_left, bisect_right
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from itertools import count
from typing import Any, Callable

from yfpp.events import MISSING, Event
from yfpp.match_buffer import MatchBuffer, Version
from yfpp.match_id import match_id
from yfpp.nfa_compiler import NegationPlan, QueryPlan
from yfpp.pattern import Contiguity
from yfpp.predicates import kleene_start, kleene_take
from yfpp.run_merging import Members, RunMerger, member_completions
from yfpp.shared_nfa import Node, SharedNFA, State

STRICT, PARTITION, STNM, STAM = (
    Contiguity.STRICT,
    Contiguity.PARTITION,
    Contiguity.SKIP_TILL_NEXT,
    Contiguity.SKIP_TILL_ANY,
)
_NONE: frozenset = frozenset()
_NO_RUN = 1 << 62  # seq floor when a tree has no live run


class Run:
    """One partial match: where it waits, what it has bound, where its events are."""

    __slots__ = ("state", "vec", "entry", "version", "first_ts", "first_pos", "key", "born", "tick", "ptick", "blocked",
                 "members")

    def __init__(self, state, vec, entry, version, first_ts, first_pos, key, born, tick=0, ptick=0):
        self.state: State = state
        self.vec: tuple = vec
        self.entry = entry
        self.version: Version = version
        self.first_ts: float = first_ts
        self.first_pos: int = first_pos  # stream position of the run's first event
        self.key: Any = key
        self.born: int = born  # tick of the event that started the run
        self.tick: int = tick  # tick of the last begin/take into a Kleene node
        self.ptick: int = ptick  # partition tick at that moment
        self.blocked: frozenset = _NONE  # skip-till-next children this run can no longer proceed to
        self.members: Members | None = None  # the runs a merged run stands for (yfpp.run_merging)

    def with_blocked(self, blocked: frozenset) -> "Run":
        """A copy that differs in ``blocked`` (runs being stepped are never mutated: see ``Runtime.process``)."""
        r = Run(self.state, self.vec, self.entry, self.version, self.first_ts, self.first_pos, self.key, self.born, self.tick, self.ptick)
        r.blocked = blocked
        return r


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


@dataclass
class Counters:
    events: int = 0
    runs_started: int = 0  # runs begun by an event at a root
    runs_created: int = 0  # run objects made: starts, splits and every Kleene take
    runs_touched: int = 0
    live_runs: int = 0
    peak_runs: int = 0
    peak_buffer: int = 0
    failed: int = 0  # events whose processing raised (rolled back, reported as dead letters)
    matches: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    shed_runs: dict[str, int] = field(default_factory=lambda: defaultdict(int))  # by query: runs dropped by a cap


def partition_key(ev: Event, attrs: tuple[str, ...]) -> Any:
    """The equivalence-key value of ``ev`` (``None`` if it lacks one of ``attrs``)."""
    if not attrs:
        return None
    if len(attrs) == 1:
        v = ev.get(attrs[0])
        return None if v is MISSING else v
    vals = tuple(ev.get(a) for a in attrs)
    return None if MISSING in vals else vals


def _touch_all(st: State) -> bool:
    """Strict states, and partition states with no equivalence list: every event moves or kills."""
    return st.contiguity is STRICT or (st.contiguity is PARTITION and not st.node.partition_by)


class Runtime:
    """Runs every registered query, merged into one shared NFA, over one ordered stream."""

    SWEEP_EVERY = 256  # events between sweeps, at least
    GROWTH_REPORT = 10_000  # runs + buffered events of a windowless branch at its first "growing" report

    def __init__(self, max_runs: int = 250_000, max_buffer: int = 1_000_000,
                 on_error: Callable[[Event, Exception], None] | None = None,
                 report: Callable[[str], None] | None = None, merge_runs: bool = False) -> None:
        self.max_runs = max_runs  # per branch of the shared NFA (see ``_shed``)
        self.max_buffer = max_buffer
        self.on_error = on_error or _raise
        self.report = report or (lambda msg: None)
        self.nfa = SharedNFA()
        self.buffer = MatchBuffer()
        self.keyed: dict[tuple[str, ...], dict[Any, dict[State, list[Run]]]] = {}
        self.unkeyed: dict[State, list[Run]] = {}
        self.strict: dict[State, list[Run]] = {}
        self.dead: set[State] = set()
        self.neg_store: dict[NegationPlan, dict[Any, tuple[list[int], list[Event]]]] = {}
        self.neg_root: dict[NegationPlan, Node] = {}  # the trie branch whose runs a store serves
        self.negs_by_type: dict[str | None, list[tuple[QueryPlan, NegationPlan]]] = defaultdict(list)
        self.pending: dict[QueryPlan, dict[Any, list[Pending]]] = {}
        self.deadlines: list[tuple[float, int, Pending]] = []
        self.pticks: dict[tuple[str, ...], dict[Any, int]] = {}
        self.ptick_users: Counter = Counter()
        self.counters = Counters()
        self.branch_queries: dict[Node, list[QueryPlan]] = {}  # root node -> queries through it
        self.tick = 0
        self.now = float("-inf")
        self._roots = count()
        self._branches = count(1)
        self._order = count()
        self._reacts: dict[tuple[int, str], bool] = {}
        self._next_sweep = self.SWEEP_EVERY
        self.full_events = False  # matches list their bound events in full ("events")
        self.fed: list[tuple[QueryPlan, dict, Any]] = []  # matches of feedback queries, drained by yfpp.feedback
        self.merger = RunMerger() if merge_runs else None  # merging equivalent runs (yfpp.run_merging)

    # --- registration ---------------------------------------------------------------

    def add(self, plan: QueryPlan) -> None:
        """Register a compiled query; it sees only events processed from now on."""
        plan.since_tick = self.tick
        self.nfa.add(plan)
        for neg in plan.negations:
            self.negs_by_type[neg.event_type].append((plan, neg))
            if neg.upper is not None:
                self.neg_store[neg] = {}
                self.neg_root[neg] = plan.nodes[0]
        if plan.trailing is not None:
            self.pending[plan] = {}
        self.branch_queries.setdefault(plan.nodes[0].root, []).append(plan)
        if self._needs_pticks(plan):
            self.ptick_users[plan.partition_by] += 1
            self.pticks.setdefault(plan.partition_by, {})
        if plan.partition_by:
            self.keyed.setdefault(plan.partition_by, {})
        self._reacts.clear()
        if self.merger is not None:
            self.merger.reset(self)

    def remove(self, plan: QueryPlan) -> None:
        """Unregister: the query emits nothing more; states only it used are freed at the next sweep."""
        for st in self.nfa.remove(plan):
            self.dead.add(st)
        for neg in plan.negations:
            self.negs_by_type[neg.event_type].remove((plan, neg))
            self.neg_store.pop(neg, None)
            self.neg_root.pop(neg, None)
        for group in self.pending.pop(plan, {}).values():
            for p in group:
                p.killed = True
        root = plan.nodes[0].root
        self.branch_queries[root].remove(plan)
        if not self.branch_queries[root]:
            del self.branch_queries[root]
        if self._needs_pticks(plan):
            self.ptick_users[plan.partition_by] -= 1
            if not self.ptick_users[plan.partition_by]:
                del self.ptick_users[plan.partition_by], self.pticks[plan.partition_by]
        for node in plan.nodes:
            if not node.users:
                self.buffer.drop(node)
        self._reacts.clear()
        if self.merger is not None:
            self.merger.reset(self)

    @staticmethod
    def _needs_pticks(plan: QueryPlan) -> bool:
        return bool(plan.partition_by) and any(
            a.kleene and b.contiguity is PARTITION for a, b in zip(plan.specs, plan.specs[1:])
        )

    def _reacts_to(self, st: State, etype: str) -> bool:
        k = (st.id, etype)
        r = self._reacts.get(k)
        if r is None:
            r = self._reacts[k] = st.reacts_to(etype)
        return r

    # --- the per-event step -----------------------------------------------------------

    def process(self, ev: Event) -> list[dict]:
        """Advance every run by one event (already in stream order); return completed matches.

        Two phases: ``_advance`` computes every move without changing stored
        state (runs it steps are taken out of their stores and never mutated),
        then the commit stores the results.  If ``_advance`` raises (a
        predicate failing on this record, an unhashable key…), the runs go
        back, the buffer entries made for ``ev`` are dropped and ``on_error``
        reports the event: the stream goes on as if it had not been there.
        """
        now0 = self.now
        self.tick += 1
        ev.pos = self.tick
        self.now = ev.ts
        out: list[dict] = self._expire(ev.ts) if self.deadlines else []
        touched: list[tuple[list[Run], Any]] = []
        bumped: list[tuple[dict, Any]] = []
        try:
            moved, fresh, accepted, negated, kills, started, n_touched = self._advance(ev, touched, bumped)
        except BaseException as exc:
            self._undo(ev, now0, touched, bumped)
            if not isinstance(exc, Exception):
                raise
            self.counters.failed += 1
            self.on_error(ev, exc)
            return out
        cnt = self.counters
        cnt.events += 1
        cnt.runs_started += started
        cnt.runs_touched += n_touched
        if self.merger is not None:
            self.merger.merge(self, moved, fresh)
        live = cnt.live_runs
        for runs, stays in moved:
            delta = len(stays) - len(runs)
            if delta:
                live += delta
                runs[0].state.node.root.live += delta
            if stays:  # same state and key as before: back into their store in one step
                self._store_many(stays)
        cnt.live_runs = live
        for neg, ek in negated:
            b = self.neg_store[neg].get(ek)
            if b is None:
                b = self.neg_store[neg][ek] = ([], [])
            b[0].append(ev.pos)
            b[1].append(ev)
        for p in kills:
            p.killed = True
        if accepted:
            out.extend(self._accept(accepted, fresh))
        cap = self.max_runs
        over: list[Node] = []
        for r in fresh:
            self._store_many([r])
            root = r.state.node.root
            root.live += 1
            if root.live > cap and root not in over:
                over.append(root)
        cnt.runs_created += len(fresh)
        cnt.live_runs += len(fresh)
        if cnt.live_runs > cnt.peak_runs:
            cnt.peak_runs = cnt.live_runs
        for root in over:
            self._shed(root, "runs", cap)
        if self.buffer.size > self.max_buffer and not self.tick & 63:
            self._check_buffer_caps()
        if self.tick >= self._next_sweep:
            self.sweep()
        return out

    def _advance(self, ev: Event, touched: list, bumped: list) -> tuple:
        """Every move on ``ev``; stored state changes only by runs leaving their stores into ``touched``."""
        etype = ev.type
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
                bumped.append((ticks, k))
        negated: list[tuple[NegationPlan, Any]] = []
        kills: list[Pending] = []
        for etest in (etype, None):
            for plan, neg in self.negs_by_type.get(etest, ()):
                self._see_negated(plan, neg, ev, key_of(plan.partition_by), negated, kills)

        fresh: list[Run] = []
        accepted: list[tuple[QueryPlan, Any, dict, list]] = []
        if self.strict:
            strict, self.strict = self.strict, {}
            for runs in strict.values():
                touched.append((runs, None))
            for i, (runs, _) in enumerate(touched):
                if runs:
                    touched[i] = (runs, key_of(runs[0].state.node.partition_by))
        for attrs, by_key in self.keyed.items():
            k = key_of(attrs)
            states = by_key.get(k) if k is not None else None
            if not states:
                continue
            for st in [s for s in states if s.contiguity is PARTITION or self._reacts_to(s, etype)]:
                touched.append((states.pop(st), k))
            if not states:
                del by_key[k]
        if self.unkeyed:
            for st in [s for s in self.unkeyed if self._reacts_to(s, etype)]:
                touched.append((self.unkeyed.pop(st), None))
        dead = self.dead
        moved: list[tuple[list[Run], list[Run]]] = []
        n_touched = 0
        for runs, ek in touched:
            if not runs:
                continue
            n_touched += len(runs)
            stays: list[Run] = []
            for r in runs:
                if r.state not in dead:
                    if r.members is None:
                        self._step(r, ev, ek, fresh, stays, accepted)
                    else:
                        self.merger.step(self, r, ev, ek, fresh, stays, accepted)
            moved.append((runs, stays))
        started = 0
        for node in self.nfa.starters.candidates(ev):
            ek = key_of(node.partition_by)
            if node.partition_by and ek is None:
                continue
            vec = (None,) * (node.index + 1)
            if self._begins(node, vec, ev.ts, ek, ev, ek):
                started += 1
                base = Run(None, vec, None, (next(self._roots),), ev.ts, ev.pos, ek, self.tick)
                self._enter(node, base, base.version, ev, fresh, accepted)
        return moved, fresh, accepted, negated, kills, started, n_touched

    def _undo(self, ev: Event, now0: float, touched: list, bumped: list) -> None:
        """Put the stored state back as it was before ``ev`` (see ``process``)."""
        for ticks, k in bumped:
            ticks[k] -= 1
            if not ticks[k]:
                del ticks[k]
        for runs, _ in touched:
            if runs:
                self._store_many(runs)
        self.buffer.forget(ev)
        self.tick -= 1
        self.now = now0
        ev.pos = -1

    def _store_many(self, runs: list[Run]) -> None:
        """Store runs that all wait in the same state with the same key."""
        r = runs[0]
        st = r.state
        if _touch_all(st):
            store = self.strict
        elif st.node.partition_by:
            store = self.keyed[st.node.partition_by].setdefault(r.key, {})
        else:
            store = self.unkeyed
        lst = store.get(st)
        if lst is None:
            store[st] = runs
        else:
            lst.extend(runs)

    @staticmethod
    def _begins(node: Node, vec: tuple, first_ts: float, rkey: Any, ev: Event, ek: Any) -> bool:
        """The begin condition of ``node`` (type, equivalence, window, predicates)."""
        if node.event_type is not None and node.event_type != ev.type:
            return False
        if rkey is not None and ek != rkey:
            return False
        w = node.window
        if w is not None and ev.ts - first_ts > w:
            return False
        for p in node.begin:
            if not p(ev, vec):
                return False
        return True

    @staticmethod
    def _takes(node: Node, r: Run, ev: Event, ek: Any) -> bool:
        if node.event_type is not None and node.event_type != ev.type:
            return False
        if r.key is not None and ek != r.key:
            return False
        w = node.window
        if w is not None and ev.ts - r.first_ts > w:
            return False
        vec = r.vec
        for p in node.take:
            if not p(ev, vec):
                return False
        return True

    def _step(self, r: Run, ev: Event, ek: Any, fresh: list[Run], stays: list[Run], accepted: list) -> None:
        """Every move ``r`` makes on ``ev``: new runs go to ``fresh``; ``r`` itself, if it stays, to ``stays``."""
        st = r.state
        w = st.node.window
        if w is not None and ev.ts - r.first_ts > w:
            return  # pruned by the window: no move can hold any more
        moves: list[tuple[str, Any]] = []
        if st.mode == "wait":
            for child in st.table.candidates(ev):
                if self._begins(child, r.vec, r.first_ts, r.key, ev, ek):
                    moves.append(("begin", child))
            if _ignores(st.contiguity, bool(moves), ek, r.key):
                moves.append(("stay", r.blocked))
        else:
            node = st.node
            take = self._takes(node, r, ev, ek)
            ignore = _ignores(node.inner, take, ek, r.key)
            if take:
                moves.append(("take", None))
            blocked = r.blocked
            if node.waits:
                final = None
                for wait in node.waits.values():
                    c = wait.contiguity
                    check_block = c is STNM and ignore and wait.child not in blocked
                    can_proceed = self._retro_ok(r, wait, ek)
                    if can_proceed:
                        if final is None:
                            final = self._final_ok(node, r.vec)
                        can_proceed = final
                    if not (can_proceed or check_block):
                        continue
                    began = [q for q in wait.table.candidates(ev) if self._begins(q, r.vec, r.first_ts, r.key, ev, ek)]
                    if check_block and began:
                        blocked = blocked | {wait.child}
                    if can_proceed:
                        moves.extend(("begin", q) for q in began)
                        if not take and not ignore and _ignores(c, bool(began), ek, r.key):
                            moves.append(("wait", wait))
            if ignore:
                moves.append(("stay", blocked))
        if not moves:
            return
        # Dewey versions: one branch (the run that stays, else the first) keeps the
        # run's version; every other branch gets it extended by a fresh number.
        keeper = len(moves) - 1 if moves[-1][0] == "stay" else 0
        for j, (kind, arg) in enumerate(moves):
            version = r.version if j == keeper else r.version + (next(self._branches),)
            if kind == "stay":  # keeps r.version (keeper); a new ``blocked`` makes a copy
                stays.append(r if arg is r.blocked else r.with_blocked(arg))
            elif kind == "begin":
                self._enter(arg, r, version, ev, fresh, accepted)
            elif kind == "take":
                self._take(st.node, r, version, ev, fresh, accepted)
            else:  # opportunistic move: wait for the next component, which ignored ev
                fresh.append(Run(arg, r.vec, r.entry, version, r.first_ts, r.first_pos, r.key, r.born))

    def _retro_ok(self, r: Run, wait: State, ek: Any) -> bool:
        """Were all events the run ignored inside its Kleene ignorable under ``wait``'s contiguity?"""
        c = wait.contiguity
        if c is STAM:
            return True
        if c is STNM:
            return wait.child not in r.blocked
        attrs = wait.node.partition_by
        if c is STRICT or not attrs:
            return self.tick - 1 == r.tick
        seen = self.pticks[attrs].get(r.key, 0)
        return seen - (1 if ek == r.key else 0) == r.ptick

    @staticmethod
    def _final_ok(node: Node, vec: tuple) -> bool:
        for p in node.final:
            if not p(None, vec):
                return False
        return True

    def _enter(self, node: Node, r: Run, version: Version, ev: Event, fresh: list[Run], accepted: list) -> None:
        """Begin ``node`` with ``ev`` (from a wait state, a proceed, or a new run)."""
        entry = self.buffer.add(node, node.index, ev, version, r.entry)
        i = node.index
        val = kleene_start(ev, node.agg_slots, node.keep_events) if node.kleene else ev
        vec = r.vec[:i] + (val,)  # a run's vec ends with a free slot for the node it may begin
        if node.kleene:
            self._arrive_inside(node, vec, entry, version, r, fresh, accepted)
            return
        if node.accepts:
            self._complete(node, vec, entry, version, r, accepted)
        for wait in node.waits.values():
            fresh.append(Run(wait, vec + (None,), entry, version, r.first_ts, r.first_pos, r.key, r.born))

    def _take(self, node: Node, r: Run, version: Version, ev: Event, fresh: list[Run], accepted: list) -> None:
        entry = self.buffer.add(node, node.index, ev, version, r.entry)
        i = node.index
        vec = r.vec[:i] + (kleene_take(r.vec[i], ev, node.agg_slots),)
        self._arrive_inside(node, vec, entry, version, r, fresh, accepted)

    def _arrive_inside(self, node: Node, vec, entry, version, r: Run, fresh: list[Run], accepted: list) -> None:
        ptick = self.pticks[node.partition_by].get(r.key, 0) if node.partition_by in self.pticks else 0
        run = Run(node.inside, vec + (None,), entry, version, r.first_ts, r.first_pos, r.key, r.born, self.tick, ptick)
        fresh.append(run)
        if node.accepts and self._final_ok(node, vec):
            self._complete(node, vec, entry, version, r, accepted)

    def _complete(self, node: Node, vec: tuple, entry, version: Version, r: Run, accepted: list) -> None:
        """A run bound the last component of the queries accepting at ``node``: post-process per query."""
        last_ts = entry.event.ts
        for version, first_ts, born in member_completions(r, version, entry):  # one run, or each run merged into r
            self._complete_run(node, vec, entry, version, first_ts, born, r.key, last_ts, accepted)

    def _complete_run(self, node: Node, vec: tuple, entry, version: Version, first_ts: float, born: int, key: Any,
                      last_ts: float, accepted: list) -> None:
        binds = None
        for plan in node.accepts:
            if born <= plan.since_tick:
                continue  # started before the query was registered
            if plan.window is not None and last_ts - first_ts > plan.window:
                continue
            if not self._negation_ok(plan, vec, key):
                continue
            if binds is None:
                binds = MatchBuffer.extract(entry, version)
            match = self._match(plan, binds, vec)
            if plan.trailing is not None:
                p = Pending(plan, key, vec, entry.event.pos, first_ts + plan.window, match)
                self.pending[plan].setdefault(key, []).append(p)
                heapq.heappush(self.deadlines, (p.deadline, next(self._order), p))
            else:
                accepted.append((plan, key, match, binds))

    def _negation_ok(self, plan: QueryPlan, vec: tuple, key: Any) -> bool:
        for neg in plan.negations:
            if neg.upper is None:
                continue
            bucket = self.neg_store[neg].get(key)
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

    def _match(self, plan: QueryPlan, binds: list[tuple[int, Event]], vec: tuple) -> dict:
        names = plan.var_names
        seqs: dict[str, list[int | str]] = {v: [] for v in names}
        for unit, e in binds:
            seqs[names[unit]].append(e.seq)
        m = {"query": plan.name, "id": match_id(plan.name, seqs), "bindings": seqs, "start": binds[0][1].ts, "end": binds[-1][1].ts}
        if plan.emit is not None:
            etype, attrs = plan.emit
            m["emit"] = {"type": etype, "attrs": {k: _plain(g(None, vec)) for k, g in attrs}}
        if self.full_events:
            events: dict[str, list[dict]] = {v: [] for v in names}
            for unit, e in binds:
                events[names[unit]].append(e.describe())
            m["events"] = events
        return m

    def _emitted(self, plan: QueryPlan, m: dict, binds: list | None, out: list[dict]) -> None:
        """Output match ``m``; a feedback query's also goes to ``fed``, ranked by its bound events (None: a deadline's)."""
        out.append(m)
        self.counters.matches[plan.name] += 1
        if plan.pattern.feedback:
            self.fed.append((plan, m, binds and _overlap_rank(len(plan.var_names), binds)))

    # --- negation, deadlines, policy --------------------------------------------------

    def _see_negated(self, plan: QueryPlan, neg: NegationPlan, ev: Event, ek: Any, negated: list, kills: list) -> None:
        """A candidate for ``neg``: goes to its store (middle) or kills pending matches (trailing) at commit."""
        if plan.partition_by and ek is None:
            return
        if not all(p(ev, ()) for p in neg.self_preds):
            return
        if neg.upper is not None:
            negated.append((neg, ek))
            return
        for p in self.pending[plan].get(ek, ()):
            if not p.killed and ev.pos > p.last_pos and ev.ts <= p.deadline:
                if all(c(ev, p.vec) for c in neg.cross_preds):
                    kills.append(p)

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
                self._emitted(p.plan, p.match, None, out)
        return out

    def _accept(self, accepted: list[tuple[QueryPlan, Any, dict, list]], fresh: list[Run]) -> list[dict]:
        out: list[dict] = []
        chosen: dict[tuple[int, Any], tuple[QueryPlan, dict, tuple, list]] = {}
        for plan, key, m, binds in accepted:
            if plan.policy == "non_overlapping":
                rank = _overlap_rank(len(plan.var_names), binds)
                cur = chosen.get((id(plan), key))
                if cur is None or rank < cur[2]:
                    chosen[(id(plan), key)] = (plan, m, rank, binds)
            else:
                self._emitted(plan, m, binds, out)
        for (_, key), (plan, m, _, binds) in chosen.items():
            self._emitted(plan, m, binds, out)
            self._discard(plan, key, fresh)
        return out

    def _discard(self, plan: QueryPlan, key: Any, fresh: list[Run]) -> None:
        """non_overlapping: drop every run of ``plan``'s partition ``key`` (all began at or before now).

        Such a query's nodes are private to it (its signature includes the query)."""
        nodes = set(plan.nodes)
        root = plan.nodes[0].root
        gone = 0
        for st, runs in list(self.strict.items()):
            if st.node in nodes:
                kept = [r for r in runs if plan.partition_by and r.key != key]
                gone += len(runs) - len(kept)
                self.strict[st] = kept
        if plan.partition_by:
            states = self.keyed[plan.partition_by].get(key, {})
            for st in [s for s in states if s.node in nodes]:
                gone += len(states.pop(st))
        else:
            for st in [s for s in self.unkeyed if s.node in nodes]:
                gone += len(self.unkeyed.pop(st))
        self.counters.live_runs -= gone
        root.live -= gone
        fresh[:] = [r for r in fresh if r.state.node not in nodes or (plan.partition_by and r.key != key)]

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
        """Drop runs of removed states and past their window; prune what no run can reach."""
        now = self.now
        floor: dict[Node, int] = {}
        per_root: Counter = Counter()
        live = 0

        def keep(st: State, runs: list[Run]) -> list[Run]:
            nonlocal live
            if st in self.dead:
                return []
            w = st.node.window
            if w is not None:
                runs = [r for r in runs if now - r.first_ts <= w]
                if self.merger is not None:
                    runs = self.merger.trim(runs, now, w)
            if runs:
                live += len(runs)
                root = st.node.root
                per_root[root] += len(runs)
                floor[root] = min(floor.get(root, _NO_RUN), min(r.first_pos for r in runs))
            return runs

        for store in self._stores():
            for st in list(store):
                runs = keep(st, store[st])
                if runs:
                    store[st] = runs
                else:
                    del store[st]
        for by_key in self.keyed.values():
            for k in [k for k, s in by_key.items() if not s]:
                del by_key[k]
        self.dead.clear()
        self.counters.live_runs = live
        for root in self.branch_queries:
            root.live = per_root.get(root, 0)
        stacks = self.buffer.stacks()  # only stacks that hold entries: the cost follows live state
        buffered: Counter = Counter()
        for node in stacks:
            buffered[node.root] += self.buffer.prune_before(node, floor.get(node.root, _NO_RUN))
        buckets = self._prune_negations(floor)
        self.counters.peak_buffer = max(self.counters.peak_buffer, self.buffer.size)
        self._report_growth(per_root, buffered)
        # amortised: the next sweep waits at least as many events as this one visited objects
        stores = len(self.strict) + len(self.unkeyed) + sum(len(b) for b in self.keyed.values())
        work = live + stores + len(stacks) + len(self.neg_store) + buckets
        self._next_sweep = self.tick + max(self.SWEEP_EVERY, work)

    def _stores(self) -> list[dict[State, list[Run]]]:
        return [self.strict, self.unkeyed, *(s for by_key in self.keyed.values() for s in by_key.values())]

    def _prune_negations(self, floor: dict[Node, int], only: Node | None = None) -> int:
        """Drop negation candidates before the first event of every live run of their branch."""
        buckets = 0
        for neg, store in self.neg_store.items():
            root = self.neg_root[neg]
            if only is not None and root is not only:
                continue
            cut_pos = floor.get(root, _NO_RUN)
            for k in list(store):
                positions, events = store[k]
                cut = bisect_left(positions, cut_pos)
                if cut:
                    del positions[:cut], events[:cut]
                if not positions:
                    del store[k]
            buckets += len(store)
        return buckets

    def _report_growth(self, per_root: Counter, buffered: Counter) -> None:
        """Say so when a branch some query of which has no window keeps growing (each doubling)."""
        for root, plans in self.branch_queries.items():
            if root.window is not None:
                continue
            size = per_root.get(root, 0) + buffered.get(root, 0)
            if size < max(self.GROWTH_REPORT, 2 * root.reported):
                continue
            root.reported = size
            names = ", ".join(repr(str(p.name)) for p in plans if p.window is None)
            self.report(
                f"query {names} has no window (WITHIN) and its state is growing: {per_root.get(root, 0):,} runs, "
                f"{buffered.get(root, 0):,} buffered events; at max_runs_per_query={self.max_runs:,} or "
                f"max_buffer_per_query={self.max_buffer:,} its oldest runs will be shed"
            )

    # --- caps ---------------------------------------------------------------------------

    def _branch_runs(self, root: Node) -> list[tuple[dict[State, list[Run]], State]]:
        """The stores and states of ``root``'s branch that hold runs."""
        found = []
        for store in self._stores():
            for st in store:
                if st.node.root is root:
                    found.append((store, st))
        return found

    def _shed(self, root: Node, what: str, cap: int) -> None:
        """Over a cap: drop the runs of the branch's oldest start events until it is at 3/4 of the cap.

        A branch is the part of the shared NFA under one first component: the
        queries in it share its runs, so a run is counted once, in its branch,
        and shedding it affects every query of the branch (all are named in
        the report).  Runs go by start event, oldest first, all runs of one
        start together: every match still reported is a true match, and the
        matches lost are exactly those starting at the shed events.
        """
        if self.merger is not None:
            self.merger.split_branch(self, root)
        where = self._branch_runs(root)
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
            for p in starts + [_NO_RUN]:
                cut = p
                if self._buffered(root, cut) <= target:
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
        for by_key in self.keyed.values():
            for k in [k for k, s in by_key.items() if not s]:
                del by_key[k]
        root.live -= gone
        self.counters.live_runs -= gone
        new_floor = min((r.first_pos for store, st in where if st in store for r in store[st]), default=_NO_RUN)
        for node in self.buffer.stacks():
            if node.root is root:
                self.buffer.prune_before(node, new_floor)
        self._prune_negations({root: new_floor}, only=root)
        if not gone:
            return
        plans = self.branch_queries.get(root, [])
        for plan in plans:
            self.counters.shed_runs[plan.name] += gone
        if not root.shed:
            names = ", ".join(repr(str(p.name)) for p in plans)
            limit = f"max_runs_per_query={cap:,}" if what == "runs" else f"max_buffer_per_query={cap:,}"
            self.report(f"query {names}: over {limit}; shed {gone:,} runs (the oldest start events); "
                        "matches starting at shed events are lost (counted in the stats)")
        root.shed += gone

    def _buffered(self, root: Node, floor: int = 0) -> int:
        """Buffer entries of ``root``'s branch at stream position ``floor`` or later."""
        return sum(self.buffer.count_from(node, floor) for node in self.buffer.stacks() if node.root is root)

    def _check_buffer_caps(self) -> None:
        cap = self.max_buffer
        sizes: Counter = Counter()
        for node in self.buffer.stacks():
            sizes[node.root] += self.buffer.count_from(node, 0)
        for root, n in sizes.items():
            if n > cap:
                self._shed(root, "buffer", cap)

    @property
    def live_states(self) -> int:
        return len(self.nfa.states)


# --- helpers ------------------------------------------------------------------------


def _raise(ev: Event, exc: Exception) -> None:
    raise exc


def _ignores(c: Contiguity, moved: bool, ek: Any, rkey: Any) -> bool:
    if c is STAM:
        return True
    if c is STNM:
        return not moved
    if c is PARTITION:
        return ek != rkey
    return False


def _last_pos(v) -> int:
    return v.pos if isinstance(v, Event) else v.last.pos


def _first_pos(v) -> int:
    return v.pos if isinstance(v, Event) else v.first.pos


def _overlap_rank(n_vars: int, binds: list[tuple[int, Event]]) -> tuple:
    """SPEC §2.4's order among matches completing together, by stream position (binds are in stream order)."""
    flat = [e.pos for _, e in binds]
    lists: list[list[int]] = [[] for _ in range(n_vars)]
    for unit, e in binds:
        lists[unit].append(e.pos)
    return (flat[0], flat, lists)


def _plain(v: Any) -> Any:
    return None if v is MISSING else v
