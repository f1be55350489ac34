"""The Spark plan without Spark: query grouping, the slicing rule, the streaming replay state.

The slicing rule and the per-key replay are checked against one Engine over
the whole stream, on generated workloads, by simulating what Spark does.
"""

from __future__ import annotations

import json
import math
import random
from collections import Counter, defaultdict

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from yfpp.input.dead_letters import DeadLetters
from yfpp.engine import Engine
from yfpp.errors import YfppError
from yfpp.input.events import Event
from yfpp.input.generate import generate_rfid, generate_stock
from yfpp.spark.plan import _LIVE, LiveEngines, Slicing, advance_key, effective_queries, group_queries, make_event

KEYED = {
    "sase_shop": "PATTERN SEQ(shelf a, ~register b, exit c) WHERE [tag_id] WITHIN 1 hour",
    "xpath_out": "[tag_id]&&//shelf//exit&&(1 hour)",
    "unkeyed": "//register//exit&&(60)",
    "strict_keyed": "PATTERN SEQ(shelf a, exit c) WHERE strict_contiguity(a, c) {[tag_id]} WITHIN 10 min",
    "trailing": "PATTERN SEQ(register a, ~exit b) WITHIN 100",
    "trailing_keyed": "PATTERN SEQ(shelf a, ~exit b) WHERE [tag_id] WITHIN 300",
    "non_overlapping": "PATTERN SEQ(shelf a, exit c) WHERE [tag_id] WITHIN 1 hour OUTPUT non_overlapping",
    "unkeyed_no": "PATTERN SEQ(shelf a, register b) WITHIN 200 OUTPUT non_overlapping",
    "theft": "PATTERN SEQ(shelf a, ~register b, exit c) WHERE [tag_id] WITHIN 12 hours RETURN theft(tag = a.tag_id, door = c.door)",
    "same_zone": "PATTERN SEQ(shelf a, shelf b) WHERE [tag_id, zone] WITHIN 1 hour",
    "zone_quiet": "PATTERN SEQ(shelf a, ~shelf b) WHERE [zone] WITHIN 50",
    "same_tag": "PATTERN SEQ(shelf a, exit c) WHERE skip_till_any_match(a, c) { a.tag_id = c.tag_id } WITHIN 5 min RETURN out(tag = a.tag_id)",
}
STOCK = {
    "rise": "PATTERN SEQ(stock+ a[], stock b) WHERE [symbol] AND a[i].price > a[i-1].price AND b.price < a[a.len].price WITHIN 30",
    "pair": "PATTERN SEQ(stock a, stock b) WHERE strict_contiguity(a, b) { a.price < b.price } WITHIN 5",
    "any": "PATTERN SEQ(stock a, stock b) WHERE skip_till_any_match(a, b) { [symbol] AND b.price > a.price + 8 } WITHIN 6",
    "unbounded": "PATTERN SEQ(stock a, stock b) WHERE [symbol] AND b.price > a.price + 9",
}


def local(queries: dict[str, str], events: list[Event]) -> Counter:
    eng = Engine(dead_letters=DeadLetters())
    for name, q in queries.items():
        eng.register(q, name=name)
    return Counter(json.dumps(m) for m in eng.process_all(events))


def stream_of(records) -> list[Event]:
    return [Event.from_dict(r, seq=i) for i, r in enumerate(records)]


def test_groups_follow_keys_windows_and_policies():
    groups = group_queries(effective_queries(KEYED))
    by_query = {name: g for g in groups for name, _ in g.queries}
    assert by_query["sase_shop"] is by_query["xpath_out"] is by_query["non_overlapping"]
    assert by_query["sase_shop"].key == ("tag_id",) and by_query["sase_shop"].window == 12 * 3600
    assert by_query["unkeyed"] is by_query["strict_keyed"] is by_query["trailing"]  # strict is global
    assert by_query["unkeyed"].sliced and by_query["unkeyed"].window == 600
    assert not by_query["unkeyed_no"].sliced  # non_overlapping without a key: one slice
    unbounded = group_queries(effective_queries({"u": "PATTERN SEQ(a x, b y)"}))
    assert [(g.sliced, g.window) for g in unbounded] == [(False, None)]
    streaming = group_queries(effective_queries(KEYED), streaming=True)
    assert not any(g.sliced for g in streaming)
    assert sum(1 for g in streaming if len(g.queries) == 1 and g.queries[0][1].policy == "non_overlapping") == 2
    names = [str(n) for n, _ in effective_queries(["PATTERN SEQ(a x, b y)", ("named", "//a//b")])]
    assert names == ["0", "named"]


