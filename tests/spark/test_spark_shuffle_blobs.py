"""The shuffle plan's matching in compact batches (``yfpp.spark.batch._packer`` and ``_runner``), without Spark.

Numbered events in Arrow batches, given to the packer in any order as Spark's
partitions would be; its blobs grouped by task and sorted by group and slice,
as ``repartitionById`` and ``sortWithinPartitions`` hand them over; the tasks'
matches together equal one engine's over the stream, on generated patterns
and streams, with several tasks and slicings.
"""

from __future__ import annotations

import json
from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("pyspark", reason="pyspark is not installed (pip install '.[spark]')")

import pyarrow as pa  # noqa: E402
import pyarrow.compute as pc  # noqa: E402

from tests.generators import patterns, streams  # noqa: E402
from yfpp.engine import Engine  # noqa: E402
from yfpp.input.events import MISSING  # noqa: E402
from yfpp.spark import batch  # noqa: E402
from yfpp.spark.parse import _json  # noqa: E402
from yfpp.spark.plan import Slicing, effective_queries, group_queries  # noqa: E402
from yfpp.spark.scan import value_hash  # noqa: E402


@settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck))
@given(pats=st.lists(patterns(), min_size=1, max_size=3), events=streams(max_events=30), n=st.integers(1, 3),
       cut=st.integers(1, 7), slices=st.integers(1, 4))
def test_packed_tasks_together_equal_one_engine(pats, events, n, cut, slices):
    named = [(f"q{i}", p) for i, p in enumerate(pats)]
    eng = Engine()
    for name, p in named:
        eng.register(p, name=name)
    want = Counter(json.dumps(m) for m in eng.process_all(list(events)))
    groups = group_queries(effective_queries(named))
    slicings = {}
    if events:
        for g, grp in enumerate(groups):
            sl = Slicing.plan(events[0].ts, events[-1].ts, grp.window, slices) if grp.sliced else None
            if sl is not None:
                slicings[g] = sl
    cols: dict[str, list] = {"seq": [], "type": [], "ts": [], "attrs": [], "xml": []}
    for i, ev in enumerate(events):
        text = _json(ev.attrs)
        for k, v in (("seq", i), ("type", ev.type), ("ts", float(ev.ts)),
                     ("attrs", text.decode() if isinstance(text, bytes) else text), ("xml", None)):
            cols[k].append(v)
    fields = [("seq", pa.int64()), ("type", pa.string()), ("ts", pa.float64()), ("attrs", pa.string()), ("xml", pa.string())]
    for g, grp in enumerate(groups):
        if grp.key:  # any hash every task computes alike: the packer only takes it modulo the tasks;
            hashes = []  # spread over 64 bits, as Spark's key hash is (a float would round it)
            for ev in events:
                vals = [ev.get(a) for a in grp.key]
                hashes.append(None if MISSING in vals
                              else (sum(value_hash(v) for v in vals) * 0x9E3779B97F4A7C15) % 2**64 - 2**63)
            cols[f"h{g}"] = hashes
            fields.append((f"h{g}", pa.int64()))
    table = pa.Table.from_pydict(cols, schema=pa.schema(fields))
    parts = [b for i in range(0, table.num_rows, cut) for b in table.slice(i, cut).to_batches()][::-1]
    packed = pa.Table.from_batches(list(batch._packer(groups, slicings, n)(iter(parts))), schema=batch._PACKED_ARROW)
    got: Counter = Counter()
    for p in range(n):
        mine = packed.filter(pc.equal(packed["p"], p)).sort_by([("g", "ascending"), ("s", "ascending")])
        for rb in batch._runner(groups, slicings)(iter(mine.to_batches())):
            for q, line in zip(rb.column("query").to_pylist(), rb.column("json").to_pylist()):
                if q is not None:
                    got[line] += 1
    assert got == want


def test_a_key_goes_to_one_task_whether_or_not_its_batch_has_events_without_the_key():
    """A 64-bit key hash taken modulo the tasks as an integer also in a batch where some event lacks the
    key (Arrow gives such a column to numpy as floats, which round the hash: the key went to two tasks)."""
    (grp,) = group_queries(effective_queries(["PATTERN SEQ(shelf a, exit c) WHERE [tag_id] WITHIN 60"]))
    fields = [("seq", pa.int64()), ("type", pa.string()), ("ts", pa.float64()), ("attrs", pa.string()),
              ("xml", pa.string()), ("h0", pa.int64())]
    big = 2**62 + 12345  # (not a float: 2**62 + 12344 and + 12345 round alike)
    with_null = pa.RecordBatch.from_pydict({"seq": [0, 1], "type": ["shelf", "heartbeat"], "ts": [1.0, 2.0],
                                            "attrs": ['{"tag_id":"t"}', "{}"], "xml": [None, None], "h0": [big, None]},
                                           schema=pa.schema(fields))
    without = pa.RecordBatch.from_pydict({"seq": [2], "type": ["exit"], "ts": [3.0], "attrs": ['{"tag_id":"t"}'],
                                          "xml": [None], "h0": [big]}, schema=pa.schema(fields))
    for n in (2, 3, 4):
        packed = pa.Table.from_batches(list(batch._packer([grp], {}, n)(iter([with_null, without]))),
                                       schema=batch._PACKED_ARROW)
        assert set(packed["p"].to_pylist()) == {big % n}, n
