"""Live sources of ``yfpp spark --stream``: ``-i tcp://HOST:PORT`` and ``-i mqtt://HOST[:PORT]/TOPIC``.

A Spark 4 Python data source, ``yfpp_live`` (``spark.readStream.format("yfpp_live").option("url", …)``).
Its stream reader's planning half runs on the driver (Spark's Python data-source process for the query)
and only moves bytes; the records are parsed on the executors:

* **tcp://HOST:PORT** — connects to a producer and reads what it sends: one record per line (JSON lines,
  or with ``format`` ``xml`` one element per line), as a ``yfpp serve`` feed port reads a connection.
  When ``$YFPP_FEED_KEY`` is set it first sends ``AUTH <key>`` and a newline — the line a feed connection
  to ``yfpp serve`` sends; nothing else. A connection that closes or drops is connected again, after
  :data:`BACKOFF` seconds doubling up to :data:`MAX_BACKOFF` while it fails (a last line without its
  newline is a record); only the first connection's failure is an error.
* **mqtt://…** — subscribes to the URL's topic with :class:`yfpp.input.mqtt.Subscriber` (the URL's options,
  TLS and password as for ``yfpp run -i mqtt://``).

What arrives is appended, as whole records (TCP lines; MQTT messages as frames, one before paho
acknowledges it), to the **spool** (:class:`Spool`, segment files under ``CHECKPOINT/live/spool/``) and
made durable before Spark sees it. An offset is ``{"pos", "records"}``: a byte position in the spool and
the records (lines, messages) before it. A micro-batch is the byte range between two offsets, cut by
:meth:`_Reader.partitions` into chunks of about :data:`CHUNK_BYTES` at record boundaries, each sent with
its task (so any executor can read it) and parsed there (:mod:`yfpp.spark.live_parse`); the ingest
query's stager (:class:`yfpp.spark.ingest.Stager`) numbers them from the chunks' summaries, as a
directory's files. A restarted query plans an uncommitted micro-batch again from the spool, identically;
once Spark commits a micro-batch (:meth:`_Reader.commit`) the segments wholly before it are deleted.
What Spark has not committed is capped (:data:`MAX_SPOOL_BYTES`): TCP waits, MQTT drops and reports.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming import StreamingQuery

from yfpp.errors import InputError
from yfpp.input.mqtt import Subscriber, Topic, parse_url
from yfpp.spark.ingest import Stager, stage
from yfpp.spark.inputs import local_path, socket_address
from yfpp.spark.live_parse import (
    DROPPED,
    FRAME,
    frame,
    frame_ends,
    line_batches,
    message_batches,
)
from yfpp.spark.parse import PARSED_SCHEMA
from yfpp.spark.read import Parsed
from yfpp.spark.source import CONNECT_TIMEOUT
from yfpp.spark.stream_hot import HotKeys

log = logging.getLogger(__name__)

FEED_KEY_ENV = "YFPP_FEED_KEY"  #: the feed key a tcp:// source sends as its AUTH line
CHUNK_BYTES = 4 << 20  #: a micro-batch's bytes per task (about: chunks end at a record's end)
SEGMENT_BYTES = 64 << 20  #: a spool segment's size before the next is started (option ``segment_bytes``)
BACKOFF, MAX_BACKOFF = 0.2, 5.0  #: seconds before a TCP source connects again, doubling while it fails
READ_BYTES = 16 << 20  #: a TCP source's bytes read per offset Spark asks for, at most
#: The most a spool holds that Spark has not committed (option ``max_spool_bytes``, ``yfpp spark --max-spool``):
#: a TCP source stops reading (TCP's flow control then holds the producer back); an MQTT source, which
#: cannot hold the broker back, drops the messages that do not fit, counts them, and spools the count as
#: one drop report (a dead letter) ahead of the next message that fits.
MAX_SPOOL_BYTES = 1 << 30
#: Counts the whole records of spooled bytes: ``(their length, the records)``.
Counter = Callable[[bytes], tuple[int, int]]


def whole_lines(data: bytes) -> tuple[int, int]:
    """The length of ``data`` up to its last newline, and its lines."""
    cut = data.rfind(b"\n") + 1
    return cut, data.count(b"\n", 0, cut)


def whole_frames(data: bytes) -> tuple[int, int]:
    """The length of ``data``'s whole MQTT frames, and their number."""
    ends = frame_ends(data)
    return (ends[-1] if ends else 0), len(ends)


