"""Merging equivalent runs (SIGMOD 2008 §5.2.2), switched on by ``Engine(merge_runs=True)``.

Two runs are *equivalent* when everything the rest of their processing can
depend on is equal: they wait in the same state of the shared NFA, under the
same partition key, with the same contiguity bookkeeping (``blocked``: the
skip-till-next children they can no longer proceed to; ``tick``/``ptick``:
when their Kleene component last moved, for strict and partition contiguity)
and the same *merge key* of their computation-state vector.  The merge key of
a state (the paper's mask ``M``) is read off the pattern IR of every query
through the state's node: each value that a predicate still ahead reads
(``v.attr`` of a bound single event, ``a[1].attr``, ``a[i-1].attr`` /
``a[a.len].attr``, ``a.len``, an aggregate's running accumulator), the
positions a middle negation's interval is cut by, and what RETURN reads.
Values are compared with their type (``1``, ``1.0`` and ``True`` differ, so
do ``0.0`` and ``-0.0``).  A state where some future check quantifies over
every event of a Kleene variable (``a.x`` outside ``a``'s own iterations, or
a RETURN listing them) never merges: its key would be the whole event list.

Equivalent runs then select the same events until they finish; they become
one :class:`~yfpp.runtime.runtime.Run` that keeps, in ``members``, each merged run's
Dewey version, last buffer entry, start time, first position and birth tick
(sorted oldest start first).  The runtime steps the merged run once; what
differs per member is handled here:

* **buffer** — every entry the step adds gets one predecessor pointer per
  member (its own version, its own previous entry), so the versioned buffer
  holds exactly what it would hold without merging, and every member's match
  is read back as before;
* **windows** — before a step, members are grouped by which of the windows
  involved (the state's node and its children) their start still satisfies;
  each group is stepped on its own (usually there is one group: a merged run
  carries the youngest start, and expired members drop out);
* **matches** — a completion is post-processed per member (registration time,
  query window, negations, trailing-negation deadline), in the runtime's
  ``_complete``.

A merged run counts once in ``stats.runs_touched``, ``live_runs`` and the
``max_runs_per_query`` cap; before a branch is shed its merged runs are split
back into their members, so shedding still drops whole start events.
Checkpoints store merged runs as their members (the restored engine merges
again from its next event).  Merging happens when runs are stored after an
event: the runs that event created or left waiting are grouped by state and
key; runs that an event does not touch merge at the next event that does.
"""

from __future__ import annotations

import math
from typing import Any, Callable

from yfpp.input.events import Event
from yfpp.language.pattern import Aggregate, Contiguity, Index, Length, Ref, XPathTest, walk
from yfpp.nfa.shared_nfa import children_of
from yfpp.runtime.runs import FullRun, first_entry, full


class Members:
    """The runs a merged run stands for, oldest start first (parallel tuples)."""

    __slots__ = ("versions", "entries", "first_ts", "first_pos", "born")

    def __init__(self, versions: tuple, entries: tuple, first_ts: tuple, first_pos: tuple, born: tuple) -> None:
        self.versions = versions
        self.entries = entries
        self.first_ts = first_ts
        self.first_pos = first_pos
        self.born = born

    def __len__(self) -> int:
        return len(self.versions)


_UNMERGEABLE = object()  # a state whose merge key would need whole event lists


