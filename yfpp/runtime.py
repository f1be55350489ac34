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

from collections import Counter
from itertools import count
from typing import Any, Callable, Iterator

from yfpp.caps import check_buffer_caps, shed
from yfpp.deadlines import Deadlines, Pending
from yfpp.events import MISSING, Event
from yfpp.match_buffer import Entry, MatchBuffer, Version
from yfpp.match_id import match_id_of
from yfpp.negation_store import CandidateStore, NegationStores
from yfpp.nfa_compiler import NegationPlan, QueryPlan
from yfpp.pattern import Contiguity
from yfpp.policies import accept, overlap_rank
from yfpp.predicates import kleene_start, kleene_take
from yfpp.pruning import sweep
from yfpp.run_merging import RunMerger, member_completions
from yfpp.runs import PLAIN_KEYS, Counters, FullRun, Run, partition_key, usable_key
from yfpp.shared_nfa import Node, SharedNFA, State

_UNSET: Any = object()  # an event's key not yet computed (Runtime._steps)
WIDE = 16  # negations of one event type beyond which an event finds those with live state through indexes
_new = object.__new__
_ROOT_VEC = (None,)  # a root's begin: its type and key hold, its window cannot be passed
STRICT, PARTITION, STNM, STAM = (
    Contiguity.STRICT,
    Contiguity.PARTITION,
    Contiguity.SKIP_TILL_NEXT,
    Contiguity.SKIP_TILL_ANY,
)


class _Route:
    """Dispatch of one event type: the negations it is a candidate for, how to find the root nodes it may
    begin (per root-table group, :meth:`~yfpp.shared_nfa._TypeGroup.finder`), whether any state reacts to it,
    and (filled as met) whether a given state's runs react to it (partition-contiguity states always do)."""

    __slots__ = ("negs", "starters", "scan", "touch", "quick", "starts", "step", "wide")

    def __init__(self, negs: tuple, starters: tuple, scan: bool) -> None:
        # (shared candidate store, None, the wait states whose runs a candidate ends: see Runtime._ended_by)
        # or (query, its trailing negation, ())
        self.negs: tuple[tuple[Any, NegationPlan | None, tuple[State, ...]], ...] = negs
        self.starters = starters
        self.scan = scan  # may the event move a stored run (else the stores are not looked at)
        self.touch: dict[State, bool] = {}
        # Over WIDE negations, what an event looks at is found through what is live (Runtime._live_negs): the
        # keyed shared stores by branch, the trailing negations by query, the unkeyed stores in a list.
        self.wide: tuple[dict[Node, list], dict[QueryPlan, list], list] | None = None
        if len(negs) > WIDE:
            by_root: dict[Node, list] = {}
            by_plan: dict[QueryPlan, list] = {}
            plain = []
            for entry in negs:
                owner, neg, _ = entry
                if neg is not None:
                    by_plan.setdefault(owner, []).append(entry)
                elif owner.partition_by:
                    by_root.setdefault(owner.root, []).append(entry)
                else:
                    plain.append(entry)
            self.wide = (by_root, by_plan, plain)
        # For Runtime._quiet, when the type feeds only shared candidate stores and begins no root or only through
        # one equality index: () or that index's (attribute, table); else None (no shortcut).
        self.quick: tuple | None = None
        if all(neg is None for _, neg, _ in negs):
            if not starters:
                self.quick = ()
            elif len(starters) == 1 and not starters[0][0] and starters[0][2] is None and len(starters[0][1]) == 1:
                self.quick = starters[0][1][0]
        # For Runtime._starts, when all the type can do is begin one root node that every event of it finds, a
        # single component that no query ends at, after which runs wait in one state (not strict): that node and
        # state, its equivalence attribute if it has one only, and its runs by key (None: unkeyed; set by
        # Runtime._route); else None.
        self.starts: tuple[Node, State, str | None, dict | None] | None = None
        if not negs and not scan and len(starters) == 1 and not starters[0][1] and starters[0][2] is None:
            nodes = starters[0][0]
            if len(nodes) == 1 and not nodes[0].kleene and not nodes[0].accepts and len(nodes[0].waits) == 1:
                wait = next(iter(nodes[0].waits.values()))
                if not wait.touch_all:
                    attrs = nodes[0].partition_by
                    self.starts = (nodes[0], wait, attrs[0] if len(attrs) == 1 else None, None)
        # What Runtime.process calls for the type while no strict run is stored (Runtime._route chooses).
        self.step: Callable[[Runtime, Event, _Route, int, list[dict]], list[dict]] = Runtime._steps


def _key(keys: dict | None, ev: Event, attrs: tuple[str, ...]) -> Any:
    """``ev``'s key for ``attrs``, remembered in ``keys`` (None: not remembered)."""
    if keys is None:
        return _key_of(ev, attrs)
    k = keys.get(attrs, keys)
    if k is keys:
        k = keys[attrs] = _key_of(ev, attrs)
    return k


def _key_of(ev: Event, attrs: tuple[str, ...]) -> Any:
    """``ev``'s key for ``attrs`` (None: it has none)."""
    if len(attrs) == 1:
        k = ev.attrs.get(attrs[0], MISSING)
        if k is MISSING:
            k = ev.get(attrs[0])  # a pseudo-attribute (ts, type, seq), else MISSING
        return k if k.__class__ in PLAIN_KEYS else usable_key(k)
    return partition_key(ev, attrs)


