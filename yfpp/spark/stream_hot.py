"""Hot keys of a directory stream: a key with a large share of the first events cut into time slices.

A stream spreads a keyed group's key values over a fixed number of state keys
(buckets, :mod:`yfpp.spark.stream`); a key with half the events makes its
bucket's state function do half the work. For a group whose matches span at
most a window (:func:`yfpp.spark.hot_keys.sliceable`), a hot key's events go
instead to state keys of their own, one per time slice of that key (the
slicing rule of docs/spark.md: a slice reads a window past its end and keeps
the matches that start in it), as the scan plan cuts a hot key in a batch job.

Which keys are hot is decided once, by the ingest query's stager when it
stages the stream's first micro-batch with events — nothing came before, so a
hot key has no history in a bucket — from that batch's key counts (Spark
aggregations on the executors: the driver parses nothing and is sent only the
hot hashes), and recorded in the
checkpoint (``hot.json``, read back on every later batch and restart). A key
is hot when it has at least half a bucket's fair share of the group's keyed
events of that batch (:func:`yfpp.spark.hot_keys.hot_bar`). Its slicing
starts at its first ts; a slice is at least :data:`SLICE_WINDOWS` windows
long, and the first batch's span over the buckets, so that a batch as long as
the first spreads the key over about as many state keys as there are buckets.

The stager adds to each staged event of a hot key the column :data:`HOT_TYPE`:
per hot group, the slices that read the event — state key ``b = buckets + i +
H·s`` for slice ``s`` of hot key ``i`` of the group's ``H`` — with the slicing;
the matching query routes the event there instead of to its key's bucket, and
the state function of a slice keeps the matches that start in it
(:func:`yfpp.spark.plan.advance_key`'s ``slice_of``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from yfpp.spark.batch import key_hash
from yfpp.spark.hot_keys import hot_bar, sliceable
from yfpp.spark.plan import SLICE_WINDOWS, Group, Slicing

#: The staged column of a hot key's event: the state keys of the slices that read it, with the slicing.
HOT_TYPE = "array<struct<g:int,b:bigint,s:bigint,t0:double,len:double,w:double>>"
#: The record of the decision under the stream's checkpoint.
RECORD = "hot.json"


@dataclass
class HotKeys:
    """A stream's hot keys: ``groups`` (the matching query's), ``buckets`` per keyed group, and, once
    decided, each group's hot keys as ``[key hash, t0, slice length]`` (``None``: not decided yet)."""

    groups: list[Group]
    buckets: int
    decided: dict[int, list[list[float]]] | None = None

    def load(self, text: str) -> None:
        """The decision as recorded (:meth:`record`)."""
        self.decided = {int(g): keys for g, keys in json.loads(text)["groups"].items()}

    def record(self) -> str:
        return json.dumps({"groups": self.decided or {}})

    def decide(self, events: DataFrame, first: bool) -> None:
        """Decide from ``events`` (a micro-batch's numbered events, dead letters included); ``first``:
        the stream's first events — otherwise no key is hot, ever (a key seen before has a history in
        its bucket)."""
        self.decided = {}
        if not first:
            return
        good = events.where(F.col("reason").isNull())  # (late events are dead letters by now)
        for g, grp in enumerate(self.groups):
            if not grp.key or not sliceable(grp) or grp.window is None:
                continue
            keyed = good.select(key_hash(grp.key).alias("h"), "ts").where(F.col("h").isNotNull())
            total, end = keyed.agg(F.count("*"), F.max("ts")).first()
            if not total:
                continue
            rows = (keyed.groupBy("h").agg(F.count("*").alias("n"), F.min("ts").alias("t0"))
                    .where(F.col("n") >= F.lit(hot_bar(total, self.buckets))).collect())
            keys = [[r["h"], r["t0"], max(SLICE_WINDOWS * grp.window, (end - r["t0"]) / self.buckets)]
                    for r in sorted(rows, key=lambda r: (r["t0"], r["h"])) if end > r["t0"]]
            if keys:
                self.decided[g] = keys

    def mark(self, events: DataFrame) -> DataFrame:
        """``events`` with the :data:`HOT_TYPE` column ``hot`` (null for an event of no hot key)."""
        parts = [self._slices(g, keys) for g, keys in sorted((self.decided or {}).items())]
        if not parts:
            return events.withColumn("hot", F.lit(None).cast(HOT_TYPE))
        hot = parts[0] if len(parts) == 1 else F.flatten(F.filter(F.array(*parts), lambda a: a.isNotNull()))
        return events.withColumn("hot", F.when(F.col("reason").isNull(), hot).cast(HOT_TYPE))

    def _slices(self, g: int, keys: list[list[float]]) -> Column:
        """The slices of group ``g``'s hot keys that read the event, null when it is of none of them."""
        grp = self.groups[g]
        window = float(grp.window)  # type: ignore[arg-type]
        h = key_hash(grp.key)
        out: Any = None
        for i, (key, t0, length) in enumerate(keys):
            rel = F.col("ts") - F.lit(t0)
            first = F.greatest(F.lit(0).cast("long"), F.ceil((rel - F.lit(window)) / F.lit(length) - F.lit(1e-9)) - 1)
            last = F.floor(rel / F.lit(length))  # Slicing.reads, in Spark's double arithmetic (IEEE, as Python's)
            slices = F.transform(F.sequence(first, F.greatest(first, last)),
                                 _slice_struct(g, self.buckets + i, len(keys), t0, length, window))
            cond = (h == F.lit(key)) & (last >= first)
            out = F.when(cond, slices) if out is None else out.when(cond, slices)
        return out


def _slice_struct(g: int, base: int, step: int, t0: float, length: float, window: float) -> Any:
    """The function of slice number ``s`` giving its :data:`HOT_TYPE` entry: state key ``base + step·s``."""
    return lambda s: F.struct(F.lit(g).alias("g"), (F.lit(base) + F.lit(step) * s).alias("b"), s.alias("s"),
                              F.lit(float(t0)).alias("t0"), F.lit(float(length)).alias("len"),
                              F.lit(window).alias("w"))


def owner(row_slice: Any) -> tuple[Slicing, int] | None:
    """A slice state key's slicing and slice number from a routed row's ``s``, ``t0``, ``len``, ``w`` (None: a bucket)."""
    s, t0, length, w = row_slice
    if s is None or s != s:  # null, or NaN as pandas gives a null
        return None
    return Slicing(float(t0), float(length), float(w)), int(s)
