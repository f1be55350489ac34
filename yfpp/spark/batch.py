"""The batch pipeline: read events with global seq numbers, route them, match per partition."""

from __future__ import annotations

import operator
import os
from functools import reduce
from typing import Any, Callable, Iterator

import pyarrow as pa
from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from yfpp.events import PSEUDO_ATTRS
from yfpp.spark import source
from yfpp.spark.plan import Group, Slicing, effective_queries, group_queries, make_event, match_row

MATCH_SCHEMA = "query string, bindings map<string, array<bigint>>, start double, end double, emit string, json string"
_ARROW_SCHEMA = pa.schema([
    ("query", pa.string()), ("bindings", pa.map_(pa.string(), pa.list_(pa.int64()))), ("start", pa.float64()),
    ("end", pa.float64()), ("emit", pa.string()), ("json", pa.string()),
])
# With feedback queries, bindings also hold derived events' ids (strings): seq numbers are written as text.
ID_MATCH_SCHEMA = MATCH_SCHEMA.replace("array<bigint>", "array<string>")
_ID_ARROW_SCHEMA = pa.schema([f if f.name != "bindings" else pa.field("bindings", pa.map_(pa.string(), pa.list_(pa.string())))
                              for f in _ARROW_SCHEMA])
_EVENT_COLS = ("seq", "type", "ts", "attrs", "xml")


def read_events_df(spark: SparkSession, path: str | os.PathLike[str], format: str | None = None, *,
                   ts_field: str = "ts", ts_unit: str = "s") -> DataFrame:
    """Every record of a file, or of a directory's files in name order, as a persisted DataFrame
    (``unpersist()`` it when done).

    Columns: ``seq`` (global: the record's index in its file plus the records
    of the files before it), ``type``, ``ts``, ``attrs`` (a JSON object),
    ``xml`` (the event's element, XML input only), and for a dead letter
    ``reason``, ``position``, ``raw``. Malformed records and late events
    (ts below the largest earlier ts, as ``yfpp run`` with ``max_delay`` 0)
    are dead letters; :func:`match` skips them.
    """
    source.register(spark)
    path = os.fspath(path)
    opts = {"path": path, "ts_field": ts_field, "ts_unit": ts_unit, **({"format": format} if format else {})}
    raw = spark.read.format("yfpp").options(**opts).load()
    offsets: list[int] = [0]
    before: list[float | None] = [None]  # the largest ts of the files before each file
    n_files = len(source.list_files(path))
    if n_files > 1:  # one pass for the record count and largest ts per file
        raw = raw.persist(StorageLevel.MEMORY_AND_DISK)
        stats = {r["file"]: (r["n"], r["t"]) for r in raw.groupBy("file").agg(F.count("*").alias("n"), F.max("ts").alias("t")).collect()}
        for i in range(n_files - 1):
            n, t = stats.get(i, (0, None))
            offsets.append(offsets[-1] + n)
            known = [x for x in (before[-1], t) if x is not None]
            before.append(max(known) if known else None)
    idx = F.col("file") + 1
    seq = F.element_at(F.array(*[F.lit(o).cast("long") for o in offsets]), idx) + F.col("pos")
    stream_time = F.greatest("prev_max", F.element_at(F.array(*[F.lit(b).cast("double") for b in before]), idx))
    late = F.col("reason").isNull() & (F.col("ts") < stream_time)
    events = raw.select(
        seq.alias("seq"), "type", "ts", "attrs", "xml",
        F.when(late, F.format_string("late event: ts %s < stream time %s (max_delay 0.0)", "ts", stream_time))
        .otherwise(F.col("reason")).alias("reason"),
        F.when(late, F.concat(F.lit("seq "), seq)).otherwise(F.col("position")).alias("position"),
        "raw",
    ).persist(StorageLevel.MEMORY_AND_DISK)
    if raw.is_cached:
        events.count()
        raw.unpersist()
    return events


def events_only(df: DataFrame) -> DataFrame:
    """The event columns of ``df``, dead letters dropped.

    ``df`` needs ``seq``, ``type`` and ``ts``; its attributes are an ``attrs``
    JSON column, or else every other column (nulls are missing attributes).
    """
    if "reason" in df.columns:
        df = df.where(F.col("reason").isNull())
    if "attrs" not in df.columns:
        rest = [c for c in df.columns if c not in _EVENT_COLS + ("reason", "position", "raw")]
        df = df.withColumn("attrs", F.to_json(F.struct(*rest)) if rest else F.lit("{}"))
    if "xml" not in df.columns:
        df = df.withColumn("xml", F.lit(None).cast("string"))
    return df.select(F.col("seq").cast("long"), "type", F.col("ts").cast("double"), "attrs", "xml")


