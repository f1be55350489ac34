"""Window units shared by both query languages (docs/semantics.md §8): name → seconds.

A window written without a unit (``WITHIN 500``) is in the timestamp unit of the feed
(``--ts-unit``); the readers convert timestamps to seconds, so the window is too.
"""

from __future__ import annotations

from decimal import Decimal

UNIT_SECONDS: dict[str, Decimal] = {
    "ms": Decimal("0.001"),
    **dict.fromkeys(("s", "sec", "secs", "second", "seconds"), Decimal(1)),
    **dict.fromkeys(("min", "mins", "minute", "minutes"), Decimal(60)),
    **dict.fromkeys(("h", "hr", "hrs", "hour", "hours"), Decimal(3600)),
    **dict.fromkeys(("d", "day", "days"), Decimal(86400)),
}


def window_seconds(number: str, unit: str) -> float:
    """``number unit`` in seconds, exactly as written (``0.1 h`` is 360.0, not 360.00000000000006)."""
    return float(Decimal(number) * UNIT_SECONDS[unit.lower()])


def bare_window(number: str, ts_unit: str) -> float:
    """A window written without a unit, in the timestamp unit ``ts_unit`` (``s``, ``ms``, … as ``--ts-unit``),
    in seconds."""
    from yfpp.input.record_fields import TS_UNITS

    multiplier, divisor = TS_UNITS[ts_unit]
    return float(Decimal(number) * multiplier / divisor)
