"""The streaming Python data source ``yfpp_stream`` (Spark 4): lines from a socket, a demo source.

It runs on the driver: it reads what arrived, runs the project's readers,
assigns the global seq and flags late events itself, and keeps both in its
offsets. (A directory stream is read by Spark's file source on the executors
instead: :mod:`yfpp.spark.ingest`.)
"""

from __future__ import annotations

import io
import json
import socket
from typing import Any, Iterator

from pyspark.sql.datasource import DataSource, SimpleDataSourceStreamReader

from yfpp.engine import event_raw, late_reason
from yfpp.errors import InputError
from yfpp.spark.inputs import socket_address
from yfpp.spark.parse import records

CONNECT_TIMEOUT = 10  #: seconds to connect to the socket
#: Columns of an event table (the stream source's, and read_events_df's result).
EVENT_SCHEMA = "seq long, type string, ts double, attrs string, xml string, reason string, position string, raw string"


class YfppStreamSource(DataSource):
    """``spark.readStream.format("yfpp_stream")`` with option ``socket`` (host:port).

    Options: format, ts_field, ts_unit, type_field.
    """

    @classmethod
    def name(cls) -> str:
        return "yfpp_stream"

    def schema(self) -> str:
        return EVENT_SCHEMA

    def simpleStreamReader(self, schema: Any) -> SimpleDataSourceStreamReader:
        return _SocketReader(dict(self.options))


class _Sequencer:
    """Global seq and late-event flags over records read in order (the Engine's rule, ``max_delay`` 0)."""

    def __init__(self, seq: int, max_ts: float | None):
        self.seq, self.max_ts = seq, max_ts

    def rows(self, recs: Iterator[tuple]) -> list[tuple]:
        out = []
        base, n = self.seq, 0
        for pos, type_, ts, attrs, xml, reason, position, raw in recs:
            seq = base + pos
            n = pos + 1
            if reason is None and self.max_ts is not None and ts < self.max_ts:
                reason = late_reason(ts, self.max_ts, 0.0)
                position, raw = f"seq {seq}", event_raw(type_, ts, json.loads(attrs))
            elif ts is not None:
                self.max_ts = ts if self.max_ts is None else max(ts, self.max_ts)
            out.append((seq, type_, ts, attrs, xml, reason, position, raw))
        self.seq = base + n
        return out

    def offset(self, **extra: Any) -> dict:
        return {"seq": self.seq, "max_ts": self.max_ts, **extra}


class _SocketReader(SimpleDataSourceStreamReader):
    """Lines from ``host:port``, one record per line; what arrived since the last read is one micro-batch.

    Like Spark's own socket source this is for demos: Spark keeps a batch's
    rows only until it commits them, so a restarted query cannot read them again.
    """

    def __init__(self, options: dict[str, str]):
        self.options = {**options, "format": options.get("format") or "jsonl"}
        address = socket_address(options["socket"])
        if address is None:
            raise InputError(f"a socket must be HOST:PORT (a port from 1 to 65535), not {options['socket']!r}")
        self.address = address
        self.sock: socket.socket | None = None  # connected on the first read, on the driver
        self.pending = b""

    def __getstate__(self) -> dict:  # Spark pickles the reader: without its connection
        return {**self.__dict__, "sock": None}

    def initialOffset(self) -> dict:
        return {"seq": 0, "max_ts": None}

    def read(self, start: dict) -> tuple[Iterator[tuple], dict]:
        if self.sock is None:
            try:
                self.sock = socket.create_connection(self.address, timeout=CONNECT_TIMEOUT)
            except OSError as e:
                host, port = self.address
                raise InputError(f"cannot connect to {host}:{port}: {e.strerror or e}") from None
            self.sock.settimeout(0.2)
        try:
            while chunk := self.sock.recv(1 << 16):
                self.pending += chunk
        except (TimeoutError, socket.timeout):
            pass
        data, _, self.pending = self.pending.rpartition(b"\n")
        seqr = _Sequencer(start["seq"], start["max_ts"])
        rows = seqr.rows(records(io.BytesIO(data + b"\n"), self.options)) if data.strip() else []
        return iter(rows), seqr.offset()

    def readBetweenOffsets(self, start: dict, end: dict) -> Iterator[tuple]:
        raise InputError("the socket source cannot read a micro-batch again (restarted query): its data is gone")

    def stop(self) -> None:
        if self.sock is not None:
            self.sock.close()


def register(spark: Any) -> None:
    """Make ``yfpp_stream`` known to ``spark``."""
    spark.dataSource.register(YfppStreamSource)