def key_hash(key: tuple[str, ...]) -> Column:
    """A hash of the event's equivalence-key values, null when one is missing.

    Values that Python finds equal hash equally (``7``, ``7.0``, ``true``/``1``
    are all the double ``7.0`` / ``1.0``); a few unequal ones may collide,
    which only puts them in the same partition.
    """
    amap = F.from_json("attrs", "map<string, string>")
    vals = []
    for a in key:
        v = amap[a]
        if a in PSEUDO_ATTRS:
            v = F.coalesce(v, F.col(a).cast("string"))
        num = (v.try_cast("double") + F.lit(0.0)).cast("string")  # + 0.0: -0.0 == 0.0 in Python
        vals.append(F.coalesce(num, F.when(v == "true", "1.0").when(v == "false", "0.0"), v))
    missing = reduce(operator.or_, [v.isNull() for v in vals])
    return F.when(missing, F.lit(None).cast("long")).otherwise(F.xxhash64(*vals))


def routes(groups: list[Group], slicings: dict[int, Slicing]) -> Column:
    """For each event, the ``(g, s, h)`` = (group, slice, key hash) copies it is sent to."""
    arrays = []
    for g, grp in enumerate(groups):
        gl = F.lit(g).cast("int")
        sl = slicings.get(g)
        if grp.key:
            arrays.append(F.array(F.struct(gl.alias("g"), F.lit(0).cast("long").alias("s"), key_hash(grp.key).alias("h"))))
        elif sl is not None:
            rel = F.col("ts") - F.lit(sl.t0)
            own = F.floor(rel / F.lit(sl.length))
            first = F.greatest(F.lit(0).cast("long"), F.ceil((rel - F.lit(sl.window)) / F.lit(sl.length) - F.lit(1e-9)) - 1)
            arrays.append(F.transform(F.sequence(first, own), lambda s: F.struct(gl.alias("g"), s.cast("long").alias("s"), F.lit(0).cast("long").alias("h"))))
        else:
            arrays.append(F.array(F.struct(gl.alias("g"), F.lit(0).cast("long").alias("s"), F.lit(0).cast("long").alias("h"))))
    return F.flatten(F.array(*arrays))


def match(spark: SparkSession, queries: Any, events_df: DataFrame, *, policy: str | None = None,
          partitions: int | None = None) -> DataFrame:
    """The matches of ``queries`` over ``events_df`` (see :func:`events_only`), one row per match.

    Columns: ``query``, ``bindings`` (variable → seq numbers, pattern order),
    ``start``, ``end``, ``emit`` (a JSON object or null) and ``json`` (the SPEC
    §5 line). ``queries``: as :func:`yfpp.spark.plan.effective_queries`.
    ``partitions``: shuffle partitions (default ``spark.sql.shuffle.partitions``).
    """
    groups = group_queries(effective_queries(queries, policy))
    derived_ids = any(p.feedback for g in groups for _, p in g.queries)  # bindings hold strings too
    events = events_only(events_df)
    n = partitions or int(spark.conf.get("spark.sql.shuffle.partitions"))
    slicings: dict[int, Slicing] = {}
    if n > 1 and any(g.sliced for g in groups):
        t0, t1 = events.agg(F.min("ts"), F.max("ts")).first()
        for i, g in enumerate(groups):
            sl = Slicing.plan(t0, t1, g.window, n) if g.sliced and t0 is not None else None
            if sl is not None:
                slicings[i] = sl
    routed = (events.select(F.explode(routes(groups, slicings)).alias("r"), *_EVENT_COLS)
              .select("r.*", *_EVENT_COLS).where(F.col("h").isNotNull())
              .repartition(n, "g", "s", "h").sortWithinPartitions("g", "s", "ts", "seq")
              .select("g", "s", *_EVENT_COLS))
    if derived_ids:
        return routed.mapInArrow(_runner(groups, slicings, _ID_ARROW_SCHEMA), ID_MATCH_SCHEMA)
    return routed.mapInArrow(_runner(groups, slicings), MATCH_SCHEMA)


def _runner(groups: list[Group], slicings: dict[int, Slicing], schema: pa.Schema = _ARROW_SCHEMA,
            ) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The mapInArrow function: one engine per (group, slice) run of a sorted partition."""
    as_text = schema is _ID_ARROW_SCHEMA

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        rows: list[tuple] = []
        current, engine, sl = None, None, None

        def keep(ms: list[dict], s: int) -> None:
            rows.extend(match_row(m, as_text) for m in ms if sl is None or sl.own(m["start"]) == s)

        for rb in batches:
            c = rb.to_pydict()
            for g, s, seq, type_, ts, attrs, xml in zip(c["g"], c["s"], c["seq"], c["type"], c["ts"], c["attrs"], c["xml"]):
                if (g, s) != current:
                    if engine is not None:
                        keep(engine.flush(), current[1])
                    current, engine, sl = (g, s), groups[g].engine(), slicings.get(g)
                keep(engine.process(make_event(type_, ts, seq, attrs, xml)), s)
            if len(rows) >= 4096:
                yield _batch(rows, schema)
                rows.clear()
        if engine is not None:
            keep(engine.flush(), current[1])
        if rows:
            yield _batch(rows, schema)

    return run


def _batch(rows: list[tuple], schema: pa.Schema) -> pa.RecordBatch:
    cols = list(zip(*rows))
    return pa.RecordBatch.from_arrays([pa.array(col, f.type) for col, f in zip(cols, schema)], schema=schema)
