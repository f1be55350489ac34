"""The Engine API (README, "Python API"): registration, stream order, late events, pruning."""

from __future__ import annotations

import io
import json

import pytest

from yfpp.input.dead_letters import DeadLetters
from yfpp.engine import Engine
from yfpp.errors import PatternError, QuerySyntaxError, YfppError
from yfpp.input.events import Event
from yfpp.runtime.match_id import match_id

SHOP = "PATTERN SEQ(shelf a, ~register b, exit c) WHERE [tag_id] WITHIN 100"


def feed(eng: Engine, records: list[dict]) -> list[dict]:
    out = []
    for r in records:
        out += eng.process(r)
    return out + eng.flush()


def test_register_knows_the_language_and_names_matches():
    eng = Engine()
    eng.register(SHOP, name="sase")
    eng.register("[tag_id]&&//shelf//!register//exit&&(100)", name="xpath")
    qid = eng.register("PATTERN SEQ(shelf a, exit c) WHERE [tag_id]")
    out = feed(eng, [{"type": "shelf", "ts": 1, "tag_id": 1}, {"type": "exit", "ts": 2, "tag_id": 1}])
    assert sorted(str(m["query"]) for m in out) == sorted(["sase", "xpath", str(qid)])
    assert qid in {m["query"] for m in out}  # an unnamed query is named by its id
    by = {m["query"]: m for m in out}
    assert by["sase"]["bindings"] == {"a": [0], "c": [1]}
    assert by["xpath"]["bindings"] == {"e1": [0], "e2": [1]}
    assert by["sase"]["start"] == 1 and by["sase"]["end"] == 2


def test_bad_queries_raise_clear_errors():
    eng = Engine()
    with pytest.raises(QuerySyntaxError) as e:
        eng.register("PATTERN SEQ(shelf a exit c)")
    assert e.value.line == 1 and e.value.column > 1
    with pytest.raises(PatternError, match="window"):
        eng.register("PATTERN SEQ(shelf a, ~register b)")
    with pytest.raises(YfppError):
        eng.unregister(12345)


def test_unregister_stops_matches_and_frees_runs():
    eng = Engine()
    keep = eng.register("PATTERN SEQ(shelf a, exit c) WHERE [tag_id]", name="keep")
    gone = eng.register("PATTERN SEQ(shelf a, exit c) WHERE skip_till_any_match(a, c) { [tag_id] }", name="gone")
    eng.process({"type": "shelf", "ts": 1, "tag_id": 1})
    eng.unregister(gone)
    out = feed(eng, [{"type": "exit", "ts": 2, "tag_id": 1}])
    assert [m["query"] for m in out] == ["keep"]
    assert keep in eng.queries and gone not in eng.queries


def test_ids_given_by_the_caller_are_never_given_again_and_survive_a_checkpoint():
    eng = Engine()
    assert eng.register("PATTERN SEQ(a x)", query_id=5) == 5
    assert eng.register("PATTERN SEQ(b x)") == 6 and eng.register("PATTERN SEQ(c x)", query_id=9) == 9
    assert eng.register("PATTERN SEQ(d x)") == 10
    assert list(Engine.restore(eng.snapshot()).sources) == [5, 6, 9, 10]


def test_query_added_mid_stream_sees_only_later_events():
    eng = Engine()
    eng.process({"type": "shelf", "ts": 1, "tag_id": 1})
    eng.register("PATTERN SEQ(shelf a, exit c) WHERE [tag_id]", name="late")
    out = feed(eng, [{"type": "exit", "ts": 2, "tag_id": 1}, {"type": "shelf", "ts": 3, "tag_id": 1}, {"type": "exit", "ts": 4, "tag_id": 1}])
    assert [m["bindings"] for m in out] == [{"a": [2], "c": [3]}]


def test_late_event_goes_to_dead_letters_with_seq():
    sink = io.StringIO()
    eng = Engine(dead_letters=DeadLetters(sink))
    eng.register("PATTERN SEQ(a x, b y)", name="q")
    assert feed(eng, [{"type": "a", "ts": 5}, {"type": "b", "ts": 3}, {"type": "b", "ts": 6}]) == [
        {"query": "q", "id": match_id("q", {"x": [0], "y": [2]}, 5, 6), "bindings": {"x": [0], "y": [2]}, "start": 5, "end": 6}
    ]
    letters = [json.loads(x) for x in sink.getvalue().splitlines()]
    assert [(d["seq"], d["reason"].split(":")[0]) for d in letters] == [(1, "late event")]
    assert eng.dead_letters.count == 1


