"""Executor side of reading: the project's readers over the bytes Spark read (no pyspark import here).

Spark reads the input through its own file system layer (any Hadoop URI) in
one of two shapes, and :func:`parse_batches` (a ``mapInArrow`` function) runs
:func:`yfpp.input.readers.read_event_batches` over them:

* a **whole file** per row (``binaryFile``): XML, gzip, a small JSON-lines
  file, or any file whose name is not a plain JSON-lines name — parsed in one go;
* the **lines of a split** of a plain JSON-lines file (``text``, split by
  Spark at line boundaries), one row per line ending with ``\n`` (added in
  the JVM), the split named by its start offset — the lines of an Arrow batch
  handed to the reader as one piece of bytes (no Python object per line),
  counting on across batches.

Output is built column by column (a list per column, one Arrow array each)
from the readers' event lists. Every record gives a row (events and malformed
records alike) with its split's id (:func:`split_id`, a 64-bit hash of path
and offset), its index ``pos`` and line within its split and, for an event,
the largest ts before it in the split; after the last record of a split comes
one summary row — the only row carrying the split's ``path`` and ``block`` —
(``n`` = records, ``dead`` = malformed records, ``line`` = lines, ``ts`` =
largest ts, ``prev_max`` = smallest ts, ``pos`` = the events below a larger
ts before them in the split)
from which the driver computes global seq numbers and late events
(:mod:`yfpp.spark.read`).

Options (a dict): ``ts_field``, ``ts_unit`` (``iso``: ISO-8601 text), ``type_field``, ``format`` (the
readers' arguments, :func:`reader_kwargs`); ``xml`` (default
true): ship each XML event's element as text (only XPath predicates read it);
``keys``: equivalence lists whose key hash (:func:`key_hash`) each event
carries in ``key_hashes`` (``"a,b"`` → hash, null when the event lacks one),
so the routing needs no JSON parsing in the JVM; ``bad_files`` (default
false): a whole file the readers cannot read (neither XML nor JSON lines, a
corrupt gzip stream) is a dead letter after the records read before the damage,
position ``""`` (the file; a stream must go on), rather than an
:class:`~yfpp.errors.InputError` naming it (which fails a batch job).
"""

from __future__ import annotations

import hashlib
import io
import json
import re
import zlib
from typing import Any, Iterator, Sequence
from urllib.parse import unquote

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc
from lxml import etree

from yfpp.input.dead_letters import DeadLetters
from yfpp.errors import InputError
from yfpp.input.events import MISSING, PSEUDO_ATTRS, Event
from yfpp.input.readers import format_of, read_event_batches, read_events
from yfpp.spark.inputs import local_path

#: Rows of :func:`parse_batches`: a record (``n`` null) or a split's summary (``n``, ``path``, ``block`` set).
PARSED_SCHEMA = ("split long, pos long, line long, prev_max double, type string, ts double, attrs string, "
                 "xml string, reason string, position string, raw string, n long, key_hashes map<string, bigint>, "
                 "path string, block long, dead long")
_ARROW = pa.schema([
    ("split", pa.int64()), ("pos", pa.int64()), ("line", pa.int64()), ("prev_max", pa.float64()),
    ("type", pa.string()), ("ts", pa.float64()), ("attrs", pa.string()), ("xml", pa.string()), ("reason", pa.string()),
    ("position", pa.string()), ("raw", pa.string()), ("n", pa.int64()),
    ("key_hashes", pa.map_(pa.string(), pa.int64())), ("path", pa.string()), ("block", pa.int64()), ("dead", pa.int64()),
])
_LINE = re.compile(r"line (\d+)")


class _Collect(DeadLetters):
    """Dead letters kept as ``(pos, position, reason, raw)`` until the caller takes them."""

    def __init__(self) -> None:
        super().__init__()
        self.items: list[tuple[int, str, str, str | None]] = []

    def report(self, seq: int, position: str, reason: str, raw: str | None = None) -> None:
        super().report(seq, position, reason, raw)
        self.items.append((seq, position, reason, raw))


