"""Spark 4 Python data sources that run the project's hardened readers.

Spark's XML source reads one element name at a time, so it cannot give
heterogeneous events in document order; these sources run
:func:`yfpp.readers.read_events` on each file instead.

* ``yfpp`` (batch): one partition per file (files of a directory in name
  order). A row per record — events and malformed records alike — with the
  file's index, the record's position in the file (the reader's seq) and the
  largest ts before it in the file; :func:`yfpp.spark.batch.read_events_df`
  turns these into global seq numbers and late-event reports.
* ``yfpp_stream`` (streaming, read on the driver): new files of a directory
  in name order, or lines from a socket (a demo: not replayable). It assigns
  the global seq and flags late events itself, and keeps both in its offsets.
"""

from __future__ import annotations

import io
import json
import os
import socket
from typing import Any, Iterator

from lxml import etree
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition, SimpleDataSourceStreamReader

from yfpp.dead_letters import DeadLetters
from yfpp.engine import event_raw
from yfpp.errors import InputError
from yfpp.readers import read_events

#: Columns of the batch source.
RAW_SCHEMA = ("file int, pos long, prev_max double, type string, ts double, attrs string, xml string, "
              "reason string, position string, raw string")
#: Columns of an event table (the stream source's, and read_events_df's result).
EVENT_SCHEMA = "seq long, type string, ts double, attrs string, xml string, reason string, position string, raw string"


class _Collect(DeadLetters):
    """Dead letters kept as ``(pos, position, reason, raw)`` until the caller takes them."""

    def __init__(self, where: str) -> None:
        super().__init__()
        self.where = where
        self.items: list[tuple[int, str, str, str | None]] = []

    def report(self, seq: int, position: str, reason: str, raw: str | None = None) -> None:
        super().report(seq, position, reason, raw)
        self.items.append((seq, f"{self.where} {position}" if self.where else position, reason, raw))


def records(source: Any, options: dict[str, str], where: str = "") -> Iterator[tuple]:
    """``(pos, type, ts, attrs JSON, xml, reason, position, raw)`` for every record of ``source``, in order.

    ``where`` (a file name) prefixes the positions of dead letters.
    """
    dead = _Collect(where)
    fmt = options.get("format") or None
    events = read_events(source, fmt, ts_field=options.get("ts_field", "ts"), ts_unit=options.get("ts_unit", "s"),
                         dead_letters=dead)
    for ev in events:
        yield from _drain(dead)
        xml = etree.tostring(ev._element, encoding="unicode", with_tail=False) if ev._element is not None else None
        yield ev.seq, ev.type, float(ev.ts), json.dumps(ev.attrs), xml, None, None, None
    yield from _drain(dead)


def _drain(dead: _Collect) -> Iterator[tuple]:
    for pos, position, reason, raw in dead.items:
        yield pos, None, None, None, None, reason, position, raw
    dead.items.clear()


def list_files(path: str) -> list[str]:
    """``path`` itself, or the files of directory ``path`` in name order (hidden and ``_…`` names skipped)."""
    if not os.path.isdir(path):
        if not os.path.isfile(path):
            raise InputError(f"no such input: {path}")
        return [path]
    names = sorted(n for n in os.listdir(path) if not n.startswith((".", "_")))
    return [os.path.join(path, n) for n in names if os.path.isfile(os.path.join(path, n))]


class YfppSource(DataSource):
    """``spark.read.format("yfpp").option("path", …)``; options format, ts_field, ts_unit."""

    @classmethod
    def name(cls) -> str:
        return "yfpp"

    def schema(self) -> str:
        return RAW_SCHEMA

    def reader(self, schema: Any) -> DataSourceReader:
        return _BatchReader(dict(self.options))


class _BatchReader(DataSourceReader):
    def __init__(self, options: dict[str, str]):
        self.options = options

    def partitions(self) -> list[InputPartition]:
        return [InputPartition((i, f)) for i, f in enumerate(list_files(self.options["path"]))]

    def read(self, partition: InputPartition) -> Iterator[tuple]:
        index, path = partition.value
        where = os.path.basename(path) if os.path.isdir(self.options["path"]) else ""
        prev_max = None
        for pos, type_, ts, attrs, xml, reason, position, raw in records(path, self.options, where):
            yield index, pos, prev_max, type_, ts, attrs, xml, reason, position, raw
            if ts is not None and (prev_max is None or ts > prev_max):
                prev_max = ts


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
    """Make ``yfpp`` and ``yfpp_stream`` known to ``spark``."""
    spark.dataSource.register(YfppSource)
    spark.dataSource.register(YfppStreamSource)
