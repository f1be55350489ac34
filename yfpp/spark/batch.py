"""The batch pipeline: route events to their groups, partitions and slices, match per partition."""

from __future__ import annotations

import json
import operator
import time
from functools import reduce
from typing import Any, Callable, Iterator, Sequence

import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from yfpp.input.events import PSEUDO_ATTRS
from yfpp.runtime.feedback import MAX_DEPTH, MAX_DERIVED
from yfpp.spark.plan import Group, Slicing, effective_queries, group_queries, make_event, match_row, rare_collections

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
#: Equivalence-key hashes computed by the readers (``yfpp.spark.parse``): ``"a,b"`` → hash.
_HASHES = "key_hashes"


def events_only(df: DataFrame) -> DataFrame:
    """The event columns of ``df``, dead letters dropped.

    ``df`` needs ``seq``, ``type`` and ``ts``; its attributes are an ``attrs``
    JSON column, or else every other column (nulls are missing attributes).
    ``ts``: see :func:`ts_seconds`.
    """
    if "reason" in df.columns:
        df = df.where(F.col("reason").isNull())
    if "attrs" not in df.columns:
        rest = [c for c in df.columns if c not in _EVENT_COLS + ("reason", "position", "raw")]
        df = df.withColumn("attrs", F.to_json(F.struct(*rest)) if rest else F.lit("{}"))
    if "xml" not in df.columns:
        df = df.withColumn("xml", F.lit(None).cast("string"))
    hashes = [_HASHES] if _HASHES in df.columns else []
    return df.select(F.col("seq").cast("long"), "type", ts_seconds(df, "ts").alias("ts"), "attrs", "xml", *hashes)


def ts_seconds(df: DataFrame, name: str) -> Column:
    """Column ``name`` of ``df`` as seconds (a double): a number as it is (seconds), a
    ``timestamp`` as seconds since the epoch (the instant, whatever the session
    time zone), a ``timestamp_ntz`` or ``date`` read as UTC; fractions kept (µs)."""
    kind = dict(df.dtypes)[name]
    if kind == "timestamp":
        return F.unix_micros(F.col(name)) / F.lit(1e6)
    if kind in ("timestamp_ntz", "date"):
        epoch = F.lit("1970-01-01 00:00:00").cast("timestamp_ntz")
        return F.timestamp_diff("MICROSECOND", epoch, F.col(name).cast("timestamp_ntz")) / F.lit(1e6)
    return F.col(name).cast("double")


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


def routes(groups: list[Group], slicings: dict[int, Slicing], n: int, hashed: Sequence[tuple[str, ...]] = ()) -> Column:
    """For each event, the ``(g, s, h, p)`` = (group, slice, key hash, task) copies it is sent to.

    The task is chosen, not hashed: a keyed group's key hash modulo ``n``, a
    sliced group's slices round-robin (there are about ``n`` of them, so every
    task gets one), a whole group by its number. A key in ``hashed`` is taken
    from the readers' ``key_hashes`` column, any other is hashed here (:func:`key_hash`).
    """
    arrays = []
    zero = F.lit(0).cast("long")

    def route(g: int, s: Column, h: Column, p: Column) -> Column:
        return F.struct(F.lit(g).cast("int").alias("g"), s.cast("long").alias("s"), h.alias("h"), p.cast("int").alias("p"))

    for g, grp in enumerate(groups):
        sl = slicings.get(g)
        if grp.key:
            h = F.col(_HASHES)[",".join(grp.key)] if grp.key in hashed else key_hash(grp.key)
            arrays.append(F.array(route(g, zero, h, F.pmod(h, F.lit(n)))))
        elif sl is not None:
            rel = F.col("ts") - F.lit(sl.t0)
            own = F.floor(rel / F.lit(sl.length))
            first = F.greatest(zero, F.ceil((rel - F.lit(sl.window)) / F.lit(sl.length) - F.lit(1e-9)) - 1)
            arrays.append(F.transform(F.sequence(first, own), _slice_route(route, g, zero, n)))
        else:
            arrays.append(F.array(route(g, zero, zero, F.lit(g % n))))
    return F.flatten(F.array(*arrays))


def _slice_route(route: Callable[..., Column], g: int, zero: Column, n: int) -> Callable[[Column], Column]:
    """The route of slice ``s`` of group ``g`` (a one-argument function: ``F.transform`` reads the arity)."""
    return lambda s: route(g, s, zero, F.pmod(s + g, F.lit(n)))


