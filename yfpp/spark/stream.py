"""Structured Streaming: per-key matching state across micro-batches.

Its input is a directory's staged events (the ingest query of
:mod:`yfpp.spark.ingest` reads, numbers and stages them) or the socket demo
source (:mod:`yfpp.spark.source`); :func:`start_stream` starts both queries.

A keyed group's key values are spread over a fixed number of **state keys**
(buckets: ``(group, key hash mod B)``, :func:`state_buckets`; an unkeyed group is one), as a
batch task holds many key values: per micro-batch, the state function runs
once per bucket that got events or timed out — one engine, its queries
compiled once, for all the bucket's key values —, not once per key value
(compiling a group of 1,000 subscriptions takes about a tenth of a second). A
directory or live stream's hot keys have state keys of their own, one per time slice
(:mod:`yfpp.spark.stream_hot`).

The state of a bucket is its **not-yet-finished events**, not a pickled engine
(which is its snapshot: its queries would be compiled again at every
micro-batch all the same): each micro-batch replays them, with the bucket's new events, into a fresh engine and
drops the matches it emitted before (a match is identified by query and
bindings). An event is kept while a future match could still use it: while
its ts is at least ``max(the bucket's last ts, watermark) − W`` (W: the group's
largest window; no window keeps everything) — later events are not earlier
(late ones are dead letters), and a pending trailing negation older than that has been decided by an event
or the watermark. A ``non_overlapping`` query also drops, per key value, the
events at or before the end of its last chosen match — the history its runs
were discarded at, so the replay chooses as the full stream did.

Trailing-negation matches are emitted once the event-time watermark passes
their deadline: the bucket's state sets an event-time timeout at the next
possible deadline (and at the moment its last event leaves the window, to be
removed). The watermark lags one micro-batch, so such a match comes out in a
later batch than the event that made it possible; at the end of a finite
feed, an event with a later ts (a heartbeat of any type) lets them out.
"""

from __future__ import annotations

import json
import re
import sys
import uuid
import warnings
from typing import Any, Callable, Iterator

import pandas as pd
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery
from pyspark.sql.streaming.state import GroupState

from yfpp.engine import event_raw
from yfpp.errors import InputError
from yfpp.input.record_fields import ISO_UNIT_NAME
from yfpp.spark import ingest, inputs, live_sources, source
from yfpp.spark.live_receiver import receiver_of
from yfpp.spark.batch import MATCH_SCHEMA, key_hash
from yfpp.spark.plan import Group, advance_key, effective_queries, group_queries, match_row
from yfpp.spark.shipped import Shipped
from yfpp.spark.stream_hot import HOT_TYPE, RECORD, HotKeys, owner

OUTPUT_SCHEMA = "kind string, " + MATCH_SCHEMA
_OUT_COLS = ["kind", "query", "bindings", "start", "end", "emit", "json"]
_RECORD_COLS = ["seq", "type", "ts", "attrs", "xml", "reason", "position", "raw"]
DEAD = -1  # the group number of dead letters (one state key, no state)
TICK = -2  # the group number of events no group takes (one state key, no state: they only move the watermark)
#: Seconds added to ts for Spark's event time: its first watermark is 0 and it drops rows at or below
#: the watermark, so an event at ts 0 (or below) would be lost without it. pandas holds event times in
#: nanoseconds (up to 2262), so ts must lie within :data:`TS_RANGE`.
SHIFT = 10**9
#: The ts (seconds, both ends excluded) a stream can match: 1938-04-24 to 2223-07-04 UTC; an event outside
#: is a dead letter (a millisecond epoch read as seconds, ~1.7·10^12, is one).
TS_RANGE = (-SHIFT, 8 * 10**9)

# pyspark's worker concatenates our output frames; pandas warns when a column (emit) is all null.
warnings.filterwarnings("ignore", "The behavior of DataFrame concatenation with empty or all-NA", FutureWarning)