@pytest.mark.parametrize("length_factor", [1.0, 1.7, 5.0])
@pytest.mark.parametrize("workload", ["rfid", "stock"])
def test_slicing_rule_loses_and_duplicates_nothing(workload, length_factor):
    if workload == "rfid":
        events = stream_of(generate_rfid(1500, tags=6, gap=8, seed=3))  # gaps of 0 give ts ties
        queries = {k: v for k, v in KEYED.items() if k in ("unkeyed", "strict_keyed", "trailing", "same_tag")}
    else:
        events = stream_of(generate_stock(1500, symbols=3, seed=5))
        queries = {k: v for k, v in STOCK.items() if k != "unbounded"}
    (group,) = [g for g in group_queries(effective_queries(queries)) if g.sliced]  # the workload has one
    t0 = events[0].ts
    sl = Slicing(t0, group.window * length_factor, group.window)
    slices: dict[int, list[Event]] = defaultdict(list)
    for ev in events:
        for s in sl.reads(ev.ts):
            slices[s].append(ev)
    assert len(slices) > 3
    got: Counter = Counter()
    for s, evs in slices.items():
        eng = group.engine()
        got.update(json.dumps(m) for m in eng.process_all(evs) if sl.own(m["start"]) == s)
    assert got == local({str(n): p.source for n, p in group.queries}, events) and got


def test_slicing_plan():
    assert Slicing.plan(0, 100, 10, 4) == Slicing(0, 25, 10)
    assert Slicing.plan(0, 100, 60, 4) == Slicing(0, 60, 60)
    assert Slicing.plan(0, 100, 200, 4) is None  # one slice
    assert Slicing.plan(5, 5, 0, 4) is None


class FakeState:
    """The part of pyspark's GroupState that the state function uses."""

    def __init__(self) -> None:
        self.value: tuple | None = None
        self.timeout: int | None = None

    @property
    def exists(self) -> bool:
        return self.value is not None

    @property
    def get(self) -> tuple:
        assert self.value is not None
        return self.value

    def update(self, value: tuple) -> None:
        self.value = value

    def remove(self) -> None:
        self.value, self.timeout = None, None

    def setTimeoutTimestamp(self, ms: int) -> None:
        self.timeout = ms


def simulate_stream(queries: dict[str, str], events: list[Event], batches: int, seed: int,
                    buckets: int | None = None, live: LiveEngines | None = _LIVE) -> tuple[Counter, int]:
    """Spark's applyInPandasWithState loop over random micro-batches: data keys, then timed-out keys;
    the watermark is the previous batches' largest ts minus 1 ms; a no-data batch when it moved.
    A state key is a key value, or with ``buckets`` a bucket of them (the key hash modulo ``buckets``,
    as ``yfpp.spark.stream`` groups them); ``live``: the worker's live engines (None: every call replays).
    Returns the matches and the number of state keys left."""
    from yfpp.spark.parse import key_hash

    groups = group_queries(effective_queries(queries), streaming=True)
    cuts = sorted(random.Random(seed).sample(range(1, len(events)), batches - 1))
    chunks = [events[a:b] for a, b in zip([0, *cuts], [*cuts, len(events)])] + [[]]
    states: dict[tuple, FakeState] = defaultdict(FakeState)
    out: Counter = Counter()
    wm_ms, max_ts = 0, None
    for chunk in chunks:
        rows: dict[tuple, list[tuple]] = defaultdict(list)
        for ev in chunk:
            for g, grp in enumerate(groups):
                k = grp.key_of(ev)
                if k is not None and buckets:
                    k = key_hash(ev, grp.key) % buckets if grp.key else 0
                if k is not None:
                    rows[(g, k)].append((ev.ts, ev.seq, ev.type, json.dumps(ev.attrs), None))
        for (g, k), r in rows.items():
            out.update(json.dumps(m) for m in advance_key(groups[g], states[(g, k)], r, wm_ms, live=live))
        for (g, k), state in list(states.items()):
            if (g, k) not in rows and state.timeout is not None and state.timeout < wm_ms:
                out.update(json.dumps(m) for m in advance_key(groups[g], state, [], wm_ms, live=live))
        if chunk:
            max_ts = max(ev.ts for ev in chunk)
            wm_ms = max(wm_ms, math.floor(max_ts * 1000) - 1)
    return out, sum(st.exists for st in states.values())


