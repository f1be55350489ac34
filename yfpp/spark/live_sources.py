"""Live sources of ``yfpp spark --stream``: ``-i tcp://HOST:PORT`` and ``-i mqtt://HOST[:PORT]/TOPIC``.

A Spark 4 Python data source, ``yfpp_live`` (``spark.readStream.format("yfpp_live").option("url", …)``),
whose streaming reader runs on the driver (Spark's Python data-source process for the query):

* **tcp://HOST:PORT** — connects to a producer and reads what it sends: one record per line (JSON lines,
  or with ``format`` ``xml`` one element per line), as a ``yfpp serve`` feed port reads a connection.
  When ``$YFPP_FEED_KEY`` is set it first sends ``AUTH <key>`` and a newline — the line a feed connection
  to ``yfpp serve`` sends; nothing else. A closed connection is the end of the feed.
* **mqtt://…** — subscribes to the URL's topic with :class:`yfpp.input.mqtt.Subscriber` (the URL's options,
  TLS and password as for ``yfpp run -i mqtt://``); each message's events are read by
  :func:`yfpp.input.mqtt.message_events`, as the service's MQTT feed reads them.

What arrives is appended to a **spool** file under the stream's checkpoint (``CHECKPOINT/live/spool``)
before Spark sees it — an MQTT message before paho acknowledges it — and a micro-batch is a byte range of
the spool, so a restarted query reads an unfinished micro-batch again from there, identically (its offsets
carry the seq and the largest ts before it). Records are numbered and late ones flagged as the socket
source does (:class:`yfpp.spark.source._Sequencer`: ``yfpp run``'s numbering, ``max_delay`` 0); an MQTT
dead letter has seq -1, as ``yfpp run -i mqtt://`` reports it.
"""

from __future__ import annotations

import io
import json
import os
import re
import socket
import struct
import threading
from collections.abc import Iterator
from typing import Any

from lxml import etree
from pyspark.sql.datasource import DataSource, SimpleDataSourceStreamReader

from yfpp.errors import InputError
from yfpp.input.dead_letters import DeadLetters
from yfpp.input.mqtt import Subscriber, Topic, message_events, parse_url
from yfpp.spark.inputs import socket_address
from yfpp.spark.parse import reader_kwargs, records
from yfpp.spark.source import CONNECT_TIMEOUT, EVENT_SCHEMA, _Sequencer

FEED_KEY_ENV = "YFPP_FEED_KEY"  #: the feed key a tcp:// source sends as its AUTH line
_LINE = re.compile(r"^line (\d+)")  #: a reader's dead-letter position, numbered within the data it read
_FRAME = struct.Struct(">II")  #: an MQTT message in the spool: topic and payload lengths, then both


class Spool:
    """An append-only file of what a live source received; offsets are byte positions in it. At open, a
    tail cut by a crash (``complete`` gives the length of the whole records of the bytes) is dropped."""

    def __init__(self, path: str, complete: Any):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "ab+") as f:
            f.seek(0)
            size = complete(f.read())
            f.truncate(size)
        self.path, self.size = path, size
        self.file = open(path, "ab")  # noqa: SIM115 (kept open: appended to until the reader stops)
        self.lock = threading.Lock()

    def append(self, data: bytes) -> None:
        """Append ``data`` and make it durable before returning."""
        with self.lock:
            self.file.write(data)
            self.file.flush()
            os.fsync(self.file.fileno())
            self.size += len(data)

    def close(self) -> None:
        self.file.close()


def spooled(path: str, start: int, end: int) -> bytes:
    """Bytes ``start`` to ``end`` of the spool file ``path`` (read only)."""
    with open(path, "rb") as f:
        f.seek(start)
        return f.read(end - start)


def whole_lines(data: bytes) -> int:
    """The length of ``data`` up to its last newline."""
    return data.rfind(b"\n") + 1


def whole_frames(data: bytes) -> int:
    """The length of ``data``'s whole MQTT frames."""
    pos = 0
    while pos + _FRAME.size <= len(data):
        t, p = _FRAME.unpack_from(data, pos)
        if pos + _FRAME.size + t + p > len(data):
            break
        pos += _FRAME.size + t + p
    return pos


