"""Hot keys of a keyed group: a key value with a large share of the events is cut into time slices.

A keyed group sends each key's events to the task its hash picks, so a key
with half the events makes one task do half the work. For a group whose
matches span at most a window (every query windowed, no ``non_overlapping``
policy, no feedback query), one key's events can be cut into overlapping time
slices exactly as an unkeyed group's stream is (docs/spark.md, "The slicing
rule"): an engine per slice, fed only that key's events, finds the key's
matches that start in the slice. The slices go round robin over the tasks.

Which keys are hot is decided by the driver from the head of the stream, as a
sliced group's slicing is (``yfpp.spark.scan.head_slicings``): a key is hot
when it has at least :data:`HOT_SHARE` of a task's fair share of the group's
first keyed events; the read tasks send a hot key's events to its slices'
tasks, slice ``s`` of hot key ``i`` of group ``g`` on task ``(s + g + i) mod n``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Mapping
from typing import Protocol

from yfpp.input.events import Event
from yfpp.spark.plan import Group

#: A key is hot when its events in the prefix are at least this part of a task's fair share.
HOT_SHARE = 0.5


class Share(Protocol):
    """What :class:`HotSlices` needs of a share of the scan plan (``yfpp.spark.scan._Sliced``)."""

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
    return hot_of_counts(Counter(keys), tasks)


def hot_of_counts(counts: Mapping[Hashable, int], tasks: int) -> list[Hashable]:
    """The keys of ``counts`` (events per key value) that are hot among ``tasks`` tasks, in ``counts``' order."""
    bar = hot_bar(sum(counts.values()), tasks)
    return [k for k, c in counts.items() if c >= bar]


def hot_bar(events: int, tasks: int) -> float:
    """The events a key needs to be hot, of ``events`` keyed events over ``tasks`` tasks (two at least: one
    event is never worth slicing)."""
    return max(2.0, HOT_SHARE * events / tasks)


class HotSlices:
    """A matching task's share of one keyed group's hot keys: ``slices`` maps each hot key to its
    sliced share (``yfpp.spark.scan._Sliced``, which keeps the slices that are the task's);
    :meth:`split` takes a batch's hot-key events away to their slices and gives back the rest."""

    def __init__(self, grp: Group, slices: dict[Hashable, Share]):
        self.grp, self.keys = grp, slices

    def split(self, events: list[Event], out: list[tuple]) -> list[Event]:
        """Feed the hot keys' events of ``events`` to their slices; the others, in order."""
        rest: list[Event] = []
        mine: dict[Hashable, list[Event]] = {}  # hot key → its events of the batch, in order
        keys, key_of = self.keys, self.grp.key_of
        for ev in events:
            k = key_of(ev)
            k = hashable(k) if k is not None else None
            if k is None or k not in keys:
                rest.append(ev)
            else:
                mine.setdefault(k, []).append(ev)
        for k, evs in mine.items():
            keys[k].feed(evs, out)
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
