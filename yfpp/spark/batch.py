"""The batch pipeline: route events to their groups, partitions and slices, match per partition."""

from __future__ import annotations

import json
import operator
import time
from functools import reduce
from typing import Any, Callable, Iterator, Sequence

import numpy as np
import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from yfpp.input.events import PSEUDO_ATTRS
from yfpp.runtime.feedback import MAX_DEPTH, MAX_DERIVED
from yfpp.spark.plan import Group, Slicing, effective_queries, group_queries, make_event, match_row, rare_collections
from yfpp.spark.shuffle_hot import HotHash, find_hot_hashes

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


def match(spark: SparkSession, queries: Any, events_df: DataFrame, *, policy: str | None = None,
          partitions: int | None = None, full_events: bool = False,
          feedback_limits: tuple[int, int] = (MAX_DEPTH, MAX_DERIVED), iso_times: bool = False,
          hot_keys: bool = True) -> DataFrame:
    """The matches of ``queries`` over ``events_df`` (see :func:`events_only`), one row per match.

    Columns: ``query``, ``bindings`` (variable → seq numbers, pattern order),
    ``start``, ``end``, ``emit`` (a JSON object or null) and ``json`` (the
    line ``yfpp run`` prints). ``queries``: as :func:`yfpp.spark.plan.effective_queries`.
    ``partitions``: shuffle partitions (default ``spark.sql.shuffle.partitions``).
    ``full_events``: each match's ``json`` also lists its bound events in full
    (``"events"``, as ``yfpp run --events`` writes them). ``feedback_limits``: the engines'
    ``(max_feedback_depth, max_derived_per_event)`` (``yfpp run --max-feedback-depth/--max-derived``).
    ``iso_times``: ``json`` has ``start`` and ``end`` as ISO-8601 UTC text (``yfpp run --ts-format iso``).
    ``hot_keys``: cut a keyed group's hot key hashes into time slices (:mod:`yfpp.spark.shuffle_hot`).
    """
    return match_with_stats(spark, queries, events_df, policy=policy, partitions=partitions, full_events=full_events,
                            feedback_limits=feedback_limits, iso_times=iso_times,
                            hot_keys=hot_keys).where(F.col("query").isNotNull())


