"""What the runtime stores per partial match, and what it counts."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from yfpp.events import MISSING, Event
from yfpp.match_buffer import Version
from yfpp.shared_nfa import State

_NONE: frozenset = frozenset()
NO_RUN = 1 << 62  # position floor when a branch has no live run


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
        self.members = None  # a merged run: the runs it stands for (yfpp.run_merging.Members)

    def with_blocked(self, blocked: frozenset) -> "Run":
        """A copy that differs in ``blocked`` (runs being stepped are never mutated: see ``Runtime._steps``)."""
        r = Run(self.state, self.vec, self.entry, self.version, self.first_ts, self.first_pos, self.key, self.born, self.tick, self.ptick)
        r.blocked = blocked
        return r


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
