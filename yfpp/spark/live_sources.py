"""Live sources of ``yfpp spark --stream``: ``-i tcp://HOST:PORT`` and ``-i mqtt://HOST[:PORT]/TOPIC``.

A Spark 4 Python data source, ``yfpp_live`` (``spark.readStream.format("yfpp_live").option("url", …)``), fed by
a **receiver** (:mod:`yfpp.spark.live_receiver`): a job of one task on an executor, for the stream's life, that
receives the feed and appends it, as whole records (TCP lines; MQTT messages as frames), to the **spool**
(:mod:`yfpp.spark.live_spool`, segment files under ``CHECKPOINT/live/spool/``, a folder the driver and the
executors share), publishing its durable end and record-aligned marks after each append.

The stream reader's planning half, on the driver (Spark's Python data-source process for the query), reads
only those files: an offset is ``{"pos", "records"}``, the published end (a byte position in the spool and
the records before it); a micro-batch is the range between two offsets, cut by :meth:`_Reader.partitions` at
published marks into chunks of about :data:`CHUNK_BYTES` — a chunk is a byte range, not bytes — and each
executor's :meth:`_Reader.read` reads its chunk from the spool and parses it (:mod:`yfpp.spark.live_parse`);
the ingest query's stager (:class:`yfpp.spark.ingest.Stager`) numbers them from the chunks' summaries, as a
directory's files. A restarted query plans an uncommitted micro-batch again from the same marks,
identically; once Spark commits a micro-batch (:meth:`_Reader.commit`) the segments wholly before it are
deleted and the committed position is published for the receiver's cap
(:data:`yfpp.spark.live_receiver.MAX_SPOOL_BYTES`).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming import StreamingQuery

from yfpp.errors import InputError
from yfpp.input.mqtt import Topic, parse_url
from yfpp.spark.ingest import Stager, stage
from yfpp.spark.inputs import local_path
from yfpp.spark.live_parse import line_batches, message_batches
from yfpp.spark.live_receiver import Feed, ReceiverJob
from yfpp.spark.live_spool import (
    CHUNK_BYTES,
    ERROR,
    Mark,
    cuts,
    publish_committed,
    read_published,
    spooled,
    trim,
)
from yfpp.spark.parse import PARSED_SCHEMA
from yfpp.spark.read import Parsed
from yfpp.spark.stream_hot import HotKeys

@dataclass
class Chunk(InputPartition):
    """A task's share of a micro-batch: spool bytes ``block`` to ``end``, whole records, ``before`` records before them."""

    block: int
    before: int
    end: int


class LiveSource(DataSource):
    """``spark.readStream.format("yfpp_live")``, option ``url`` (``tcp://…``, ``mqtt://…``) and ``spool`` (the
    receiver's folder). Options: format, ts_field, ts_unit, type_field."""

    @classmethod
    def name(cls) -> str:
        return "yfpp_live"

    def schema(self) -> str:
        return PARSED_SCHEMA

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        options = dict(self.options)
        return (_TcpReader if options["url"].startswith("tcp://") else _MqttReader)(options)


class _Reader(DataSourceStreamReader):
    """What the two sources share: offsets and chunks from the published files, trimming. The driver's half
    (:meth:`latestOffset`, :meth:`partitions`, :meth:`commit`) reads no spooled byte; an executor's half
    (:meth:`read`) reads its chunk's and parses them."""

    def __init__(self, options: dict[str, str]):
        self.options = {**options, "bad_files": True}  # a chunk the readers cannot read: a dead letter
        self.folder = options["spool"]

    def initialOffset(self) -> dict:
        return {"pos": 0, "records": 0}

    def latestOffset(self) -> dict:
        """The receiver's published end (the initial offset before it first published); its error raised."""
        try:
            with open(os.path.join(self.folder, ERROR)) as f:
                raise InputError(f.read())
        except FileNotFoundError:
            pass
        published = read_published(self.folder)
        return published.end._asdict() if published else self.initialOffset()

    def partitions(self, start: dict, end: dict) -> Sequence[Chunk]:
        published = read_published(self.folder)
        marks = published.marks if published else ()
        return [Chunk(a.pos, a.records, b.pos)
                for a, b in cuts(Mark(**start), Mark(**end), marks, CHUNK_BYTES)]

    def chunk_bytes(self, partition: Chunk) -> bytes:
        return spooled(self.folder, partition.block, partition.end)

    def read(self, partition: Chunk) -> Iterator[pa.RecordBatch]:
        raise NotImplementedError

    def commit(self, end: dict) -> None:
        publish_committed(self.folder, end["pos"])
        trim(self.folder, end["pos"])


