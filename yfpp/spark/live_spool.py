"""The spool of a live source (:mod:`yfpp.spark.live_sources`): what its receiver got, in a folder the driver and the
executors share, and the files through which the receiver and the planning half speak. No pyspark import here.

* **Segments** ``FOLDER/<first byte>-<records before>`` (zero-padded) hold the bytes, whole records only (TCP
  lines; MQTT messages as frames); a position is a byte offset in the whole. Only the receiver writes them,
  appending to the newest; the planning half deletes the segments wholly before what Spark committed
  (:func:`trim`, never the newest) and the executors read byte ranges (:func:`spooled`).
* ``published`` and ``marks.json`` (:class:`Published`, :func:`read_published`): the durable **end** — a
  byte position and the records before it — and the record-aligned **marks** (``[pos, records]``, about
  :data:`MARK_BYTES` apart) the planner cuts a micro-batch's chunks at without reading the bytes. After
  an append is fsynced (:meth:`Spool.append`; or several at once, :meth:`Spool.write` then :meth:`Spool.sync`)
  the receiver publishes the end: a record of two slots written in turn (a publication number, the end, a
  CRC; written in place and fsynced — far cheaper than a new file and a rename, which matters at one
  publication per batch of MQTT messages); the reader takes the valid slot with the
  higher number. ``marks.json`` is rewritten (write, fsync, rename) only when a mark is added, before the end
  that passes it. Nothing past the end is ever planned, and a receiver started again truncates what lies
  past it (and drops the marks past it).
* ``committed.json``: the position Spark committed, written by the planning half at each commit; the
  receiver reads it to keep what Spark has not committed under its cap.
* ``error``: a receiver's last word when it cannot go on (its first connection failed, or it failed too
  often); the planning half raises it. ``stop-<job>``: the driver's request to a receiver job's task to end.
"""

from __future__ import annotations

import json
import os
import struct
import threading
import zlib
from collections.abc import Iterable, Sequence
from itertools import pairwise
from typing import NamedTuple

from yfpp.errors import InputError

SEGMENT_BYTES = 64 << 20  #: a spool segment's size before the next is started (option ``segment_bytes``)
CHUNK_BYTES = 4 << 20  #: a micro-batch's bytes per task (about: chunks end at a record's end)
MARK_BYTES = 1 << 20  #: the spacing of the published marks a chunk may end at
PUBLISHED, MARKS, COMMITTED, ERROR, STOP = "published", "marks.json", "committed.json", "error", "stop"
#: A slot of ``published``: the publication's number, the end's position and records, the CRC-32 of the three.
SLOT = struct.Struct("<QQQI")


class Mark(NamedTuple):
    """A record boundary of the spool: its byte position and the records before it."""

    pos: int
    records: int


class Published(NamedTuple):
    """The receiver's durable end (``end``) and the marks before it (from about what Spark committed on)."""

    end: Mark
    marks: tuple[Mark, ...] = ()


def write_atomically(path: str, text: str) -> None:
    """``path`` holds ``text`` or what it held before, never a part (write, fsync, rename)."""
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read_end(folder: str) -> tuple[int, Mark] | None:
    """The number and the end of the last publication of the spool in ``folder``; None before the first."""
    try:
        with open(os.path.join(folder, PUBLISHED), "rb") as f:
            data = f.read(2 * SLOT.size)
    except FileNotFoundError:
        return None
    slots = [SLOT.unpack_from(data, at) for at in range(0, len(data) - SLOT.size + 1, SLOT.size)]
    valid = [(n, Mark(pos, records)) for n, pos, records, crc in slots if crc == _crc(n, pos, records)]
    return max(valid, default=None)


def _crc(*fields: int) -> int:
    return zlib.crc32(SLOT.pack(*fields, 0)[:-4])


def read_marks(folder: str) -> tuple[Mark, ...]:
    try:
        with open(os.path.join(folder, MARKS)) as f:
            return tuple(Mark(*m) for m in json.load(f))
    except FileNotFoundError:
        return ()


def read_published(folder: str) -> Published | None:
    """What the receiver of the spool in ``folder`` published last; None before it first did. (The end is read
    first: the marks, written before any end that passes them, then hold every mark before it.)"""
    end = read_end(folder)
    return None if end is None else Published(end[1], read_marks(folder))


def read_committed(folder: str) -> int:
    """The spool position Spark committed (at least: the first segment's start, what was trimmed)."""
    try:
        with open(os.path.join(folder, COMMITTED)) as f:
            return int(json.load(f)["pos"])
    except FileNotFoundError:
        return (segments(folder) or [(0, 0)])[0][0]


def publish_committed(folder: str, pos: int) -> None:
    write_atomically(os.path.join(folder, COMMITTED), json.dumps({"pos": pos}))


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
    for (first, records), (nxt, _) in pairwise(segments(folder)):
        if nxt <= pos:
            os.remove(segment_path(folder, first, records))