class RunMerger:
    """Merges equivalent runs as they are stored, and steps merged runs (see the module docstring)."""

    def __init__(self) -> None:
        self._keys: dict[Any, Any] = {}  # State -> its merge-key function, or _UNMERGEABLE
        self._windows: dict[Any, tuple] = {}  # Node -> the windows of it and its children, smallest first
        self.merged = 0  # runs that joined another run (for the benchmarks)

    def reset(self, rt) -> None:
        """Queries changed: forget the merge keys; on registration split merged runs (new futures may tell them apart)."""
        self._keys.clear()
        self._windows.clear()
        gained = 0
        for store in rt._stores():
            for st, runs in store.items():
                if any(r.members is not None for r in runs):
                    split = [x for r in runs for x in as_plain_runs(r)]
                    st.node.root.live += len(split) - len(runs)
                    gained += len(split) - len(runs)
                    store[st] = split
        rt.counters.live_runs += gained

    # --- merging ---------------------------------------------------------------------

    def merge(self, rt, moved: list[list], fresh: list) -> None:
        """Merge equivalent runs among those about to be stored (``fresh`` and every ``stays``), in place."""
        n = len(fresh)
        for stays in moved:
            n += len(stays)
        if n < 2:
            return
        slots: dict[tuple, list] = {}
        for r in fresh:
            slots.setdefault((r.state, r.key), []).append(r)
        for stays in moved:
            for r in stays:
                slots.setdefault((r.state, r.key), []).append(r)
        joined: set[int] = set()
        made = []
        dead = rt.dead
        for (st, _), runs in slots.items():
            if len(runs) < 2 or st in dead:
                continue
            key_of = self._keys.get(st)
            if key_of is None:
                key_of = self._keys[st] = _merge_key(rt, st)
            if key_of is _UNMERGEABLE:
                continue
            groups: dict[tuple, list] = {}
            try:
                for r in runs:
                    groups.setdefault(key_of(r), []).append(r)
            except TypeError:  # an unhashable attribute value: leave these runs apart
                continue
            for group in groups.values():
                if len(group) > 1:
                    made.append(combine(group))
                    joined.update(map(id, group))
                    self.merged += len(group) - 1
        if not made:
            return
        fresh[:] = [r for r in fresh if id(r) not in joined]
        for stays in moved:
            if stays:
                stays[:] = [r for r in stays if id(r) not in joined]
        fresh.extend(made)

    # --- stepping ----------------------------------------------------------------------

    def step(self, rt, r, ev: Event, ek: Any, fresh: list, stays: list, accepted: list) -> None:
        """``Runtime._step`` for a merged run: per window group, then the results get the members."""
        node = r.state.node
        windows = self._windows.get(node)
        if windows is None:
            ws = {w for w in (node.window, *(c.window for c in children_of(node))) if w is not None}
            windows = self._windows[node] = tuple(sorted(ws))
        if not windows or ev.ts - r.members.first_ts[0] <= windows[0]:
            groups = [r]  # the oldest member is inside every window: so is every member
        else:
            groups = _window_groups(r, ev.ts, windows)
        for g in groups:
            if g.members is None:
                rt._step(g, ev, ek, fresh, stays, accepted)
                continue
            f0, s0 = len(fresh), len(stays)
            rt.merging_run = g  # its completions are post-processed per member (Runtime._complete)
            try:
                rt._step(g, ev, ek, fresh, stays, accepted)
            finally:
                rt.merging_run = None
            for k in range(f0, len(fresh)):
                run = fresh[k] = full(fresh[k])
                run.members = _derive(g, run)
            for k in range(s0, len(stays)):
                run = stays[k] = full(stays[k])
                run.members = g.members

    def trim(self, runs: list, now: float, window: float) -> list:
        """Runs kept by the sweep without the members whose start ``window`` has passed."""
        out = []
        for r in runs:
            m = r.members
            if m is not None and now - m.first_ts[0] > window:
                i = next(i for i, t in enumerate(m.first_ts) if now - t <= window)
                r = _part(r, i, len(m))
            out.append(r)
        return out

    def split_branch(self, rt, root) -> None:
        """Split the merged runs of ``root``'s branch back into plain runs (before shedding)."""
        gained = 0
        for store in rt._stores():
            for st, runs in store.items():
                if st.node.root is root and any(r.members is not None for r in runs):
                    split = [x for r in runs for x in as_plain_runs(r)]
                    gained += len(split) - len(runs)
                    store[st] = split
        root.live += gained
        rt.counters.live_runs += gained


