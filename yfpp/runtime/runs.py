"""What the runtime stores per partial match, and what it counts."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from yfpp.input.events import MISSING, Event
from yfpp.runtime.match_buffer import Entry, MatchBuffer, Version
from yfpp.nfa.shared_nfa import State

_NONE: frozenset = frozenset()
NO_RUN = 1 << 62  # position floor when a branch has no live run


class Run:
    """One partial match: where it waits, what it has bound, where its events are.

    Most runs need only these slots; a run inside a Kleene node (its ticks), with blocked skip-till-next
    children or standing for merged runs is a :class:`FullRun`, which has its own; for the others the class
    defaults below hold."""

    __slots__ = ("state", "vec", "entry", "version", "first_ts", "first_pos", "key", "born")
    tick: int = 0  # tick of the last begin/take into a Kleene node
    ptick: int = 0  # partition tick at that moment
    blocked: frozenset = _NONE  # skip-till-next children this run can no longer proceed to
    members = None  # a merged run: the runs it stands for (yfpp.runtime.run_merging.Members)

    def __init__(self, state, vec, entry, version, first_ts, first_pos, key, born):
        self.state: State = state
        self.vec: tuple = vec
        self.entry = entry  # the last buffer entry (None: the run has bound only its first event, a single one)
        self.version: Version = version
        self.first_ts: float = first_ts
        self.first_pos: int = first_pos  # stream position of the run's first event
        self.key: Any = key
        self.born: int = born  # tick of the event that started the run

    def with_blocked(self, blocked: frozenset) -> "Run":
        """A copy that differs in ``blocked`` (runs being stepped are never mutated: see ``Runtime._steps``)."""
        r = FullRun(self.state, self.vec, self.entry, self.version, self.first_ts, self.first_pos, self.key, self.born,
                    self.tick, self.ptick)
        r.blocked = blocked
        return r


class FullRun(Run):
    """A run with its own ``tick``, ``ptick``, ``blocked`` and ``members`` (see :class:`Run`)."""

    __slots__ = ("tick", "ptick", "blocked", "members")

    def __init__(self, state, vec, entry, version, first_ts, first_pos, key, born, tick=0, ptick=0):
        # (Run.__init__'s stores written out: a Kleene take makes one of these, a call more would cost it)
        self.state = state
        self.vec = vec
        self.entry = entry
        self.version = version
        self.first_ts = first_ts
        self.first_pos = first_pos
        self.key = key
        self.born = born
        self.tick = tick
        self.ptick = ptick
        self.blocked = _NONE
        self.members = None


def full(r: Run) -> FullRun:
    """``r`` as a :class:`FullRun` (itself if it is one)."""
    if isinstance(r, FullRun):
        return r
    return FullRun(r.state, r.vec, r.entry, r.version, r.first_ts, r.first_pos, r.key, r.born)


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


PLAIN_KEYS = frozenset({str, int, float, bool})  #: the classes of the common key values, usable as they are


def partition_key(ev: Event, attrs: tuple[str, ...]) -> Any:
    """The equivalence-key value of ``ev`` (``None`` if it has none: see :func:`usable_key`)."""
    if not attrs:
        return None
    if len(attrs) == 1:
        v = ev.get(attrs[0])
        return v if v.__class__ in PLAIN_KEYS else usable_key(v)
    vals = tuple(ev.get(a) for a in attrs)
    if PLAIN_KEYS.issuperset(map(type, vals)):
        return vals
    return None if any(usable_key(v) is None for v in vals) else vals


def usable_key(v: Any) -> Any:
    """An attribute's value ``v`` as an equivalence key, or None when it can be none (docs/semantics.md §1):
    missing, null, or a value that compares with nothing (a list, a dict: unhashable) — the event is then in
    no partition."""
    if v is MISSING or v is None:
        return None
    try:
        hash(v)
    except TypeError:
        return None
    return v


def first_entry(r: Run) -> Entry:
    """The buffer entry of a run that has none: it has bound only its first event (a single one, ``vec[0]``).
    Made when a later event needs it as a predecessor, outside the buffer's stacks (their entries are in
    stream order), and kept by the run (so the runs that go on from it share it)."""
    e = r.entry = MatchBuffer.first_entry(r.vec[0], r.version)
    return e