def read_stream(spark: SparkSession, path: str | None = None, *, socket: str | None = None,
                checkpoint: str | None = None, format: str | None = None, ts_field: str = "ts", ts_unit: str = "s",
                type_field: str | None = None, max_files: int | None = None, interval: str | None = None,
                hot: HotKeys | None = None, max_spool: int | None = None) -> tuple[DataFrame, StreamingQuery | None]:
    """A streaming event DataFrame from new files of directory ``path``, a live source ``path``
    (``tcp://…``, ``mqtt://…``: :mod:`yfpp.spark.live_sources`, spooled under ``checkpoint``) or lines
    from ``socket`` (host:port), and the query ingesting the directory or live source (``None`` otherwise):
    a live source's records are parsed on the executors and staged as a directory's files are.

    A directory is read by Spark's file source on the executors, and an ingest
    query of its own numbers and stages the events under ``checkpoint`` (required
    then; see :mod:`yfpp.spark.ingest`); ``max_files`` new files at most per
    micro-batch, ``interval`` its trigger. A socket is read on the driver (a demo source).
    ``ts_field``, ``ts_unit`` (``iso``: ISO-8601 text), ``type_field``: as :func:`yfpp.input.readers.read_events`'s.
    ``hot``: a directory or live stream's hot keys, decided and marked by its stager (:mod:`yfpp.spark.stream_hot`).
    ``max_spool``: a live source's cap on spooled bytes Spark has not committed
    (:data:`yfpp.spark.live_receiver.MAX_SPOOL_BYTES` by default).
    """
    if path is not None and checkpoint is None:
        raise ValueError("a directory or live stream needs a checkpoint folder")
    if path is not None and inputs.is_live(path):
        query, events = live_sources.start_live(spark, path, checkpoint, {
            "ts_field": ts_field, "ts_unit": ts_unit, **({"format": format} if format else {}),
            **({"type_field": type_field} if type_field else {}),
            **({"max_spool_bytes": str(max_spool)} if max_spool else {})}, interval, hot)
        return events, query
    if path is not None:
        query, events = ingest.start_ingest(spark, path, checkpoint, format=format, ts_field=ts_field, ts_unit=ts_unit,
                                            type_field=type_field, max_files=max_files, interval=interval, hot=hot)
        return events, query
    source.register(spark)
    opts = {"ts_field": ts_field, "ts_unit": ts_unit, "socket": str(socket), **({"format": format} if format else {}),
            **({"type_field": type_field} if type_field else {})}  # (a data source's options are strings)
    return spark.readStream.format("yfpp_stream").options(**opts).load(), None


def start_stream(spark: SparkSession, queries: Any, outdir: str, checkpoint: str, *, path: str | None = None,
                 socket: str | None = None, policy: str | None = None, full_events: bool = False,
                 format: str | None = None, ts_field: str = "ts", ts_unit: str = "s", type_field: str | None = None,
                 max_files: int | None = None, interval: str | None = None, log: Any = None,
                 hot_keys: bool = True, max_spool: int | None = None) -> list[StreamingQuery]:
    """Start a stream's queries: ingest (a directory only) and matching, checkpointed under
    ``checkpoint`` (``ingest/``, ``staged/``, ``numbering/``; ``match/``), written to ``outdir``
    (:func:`write_stream`); ``policy``, ``full_events``: as :func:`stream_matches`'s; the reading options
    as :func:`read_stream`'s (``ts_unit`` ``iso``: the matches' lines have ISO-8601 start and end too, as
    ``yfpp run --ts-format iso``). ``hot_keys``: a directory or live stream cuts a keyed group's hot keys into
    time slices (:mod:`yfpp.spark.stream_hot`); ``max_spool``: as :func:`read_stream`'s. Stop them with
    :func:`finish`, or ``stop()`` each."""
    checkpoint, outdir = inputs.qualify(spark, checkpoint).rstrip("/"), inputs.qualify(spark, outdir)
    buckets = state_buckets(spark, checkpoint)
    hot = None
    if path is not None and (hot_keys or _has_hot_keys(spark, checkpoint)):
        # (the stager needs them from its first batch; once decided, a checkpoint keeps them, --hot-keys off or not)
        hot = HotKeys(group_queries(effective_queries(queries, policy), streaming=True), buckets)
    events, ingesting = read_stream(spark, path, socket=socket, checkpoint=checkpoint, format=format, ts_field=ts_field,
                                    ts_unit=ts_unit, type_field=type_field, max_files=max_files, interval=interval,
                                    hot=hot, max_spool=max_spool)
    try:
        matches = stream_matches(spark, queries, events, policy=policy, full_events=full_events,
                                 iso_times=ts_unit == ISO_UNIT_NAME, buckets=buckets)
        matching = write_stream(matches, outdir, f"{checkpoint}/match", interval=interval, log=log)
    except BaseException:
        if ingesting is not None:
            ingesting.stop()
        raise
    return [q for q in (ingesting, matching) if q is not None]