class Spool:
    """What a live source received, in segment files ``FOLDER/<first byte>-<records before>`` (zero-padded);
    a position is a byte offset in the whole. At open, a tail cut by a crash (``count`` gives the length
    of the whole records of the bytes) is dropped; appends go to the last segment until it holds
    ``segment_bytes``."""

    def __init__(self, folder: str, count: Counter, segment_bytes: int = SEGMENT_BYTES):
        os.makedirs(folder, exist_ok=True)
        self.folder, self.segment_bytes, self.lock = folder, segment_bytes, threading.Lock()
        start, records = (segments(folder) or [(0, 0)])[-1]
        last = segment_path(folder, start, records)
        with open(last, "ab+") as f:
            f.seek(0)
            size, n = count(f.read())
            f.truncate(size)
        self.size, self.records, self.segment_start = start + size, records + n, start
        self.file = open(last, "ab")  # noqa: SIM115 (kept open: appended to until the reader stops)

    def append(self, data: bytes, records: int) -> None:
        """Append ``data`` (``records`` whole records) and make it durable before returning."""
        with self.lock:
            if self.size - self.segment_start >= self.segment_bytes:
                self.file.close()
                self.segment_start = self.size
                self.file = open(segment_path(self.folder, self.size, self.records), "ab")  # noqa: SIM115
            self.file.write(data)
            self.file.flush()
            os.fsync(self.file.fileno())
            self.size += len(data)
            self.records += records

    def offset(self) -> dict:
        """The offset of everything spooled so far."""
        with self.lock:
            return {"pos": self.size, "records": self.records}

    def close(self) -> None:
        self.file.close()


def segments(folder: str) -> list[tuple[int, int]]:
    """The ``(first byte, records before)`` of the spool segments in ``folder``, in order."""
    names = os.listdir(folder) if os.path.isdir(folder) else []
    return sorted(tuple(int(x) for x in n.split("-")) for n in names if n.count("-") == 1 and n.replace("-", "").isdigit())


def segment_path(folder: str, start: int, records: int) -> str:
    return os.path.join(folder, f"{start:020d}-{records:020d}")


def spooled(folder: str, start: int, end: int) -> bytes:
    """Bytes ``start`` to ``end`` of the spool in ``folder`` (read only)."""
    segs = segments(folder)
    out = []
    for i, (first, records) in enumerate(segs):
        last = segs[i + 1][0] if i + 1 < len(segs) else end
        if last <= start or first >= end:
            continue
        with open(segment_path(folder, first, records), "rb") as f:
            f.seek(max(start - first, 0))
            out.append(f.read(min(end, last) - max(start, first)))
    data = b"".join(out)
    if len(data) != end - start:
        raise InputError(f"the spool {folder} lacks bytes {start} to {end} (deleted, or not this stream's)")
    return data


def trim(folder: str, pos: int) -> None:
    """Delete the segments that end at or before ``pos`` (never the last one)."""
    segs = segments(folder)
    for (first, records), (nxt, _) in pairwise(segs):
        if nxt <= pos:
            os.remove(segment_path(folder, first, records))


@dataclass
class Chunk(InputPartition):
    """A task's share of a micro-batch: spool bytes from ``block``, whole records, ``before`` records before them."""

    block: int
    before: int
    data: bytes


class LiveSource(DataSource):
    """``spark.readStream.format("yfpp_live")``, option ``url`` (``tcp://…``, ``mqtt://…``) and ``spool`` (a
    local folder under the checkpoint). Options: format, ts_field, ts_unit, type_field, segment_bytes."""

    @classmethod
    def name(cls) -> str:
        return "yfpp_live"

    def schema(self) -> str:
        return PARSED_SCHEMA

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        options = dict(self.options)
        return (_TcpReader if options["url"].startswith("tcp://") else _MqttReader)(options)