@pytest.mark.parametrize("seed", [1, 2])
def test_streaming_replay_state_equals_whole_stream(seed):
    events = stream_of(generate_rfid(700, tags=5, gap=15, seed=seed))
    events.append(Event("heartbeat", events[-1].ts + 10**6, {}, len(events)))  # lets the last deadlines pass
    got, left = simulate_stream(KEYED, events, batches=6, seed=seed)
    assert got == local(KEYED, events) and left == 2  # only the unkeyed groups' states (holding the heartbeat)
    stock = stream_of(generate_stock(600, symbols=2, seed=seed))
    got, left = simulate_stream(STOCK, stock, batches=5, seed=seed)
    assert got == local(STOCK, stock) and left == 3  # unbounded: each symbol's events stay; and the unkeyed group


@pytest.mark.parametrize("live", [None, 1, 16], ids=["replay", "one-live-engine", "live-engines"])
@pytest.mark.parametrize("buckets", [1, 3])
def test_streaming_replay_state_of_buckets_of_keys_equals_whole_stream(buckets, live):
    """Many key values in one state key (one engine for all their events) give the same matches, whether
    each call replays the kept events, continues the engine this worker left (``live``), or a mix (a
    worker keeping one engine: the state keys take turns)."""
    engines = None if live is None else LiveEngines(live)
    events = stream_of(generate_rfid(700, tags=7, gap=15, seed=buckets))
    events.append(Event("heartbeat", events[-1].ts + 10**6, {}, len(events)))
    got, left = simulate_stream(KEYED, events, batches=6, seed=buckets, buckets=buckets, live=engines)
    assert got == local(KEYED, events) and left == 2  # the unkeyed groups' states (holding the heartbeat)
    stock = stream_of(generate_stock(600, symbols=5, seed=buckets))
    got, left = simulate_stream(STOCK, stock, batches=5, seed=buckets, buckets=buckets, live=engines)
    assert got == local(STOCK, stock) and left <= 2 * buckets + 1  # unbounded: the symbols' events stay
    sets = stream_of(generate_rfid(600, tags=5, gap=15, seed=4))
    sets.append(Event("heartbeat", sets[-1].ts + 10**6, {}, len(sets)))
    assert simulate_stream(SETS, sets, batches=5, seed=4, buckets=buckets, live=engines)[0] == local(SETS, sets)


def test_a_state_rolled_back_replays_rather_than_continue_a_live_engine():
    """A micro-batch retried after a failure gets the state before it: the engine the failed attempt left
    (under the newer token) is not continued, the kept events are replayed; no match is lost or repeated."""
    (grp,) = group_queries(effective_queries({"q": KEYED["sase_shop"]}), streaming=True)
    events = stream_of(generate_rfid(300, tags=4, gap=15, seed=2))
    rows = [(ev.ts, ev.seq, ev.type, json.dumps(ev.attrs), None) for ev in events]
    engines, state = LiveEngines(), FakeState()
    first = advance_key(grp, state, rows[:150], 0, live=engines)
    before = state.value
    wm = math.floor(rows[149][0] * 1000) - 1
    advance_key(grp, state, rows[150:], wm, live=engines)  # the attempt that failed after its state update
    state.value = before  # Spark's state store: the version of the last committed micro-batch
    again = advance_key(grp, state, rows[150:], wm, live=engines)
    assert Counter(json.dumps(m) for m in first + again) == local({"q": KEYED["sase_shop"]}, events)