def reader_kwargs(options: dict[str, Any]) -> dict[str, Any]:
    """The readers' keyword arguments among ``options``: ``ts_field``, ``ts_unit``, ``type_field``."""
    return {"ts_field": options.get("ts_field", "ts"), "ts_unit": options.get("ts_unit", "s"),
            "type_field": options.get("type_field") or None}


def records(source: Any, options: dict[str, Any]) -> Iterator[tuple]:
    """``(pos, type, ts, attrs JSON, xml, reason, position, raw)`` for every record of ``source``, in order
    (the socket source's rows, :mod:`yfpp.spark.source`)."""
    dead = _Collect()
    with_xml = options.get("xml", True)
    events = read_events(source, options.get("format") or None, **reader_kwargs(options), dead_letters=dead)
    for ev in events:
        if dead.items:
            yield from _drain(dead)
        el = ev._element
        xml = etree.tostring(el, encoding="unicode", with_tail=False) if with_xml and el is not None else None
        yield ev.seq, ev.type, float(ev.ts), json.dumps(ev.attrs), xml, None, None, None
    yield from _drain(dead)


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


def _drain(dead: _Collect) -> Iterator[tuple]:
    for pos, position, reason, raw in dead.items:
        yield pos, None, None, None, None, reason, position, raw
    dead.items.clear()


