"""Executor side of the live sources: a spooled chunk parsed into :data:`yfpp.spark.parse.PARSED_SCHEMA` rows.

A chunk is a byte range of a live source's spool (:mod:`yfpp.spark.live_sources`) holding whole records —
TCP lines, or MQTT messages as frames — with the number of records before it in the feed. It is one
split of the feed (path: the source's URL, block: the chunk's first byte in the spool), parsed as
:mod:`yfpp.spark.parse` parses a split of a file: rows with the record's index in the chunk and the
chunk's summary, from which the ingest query's :class:`yfpp.spark.ingest.Stager` numbers the events and
finds the late ones on the driver, as for a directory's files. No pyspark import here.

* **TCP lines**: the readers over the chunk's bytes (JSON lines, or XML elements); a dead letter's
  ``line`` counts from the feed's first line (the chunk's summary counts no lines: its dead letters
  are numbered here), so its position is ``line N`` of the whole feed, as ``yfpp run`` reads the bytes.
* **MQTT messages**: each message's events read by :func:`yfpp.input.mqtt.message_events` (its number
  in the feed from 1, its topic's named levels); its dead letters take no seq (``yfpp run -i mqtt://``
  numbers events only): their rows have ``pos`` null, which the stager gives seq -1. A drop report
  (:data:`DROPPED`: messages the driver dropped while the spool was full) is one such dead letter.
"""

from __future__ import annotations

import io
import struct
from collections.abc import Iterator
from typing import Any

import pyarrow as pa

from yfpp.input.mqtt import Topic, message_events
from yfpp.spark.parse import _BATCH_ROWS, _Collect, _Columns, _Split, reader_kwargs

FRAME = struct.Struct(">II")  #: an MQTT message in the spool: topic and payload lengths, then both
#: The topic of a drop report in the spool (no MQTT topic holds U+0000): its payload, the messages dropped.
DROPPED = "\0dropped"


def frame(topic: str, payload: bytes) -> bytes:
    """One MQTT message as the spool holds it."""
    t = topic.encode("utf-8")
    return FRAME.pack(len(t), len(payload)) + t + payload


def frames(data: bytes) -> Iterator[tuple[str, bytes]]:
    """The ``(topic, payload)`` messages of whole frames."""
    pos = 0
    while pos < len(data):
        t, p = FRAME.unpack_from(data, pos)
        pos += FRAME.size
        yield data[pos:pos + t].decode("utf-8", "replace"), data[pos + t:pos + t + p]
        pos += t + p


def line_batches(url: str, block: int, lines_before: int, data: bytes,
                 options: dict[str, Any]) -> Iterator[pa.RecordBatch]:
    """The rows of a chunk of TCP lines (whole lines, the feed's ``lines_before`` lines before it)."""
    out, split = _Columns(()), _Split(url, block)
    split.lines = lines_before  # dead letters' lines from the feed's first line ...
    yield from split.read(io.BytesIO(data), options.get("format") or "jsonl", 0, options, out)
    split.lines = 0  # ... and none for the stager to add
    out.summary(split)
    yield out.batch()


def message_batches(url: str, block: int, messages_before: int, data: bytes, topic: Topic, fmt: str | None,
                    options: dict[str, Any]) -> Iterator[pa.RecordBatch]:
    """The rows of a chunk of MQTT frames (``messages_before`` messages before it); ``topic``: the
    subscription (format, named levels), ``fmt``: the format the URL or ``--format`` gives."""
    out, split, dead = _Columns(()), _Split(url, block), _Collect()
    read_opts = reader_kwargs(options)
    for number, (name, payload) in enumerate(frames(data), messages_before + 1):
        if name == DROPPED:
            dead.report(0, "mqtt spool", f"spool full: {int(payload)} messages dropped (max_spool_bytes), not matched")
            events = []
        else:
            events = message_events(payload, name, topic, number, dead, read_opts, fmt)
        if dead.items:
            out.dead(split, dead.items, 0, 0, numbered=False)
        if events:
            for i, ev in enumerate(events, split.n):
                ev.seq = i
            out.events(split, events, 0, options.get("xml", True))
            split.n += len(events)
        if len(out) >= _BATCH_ROWS:
            yield out.batch()
    out.summary(split)
    yield out.batch()
