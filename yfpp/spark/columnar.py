"""The scan plan's columnar read side: plain JSON lines parsed by Arrow's C++ reader and routed in numpy.

A read task takes this path for a byte range only when every record in it
reads exactly as ``yfpp run``'s reader reads it (:func:`plain_tables`): each
line one flat JSON object, ASCII without escapes or control characters, no
blank line, no line over ``max_record_bytes``, its keys in the order of the
Arrow columns (so each event's attributes keep the line's order), the type a
non-empty string, ts a finite number, the ts in order, and each attribute an
integer, a non-integral float, a string or a bool (a float column holding an
integral value could have been written ``7`` or ``7.0``: left to the reader).
Anything else, and any range when the job is not one keyed group on one
attribute without hot keys (:func:`applies`), takes the reader's path. A
``null`` is a missing attribute, as the reader has it.

Each block's rows go to their key's task (:func:`route`: the key hash of
:func:`yfpp.spark.scan.value_hash`, in numpy), packed as the reader's
events are (:func:`yfpp.spark.scan._packs`: the attributes' dicts made from
the columns, :func:`attrs_of`), so the matching tasks read them as any.
"""

from __future__ import annotations

import io
import zlib
from collections.abc import Callable
from operator import itemgetter
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj

from yfpp.input.events import PSEUDO_ATTRS
from yfpp.input.record_fields import MAX_RECORD_BYTES

#: Bytes per Arrow parse (cut at a line end): Arrow's reader is cheapest per line from about 256 KB up.
BLOCK_BYTES = 1 << 20
_ATTR_TYPES = (pa.int64(), pa.float64(), pa.string(), pa.bool_(), pa.null())
_HASH_MOD = (1 << 61) - 1  # CPython's numeric hash of an int: its value modulo 2**61 - 1, sign kept, -1 → -2


def applies(groups: list[Any], hot: dict[int, Any], with_xml: bool, reading: dict[str, Any]) -> bool:
    """Can the job's read tasks ship columns? One keyed group on one attribute, no hot key, no XML, JSON
    lines with numeric ts in seconds and the type in ``type``."""
    if len(groups) != 1 or with_xml or hot.get(0) or reading.get("format") not in (None, "jsonl"):
        return False
    key = groups[0].key
    return (bool(key) and len(key) == 1 and key[0] not in PSEUDO_ATTRS and reading.get("ts_unit", "s") == "s"
            and reading.get("type_field") in (None, "type") and reading.get("ts_field", "ts") != "type")


def plain_tables(data: bytes, ts_field: str) -> list[pa.Table] | None:
    """``data`` (a range's whole lines) as Arrow tables of at most about :data:`BLOCK_BYTES` each, columns
    ``type``, ``ts`` (float64) and the attributes; None unless each record reads exactly as the reader's
    (module docstring) and the ts are in order."""
    if not data or not _plain_shape(data):
        return None
    tables = []
    start, after = 0, None
    while start < len(data):
        end = data.rfind(b"\n", start, start + BLOCK_BYTES) + 1 if len(data) - start > BLOCK_BYTES else len(data)
        if end <= start:  # a line over BLOCK_BYTES: one block
            end = data.find(b"\n", start + BLOCK_BYTES) + 1 or len(data)
        table = _table(data[start:end], ts_field)
        if table is None:
            return None
        ts = _numpy(table.column("ts"))
        if (after is not None and ts[0] < after) or (len(ts) > 1 and bool(np.any(ts[1:] < ts[:-1]))):
            return None
        after = float(ts[-1])
        tables.append(table)
        start = end
    return tables


def _plain_shape(data: bytes) -> bool:
    """Does ``data`` hold only flat one-line objects of ASCII text without escapes or control characters, none
    over the readers' ``max_record_bytes`` — counted over its bytes, in C?"""
    if not data.endswith(b"}\n") or not data.startswith(b"{") or not data.isascii() or b"\\" in data or b"[" in data:
        return False
    lines = data.count(b"\n")
    if data.count(b"}\n{") != lines - 1 or data.count(b"{") != lines or data.count(b"}") != lines:
        return False  # (each line's keys, type and ts once, are checked with the columns: _keys_in_column_order)
    a = np.frombuffer(data, np.uint8)
    if int(np.count_nonzero(a < 32)) != lines:  # the line ends only: no tab, no \r, no control character
        return False
    ends = np.flatnonzero(a == 10)
    return int(np.diff(ends, prepend=-1).max()) - 1 <= MAX_RECORD_BYTES


