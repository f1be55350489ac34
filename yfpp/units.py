"""Window units shared by both query languages (docs/semantics.md §8): name → seconds."""

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