def member_completions(r, version: tuple, entry) -> list[tuple[tuple, float, int]]:
    """(version, first_ts, born) of each run ``r`` stands for, completing at ``entry`` (made by ``r``'s step as ``version``)."""
    m = r.members
    if m is None:
        return [(version, r.first_ts, r.born)]
    suffix = version[len(r.version):]
    versions = [v + suffix for v in m.versions] if suffix else m.versions
    for v, e in zip(versions, m.entries):
        entry.link(v, e)
    return list(zip(versions, m.first_ts, m.born))


def as_plain_runs(r) -> list:
    """The runs a (possibly merged) run stands for, as plain runs."""
    m = r.members
    if m is None:
        return [r]
    return [_part(r, i, i + 1) for i in range(len(m))]


def combine(runs: list):
    """One run standing for all of ``runs`` (equivalent: same state, key, bookkeeping and merge key)."""
    rows = []
    for r in runs:
        m = r.members
        if m is None:  # (a run without an entry has bound only its first event: first_entry)
            rows.append((r.first_ts, r.first_pos, r.version, r.entry or first_entry(r), r.born))
        else:
            rows.extend(zip(m.first_ts, m.first_pos, m.versions, m.entries, m.born))
    rows.sort(key=lambda row: (row[0], row[1]))
    ts, pos, versions, entries, born = zip(*rows)
    r0 = runs[0]
    run = FullRun(r0.state, r0.vec, entries[0], versions[0], ts[-1], min(pos), r0.key, min(born), r0.tick, r0.ptick)
    run.blocked = r0.blocked
    run.members = Members(versions, entries, ts, pos, born)
    return run


def _part(r, i: int, j: int):
    """The run standing for members ``i:j`` of merged run ``r`` (a plain run for one member)."""
    m = r.members
    if j - i == 1:
        run = FullRun(r.state, r.vec, m.entries[i], m.versions[i], m.first_ts[i], m.first_pos[i], r.key, m.born[i],
                      r.tick, r.ptick)
    else:
        sub = Members(m.versions[i:j], m.entries[i:j], m.first_ts[i:j], m.first_pos[i:j], m.born[i:j])
        run = FullRun(r.state, r.vec, sub.entries[0], sub.versions[0], sub.first_ts[-1], min(sub.first_pos), r.key,
                      min(sub.born), r.tick, r.ptick)
        run.members = sub
    run.blocked = r.blocked
    return run


def _window_groups(r, now: float, windows: tuple) -> list:
    """``r`` split by which ``windows`` (of its state's node and children) its members' starts still satisfy."""
    ts = r.members.first_ts
    cuts = {0, len(ts)}
    for w in windows:  # starts are sorted, so the members passing w are a suffix
        cuts.add(next((i for i, t in enumerate(ts) if now - t <= w), len(ts)))
    bounds = sorted(cuts)
    return [_part(r, i, j) for i, j in zip(bounds, bounds[1:])]


def _derive(g, run) -> Members:
    """The members of ``run``, made by merged run ``g``'s step (same or extended version; same or a new entry)."""
    m = g.members
    suffix = run.version[len(g.version):]
    versions = tuple(v + suffix for v in m.versions) if suffix else m.versions
    if run.entry is g.entry:
        entries = m.entries
    else:  # a new entry whose pointer for g's version is g's entry: one pointer per member
        for v, e in zip(versions, m.entries):
            run.entry.link(v, e)
        entries = (run.entry,) * len(versions)
    return Members(versions, entries, m.first_ts, m.first_pos, m.born)


# --- the merge key of a state ------------------------------------------------------------