def split_id(path: str, block: int) -> int:
    """The 64-bit id of the split of ``path`` starting at byte ``block`` (a hash: the driver checks that
    the input's splits have distinct ids, see :func:`yfpp.spark.read.split_offsets`)."""
    digest = hashlib.blake2b(f"{path}\x00{block}".encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


class _Split:
    """The running counts of one split: records, lines, the smallest and largest ts so far."""

    def __init__(self, path: str, block: int):
        self.path, self.block, self.id = path, block, split_id(path, block)
        self.n = self.lines = self.dead = 0
        self.max_ts: float | None = None
        self.min_ts: float | None = None
        self.late = 0  # events with ts below the largest ts before them in the split

    def read(self, source: Any, fmt: str | None, lines: int, options: dict[str, Any],
             out: "_Columns") -> Iterator[pa.RecordBatch]:
        """Parse ``source`` (``lines`` more lines of this split; 0: a whole file) into ``out``'s rows,
        yielding them as a batch whenever there are :data:`_BATCH_ROWS` (memory stays bounded in a big file)."""
        dead = _Collect()
        base_pos, base_line, last = self.n, self.lines, -1
        try:
            for events in read_event_batches(source, fmt, **reader_kwargs(options), dead_letters=dead):
                if dead.items:
                    last = max(last, out.dead(self, dead.items, base_pos, base_line))
                out.events(self, events, base_pos, options.get("xml", True))
                last = max(last, events[-1].seq)
                if len(out) >= _BATCH_ROWS:
                    yield out.batch()
        except InputError as e:
            if not options.get("bad_files"):
                raise
            last = max([last, *(seq for seq, *_ in dead.items)])
            dead.report(last + 1, "", str(e))  # the file itself, after its records
        finally:
            if dead.items:
                last = max(last, out.dead(self, dead.items, base_pos, base_line))
        self.n = base_pos + last + 1
        self.lines += lines


class _Columns:
    """:data:`PARSED_SCHEMA` rows being built, a list per column, until :meth:`batch` takes them."""

    def __init__(self, keys: Sequence[Sequence[str]]):
        self.keys = [(",".join(k), tuple(k)) for k in keys]
        self.names = [n for n, _ in self.keys]
        self.memos: list[dict[Any, int | None]] = [{} for _ in self.keys]  # value → key hash, per key
        self._clear()

    def _clear(self) -> None:
        self.cols: dict[str, list[Any]] = {f.name: [] for f in _ARROW if f.name != "key_hashes"}
        self.hashes: list[list[int | None]] = [[] for _ in self.keys]

    def __len__(self) -> int:
        return len(self.cols["split"])

    def _nulls(self, k: int, *names: str) -> None:
        none = [None] * k
        for name in names:
            self.cols[name].extend(none)
        for h in self.hashes:
            h.extend(none)

    def events(self, split: _Split, events: list[Event], base_pos: int, with_xml: bool) -> None:
        """Add the rows of ``events`` (in order) and count them into ``split``."""
        c, k = self.cols, len(events)
        ts = [ev.ts for ev in events]
        prev, hi, late = [], split.max_ts, split.late
        for t in ts:
            prev.append(hi)
            if hi is None or t > hi:
                hi = t
            elif t < hi:
                late += 1
        low = min(ts)
        split.max_ts, split.late = hi, late
        split.min_ts = low if split.min_ts is None or low < split.min_ts else split.min_ts
        c["split"].extend([split.id] * k)
        c["pos"].extend([ev.seq + base_pos for ev in events])
        c["prev_max"].extend(prev)
        c["type"].extend([ev.type for ev in events])
        c["ts"].extend(ts)
        c["attrs"].extend([_json(ev.attrs) for ev in events])
        tostring = etree.tostring
        c["xml"].extend([tostring(ev._element, encoding="unicode", with_tail=False) if ev._element is not None
                         else None for ev in events] if with_xml else [None] * k)
        none = [None] * k
        for name in ("line", "reason", "position", "raw", "n", "path", "block", "dead"):
            c[name].extend(none)
        for h, (_, key), memo in zip(self.hashes, self.keys, self.memos):
            h.extend(_key_hashes(events, key, memo))

    def dead(self, split: _Split, items: list[tuple[int, str, str, str | None]], base_pos: int, base_line: int,
             numbered: bool = True) -> int:
        """Add the dead letters ``items`` (and clear them); their largest record index. Not ``numbered``: they
        take no seq (an MQTT message's, :mod:`yfpp.spark.live_parse`): ``pos`` and ``line`` null."""
        c = self.cols
        for seq, position, reason, raw in items:
            m = _LINE.search(position) if numbered else None
            c["split"].append(split.id)
            c["pos"].append(seq + base_pos if numbered else None)
            c["line"].append(int(m.group(1)) + base_line if m else None)
            c["reason"].append(reason)
            c["position"].append(position)
            c["raw"].append(raw)
        self._nulls(len(items), "prev_max", "type", "ts", "attrs", "xml", "n", "path", "block", "dead")
        split.dead += len(items)
        last = max(seq for seq, *_ in items)
        items.clear()
        return last

    def summary(self, split: _Split) -> None:
        """Add ``split``'s summary row."""
        c = self.cols
        for name, value in (("split", split.id), ("pos", split.late), ("line", split.lines), ("prev_max", split.min_ts),
                            ("ts", split.max_ts), ("n", split.n), ("path", split.path), ("block", split.block),
                            ("dead", split.dead)):
            c[name].append(value)
        self._nulls(1, "type", "attrs", "xml", "reason", "position", "raw")

    def batch(self) -> pa.RecordBatch:
        """The rows added since the last call, as one Arrow batch."""
        rows = len(self)
        arrays = []
        for f in _ARROW:
            if f.name != "key_hashes":
                arrays.append(pa.array(self.cols[f.name], f.type))
            elif not self.keys:
                arrays.append(pa.nulls(rows, f.type))
            else:
                k = len(self.keys)
                values = self.hashes[0] if k == 1 else [v for vs in zip(*self.hashes) for v in vs]
                arrays.append(pa.MapArray.from_arrays(pa.array(range(0, rows * k + 1, k), pa.int32()),
                                                      pa.array(self.names * rows, pa.string()),
                                                      pa.array(values, pa.int64()), type=f.type))
        self._clear()
        return pa.RecordBatch.from_arrays(arrays, schema=_ARROW)


def _key_hashes(events: list[Event], key: tuple[str, ...], memo: dict[Any, int | None]) -> list[int | None]:
    """:func:`key_hash` of each event, remembered per value of a one-attribute key (values Python finds
    equal hash alike, so the memo may be keyed by the value; cleared past 2¹⁶ values)."""
    if len(key) > 1 or key[0] in PSEUDO_ATTRS:
        return [key_hash(ev, key) for ev in events]
    if len(memo) > 1 << 16:
        memo.clear()
    a, out = key[0], []
    for ev in events:
        v = ev.attrs.get(a, MISSING)
        try:
            out.append(memo[v])
        except KeyError:
            out.append(memo.setdefault(v, key_hash(ev, key)))
    return out


def _json(attrs: dict[str, Any]) -> bytes | str:
    """``attrs`` as a JSON object (orjson; the standard library for what orjson refuses: integers beyond
    64 bits, lone surrogates). The readers' floats are finite, so orjson never writes NaN as null."""
    try:
        return orjson.dumps(attrs)
    except TypeError:  # orjson.JSONEncodeError
        return json.dumps(attrs)


_BATCH_ROWS = 8192  # rows per output Arrow batch (about)


def parse_batches(options: dict[str, Any]) -> Any:
    """The ``mapInArrow`` function over ``(path, block, content, whole)`` rows (see the module docstring)."""

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        out = _Columns(options.get("keys", ()))
        split: _Split | None = None
        for rb in batches:
            paths, blocks, contents, whole = (rb.column(c) for c in ("path", "block", "content", "whole"))
            for a, b in _runs(paths, blocks):
                path, block = paths[a].as_py(), blocks[a].as_py()
                if split is None or (path, block) != (split.path, split.block):
                    if split is not None:
                        out.summary(split)
                    split = _Split(path, block)
                if whole[a].as_py():  # a whole file (one row)
                    fmt = options.get("format") or format_of(path)
                    for i in range(a, b):
                        yield from split.read(_named(contents[i].as_py(), path), fmt, 0, options, out)
                else:
                    yield from split.read(io.BytesIO(_piece(contents, a, b)), "jsonl", b - a, options, out)
        if split is not None:
            out.summary(split)
        if len(out):
            yield out.batch()

    return run


def _named(content: bytes, path: str) -> io.BufferedReader:
    """A file's bytes as a binary file named as the file (a local path, else the URI), for the readers' errors."""
    raw = io.BytesIO(content)
    raw.name = local_path(path) or unquote(path)  # type: ignore[attr-defined]  (BytesIO takes attributes)
    return io.BufferedReader(raw)


def _runs(paths: pa.Array, blocks: pa.Array) -> list[tuple[int, int]]:
    """The ``[a, b)`` row ranges of equal ``(path, block)``: the splits of an Arrow batch."""
    n = len(paths)
    if n < 2:
        return [(0, n)] if n else []
    change = pc.or_(pc.not_equal(paths[1:], paths[:-1]), pc.not_equal(blocks[1:], blocks[:-1]))
    edges = [0, *(np.flatnonzero(change.to_numpy(zero_copy_only=False)) + 1).tolist(), n]
    return list(zip(edges, edges[1:]))


def _piece(values: pa.Array, a: int, b: int) -> bytes:
    """Rows ``a`` to ``b`` of a binary column as one ``bytes`` (a slice of its data buffer)."""
    width = np.int64 if pa.types.is_large_binary(values.type) else np.int32
    _, offsets, data = values.buffers()
    off = np.frombuffer(offsets, dtype=width, count=len(values) + 1, offset=values.offset * np.dtype(width).itemsize)
    return data[int(off[a]):int(off[b])].to_pybytes() if data is not None else b""