def test_xml_events_parse_their_element_only_when_read():
    ev = make_event("shelf", 1.0, 3, '{"zone": 7}', '<shelf ts="1" zone="07"/>')
    assert ev.attrs == {"zone": 7} and ev._el is None
    assert ev.element.get("zone") == "07"
    assert make_event("shelf", 1.0, 3, "{}", None).element.get("ts") == "1.0"


FEEDBACK = {
    "theft_fb": "[tag_id]&&//shelf//!register//exit&&(1 hour)&&=> theft(tag_id = e1.tag_id, zone = e1.zone) feedback",
    "back_at_shelf": "PATTERN SEQ(theft t, shelf s) WHERE [tag_id] WITHIN 1 hour",
    "zone_pairs": "[zone]&&//shelf//shelf&&(60)",  # another partitioning, blind to theft events
}


def test_feedback_queries_that_keep_their_partition_key_are_accepted():
    groups = group_queries(effective_queries(FEEDBACK))
    by_query = {name: g for g in groups for name, _ in g.queries}
    assert by_query["theft_fb"] is by_query["back_at_shelf"] and by_query["theft_fb"].key == ("tag_id",)


@pytest.mark.parametrize("queries, message", [
    ({"f": "//a//b(60) => c feedback"}, "needs an equivalence list and no strict step"),
    ({"f": "[k]&&//a//b(60) => c(x = e1.x) feedback"}, "must keep the partition key .*add k = e1.k"),
    ({"f": "[k]&&//a//b(60) => c(k = e1.k) feedback", "g": "//c//d(60)"}, "query 'g' would see the events query 'f' feeds back"),
    ({"f": "[k]&&//a//b(60) => c(k = e1.k) feedback", "g": "//x/y(60)"}, "query 'g' would see"),  # strict: any event counts
])
def test_other_feedback_queries_are_refused(queries, message):
    with pytest.raises(YfppError, match=message):
        group_queries(effective_queries(queries))


def test_feedback_is_refused_when_streaming_and_by_the_cli(capsys):
    with pytest.raises(YfppError, match="batch jobs only"):
        group_queries(effective_queries({"f": "[k]&&//a//b(60) => c(k = e1.k) feedback"}), streaming=True)
    from yfpp.cli import main

    assert main(["spark", "-q", "//a//b(60) => c feedback", "-i", "sample.xml", "-o", "unused"]) == 2
    assert capsys.readouterr().err.startswith("yfpp: error: query 'q': on Spark a feedback query needs an equivalence list")


SETS = {  # event-set queries (docs/event_sets.md) over the RFID feed
    "set_related": "PATTERN SEQ({shelf a, register+ r[]}, exit c) WHERE a.tag_id = r.tag_id AND r.tag_id = c.tag_id WITHIN 10 min",
    "set_listed": "[tag_id]//{shelf, shelf+}//exit(10 min)",
    "set_maximal": "PATTERN SEQ({shelf a, register r}, exit c) WHERE [tag_id] WITHIN 10 min OUTPUT earliest_maximal",
    "set_unkeyed": "PATTERN SEQ({register r, exit x}, ~shelf s, shelf t) WITHIN 40",
    "set_unkeyed_maximal": "PATTERN {register+ r[], exit x} WITHIN 30 OUTPUT earliest_maximal",
    "set_quiet": "PATTERN SEQ({shelf a, register r}, ~exit x) WHERE a.tag_id = r.tag_id AND r.tag_id = x.tag_id WITHIN 2 min",
    "set_first": "PATTERN {shelf a, exit c} WHERE [tag_id] WITHIN 10 min OUTPUT non_overlapping",
    "set_first_anywhere": "PATTERN {shelf a, exit c} WHERE a.tag_id = c.tag_id WITHIN 1 min OUTPUT non_overlapping",
}


def test_set_queries_are_keyed_by_their_equality_relationships_or_sliced():
    by_query = {name: g for g in group_queries(effective_queries(SETS)) for name, _ in g.queries}
    assert by_query["set_related"] is by_query["set_listed"] is by_query["set_maximal"] is by_query["set_quiet"]
    assert by_query["set_related"].key == ("tag_id",)
    assert by_query["set_unkeyed"] is by_query["set_unkeyed_maximal"] and by_query["set_unkeyed"].sliced
    # non_overlapping goes by the equivalence list alone: without one, the whole stream is one partition
    assert by_query["set_first_anywhere"].key == () and not by_query["set_first_anywhere"].sliced