def _has_hot_keys(spark: SparkSession, checkpoint: str) -> bool:
    """Has the stream checkpointed under ``checkpoint`` decided its hot keys (:mod:`yfpp.spark.stream_hot`)?"""
    return ingest.Files(spark, checkpoint).exists(f"{checkpoint}/{RECORD}")


def state_buckets(spark: SparkSession, checkpoint: str) -> int:
    """The state keys per keyed group of the stream checkpointed under ``checkpoint``: recorded there
    (``buckets.json``) when it starts — twice the cores, so every core has a share of the keys — and
    read back on a restart (a key's state must stay where it was)."""
    files = ingest.Files(spark, checkpoint)
    record = f"{checkpoint}/buckets.json"
    if not files.exists(record):
        if files.exists(f"{checkpoint}/match"):
            raise InputError(f"{checkpoint} was made by a yfpp that kept one state key per key value; "
                             "start this stream with a fresh checkpoint folder")
        files.mkdirs(checkpoint)
        files.write_text(f"{checkpoint}/tmp-buckets-{uuid.uuid4().hex}.json", record,
                         json.dumps({"buckets": 2 * spark.sparkContext.defaultParallelism}))
    return int(json.loads(files.read_text(record))["buckets"])


def finish(queries: list[StreamingQuery]) -> None:
    """Process what is available, in order (ingest, then matching: what it staged), then :func:`stop`
    every query: the error of one that failed is raised, also when it failed after its last
    ``processAllAvailable`` (a file that came meanwhile), which stopping it would hide."""
    try:
        for q in queries:
            q.processAllAvailable()
    except BaseException:
        for q in queries:
            stop_query(q)
        raise
    stop(queries)


#: A stopped query's error that is the interruption of its micro-batch by the stop, not a failure.
_STOPPED = re.compile(r"java\.lang\.InterruptedException|InterruptedIOException|ClosedByInterruptException"
                      r"|SPARK_JOB_CANCELLED")


def stop(queries: list[StreamingQuery]) -> None:
    """Stop every query of ``queries`` (and a live stream's receiver); raise the error of the first that had
    failed (the ``StreamingQueryException``), not counting the interruption of a micro-batch by this stop."""
    failed = []
    for q in queries:
        active = q.isActive
        stop_query(q)
        error = q.exception()
        if error is not None and not (active and _STOPPED.search(str(error))):
            failed.append(error)
    if failed:
        raise failed[0]


def stop_query(query: StreamingQuery) -> None:
    """Stop ``query``, and its receiver if it reads a live source (:mod:`yfpp.spark.live_receiver`)."""
    query.stop()
    receiver = receiver_of(query)
    if receiver is not None:
        receiver.stop()


