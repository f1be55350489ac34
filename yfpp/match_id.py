"""Stable match ids: the same match gets the same id in every run, restore and Spark job.

A receiver that may see a match twice (at-least-once delivery after a restore, a
retried sink) drops repeats by this id.  It depends only on the query's name and
the match's bindings (the identities of the events it binds), never on timing.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Callable, Mapping

import orjson

_COMPACT = json.JSONEncoder(separators=(",", ":"), default=str)  # what json.dumps(…, separators, default) builds per call
_PLAIN = frozenset(chr(c) for c in range(0x20, 0x7F)) - {'"', "\\"}


def match_id(query: Any, bindings: Mapping[str, list]) -> str:
    """16 hex digits of a BLAKE2b hash of ``[query, bindings]`` in compact JSON."""
    text = _COMPACT.encode([query, bindings])
    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


def match_id_of(query: Any, var_names: tuple[str, ...]) -> Callable[[Mapping[str, list], bool], str]:
    """:func:`match_id` for one query: ``f(bindings, ints)``, ``ints`` saying every bound seq is an int.

    When the query's name is a string and it and the variable names are printable ASCII without
    quotes or backslashes, and the seqs are ints, the compact JSON is orjson's (the same bytes:
    nothing to escape, ints written alike), else the standard library's.
    """
    if not (type(query) is str and all(_PLAIN.issuperset(s) for s in (query, *var_names))):
        return lambda bindings, ints: match_id(query, bindings)
    prefix = b'["' + query.encode() + b'",'
    dumps, blake2b = orjson.dumps, hashlib.blake2b

    def fast(bindings: Mapping[str, list], ints: bool) -> str:
        if ints:
            try:
                return blake2b(prefix + dumps(bindings) + b"]", digest_size=8).hexdigest()
            except orjson.JSONEncodeError:  # an int beyond 64 bits
                pass
        return match_id(query, bindings)

    return fast
