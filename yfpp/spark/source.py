"""The streaming Python data source ``yfpp_stream`` (Spark 4), running the project's readers.

New files of a local directory in name order, or lines from a socket (a demo:
not replayable), read on the driver: the source assigns the global seq and
flags late events itself, and keeps both in its offsets. (Batch input goes
through Spark's file system layer instead: :mod:`yfpp.spark.read`.)
"""

from __future__ import annotations

import io
import json
import os
import socket
from typing import Any, Iterator

from pyspark.sql.datasource import DataSource, SimpleDataSourceStreamReader

from yfpp.engine import event_raw
from yfpp.errors import InputError
from yfpp.spark.parse import records

#: Columns of an event table (the stream source's, and read_events_df's result).
EVENT_SCHEMA = "seq long, type string, ts double, attrs string, xml string, reason string, position string, raw string"


def list_files(path: str) -> list[str]:
    """``path`` itself, or the files of directory ``path`` in name order (hidden and ``_…`` names skipped)."""
    if not os.path.isdir(path):
        if not os.path.isfile(path):
            raise InputError(f"no such input: {path}")
        return [path]
    names = sorted(n for n in os.listdir(path) if not n.startswith((".", "_")))
    return [os.path.join(path, n) for n in names if os.path.isfile(os.path.join(path, n))]


class YfppStreamSource(DataSource):
    """``spark.readStream.format("yfpp_stream")`` with option ``path`` (a directory) or ``socket`` (host:port).

    Options: format, ts_field, ts_unit, max_files (per micro-batch, directory only).
    """

    @classmethod
    def name(cls) -> str:
        return "yfpp_stream"

    def schema(self) -> str:
        return EVENT_SCHEMA

    def simpleStreamReader(self, schema: Any) -> SimpleDataSourceStreamReader:
        opts = dict(self.options)
        return _SocketReader(opts) if "socket" in opts else _DirectoryReader(opts)


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
                reason = f"late event: ts {ts} < stream time {self.max_ts} (max_delay 0.0)"
                position, raw = f"seq {seq}", event_raw(type_, ts, json.loads(attrs))
            elif ts is not None:
                self.max_ts = ts if self.max_ts is None else max(ts, self.max_ts)
            out.append((seq, type_, ts, attrs, xml, reason, position, raw))
        self.seq = base + n
        return out

    def offset(self, **extra: Any) -> dict:
        return {"seq": self.seq, "max_ts": self.max_ts, **extra}


class _DirectoryReader(SimpleDataSourceStreamReader):
    """New files of a directory, in name order: a file must be complete when it appears (write, then rename)."""

    def __init__(self, options: dict[str, str]):
        self.options = options
        self.max_files = int(options.get("max_files", 0)) or None

    def initialOffset(self) -> dict:
        return {"files": 0, "seq": 0, "max_ts": None}

    def _read(self, start: dict, stop: int | None) -> tuple[list[tuple], dict]:
        files = list_files(self.options["path"])[start["files"]:stop]
        if stop is None and self.max_files:
            files = files[: self.max_files]
        seqr = _Sequencer(start["seq"], start["max_ts"])
        rows = [row for f in files for row in seqr.rows(records(f, self.options, os.path.basename(f)))]
        return rows, seqr.offset(files=start["files"] + len(files))

    def read(self, start: dict) -> tuple[Iterator[tuple], dict]:
        rows, end = self._read(start, None)
        return iter(rows), end

    def readBetweenOffsets(self, start: dict, end: dict) -> Iterator[tuple]:
        return iter(self._read(start, end["files"])[0])


class _SocketReader(SimpleDataSourceStreamReader):
    """Lines from ``host:port``, one record per line; what arrived since the last read is one micro-batch.

    Like Spark's own socket source this is for demos: Spark keeps a batch's
    rows only until it commits them, so a restarted query cannot read them again.
    """

    def __init__(self, options: dict[str, str]):
        self.options = {**options, "format": options.get("format") or "jsonl"}
        host, _, port = options["socket"].rpartition(":")
        self.address = (host or "localhost", int(port))
        self.sock: socket.socket | None = None  # connected on the first read, on the driver
        self.pending = b""

    def __getstate__(self) -> dict:  # Spark pickles the reader: without its connection
        return {**self.__dict__, "sock": None}

    def initialOffset(self) -> dict:
        return {"seq": 0, "max_ts": None}

    def read(self, start: dict) -> tuple[Iterator[tuple], dict]:
        if self.sock is None:
            self.sock = socket.create_connection(self.address)
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
