"""Plain JSON lines routed unparsed: a compiled scan of a byte range (numba; optional, the job runs without it).

The scan plan's read task (:func:`yfpp.spark.scan.read_task`) of a job whose one group is keyed by one
attribute hands this module a byte range of plain JSON lines. One pass of code compiled by numba finds
each line's end, whether the line is *plain* (below), its ts and its key's :func:`~yfpp.spark.scan.value_hash`;
a second pass groups a chunk's lines by matching task (hash modulo the tasks). The lines travel whole, and
the matching task reads them as ``yfpp run``'s reader reads a block of plain lines (:class:`LineReader`: one
orjson call a block — without the bulk path's checks of the block, which the scan has made line by line —
and the reader's ``plain_events``) — so each event is built once, where it is matched.

A line is plain when it is what the reader's bulk path reads as an event with the ts and key the scan
found, which the scan makes sure of by taking only lines that are

* one flat object, ``{`` its first byte and ``}`` its last (blanks and tabs between the tokens), of ASCII
  without a backslash, a control character, a brace or a bracket in its strings — so no string is escaped
  and its bytes are its text — and no string value that spells the type or the ts field's name (the bulk
  path counts braces, brackets and those names);
* of values that are each a string, ``true``, ``false`` or a JSON number without an exponent of at most
  18 digits before its point (no ``null``, array or object; no float of 2⁶³ or more);
* naming the type field once, with a non-empty string; the ts field once, with an integer of at most 15
  digits whose scaled value the float division gives exactly (``|ts × multiplier| ≤ 2⁵³``, as the reader's
  ``raw * m / d`` rounds); and the key attribute once, with a string (hashed by CRC-32, as ``value_hash``
  hashes text) or an integer (Python's hash of it).

Any other line — and a range with a ``\\r``, a byte-order mark or a line over :data:`MAX_LINE_BYTES` —
is left to the reader on the read task (:func:`scan_range` says which).
"""

from __future__ import annotations

import functools
import importlib.util
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Iterator, NamedTuple

import numpy as np
import orjson

from yfpp.input.events import Event
from yfpp.input.jsonl_reader import plain_events
from yfpp.input.record_fields import ISO_8601, READ_BLOCK, ReaderOptions
from yfpp.spark.machine_cache import import_stable

#: A blob's head: its line count (int32) and its first line's ts (float64).
HEAD = 12
#: A range with a line longer than this is read by the reader (a matching task reads its lines a ``READ_BLOCK``
#: and a line at a time, and the reader's bulk path takes at most ``max_record_bytes`` at once); a chunk of
#: lines is at most this long too.
MAX_LINE_BYTES = 1 << 19
_BOM = b"\xef\xbb\xbf"
_NEWLINE = 10


def available() -> bool:
    """Can this Python scan lines (numba is installed: pip install numba)?"""
    return _kernels() is not None


@dataclass(frozen=True)
class LineSpec:
    """What a scan looks for: the type, ts and key field names (ASCII, no quote or backslash) and the ts
    unit's multiplier and divisor."""

    type_field: bytes
    ts_field: bytes
    key: bytes
    mul: int
    div: int

    @classmethod
    def of(cls, opts: ReaderOptions, key: str) -> LineSpec | None:
        """The spec for reading ``opts`` and key attribute ``key``; None where no line could be plain (ISO-8601
        ts, a name that needs escapes, the key or the type the ts field)."""
        names = (opts.type_field or "type", opts.ts_field, key)
        if opts.unit is ISO_8601 or len(set(names)) < 3 or not all(_plain_name(n) for n in names):
            return None
        mul, div = opts.unit
        return cls(*(n.encode() for n in names), mul, div)


def _plain_name(name: str) -> bool:
    return name.isascii() and name.isprintable() and '"' not in name and "\\" not in name


class Scanned(NamedTuple):
    """A range's lines: each line's end (the offset after its ``\\n``), whether it is plain, and for a plain
    line its ts and matching task (its key's hash modulo the tasks)."""

    ends: np.ndarray
    plain: np.ndarray
    ts: np.ndarray
    tasks: np.ndarray


def scan_range(data: bytes, spec: LineSpec, n: int) -> Scanned | None:
    """The lines of ``data`` (complete lines, the last ``\\n``-terminated) scanned for ``n`` tasks; None when
    the range is left to the reader: no numba here, a ``\\r`` (a line end of the reader's too), a
    byte-order mark first (the reader drops it), or a line over :data:`MAX_LINE_BYTES`."""
    kernels = _kernels()
    if kernels is None or not data or b"\r" in data or data.startswith(_BOM):
        return None
    arr = np.frombuffer(data, np.uint8)
    ends = np.flatnonzero(arr == _NEWLINE) + 1
    plain, ts, hashes = kernels.scan(arr, ends, *_spec_arrays(spec), spec.mul, spec.div)
    if np.diff(ends, prepend=0).max() > MAX_LINE_BYTES:
        return None
    return Scanned(ends, plain.view(np.bool_), ts, np.mod(hashes, n))


def chunk_ends(scanned: Scanned, start: int, lines: int) -> int:
    """The line after a chunk that begins at line ``start``: at most ``lines`` lines and
    :data:`MAX_LINE_BYTES` bytes (at least one line)."""
    ends = scanned.ends
    first = ends[start - 1] if start else 0
    fit = int(np.searchsorted(ends, first + MAX_LINE_BYTES, "right"))
    return max(start + 1, min(start + lines, fit))


def chunk_is_plain(scanned: Scanned, a: int, b: int, hi: float | None) -> bool:
    """Are lines ``a`` to ``b`` all plain, with ts in order and none below ``hi`` (no late event)?"""
    ts = scanned.ts[a:b]
    return bool(scanned.plain[a:b].all() and (hi is None or ts[0] >= hi) and (ts[1:] >= ts[:-1]).all())


