"""The shared versioned match buffer (SIGMOD 2008 §4.1).

One stack per buffer unit (a positive component of a query, or a shared NFA
state): an entry holds one event and its predecessor pointers, each labelled
with the Dewey version of the run that wrote it.  Runs that share a prefix
share its entries; an event selected by several runs into the same unit is
stored once.  A match is read back by walking predecessor pointers from the
run's last entry, taking at each entry the pointer whose version is the
longest prefix of the run's version (a dict lookup per prefix length, so
extraction is linear in the match length, not in the runs sharing an entry).

Entries of a stack are in stream order (``Event.pos``), so pruning pops from
the left.  A run that has bound only its first event (a single one) has no
entry: its vector holds the event; the entry is made, outside the stacks
(:meth:`MatchBuffer.first_entry`), only when a later event must point back to
it.  Narrow interface: :meth:`MatchBuffer.add`, :meth:`MatchBuffer.first_entry`,
:meth:`MatchBuffer.extract`, :meth:`MatchBuffer.prune_before`.  The runtime
never touches entries itself.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import deque
from typing import Hashable

from yfpp.input.events import Event

Version = tuple[int, ...]


class Entry:
    """One buffered event and its predecessor pointers, each labelled with a version.

    The first pointer is kept in ``version`` / ``pred`` (most entries have one); any
    others in the dict ``more`` (None until there is a second)."""

    __slots__ = ("event", "unit", "version", "pred", "more")

    def __init__(self, event: Event, unit: int, version: Version | None = None, pred: "Entry | None" = None):
        self.event = event
        self.unit = unit
        self.version = version  # None: no pointer yet
        self.pred = pred
        self.more: dict[Version, Entry | None] | None = None

    def link(self, version: Version, pred: "Entry | None") -> None:
        """The run ``version`` reached this entry from ``pred`` (a later pointer of one version replaces its earlier)."""
        if self.version is None or self.version == version:
            self.version, self.pred = version, pred
        elif self.more is None:
            self.more = {version: pred}
        else:
            self.more[version] = pred

    def pointers(self) -> list[tuple[Version, "Entry | None"]]:
        """Every (version label, predecessor), the first one first."""
        if self.version is None:
            return []
        first = [(self.version, self.pred)]
        return first + list(self.more.items()) if self.more else first

    def back(self, version: Version) -> "Entry | None":
        """The predecessor for the run ``version``: the pointer whose label is the longest prefix of it."""
        more = self.more
        mine = self.version
        if more is None:
            if mine is not None and (mine is version or version[:len(mine)] == mine):
                return self.pred
        else:
            for k in range(len(version), 0, -1):
                label = version if k == len(version) else version[:k]
                if label == mine:
                    return self.pred
                if label in more:
                    return more[label]
        raise AssertionError("versioned buffer: no compatible predecessor pointer")


class MatchBuffer:
    def __init__(self) -> None:
        self._stacks: dict[Hashable, deque[Entry]] = {}
        self.size = 0  # entries held in all stacks

    def add(self, stack: Hashable, unit: int, event: Event, version: Version, pred: Entry | None) -> Entry:
        """Record that the run ``version`` selected ``event`` into ``unit`` after ``pred``."""
        st = self._stacks.get(stack)
        if st is None:
            st = self._stacks[stack] = deque()
        if st and st[-1].event is event:
            entry = st[-1]
            entry.link(version, pred)
        else:
            entry = Entry(event, unit, version, pred)
            st.append(entry)
            self.size += 1
        return entry

    @staticmethod
    def first_entry(event: Event, version: Version) -> Entry:
        """An entry for the first event of the run ``version`` (unit 0, no predecessor) that is kept outside the
        stacks: a run that has bound only one single event holds it in its vector until a later event needs an
        entry to point back to (``Runtime._first_entry``).  Not counted in :attr:`size`; it lives as long as what
        points to it."""
        return Entry(event, 0, version, None)

    @staticmethod
    def extract(entry: Entry, version: Version) -> list[tuple[int, Event]]:
        """The (unit, event) pairs of the run ``version`` ending at ``entry``, oldest first."""
        out = []
        node: Entry | None = entry
        while node is not None:
            out.append((node.unit, node.event))
            node = node.back(version)
        out.reverse()
        return out

    def prune_before(self, stack: Hashable, pos: int) -> int:
        """Drop entries of ``stack`` whose event came before stream position ``pos``; return how many are left."""
        st = self._stacks.get(stack)
        if st is None:
            return 0
        n = len(st)
        while st and st[0].event.pos < pos:
            st.popleft()
        self.size -= n - len(st)
        if not st:
            del self._stacks[stack]
        return len(st)

    def count_from(self, stack: Hashable, pos: int) -> int:
        """Entries of ``stack`` at stream position ``pos`` or later."""
        st = self._stacks.get(stack)
        if not st:
            return 0
        if st[0].event.pos >= pos:
            return len(st)
        return len(st) - bisect_left(st, pos, key=lambda e: e.event.pos)

    def forget(self, event: Event) -> None:
        """Drop the entries made for ``event`` (the last event): its processing was rolled back."""
        for stack in [s for s, st in self._stacks.items() if st[-1].event is event]:
            st = self._stacks[stack]
            st.pop()
            self.size -= 1
            if not st:
                del self._stacks[stack]

    def load(self, stack: Hashable, entries: list[Entry]) -> None:
        """Set ``stack``'s entries (oldest first), as a checkpoint stored them."""
        self.drop(stack)
        if entries:
            self._stacks[stack] = deque(entries)
            self.size += len(entries)

    def drop(self, stack: Hashable) -> None:
        st = self._stacks.pop(stack, None)
        if st is not None:
            self.size -= len(st)

    def stacks(self) -> list[Hashable]:
        return list(self._stacks)

    def entries(self, stack: Hashable) -> deque[Entry]:
        """The entries of ``stack``, oldest first (for checkpoints)."""
        return self._stacks.get(stack, deque())
