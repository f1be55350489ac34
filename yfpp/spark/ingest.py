"""Streaming ingest: new files of a directory read and parsed on the executors, numbered, staged.

The first of a directory stream's two queries (the second, :mod:`yfpp.spark.stream`,
matches). Spark's own streaming file source (``binaryFile``, recursive) picks
the new files of each micro-batch and the executors parse them in a
``mapInArrow`` — the batch job's readers and dead letters
(:func:`yfpp.spark.parse.parse_batches`, one task per file). Numbering needs
what came before: a file's first seq is the record count of all earlier files,
and an event is late when its ts is below the largest ts before it. So the
query's ``foreachBatch`` (:class:`Stager`, on the driver) takes the running
count and largest ts from the *previous micro-batch's* record
(``CHECKPOINT/numbering/N-1.json``), numbers the batch's files in name order
from the per-file summaries the readers emit (:func:`yfpp.spark.read.events_of`,
the batch job's step), and stages the numbered events: written to
``CHECKPOINT/tmp/…``, renamed to ``CHECKPOINT/staged/batch-N`` (one atomic
rename: the matching query sees a batch whole or not at all), then its record
``numbering/N.json`` written (temp file, rename) — the mark that batch N is done.

A micro-batch replayed after a failure (Spark keeps its file list in the
checkpoint) is numbered from the same record, so identically; one whose mark
exists is skipped, and one staged but not marked keeps the staged folder
(same name, same rows): nothing is staged twice or lost. The matching query
reads ``staged/`` as its own streaming file source and checkpoint.

A live source (:mod:`yfpp.spark.live_sources`) is staged the same way (:func:`stage`): its chunks,
parsed on the executors, are the splits of one feed.
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any, Callable

from py4j.protocol import Py4JJavaError
from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery

from yfpp.errors import InputError
from yfpp.spark import inputs, stream_hot
from yfpp.spark.parse import PARSED_SCHEMA, parse_batches
from yfpp.spark.read import Parsed, any_late, events_of, split_offsets, summaries
from yfpp.spark.source import EVENT_SCHEMA
from yfpp.spark.stream_hot import HotKeys

_BINARY_FILE = "path string, modificationTime timestamp, length long, content binary"
#: Spark's file source ignores files older than the newest seen minus maxFileAge (7 days by default):
#: a file moved in with an old modification time would be skipped silently. A century keeps them all.
_MAX_FILE_AGE = "36500d"


class Files:
    """The few file operations staging needs, through Hadoop's file system API (any checkpoint URI)."""

    def __init__(self, spark: SparkSession, path: str):
        self.jvm = spark.sparkContext._jvm
        hadoop = spark.sparkContext._jsc.hadoopConfiguration()
        self.fs = self.jvm.org.apache.hadoop.fs.Path(path).getFileSystem(hadoop)

    def path(self, p: str) -> Any:
        return self.jvm.org.apache.hadoop.fs.Path(p)

    def qualified(self, p: str) -> str:
        """``p`` as Spark writes it in a file's ``path`` (e.g. ``file:/abs/dir``)."""
        return str(self.fs.makeQualified(self.path(p)).toString())

    def exists(self, p: str) -> bool:
        return bool(self.fs.exists(self.path(p)))

    def mkdirs(self, p: str) -> None:
        self.fs.mkdirs(self.path(p))

    def read_text(self, p: str) -> str:
        stream = self.fs.open(self.path(p))
        try:
            return bytes(self.jvm.org.apache.commons.io.IOUtils.toByteArray(stream)).decode()
        finally:
            stream.close()

    def publish(self, tmp: str, final: str) -> None:
        """Rename ``tmp`` to ``final``; if ``final`` exists (a replay got there first), drop ``tmp``."""
        if self.exists(final) or not self.fs.rename(self.path(tmp), self.path(final)):
            if not self.exists(final):
                raise InputError(f"cannot rename {tmp} to {final}")
            self.fs.delete(self.path(tmp), True)

    def delete_matching(self, pattern: str) -> None:
        """Delete what glob ``pattern`` matches."""
        for status in self.fs.globStatus(self.path(pattern)) or []:
            self.fs.delete(status.getPath(), True)

    def write_text(self, tmp: str, final: str, text: str) -> None:
        """Write ``text`` to ``tmp``, then publish it as ``final``."""
        out = self.fs.create(self.path(tmp), True)
        try:
            out.write(bytearray(text.encode()))
        finally:
            out.close()
        self.publish(tmp, final)