def plain_run(scanned: Scanned, a: int, b: int, lines: int, most: int) -> int:
    """The line after the plain lines from ``a`` on: lines ``a`` to ``b`` (plain: :func:`chunk_is_plain`) and the
    plain chunks of :func:`chunk_ends` (``lines`` lines) after them that continue their ts order, while all of them
    hold at most ``most`` bytes — so that many tasks get blobs of many lines each, not a chunk's share."""
    ends = scanned.ends
    limit = (int(ends[a - 1]) if a else 0) + most
    while b < len(ends):
        c = chunk_ends(scanned, b, lines)
        if int(ends[c - 1]) > limit or not chunk_is_plain(scanned, b, c, float(scanned.ts[b - 1])):
            break
        b = c
    return b


def group_lines(data: bytes, scanned: Scanned, a: int, b: int, seq: int, n: int) -> list[tuple[int, bytes]]:
    """Lines ``a`` to ``b`` of ``data`` grouped by task, in order: ``(task, blob)`` for each task with lines, the
    blob its lines' count, the first one's ts (the smallest: a chunk's lines are in ts order), their record indexes
    (``seq`` on, int32) and their bytes (:class:`LineReader` reads them)."""
    first = int(scanned.ends[a - 1]) if a else 0
    out, blob_at = _kernels().group(np.frombuffer(data, np.uint8), first, scanned.ends[a:b], scanned.tasks[a:b],
                                    scanned.ts[a:b], seq, n, HEAD)
    at = blob_at.tolist()
    return [(t, out[at[t]:at[t + 1]].tobytes()) for t in range(n) if at[t + 1] > at[t]]


def blob_low(blob: bytes) -> float:
    """The smallest ts of a :func:`group_lines` blob's lines."""
    return float(np.frombuffer(blob, np.float64, 1, 4)[0])


class LineReader:
    """The lines of :func:`group_lines` blobs read as ``yfpp run``'s reader reads plain lines (one orjson call, then
    ``plain_events``) a ``READ_BLOCK`` of bytes at a time, across blobs: a matching task that gets many small blobs
    (of many byte ranges) reads their lines in the reader's blocks, one call each, not one a blob. Each line's seq
    is its blob's ``base`` plus its record index."""

    def __init__(self, opts: ReaderOptions):
        self.opts = opts
        self.bodies: list[Any] = []
        self.seqs: list[np.ndarray] = []
        self.size = 0

    def add(self, blob: bytes, base: int) -> None:
        """Hold a blob's lines, to be read by :meth:`blocks`."""
        k = int(np.frombuffer(blob, np.int32, 1)[0])
        self.seqs.append(np.frombuffer(blob, np.int32, k, HEAD).astype(np.int64) + base)  # (base + an int32 would
        view = memoryview(blob)[HEAD + 4 * k:]                                             # wrap past 2**31 events)
        self.bodies.append(view)
        self.size += len(view)

    def blocks(self, final: bool = False) -> Iterator[list[Event]]:
        """The events of the lines held, a batch per ``READ_BLOCK`` bytes or so (as ``yfpp run``'s reader reads:
        the records just parsed are matched while they are in the processor's cache); unless ``final``, the lines
        after the last whole block are kept for the blobs to come."""
        if not self.bodies or (not final and self.size < READ_BLOCK):
            return
        body = bytes(self.bodies[0]) if len(self.bodies) == 1 else b"".join(self.bodies)
        seqs = np.concatenate(self.seqs) if len(self.seqs) > 1 else self.seqs[0]
        numbers = seqs.tolist()
        start = first = 0
        while start < len(body):
            end = body.find(b"\n", start + READ_BLOCK) + 1
            if not end:
                if not final:
                    break
                end = len(body)
            records = orjson.loads(b"[" + body[start:end - 1].replace(b"\n", b",") + b"]")  # (the scan checked them)
            lines = body.count(b"\n", start, end)
            events = plain_events(records, numbers[first:first + lines], self.opts) if len(records) == lines else None
            if events is None:
                raise RuntimeError("the line scan took a line that yfpp's reader does not read as a plain event")
            yield events
            start, first = end, first + lines
        self.bodies, self.seqs, self.size = ([body[start:]], [seqs[first:]], len(body) - start) if start < len(body) \
            else ([], [], 0)


def _spec_arrays(spec: LineSpec) -> tuple[np.ndarray, ...]:
    return tuple(np.frombuffer(n, np.uint8) for n in (spec.type_field, spec.ts_field, spec.key))


def warm() -> bool:
    """Load the kernels into this process — from numba's cache, or compiled — by scanning and grouping two plain
    lines, with the argument types of a job's calls (a Python worker that runs this before a job's tasks spares
    them the load); False without numba."""
    scanned = scan_range(_SAMPLE, _SAMPLE_SPEC, 2)
    if scanned is None:
        return False
    group_lines(_SAMPLE, scanned, 0, len(scanned.ends), 0, 2)
    return True


_SAMPLE = b'{"type":"a","ts":1,"k":"x"}\n{"type":"a","ts":2,"k":7}\n'
_SAMPLE_SPEC = LineSpec(b"type", b"ts", b"k", 1, 1)


@functools.cache
def _kernels() -> ModuleType | None:
    """:mod:`yfpp.spark.line_kernels` imported once, from its copy in the machine's cache
    (:func:`~yfpp.spark.machine_cache.import_stable`: numba's cache of it then serves every application), each
    kernel compiled or loaded from numba's cache on its first call; None without numba (or with one that does
    not import)."""
    try:
        if importlib.util.find_spec("numba") is None:
            return None
        return import_stable("yfpp.spark.line_kernels")
    except ImportError:
        return None