def stream_matches(spark: SparkSession, queries: Any, events: DataFrame, *, policy: str | None = None,
                   full_events: bool = False, iso_times: bool = False, buckets: int = 8) -> DataFrame:
    """Matches (``kind`` = ``match``) and dead letters (``kind`` = ``dead``, the record in ``json``) of a stream.

    ``events``: as :func:`read_stream` gives. Columns as :func:`yfpp.spark.match`'s, plus ``kind``;
    ``full_events``, ``iso_times``: as :func:`yfpp.spark.match`'s. ``buckets``: the state keys per keyed
    group (a key value's is its key hash modulo ``buckets``); fixed for the life of a checkpoint.
    """
    groups = group_queries(effective_queries(queries, policy), streaming=True, full_events=full_events,
                           iso_times=iso_times)
    low, high = TS_RANGE
    good = F.col("reason").isNull() & (F.col("ts") > low) & (F.col("ts") < high)
    if "hot" not in events.columns:  # (the socket source: no hot keys)
        events = events.withColumn("hot", F.lit(None).cast(HOT_TYPE))
    routed = (events.select(F.explode(_routes(groups, good, buckets)).alias("r"), "*")
              .select("r.*", *_RECORD_COLS)
              .withColumn("event_time", F.when(good, F.timestamp_seconds(F.col("ts") + SHIFT)))
              .withWatermark("event_time", "1 millisecond"))  # dead letters have no event time: never dropped
    return routed.groupBy("g", "b").applyInPandasWithState(
        _state_function(groups), OUTPUT_SCHEMA, "events binary", "append", "EventTimeTimeout")


def _routes(groups: list[Group], good: Column, buckets: int) -> Column:
    """``(g, b, s, t0, len, w)`` per copy of an event: its group and state key — its key hash modulo
    ``buckets`` (0 for an unkeyed group), or, for an event of a hot key, each slice that reads it (the
    staged column ``hot``, :mod:`yfpp.spark.stream_hot`) with its slicing (null for a bucket); an event no
    group takes (no key attribute of any keyed group, and no unkeyed group) to TICK, so that its time still
    moves the watermark (as in ``yfpp run``, where every event moves the stream time); dead letters, and
    events whose ts is outside :data:`TS_RANGE` (not ``good``), to DEAD."""
    zero = F.lit(0).cast("long")

    def route(g: int, b: Column) -> Column:
        return F.struct(F.lit(g).alias("g"), b.alias("b"), F.lit(None).cast("long").alias("s"),
                        *(F.lit(None).cast("double").alias(c) for c in ("t0", "len", "w")))

    arrays = []
    for g, grp in enumerate(groups):
        if not grp.key:
            arrays.append(F.array(route(g, zero)))
            continue
        bucket = F.array(route(g, F.pmod(key_hash(grp.key), F.lit(buckets))))
        hot = F.filter("hot", _of_group(g))
        arrays.append(F.when(F.coalesce(F.size(hot), F.lit(0)) > 0, hot).otherwise(bucket))
    taken = F.filter(F.flatten(F.array(*arrays)), lambda r: r["b"].isNotNull())
    return F.when(good, F.when(F.size(taken) > 0, taken).otherwise(F.array(route(TICK, zero)))).otherwise(
        F.array(route(DEAD, zero)))


def _of_group(g: int) -> Callable[[Column], Column]:
    """The test ``x.g = g`` for ``F.filter`` (a function of one argument: a second one would be the index)."""
    return lambda x: x["g"] == g


def range_reason(ts: float) -> str:
    """The reason of the dead letter of an event whose ts is outside :data:`TS_RANGE`."""
    low, high = TS_RANGE
    return (f"ts {ts} is outside the range a stream can match, {low} < ts < {high} s "
            "(1938 to 2223, docs/spark.md): is --ts-unit right?")


