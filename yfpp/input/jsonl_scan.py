"""What a block of JSON lines holds, read without parsing it: each line's ts and key values.

``yfpp run --workers N`` has every worker read the whole file and parse only its own lines
(yfpp/workers_reading.py); which lines are its own it learns from :func:`scan_block`, which finds each
line's ts and the values of the routing attributes with a few passes of C code over the block.

A block is scanned only when every line has the plain shape — one flat object ``{`` … ``}`` (no other
brace or bracket, no backslash, no ``\\r``), the ts field named once with a number, each routing
attribute named once with an integer or a string — else :func:`scan_block` gives None (the caller
parses the block). Without a backslash no quote is escaped, and without nesting every ``"name":`` is a
top-level key, so for each line that the parser takes as an event the scanned ts is its ts and the
scanned value is the routing text (:func:`routing_text`) of its attribute; a line it refuses may have
any scanned values.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Any, Sequence

import orjson

from yfpp.input.record_fields import ISO_8601, ReaderOptions

_NUMBER = rb"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?"
_VALUE = rb'0|-?[1-9][0-9]*|"[^"\n]*"'  # an integer as JSON writes it (so one text per value), or a string


@lru_cache(maxsize=64)
def _field(name: str, value: bytes) -> re.Pattern[bytes]:
    """``"name": value`` and the rest of its line (so at most one match per line)."""
    return re.compile(rb'"%s"[ \t]*:[ \t]*(%s)[ \t]*[,}][^\n]*' % (re.escape(name.encode()), value))


def scan_block(body: bytes, opts: ReaderOptions, keys: Sequence[str]) -> tuple[list[float], list[list[bytes]]] | None:
    """Each line's ts (scaled as the reader scales it) and, per name of ``keys``, each line's value as JSON
    text; None unless every line of ``body`` (complete lines, ``\\n``-terminated but maybe the last) has the
    plain shape of the module docstring."""
    if opts.unit is ISO_8601 or b"\\" in body or b"[" in body or b"\r" in body:
        return None
    text = body[:-1] if body[-1:] == b"\n" else body
    lines = text.count(b"\n") + 1
    if (text[:1] != b"{" or text[-1:] != b"}" or text.count(b"{") != lines or text.count(b"}") != lines
            or text.count(b"}\n{") != lines - 1):
        return None
    raw = _field(opts.ts_field, _NUMBER).findall(text)
    if len(raw) != lines or text.count(b'"%s"' % opts.ts_field.encode()) != lines:
        return None
    try:
        numbers: list[Any] = orjson.loads(b"[" + b",".join(raw) + b"]")
        m, d = opts.unit
        ts = [float(r) for r in numbers] if m == d == 1 else [r * m / d for r in numbers]
    except (orjson.JSONDecodeError, OverflowError):
        return None
    values = []
    for name in keys:
        found = _field(name, _VALUE).findall(text)
        if len(found) != lines or text.count(b'"%s"' % name.encode()) != lines:
            return None
        values.append(found)
    return ts, values


def routing_text(value: Any) -> bytes:
    """The text :func:`scan_block` finds for an attribute's value, made from the parsed value; values equal in
    Python (``1``, ``1.0``, ``True``) get one text, so one key goes to one worker however it is written."""
    if type(value) is str:
        return b'"%s"' % value.encode("utf-8", "surrogatepass")
    if isinstance(value, (bool, int)) or (type(value) is float and value.is_integer()):
        return str(int(value)).encode()
    return repr(value).encode()