@pytest.mark.parametrize("length_factor", [1.0, 2.5])
def test_slicing_rule_holds_for_unkeyed_set_queries(length_factor):
    events = stream_of(generate_rfid(1200, tags=6, gap=6, seed=8))
    queries = {k: v for k, v in SETS.items() if "unkeyed" in k}
    (group,) = group_queries(effective_queries(queries))
    sl = Slicing(events[0].ts, group.window * length_factor, group.window)
    slices: dict[int, list[Event]] = defaultdict(list)
    for ev in events:
        for s in sl.reads(ev.ts):
            slices[s].append(ev)
    got: Counter = Counter()
    for s, evs in slices.items():
        got.update(json.dumps(m) for m in group.engine().process_all(evs) if sl.own(m["start"]) == s)
    want = local(queries, events)
    assert got == want and {json.loads(m)["query"] for m in want} == set(queries)


def test_streaming_replay_state_holds_for_set_queries():
    events = stream_of(generate_rfid(600, tags=5, gap=15, seed=4))
    events.append(Event("heartbeat", events[-1].ts + 10**6, {}, len(events)))
    got, _ = simulate_stream(SETS, events, batches=5, seed=4)
    want = local(SETS, events)
    assert got == want and {json.loads(m)["query"] for m in want} == set(SETS)


def test_readers_key_hashes_and_what_travels():
    """Key values Python finds equal hash alike (the readers route by these hashes); a missing key is None;
    the XML element travels only when an XPath predicate reads it; keys naming ``seq`` are hashed in SQL."""
    from yfpp.spark.parse import key_hash
    from yfpp.spark.plan import hashable_keys, needs_xml

    def h(**attrs):
        return key_hash(Event("e", 1.0, attrs), ("k",))

    assert h(k=7) == h(k=7.0) == key_hash(Event("e", 7.0, {}), ("ts",)) and h(k=True) == h(k=1) and h(k=-0.0) == h(k=0)
    assert h(k=7) != h(k=8) and h(k="7") != h(k="x") and h() is None and h(k=None) is not None
    assert h(k=10**400) == h(k=10**400) and 0 <= h(k="x") < 2**63
    assert key_hash(Event("e", 1.0, {"a": 1, "b": "x"}), ("a", "b")) != key_hash(Event("e", 1.0, {"a": "x", "b": 1}), ("a", "b"))
    groups = group_queries(effective_queries(KEYED))
    assert not needs_xml(groups) and ("tag_id",) in hashable_keys(groups)
    assert needs_xml(group_queries(effective_queries(["[tag_id]&&//shelf[@zone='Z1']//exit&&(1 hour)"])))
    assert hashable_keys(group_queries(effective_queries(["PATTERN SEQ(a x, b y) WHERE [seq] WITHIN 5"]))) == []


_SCALARS = (st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8)
            | st.sampled_from([2**63 - 1, 2**63, -2**63, -2**63 - 1, 10**30, 2.0**63, 1e300, float("nan"), float("inf")]))
_ATTRS = st.dictionaries(st.text(max_size=6), _SCALARS | st.lists(_SCALARS, max_size=3)
                         | st.dictionaries(st.text(max_size=3), _SCALARS, max_size=3), max_size=6)


@settings(max_examples=500, deadline=None)
@given(_ATTRS)
def test_load_attrs_reads_what_the_readers_write_as_the_standard_library_does(attrs):
    """orjson where it is exact; the standard library for big integers, NaN/Infinity and nested values."""
    from yfpp.spark.parse import _json
    from yfpp.spark.plan import load_attrs

    for text in {_json(attrs), json.dumps(attrs), json.dumps(attrs, separators=(",", ":"))}:
        text = text.decode() if isinstance(text, bytes) else text
        got, want = load_attrs(text), json.loads(text)
        assert repr(got) == repr(want) and [type(v) for v in got.values()] == [type(v) for v in want.values()]