class Runtime:
    """Runs every registered query, merged into one shared NFA, over one ordered stream."""

    SWEEP_EVERY = 256  # events between sweeps, at least
    GROWTH_REPORT = 10_000  # runs + buffered events of a windowless branch at its first "growing" report

    def __init__(self, max_runs: int = 250_000, max_buffer: int = 1_000_000,
                 on_error: Callable[[Event, Exception], None] | None = None,
                 report: Callable[[str], None] | None = None, merge_runs: bool = False) -> None:
        self.max_runs = max_runs  # per branch of the shared NFA (see ``yfpp.caps``)
        self.max_buffer = max_buffer
        self.on_error = on_error or _raise
        self.report = report or (lambda msg: None)
        self.nfa = SharedNFA()
        self.buffer = MatchBuffer()
        self.keyed: dict[tuple[str, ...], dict[Any, dict[State, list[Run]]]] = {}
        self.unkeyed: dict[State, list[Run]] = {}
        self.strict: dict[State, list[Run]] = {}
        self.dead: set[State] = set()
        self.negations = NegationStores()
        self.deadlines = Deadlines()
        self._deadline_heap = self.deadlines.heap  # the same list, looked up once per event
        self.pticks: dict[tuple[str, ...], dict[Any, int]] = {}
        self.ptick_users: Counter = Counter()
        self._counters = Counters()  # read as ``counters``, which brings ``events`` up to date
        self.branch_queries: dict[Node, list[QueryPlan]] = {}  # root node -> queries through it
        self.tick = 0
        self.now = float("-inf")
        self._roots = count()
        self._branches = count(1)
        self._routes: dict[str, _Route] = {}
        self._fresh: list[Run] = []  # the current event's new runs (empty between events)
        self._accepted: list[tuple[QueryPlan, Any, dict, list]] = []  # and its matches before the policies
        self._interned: dict[tuple[str, ...], tuple[str, ...]] = {}  # one tuple object per equivalence list
        self._parts: list[tuple[tuple[str, ...], dict]] = []  # self.keyed's items, in a list
        self._attrs0: tuple[str, ...] | None = None  # the one equivalence list, when there is exactly one
        self._makers: dict[QueryPlan, tuple] = {}  # how a query's match is built (_maker)
        self._next_sweep = self.SWEEP_EVERY
        self._next_check = 0  # the next tick at which _periodic looks (0: the next event)
        self.full_events = False  # matches list their bound events in full ("events")
        self.fed: list[tuple[QueryPlan, dict, Any, int]] = []  # feedback queries' matches, drained by yfpp.feedback
        self.to_hold: list[Pending] = []  # trailing-negation matches the current event completed, held at commit
        self.merger = RunMerger() if merge_runs else None  # merging equivalent runs (yfpp.run_merging)
        self.merging_run: Run | None = None  # the merged run being stepped: completions are per member

    # --- registration ---------------------------------------------------------------

    def add(self, plan: QueryPlan) -> None:
        """Register a compiled query; it sees only events processed from now on."""
        plan.since_tick = self.tick
        if plan.partition_by:  # identical lists are one object: the per-event key lookup compares by identity
            plan.partition_by = self._interned.setdefault(plan.partition_by, plan.partition_by)
        self.nfa.add(plan)
        self._makers[plan] = _maker(plan)
        self.negations.add(plan)
        self.deadlines.add(plan)
        self.branch_queries.setdefault(plan.nodes[0].root, []).append(plan)
        if self._needs_pticks(plan):
            self.ptick_users[plan.partition_by] += 1
            self.pticks.setdefault(plan.partition_by, {})
        if plan.partition_by and plan.partition_by not in self.keyed:
            self.keyed[plan.partition_by] = {}
            self._parts = list(self.keyed.items())
            self._attrs0 = plan.partition_by if len(self.keyed) == 1 else None
        self._routes.clear()
        if self.merger is not None:
            self.merger.reset(self)

    def remove(self, plan: QueryPlan) -> None:
        """Unregister: the query emits nothing more; states only it used are freed at the next sweep."""
        for st in self.nfa.remove(plan):
            self.dead.add(st)
        self.negations.remove(plan)
        self.deadlines.remove(plan)
        del self._makers[plan]
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
        self._routes.clear()
        if self.merger is not None:
            self.merger.reset(self)

    @staticmethod
    def _needs_pticks(plan: QueryPlan) -> bool:
        return bool(plan.partition_by) and any(
            a.kleene and b.contiguity is PARTITION for a, b in zip(plan.specs, plan.specs[1:])
        )

    # --- the per-event step -----------------------------------------------------------

    def _route(self, etype: str) -> "_Route":
        """What an event of type ``etype`` can do; made on the first such event after a registration change."""
        negs = (*self.negations.by_type.get(etype, ()), *self.negations.by_type.get(None, ()))
        route = self._routes[etype] = _Route(
            tuple((owner, neg, () if neg is not None else self._ended_by(owner, etype)) for owner, neg in negs),
            tuple(g.finder() for g in self.nfa.starters.groups(etype)),
            self.nfa.reacts(etype),
        )
        if self.merger is not None:
            route.starts = None  # (a new run may merge with a stored one: _steps)
        if not self.pticks:  # (partition ticks count every event: _steps)
            if route.starts is not None:
                node, wait, attr, _ = route.starts
                route.starts = (node, wait, attr, self.keyed[node.partition_by] if node.partition_by else None)
                route.step = Runtime._starts
            elif len(route.negs) == 1 and route.negs[0][1] is None and not route.scan and not route.starters:
                route.step = Runtime._candidate
            elif route.quick is not None:
                route.step = Runtime._quiet
        return route

    def _ended_by(self, store: CandidateStore, etype: str) -> tuple[State, ...]:
        """The wait states whose runs a candidate of ``store`` of type ``etype`` ends at once (of its key, when keyed).

        Such a run has bound the component before the negation of every query it can still complete, and the
        component after it comes later: the candidate lies between them in every match the run could give, and no
        cross predicate could spare one.  So: a wait state (not strict) of the store's branch after node ``n``, no
        child of which ``etype`` can begin, every query below whose children has a negation of this store right
        after ``n`` and without cross predicates.  (A merged run ends with all its members: they share its state
        and key, yfpp.run_merging.)"""
        of = self.negations.of
        out = []
        for st in _wait_states_below(store.root):
            node = st.node
            if st.touch_all:
                continue
            children = [st.child] if st.child is not None else [
                c for c in node.children.values() if c.contiguity is st.contiguity]
            if children and all(c.event_type is not None and c.event_type != etype and all(
                    any(of.get(neg) is store and neg.lower == node.index and neg.upper == c.index
                        and not neg.cross_preds for neg in plan.negations)
                    for plan in _accepting_below(c)) for c in children):
                out.append(st)
        return tuple(out)

    def process(self, ev: Event) -> list[dict]:
        """Advance every run by one event (already in stream order); return completed matches.

        The event gets its tick (stream position) and fires the deadlines before it; then its type's
        ``_Route.step`` takes it (while no strict run is stored): :meth:`_starts` for an event that can only begin
        one root, :meth:`_candidate` for one that can only be a middle negation's candidate, :meth:`_quiet` for
        one that may change nothing, :meth:`_steps` for any other.
        """
        tick = self.tick = self.tick + 1
        ev.pos = tick
        self.now = ev.ts
        out: list[dict] = self._expire(ev.ts) if self._deadline_heap else []
        route = self._routes.get(ev.type) or self._route(ev.type)
        if self.strict:
            return self._steps(ev, route, tick, out)
        return route.step(self, ev, route, tick, out)

    def _starts(self, ev: Event, route: _Route, tick: int, out: list[dict]) -> list[dict]:
        """:meth:`_steps` of an event that can only begin one root (``_Route.starts``; no partition ticks, strict
        runs or run merging): the new run, if it begins, stored in the node's one wait state, as ``_steps``
        would (``_start``, then its commit) with fewer steps.  A predicate that raises fails before anything is
        stored, the event rolled back as in ``_steps``."""
        node, wait, attr, by_key = route.starts
        try:
            if by_key is not None:
                ek = ev.attrs.get(attr) if attr is not None else None  # _key_of, inline for a plain attribute
                if ek is None:
                    ek = _key_of(ev, node.partition_by)
                    if ek is None:
                        return self._done(tick, out)
                try:
                    states = by_key.get(ek)
                except TypeError:  # an unhashable value (a list…) is no key (usable_key): ev begins nothing
                    return self._done(tick, out)
            else:
                ek = None
                states = self.unkeyed
            for p in node.begin:
                if not p(ev, _ROOT_VEC):
                    if tick >= self._next_check:  # (_done, inline: the common end of a query that never matches)
                        self._periodic(tick)
                    return out
            version = (next(self._roots),)
        except BaseException as exc:
            return self._failed(ev, exc, out)
        # Run(wait, (ev, None), None, version, ev.ts, tick, ek, tick) without the call to __init__ (no entry: see
        # _start); half the events of a keyed SEQ begin a run here
        r = _new(Run)
        r.state = wait
        r.vec = (ev, None)
        r.entry = None
        r.version = version
        r.first_ts = ev.ts
        r.first_pos = tick
        r.key = ek
        r.born = tick
        if states is None:
            by_key[ek] = {wait: [r]}
        else:
            lst = states.get(wait)
            if lst is None:
                states[wait] = [r]
            else:
                lst.append(r)
        cnt = self._counters
        cnt.runs_started += 1
        cnt.runs_created += 1
        live = cnt.live_runs = cnt.live_runs + 1
        if live > cnt.peak_runs:
            cnt.peak_runs = live
        node.live = n = node.live + 1  # (a root)
        if n > self.max_runs:
            shed(self, node, "runs", self.max_runs)
        if tick >= self._next_check:
            self._periodic(tick)
        return out

    def _failed(self, ev: Event, exc: BaseException, out: list[dict], touched: list | tuple = (),
                bumped: list | tuple = ()) -> list[dict]:
        """``ev``'s processing raised ``exc``: the stored state is put back (``_undo``) and the event reported
        (``on_error``); an exception that is not an ``Exception`` (KeyboardInterrupt…) goes on up."""
        self._undo(ev, touched, bumped)
        if not isinstance(exc, Exception):
            raise exc
        self.counters.failed += 1
        self.on_error(ev, exc)
        return out

    def _candidate(self, ev: Event, route: _Route, tick: int, out: list[dict]) -> list[dict]:
        """:meth:`_steps` of an event that can only be a candidate of one shared middle-negation store (no run to
        move, no root to begin; no partition ticks or strict runs).  As there: the candidate matters only while a
        run of the store's branch and the event's key is live (``_may_need``) and its own predicates hold; it ends
        that key's runs in the ``ends`` states (``_ended_by``), and is kept if a run of the branch and key is left.
        The key and the predicates are evaluated before anything changes: an event that raises there is rolled
        back as in ``_steps``."""
        store, _, ends = route.negs[0]
        root = store.root
        if not root.live:
            if tick >= self._next_check:  # (_done, inline: the common end of a candidate with no run to end)
                self._periodic(tick)
            return out
        attrs = store.partition_by
        try:
            if attrs:
                ek = ev.attrs.get(attrs[0]) if len(attrs) == 1 else None  # _key_of, inline for a plain attribute
                if ek is None:
                    ek = _key_of(ev, attrs)
                    if ek is None:
                        return self._done(tick, out)
                try:
                    states = self.keyed[attrs].get(ek)
                except TypeError:  # an unhashable value (a list…) is no key (usable_key): no run it could end
                    return self._done(tick, out)
                if not _holds(states, root):  # _may_need without strict runs
                    return self._done(tick, out)
            else:
                ek = None
                states = self.unkeyed
            for p in store.self_preds:
                if not p(ev, ()):
                    return self._done(tick, out)
        except BaseException as exc:
            return self._failed(ev, exc, out)
        if ends and states:
            n = 0
            for st in ends:  # (states of the store's branch)
                runs = states.pop(st, None)
                if runs is not None:
                    n += len(runs)
            if not states and attrs:
                del self.keyed[attrs][ek]
                keep = False  # no run left that it could lie inside
            else:
                keep = not attrs or _holds(states, root)  # (the same)
            if n:
                root.live -= n
                cnt = self._counters
                cnt.live_runs -= n
                cnt.runs_touched += n
        else:
            keep = True
        if keep:
            store.hold(ek, tick, ev)
        if tick >= self._next_check:  # (_done)
            self._periodic(tick)
        return out

    def _done(self, tick: int, out: list[dict]) -> list[dict]:
        """The end of an event that changed nothing."""
        if tick >= self._next_check:
            self._periodic(tick)
        return out

    def _steps(self, ev: Event, route: _Route, tick: int, out: list[dict]) -> list[dict]:
        """:meth:`process` of an event that may change something: its matches are added to ``out``.

        Two phases: the first computes every move without changing stored
        state (runs it steps are taken out of their stores into ``touched`` and
        never mutated), then the commit stores the results.  If the first
        phase raises (a predicate failing on this record…),
        ``_undo`` puts the runs back, drops the buffer entries made for ``ev``
        and ``on_error`` reports the event: the stream goes on as if the record
        had been a bare time advance to its ts (``advance_time``): the
        trailing-negation deadlines before it fire, as at any later event.
        """
        etype = ev.type
        # runs out of their stores with the event's key for them, partition ticks counted, negation candidates kept,
        # held matches killed (None: none); new runs go to self._fresh, completed matches to self._accepted
        touched: list[tuple[list[Run], Any]] | None
        bumped: list[tuple[dict, Any]] | None
        touched = bumped = negated = kills = ended = None
        started = 0
        # The event's key for each equivalence list: with one list (the common case) ``k0``, computed when first
        # needed (_UNSET until then), else memoised in ``keys``.
        a0 = self._attrs0
        keys: dict[tuple[str, ...], Any] | None = None if a0 is not None else {}
        k0 = _UNSET
        try:
            if self.pticks:
                bumped = []
                for attrs, ticks in self.pticks.items():
                    if attrs is a0:
                        k = k0 = _key_of(ev, a0) if k0 is _UNSET else k0
                    else:
                        k = _key(keys, ev, attrs)
                    if k is not None:
                        ticks[k] = ticks.get(k, 0) + 1
                        bumped.append((ticks, k))
            if route.negs:
                for owner, neg, ends in (route.negs if route.wide is None else self._live_negs(route, ev)):
                    if neg is None and not owner.root.live:
                        continue  # a shared candidate store of a branch without runs (see _may_need)
                    attrs = owner.partition_by
                    if attrs is a0:
                        if k0 is _UNSET:
                            k0 = _key_of(ev, a0)
                        ek = k0
                        if ek is None:
                            continue
                    elif attrs:
                        ek = _key(keys, ev, attrs)
                        if ek is None:
                            continue
                    else:
                        ek = None
                    if neg is None:  # a shared candidate store
                        if not _may_need(self, owner, ek):
                            continue  # no run before ev can bind the component before the negation
                        for p in owner.self_preds:
                            if not p(ev, ()):
                                break
                        else:
                            if ends:  # runs the candidate ends, out of their stores (put back by _undo)
                                store = self.keyed[attrs].get(ek) if attrs else self.unkeyed
                                if store:
                                    for st in ends:
                                        runs = store.pop(st, None)
                                        if runs is not None:
                                            if ended is None:
                                                ended = []
                                            ended.append(runs)
                                    if not store and attrs:
                                        del self.keyed[attrs][ek]
                                        if not self.strict:
                                            continue  # no run left that it could lie inside
                                    if not _may_need(self, owner, ek):
                                        continue  # (the same)
                            if negated is None:
                                negated = []
                            negated.append((owner, ek))
                    else:  # a trailing negation of query ``owner``
                        for p in neg.self_preds:
                            if not p(ev, ()):
                                break
                        else:
                            if kills is None:
                                kills = []
                            self.deadlines.killed_by(owner, neg, ev, ek, kills)
            if self.strict:
                touched = []
                strict, self.strict = self.strict, {}
                for runs in strict.values():
                    attrs = runs[0].state.node.partition_by if runs else None
                    if not attrs:
                        touched.append((runs, None))
                    elif attrs is a0:
                        if k0 is _UNSET:
                            k0 = _key_of(ev, a0)
                        touched.append((runs, k0))
                    else:
                        touched.append((runs, _key(keys, ev, attrs)))
            if route.scan:  # the stored runs the event may move: by key, then the unkeyed states
                touch = route.touch
                for attrs, by_key in self._parts:
                    if not by_key:
                        continue
                    if attrs is a0:
                        if k0 is _UNSET:
                            k0 = _key_of(ev, a0)
                        k = k0
                    else:
                        k = _key(keys, ev, attrs)
                    if k is None:
                        continue
                    states = by_key.get(k)
                    if not states:
                        continue
                    hit = None
                    for st in states:
                        t = touch.get(st)
                        if t is None:
                            t = touch[st] = st.contiguity is PARTITION or st.reacts_to(etype)
                        if t:
                            if hit is None:
                                hit = [st]
                            else:
                                hit.append(st)
                    if hit is not None:
                        if touched is None:
                            touched = []
                        for st in hit:
                            touched.append((states.pop(st), k))
                        if not states:
                            del by_key[k]
                if self.unkeyed:
                    unkeyed = self.unkeyed
                    for st in list(unkeyed):
                        t = touch.get(st)
                        if t is None:
                            t = touch[st] = st.reacts_to(etype)  # no partition-contiguity state is unkeyed
                        if t:
                            if touched is None:
                                touched = []
                            touched.append((unkeyed.pop(st), None))
            if touched:
                moved: list[list[Run]] = []  # per entry of touched: the runs that stay as they were
                fresh, accepted = self._fresh, self._accepted
                dead = self.dead
                merger = self.merger
                for runs, ek in touched:
                    stays: list[Run] = []
                    moved.append(stays)
                    if not runs or runs[0].state in dead:  # (a list holds runs of one state)
                        continue
                    st = runs[0].state
                    if merger is None and st.mode == "wait":
                        self._step_wait(st, runs, ev, ek, fresh, stays, accepted)
                        continue
                    for r in runs:
                        if r.members is None:
                            self._step(r, ev, ek, fresh, stays, accepted)
                        else:
                            merger.step(self, r, ev, ek, fresh, stays, accepted)
            for plain, eqs, group in route.starters:  # the root nodes ev may begin (see _TypeGroup.finder)
                nodes = plain if group is None else group.candidates(ev)
                for attr, table in eqs:
                    v = ev.attrs.get(attr, MISSING)
                    if v is not MISSING:
                        try:
                            found = table.get(v)
                        except TypeError:  # unhashable value
                            found = None
                        if found:
                            nodes = [*nodes, *found]
                if nodes:
                    for node in nodes:
                        attrs = node.partition_by
                        if attrs is a0:
                            if k0 is _UNSET:
                                k0 = _key_of(ev, a0)
                            ek = k0
                            if ek is None:
                                continue
                        elif attrs:
                            ek = _key(keys, ev, attrs)
                            if ek is None:
                                continue
                        else:
                            ek = None
                        for p in node.begin:
                            if not p(ev, _ROOT_VEC):
                                break
                        else:
                            started += 1
                            self._start(node, ev, ek, self._fresh, self._accepted)
        except BaseException as exc:
            return self._failed(ev, exc, out, (touched or []) + [(runs, None) for runs in ended or ()], bumped or ())
        if touched or started or negated or kills or ended:  # (to_hold and the merger only get work from a step or a start)
            cnt = self._counters
            if ended:
                n = 0
                for runs in ended:
                    n += len(runs)
                    runs[0].state.node.root.live -= len(runs)
                cnt.live_runs -= n
                cnt.runs_touched += n
            fresh, accepted = self._fresh, self._accepted  # (only a step or a start fills them)
            if self.merger is not None:
                self.merger.merge(self, moved if touched else [], fresh)
            if touched:
                live = cnt.live_runs
                n_touched = 0
                for (runs, _), stays in zip(touched, moved):
                    n_touched += len(runs)
                    delta = len(stays) - len(runs)
                    if delta:
                        live += delta
                        runs[0].state.node.root.live += delta
                    if stays:  # same state and key as before: back into their store in one step
                        self._store_many(stays)
                cnt.live_runs = live
                cnt.runs_touched += n_touched
            if negated:
                for store, ek in negated:  # the negation candidates: into their shared stores
                    store.hold(ek, tick, ev)
            if kills:
                for p in kills:
                    p.killed = True
            if self.to_hold:
                for p in self.to_hold:
                    self.deadlines.hold(p)
                self.to_hold = []
            if accepted:
                out.extend(accept(self, accepted, fresh))
                accepted.clear()
            if fresh:
                cnt.runs_started += started
                cap = self.max_runs
                over: list[Node] | None = None  # branches over the cap
                keyed = self.keyed
                for r in fresh:
                    st = r.state
                    attrs = st.node.partition_by
                    if attrs and not st.touch_all:  # _store, inline for the common case
                        states = keyed[attrs].get(r.key)
                        if states is None:
                            keyed[attrs][r.key] = {st: [r]}
                        else:
                            lst = states.get(st)
                            if lst is None:
                                states[st] = [r]
                            else:
                                lst.append(r)
                    else:
                        self._store(r)
                    root = st.node.root
                    root.live += 1
                    if root.live > cap:
                        if over is None:
                            over = [root]
                        elif root not in over:
                            over.append(root)
                cnt.runs_created += len(fresh)
                live = cnt.live_runs = cnt.live_runs + len(fresh)
                if live > cnt.peak_runs:
                    cnt.peak_runs = live
                fresh.clear()
                for root in over or ():
                    shed(self, root, "runs", cap)
            elif started:
                cnt.runs_started += started
        if tick >= self._next_check:
            self._periodic(tick)
        return out

    def _quiet(self, ev: Event, route: _Route, tick: int, out: list[dict]) -> list[dict]:
        """:meth:`_steps` of an event of a route with ``quick`` (no partition ticks or strict runs), which may
        change nothing: no candidate store it feeds has a live branch, no run is stored under its keys for it to
        move, and it begins no root.  Then it stops here; else it goes through ``_steps``."""
        for store, _, _ in (route.negs if route.wide is None else self._live_negs(route, ev)):
            if store.root.live:
                return self._steps(ev, route, tick, out)
        if route.scan:
            if self.unkeyed:
                return self._steps(ev, route, tick, out)
            if self._counters.live_runs:
                for attrs, by_key in self._parts:
                    if by_key:
                        try:
                            k = ev.attrs.get(attrs[0]) if len(attrs) == 1 else None  # _key_of, inline for an attribute
                            if k is None:
                                k = _key_of(ev, attrs)
                            if k is not None and by_key.get(k):
                                return self._steps(ev, route, tick, out)
                        except TypeError:  # an unhashable value: no key (usable_key), no run to move
                            pass
            else:  # (nothing is stored but empty lists, whatever the keys)
                for _, by_key in self._parts:
                    if by_key:
                        return self._steps(ev, route, tick, out)
        quick = route.quick
        if quick:
            v = ev.attrs.get(quick[0], MISSING)
            if v is not MISSING:
                try:
                    if quick[1].get(v):
                        return self._steps(ev, route, tick, out)
                except TypeError:  # unhashable value: found nothing
                    pass
        if tick >= self._next_check:
            self._periodic(tick)
        return out

    def _live_negs(self, route: _Route, ev: Event) -> list:
        """The entries of ``route.negs`` an event may matter to, found through what is live rather than tried one
        by one: shared stores of the branches holding runs under the event's keys (or strict runs: see
        ``_may_need``), trailing negations of the queries holding pending matches, every unkeyed store."""
        by_root, by_plan, out = route.wide  # type: ignore[misc]
        out = list(out)
        if by_root:
            roots = {st.node.root for st in self.strict}
            for attrs, by_key in self._parts:
                if by_key:
                    k = _key_of(ev, attrs)
                    states = by_key.get(k) if k is not None else None
                    if states:
                        roots.update(st.node.root for st in states)
            for root in roots:
                out += by_root.get(root, ())
        if by_plan:
            for plan in self.deadlines.waiting:
                out += by_plan.get(plan, ())
        return out

    @property
    def counters(self) -> Counters:
        """What the runtime counted; ``events`` is the ticks given (an event rolled back gives its tick back)."""
        c = self._counters
        c.events = self.tick
        return c

    def _periodic(self, tick: int) -> None:
        """The buffer's peak and caps every 64 events, the sweep when due; when to come back."""
        if tick & 63 == 0:
            size = self.buffer.size
            if size > self._counters.peak_buffer:  # (before a shed: the size that reached the cap)
                self._counters.peak_buffer = size
            if size > self.max_buffer:
                check_buffer_caps(self)
        if tick >= self._next_sweep:
            if self._holds_anything():
                sweep(self)
            else:  # nothing stored: nothing to sweep
                self._next_sweep = tick + self.SWEEP_EVERY
        self._next_check = min(self._next_sweep, (tick | 63) + 1)

    def _holds_anything(self) -> bool:
        """Is any run, buffered event, negation candidate or removed state kept?"""
        if self._counters.live_runs or self.strict or self.unkeyed or self.buffer.size or self.dead or self.negations.held():
            return True
        for _, by_key in self._parts:
            if by_key:
                return True
        return False

    def _undo(self, ev: Event, touched: list, bumped: list) -> None:
        """Put the stored state back as it was before ``ev``, stream time aside (see ``process``)."""
        for ticks, k in bumped:
            ticks[k] -= 1
            if not ticks[k]:
                del ticks[k]
        for runs, _ in touched:
            if runs:
                self._store_many(runs)
        self.buffer.forget(ev)
        self.to_hold = []
        self._fresh.clear()
        self._accepted.clear()
        self.tick -= 1
        ev.pos = -1

    def _store_many(self, runs: list[Run]) -> None:
        """Store runs that all wait in the same state with the same key."""
        r = runs[0]
        st = r.state
        if st.touch_all:
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

    def _store(self, r: Run) -> None:
        """Store one run."""
        st = r.state
        if st.touch_all:
            store = self.strict
        else:
            attrs = st.node.partition_by
            if attrs:
                by_key = self.keyed[attrs]
                store = by_key.get(r.key)
                if store is None:
                    store = by_key[r.key] = {}
            else:
                store = self.unkeyed
        lst = store.get(st)
        if lst is None:
            store[st] = [r]
        else:
            lst.append(r)

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
        if st.mode == "wait":
            self._step_wait(st, (r,), ev, ek, fresh, stays, accepted)
            return
        w = st.node.window
        if w is not None and ev.ts - r.first_ts > w:
            return  # pruned by the window: no move can hold any more
        moves: list[tuple[str, Any]] = []
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

    def _step_wait(self, st: State, runs, ev: Event, ek: Any, fresh: list[Run], stays: list[Run], accepted: list) -> None:
        """:meth:`_step` of runs waiting in wait state ``st`` (plain runs, not merged ones), the children ``ev`` may
        begin looked up once."""
        w = st.node.window
        c = st.contiguity
        ts = ev.ts
        cands = st.table.candidates(ev)
        for r in runs:
            age = ts - r.first_ts
            if w is not None and age > w:
                continue  # pruned by the window: no move can hold any more
            rkey = r.key
            began = None
            if cands and (rkey is None or ek == rkey):  # the rest of _begins: a candidate has the event's type
                vec = r.vec
                for child in cands:
                    cw = child.window
                    if cw is not None and age > cw:
                        continue
                    for p in child.begin:
                        if not p(ev, vec):
                            break
                    else:
                        if began is None:
                            began = [child]
                        else:
                            began.append(child)
            stay = began is None if c is STNM else _ignores(c, began is not None, ek, rkey)
            if stay:
                stays.append(r)  # the keeper: its version stays
            if began is not None:
                version = r.version
                if stay:
                    version = version + (next(self._branches),)
                self._enter(began[0], r, version, ev, fresh, accepted)
                if len(began) > 1:
                    for child in began[1:]:
                        self._enter(child, r, r.version + (next(self._branches),), ev, fresh, accepted)

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

    def _start(self, node: Node, ev: Event, ek: Any, fresh: list[Run], accepted: list) -> None:
        """A new run: ``ev`` begins root ``node``.  A run that has bound only its first event, a single one, has no
        buffer entry (its vec holds the event; :meth:`_first_entry` makes one when a later event needs it)."""
        version = (next(self._roots),)
        ts, tick = ev.ts, self.tick
        if node.kleene:
            entry = self.buffer.add(node, 0, ev, version, None)
            vec = (kleene_start(ev, node.agg_slots, node.keep_events),)
            self._arrive_inside(node, vec, entry, version, ts, ev.pos, ek, tick, fresh, accepted)
            return
        vec = (ev,)
        entry = None
        if node.accepts:
            entry = self.buffer.add(node, 0, ev, version, None)
            self._complete(node, vec, entry, version, ts, ek, tick, accepted)
        for wait in node.waits.values():
            fresh.append(Run(wait, (ev, None), entry, version, ts, ev.pos, ek, tick))

    def _enter(self, node: Node, r: Run, version: Version, ev: Event, fresh: list[Run], accepted: list) -> None:
        """Begin ``node`` with ``ev`` (from a wait state or a proceed)."""
        i = node.index
        if node.kleene:
            entry = self.buffer.add(node, i, ev, version, r.entry or self._first_entry(r))
            vec = r.vec[:i] + (kleene_start(ev, node.agg_slots, node.keep_events),)
            self._arrive_inside(node, vec, entry, version, r.first_ts, r.first_pos, r.key, r.born, fresh, accepted)
            return
        vec = r.vec[:i] + (ev,)  # a run's vec ends with a free slot for the node it may begin
        if not node.waits and self.merging_run is None:  # a last component: no run goes on, no entry is made
            self._complete(node, vec, None, version, r.first_ts, r.key, r.born, accepted, ev, r.entry)
            return
        entry = self.buffer.add(node, i, ev, version, r.entry or self._first_entry(r))
        if node.accepts:
            self._complete(node, vec, entry, version, r.first_ts, r.key, r.born, accepted)
        if node.waits:
            nxt = vec + (None,)
            for wait in node.waits.values():
                fresh.append(Run(wait, nxt, entry, version, r.first_ts, r.first_pos, r.key, r.born))

    @staticmethod
    def bound(r: Run) -> list[tuple[int, Event]]:
        """The (unit, event) pairs run ``r`` has bound, oldest first."""
        return MatchBuffer.extract(r.entry, r.version) if r.entry is not None else [(0, r.vec[0])]

    @staticmethod
    def _first_entry(r: Run) -> Entry:
        """The buffer entry of a run that has none: it has bound only its first event (a single one, ``vec[0]``).
        Made when a later event needs it as a predecessor, outside the buffer's stacks (their entries are in
        stream order), and kept by the run (so the runs that go on from it share it)."""
        e = r.entry = MatchBuffer.first_entry(r.vec[0], r.version)
        return e

    def _take(self, node: Node, r: Run, version: Version, ev: Event, fresh: list[Run], accepted: list) -> None:
        entry = self.buffer.add(node, node.index, ev, version, r.entry)
        i = node.index
        vec = r.vec[:i] + (kleene_take(r.vec[i], ev, node.agg_slots),)
        self._arrive_inside(node, vec, entry, version, r.first_ts, r.first_pos, r.key, r.born, fresh, accepted)

    def _arrive_inside(self, node: Node, vec: tuple, entry, version: Version, first_ts: float, first_pos: int,
                       key: Any, born: int, fresh: list[Run], accepted: list) -> None:
        ptick = self.pticks[node.partition_by].get(key, 0) if node.partition_by in self.pticks else 0
        fresh.append(FullRun(node.inside, vec + (None,), entry, version, first_ts, first_pos, key, born, self.tick, ptick))
        if node.accepts and self._final_ok(node, vec):
            self._complete(node, vec, entry, version, first_ts, key, born, accepted)

    def _complete(self, node: Node, vec: tuple, entry, version: Version, first_ts: float, key: Any, born: int,
                  accepted: list, ev: Event | None = None, pred=None) -> None:
        """A run bound the last component of the queries accepting at ``node``: post-process per query.

        ``entry`` None (not for a merged run): ``ev`` after ``pred`` ends the run, with no buffer entry of its own
        (nothing can ever walk back from it): a match reads its bindings up to ``pred`` and adds ``ev`` (``pred``
        None: the run had bound only its first event, ``vec[0]``, see :meth:`_start`).
        """
        merged = self.merging_run
        if merged is not None:  # a merged run's step: once per run it stands for (yfpp.run_merging)
            self.merging_run = None
            try:
                for version, first_ts, born in member_completions(merged, version, entry):
                    self._complete(node, vec, entry, version, first_ts, key, born, accepted)
            finally:
                self.merging_run = merged
            return
        binds = None
        last = entry.event if entry is not None else ev
        last_ts = last.ts
        accepts = node.accepts
        memo: dict | None = {} if len(accepts) > 1 else None  # equal negation checks give equal answers
        for plan in accepts:
            if born <= plan.since_tick:
                continue  # started before the query was registered
            if plan.window is not None and last_ts - first_ts > plan.window:
                continue
            if plan.negations:
                if memo is None:
                    ok = self.negations.allows(plan, vec, key)
                else:
                    ok = memo.get(plan.negation_key)
                    if ok is None:
                        ok = memo[plan.negation_key] = self.negations.allows(plan, vec, key)
                if not ok:
                    continue
            if binds is None:
                if entry is None:
                    binds = MatchBuffer.extract(pred, version) if pred is not None else [(0, vec[0])]
                    binds.append((node.index, ev))
                else:
                    binds = MatchBuffer.extract(entry, version)
                shared: dict = {}
            match = self._match(plan, binds, vec, shared)
            if plan.trailing is not None:
                depth = max(getattr(e, "depth", 0) for _, e in binds) if plan.pattern.feedback else 0
                self.to_hold.append(Pending(plan, key, vec, last.pos, first_ts + plan.window, match, depth=depth))
            else:
                accepted.append((plan, key, match, binds))

    def _match(self, plan: QueryPlan, binds: list[tuple[int, Event]], vec: tuple, shared: dict) -> dict:
        """The match dict of ``plan`` for ``binds``; ``shared`` keeps the seq lists per variable names for the other
        queries completing on the same binds (each match gets its own copies)."""
        names = plan.var_names
        match_id, singles, emit = self._makers[plan]
        if singles:  # one event per variable, in order: no lists to share
            seqs = {}
            ints = True
            for name, (_, e) in zip(names, binds):
                s = e.seq
                if type(s) is not int:
                    ints = False
                seqs[name] = [s]
        else:
            got = shared.get(names)
            if got is None:
                lists: list[list[int | str]] = [[] for _ in names]
                ints = True
                for unit, e in binds:
                    s = e.seq
                    if type(s) is not int:
                        ints = False
                    lists[unit].append(s)
                shared[names] = (lists, ints)
                seqs = dict(zip(names, lists))
            else:
                lists, ints = got
                seqs = dict(zip(names, map(list, lists)))
        start, end = binds[0][1].ts, binds[-1][1].ts
        m = {"query": plan.name, "id": match_id(seqs, ints, start, end), "bindings": seqs, "start": start, "end": end}
        if emit is not None:
            values = {}
            for k, g, read in emit[1]:
                if read is None:
                    v = g(None, vec)
                else:  # g, inline: a bound single event's attribute
                    x = vec[read[0]]
                    v = MISSING if x is None else x.attrs.get(read[1], MISSING)
                values[k] = None if v is MISSING else v
            m["emit"] = {"type": emit[0], "attrs": values}
        if self.full_events:
            events: dict[str, list[dict]] = {v: [] for v in names}
            for unit, e in binds:
                events[names[unit]].append(e.describe())
            m["events"] = events
        return m

    def _emitted(self, plan: QueryPlan, m: dict, binds: list | None, out: list[dict], depth: int = 0) -> None:
        """Output match ``m``; a feedback query's also goes to ``fed``, ranked by its bound events (None: a deadline's,
        with the depth of the deepest derived event it binds)."""
        out.append(m)
        self._counters.matches[plan.name] += 1
        if plan.pattern.feedback:
            self.fed.append((plan, m, binds and overlap_rank(len(plan.var_names), binds), depth))

    # --- negation, deadlines, policy --------------------------------------------------

    def _expire(self, now: float, everything: bool = False) -> list[dict]:
        out: list[dict] = []
        for p in self.deadlines.expire(now, everything):
            self._emitted(p.plan, p.match, None, out, p.depth)
        return out

    def advance_time(self, ts: float) -> list[dict]:
        """The stream time moves to ``ts`` with no event: deadlines before it fire."""
        if ts > self.now:
            self.now = ts
        return self._expire(ts)

    def flush(self) -> list[dict]:
        """End of input: every pending trailing-negation match is decided."""
        return self._expire(0, everything=True)

    def _stores(self) -> list[dict[State, list[Run]]]:
        return [self.strict, self.unkeyed, *(s for by_key in self.keyed.values() for s in by_key.values())]

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


