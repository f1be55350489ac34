"""Executor side of reading: the project's readers over the bytes Spark read (no pyspark import here).

Spark reads the input through its own file system layer (any Hadoop URI) in
one of two shapes, and :func:`parse_batches` (a ``mapInArrow`` function) runs
:func:`yfpp.readers.read_events` over them:

* a **whole file** per row (``binaryFile``): XML, gzip, or any file whose
  name is not a plain JSON-lines name — parsed in one go;
* the **lines of a split** of a plain JSON-lines file (``text``, split by
  Spark at line boundaries), one row per line, the split named by its start
  offset — parsed a batch of lines at a time, counting on across batches.

Every record gives a row (events and malformed records alike) with its index
``pos`` and line within its split and the largest ts before it in the split;
after the last record of a split comes one summary row (``n`` = records,
``line`` = lines, ``ts`` = largest ts, ``prev_max`` = smallest ts, ``pos`` =
the events below a larger ts before them in the split) from which the driver
computes global seq numbers and late events (:mod:`yfpp.spark.read`).

Options (a dict): ``ts_field``, ``ts_unit``, ``format``; ``xml`` (default
true): ship each XML event's element as text (only XPath predicates read it);
``keys``: equivalence lists whose key hash (:func:`key_hash`) each event
carries in ``key_hashes`` (``"a,b"`` → hash, null when the event lacks one),
so the routing needs no JSON parsing in the JVM.
"""

from __future__ import annotations

import io
import json
import re
import zlib
from typing import Any, Iterator, Sequence

import pyarrow as pa
from lxml import etree

from yfpp.dead_letters import DeadLetters
from yfpp.events import MISSING, Event
from yfpp.readers import format_of, read_events

#: Rows of :func:`parse_batches`: a record (``n`` null) or a split's summary (``n`` set).
PARSED_SCHEMA = ("path string, block long, pos long, line long, prev_max double, type string, ts double, "
                 "attrs string, xml string, reason string, position string, raw string, n long, "
                 "key_hashes map<string, bigint>")
_ARROW = pa.schema([
    ("path", pa.string()), ("block", pa.int64()), ("pos", pa.int64()), ("line", pa.int64()), ("prev_max", pa.float64()),
    ("type", pa.string()), ("ts", pa.float64()), ("attrs", pa.string()), ("xml", pa.string()), ("reason", pa.string()),
    ("position", pa.string()), ("raw", pa.string()), ("n", pa.int64()),
    ("key_hashes", pa.map_(pa.string(), pa.int64())),
])
_LINE = re.compile(r"line (\d+)")


class _Collect(DeadLetters):
    """Dead letters kept as ``(pos, position, reason, raw)`` until the caller takes them."""

    def __init__(self, where: str = "") -> None:
        super().__init__()
        self.where = where
        self.items: list[tuple[int, str, str, str | None]] = []

    def report(self, seq: int, position: str, reason: str, raw: str | None = None) -> None:
        super().report(seq, position, reason, raw)
        self.items.append((seq, f"{self.where} {position}" if self.where else position, reason, raw))


def records(source: Any, options: dict[str, Any], where: str = "", format: str | None = None,
            keys: Sequence[Sequence[str]] = ()) -> Iterator[tuple]:
    """``(pos, type, ts, attrs JSON, xml, reason, position, raw)`` for every record of ``source``, in order,
    and with ``keys`` the event's ``{"a,b": key hash}`` of each list as a ninth item (None for a dead letter).

    ``where`` (a file name) prefixes the positions of dead letters; ``format``
    overrides ``options["format"]``.
    """
    dead = _Collect(where)
    fmt = format or options.get("format") or None
    with_xml = options.get("xml", True)
    events = read_events(source, fmt, ts_field=options.get("ts_field", "ts"), ts_unit=options.get("ts_unit", "s"),
                         dead_letters=dead)
    names = [(",".join(k), k) for k in keys]
    keyed, dumps, tostring = bool(keys), json.dumps, etree.tostring
    for ev in events:
        if dead.items:
            yield from _drain(dead, keyed)
        el = ev._element
        xml = tostring(el, encoding="unicode", with_tail=False) if with_xml and el is not None else None
        if keyed:
            yield (ev.seq, ev.type, float(ev.ts), dumps(ev.attrs), xml, None, None, None,
                   {n: key_hash(ev, k) for n, k in names})
        else:
            yield ev.seq, ev.type, float(ev.ts), dumps(ev.attrs), xml, None, None, None
    yield from _drain(dead, keyed)