def test_reorder_buffer_puts_events_in_ts_order():
    eng = Engine(max_delay=10, dead_letters=DeadLetters())
    eng.register("PATTERN SEQ(a x, b y) WHERE strict_contiguity(x, y)", name="q")
    out = []
    for r in [{"type": "b", "ts": 6}, {"type": "a", "ts": 5}, {"type": "c", "ts": 30}]:
        out += eng.process(r)
    # a (seq 1, ts 5) then b (seq 0, ts 6) once reordered: strict contiguity holds
    assert [m["bindings"] for m in out] == [{"x": [1], "y": [0]}]
    assert eng.flush() == []
    assert eng.dead_letters.count == 0


def test_equal_timestamps_are_ordered_by_seq():
    eng = Engine()
    eng.register("PATTERN SEQ(a x, b y) WHERE strict_contiguity(x, y)", name="q")
    out = feed(eng, [{"type": "a", "ts": 1}, {"type": "b", "ts": 1}, {"type": "b", "ts": 1}])
    assert [m["bindings"] for m in out] == [{"x": [0], "y": [1]}]


def test_process_accepts_events_with_their_own_seq():
    eng = Engine()
    eng.register("PATTERN SEQ(a x, b y)", name="q")
    out = feed(eng, [Event("a", 1.0, {}, 10), Event("b", 2.0, {}, 17)])
    assert out[0]["bindings"] == {"x": [10], "y": [17]}


def test_window_is_inclusive_and_prunes_runs():
    eng = Engine()
    eng.register("PATTERN SEQ(a x, b y) WHERE skip_till_any_match(x, y) WITHIN 10", name="q")
    out = feed(eng, [{"type": "a", "ts": 0}, {"type": "b", "ts": 10}, {"type": "b", "ts": 10.5}])
    assert [m["bindings"] for m in out] == [{"x": [0], "y": [1]}]


def test_memory_stays_flat_on_a_long_windowed_stream():
    eng = Engine()
    eng.register("PATTERN SEQ(a x, b y) WHERE skip_till_any_match(x, y) { [k] } WITHIN 20", name="q")
    for i in range(20_000):
        eng.process({"type": "ab"[i % 2], "ts": i, "k": i % 7})
    assert eng.stats.live_runs < 40
    assert eng.runtime.buffer.size < 200
    assert eng.stats.matches["q"] == 9_997  # each a meets the b 7 events later (same k)


def test_buffer_shares_events_between_runs():
    eng = Engine()
    eng.register("PATTERN SEQ(a x, b+ y[], c z) WHERE skip_till_any_match(x, y, z)", name="q")
    out = feed(eng, [{"type": t, "ts": i} for i, t in enumerate("abbbc")])
    assert len(out) == 7  # every non-empty subset of the three b's
    # the a is stored once although seven runs selected it
    assert eng.runtime.buffer.size <= 1 + 3 + 3


def test_non_overlapping_policy_from_the_query_and_the_engine():
    recs = [{"type": t, "ts": i, "k": 1} for i, t in enumerate("aabab")]
    per_query = Engine()
    per_query.register("PATTERN SEQ(a x, b y) WHERE skip_till_any_match(x, y) { [k] } OUTPUT non_overlapping", name="q")
    engine_wide = Engine(policy="non_overlapping")
    engine_wide.register("PATTERN SEQ(a x, b y) WHERE skip_till_any_match(x, y) { [k] }", name="q")
    for eng in (per_query, engine_wide):
        assert [m["bindings"] for m in feed(eng, recs)] == [{"x": [0], "y": [2]}, {"x": [3], "y": [4]}]


def test_return_builds_the_emitted_event():
    eng = Engine()
    eng.register(
        "PATTERN SEQ(stock+ a[], stock b) WHERE { [symbol] AND a[i].price > a[i-1].price } "
        "RETURN rise(symbol = b.symbol, n = a.len, top = max(a[..].price), prices = a.price, gone = b.nothing)",
        name="q",
    )
    out = feed(eng, [{"type": "stock", "ts": i, "symbol": 1, "price": p} for i, p in enumerate([1, 2, 3, 1])])
    longest = max(out, key=lambda m: len(m["bindings"]["a"]))
    assert longest["emit"] == {"type": "rise", "attrs": {"symbol": 1, "n": 3, "top": 3, "prices": [1, 2, 3], "gone": None}}


