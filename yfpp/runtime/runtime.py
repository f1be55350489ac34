"""The NFA^b runtime over the shared NFA (SIGMOD 2008 §4, YFilter++ §6).

Runs wait in states of the shared NFA (``yfpp.nfa.shared_nfa``) and are stored so
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
from typing import Any, Callable, Iterator, Mapping, Sequence

from yfpp.input.events import Event
from yfpp.nfa.compiler import NegationPlan, QueryPlan
from yfpp.nfa.shared_nfa import Node, SharedNFA, State
from yfpp.runtime.acceptance import Acceptance, MatchMakers
from yfpp.runtime.caps import check_buffer_caps
from yfpp.runtime.deadlines import Deadlines, Pending
from yfpp.runtime.dispatch import EventSteps
from yfpp.runtime.match_buffer import MatchBuffer
from yfpp.runtime.moves import PARTITION, RunMoves
from yfpp.runtime.negation_store import NegationStores, TypeNegations
from yfpp.runtime.pruning import sweep
from yfpp.runtime.run_merging import RunMerger
from yfpp.runtime.runs import Counters, Run


WIDE = 16  # negations of one event type beyond which an event finds those with live state through indexes
_NO_NEGATIONS = TypeNegations()


class Route:
    """Dispatch of one event type: the negations it is a candidate for, how to find the root nodes it may
    begin (per root-table group, :meth:`~yfpp.nfa.shared_nfa._TypeGroup.finder`), whether any state reacts to it,
    and (filled as met) whether a given state's runs react to it (partition-contiguity states always do)."""

    __slots__ = ("negs", "starters", "scan", "touch", "quick", "starts", "step", "wide")

    def __init__(self, negs: TypeNegations, starters: tuple, scan: bool) -> None:
        # (shared candidate store, None, the wait states whose runs a candidate ends: see NegationStores.ends)
        # or (query, its trailing negation, ())
        self.negs: tuple[tuple[Any, NegationPlan | None, tuple[State, ...]], ...] | Any = ()
        self.starters = starters
        self.scan = scan  # may the event move a stored run (else the stores are not looked at)
        self.touch: dict[State, bool] = {}
        # Over WIDE negations, what an event looks at is found through what is live (EventSteps._live_negs): the
        # keyed shared stores by branch, the trailing negations by query, the unkeyed stores (the live indexes
        # of TypeNegations, not copies: a route costs the same however many negations there are).
        self.wide: tuple[dict[Node, dict], dict[QueryPlan, list], dict] | None = None
        if len(negs) > WIDE:
            self.negs = negs.entries.values()
            self.wide = (negs.by_root, negs.by_plan, negs.plain)
        else:
            self.negs = tuple(negs.entries.values())
        # For Runtime._quiet, when the type feeds only shared candidate stores and begins no root or only through
        # one equality index: () or that index's (attribute, table); else None (no shortcut).
        self.quick: tuple | None = None
        if not negs.trailing:
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
        self.step: Callable[[Runtime, Event, Route, int, list[dict]], list[dict]] = Runtime._steps


class BranchQueries(Mapping[Node, Sequence[QueryPlan]]):
    """Each branch's root node -> the queries through it, kept as the query itself while it is the only one (most
    branches: a million subscriptions of their own branches would hold a million tuples of one), else a list; read
    as sequences (made when read: sweeps, caps and reports read them, no event does)."""

    __slots__ = ("_by_root",)

    def __init__(self) -> None:
        self._by_root: dict[Node, QueryPlan | list[QueryPlan]] = {}

    def add(self, plan: QueryPlan) -> None:
        root, by_root = plan.last.root, self._by_root
        had = by_root.get(root)
        if had is None:
            by_root[root] = plan
        elif type(had) is list:
            had.append(plan)
        else:
            by_root[root] = [had, plan]  # type: ignore[list-item]

    def remove(self, plan: QueryPlan) -> None:
        root, by_root = plan.last.root, self._by_root
        had = by_root[root]
        if type(had) is list and len(had) > 1:
            had.remove(plan)
        else:
            del by_root[root]

    def __getitem__(self, root: Node) -> Sequence[QueryPlan]:
        had = self._by_root[root]
        return had if type(had) is list else (had,)  # type: ignore[return-value]

    def __iter__(self) -> Iterator[Node]:
        return iter(self._by_root)

    def __len__(self) -> int:
        return len(self._by_root)