def _nodes_below(node: Node) -> Iterator[Node]:
    """``node`` and every node of its branch below it."""
    stack = [node]
    while stack:
        n = stack.pop()
        yield n
        stack.extend(n.children.values())


def _wait_states_below(root: Node) -> list[State]:
    """The wait states of ``root``'s branch."""
    return [st for n in _nodes_below(root) for st in n.waits.values()]


def _accepting_below(node: Node) -> list[QueryPlan]:
    """The queries accepting at ``node`` or below it."""
    return [plan for n in _nodes_below(node) for plan in n.accepts]


def _maker(plan: QueryPlan) -> tuple:
    """How ``plan``'s matches are built (``Runtime._match``): its match-id function, whether every positive
    component binds one event, and its RETURN as (type, ((attribute, getter, (slot, attr) the getter reads
    from a bound single event or None), …)) or None."""
    emit = None
    if plan.emit is not None:
        etype, attrs = plan.emit
        emit = (etype, tuple((k, g, getattr(g, "slot_attr", None)) for k, g in attrs))
    return match_id_of(plan.name, plan.var_names), not any(spec.kleene for spec in plan.specs), emit


def _holds(states: dict[State, list[Run]] | None, root: Node) -> bool:
    """Do ``states`` (of one key) include a state of ``root``'s branch?"""
    if states:
        for st in states:
            if st.node.root is root:
                return True
    return False


def _may_need(rt: Runtime, store: CandidateStore, ek: Any) -> bool:
    """Can a run stored now (before the event) ever use a candidate of ``store`` with key ``ek``?

    A middle negation's candidate matters only to a match whose component before
    the negation bound an earlier event: so to a run of the store's branch (and
    key) already live.  Runs started later begin after the candidate.  Over-approximates
    (any live run of the branch and key), never under.
    """
    root = store.root
    if not root.live:
        return False
    attrs = store.partition_by
    if not attrs:
        return True
    if _holds(rt.keyed[attrs].get(ek), root):
        return True
    for st in rt.strict:
        if st.node.root is root:
            return True
    return False