def match_with_stats(spark: SparkSession, queries: Any, events_df: DataFrame, *, policy: str | None = None,
                     partitions: int | None = None, full_events: bool = False,
                     feedback_limits: tuple[int, int] = (MAX_DEPTH, MAX_DERIVED), hashed: Sequence[tuple[str, ...]] = (),
                     time_range: tuple[float | None, float | None] | None = None, iso_times: bool = False,
                     hot_keys: bool = True) -> DataFrame:
    """:func:`match`'s rows plus one row per task with ``query`` null and in ``json``
    ``{"task", "rows", "engines", "seconds", "matches", "hot"}``: the rows (event copies) it matched, the
    engines it ran (one per group and slice), its Python time, its matches per query, the job's hot keys
    (``hot_keys``: :mod:`yfpp.spark.shuffle_hot`; else none).

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
    hashes = [(F.col(_HASHES)[",".join(grp.key)] if grp.key in hashed else key_hash(grp.key)).alias(f"h{g}")
              for g, grp in enumerate(groups) if grp.key]
    hashed_events = events.select(*_EVENT_COLS, *hashes)
    hot = find_hot_hashes(hashed_events, groups, n) if hot_keys else []
    packed = hashed_events.mapInArrow(_packer(groups, slicings, n, hot), _PACKED_SCHEMA)
    routed = packed.repartitionById(n, "p").sortWithinPartitions("g", "s")
    # hot hash j runs as unit len(groups) + j: its group's queries, its own slicing
    units = groups + [groups[hh.group] for hh in hot]
    unit_slicings = {**slicings, **{len(groups) + j: hh.slicing for j, hh in enumerate(hot)}}
    names = [hh.name for hh in hot]
    if derived_ids:
        return routed.mapInArrow(_runner(units, unit_slicings, _ID_ARROW_SCHEMA, names), ID_MATCH_SCHEMA)
    return routed.mapInArrow(_runner(units, unit_slicings, hot=names), MATCH_SCHEMA)


#: A packed blob: the events (``_EVENT_COLS``, Arrow IPC) of one input batch for group ``g``'s slice ``s``
#: on task ``p``. The shuffle moves and sorts these, a few per task and input batch, not a row per event.
_PACKED_SCHEMA = "g int, s long, p int, blob binary"
_PACKED_ARROW = pa.schema([("g", pa.int32()), ("s", pa.int64()), ("p", pa.int32()), ("blob", pa.binary())])


def _packer(groups: list[Group], slicings: dict[int, Slicing], n: int, hot: Sequence[HotHash] = (),
            ) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The mapInArrow function that routes each event to its ``(g, s, p)`` copies — a keyed group's key hash
    (column ``h{g}``, null: no key) modulo ``n``, a sliced group's slices round-robin, a whole group
    by its number; the events of hot hash ``j`` (``hot``) to its slices as unit ``g = len(groups) + j``
    — and packs each input batch's events per ``(g, s, p)`` into one Arrow IPC blob."""
    hot_of: dict[int, list[tuple[int, HotHash]]] = {}  # keyed group → its hot hashes, with their unit
    for j, hh in enumerate(hot):
        hot_of.setdefault(hh.group, []).append((len(groups) + j, hh))

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for rb in batches:
            events = rb.select(list(_EVENT_COLS))
            ts = rb.column("ts").to_numpy(zero_copy_only=False)
            out: list[tuple[int, int, int, bytes]] = []
            for g, grp in enumerate(groups):
                sl = slicings.get(g)
                if grp.key:
                    h = rb.column(f"h{g}")
                    rows = np.flatnonzero(h.is_valid().to_numpy(zero_copy_only=False))
                    # the valid hashes alone: with a null among them to_numpy gives floats, which round a
                    # 64-bit hash, so one key would go to another task in a batch where some event lacks it
                    hs = h.drop_null().to_numpy().astype(np.int64) if len(rows) else np.zeros(0, np.int64)
                    for u, hh in hot_of.get(g, ()):
                        mine = hs == hh.hash
                        if mine.any():
                            out += _blobs(events, u, *_slices(ts, rows[mine], hh.slicing, u, n), n)
                            rows, hs = rows[~mine], hs[~mine]
                    s, p = np.zeros(len(rows), np.int64), hs % n
                elif sl is not None:
                    rows, s, p = _slices(ts, np.arange(len(ts)), sl, g, n)
                else:
                    rows, s = np.arange(len(ts)), np.zeros(len(ts), np.int64)
                    p = np.full(len(ts), g % n, np.int64)
                out += _blobs(events, g, rows, s, p, n)
            if out:
                yield pa.RecordBatch.from_arrays([pa.array(c, f.type) for c, f in zip(zip(*out), _PACKED_ARROW)],
                                                 schema=_PACKED_ARROW)

    return run


