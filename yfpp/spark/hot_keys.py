"""Hot keys of a keyed group: a key value with a large share of the events is cut into time slices.

A keyed group sends each key's events to the task its hash picks, so a key
with half the events makes one task do half the work. For a group whose
matches span at most a window (every query windowed, no ``non_overlapping``
policy, no feedback query), one key's events can be cut into overlapping time
slices exactly as an unkeyed group's stream is (docs/spark.md, "The slicing
rule"): an engine per slice, fed only that key's events, finds the key's
matches that start in the slice. The slices go round robin over the tasks.

Which keys are hot is decided from the stream alone — the group's first
``prefix`` keyed events, which every task reads alike — so the tasks agree
without a pass over the input: a key is hot when it has at least
:data:`HOT_SHARE` of a task's fair share of them (``prefix / tasks``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Hashable
from typing import Protocol

from yfpp.input.events import Event
from yfpp.spark.plan import Group

#: A key is hot when its events in the prefix are at least this part of a task's fair share.
HOT_SHARE = 0.5


class Share(Protocol):
    """What :class:`HotKeys` needs of a share of the scan plan (``yfpp.spark.scan._Sliced``)."""

    rows: int
    engines: int
    per_query: dict[str, int]

    def feed(self, events: list[Event], out: list[tuple]) -> None: ...

    def finish(self, out: list[tuple]) -> None: ...


def sliceable(grp: Group) -> bool:
    """Can one key of ``grp`` be cut into time slices? Every query has a window, none is
    ``non_overlapping`` (its choice depends on the key's whole history) or a feedback query
    (a derived event would be made again in each slice that reads its cause)."""
    return grp.window is not None and all(p.policy != "non_overlapping" and not p.feedback for _, p in grp.queries)


def hashable(key: tuple) -> Hashable | None:
    """``key`` if it can be counted (no list or object values), else None (never hot)."""
    try:
        hash(key)
    except TypeError:
        return None
    return key


def find_hot(keys: list[Hashable], tasks: int) -> list[Hashable]:
    """The hot keys among ``keys`` (the prefix's key values, in stream order), in order of first appearance."""
    counts = Counter(keys)
    bar = HOT_SHARE * len(keys) / tasks
    return [k for k, c in counts.items() if c >= bar and c >= 2]


class HotKeys:
    """The hot keys of one keyed group in one task: holds the group's first ``prefix`` keyed events,
    then decides; :meth:`split` takes a batch's hot-key events away to their slices (``slices(i)``: a
    sliced share for hot key number ``i``) and gives back the rest."""

    def __init__(self, grp: Group, tasks: int, prefix: int, slices: Callable[[int], Share]):
        self.grp, self.tasks, self.prefix, self.make = grp, tasks, prefix, slices
        self.held: list[Event] | None = []
        self.keys: dict[Hashable, Share] = {}
        self.numbers: dict[Hashable, int] = {}

    @property
    def deciding(self) -> bool:
        return self.held is not None

    def hold(self, events: list[Event]) -> list[Event]:
        """While deciding: keep ``events``; once the prefix is full, decide and give back all held events."""
        held = self.held
        assert held is not None
        held.extend(events)
        if sum(1 for ev in held if self.grp.key_of(ev) is not None) < self.prefix:
            return []
        return self.decide()

    def decide(self) -> list[Event]:
        """Choose the hot keys from the held events (also at the end of a short stream); give them back."""
        held, self.held = self.held or [], None
        keys = [k for k in (hashable(self.grp.key_of(ev)) for ev in held) if k is not None]
        self.keys = {k: self.make(i) for i, k in enumerate(find_hot(keys, self.tasks))}
        self.numbers = {k: i for i, k in enumerate(self.keys)}
        return held

    def split(self, events: list[Event], out: list[tuple]) -> list[Event]:
        """Feed the hot keys' events of ``events`` to their slices; the others, in order."""
        if not self.keys:
            return events
        rest: list[Event] = []
        mine: dict[int, list[Event]] = {}  # hot key number → its events of the batch, in order
        numbers, key_of = self.numbers, self.grp.key_of
        for ev in events:
            i = numbers.get(hashable(key_of(ev)))
            if i is None:
                rest.append(ev)
            else:
                mine.setdefault(i, []).append(ev)
        shares = list(self.keys.values())
        for i, evs in mine.items():
            shares[i].feed(evs, out)
        return rest

    def finish(self, out: list[tuple]) -> None:
        for share in self.keys.values():
            share.finish(out)

    def counts(self) -> tuple[int, int, dict[str, int]]:
        """The slices' rows, engines and matches per query, for the task's stats."""
        per_query: dict[str, int] = {}
        for share in self.keys.values():
            for q, k in share.per_query.items():
                per_query[q] = per_query.get(q, 0) + k
        return (sum(s.rows for s in self.keys.values()), sum(s.engines for s in self.keys.values()), per_query)

    def names(self) -> list[str]:
        """The hot keys, as text for ``--stats``."""
        return [repr(k[0] if len(k) == 1 else k) for k in self.keys]  # type: ignore[index,arg-type]
