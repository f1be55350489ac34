"""A stream's hot-key decision (``yfpp.spark.stream_hot.HotKeys.decide``), filtered in Spark: the keys it
decides are those of the whole batch's key counts (:func:`yfpp.spark.hot_keys.hot_of_counts`, keys in order
of their first ts), with the slicing from each key's first ts over the batch's span."""

from __future__ import annotations

import json
import random

import pytest

pytest.importorskip("pyspark", reason="pyspark is not installed (pip install '.[spark]')")

from yfpp.spark.batch import key_hash  # noqa: E402
from yfpp.spark.hot_keys import hot_of_counts  # noqa: E402
from yfpp.spark.plan import SLICE_WINDOWS, effective_queries, group_queries  # noqa: E402
from yfpp.spark.stream_hot import HotKeys  # noqa: E402

COLUMNS = "seq long, type string, ts double, attrs string, xml string, reason string, position string, raw string"


def test_decided_keys_are_those_of_all_counts(spark):
    groups = group_queries(effective_queries({"q": "PATTERN SEQ(shelf a, exit c) WHERE [tag_id] WITHIN 7"}),
                           streaming=True)
    rng = random.Random(5)
    rows, ts = [], 0.0
    for i in range(600):
        ts += rng.choice([0.0, 0.5, 1.0])
        key = "H" if i % 2 else ("G" if i % 4 == 0 else f"k{rng.randrange(40)}")
        attrs = json.dumps({"tag_id": key} if i % 17 else {"other": 1})  # some events without the key
        rows.append((i, "shelf", ts, attrs, None, None, None, None))
    rows.append((600, None, None, None, None, "bad", "line 601", "{"))  # a dead letter: not counted
    df = spark.createDataFrame(rows, COLUMNS)
    buckets = 4
    hot = HotKeys(groups, buckets)
    hot.decide(df, first=True)
    pairs = [(r["h"], r["ts"]) for r in df.where("reason is null").select(key_hash(("tag_id",)).alias("h"), "ts")
             .where("h is not null").collect()]
    firsts: dict[int, float] = {}
    counts: dict[int, int] = {}
    for h, t in pairs:
        firsts[h] = min(firsts.get(h, t), t)
        counts[h] = counts.get(h, 0) + 1
    end = max(t for _, t in pairs)
    ordered = {h: counts[h] for h in sorted(counts, key=lambda h: (firsts[h], h))}
    want = [[h, firsts[h], max(SLICE_WINDOWS * 7.0, (end - firsts[h]) / buckets)]
            for h in hot_of_counts(ordered, buckets) if end > firsts[h]]
    assert len(want) == 2  # H and G
    assert hot.decided == {0: want}
    later = HotKeys(groups, buckets)
    later.decide(df, first=False)
    assert later.decided == {}