def _merge_key(rt, st) -> Callable[[Any], tuple] | object:
    """A function of a run in ``st`` giving everything ahead of it can read (or _UNMERGEABLE).

    ``blocked`` always; the Kleene ticks only where a strict or partition-contiguity proceed reads them
    (``Runtime._retro_ok``); then the merge key of the vector.
    """
    node = st.node
    i = node.index
    inside = st.mode == "in"
    getters: dict[tuple, Callable] = {}
    for plan in rt.branch_queries.get(node.root, ()):
        nodes = plan.nodes  # (a walk up the plan's parents: once)
        if len(nodes) <= i or nodes[i] is not node:
            continue
        slot_of = {v: k for k, v in enumerate(plan.var_names)}
        slot_of.update({f"#{k}": k for k in range(len(plan.var_names))})
        specs = plan.specs  # (compiled again from the pattern once registered: read once)
        kleene = [s.kleene for s in specs]
        exprs: list[tuple[Any, int | None]] = []  # (expression, slot whose own iteration it runs in)
        for j, spec in enumerate(specs):
            if j > i:
                exprs += [(e, j) for e, _ in spec.begin + spec.take] + [(e, None) for e, _ in spec.final]
            elif j == i and inside:
                exprs += [(e, j) for e, _ in spec.take] + [(e, None) for e, _ in spec.final]
        negated = {c.var for c in plan.pattern.components if not c.positive}
        exprs += [(e, None) for e in plan.pattern.where if any(getattr(n, "var", None) in negated for n in walk(e))]
        if plan.pattern.emit is not None:
            exprs += [(e, None) for _, e in plan.pattern.emit.attrs]
        for expr, own in exprs:
            for n in walk(expr):
                if not isinstance(n, (Ref, Length, Aggregate, XPathTest)):
                    continue
                s = slot_of.get(n.var)
                if s is None or s > i:
                    continue  # a negated event, or one bound after now: the same for equivalent runs
                if not _add_getter(getters, n, s, kleene[s], own == s, specs[s]):
                    return _UNMERGEABLE
        for neg in plan.negations:
            if 0 <= neg.lower <= i:
                getters.setdefault(("last_pos", neg.lower), _last_pos_of(neg.lower))
            if neg.upper is not None and neg.upper <= i:
                getters.setdefault(("first_pos", neg.upper), _first_pos_of(neg.upper))
    parts = tuple(getters.values())
    if inside and any(w.contiguity in (Contiguity.STRICT, Contiguity.PARTITION) for w in node.waits.values()):
        return lambda r: (r.blocked, r.tick, r.ptick, *[g(r.vec) for g in parts])
    return lambda r: (r.blocked, *[g(r.vec) for g in parts])


def _add_getter(getters: dict, n, s: int, kleene: bool, own_iteration: bool, spec) -> bool:
    """Add what reading ``n`` (of slot ``s``) needs; False if it needs every event of a Kleene variable."""
    if isinstance(n, Length):
        getters.setdefault(("len", s), lambda vec: vec[s].n)
        return True
    if isinstance(n, Aggregate):
        k = spec.agg_slots.index(_agg_slot(n))
        getters.setdefault(("agg", s, k), lambda vec: _canon(vec[s].aggs[k]))
        return True
    if isinstance(n, XPathTest):
        if not kleene:
            getters.setdefault(("event", s), lambda vec: id(vec[s]))
            return True
        return own_iteration  # its own iteration reads the event being taken
    attr = n.attr
    if not kleene:
        getters.setdefault(("attr", s, attr), lambda vec: _canon(vec[s].get(attr)))
    elif n.index is Index.FIRST:
        getters.setdefault(("first", s, attr), lambda vec: _canon(vec[s].first.get(attr)))
    elif n.index in (Index.PREV, Index.LAST):
        getters.setdefault(("last", s, attr), lambda vec: _canon(vec[s].last.get(attr)))
    else:
        return own_iteration  # EACH: the event being taken in its own iteration, else every bound event
    return True


def _agg_slot(n: Aggregate):
    from yfpp.nfa.predicates import AggSlot

    return AggSlot(n.func, n.attr)


def _last_pos_of(s: int) -> Callable:
    return lambda vec: vec[s].pos if isinstance(vec[s], Event) else vec[s].last.pos


def _first_pos_of(s: int) -> Callable:
    return lambda vec: vec[s].pos if isinstance(vec[s], Event) else vec[s].first.pos


def _canon(v: Any) -> Any:
    """``v`` with its type, so that values equal under ``==`` but not interchangeable stay apart."""
    t = type(v)
    if t is tuple:
        return tuple(_canon(x) for x in v)
    if t is float and v == 0.0:
        return (t, v, math.copysign(1.0, v))
    return (t, v)