def _state_function(groups: list[Group]) -> Callable[[tuple, Iterator[pd.DataFrame], GroupState], Iterator[pd.DataFrame]]:
    shipped = Shipped(groups)  # (unpickled once per Python worker, not at every task of every micro-batch)

    def fn(key: tuple, pdfs: Iterator[pd.DataFrame], state: GroupState) -> Iterator[pd.DataFrame]:
        groups = shipped.get()
        g = int(key[0])
        if g == TICK:
            for _ in pdfs:
                pass
            return
        if g == DEAD:
            for pdf in pdfs:
                yield _frame([("dead", None, None, None, None, None, json.dumps(_dead_letter(r)))
                              for r in pdf.itertuples(index=False)])
            return
        records = [r for pdf in pdfs for r in pdf.itertuples(index=False)]
        rows = [(float(r.ts), int(r.seq), r.type, r.attrs, r.xml) for r in records]
        slice_of = owner((records[0].s, records[0].t0, records[0].len, records[0].w)) if records else None
        found = advance_key(groups[g], state, rows, state.getCurrentWatermarkMs(), SHIFT, slice_of=slice_of)
        if found:
            yield _frame([("match", *match_row(m, iso_times=groups[g].iso_times)) for m in found])

    return fn


def _dead_letter(r: Any) -> dict[str, Any]:
    """A DEAD row's dead letter: a record's own, or that of an event outside :data:`TS_RANGE` (at its seq,
    as a late event's)."""
    if isinstance(r.reason, str):
        return {"seq": int(r.seq), "position": r.position, "reason": r.reason, "raw": r.raw}
    ts = float(r.ts)
    return {"seq": int(r.seq), "position": f"seq {int(r.seq)}", "reason": range_reason(ts),
            "raw": event_raw(r.type, ts, json.loads(r.attrs))}


def _frame(rows: list[tuple]) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=_OUT_COLS)


def write_stream(matches: DataFrame, outdir: str, checkpoint: str, *, interval: str | None = None,
                 log: Any = None) -> StreamingQuery:
    """Start writing ``matches`` (from :func:`stream_matches`): per micro-batch N,
    ``outdir/matches.jsonl/batch=N``, ``outdir/matches.parquet/batch=N`` and
    ``outdir/dead_letters.jsonl/batch=N`` (when there are any), overwritten
    if the batch is replayed after a failure, so each match is written once.
    Counters per batch go to ``log`` (default: stderr).
    """

    def sink(df: DataFrame, batch_id: int) -> None:
        df = df.persist()
        counts = write_batch(df, outdir, batch_id)
        n_matches = sum(n for (k, _), n in counts.items() if k == "match")
        n_dead = counts.get(("dead", None), 0)
        per_query = ", ".join(f"{q} {n}" for (k, q), n in sorted(counts.items()) if k == "match")
        print(f"batch {batch_id}: {n_matches} matches{f' ({per_query})' if per_query else ''}, {n_dead} dead letters",
              file=log or sys.stderr)
        df.unpersist()

    writer = matches.writeStream.foreachBatch(ingest.one_line_errors(sink)).option("checkpointLocation", checkpoint)
    if interval:
        writer = writer.trigger(processingTime=interval)
    return writer.start()


def write_batch(df: DataFrame, outdir: str, batch_id: int) -> dict[tuple[str, str | None], int]:
    """Write micro-batch ``batch_id``'s matches and dead letters (overwriting a replayed batch's);
    return the rows per ``(kind, query)``."""
    counts = {(r["kind"], r["query"]): r["count"] for r in df.groupBy("kind", "query").count().collect()}
    found = df.where(F.col("kind") == "match")
    if any(k == "match" for k, _ in counts):
        found.select("json").coalesce(1).write.mode("overwrite").text(f"{outdir}/matches.jsonl/batch={batch_id}")
        found.drop("kind", "json").coalesce(1).write.mode("overwrite").parquet(f"{outdir}/matches.parquet/batch={batch_id}")
    if ("dead", None) in counts:
        df.where(F.col("kind") == "dead").select("json").coalesce(1).write.mode("overwrite").text(
            f"{outdir}/dead_letters.jsonl/batch={batch_id}")
    return counts
