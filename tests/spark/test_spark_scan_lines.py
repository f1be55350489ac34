"""The scan plan's plain blocks (``yfpp.spark.scan_lines``): lines routed by a scan, parsed where they are matched.

Without Spark: a job's read and matching tasks run one after the other
(``tests/spark/test_spark_scan.py``'s ``scanned``), over feeds that mix plain
blocks with blocks a read task must parse (a null or nested key, a broken
line, a ``\\u`` escape), dead letters of a plain block's shape, late events
and several byte ranges, small read blocks and chunks: exactly one engine's
matches and dead letters. The routing of a scanned line equals that of its
parsed event.
"""

from __future__ import annotations

import json
from collections import Counter
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("pyspark", reason="pyspark is not installed (pip install '.[spark]')")

from tests.generators import patterns  # noqa: E402
from tests.spark.test_spark_scan import one_engine, scanned  # noqa: E402
from yfpp.input.events import Event  # noqa: E402
from yfpp.spark.routing import key_tasks, text_tasks  # noqa: E402
from yfpp.spark.scan_lines import LINES  # noqa: E402

KEYS = st.one_of(st.integers(-(2 ** 70), 2 ** 70), st.integers(-3, 3),
                 st.text(st.characters(blacklist_categories=("Cs", "Cc"), blacklist_characters='"\\'), max_size=4))


@settings(max_examples=300, deadline=None)
@given(values=st.lists(KEYS, min_size=1, max_size=20), n=st.integers(1, 7))
def test_a_scanned_key_goes_where_its_parsed_value_goes(values, n):
    texts = [json.dumps(v, ensure_ascii=False).encode() for v in values]
    events = [Event("A", 0.0, {"k": v}, i) for i, v in enumerate(values)]
    assert text_tasks(texts, n) == key_tasks(events, ("k",), n)


def _line(draw, ts: int) -> str:
    """One line at ``ts``: mostly a plain event, sometimes a dead letter of the plain shape, or a line that
    makes its block one the read task parses."""
    kind = draw(st.sampled_from(["plain"] * 12 + ["text key", "dead type", "dead list", "null key", "nested",
                                                  "broken", "escaped", "no key"]))
    t, x = draw(st.sampled_from("ABC")), draw(st.integers(0, 3))
    k = draw(st.sampled_from([0, 1, 2, -1]))
    record = {"plain": {"type": t, "ts": ts, "k": k, "x": x},
              "text key": {"type": t, "ts": ts, "k": draw(st.sampled_from(["a", "é", ""])), "x": x},
              "dead type": {"type": 5, "ts": ts, "k": k},
              "dead list": {"type": t, "ts": ts, "k": k, "y": [1]},
              "null key": {"type": t, "ts": ts, "k": None, "x": x},
              "nested": {"type": t, "ts": ts, "n": {"k": k}, "x": x},
              "no key": {"type": t, "ts": ts, "x": x},
              "escaped": {"type": t, "ts": ts, "k": "é", "x": x}}.get(kind)
    if record is None:  # broken
        return '{"type": "B", "ts": '
    return json.dumps(record, ensure_ascii=kind == "escaped")


@st.composite
def feeds(draw) -> list[str]:
    """JSON lines whose ts mostly go forward, some back (late events)."""
    lines, ts = [], 0
    for _ in range(draw(st.integers(0, 60))):
        ts += draw(st.sampled_from([0, 1, 1, 2, -3]))
        lines.append(_line(draw, max(ts, 0)))
    return lines


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(pats=st.lists(patterns(), min_size=1, max_size=3), lines=feeds(), n=st.integers(2, 3),
       slice_events=st.sampled_from([1, 4, 100]), pieces=st.sampled_from([1, 3, 7]),
       block=st.sampled_from([40, 200, 1 << 14]), chunk=st.sampled_from([1, 5, 4096]))
def test_plain_and_parsed_blocks_together_equal_one_engine(tmp_path_factory, pats, lines, n, slice_events, pieces,
                                                           block, chunk):
    path = tmp_path_factory.mktemp("lines") / "feed.jsonl"
    path.write_text("".join(ln + "\n" for ln in lines), encoding="utf-8")
    named = [(f"q{i}", p) for i, p in enumerate(pats)]
    want, letters = one_engine(named, path)
    with mock.patch("yfpp.spark.ranges.BLOCK", block), mock.patch("yfpp.spark.scan.CHUNK_EVENTS", chunk), \
            mock.patch("yfpp.spark.scan.BLOB_EVENTS", 1):
        got, dead, stats = scanned(named, [path], n, slice_events, pieces)
    assert got == want
    assert dead == sorted(letters, key=lambda d: d["seq"])
    assert sum(s["dead"] for s in stats) == len(letters) and stats[0]["records"] == len(lines)


def test_a_mixed_feed_ships_lines_and_events(tmp_path):
    """Plain blocks go as lines, the others as parsed events; dead letters of either kind and a late event
    first in its block are reported once, by the lowest task they went to."""
    recs = [{"type": "AB"[i % 2], "ts": i // 2, "k": i % 5, "x": i % 4} for i in range(400)]
    lines = [json.dumps(r) for r in recs]
    lines[50] = json.dumps({"type": 7, "ts": 25, "k": 1})  # a dead letter of the plain shape
    lines[120] = json.dumps({"type": "A", "ts": 60, "k": None})  # a null key: its block is parsed
    lines[200] = json.dumps({"type": "B", "ts": 3, "k": 2})  # late
    lines[300] = '{"type": "A", "ts": '  # broken: its block is parsed
    path = tmp_path / "feed.jsonl"
    path.write_text("".join(ln + "\n" for ln in lines))
    named = [("keyed", "PATTERN SEQ(A a, B b) WHERE [k] WITHIN 3"), ("whole", "PATTERN SEQ(A a, A b) WITHIN 1"),
             ("sliced", "PATTERN SEQ(B a, ~A b, B c) WITHIN 2")]
    want, letters = one_engine(named, path)
    assert [d["seq"] for d in letters] == [50, 200, 300] and sum(want.values()) > 100
    kinds: Counter = Counter()
    import yfpp.spark.scan as scan

    real = scan.read_task

    def counting(job, ids):
        for rows in real(job, ids):
            kinds.update(r[3] for r in rows)
            yield rows

    with mock.patch("yfpp.spark.ranges.BLOCK", 600), mock.patch.object(scan, "CHUNK_EVENTS", 40), \
            mock.patch("tests.spark.test_spark_scan.read_task", counting):
        got, dead, _ = scanned(named, [path], 3, 50, 3)
    assert got == want and dead == letters
    assert kinds[LINES] > 0 and kinds[scan.EVENTS] > 0