def _slices(ts: np.ndarray, rows: np.ndarray, sl: Slicing, g: int, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(rows, s, p)``: each of ``rows`` (indices into ``ts``) once per slice of ``sl`` that reads it
    (:meth:`Slicing.reads`, vectorised), slice ``s`` of unit ``g`` on task ``p = (s + g) mod n``."""
    rel = ts[rows] - sl.t0
    own = np.floor(rel / sl.length).astype(np.int64)
    first = np.maximum(0, np.ceil((rel - sl.window) / sl.length - 1e-9).astype(np.int64) - 1)
    span = int((own - first).max()) + 1 if len(rows) else 0
    reads = [np.flatnonzero(first + j <= own) for j in range(span)]
    if not reads:
        return rows, rows, rows
    s = np.concatenate([first[r] + j for j, r in enumerate(reads)])
    return np.concatenate([rows[r] for r in reads]), s, (s + g) % n


def _blobs(events: pa.RecordBatch, g: int, rows: np.ndarray, s: np.ndarray, p: np.ndarray,
           n: int) -> list[tuple[int, int, int, bytes]]:
    """``(g, s, p, blob)`` for each distinct ``(s, p)`` of the routed ``rows`` (in their order)."""
    if not len(rows):
        return []
    unit = s * n + p
    order = np.argsort(unit, kind="stable")
    cuts = np.flatnonzero(np.diff(unit[order])) + 1
    out = []
    for part in np.split(order, cuts):
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, events.schema) as writer:
            writer.write_batch(events.take(pa.array(rows[part])))
        out.append((g, int(s[part[0]]), int(p[part[0]]), sink.getvalue().to_pybytes()))
    return out


def _runner(groups: list[Group], slicings: dict[int, Slicing], schema: pa.Schema = _ARROW_SCHEMA,
            hot: list[str] | None = None) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The mapInArrow function: one engine per (group, slice) run of a sorted partition, then a stats row
    (with ``hot``, the job's hot keys, when given). ``groups``: by unit number (a hot hash's unit, its group)."""
    as_text = schema is _ID_ARROW_SCHEMA

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        with rare_collections():
            yield from matched(batches)

    def matched(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        started = time.process_time()
        rows: list[tuple] = []
        n_rows = n_engines = 0
        per_query: dict[str, int] = {}

        for (g, s), events in _units(batches):
            engine, sl, iso = groups[g].engine(), slicings.get(g), groups[g].iso_times
            n_engines += 1
            n_rows += events.num_rows

            def keep(ms: list[dict], s: int = s, sl: Slicing | None = sl, iso: bool = iso) -> None:
                for m in ms:
                    if sl is None or sl.own(m["start"]) == s:
                        rows.append(match_row(m, as_text, iso))
                        per_query[str(m["query"])] = per_query.get(str(m["query"]), 0) + 1

            for rb in events.to_batches(max_chunksize=10_000):
                c = rb.to_pydict()
                for seq, type_, ts, attrs, xml in zip(c["seq"], c["type"], c["ts"], c["attrs"], c["xml"]):
                    keep(engine.process(make_event(type_, ts, seq, attrs, xml)))
                if len(rows) >= 4096:
                    yield _batch(rows, schema)
                    rows.clear()
            keep(engine.flush())
        ctx = TaskContext.get()
        task = {"task": ctx.partitionId() if ctx else None, "rows": n_rows, "engines": n_engines,
                "seconds": round(time.process_time() - started, 3), "matches": per_query,
                **({"hot": hot} if hot is not None else {})}
        rows.append((None, None, None, None, None, json.dumps(task)))
        yield _batch(rows, schema)

    return run


def _units(batches: Iterator[pa.RecordBatch]) -> Iterator[tuple[tuple[int, int], pa.Table]]:
    """The events of each ``(g, s)`` of a task's packed blobs (sorted by ``g`` and ``s``), unpacked and
    sorted by ts and seq: one group's share of the task at a time, held as Arrow columns."""
    current, blobs = None, []
    for rb in batches:
        for g, s, blob in zip(*(rb.column(c).to_pylist() for c in ("g", "s", "blob"))):
            if (g, s) != current:
                if blobs:
                    yield current, _unpacked(blobs)
                current, blobs = (g, s), []
            blobs.append(blob)
    if blobs:
        yield current, _unpacked(blobs)


def _unpacked(blobs: list[bytes]) -> pa.Table:
    tables = [pa.ipc.open_stream(pa.py_buffer(b)).read_all() for b in blobs]
    return pa.concat_tables(tables).sort_by([("ts", "ascending"), ("seq", "ascending")])


def _batch(rows: list[tuple], schema: pa.Schema) -> pa.RecordBatch:
    cols = list(zip(*rows))
    return pa.RecordBatch.from_arrays([pa.array(col, f.type) for col, f in zip(cols, schema)], schema=schema)
