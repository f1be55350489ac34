"""What a block of JSON lines holds, read without parsing it: each line's ts and key values.

``yfpp run --workers N`` has every worker read the whole file and parse only its own lines
(yfpp/workers/reading.py); which lines are its own it learns from :func:`scan_block`, which finds each
line's ts and the values of the routing attributes with a few passes of C code over the block.

A block is scanned only when no line holds a backslash or a ``\r`` and each line names the ts field once,
with a number, and each routing attribute once, with an integer or a string — else :func:`scan_block`
gives None (the caller parses the block). Without a backslash no quote is escaped and no key is written
with escapes, so a line the parser takes as an event has its ts key where the scan found it: the scanned
ts is its ts. A routing attribute named once is the event's attribute, with the scanned value
(:func:`key_values`), unless the name is nested (``{"n": {"k": 1}}``): then the event lacks it, and
the caller checks that an event it parsed has the attribute. A line the parser refuses may have any
scanned values.

For keyed groups :func:`parsed_scan` finds the same by parsing the block once (one orjson call, as the reader
parses a block of the plain shape) and keeps the records, so that the scanning worker builds its own lines'
events from them instead of parsing those lines again.
"""

from __future__ import annotations

import math
import re
from functools import lru_cache
from itertools import repeat
from operator import itemgetter
from typing import Any, Sequence

import orjson

from yfpp.input.jsonl_reader import plain_records
from yfpp.input.record_fields import ISO_8601, ReaderOptions

# a number's characters (float() refuses what is no number; a line the parser takes has a JSON number there)
_NUMBER = rb"-?[0-9][0-9.eE+-]*"
_VALUE = rb'0|-?[1-9][0-9]*|"[^"\n]*"'  # an integer as JSON writes it (so one text per value), or a string


@lru_cache(maxsize=64)
def _field(name: str, value: bytes) -> re.Pattern[bytes]:
    """``"name": value`` and the rest of its line (so at most one match per line)."""
    return re.compile(rb'"%s"[ \t]*:[ \t]*(%s)[ \t]*[,}][^\n]*' % (re.escape(name.encode()), value))


def scan_block(body: bytes, opts: ReaderOptions, keys: Sequence[str]) -> tuple[list[float], list[list[Any]]] | None:
    """Each line's ts (scaled as the reader scales it) and, per name of ``keys``, each line's value (an integer or
    a string, :func:`key_values`); None unless every line of ``body`` (complete lines, ``\\n``-terminated but maybe
    the last) has the shape of the module docstring."""
    if opts.unit is ISO_8601 or b"\\" in body or b"\r" in body:
        return None
    lines = body.count(b"\n") + (body[-1:] != b"\n")
    raw = _field(opts.ts_field, _NUMBER).findall(body)
    if len(raw) != lines or body.count(b'"%s"' % opts.ts_field.encode()) != lines:
        return None
    try:
        m, d = opts.unit
        if m == d == 1:
            ts = list(map(float, raw))
        else:
            numbers: list[Any] = orjson.loads(b"[" + b",".join(raw) + b"]")
            ts = [r * m / d for r in numbers]
    except (ValueError, OverflowError):  # (orjson.JSONDecodeError is a ValueError)
        return None
    if not math.isfinite(sum(ts)):  # (1e999: a dead letter; a sum past the floats: not scanned)
        return None
    values = []
    for name in keys:
        found = _field(name, _VALUE).findall(body)
        if len(found) != lines or body.count(b'"%s"' % name.encode()) != lines:
            return None
        values.append(key_values(found))
    return ts, values


def key_values(texts: list[bytes]) -> list[int | str]:
    """The values of JSON integers and strings without escapes, as a parser reads them (a line's bytes that are no
    UTF-8 kept as surrogates: that line is a dead letter); in C passes where they are all of one kind."""
    quotes = sum(map(bytes.count, texts, repeat(b'"')))
    if quotes == 0:
        return list(map(int, texts))
    if quotes == 2 * len(texts):  # (no string holds a quote: joined, they are cut at each pair of quotes)
        return b"".join(texts)[1:-1].decode("utf-8", "surrogateescape").split('""')
    return [int(t) if t[:1] != b'"' else t[1:-1].decode("utf-8", "surrogateescape") for t in texts]


def parsed_scan(body: bytes, opts: ReaderOptions) -> tuple[list[float], list[dict[str, Any]]] | None:
    """Each line's ts (scaled as the reader scales it) and the lines' records, from one parse of the block
    (:func:`~yfpp.input.jsonl_reader.plain_records`); None unless every line is of the plain shape, without
    ``\\r``, with a number as ts (a boolean passes as one: its line is no plain event). The caller looks up the
    routing values in the records: a flat object's value is a number, a string, a boolean or null. A record that is
    no plain event (an empty type, a null value) may be a dead letter: the caller parses its line again to learn what
    it is."""
    if b"\r" in body:
        return None
    records = plain_records(body, opts)
    if records is None:
        return None
    try:
        raw = list(map(itemgetter(opts.ts_field), records))
        m, d = opts.unit
        ts = raw if m == d == 1 else [r * m / d for r in raw]
        # (a sum of numbers: a string or a null among them is a TypeError; a boolean counts as the number it is, its
        # line no plain event, which its worker parses again; an integer sum is exact, a float one overflows to inf)
        if not math.isfinite(sum(ts)):
            return None
    except KeyError:  # (a line naming the ts as a value only)
        return None
    except (TypeError, OverflowError):  # (a ts of no number; an integer past the floats)
        return None
    return ts, records