def test_advance_time_fires_trailing_negation_deadlines():
    eng = Engine()
    eng.register(SHOP.replace("exit c", "exit c, ~register d").replace("~register b, ", ""), name="q")
    assert eng.process({"type": "shelf", "ts": 0, "tag_id": 1}) == []
    assert eng.process({"type": "exit", "ts": 1, "tag_id": 1}) == []
    assert eng.advance_time(100) == []
    assert [m["bindings"] for m in eng.advance_time(100.01)] == [{"a": [0], "c": [1]}]


def test_malformed_dict_is_reported_and_the_stream_goes_on():
    sink = io.StringIO()
    eng = Engine(dead_letters=DeadLetters(sink))
    eng.register("PATTERN SEQ(a x, b y)", name="q")
    out = feed(eng, [{"type": "a", "ts": 1}, {"ts": 2}, {"type": "b", "ts": "soon"}, {"type": "b", "ts": 3}])
    assert [m["bindings"] for m in out] == [{"x": [0], "y": [3]}]
    assert [json.loads(x)["seq"] for x in sink.getvalue().splitlines()] == [1, 2]


# --- values that compare with nothing, refusals that leave no trace, options a restore keeps ------------------


def test_a_list_dict_or_null_key_puts_the_event_in_no_partition_and_the_stream_goes_on():
    for query in ("PATTERN SEQ(a x, a y) WHERE [k]", "PATTERN SEQ(a x, a y) WHERE [k, j]", "[k]//a//a",
                  "PATTERN SEQ(a+ x[], a y) WHERE [k]", "PATTERN SEQ({a x, b y}, a z) WHERE [k] WITHIN 10"):
        for merge in (False, True):
            eng = Engine(reports=None, merge_runs=merge)
            eng.register(query, name="keyed")
            eng.register("PATTERN SEQ(a x, c y)", name="plain")
            odd = [{"type": "a", "ts": 1, "k": [1], "j": 0}, {"type": "a", "ts": 2, "k": {"v": 1}, "j": 0},
                   {"type": "a", "ts": 3, "k": None, "j": 0}, {"type": "b", "ts": 3.5, "k": [3], "j": 0}]
            good = [{"type": "a", "ts": 4, "k": 3, "j": 0}, {"type": "b", "ts": 4.5, "k": 3, "j": 0},
                    {"type": "a", "ts": 5, "k": 3, "j": 0}, {"type": "c", "ts": 6, "k": [1], "j": 0}]
            out = feed(eng, odd + good)
            keyed = [m["bindings"] for m in out if m["query"] == "keyed"]
            assert keyed and all(s >= 4 for b in keyed for seqs in b.values() for s in seqs), (query, keyed)
            assert len([m for m in out if m["query"] == "plain"]) == 5 and eng.stats.failed == 0, query


def test_null_lists_and_dicts_compare_with_nothing():
    eng = Engine(reports=None)
    eng.register("PATTERN SEQ(a x, b y) WHERE x.v = y.v", name="eq")
    eng.register("PATTERN SEQ(a x, b y) WHERE x.v < y.v", name="lt")
    eng.register("PATTERN SEQ(a x, b y) WHERE NOT (x.v = y.v)", name="not_eq")
    out = feed(eng, [{"type": "a", "ts": 1, "v": v} for v in (None, [1], {"a": 1})]
               + [{"type": "b", "ts": 2, "v": v} for v in (None, [1], {"a": 1})])
    assert eng.stats.failed == 0
    assert {m["query"] for m in out} == {"not_eq"} and len(out) == 3  # (each a takes the first b)


def test_a_refused_query_leaves_the_engine_as_it_was():
    eng = Engine()
    eng.register("PATTERN SEQ(a x, b y)", name="ok")
    with pytest.raises(PatternError):
        eng.register("PATTERN SEQ(b+ x[], c y) WHERE x[i-1].v < x[x.len].v", name="bad")
    assert [q[1] for q in eng.snapshot()["queries"]] == ["ok"]
    eng.register("PATTERN SEQ(a x, c y)", name="bad")  # the name is free
    assert [q[1] for q in Engine.restore(eng.snapshot()).snapshot()["queries"]] == ["ok", "bad"]
    for name in (1, ["x"], ""):  # an int name could be an unnamed query's id
        with pytest.raises(YfppError, match="a query name must be a non-empty string"):
            eng.register("PATTERN SEQ(a x)", name=name)
    with pytest.raises(YfppError, match="unregister\\(\\) takes a query id"):
        eng.unregister([])