def match(spark: SparkSession, queries: Any, events_df: DataFrame, *, policy: str | None = None,
          partitions: int | None = None, full_events: bool = False,
          feedback_limits: tuple[int, int] = (MAX_DEPTH, MAX_DERIVED), iso_times: bool = False) -> DataFrame:
    """The matches of ``queries`` over ``events_df`` (see :func:`events_only`), one row per match.

    Columns: ``query``, ``bindings`` (variable → seq numbers, pattern order),
    ``start``, ``end``, ``emit`` (a JSON object or null) and ``json`` (the
    line ``yfpp run`` prints). ``queries``: as :func:`yfpp.spark.plan.effective_queries`.
    ``partitions``: shuffle partitions (default ``spark.sql.shuffle.partitions``).
    ``full_events``: each match's ``json`` also lists its bound events in full
    (``"events"``, as ``yfpp run --events`` writes them). ``feedback_limits``: the engines'
    ``(max_feedback_depth, max_derived_per_event)`` (``yfpp run --max-feedback-depth/--max-derived``).
    ``iso_times``: ``json`` has ``start`` and ``end`` as ISO-8601 UTC text (``yfpp run --ts-format iso``).
    """
    return match_with_stats(spark, queries, events_df, policy=policy, partitions=partitions, full_events=full_events,
                            feedback_limits=feedback_limits, iso_times=iso_times).where(F.col("query").isNotNull())


def match_with_stats(spark: SparkSession, queries: Any, events_df: DataFrame, *, policy: str | None = None,
                     partitions: int | None = None, full_events: bool = False,
                     feedback_limits: tuple[int, int] = (MAX_DEPTH, MAX_DERIVED), hashed: Sequence[tuple[str, ...]] = (),
                     time_range: tuple[float | None, float | None] | None = None, iso_times: bool = False) -> DataFrame:
    """:func:`match`'s rows plus one row per task with ``query`` null and in ``json``
    ``{"task", "rows", "engines", "seconds", "matches"}``: the rows (event copies) it matched, the
    engines it ran (one per group and slice), its Python time, its matches per query.

    ``hashed``: equivalence keys whose hashes ``events_df`` carries (``key_hashes``, from
    :func:`yfpp.spark.read.parse_input`); ``time_range``: the events' smallest and largest ts
    when known (else a job computes them when a group is sliced)."""
    groups = group_queries(effective_queries(queries, policy), full_events=full_events, feedback_limits=feedback_limits,
                           iso_times=iso_times)
    derived_ids = any(p.feedback for g in groups for _, p in g.queries)  # bindings hold strings too
    events = events_only(events_df)
    n = partitions or int(spark.conf.get("spark.sql.shuffle.partitions"))
    slicings: dict[int, Slicing] = {}
    if n > 1 and any(g.sliced for g in groups):
        t0, t1 = time_range or events.agg(F.min("ts"), F.max("ts")).first()
        for i, g in enumerate(groups):
            sl = Slicing.plan(t0, t1, g.window, n) if g.sliced and t0 is not None else None
            if sl is not None:
                slicings[i] = sl
    routed = (events.select(F.explode(routes(groups, slicings, n, hashed)).alias("r"), *_EVENT_COLS)
              .select("r.*", *_EVENT_COLS).where(F.col("h").isNotNull())
              .repartitionById(n, "p").sortWithinPartitions("g", "s", "ts", "seq")
              .select("g", "s", *_EVENT_COLS))
    if derived_ids:
        return routed.mapInArrow(_runner(groups, slicings, _ID_ARROW_SCHEMA), ID_MATCH_SCHEMA)
    return routed.mapInArrow(_runner(groups, slicings), MATCH_SCHEMA)


def _runner(groups: list[Group], slicings: dict[int, Slicing], schema: pa.Schema = _ARROW_SCHEMA,
            ) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The mapInArrow function: one engine per (group, slice) run of a sorted partition, then a stats row."""
    as_text = schema is _ID_ARROW_SCHEMA

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        with rare_collections():
            yield from matched(batches)

    def matched(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        started = time.process_time()
        rows: list[tuple] = []
        current, engine, sl = None, None, None
        n_rows = n_engines = 0
        per_query: dict[str, int] = {}

        def keep(ms: list[dict], s: int) -> None:
            iso = groups[current[0]].iso_times
            for m in ms:
                if sl is None or sl.own(m["start"]) == s:
                    rows.append(match_row(m, as_text, iso))
                    per_query[str(m["query"])] = per_query.get(str(m["query"]), 0) + 1

        for rb in batches:
            c = rb.to_pydict()
            n_rows += rb.num_rows
            for g, s, seq, type_, ts, attrs, xml in zip(c["g"], c["s"], c["seq"], c["type"], c["ts"], c["attrs"], c["xml"]):
                if (g, s) != current:
                    if engine is not None:
                        keep(engine.flush(), current[1])
                    current, engine, sl = (g, s), groups[g].engine(), slicings.get(g)
                    n_engines += 1
                keep(engine.process(make_event(type_, ts, seq, attrs, xml)), s)
            if len(rows) >= 4096:
                yield _batch(rows, schema)
                rows.clear()
        if engine is not None:
            keep(engine.flush(), current[1])
        ctx = TaskContext.get()
        task = {"task": ctx.partitionId() if ctx else None, "rows": n_rows, "engines": n_engines,
                "seconds": round(time.process_time() - started, 3), "matches": per_query}
        rows.append((None, None, None, None, None, json.dumps(task)))
        yield _batch(rows, schema)

    return run


def _batch(rows: list[tuple], schema: pa.Schema) -> pa.RecordBatch:
    cols = list(zip(*rows))
    return pa.RecordBatch.from_arrays([pa.array(col, f.type) for col, f in zip(cols, schema)], schema=schema)
