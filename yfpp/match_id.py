"""Stable match ids: the same match gets the same id in every run, restore and Spark job.

A receiver that may see a match twice (at-least-once delivery after a restore, a
retried sink) drops repeats by this id.  It depends only on the query's name and
the match's bindings (the identities of the events it binds), never on timing.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Mapping


def match_id(query: Any, bindings: Mapping[str, list]) -> str:
    """16 hex digits of a BLAKE2b hash of ``[query, bindings]`` in compact JSON."""
    text = json.dumps([query, bindings], separators=(",", ":"), default=str)
    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()