def frames(data: bytes) -> Iterator[tuple[str, bytes]]:
    """The ``(topic, payload)`` messages of whole frames."""
    pos = 0
    while pos < len(data):
        t, p = _FRAME.unpack_from(data, pos)
        pos += _FRAME.size
        topic = data[pos:pos + t].decode("utf-8", "replace")
        yield topic, data[pos + t:pos + t + p]
        pos += t + p


class LiveSource(DataSource):
    """``spark.readStream.format("yfpp_live")``, option ``url`` (``tcp://…``, ``mqtt://…``) and ``spool`` (a
    local file path under the checkpoint). Options: format, ts_field, ts_unit, type_field."""

    @classmethod
    def name(cls) -> str:
        return "yfpp_live"

    def schema(self) -> str:
        return EVENT_SCHEMA

    def simpleStreamReader(self, schema: Any) -> SimpleDataSourceStreamReader:
        options = dict(self.options)
        return (_TcpReader if options["url"].startswith("tcp://") else _MqttReader)(options)


class _Reader(SimpleDataSourceStreamReader):
    """What the two sources share: the spool, offsets ``{"pos", "seq", "max_ts", "messages"}`` (the spool's
    bytes, records and largest ts before, MQTT messages or TCP lines before), and replay."""

    complete: Any = staticmethod(whole_lines)

    def __init__(self, options: dict[str, str]):
        self.options = options
        self.spool: Spool | None = None  # opened on the driver at the first read (Spark pickles readers)

    def __getstate__(self) -> dict:
        return {**self.__dict__, "spool": None}

    def initialOffset(self) -> dict:
        return {"pos": 0, "seq": 0, "max_ts": None, "messages": 0}

    def open(self) -> Spool:
        if self.spool is None:
            self.spool = Spool(self.options["spool"], self.complete)
            self.connect()
        return self.spool

    def connect(self) -> None:
        raise NotImplementedError

    def receive(self) -> None:
        """Append what has arrived to the spool (MQTT: done as messages come)."""

    def read(self, start: dict) -> tuple[Iterator[tuple], dict]:
        spool = self.open()
        self.receive()
        end = spool.size
        rows, offset = self.rows(start, spooled(spool.path, start["pos"], end))
        return iter(rows), {"pos": end, **offset}  # (keys in one order: Spark compares offsets as JSON text)

    def readBetweenOffsets(self, start: dict, end: dict) -> Iterator[tuple]:
        """A micro-batch again (a restarted query): from the spool file alone — Spark may call this in
        another process (an executor's Python worker), which must neither connect nor write."""
        rows, _ = self.rows(start, spooled(self.options["spool"], start["pos"], end["pos"]))
        return iter(rows)

    def rows(self, start: dict, data: bytes) -> tuple[list[tuple], dict]:
        """The rows of ``data`` (whole records from offset ``start``) and the offset after them (less ``pos``)."""
        raise NotImplementedError

    def stop(self) -> None:
        if self.spool is not None:
            self.spool.close()


