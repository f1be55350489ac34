"""Byte ranges of the scan plan's input: each byte read and parsed by one task.

A plain JSON-lines file (not compressed) is cut into ranges of about equal
size; a range holds the lines that *start* in it, as Hadoop's line reader
splits a file: it begins after the first line break at or after its start
(unless it starts at 0) and ends with the line that runs over its end. Any
other file (XML, gzip) is one range, read by its own reader. Ranges are
numbered in stream order (the files in the order given, each from its start),
so a record's stream position is its range's number and its index there; its
seq number is that index plus the records of the ranges before
(:func:`range_offsets`).
"""

from __future__ import annotations

import io
import math
import os
import re
from typing import Any, Iterator, NamedTuple, Sequence

import numpy as np

from yfpp.input.dead_letters import DeadLetters
from yfpp.input.events import Event
from yfpp.input.readers import read_event_batches
from yfpp.spark.inputs import splittable
from yfpp.spark.parse import reader_kwargs
from yfpp.spark.read import split_offsets

#: A range is at most this long (a task holds its range's bytes while it parses them).
MAX_RANGE_BYTES = 32 << 20
#: A range is at least this long, but for a file's last (a file below it is one range): a range costs each
#: matching task a blob, a summary and its offsets whatever its size (about 0.7 ms a range in all at 128 tasks),
#: against some 25 ms to read and scan 4 MB (docs/spark.md, "The cost model").
MIN_RANGE_BYTES = 4 << 20
_LINE = re.compile(r"^line (\d+)")


class ByteRange(NamedTuple):
    """Bytes ``start`` to ``end`` of input file number ``file``; ``end`` None: the whole file, by its own reader."""

    file: int
    start: int
    end: int | None


class Summary(NamedTuple):
    """What a read task found in one range: records (events and malformed ones), lines, the largest ts,
    and for the cost model the bytes it parsed and its CPU seconds."""

    records: int
    lines: int
    max_ts: float | None
    bytes: int
    seconds: float

    def packed(self) -> bytes:
        """The summary as one fixed-size record (:func:`unpack_summaries`; no ts yet: NaN, which no ts is)."""
        return np.array([(self.records, self.lines, math.nan if self.max_ts is None else self.max_ts, self.bytes,
                          self.seconds)], _PACKED).tobytes()


_PACKED = np.dtype([("records", "<i8"), ("lines", "<i8"), ("max_ts", "<f8"), ("bytes", "<i8"), ("seconds", "<f8")])


def unpack_summaries(blobs: Sequence[bytes]) -> list[Summary]:
    """The summaries of :meth:`Summary.packed` records, read in one go (a matching task gets one a range)."""
    cols = np.frombuffer(b"".join(blobs), _PACKED)
    return [Summary(n, lines, None if ts != ts else ts, size, cpu)
            for n, lines, ts, size, cpu in zip(*(cols[name].tolist() for name in _PACKED.names))]


class Offsets(NamedTuple):
    """A range's place in the stream: the records before it, the lines before it in its file, the largest
    ts before it (None: no event yet), and its dead letters' position prefix (its file's name, or "")."""

    seq_base: int
    line_base: int
    before: float | None
    prefix: str


def plan_ranges(paths: Sequence[str], format: str | None, pieces: int,
                min_bytes: int = MIN_RANGE_BYTES) -> list[ByteRange]:
    """The ranges of the local files ``paths`` (in stream order): the splittable ones
    (:func:`yfpp.spark.inputs.splittable`) cut so that there are about ``pieces`` ranges over all
    bytes, each of a file but its last at least ``min_bytes`` long and none over :data:`MAX_RANGE_BYTES`
    (``min_bytes`` at most half of it); the others one range each."""
    if not 1 <= min_bytes <= MAX_RANGE_BYTES // 2:
        raise ValueError(f"a range's least size must be from 1 to {MAX_RANGE_BYTES // 2:,} bytes, not {min_bytes:,}")
    sizes = [os.path.getsize(p) for p in paths]
    target = min(MAX_RANGE_BYTES, max(min_bytes, -(-sum(sizes) // max(pieces, 1))))
    out = []
    for i, (path, size) in enumerate(zip(paths, sizes)):
        if not splittable(path, format) or size == 0:
            out.append(ByteRange(i, 0, None))
            continue
        cuts = max(1, min(-(-size // target), size // min_bytes))  # ≥ size / MAX (min_bytes ≤ MAX / 2)
        step = -(-size // cuts)  # equal pieces, each at least min_bytes and at most the target
        out += [ByteRange(i, a, min(a + step, size)) for a in range(0, size, step)]
    return out


def range_bytes(path: str, start: int, end: int) -> bytes:
    """The lines of ``path`` that start in bytes ``[start, end)``, whole."""
    with open(path, "rb") as f:
        if start:
            f.seek(start - 1)
            f.readline()  # the line running into the range is the range before's
        at = f.tell()
        if at >= end:
            return b""
        data = f.read(end - at)
        if data and not data.endswith(b"\n"):
            data += f.readline()
    return data


def read_range(path: str, rng: ByteRange, reading: dict[str, Any], dead: DeadLetters,
               data: bytes | None = None) -> tuple[Iterator[list[Event]], int, int]:
    """The events of one range, a reader's batch at a time, ``seq`` their index in the range (dead letters
    to ``dead``, positions as the reader gives them: "line N" of the range); the bytes it holds; and the
    lines it counts for the line numbers of the ranges after it in its file (a whole file: 0). ``data``:
    the range's bytes (:func:`range_bytes`) when the caller has read them."""
    kw = reader_kwargs(reading)
    if rng.end is None:
        return read_event_batches(path, reading["format"], **kw, dead_letters=dead), os.path.getsize(path), 0
    if data is None:
        data = range_bytes(path, rng.start, rng.end)
    lines = data.count(b"\n") + (1 if data and not data.endswith(b"\n") else 0)
    return read_event_batches(io.BytesIO(data), "jsonl", **kw, dead_letters=dead), len(data), lines


def range_offsets(files: Sequence[str], ranges: Sequence[ByteRange], summaries: Sequence[Summary],
                  single: bool) -> list[Offsets]:
    """Each range's :class:`Offsets` from all ranges' summaries (``files``: the listed URIs, in stream order)."""
    stats = [(files[r.file], r.start, s.records, s.lines, s.max_ts) for r, s in zip(ranges, summaries)]
    by_range = {(o[0], o[1]): o for o in split_offsets(stats, single, order=files)}
    return [Offsets(*by_range[(files[r.file], r.start)][2:]) for r in ranges]


def renumber(position: str, offsets: Offsets) -> str:
    """A malformed record's position as ``yfpp run`` gives it: the file's name, the line number in the file."""
    if offsets.line_base:
        position = _LINE.sub(lambda m: f"line {int(m.group(1)) + offsets.line_base}", position, count=1)
    return offsets.prefix + position