def test_max_delay_lowered_with_events_held_releases_them_first():
    for lower in ("setter", "restore"):
        eng = Engine(max_delay=5)
        eng.register("PATTERN SEQ(a x, b y)", name="q")
        assert feed_only(eng, [{"type": "a", "ts": 1}, {"type": "b", "ts": 2}]) == []
        if lower == "setter":
            eng.max_delay = 0
        else:
            eng = Engine.restore(eng.snapshot(), max_delay=0)
        out = feed_only(eng, [{"type": "a", "ts": 4}, {"type": "b", "ts": 6}]) + eng.flush()
        assert sorted((m["bindings"]["x"][0], m["bindings"]["y"][0]) for m in out) == [(0, 1), (2, 3)], lower
        assert all(m["start"] <= m["end"] for m in out)
    for bad in (-1, "x", 10**400, float("nan")):
        with pytest.raises(YfppError, match="max_delay must be a finite number >= 0"):
            Engine(max_delay=bad)
        with pytest.raises(YfppError, match="max_delay must be a finite number >= 0"):
            eng.max_delay = bad


def feed_only(eng: Engine, records: list[dict]) -> list[dict]:
    return [m for r in records for m in eng.process(r)]


def test_restore_keeps_full_events_and_the_feedback_guards():
    eng = Engine(full_events=True, max_feedback_depth=2, max_derived_per_event=7, reports=None,
                 dead_letters=DeadLetters(io.StringIO()))
    eng.register("//x => x(n = e1.n + 1) feedback", name="loop")
    back = Engine.restore(eng.snapshot(), reports=None, dead_letters=DeadLetters(io.StringIO()))
    runs = [feed(e, [{"type": "x", "ts": 1, "n": 0}]) for e in (eng, back)]
    assert runs[0] == runs[1] and len(runs[0]) == 3 and "events" in runs[0][0]  # x, then two derived (depth 2)


def test_full_events_are_copies_the_engine_does_not_read_back():
    eng = Engine(full_events=True)
    eng.register("PATTERN SEQ(a x, b y) WHERE skip_till_any_match(x, y) { x.v = y.v }", name="q")
    eng.process({"type": "a", "ts": 1, "v": 1})
    (m,) = eng.process({"type": "b", "ts": 2, "v": 1})
    m["events"]["x"][0]["attrs"]["v"] = 99
    assert len(eng.process({"type": "b", "ts": 3, "v": 1})) == 1


def test_integers_too_long_to_print_are_reported_not_raised():
    out = io.StringIO()
    eng = Engine(dead_letters=DeadLetters(out))
    eng.register("PATTERN SEQ(a x, b y)", name="q")
    assert eng.process({"type": "a", "ts": 10**5000}) == [] and eng.process(Event("a", 10**400)) == []
    assert eng.process({"type": "a", "ts": 5, "v": [10**5000]}) == []
    assert eng.process({"type": "a", "ts": 1, "v": [10**5000]}) == []  # late
    reasons = [(r["seq"], r["reason"]) for r in map(json.loads, out.getvalue().splitlines())]
    assert reasons[:2] == [(0, "malformed record: ts out of range: an integer of over 4,000 digits"),
                           (1, "malformed record: ts out of range: an integer of 401 digits")]
    assert reasons[2][1].startswith("late event") and "<an integer of over 4,000 digits>" in out.getvalue()


def test_wrong_argument_types_are_clear_errors():
    from yfpp.input.readers import read_events

    for opts in ({"max_feedback_depth": "x"}, {"max_derived_per_event": 0}, {"reports": 42}):
        with pytest.raises(YfppError, match="must be|reports must be a text stream"):
            Engine(**opts)
    with pytest.raises(YfppError, match=r"wrap bytes in io.BytesIO"):
        list(read_events(b'{"type": "a", "ts": 1}\n', "jsonl"))
    with pytest.raises(ValueError, match="max_depth must be an integer >= 1"):
        list(read_events(io.BytesIO(b""), "jsonl", max_depth="3"))


def test_integers_too_long_to_print_in_arguments_are_clear_errors():
    huge = 10**5000
    for call in (lambda: Engine(max_delay=huge), lambda: Engine().register("PATTERN SEQ(a x)", name=huge),
                 lambda: Engine().unregister(huge)):
        with pytest.raises(YfppError, match="an integer of over 4,000 digits"):
            call()