def key_hash(ev: Event, key: Sequence[str]) -> int | None:
    """A stable 63-bit hash of ``ev``'s values of ``key`` (None when one is missing): values Python
    finds equal hash alike (``7``, ``7.0`` and ``True``/``1`` as floats); a few unequal ones may
    collide, which only puts them in the same partition (the engine separates keys itself)."""
    parts = []
    for a in key:
        v = ev.get(a)
        if v is MISSING:
            return None
        if type(v) is not str and isinstance(v, (bool, int, float)):
            try:
                v = float(v) + 0.0  # + 0.0: -0.0 == 0.0
            except OverflowError:  # an int beyond float: equal only to itself
                pass
        parts.append(repr(v))
    text = (parts[0] if len(parts) == 1 else "\x1f".join(parts)).encode("utf-8", "surrogatepass")
    return (zlib.crc32(text) << 31) ^ zlib.adler32(text)


def _drain(dead: _Collect, keyed: bool = False) -> Iterator[tuple]:
    for pos, position, reason, raw in dead.items:
        yield (pos, None, None, None, None, reason, position, raw, *((None,) if keyed else ()))
    dead.items.clear()


class _Split:
    """The running counts of one split: records, lines and the largest ts so far."""

    def __init__(self, path: str, block: int):
        self.path, self.block = path, block
        self.n = self.lines = 0
        self.max_ts: float | None = None
        self.min_ts: float | None = None
        self.late = 0  # events with ts below the largest ts before them in the split

    def rows(self, recs: Iterator[tuple]) -> Iterator[tuple]:
        """The :data:`PARSED_SCHEMA` rows of :func:`records`' tuples, counting on (kept in locals: a hot loop)."""
        path, block, base_pos, base_line = self.path, self.block, self.n, self.lines
        n, late, lo, hi = self.n, self.late, self.min_ts, self.max_ts
        try:
            for rec in recs:
                pos, ts, reason, position = rec[0], rec[2], rec[5], rec[6]
                line = None
                if position is not None and (m := _LINE.search(position)):
                    line = int(m.group(1)) + base_line
                yield (path, block, pos + base_pos, line, hi, rec[1], ts, rec[3], rec[4], reason, position, rec[7], None,
                       rec[8] if len(rec) > 8 else None)
                n = pos + base_pos + 1
                if ts is not None:
                    if reason is None:
                        if hi is not None and ts < hi:
                            late += 1
                        if lo is None or ts < lo:
                            lo = ts
                    if hi is None or ts > hi:
                        hi = ts
        finally:
            self.n, self.late, self.min_ts, self.max_ts = n, late, lo, hi

    def summary(self) -> tuple:
        return (self.path, self.block, self.late, self.lines, self.min_ts, None, self.max_ts, None, None, None, None, None,
                self.n, None)


def parse_batches(options: dict[str, Any]) -> Any:
    """The ``mapInArrow`` function over ``(path, block, content, whole)`` rows (see the module docstring)."""

    keys = options.get("keys", ())

    def rows(batches: Iterator[pa.RecordBatch]) -> Iterator[tuple]:
        split: _Split | None = None
        lines: list[bytes] = []
        for rb in batches:
            c = rb.to_pydict()
            for path, block, content, whole in zip(c["path"], c["block"], c["content"], c["whole"]):
                if split is None or (path, block) != (split.path, split.block):
                    if split is not None:
                        yield from _lines(split, lines, options)
                        yield split.summary()
                    split = _Split(path, block)
                if whole:
                    fmt = options.get("format") or format_of(path)
                    yield from split.rows(records(io.BufferedReader(io.BytesIO(content)), options, format=fmt, keys=keys))
                else:
                    lines.append(content)
            if split is not None:
                yield from _lines(split, lines, options)
        if split is not None:
            yield split.summary()

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        out: list[tuple] = []
        for row in rows(batches):
            out.append(row)
            if len(out) >= 8192:
                yield _batch(out)
                out.clear()
        if out:
            yield _batch(out)

    return run


def _lines(split: _Split, lines: list[bytes], options: dict[str, Any]) -> Iterator[tuple]:
    """The records of the JSON lines collected for ``split`` (they continue its earlier lines)."""
    if not lines:
        return
    data, n = io.BufferedReader(io.BytesIO(b"\n".join(lines) + b"\n")), len(lines)
    lines.clear()
    yield from split.rows(records(data, options, format="jsonl", keys=options.get("keys", ())))
    split.lines += n


def _batch(rows: list[tuple]) -> pa.RecordBatch:
    cols = list(zip(*rows))
    return pa.RecordBatch.from_arrays([pa.array(col, f.type) for col, f in zip(cols, _ARROW)], schema=_ARROW)
