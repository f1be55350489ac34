"""Structured Streaming: per-key matching state across micro-batches.

The engine holds compiled predicate closures, so ``pickle.dumps(engine)``
fails. The state of a key is therefore its **not-yet-finished events**: each
micro-batch replays them, with the key's new events, into a fresh engine and
drops the matches it emitted before (a match is identified by query and
bindings). An event is kept while a future match could still use it: while
its ts is at least ``max(the key's last ts, watermark) − W`` (W: the group's
largest window; no window keeps everything) — later events are not earlier,
and a pending trailing negation older than that has been decided by an event
or the watermark. A ``non_overlapping`` query also drops, per key value, the
events at or before the end of its last chosen match — the history its runs
were discarded at, so the replay chooses as the full stream did.

Trailing-negation matches are emitted once the event-time watermark passes
their deadline: the key's state sets an event-time timeout at the next
possible deadline (and at the moment its last event leaves the window, to be
removed). The watermark lags one micro-batch, so such a match comes out in a
later batch than the event that made it possible; at the end of a finite
feed, an event with a later ts (a heartbeat of any type) lets them out.
"""

from __future__ import annotations

import json
import sys
import warnings
from typing import Any, Callable, Iterator

import pandas as pd
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery
from pyspark.sql.streaming.state import GroupState

from yfpp.spark import source
from yfpp.spark.batch import MATCH_SCHEMA, key_hash
from yfpp.spark.plan import Group, advance_key, effective_queries, group_queries, match_row

OUTPUT_SCHEMA = "kind string, " + MATCH_SCHEMA
_OUT_COLS = ["kind", "query", "bindings", "start", "end", "emit", "json"]
_RECORD_COLS = ["seq", "type", "ts", "attrs", "xml", "reason", "position", "raw"]
DEAD = -1  # the group number of dead letters (one state key, no state)
#: Seconds added to ts for Spark's event time: its first watermark is 0 and it drops rows at or below
#: the watermark, so an event at ts 0 (or below) would be lost without it. pandas holds event times in
#: nanoseconds (up to 2262), so ts must lie within (-10^9, 8·10^9) seconds.
SHIFT = 10**9

# pyspark's worker concatenates our output frames; pandas warns when a column (emit) is all null.
warnings.filterwarnings("ignore", "The behavior of DataFrame concatenation with empty or all-NA", FutureWarning)


def read_stream(spark: SparkSession, path: str | None = None, *, socket: str | None = None, format: str | None = None,
                ts_field: str = "ts", ts_unit: str = "s", max_files: int | None = None) -> DataFrame:
    """A streaming event DataFrame from new files of directory ``path`` (name order) or ``socket`` (host:port)."""
    source.register(spark)
    opts = {"ts_field": ts_field, "ts_unit": ts_unit}
    opts.update({k: str(v) for k, v in (("path", path), ("socket", socket), ("format", format), ("max_files", max_files)) if v})
    return spark.readStream.format("yfpp_stream").options(**opts).load()


def stream_matches(spark: SparkSession, queries: Any, events: DataFrame, *, policy: str | None = None,
                   full_events: bool = False) -> DataFrame:
    """Matches (``kind`` = ``match``) and dead letters (``kind`` = ``dead``, the record in ``json``) of a stream.

    ``events``: as :func:`read_stream` gives. Columns as :func:`yfpp.spark.match`'s, plus ``kind``.
    """
    groups = group_queries(effective_queries(queries, policy), streaming=True, full_events=full_events)
    routed = (events.select(F.explode(_routes(groups)).alias("r"), "*")
              .select("r.*", *_RECORD_COLS).where(F.col("h").isNotNull())
              .withColumn("event_time", F.when(F.col("reason").isNull(), F.timestamp_seconds(F.col("ts") + SHIFT)))
              .withWatermark("event_time", "1 millisecond"))  # dead letters have no event time: never dropped
    return routed.groupBy("g", "h").applyInPandasWithState(
        _state_function(groups), OUTPUT_SCHEMA, "events binary", "append", "EventTimeTimeout")


def _routes(groups: list[Group]) -> Column:
    """``(g, h)`` per copy of an event: its group and key hash (0 for an unkeyed group); dead letters to DEAD."""
    zero = F.lit(0).cast("long")
    arrays = [F.array(F.struct(F.lit(g).alias("g"), (key_hash(grp.key) if grp.key else zero).alias("h")))
              for g, grp in enumerate(groups)]
    return F.when(F.col("reason").isNull(), F.flatten(F.array(*arrays))).otherwise(
        F.array(F.struct(F.lit(DEAD).alias("g"), zero.alias("h"))))


def _state_function(groups: list[Group]) -> Callable[[tuple, Iterator[pd.DataFrame], GroupState], Iterator[pd.DataFrame]]:
    def fn(key: tuple, pdfs: Iterator[pd.DataFrame], state: GroupState) -> Iterator[pd.DataFrame]:
        g = int(key[0])
        if g == DEAD:
            for pdf in pdfs:
                yield _frame([("dead", None, None, None, None, None, json.dumps(
                    {"seq": int(r.seq), "position": r.position, "reason": r.reason, "raw": r.raw}))
                    for r in pdf.itertuples(index=False)])
            return
        rows = [(float(r.ts), int(r.seq), r.type, r.attrs, r.xml) for pdf in pdfs for r in pdf.itertuples(index=False)]
        found = advance_key(groups[g], state, rows, state.getCurrentWatermarkMs(), SHIFT)
        if found:
            yield _frame([("match", *match_row(m)) for m in found])

    return fn


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
        counts = {(r["kind"], r["query"]): r["count"] for r in df.groupBy("kind", "query").count().collect()}
        n_matches = sum(n for (k, _), n in counts.items() if k == "match")
        n_dead = counts.get(("dead", None), 0)
        found = df.where(F.col("kind") == "match")
        if n_matches:
            found.select("json").coalesce(1).write.mode("overwrite").text(f"{outdir}/matches.jsonl/batch={batch_id}")
            found.drop("kind", "json").coalesce(1).write.mode("overwrite").parquet(f"{outdir}/matches.parquet/batch={batch_id}")
        if n_dead:
            df.where(F.col("kind") == "dead").select("json").coalesce(1).write.mode("overwrite").text(
                f"{outdir}/dead_letters.jsonl/batch={batch_id}")
        per_query = ", ".join(f"{q} {n}" for (k, q), n in sorted(counts.items()) if k == "match")
        print(f"batch {batch_id}: {n_matches} matches{f' ({per_query})' if per_query else ''}, {n_dead} dead letters",
              file=log or sys.stderr)
        df.unpersist()

    writer = matches.writeStream.foreachBatch(sink).option("checkpointLocation", checkpoint)
    if interval:
        writer = writer.trigger(processingTime=interval)
    return writer.start()