class _Reader(DataSourceStreamReader):
    """What the two sources share: the spool, offsets, chunks, trimming. The driver's half (connect,
    receive, plan) keeps its connection; an executor's half (:meth:`read`) only parses a chunk."""

    count: Counter = staticmethod(whole_lines)

    def __init__(self, options: dict[str, str]):
        self.options = {**options, "bad_files": True}  # a chunk the readers cannot read: a dead letter
        self.spool: Spool | None = None  # opened on the driver at the first offset (Spark pickles readers)
        self.committed = 0  # the spool position Spark committed (known after its first commit)
        self.max_spool = int(self.options.get("max_spool_bytes", MAX_SPOOL_BYTES))

    def __getstate__(self) -> dict:
        return {**self.__dict__, "spool": None}

    def initialOffset(self) -> dict:
        return {"pos": 0, "records": 0}

    def open(self) -> Spool:
        if self.spool is None:
            self.spool = Spool(self.options["spool"], self.count, int(self.options.get("segment_bytes", SEGMENT_BYTES)))
            self.committed = segments(self.options["spool"])[0][0]  # at least: what was trimmed was committed
            self.connect()
        return self.spool

    def connect(self) -> None:
        raise NotImplementedError

    def receive(self) -> None:
        """Append what has arrived to the spool (MQTT: done as messages come)."""

    def latestOffset(self) -> dict:
        spool = self.open()
        self.receive()
        return spool.offset()

    def partitions(self, start: dict, end: dict) -> Sequence[Chunk]:
        data = spooled(self.options["spool"], start["pos"], end["pos"])
        chunks, at, before = [], 0, start["records"]
        while at < len(data):
            size, n = self.count(data[at:at + CHUNK_BYTES])
            if not n:  # a record longer than a chunk
                size, n = self.count(data[at:at + self.record_end(data, at)])
            chunks.append(Chunk(start["pos"] + at, before, data[at:at + size]))
            at, before = at + size, before + n
        return chunks

    def record_end(self, data: bytes, at: int) -> int:
        """The length of the record at ``at`` of ``data``."""
        return data.index(b"\n", at) + 1 - at

    def read(self, partition: Chunk) -> Iterator[pa.RecordBatch]:
        raise NotImplementedError

    def commit(self, end: dict) -> None:
        self.committed = end["pos"]
        trim(self.options["spool"], end["pos"])

    def stop(self) -> None:
        if self.spool is not None:
            self.spool.close()


class _TcpReader(_Reader):
    """``tcp://HOST:PORT``: lines from a producer, appended to the spool as they come; connected again
    (bounded backoff) when the connection closes or drops."""

    def __init__(self, options: dict[str, str]):
        super().__init__(options)
        address = socket_address(options["url"].removeprefix("tcp://").rstrip("/"))
        if address is None:
            raise InputError(f"a TCP source is tcp://HOST:PORT, not {options['url']!r}")
        self.address = address
        self.sock: socket.socket | None = None
        self.connected = False  # once: later failures are retried
        self.backoff, self.retry_at = BACKOFF, 0.0
        self.pending = b""

    def __getstate__(self) -> dict:
        return {**super().__getstate__(), "sock": None}

    def connect(self) -> None:
        host, port = self.address
        try:
            self.sock = socket.create_connection(self.address, timeout=CONNECT_TIMEOUT)
        except OSError as e:
            if not self.connected:
                raise InputError(f"cannot connect to {host}:{port}: {e.strerror or e}") from None
            self.retry_at = time.monotonic() + self.backoff
            self.backoff = min(2 * self.backoff, MAX_BACKOFF)
            return
        self.connected, self.backoff = True, BACKOFF
        key = os.environ.get(FEED_KEY_ENV)
        if key:
            self.sock.sendall(f"AUTH {key}\n".encode())
        self.sock.settimeout(0.2)

    def receive(self) -> None:
        assert self.spool is not None
        if self.sock is None:
            if time.monotonic() < self.retry_at:
                return
            self.connect()
            if self.sock is None:
                return
        room = min(READ_BYTES, self.max_spool - (self.spool.size - self.committed))
        got, ended = bytearray(), False  # (a bytes += would copy all it holds at each chunk)
        try:
            while not ended and len(got) < room:
                chunk = self.sock.recv(1 << 16)
                ended = not chunk
                got += chunk
        except TimeoutError:
            pass
        except OSError:  # reset: what came before it is kept
            ended = True
        data = self.pending + bytes(got)
        cut, lines = whole_lines(data)
        if ended:
            self.sock.close()
            self.sock, self.retry_at = None, time.monotonic() + self.backoff
            if cut < len(data):  # the connection's last line, without its newline
                data, cut, lines = data + b"\n", len(data) + 1, lines + 1
        self.pending = data[cut:]
        if cut:
            self.spool.append(data[:cut], lines)

    def read(self, partition: Chunk) -> Iterator[pa.RecordBatch]:
        return line_batches(self.options["url"], partition.block, partition.before, partition.data, self.options)

    def stop(self) -> None:
        if self.sock is not None:
            self.sock.close()
        super().stop()