class _TcpReader(_Reader):
    """``tcp://HOST:PORT``: lines from a producer, appended to the spool as they come."""

    def __init__(self, options: dict[str, str]):
        super().__init__({**options, "format": options.get("format") or "jsonl"})
        address = socket_address(options["url"].removeprefix("tcp://").rstrip("/"))
        if address is None:
            raise InputError(f"a TCP source is tcp://HOST:PORT, not {options['url']!r}")
        self.address = address
        self.sock: socket.socket | None = None
        self.ended = False
        self.pending = b""

    def __getstate__(self) -> dict:
        return {**super().__getstate__(), "sock": None}

    def connect(self) -> None:
        host, port = self.address
        try:
            self.sock = socket.create_connection(self.address, timeout=CONNECT_TIMEOUT)
        except OSError as e:
            raise InputError(f"cannot connect to {host}:{port}: {e.strerror or e}") from None
        key = os.environ.get(FEED_KEY_ENV)
        if key:
            self.sock.sendall(f"AUTH {key}\n".encode())
        self.sock.settimeout(0.2)

    def receive(self) -> None:
        assert self.sock is not None and self.spool is not None
        got = b""
        try:
            while not self.ended:
                chunk = self.sock.recv(1 << 16)
                if not chunk:
                    self.ended = True
                got += chunk
        except TimeoutError:
            pass
        data = self.pending + got
        cut = whole_lines(data)
        if self.ended and cut < len(data):  # the producer's last line, without its newline
            data, cut = data + b"\n", len(data) + 1
        self.pending = data[cut:]
        if cut:
            self.spool.append(data[:cut])

    def rows(self, start: dict, data: bytes) -> tuple[list[tuple], dict]:
        """As a file of the lines read so far (seq, late events, a dead letter's ``line N``): the offsets'
        ``messages`` counts the lines before."""
        seqr = _Sequencer(start["seq"], start["max_ts"])
        rows = seqr.rows(records(io.BytesIO(data), self.options)) if data.strip() else []
        lines = start["messages"]
        if lines:
            rows = [r if r[6] is None else (*r[:6], _LINE.sub(lambda m: f"line {int(m[1]) + lines}", r[6]), r[7])
                    for r in rows]
        return rows, {**seqr.offset(), "messages": lines + data.count(b"\n")}

    def stop(self) -> None:
        if self.sock is not None:
            self.sock.close()
        super().stop()


class _Collect(DeadLetters):
    """An MQTT message's dead letters, as rows of seq -1 (``yfpp run -i mqtt://`` numbers events only)."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[tuple] = []

    def report(self, seq: int, position: str, reason: str, raw: str | None = None) -> None:
        super().report(seq, position, reason, raw)
        self.rows.append((-1, None, None, None, None, reason, position, raw))


class _MqttReader(_Reader):
    """``mqtt://…/TOPIC``: each message appended to the spool (as a frame) before paho acknowledges it."""

    complete = staticmethod(whole_frames)

    def __init__(self, options: dict[str, str]):
        super().__init__(options)
        _, topic, opts = parse_url(options["url"])
        self.topic = Topic(topic, opts.get("format"))
        self.fmt = options.get("format") or opts.get("format")
        self.subscriber: Subscriber | None = None

    def __getstate__(self) -> dict:
        return {**super().__getstate__(), "subscriber": None}

    def connect(self) -> None:
        broker, _, _ = parse_url(self.options["url"])
        spool = self.spool
        assert spool is not None

        class Spooling(Subscriber):
            def on_message(self, msg: Any) -> None:
                topic = msg.topic.encode("utf-8")
                spool.append(_FRAME.pack(len(topic), len(msg.payload)) + topic + msg.payload)

        self.subscriber = Spooling(broker, [self.topic], f"mqtt source {broker.address}")
        self.subscriber.start()

    def rows(self, start: dict, data: bytes) -> tuple[list[tuple], dict]:
        dead = _Collect()
        read_opts = reader_kwargs(self.options)
        number = start["messages"]
        events: list[tuple] = []
        for topic, payload in frames(data):
            number += 1
            for ev in message_events(payload, topic, self.topic, number, dead, read_opts, self.fmt):
                el = ev._element
                xml = etree.tostring(el, encoding="unicode", with_tail=False) if el is not None else None
                events.append((len(events), ev.type, float(ev.ts), json.dumps(ev.attrs), xml, None, None, None))
        seqr = _Sequencer(start["seq"], start["max_ts"])
        return seqr.rows(iter(events)) + dead.rows, {**seqr.offset(), "messages": number}

    def stop(self) -> None:
        if self.subscriber is not None:
            self.subscriber.stop()
        super().stop()


def read_live(spark: Any, url: str, spool: str, options: dict[str, str]) -> Any:
    """The streaming event DataFrame of live source ``url``, spooled at ``spool`` (a local file path);
    ``options``: the readers' (format, ts_field, ts_unit, type_field)."""
    spark.dataSource.register(LiveSource)
    return spark.readStream.format("yfpp_live").options(url=url, spool=spool, **options).load()


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
