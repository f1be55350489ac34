"""The shared versioned match buffer (SIGMOD 2008 §4.1).

One stack per buffer unit (a positive component of a query, or a shared NFA
state): an entry holds one event and its predecessor pointers, each labelled
with the Dewey version of the run that wrote it.  Runs that share a prefix
share its entries; an event selected by several runs into the same unit is
stored once.  A match is read back by walking predecessor pointers from the
run's last entry, taking at each entry the pointer whose version is the
longest prefix of the run's version (a dict lookup per prefix length, so
extraction is linear in the match length, not in the runs sharing an entry).

Narrow interface: :meth:`MatchBuffer.add`, :meth:`MatchBuffer.extract`,
:meth:`MatchBuffer.prune_before`.  The runtime never touches entries itself.
"""

from __future__ import annotations

from collections import deque
from typing import Hashable

from yfpp.events import Event

Version = tuple[int, ...]


class Entry:
    __slots__ = ("event", "unit", "preds")

    def __init__(self, event: Event, unit: int):
        self.event = event
        self.unit = unit
        self.preds: dict[Version, Entry | None] = {}  # version label -> predecessor


class MatchBuffer:
    def __init__(self) -> None:
        self._stacks: dict[Hashable, deque[Entry]] = {}

    def add(self, stack: Hashable, unit: int, event: Event, version: Version, pred: Entry | None) -> Entry:
        """Record that the run ``version`` selected ``event`` into ``unit`` after ``pred``."""
        st = self._stacks.get(stack)
        if st is None:
            st = self._stacks[stack] = deque()
        if st and st[-1].event is event:
            entry = st[-1]
        else:
            entry = Entry(event, unit)
            st.append(entry)
        entry.preds[version] = pred
        return entry

    @staticmethod
    def extract(entry: Entry, version: Version) -> list[tuple[int, Event]]:
        """The (unit, event) pairs of the run ``version`` ending at ``entry``, oldest first."""
        out = []
        node: Entry | None = entry
        while node is not None:
            out.append((node.unit, node.event))
            preds = node.preds
            for k in range(len(version), 0, -1):  # the longest label that is a prefix of version
                label = version if k == len(version) else version[:k]
                if label in preds:
                    node = preds[label]
                    break
            else:
                raise AssertionError("versioned buffer: no compatible predecessor pointer")
        out.reverse()
        return out

    def prune_before(self, stack: Hashable, pos: int) -> None:
        """Drop entries of ``stack`` whose event came before stream position ``pos`` (no live run reaches them)."""
        st = self._stacks.get(stack)
        while st and st[0].event.pos < pos:
            st.popleft()
        if st is not None and not st:
            del self._stacks[stack]

    def drop(self, stack: Hashable) -> None:
        self._stacks.pop(stack, None)

    def stacks(self) -> list[Hashable]:
        return list(self._stacks)

    @property
    def size(self) -> int:
        """Entries held in all stacks."""
        return sum(len(s) for s in self._stacks.values())
