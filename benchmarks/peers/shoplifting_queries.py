"""The benchmark's query set, shared by the yfpp and Flink sides: shoplifting with N windows."""

from __future__ import annotations

SASE = """PATTERN SEQ(shelf a, ~register b, exit c)
WHERE skip_till_next_match(a, b, c) {{ [tag_id] }}
WITHIN {window}"""


def window(i: int) -> int:
    """Query i's window in seconds: 12 hours less i minutes (distinct queries sharing one NFA prefix)."""
    return 12 * 3600 - 60 * i


def query_file(n: int) -> str:
    """A yfpp query file of ``n`` named queries ``q0``…"""
    return "".join(f"@query q{i}\n{SASE.format(window=window(i))}\n" for i in range(n))
