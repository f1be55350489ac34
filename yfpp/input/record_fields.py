"""What both readers share: reader options and caps, typed values, the timestamp and type of a record."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from yfpp.errors import YfppError

#: unit → (multiplier, divisor) to seconds
TS_UNITS: dict[str, tuple[int, int]] = {
    "s": (1, 1), "ms": (1, 1000), "us": (1, 10**6), "ns": (1, 10**9), "min": (60, 1), "h": (3600, 1),
}
#: the ``ts_unit`` name (and its marker) for ISO-8601 timestamps: ``2026-11-22T10:00:05Z``, no offset = UTC
ISO_UNIT_NAME, ISO_8601 = "iso", (0, 0)
#: Default cap on one record's size (an XML event element or a JSON line), in bytes.
MAX_RECORD_BYTES = 1 << 20
#: Default cap on one record's nesting (XML elements inside an event, JSON objects/arrays in a line).
MAX_DEPTH = 64
#: A dead letter's ``raw`` keeps at most this many bytes of a record over the size cap.
RAW_PREVIEW = 1024
#: Bytes a reader asks for at a time; each read block's events go on as one batch. 16 KiB (a few hundred
#: events): a batch's events, with their attributes and the reader's copies of the block, stay within the
#: processor's own cache until the engine has taken them. 64 KiB took more CPU, mostly cache misses
#: (benchmarks/RESULTS.md, "Hot path", "Read blocks of 16 KiB").
READ_BLOCK = 1 << 14

_INT = re.compile(r"[+-]?[0-9]+\Z")
_NUMBER_START = frozenset("0123456789+-.")
_FLOAT = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?\Z")


@dataclass(frozen=True)
class ReaderOptions:
    """How records become events; ``type_field`` None means the JSON field ``type`` / the XML element name."""

    ts_field: str = "ts"
    unit: tuple[int, int] = (1, 1)
    type_field: str | None = None
    max_record_bytes: int = MAX_RECORD_BYTES
    max_depth: int = MAX_DEPTH


def unit_factors(name: str) -> tuple[int, int]:
    """The (multiplier, divisor) of a unit name (:data:`ISO_8601` for ``iso``); ValueError for an unknown one."""
    if name == ISO_UNIT_NAME:
        return ISO_8601
    if name not in TS_UNITS:
        raise ValueError(f"unknown ts_unit {name!r}; expected one of {', '.join(TS_UNITS)}")
    return TS_UNITS[name]


def reading_unit(ts_unit: str, ts_format: str) -> str:
    """The readers' ``ts_unit`` for ``--ts-unit`` and ``--ts-format``: ``iso`` for ISO-8601 text."""
    return ISO_UNIT_NAME if ts_format == "iso" else ts_unit


def window_unit(ts_unit: str, ts_format: str) -> str:
    """The unit of a query window written without one: the feed's numeric unit, seconds for ISO-8601 text."""
    return "s" if ts_format == "iso" else ts_unit


def typed_value(text: str) -> int | float | str:
    """``"12"`` → 12, ``"1.5"`` / ``"1e3"`` → float, anything else unchanged.

    Text that looks numeric but is no usable number stays text: an integer of
    more than 4,300 digits (Python's int/str limit), a float that overflows (``1e999``).
    """
    if text.isdigit() and text.isascii() and len(text) < 4300:  # the common case, without a regex
        return int(text)
    if text[:1] not in _NUMBER_START:
        return text
    if _INT.match(text):
        try:
            return int(text)
        except ValueError:
            return text
    if _FLOAT.match(text):
        value = float(text)
        return value if math.isfinite(value) else text
    return text


def seconds(value: Any, unit: tuple[int, int]) -> float | None:
    """The timestamp in seconds, or None when ``value`` is not a finite number (ISO-8601 text for that unit)."""
    if unit is ISO_8601:
        return iso_seconds(value)
    if isinstance(value, str):
        value = typed_value(value.strip())
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return scaled_ts(value, unit)


def iso_seconds(value: Any) -> float | None:
    """ISO-8601 text as seconds since the epoch (UTC when it has no offset), else None."""
    if not isinstance(value, str):
        return None
    try:
        t = datetime.fromisoformat(value.strip())
    except ValueError:
        return None
    return (t if t.tzinfo else t.replace(tzinfo=timezone.utc)).timestamp()


def pop_ts(fields: dict[str, Any], ts_field: str, unit: tuple[int, int], what: str) -> float | str:
    """Remove the timestamp from ``fields``: seconds, or the reason the record is malformed."""
    if ts_field not in fields:
        return f"missing ts: no {what} {ts_field!r}"
    raw_ts = fields.pop(ts_field)
    ts = seconds(raw_ts, unit)
    if ts is None:
        if unit is ISO_8601:
            return f"non-ISO-8601 ts: {raw_ts!r}"
        if isinstance(raw_ts, (int, float)) and not isinstance(raw_ts, bool):  # 1e400 (read as inf), 10**400
            return f"ts out of range: {raw_ts if isinstance(raw_ts, float) else preview(str(raw_ts).encode(), 40)}"
        return f"non-numeric ts: {raw_ts!r}"
    return ts


def pop_type(fields: dict[str, Any], type_field: str, what: str) -> tuple[str, str | None]:
    """Remove the event type from ``fields``: ``(type, None)``, or ``("", reason)`` when it is not a non-empty string."""
    value = fields.pop(type_field, None)
    if isinstance(value, str) and value:
        return value, None
    return "", (f"missing type: no {what} {type_field!r}" if value is None else f"bad type: {value!r}")


def preview(raw: bytes, limit: int = RAW_PREVIEW) -> str:
    """Raw bytes as text for a dead letter, cut to ``limit`` bytes (marked ``…``)."""
    text = raw[:limit].decode("utf-8", "replace")
    return text + "…" if len(raw) > limit else text


def scaled_ts(raw: int | float, unit: tuple[int, int]) -> float | None:
    """A number's ts in seconds (``unit``: ``(multiplier, divisor)``, not ISO-8601), or None when scaling
    overflows or the result is not finite: :func:`seconds` after its checks, the readers' fast paths directly."""
    m, d = unit
    try:
        ts = raw * m / d
    except OverflowError:
        return None
    return None if ts - ts != 0.0 else ts  # inf - inf and nan are nan


def check_ts_unit(unit: str) -> None:
    """``--ts-unit`` of ``yfpp run`` and ``yfpp spark``: one of the readers' units."""
    if unit not in TS_UNITS:
        raise YfppError(f"unknown --ts-unit {unit!r}; expected one of {', '.join(TS_UNITS)}")