class BatchFailed(Exception):
    """A micro-batch's Java error, in one line (:func:`one_line_errors`)."""


def one_line_errors(fn: Callable[[DataFrame, int], None]) -> Callable[[DataFrame, int], None]:
    """``fn``, a ``foreachBatch`` function, raising a Java error as one line — ``py4j.protocol.Py4JJavaError:
    An error occurred while calling …: <the Java exception>``, with the ``yfpp.errors`` line of a reader's
    error last — rather than with the JVM's stack trace. When a query is stopped, Spark tells an
    interruption (``java.lang.InterruptedException``) from a failure by a regular expression over the
    Python traceback, which overflows the JVM's stack on a long one: the query's thread dies with a
    ``StackOverflowError`` and a thousand lines on stderr instead of stopping cleanly."""

    def call(df: DataFrame, batch_id: int) -> None:
        try:
            fn(df, batch_id)
        except Py4JJavaError as e:
            text = str(e)
            head = " ".join(ln.strip() for ln in text.split("\n", 2)[:2])[:1000]
            found = re.search(r"yfpp\.errors\.\w+: .+", text)
            raise BatchFailed(f"py4j.protocol.Py4JJavaError: {head}{'; ' + found.group(0) if found else ''}") from None

    return call


class Stager:
    """The ingest query's ``foreachBatch``: numbers a micro-batch's records and stages them (module docstring)."""

    def __init__(self, spark: SparkSession, root: str, checkpoint: str, hot: HotKeys | None = None,
                 single: bool = False):
        """``root``: the folder the dead letters' positions name files below; ``hot``: the stream's hot keys,
        marked when staging; ``single``: the input is one feed (a live source), its positions carry no file
        name."""
        self.files = Files(spark, checkpoint)
        self.root, self.checkpoint, self.single = root, checkpoint.rstrip("/"), single
        self.hot = hot

    def mark(self, batch_id: int) -> str:
        return f"{self.checkpoint}/numbering/{batch_id}.json"

    def start(self, batch_id: int) -> tuple[int, float | None]:
        """The records and largest ts of all micro-batches before ``batch_id``."""
        if batch_id == 0:
            return 0, None
        if not self.files.exists(self.mark(batch_id - 1)):
            raise InputError(f"{self.mark(batch_id - 1)} is missing: the checkpoint's staging was removed")
        done = json.loads(self.files.read_text(self.mark(batch_id - 1)))
        return done["seq"], done["max_ts"]

    def __call__(self, parsed: DataFrame, batch_id: int) -> None:
        if self.files.exists(self.mark(batch_id)):
            return  # a replay of a batch staged before the failure
        seq, max_ts = self.start(batch_id)
        self.files.delete_matching(f"{self.checkpoint}/tmp/{batch_id}-*")  # left by a failed attempt
        parsed = parsed.persist(StorageLevel.MEMORY_AND_DISK)
        stats = summaries(parsed)
        tmp = f"{self.checkpoint}/tmp/{batch_id}-{uuid.uuid4().hex}"
        if stats:
            offsets = split_offsets(stats, self.single, (seq, max_ts), self.root, uris=True)
            events = self.events(Parsed(parsed, stats, offsets, any_late(stats, offsets)))
            if self.hot is not None:
                events = self.mark_hot(self.hot, events, batch_id, first=seq == 0)
            events.write.parquet(tmp)
            self.files.publish(tmp, f"{self.checkpoint}/staged/batch-{batch_id:012d}")
        parsed.unpersist()
        seq += sum(s["n"] for s in stats)
        max_ts = max([t for t in [max_ts, *(s["ts"] for s in stats)] if t is not None], default=None)
        self.files.write_text(tmp + ".json", self.mark(batch_id), json.dumps({"seq": seq, "max_ts": max_ts}))

    def events(self, parsed: Parsed) -> DataFrame:
        """A micro-batch's records numbered (:data:`EVENT_SCHEMA` columns)."""
        return events_of(parsed.df.sparkSession, parsed).drop("key_hashes")

    def mark_hot(self, hot: HotKeys, events: DataFrame, batch_id: int, first: bool) -> DataFrame:
        """``events`` with the hot keys' slices marked (:mod:`yfpp.spark.stream_hot`); the hot keys decided from
        them and recorded (``hot.json``) unless they were (``first``: no events came before them)."""
        record = f"{self.checkpoint}/{stream_hot.RECORD}"
        if hot.decided is None:
            if self.files.exists(record):
                hot.load(self.files.read_text(record))
            else:
                hot.decide(events, first)
                self.files.write_text(f"{self.checkpoint}/tmp/{batch_id}-hot.json", record, hot.record())
                hot.load(self.files.read_text(record))  # (what was recorded first, had a replay got there)
        return hot.mark(events)


