"""How the runtime takes one event: the handlers of an event type's route (``_starts``, ``_candidate``, ``_quiet``,
``_steps``), keys of events, and undoing what a raising event did. A mixin of :class:`~yfpp.runtime.runtime.Runtime`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from yfpp.input.events import MISSING, Event
from yfpp.nfa.shared_nfa import Node, State
from yfpp.runtime.caps import shed
from yfpp.runtime.moves import PARTITION
from yfpp.runtime.negation_store import CandidateStore
from yfpp.runtime.policies import accept
from yfpp.runtime.runs import PLAIN_KEYS, Run, partition_key, usable_key

if TYPE_CHECKING:
    from yfpp.runtime.runtime import Runtime, Route


_UNSET: Any = object()  # an event's key not yet computed (Runtime._steps)
_new = object.__new__
_ROOT_VEC = (None,)  # a root's begin: its type and key hold, its window cannot be passed


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


def _holds(states: dict[State, list[Run]] | None, root: Node) -> bool:
    """Do ``states`` (of one key) include a state of ``root``'s branch?"""
    if states:
        for st in states:
            if st.node.root is root:
                return True
    return False


class EventSteps:
    """The per-event handlers a route names (``Runtime.process`` calls one): a run-starting event, a negation
    candidate, a quiet event and the two-phase steps of the runs an event moves; undo on a raising event."""

    def _starts(self, ev: Event, route: Route, tick: int, out: list[dict]) -> list[dict]:
        """:meth:`_steps` of an event that can only begin one root (``Route.starts``; no partition ticks, strict
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

    def _candidate(self, ev: Event, route: Route, tick: int, out: list[dict]) -> list[dict]:
        """:meth:`_steps` of an event that can only be a candidate of one shared middle-negation store (no run to
        move, no root to begin; no partition ticks or strict runs).  As there: the candidate matters only while a
        run of the store's branch and the event's key is live (``_may_need``) and its own predicates hold; it ends
        that key's runs in the ``ends`` states (``NegationStores.ends``), and is kept if a run of the branch and key is left.
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

    def _steps(self, ev: Event, route: Route, tick: int, out: list[dict]) -> list[dict]:
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

    def _quiet(self, ev: Event, route: Route, tick: int, out: list[dict]) -> list[dict]:
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

    def _live_negs(self, route: Route, ev: Event) -> list:
        """The entries of ``route.negs`` an event may matter to, found through what is live rather than tried one
        by one: shared stores of the branches holding runs under the event's keys (or strict runs: see
        ``_may_need``), trailing negations of the queries holding pending matches, every unkeyed store."""
        by_root, by_plan, plain = route.wide  # type: ignore[misc]
        out = list(plain.values())
        if by_root:
            roots = {st.node.root for st in self.strict}
            for attrs, by_key in self._parts:
                if by_key:
                    k = _key_of(ev, attrs)
                    states = by_key.get(k) if k is not None else None
                    if states:
                        roots.update(st.node.root for st in states)
            for root in roots:
                stores = by_root.get(root)
                if stores:
                    out += stores.values()
        if by_plan:
            for plan in self.deadlines.waiting:
                out += by_plan.get(plan, ())
        return out
