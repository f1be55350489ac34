"""Many subscriptions of one shape, differing only by constants: each matches as it would alone (the reference
evaluator's matches over the events it saw), registered one at a time or in batches, with unregisters between
events; and the engine's memory cap refuses registrations with an error."""

from __future__ import annotations

import json
from collections import Counter
from unittest.mock import patch

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.test_many_subscriptions import TEMPLATES, VALUES, text
from yfpp.engine import Engine
from yfpp.errors import YfppError
from yfpp.input.events import Event
from yfpp.language.query_text import parse_query
from yfpp.reference.oracle import reference_matches
from yfpp.state import memory_cap

constants = st.tuples(st.integers(-1, 4), st.integers(0, 3), st.integers(0, 5), st.sampled_from(["1", "x", "x1", "2"]),
                      st.integers(1, 6))


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(template=st.integers(0, len(TEMPLATES) - 1),
       subs=st.lists(st.tuples(constants, st.integers(0, 6), st.integers(0, 7), st.booleans()), min_size=1, max_size=12),
       events=st.lists(st.tuples(st.sampled_from("abc"), st.sampled_from(VALUES), st.sampled_from(VALUES),
                                 st.sampled_from([1, 2])), max_size=6),
       restore_at=st.integers(0, 7))
def test_one_shape_with_many_constants_matches_the_reference_per_query(template, subs, events, restore_at):
    """Subscription j of the shape is registered before event ``start`` (one at a time or in a batch) and
    unregistered before event ``stop`` (after the last event: kept); its matches are exactly the reference
    evaluator's over the events between (a removed query ending in a negation aside: its deadline may fall after).
    Before event ``restore_at`` the engine is snapshot and restored from the JSON of its checkpoint."""
    stream = [Event(t, float(i), {k: v for k, v in (("x", x), ("y", y), ("k", key)) if v is not None}, i)
              for i, (t, x, y, key) in enumerate(events)]
    n = len(stream)
    spans = [(min(a, n), max(min(a, n), min(b, n + 1))) for _, a, b, _ in subs]
    queries = [text(template, *c) for c, _, _, _ in subs]
    eng = Engine()
    ids: dict[int, int] = {}
    got: Counter = Counter()
    for i in range(n + 1):
        starting = [j for j, (start, _) in enumerate(spans) if start == i]
        batched = [j for j in starting if subs[j][3]]
        for j, qid in zip(batched, eng.register_many([(queries[j], f"q{j}") for j in batched])):
            assert isinstance(qid, int), qid
            ids[j] = qid
        for j in starting:
            if not subs[j][3]:
                ids[j] = eng.register(queries[j], f"q{j}")
        for j, (_, stop) in enumerate(spans):
            if stop == i:
                eng.unregister(ids.pop(j))
        if i == restore_at:
            eng = Engine.restore(json.loads(json.dumps(eng.snapshot())))
        if i < n:
            e = stream[i]
            got.update(_canon(m["query"], m["bindings"]) for m in eng.process(Event(e.type, e.ts, dict(e.attrs), e.seq)))
    got.update(_canon(m["query"], m["bindings"]) for m in eng.flush())
    want: Counter = Counter()
    for j, (start, stop) in enumerate(spans):
        want.update(_canon(f"q{j}", binds) for binds, _ in reference_matches(parse_query(queries[j]), stream[start:stop]))
    trailing = {f"q{j}" for j, (_, stop) in enumerate(spans)
                if stop <= n and not parse_query(queries[j]).components[-1].positive}
    assert Counter({k: c for k, c in got.items() if k[0] not in trailing}) == \
        Counter({k: c for k, c in want.items() if k[0] not in trailing})


def _canon(query: str, bindings: dict) -> tuple:
    return (query, tuple((k, tuple(v)) for k, v in bindings.items()))