class _TcpReader(_Reader):
    """``tcp://HOST:PORT``: chunks of lines."""

    def read(self, partition: Chunk) -> Iterator[pa.RecordBatch]:
        return line_batches(self.options["url"], partition.block, partition.before, self.chunk_bytes(partition),
                            self.options)


class _MqttReader(_Reader):
    """``mqtt://…/TOPIC``: chunks of messages (frames)."""

    def __init__(self, options: dict[str, str]):
        super().__init__(options)
        _, topic, opts = parse_url(options["url"], secrets=False)
        self.topic = Topic(topic, opts.get("format"))
        self.fmt = options.get("format") or opts.get("format")

    def read(self, partition: Chunk) -> Iterator[pa.RecordBatch]:
        return message_batches(self.options["url"], partition.block, partition.before, self.chunk_bytes(partition),
                               self.topic, self.fmt, self.options)


class LiveStager(Stager):
    """A live source's stager: one feed (positions without a file name), and an MQTT message's dead
    letters (rows without ``pos``) at seq -1, as ``yfpp run -i mqtt://`` reports them."""

    def events(self, parsed: Parsed) -> DataFrame:
        df = parsed.df
        unnumbered = df.where(F.col("pos").isNull()).select(
            F.lit(-1).cast("long").alias("seq"), "type", "ts", "attrs", "xml", "reason", "position", "raw")
        return super().events(parsed._replace(df=df.where(F.col("pos").isNotNull()))).unionByName(unnumbered)


def start_live(spark: SparkSession, url: str, checkpoint: str, options: dict[str, str],
               interval: str | None = None, hot: HotKeys | None = None) -> tuple[StreamingQuery, DataFrame]:
    """Start the ingest query of live source ``url`` (spooled under ``checkpoint``, a local folder's URI or
    path); return it and the streaming DataFrame of staged events. ``options``: the readers' (format,
    ts_field, ts_unit, type_field) and the receiver's (max_spool_bytes, segment_bytes); ``interval``: the
    trigger; ``hot``: the stream's hot keys, decided and marked when staging, as a directory stream's
    (:mod:`yfpp.spark.stream_hot`). Its receiver (:class:`yfpp.spark.live_receiver.ReceiverJob`) starts with
    the query and ends when it ends."""
    folder = local_path(f"{checkpoint}/live/spool")
    if folder is None:
        raise InputError(f"a live source spools what it receives under the checkpoint, which must be a folder the "
                         f"driver and the executors share, mounted at the same path (a local one on one machine), "
                         f"not {checkpoint!r}")
    if os.path.isfile(folder):
        raise InputError(f"{checkpoint} was made by a yfpp that read live sources on the driver; start this "
                         "stream with a fresh checkpoint folder")
    cores = spark.sparkContext.defaultParallelism
    if cores < 2:
        raise InputError(f"a live source's receiver holds one executor core for the stream's life, and the "
                         f"stream has {cores}: give it at least 2 (--master local[2], or more executors)")
    feed = Feed.of(url, folder, options)
    receiver = ReceiverJob(spark, feed)
    spark.dataSource.register(LiveSource)
    reading = {k: v for k, v in options.items() if k not in ("max_spool_bytes", "segment_bytes")}
    parsed = spark.readStream.format("yfpp_live").options(url=url, spool=folder, **reading).load()
    query, events = stage(spark, parsed, LiveStager(spark, url, checkpoint, hot, single=True), interval)
    receiver.start(query)
    return query, events


def kafka_inbox(spark: Any, url: str, checkpoint: str) -> tuple[Any, str]:
    """``kafka://BROKERS/TOPIC``: Spark's own Kafka source (``kafka.bootstrap.servers``, ``subscribe``), each
    message's value written as a line by Spark's text sink to ``CHECKPOINT/kafka/inbox`` — the folder the
    directory stream then reads (Spark's file source reads only the files the sink's ``_spark_metadata``
    log committed). Returns the query and the folder. Untested here: the Kafka connector is not installed
    (without it Spark refuses the format, and the error names the package: ``yfpp.spark.errors``)."""
    brokers, _, topic = url.removeprefix("kafka://").partition("/")
    inbox = f"{checkpoint}/kafka/inbox"
    values = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", brokers).option("subscribe", topic)
              .load().selectExpr("CAST(value AS STRING) AS value"))
    query = (values.writeStream.format("text").option("path", inbox)
             .option("checkpointLocation", f"{checkpoint}/kafka/sink").start())
    return query, inbox
