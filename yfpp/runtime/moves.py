"""The moves of a run (SIGMOD 2008 §4): begin, take, ignore and proceed through the shared NFA's nodes and wait
states, under each contiguity. A mixin of :class:`~yfpp.runtime.runtime.Runtime`."""

from __future__ import annotations

from typing import Any, Sequence

from yfpp.input.events import Event
from yfpp.language.pattern import Contiguity
from yfpp.nfa.predicates import kleene_start, kleene_take, reads_event_only
from yfpp.nfa.shared_atoms import is_shared
from yfpp.nfa.shared_nfa import Node, State
from yfpp.runtime.match_buffer import MatchBuffer, Version
from yfpp.runtime.runs import FullRun, Run, first_entry

STRICT, PARTITION, STNM, STAM = (
    Contiguity.STRICT,
    Contiguity.PARTITION,
    Contiguity.SKIP_TILL_NEXT,
    Contiguity.SKIP_TILL_ANY,
)


def _ignores(c: Contiguity, moved: bool, ek: Any, rkey: Any) -> bool:
    if c is STAM:
        return True
    if c is STNM:
        return not moved
    if c is PARTITION:
        return ek != rkey
    return False


def _tested_once(cands: Sequence[Node], ev: Event) -> tuple[Sequence[Node], set[Node] | None]:
    """The candidates of a wait state holding several runs, those whose begin checks all read the event alone
    (``yfpp.nfa.predicates.reads_event_only``, or a shared atom) tested once for them all: the candidates left
    (in their order; those failing dropped) and the set of those that passed (None: none)."""
    kept: list[Node] = []
    passed: set[Node] | None = None
    for child in cands:
        checks = child.begin
        if checks and all(reads_event_only(p) or is_shared(p) for p in checks):
            if not all(p(ev, ()) for p in checks):
                continue
            if passed is None:
                passed = set()
            passed.add(child)
        kept.append(child)
    return (kept if passed is not None or len(kept) < len(cands) else cands), passed


class RunMoves:
    """The moves of one run on one event: begin, take, ignore, proceed, enter a node, arrive inside a Kleene node."""

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
        passed = None  # children whose checks read the event alone and hold: tested once, not per run
        if cands and len(runs) > 1:
            cands, passed = _tested_once(cands, ev)
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
                    for p in (child.begin if passed is None or child not in passed else ()):
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
        buffer entry (its vec holds the event; :func:`~yfpp.runtime.runs.first_entry` makes one when a later event needs it)."""
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
            entry = self.buffer.add(node, i, ev, version, r.entry or first_entry(r))
            vec = r.vec[:i] + (kleene_start(ev, node.agg_slots, node.keep_events),)
            self._arrive_inside(node, vec, entry, version, r.first_ts, r.first_pos, r.key, r.born, fresh, accepted)
            return
        vec = r.vec[:i] + (ev,)  # a run's vec ends with a free slot for the node it may begin
        if not node.waits and self.merging_run is None:  # a last component: no run goes on, no entry is made
            self._complete(node, vec, None, version, r.first_ts, r.key, r.born, accepted, ev, r.entry)
            return
        entry = self.buffer.add(node, i, ev, version, r.entry or first_entry(r))
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
