"""Stable match ids: the same match gets the same id in every run, restore and Spark job.

A receiver that may see a match twice (at-least-once delivery after a restore, a
retried sink) drops repeats by this id.  It depends only on the query's name, the
match's bindings (the seqs of the events it binds) and its ``start`` and ``end``
timestamps, never on when or where it was computed.  The timestamps keep apart two
different matches whose events got the same seqs: a service restored from a
checkpoint numbers its events again from the checkpoint's position, so events fed
after a crash can reuse the seqs of events matched (and delivered) before it.
"""

from __future__ import annotations

import hashlib
import json
import struct
from typing import Any, Callable, Mapping

import orjson

_COMPACT = json.JSONEncoder(separators=(",", ":"), default=str)  # what json.dumps(…, separators, default) builds per call
_PLAIN = frozenset(chr(c) for c in range(0x20, 0x7F)) - {'"', "\\"}
_TIMES = struct.Struct("<dd").pack  #: start and end as two little-endian doubles


def match_id(query: Any, bindings: Mapping[str, list], start: float, end: float) -> str:
    """16 hex digits of a BLAKE2b hash of ``[query, bindings]`` in compact JSON, then ``start`` and ``end``
    as two little-endian doubles."""
    text = _COMPACT.encode([query, bindings])
    return hashlib.blake2b(text.encode() + _TIMES(start, end), digest_size=8).hexdigest()


def match_id_of(query: Any, var_names: tuple[str, ...]) -> Callable[[Mapping[str, list], bool, float, float], str]:
    """:func:`match_id` for one query: ``f(bindings, ints, start, end)``, ``ints`` saying every bound seq is an int.

    When the query's name is a string and it and the variable names are printable ASCII without
    quotes or backslashes, and the seqs are ints, the compact JSON is orjson's (the same bytes:
    nothing to escape, ints written alike), else the standard library's.
    """
    if not (type(query) is str and all(_PLAIN.issuperset(s) for s in (query, *var_names))):
        return lambda bindings, ints, start, end: match_id(query, bindings, start, end)
    prefix = b'["' + query.encode() + b'",'
    dumps, blake2b, times = orjson.dumps, hashlib.blake2b, _TIMES

    def fast(bindings: Mapping[str, list], ints: bool, start: float, end: float) -> str:
        if ints:
            try:
                return blake2b(prefix + dumps(bindings) + b"]" + times(start, end), digest_size=8).hexdigest()
            except orjson.JSONEncodeError:  # an int beyond 64 bits
                pass
        return match_id(query, bindings, start, end)

    return fast