def cuts(start: Mark, end: Mark, marks: Sequence[Mark], chunk_bytes: int) -> list[tuple[Mark, Mark]]:
    """The chunks ``(first, last)`` of the spool range ``start`` to ``end``: each ends at a mark (or ``end``),
    the furthest within ``chunk_bytes`` of its first byte, or the next one where none is (a long record)."""
    points = [m for m in marks if start.pos < m.pos < end.pos] + [end]
    chunks, at, i = [], start, 0
    while at.pos < end.pos:
        j = i
        while j + 1 < len(points) and points[j + 1].pos - at.pos <= chunk_bytes:
            j += 1
        chunks.append((at, points[j]))
        at, i = points[j], j + 1
    return chunks


class Spool:
    """The receiver's side of the spool in ``folder``: it opens at the published end — dropping what lies past
    it (a receiver that died between an append and its publication) — and :meth:`append` makes each append
    durable, then publishes it (:meth:`write` and :meth:`sync`: several appends, one fsync and publication). Appends go to the newest segment until it holds ``segment_bytes``."""

    def __init__(self, folder: str, segment_bytes: int = SEGMENT_BYTES):
        os.makedirs(folder, exist_ok=True)
        self.folder, self.segment_bytes, self.lock = folder, segment_bytes, threading.Lock()
        last = read_end(folder)
        if last is None and segments(folder):
            raise InputError(f"the spool {folder} has no {PUBLISHED}: it was made by a yfpp that received live "
                             "sources on the driver; start this stream with a fresh checkpoint folder")
        self.number, self.end = last or (0, Mark(0, 0))
        self.durable = self.end  # the end last published
        self.marks_written = True
        self.marks = [m for m in read_marks(folder) if m.pos <= self.end.pos]  # (past it: written, never passed)
        self.write_marks()
        self.last_mark = self.marks[-1].pos if self.marks else self.end.pos  # (marks are kept this far apart)
        self.published = os.open(os.path.join(folder, PUBLISHED), os.O_RDWR | os.O_CREAT, 0o644)
        self.publish()  # (before a first segment exists: a spool with segments has a published end)
        for start, records in segments(folder):
            if start > self.end.pos:
                os.remove(segment_path(folder, start, records))
        start, records = (segments(folder) or [self.end])[-1]
        with open(segment_path(folder, start, records), "ab") as f:
            f.truncate(self.end.pos - start)
        self.segment_start = start
        self.file = open(segment_path(folder, start, records), "ab")  # noqa: SIM115 (appended to until it stops)

    @property
    def size(self) -> int:
        return self.end.pos

    def append(self, data: bytes, records: int, committed: int, inner: Iterable[Mark] = ()) -> None:
        """Append ``data`` (``records`` whole records; ``inner``: record boundaries inside it, relative to its
        start), make it durable, then publish it — and its marks, if it adds one (those after ``committed`` kept)."""
        with self.lock:
            self.write(data, records, committed, inner)
            self.sync()

    def write(self, data: bytes, records: int, committed: int, inner: Iterable[Mark] = ()) -> None:
        """Append ``data`` as :meth:`append` does, without making it durable or publishing it: :meth:`sync` does,
        for all written since (with the lock held)."""
        if self.end.pos - self.segment_start >= self.segment_bytes:
            if self.end != self.durable:  # (the segment's last bytes, before the next segment's are written)
                self.file.flush()
                os.fsync(self.file.fileno())
            self.file.close()
            self.segment_start = self.end.pos
            self.file = open(segment_path(self.folder, *self.end), "ab")  # noqa: SIM115
        self.file.write(data)
        base = self.end
        self.end = Mark(base.pos + len(data), base.records + records)
        added = []
        for m in (*(Mark(base.pos + p, base.records + r) for p, r in inner), self.end):
            if m.pos - self.last_mark >= MARK_BYTES:
                added.append(m)
                self.last_mark = m.pos
        if added:
            self.marks = [m for m in self.marks if m.pos > committed] + added
            self.marks_written = False

    def sync(self) -> None:
        """Make what :meth:`write` appended durable (one fsync), write the marks if one was added, then publish
        the end (with the lock held); nothing when nothing was written since."""
        if self.end == self.durable:
            return
        self.file.flush()
        os.fsync(self.file.fileno())
        if not self.marks_written:
            self.write_marks()
            self.marks_written = True
        self.publish()
        self.durable = self.end

    def write_marks(self) -> None:
        write_atomically(os.path.join(self.folder, MARKS), json.dumps([list(m) for m in self.marks]))

    def publish(self) -> None:
        """Publish the end: the next slot, written in place and fsynced (with the lock held, or before any append)."""
        self.number += 1
        os.pwrite(self.published, SLOT.pack(self.number, *self.end, _crc(self.number, *self.end)),
                  self.number % 2 * SLOT.size)
        os.fsync(self.published)

    def close(self) -> None:
        self.file.close()
        os.close(self.published)


def whole_lines(data: bytes) -> tuple[int, int]:
    """The length of ``data`` up to its last newline, and its lines."""
    cut = data.rfind(b"\n") + 1
    return cut, data.count(b"\n", 0, cut)


def line_marks(data: bytes, every: int) -> list[Mark]:
    """Line ends of ``data`` about ``every`` bytes apart (relative to its start; its end not included)."""
    out, at, lines = [], 0, 0
    while (nl := data.find(b"\n", at + every - 1)) >= 0 and nl + 1 < len(data):
        lines += data.count(b"\n", at, nl + 1)
        at = nl + 1
        out.append(Mark(at, lines))
    return out