def _table(block: bytes, ts_field: str) -> pa.Table | None:
    """One block parsed by Arrow, or None when a value would not read as the reader reads it."""
    try:
        table = pj.read_json(io.BytesIO(block), read_options=pj.ReadOptions(use_threads=False, block_size=len(block) + 1))
    except pa.ArrowException:
        return None
    names = table.column_names
    if "type" not in names or ts_field not in names or len(set(names)) != len(names):
        return None
    kind, ts = table.column("type"), table.column(ts_field)
    if kind.type != pa.string() or kind.null_count or ts.null_count or ts.type not in (pa.int64(), pa.float64()):
        return None
    if int(pc.min(pc.utf8_length(kind)).as_py()) == 0:
        return None
    ts = ts.cast(pa.float64(), safe=False).combine_chunks()  # an int ts as float(ts), rounded to nearest
    if not np.isfinite(_numpy(ts)).all():
        return None
    attrs = [n for n in names if n not in ("type", ts_field)]
    for n in attrs:
        col = table.column(n)
        if col.type not in _ATTR_TYPES:
            return None
        if col.type == pa.float64():
            v = _numpy(col.drop_null())
            if np.any(v == np.floor(v)):  # written 7 or 7.0? (the reader keeps 7 an int); also ±inf
                return None
    if not _keys_in_column_order(block, table, attrs, ts_field):
        return None
    return pa.table([kind, ts] + [table.column(n) for n in attrs if table.column(n).type != pa.null()],
                    names=["type", "ts"] + [n for n in attrs if table.column(n).type != pa.null()])


def _keys_in_column_order(block: bytes, table: pa.Table, attrs: list[str], ts_field: str) -> bool:
    """Does every line name its keys once each, type and ts first, the attributes in the order of ``attrs`` (the
    Arrow columns) — so that the attributes made from the columns have the line's order? The keys' text is
    gathered from the block (a string followed by ``:``; no escapes, so quotes pair) and compared with what
    the columns say each line holds, in C and numpy."""
    a = np.frombuffer(block, np.uint8)
    quotes = np.flatnonzero(a == 34)
    if len(quotes) % 2:
        return False
    starts, ends = quotes[0::2], quotes[1::2] + 1
    is_key = a[np.minimum(ends, len(a) - 1)] == 58  # ':' right after the closing quote
    starts, ends = starts[is_key], ends[is_key]
    lengths = ends - starts
    gather = np.repeat(starts - np.concatenate(([0], np.cumsum(lengths)[:-1])), lengths) + np.arange(int(lengths.sum()))
    found = a[gather].tobytes()
    head = b'"type""%s"' % ts_field.encode()
    quoted = [b'"%s"' % n.encode() for n in attrs]
    present = np.zeros(table.num_rows, np.int64)
    for i, n in enumerate(attrs):
        col = table.column(n)
        if col.null_count < len(col):
            valid = _numpy(col.is_valid()) if col.null_count else np.ones(len(col), bool)
            present |= valid.astype(np.int64) << i
    # a null in the line is a key the columns do not show: such a line does not compare equal (reader's path)
    skeleton = {int(p): head + b"".join(q for i, q in enumerate(quoted) if p >> i & 1) for p in np.unique(present)}
    return found == b"".join(map(skeleton.__getitem__, present.tolist()))