def start_ingest(spark: SparkSession, path: str, checkpoint: str, *, format: str | None = None, ts_field: str = "ts",
                 ts_unit: str = "s", type_field: str | None = None, max_files: int | None = None,
                 interval: str | None = None, hot: HotKeys | None = None) -> tuple[StreamingQuery, DataFrame]:
    """Start ingesting directory ``path`` (recursively; names starting with ``.`` or ``_`` skipped)
    into ``checkpoint``; return the query and the streaming DataFrame of staged events
    (columns :data:`EVENT_SCHEMA`, dead letters included).

    ``max_files``: at most this many new files per micro-batch; ``interval``: its trigger; ``hot``: the
    stream's hot keys, decided and marked when staging (column ``hot``).
    """
    checkpoint = inputs.qualify(spark, checkpoint).rstrip("/")
    given = inputs.qualify(spark, path)
    if not Files(spark, given).exists(given):
        raise InputError(f"no such input: {path}")
    root = Files(spark, given).qualified(given)
    opts = {"ts_field": ts_field, "ts_unit": ts_unit, "type_field": type_field, "bad_files": True,  # dead letters
            **({"format": format} if format else {})}
    reader = (spark.readStream.format("binaryFile").schema(_BINARY_FILE)
              .option("recursiveFileLookup", "true").option("maxFileAge", _MAX_FILE_AGE))
    if max_files:
        reader = reader.option("maxFilesPerTrigger", str(max_files))
    parsed = reader.load(given).select(
        "path", F.lit(0).cast("long").alias("block"), "content", F.lit(True).alias("whole"),
    ).mapInArrow(parse_batches(opts), PARSED_SCHEMA)
    return stage(spark, parsed, Stager(spark, root, checkpoint, hot), interval)


def stage(spark: SparkSession, parsed: DataFrame, stager: Stager,
          interval: str | None = None) -> tuple[StreamingQuery, DataFrame]:
    """Start the ingest query staging ``parsed`` (a stream of :data:`PARSED_SCHEMA` rows) with ``stager``
    (checkpointed under its checkpoint's ``ingest/``); return it and the streaming DataFrame of staged events."""
    checkpoint = stager.checkpoint
    writer = parsed.writeStream.foreachBatch(one_line_errors(stager)).option("checkpointLocation", f"{checkpoint}/ingest")
    if interval:
        writer = writer.trigger(processingTime=interval)
    staged = f"{checkpoint}/staged"
    stager.files.mkdirs(staged)  # the matching query's source must exist before the first batch is staged
    query = writer.start()
    events = (spark.readStream.schema(f"{EVENT_SCHEMA}, hot {stream_hot.HOT_TYPE}")  # (hot: null in files without it)
              .option("recursiveFileLookup", "true").parquet(staged))
    return query, events
