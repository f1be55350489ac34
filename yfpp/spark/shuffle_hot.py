"""Hot keys in the shuffle plan: a keyed group's key hash with a large share of its events, cut into time slices.

The shuffle plan (:func:`yfpp.spark.batch.match_with_stats`) sends a keyed group's events to the task of
their key hash, so a key with half the events makes one task do half the work. For a group whose matches
span at most a window (:func:`yfpp.spark.hot_keys.sliceable`), the events of a hot key hash are cut
instead into overlapping time slices, as an unkeyed group's stream is (docs/spark.md, "The slicing
rule"): an engine per slice, fed only that hash's events, finds the matches that start in the slice, and
the slices go round robin over the tasks. Keys whose hashes collide share the slices' engines, which keep
them apart as one engine does.

Which hashes are hot is decided before the match from the whole input, by two Spark jobs over the event
columns (the driver parses nothing): each group's keyed events counted, then the hashes with at least
:data:`yfpp.spark.hot_keys.HOT_SHARE` of a task's fair share of them (:func:`yfpp.spark.hot_keys.hot_bar`),
with their first and last ts. A hot hash's slicing runs from its first ts to its last in about
:data:`SLICES_PER_TASK` slices per task, each at least :data:`yfpp.spark.plan.SLICE_WINDOWS` windows long.
"""

from __future__ import annotations

from dataclasses import dataclass

import orjson
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from yfpp.spark.hot_keys import hot_bar, sliceable
from yfpp.spark.plan import SLICE_WINDOWS, Group, Slicing

#: A hot hash is cut into about this many slices per task (more even spread, more window overlap read twice).
SLICES_PER_TASK = 4


@dataclass(frozen=True)
class HotHash:
    """A hot key hash of keyed group ``group`` (its column ``h{group}``), its slicing, its key as text (``--stats``)."""

    group: int
    hash: int
    slicing: Slicing
    name: str


def find_hot_hashes(events: DataFrame, groups: list[Group], tasks: int) -> list[HotHash]:
    """The hot hashes of ``events`` (columns ``ts``, ``attrs`` and ``h{g}`` for each keyed group ``g``) among
    ``tasks`` tasks, by group, then most events first. None with one task or no sliceable keyed group."""
    keyed = [g for g, grp in enumerate(groups) if grp.key and grp.window is not None and sliceable(grp)]
    if tasks < 2 or not keyed:
        return []
    totals = events.agg(*[F.count(f"h{g}") for g in keyed]).first()
    out = []
    for g, total in zip(keyed, totals):
        h, window = f"h{g}", float(groups[g].window)  # type: ignore[arg-type]
        rows = (events.where(F.col(h).isNotNull()).groupBy(h)
                .agg(F.count(F.lit(1)).alias("n"), F.min("ts").alias("t0"), F.max("ts").alias("t1"),
                     F.first("attrs").alias("attrs"))
                .where(F.col("n") >= F.lit(hot_bar(total, tasks))).collect())
        for r in sorted(rows, key=lambda r: (-r["n"], r[h])):
            length = max(SLICE_WINDOWS * window, (r["t1"] - r["t0"]) / (SLICES_PER_TASK * tasks))
            if r["t1"] - r["t0"] > length:  # else one slice: nothing to spread
                out.append(HotHash(g, r[h], Slicing(r["t0"], length, window), key_text(groups[g], r["attrs"])))
    return out


def key_text(grp: Group, attrs: str | None) -> str:
    """The key value of an event of ``grp`` with ``attrs`` (JSON), as :class:`yfpp.spark.hot_keys.HotSlices` names it."""
    values = orjson.loads(attrs or "{}")
    key = tuple(values.get(a) for a in grp.key)
    return repr(key[0] if len(key) == 1 else key)