def test_a_registration_past_the_memory_cap_is_refused_with_an_error():
    eng = Engine(max_memory_mb=10**6)
    assert eng.register("//a[@x = 1]") == 0
    with patch.object(memory_cap, "rss_kib", return_value=2048 * 1024):
        small = Engine(max_memory_mb=2048)
        with pytest.raises(YfppError, match="max_memory_mb=2,048"):
            small.register("//a[@x = 1]")
        got = small.register_many(["//a[@x = 2]", "//a[@x = 3]"])
        assert all(isinstance(r, YfppError) for r in got)
        assert not small.queries
    assert small.register("//a[@x = 2]") == 0  # (under the cap again)
    with pytest.raises(YfppError, match="max_memory_mb"):
        Engine(max_memory_mb=0)


def test_the_memory_cap_reads_the_resident_set_again_before_a_registration_could_reach_it():
    cap = memory_cap.MemoryCap(1024)  # 1 GiB; the process "holds" 1,000 MiB: 24 MiB to go, within NEAR_KIB
    with patch.object(memory_cap, "rss_kib", return_value=1000 * 1024) as rss:
        for _ in range(3):
            cap.admit()
        assert rss.call_count == 3
    with patch.object(memory_cap, "rss_kib", return_value=1024) as rss:  # far below: read once per MAX_SKIP
        for _ in range(2 * (memory_cap.MAX_SKIP + 1) + 1):
            cap.admit()
        assert rss.call_count == 3
    with patch.dict("os.environ", {"YFPP_MAX_MEMORY_MB": "12"}):
        assert memory_cap.default_cap_mib() == 12
    with patch.dict("os.environ", {"YFPP_MAX_MEMORY_MB": "lots"}), pytest.raises(YfppError, match="YFPP_MAX_MEMORY_MB"):
        memory_cap.default_cap_mib()


def test_a_registration_or_two_does_not_ask_how_many_objects_are_frozen(monkeypatch):
    """``collection_paused`` leaves the few objects a registration or two makes young, without asking the
    frozen count (a walk over every frozen object: 0.2 s at each POST /subscriptions in a service of 100,000);
    after a batch the objects go to the oldest generation, and objects frozen before stay frozen."""
    import gc

    asked = []
    real = gc.get_freeze_count
    monkeypatch.setattr(gc, "get_freeze_count", lambda: asked.append(1) or real())
    eng = Engine()
    eng.register_many(["//a[@x = 1]"])
    assert not asked and gc.isenabled()
    eng.register_many([f"//a[@x = {k}]" for k in range(2, 10_000)])  # (past _FEW objects made)
    assert asked and gc.isenabled()
    held = [[k] for k in range(10)]
    gc.freeze()
    try:
        eng.register_many([f"//b[@y = {k}]" for k in range(10_000)])
        assert real() > 0  # (not unfrozen)
    finally:
        gc.unfreeze()
    assert held


def test_an_engine_that_freezes_what_it_registers_leaves_it_to_no_collection():
    """``Engine(freeze_registered=True)`` ends each registration with ``gc.freeze()``: the queries registered, one at
    a time or in a batch, are in no generation the collector walks, and they match as an engine's that does not; a
    default engine freezes nothing."""
    import gc

    events = [Event(t, float(i), {"x": ("p", "q")[i % 2]}, i) for i, t in enumerate("abab")]
    texts = ["PATTERN SEQ(a e, b f) WHERE e.x = 'p' AND f.x = 'q'", "PATTERN SEQ(a e, b f) WHERE e.x = 'q'"]
    before = gc.get_freeze_count()
    plain = Engine(reports=None)
    plain.register(texts[0])
    plain.register_many(texts[1:])
    assert gc.get_freeze_count() == before
    try:
        frozen = Engine(reports=None, freeze_registered=True)
        one = frozen.register(texts[0])
        assert gc.get_freeze_count() > before
        batch = frozen.register_many(texts[1:])
        assert gc.isenabled()
        young = {id(o) for o in gc.get_objects()}
        assert not {id(frozen.queries[q]) for q in (one, *batch)} & young
        assert [frozen.process(ev) for ev in events] == [plain.process(ev) for ev in events]
    finally:
        gc.unfreeze()