def _numpy(col: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """A numeric or bool column as a numpy array, a null's slot holding any value (``to_numpy`` imports
    pandas, as Arrow's functions given a Python scalar do: a fifth of a second in a process that has not)."""
    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    if arr.type == pa.bool_():
        return _numpy(arr.cast(pa.int8())).view(np.bool_)
    values = np.frombuffer(arr.buffers()[1], arr.type.to_pandas_dtype())  # (its to_numpy imports pandas too)
    return values[arr.offset:arr.offset + len(arr)]


def _arrow(ints: np.ndarray) -> pa.Array:
    """Integers as an Arrow int64 array (``pa.array`` of a numpy array imports pandas)."""
    values = np.ascontiguousarray(ints, dtype=np.int64)
    return pa.Array.from_buffers(pa.int64(), len(values), [None, pa.py_buffer(values)])


def route(table: pa.Table, key: str, n: int) -> np.ndarray | None:
    """The matching task of each row (its key's :func:`yfpp.spark.scan.value_hash` modulo ``n``), ``n`` for a
    row without the key; None when the key column is of a type hashed otherwise (a float)."""
    if key not in table.column_names:
        return np.full(table.num_rows, n, np.int64)
    col = table.column(key).combine_chunks()
    if col.type == pa.int64() or col.type == pa.bool_():
        v = _numpy(col.cast(pa.int64()))  # (a null's slot holds any value: its row goes to n below)
        if len(v) and int(v.min()) == -(2**63):  # (its negation overflows: left to the reader's path)
            return None
        h = np.where(v >= 0, v % _HASH_MOD, -((-v) % _HASH_MOD))
        h[h == -1] = -2
    elif col.type == pa.string():
        codes = col.dictionary_encode()
        crcs = np.array([zlib.crc32(s.encode()) for s in codes.dictionary.to_pylist()] or [0], np.int64)
        h = crcs[np.clip(_numpy(codes.indices), 0, len(crcs) - 1)]
    else:
        return None
    dest = h % n
    if col.null_count:
        dest[_numpy(col.is_null())] = n
    return dest


def attrs_of(table: pa.Table) -> list[dict[str, Any]]:
    """Each row's attributes (the columns after type and ts, in their order; a null one left out): the rows
    grouped by which columns they have, each group's dicts made by one function."""
    names = table.column_names[2:]
    cols = [table.column(n) for n in names]
    present = None
    for i, col in enumerate(cols):
        if col.null_count:
            bits = _numpy(col.is_valid()).astype(np.int64) << i
            present = bits if present is None else present | bits
    if present is None:
        return _dicts(tuple(names), [pylist(c) for c in cols], table.num_rows)
    full = sum(1 << i for i, c in enumerate(cols) if not c.null_count)
    present |= full
    out = np.empty(table.num_rows, dtype=object)
    for p in np.unique(present).tolist():
        idx = np.flatnonzero(present == p)
        keep = [i for i in range(len(cols)) if p >> i & 1]
        taken = _arrow(idx)
        out[idx] = _dicts(tuple(names[i] for i in keep), [pylist(cols[i].take(taken)) for i in keep], len(idx))
    return out.tolist()


def pylist(col: pa.Array | pa.ChunkedArray) -> list[Any]:
    """A column without nulls as a list of Python values, through numpy (Arrow's ``to_pylist`` boxes each value
    as a scalar first: several times slower); strings through their dictionary."""
    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    if arr.type == pa.string():
        codes = arr.dictionary_encode()
        words = codes.dictionary.to_pylist()
        if len(words) <= 1:
            return words * len(arr)
        return list(itemgetter(*_numpy(codes.indices).tolist())(words))
    return _numpy(arr).tolist()  # (a bool column's as bools)


def _dicts(names: tuple[str, ...], values: list[list[Any]], count: int) -> list[dict[str, Any]]:
    """``count`` dicts of the attributes ``names``, their values by column."""
    if not names:
        return [{} for _ in range(count)]
    return list(map(_maker(names), *values))


_MAKERS: dict[tuple[str, ...], Callable[..., dict[str, Any]]] = {}


def _maker(names: tuple[str, ...]) -> Callable[..., dict[str, Any]]:
    """A function of the attributes' values making their dict (a dict display: a third of ``dict(zip())``'s time)."""
    f = _MAKERS.get(names)
    if f is None:
        args = [f"v{i}" for i in range(len(names))]
        f = _MAKERS[names] = eval(f"lambda {', '.join(args)}: {{{', '.join(f'{n!r}: {a}' for n, a in zip(names, args))}}}")
    return f
