"""The shuffle plan's matching in compact batches (``yfpp.spark.batch._packer`` and ``_runner``), without Spark.

Numbered events in Arrow batches, given to the packer in any order as Spark's
partitions would be; its blobs grouped by task and sorted by group and slice,
as ``repartitionById`` and ``sortWithinPartitions`` hand them over; the tasks'
matches together equal one engine's over the stream, on generated patterns
and streams, with several tasks and slicings.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("pyspark", reason="pyspark is not installed (pip install '.[spark]')")

import pyarrow as pa  # noqa: E402
import pyarrow.compute as pc  # noqa: E402

from tests.generators import patterns, streams, within_reach  # noqa: E402
from yfpp.engine import Engine  # noqa: E402
from yfpp.input.events import MISSING, Event  # noqa: E402
from yfpp.spark import batch  # noqa: E402
from yfpp.spark.parse import _json  # noqa: E402
from yfpp.spark.plan import Slicing, effective_queries, group_queries  # noqa: E402
from yfpp.spark.hot_keys import sliceable  # noqa: E402
from yfpp.spark.scan import value_hash  # noqa: E402
from yfpp.spark.shuffle_hot import SLICES_PER_TASK, HotHash  # noqa: E402


@settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck))
@given(pats=st.lists(patterns(), min_size=1, max_size=3), events=streams(max_events=30), n=st.integers(1, 3),
       cut=st.integers(1, 7), slices=st.integers(1, 4))
def test_packed_tasks_together_equal_one_engine(pats, events, n, cut, slices):
    events = within_reach(pats, events)
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
    assert tasks_matches(groups, slicings, n, event_table(events, groups), cut) == want


def key_hash(ev, key: tuple[str, ...]) -> int | None:
    """Any hash every task computes alike (the packer only takes it modulo the tasks), spread over 64 bits,
    as Spark's key hash is (a float would round it); None: the event lacks the key."""
    vals = [ev.get(a) for a in key]
    return None if MISSING in vals else (sum(value_hash(v) for v in vals) * 0x9E3779B97F4A7C15) % 2**64 - 2**63


def event_table(events: list, groups: list) -> pa.Table:
    """The events as the packer's input: numbered, attrs as JSON, a key hash column per keyed group."""
    cols: dict[str, list] = {"seq": [], "type": [], "ts": [], "attrs": [], "xml": []}
    for i, ev in enumerate(events):
        text = _json(ev.attrs)
        for k, v in (("seq", i), ("type", ev.type), ("ts", float(ev.ts)),
                     ("attrs", text.decode() if isinstance(text, bytes) else text), ("xml", None)):
            cols[k].append(v)
    fields = [("seq", pa.int64()), ("type", pa.string()), ("ts", pa.float64()), ("attrs", pa.string()), ("xml", pa.string())]
    for g, grp in enumerate(groups):
        if grp.key:
            cols[f"h{g}"] = [key_hash(ev, grp.key) for ev in events]
            fields.append((f"h{g}", pa.int64()))
    return pa.Table.from_pydict(cols, schema=pa.schema(fields))


def tasks_matches(groups: list, slicings: dict, n: int, table: pa.Table, cut: int, hot: list = (),
                  rows: list | None = None) -> Counter:
    """The matches of the ``n`` tasks, fed as Spark would: the table in batches of ``cut`` rows, in reverse
    order, packed; each task's blobs sorted by unit and slice. ``rows``: gets each task's matched rows."""
    parts = [b for i in range(0, table.num_rows, cut) for b in table.slice(i, cut).to_batches()][::-1]
    packed = pa.Table.from_batches(list(batch._packer(groups, slicings, n, hot)(iter(parts))), schema=batch._PACKED_ARROW)
    units = groups + [groups[hh.group] for hh in hot]
    unit_slicings = {**slicings, **{len(groups) + j: hh.slicing for j, hh in enumerate(hot)}}
    got: Counter = Counter()
    for p in range(n):
        mine = packed.filter(pc.equal(packed["p"], p)).sort_by([("g", "ascending"), ("s", "ascending")])
        for rb in batch._runner(units, unit_slicings)(iter(mine.to_batches())):
            for q, line in zip(rb.column("query").to_pylist(), rb.column("json").to_pylist()):
                if q is not None:
                    got[line] += 1
                elif rows is not None:
                    rows.append(json.loads(line)["rows"])
    return got


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(pats=st.lists(patterns(), min_size=1, max_size=3), events=streams(max_events=40),
       hot=st.lists(st.booleans(), min_size=40, max_size=40), n=st.integers(2, 4), cut=st.integers(1, 7),
       length=st.sampled_from([0.5, 1.0, 2.5, 7.0]))
def test_hot_hash_slices_together_equal_one_engine(pats, events, hot, n, cut, length):
    """Keyed windowed generated patterns over streams where key 7 has about half the events: the events of its
    hash cut into slices of any length from its first ts, spread over the tasks — one engine's matches."""
    named = [(f"q{i}", replace(p, partition_by=("k",), window=p.window if p.window is not None else 3))
             for i, p in enumerate(pats)]
    events = [Event(e.type, e.ts, {**e.attrs, "k": 7} if h else e.attrs, e.seq) for e, h in zip(events, hot)]
    eng = Engine()
    for name, p in named:
        eng.register(p, name=name)
    want = Counter(json.dumps(m) for m in eng.process_all(list(events)))
    groups = group_queries(effective_queries(named))
    sevens = [e.ts for e in events if e.attrs.get("k") == 7]
    hot_hashes = [HotHash(g, key_hash(Event("a", 0, {"k": 7}, 0), grp.key), Slicing(min(sevens), length, grp.window), "7")
                  for g, grp in enumerate(groups) if sevens and grp.key and sliceable(grp)]
    assert tasks_matches(groups, {}, n, event_table(events, groups), cut, hot_hashes) == want


def test_a_hot_hash_of_a_skewed_feed_is_spread_over_the_tasks():
    """Tag H in half of a shelf / register / exit feed: its slices go round robin, the other tags by their hash —
    one engine's matches, the rows per task far more even (rows, not time: no timing assertions)."""
    rnd = random.Random(5)
    events = []
    for ts in range(4000):
        tag = "H" if rnd.random() < 0.5 else f"T{rnd.randrange(40)}"
        events.append(Event(rnd.choice(["shelf", "shelf", "register", "exit"]), ts, {"tag_id": tag}, ts))
    named = [("shop", "PATTERN SEQ(shelf a, ~register b, exit c) WHERE [tag_id] WITHIN 60"),
             ("pairs", "PATTERN SEQ(shelf a, shelf+ b[], exit c) WHERE [tag_id] WITHIN 20")]
    eng = Engine()
    for name, q in named:
        eng.register(q, name=name)
    want = Counter(json.dumps(m) for m in eng.process_all(list(events)))
    (grp,) = groups = group_queries(effective_queries(named))
    table = event_table(events, groups)
    h = key_hash(Event("shelf", 0, {"tag_id": "H"}, 0), grp.key)
    n = 4
    hot = [HotHash(0, h, Slicing(0.0, 4000 / (SLICES_PER_TASK * n), grp.window), "'H'")]
    before, after = [], []
    assert tasks_matches(groups, {}, n, table, 500, rows=before) == want
    assert tasks_matches(groups, {}, n, table, 500, hot, rows=after) == want
    assert max(before) / min(before) > 1.8 and max(after) / min(after) < 1.35, (before, after)


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