class Runtime(EventSteps, RunMoves, Acceptance):
    """Runs every registered query, merged into one shared NFA, over one ordered stream."""

    SWEEP_EVERY = 256  # events between sweeps, at least
    GROWTH_REPORT = 10_000  # runs + buffered events of a windowless branch at its first "growing" report

    def __init__(self, max_runs: int = 250_000, max_buffer: int = 1_000_000,
                 on_error: Callable[[Event, Exception], None] | None = None,
                 report: Callable[[str], None] | None = None, merge_runs: bool = False) -> None:
        self.max_runs = max_runs  # per query, checked per branch of the shared NFA (see ``yfpp.runtime.caps``)
        self.max_buffer = max_buffer
        self.on_error = on_error or _raise
        self.report = report or (lambda msg: None)
        self.nfa = SharedNFA()
        self._atom_memo = self.nfa.atoms.memo
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
        self.branch_queries = BranchQueries()  # root node -> queries through it
        self.queries_changed = 0  #: counts add and remove: a reader of branch_queries knows if it changed since
        self.tick = 0
        self.now = float("-inf")
        self._roots = count()
        self._branches = count(1)
        self._routes: dict[str, Route] = {}
        self._fresh: list[Run] = []  # the current event's new runs (empty between events)
        self._accepted: list[tuple[QueryPlan, Any, dict, list]] = []  # and its matches before the policies
        self._interned: dict[tuple[str, ...], tuple[str, ...]] = {}  # one tuple object per equivalence list
        self._parts: list[tuple[tuple[str, ...], dict]] = []  # self.keyed's items, in a list
        self._attrs0: tuple[str, ...] | None = None  # the one equivalence list, when there is exactly one
        self._makers = MatchMakers()  # how a query's match is built (made at its first match)
        self._next_sweep = self.SWEEP_EVERY
        self._next_check = 0  # the next tick at which _periodic looks (0: the next event)
        self.full_events = False  # matches list their bound events in full ("events")
        self.fed: list[tuple[QueryPlan, dict, Any, int]] = []  # feedback queries' matches, drained by yfpp.runtime.feedback
        self.to_hold: list[Pending] = []  # trailing-negation matches the current event completed, held at commit
        self.merger = RunMerger() if merge_runs else None  # merging equivalent runs (yfpp.runtime.run_merging)
        self.merging_run: Run | None = None  # the merged run being stepped: completions are per member

    # --- registration ---------------------------------------------------------------

    def add(self, plan: QueryPlan) -> None:
        """Register a compiled query; it sees only events processed from now on."""
        plan.since_tick = self.tick
        if plan.partition_by:  # identical lists are one object: the per-event key lookup compares by identity
            plan.partition_by = self._interned.setdefault(plan.partition_by, plan.partition_by)
        self.nfa.add(plan)
        self.negations.add(plan)
        if plan.trailing is not None:  # (the deadlines keep only such queries)
            self.deadlines.add(plan)
        self.branch_queries.add(plan)
        self.queries_changed += 1
        if plan.partition_by and self._needs_pticks(plan):
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
        self._makers.pop(plan, None)
        self.branch_queries.remove(plan)
        self.queries_changed += 1
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
        if not plan.partition_by:
            return False
        node = plan.last  # (up the query's path: a Kleene node followed by one of partition contiguity)
        while node.parent is not None:
            if node.contiguity is PARTITION and node.parent.kleene:
                return True
            node = node.parent
        return False

    # --- the per-event step -----------------------------------------------------------

    def _route(self, etype: str) -> "Route":
        """What an event of type ``etype`` can do; made on the first such event after a registration change."""
        negations = self.negations
        negations.refresh()
        negs = negations.by_type.get(etype) or _NO_NEGATIONS
        anyt = negations.by_type.get(None)
        if anyt:  # negations of any type: their stores' ends are this type's (a copy, only when there are such)
            both = TypeNegations()
            for entry in (*negs.entries.values(), *anyt.entries.values()):
                owner, neg, _ = entry
                both.put(entry if neg is not None else (owner, None, negations.ends(owner, etype)))
            negs = both
        route = self._routes[etype] = Route(
            negs,
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
            elif route.wide is None and len(route.negs) == 1 and route.negs[0][1] is None and not route.scan \
                    and not route.starters:
                route.step = Runtime._candidate
            elif route.quick is not None:
                route.step = Runtime._quiet
        return route

    def process(self, ev: Event) -> list[dict]:
        """Advance every run by one event (already in stream order); return completed matches.

        The event gets its tick (stream position) and fires the deadlines before it; then its type's
        ``Route.step`` takes it (while no strict run is stored): :meth:`_starts` for an event that can only begin
        one root, :meth:`_candidate` for one that can only be a middle negation's candidate, :meth:`_quiet` for
        one that may change nothing, :meth:`_steps` for any other.
        """
        tick = self.tick = self.tick + 1
        ev.pos = tick
        self._atom_memo.epoch += 1  # (the shared atoms' answers are of the events before)
        self.now = ev.ts
        out: list[dict] = self._expire(ev.ts) if self._deadline_heap else []
        route = self._routes.get(ev.type) or self._route(ev.type)
        if self.strict:
            return self._steps(ev, route, tick, out)
        return route.step(self, ev, route, tick, out)

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

    # --- negation, deadlines, policy --------------------------------------------------

    def _expire(self, now: float, everything: bool = False) -> list[dict]:
        out: list[dict] = []
        for p in self.deadlines.expire(now, everything):
            out.append(p.match)
            self._counters.matches[p.plan.name] += 1
            if p.plan.feedback:  # with the rank and depth its binds had when it was held
                self.fed.append((p.plan, p.match, p.rank, p.depth))
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
        return self.nfa.states


# --- helpers ------------------------------------------------------------------------


def _raise(ev: Event, exc: Exception) -> None:
    raise exc