class _MqttReader(_Reader):
    """``mqtt://…/TOPIC``: each message appended to the spool (as a frame) before paho acknowledges it, or
    dropped and counted while the uncommitted spool is full (:data:`MAX_SPOOL_BYTES`)."""

    count = staticmethod(whole_frames)

    def __init__(self, options: dict[str, str]):
        super().__init__(options)
        _, topic, opts = parse_url(options["url"])
        self.topic = Topic(topic, opts.get("format"))
        self.fmt = options.get("format") or opts.get("format")
        self.subscriber: Subscriber | None = None
        self.dropped = 0  # messages dropped since the last drop report was spooled
        self.guard = threading.Lock()  # paho's thread spools messages, Spark's asks for offsets

    def __getstate__(self) -> dict:
        return {**super().__getstate__(), "subscriber": None, "guard": None}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state, guard=threading.Lock())

    def connect(self) -> None:
        broker, _, _ = parse_url(self.options["url"])
        take = self.take

        class Spooling(Subscriber):
            def on_message(self, msg: Any) -> None:
                take(frame(msg.topic, msg.payload))

        self.subscriber = Spooling(broker, [self.topic], f"mqtt source {broker.address}")
        self.subscriber.start()

    def take(self, message: bytes | None) -> None:
        """Spool ``message`` (a frame; None: none, a pending drop report only) if the uncommitted spool has room,
        else drop it and count it. The drops since the last report are spooled as one drop report
        (:data:`yfpp.spark.live_parse.DROPPED`) once it fits, before any later message: drops are reported
        in stream order, and a message is spooled only after every earlier one is, or reported dropped."""
        spool = self.spool
        assert spool is not None
        with self.guard:
            if self.dropped:
                report = frame(DROPPED, str(self.dropped).encode())
                if spool.size - self.committed + len(report) <= self.max_spool:
                    spool.append(report, 1)
                    self.dropped = 0
            if message is None:
                return
            if self.dropped or spool.size - self.committed + len(message) > self.max_spool:
                if not self.dropped:
                    log.warning("the MQTT spool is full (max_spool_bytes %d not yet committed): dropping messages "
                                "until Spark commits a micro-batch", self.max_spool)
                self.dropped += 1
            else:
                spool.append(message, 1)

    def receive(self) -> None:
        self.take(None)

    def record_end(self, data: bytes, at: int) -> int:
        topic, payload = FRAME.unpack_from(data, at)
        return FRAME.size + topic + payload

    def read(self, partition: Chunk) -> Iterator[pa.RecordBatch]:
        return message_batches(self.options["url"], partition.block, partition.before, partition.data, self.topic,
                               self.fmt, self.options)

    def stop(self) -> None:
        if self.subscriber is not None:
            self.subscriber.stop()
        super().stop()


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
    ts_field, ts_unit, type_field); ``interval``: the trigger; ``hot``: the stream's hot keys, decided and
    marked when staging, as a directory stream's (:mod:`yfpp.spark.stream_hot`)."""
    folder = local_path(f"{checkpoint}/live/spool")
    if folder is None:
        raise InputError(f"a live source spools what it receives under the checkpoint, which must be a local "
                         f"folder, not {checkpoint!r}")
    if os.path.isfile(folder):
        raise InputError(f"{checkpoint} was made by a yfpp that read live sources on the driver; start this "
                         "stream with a fresh checkpoint folder")
    spark.dataSource.register(LiveSource)
    parsed = spark.readStream.format("yfpp_live").options(url=url, spool=folder, **options).load()
    return stage(spark, parsed, LiveStager(spark, url, checkpoint, hot, single=True), interval)


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
