"""Worker engines (``yfpp serve --workers N``, yfpp.service.worker_engines): the subscriptions' queries spread
over N engines, each fed every event, give each subscription exactly the matches it has in one engine, with
queries registered, changed and removed while events flow, across checkpoints and restores. Real sockets on
127.0.0.1, each wait bounded; the children are stopped with their service (or by pid)."""

from __future__ import annotations

import gc
import json
import os
import signal
import threading
import time
import weakref
from collections import defaultdict

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("fastapi", reason="the service needs pip install -e '.[serve]' in yfpp's clone")

from tests.service_helpers import LineListener, checkpoint_between, jsonl, listeners, scrape, wait_for  # noqa: E402,F401
from yfpp.engine import Engine  # noqa: E402
from yfpp.errors import YfppError  # noqa: E402
from yfpp.input.events import Event  # noqa: E402
from yfpp.language.query_text import parse_written_query  # noqa: E402
from yfpp.service.client import Client, ServiceError  # noqa: E402
from yfpp.service.config import ServiceConfig  # noqa: E402
from yfpp.service.server import BackgroundService  # noqa: E402
from yfpp.service.worker_engines import WorkerEngines  # noqa: E402

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="worker engines are forked")

QUERIES = ["//a//b", "PATTERN SEQ(a x, b y) WHERE x.v = y.v", "PATTERN SEQ(a x, c+ y[], b z) WITHIN 6",
           "PATTERN SEQ(a x, ~(c y), b z)", "//a[@v = 1]//c//b", "PATTERN SEQ({c x, a y}, b z) WITHIN 5",
           "PATTERN SEQ(b x, a y) WHERE [v] WITHIN 4"]


def pattern(query: str):
    return parse_written_query(query, "sase" if query.startswith("PATTERN") else "xpath", "s", None)


def stream(n: int, seed: int) -> list[dict]:
    import random

    rnd = random.Random(seed)
    return [{"type": rnd.choice("aabc"), "ts": i, "v": rnd.randint(0, 2)} for i in range(n)]


def key(r: dict) -> tuple:
    return r["query"], r["id"], json.dumps(r["bindings"], sort_keys=True)


# a step: ("add", query index) / ("remove", which of those registered) / ("events", how many)
STEPS = st.lists(st.one_of(st.tuples(st.just("add"), st.integers(0, len(QUERIES) - 1)),
                           st.tuples(st.just("remove"), st.integers(0, 10)),
                           st.tuples(st.just("events"), st.integers(1, 15))), min_size=1, max_size=14)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(STEPS, st.integers(0, 2**16), st.integers(2, 3))
def test_spread_over_workers_each_query_has_one_engines_matches(steps, seed, n):
    """The property: queries registered and removed between events, spread over ``n`` engines (children
    forked after the first registrations), have exactly the matches (per query) they have in one engine."""
    events = iter(stream(200, seed))
    got: list[dict] = []
    failed: list[str] = []
    lock = threading.Lock()
    one, main = Engine(), Engine()
    spread = WorkerEngines(n, main, {}, {}, None, lambda rs, arrived: got.extend(rs), lambda name, why: failed.append(why))
    expected: list[dict] = []
    live: list[tuple[int, int]] = []  # (id in one, id in spread)
    try:
        for i, (kind, arg) in enumerate(steps):
            if not spread.workers and (i == len(steps) // 2 or kind == "events"):  # (as the service: before events)
                spread.launch()
            if kind == "add":
                name = f"q{i}"
                (qid,) = spread.register_many([(pattern(QUERIES[arg]), name, None)], lock)
                live.append((one.register(pattern(QUERIES[arg]), name), qid))
            elif kind == "remove" and live:
                a, b = live.pop(arg % len(live))
                one.unregister(a)
                with lock:
                    spread.unregister(b)
            elif kind == "events":
                for e in [next(events) for _ in range(arg)]:
                    one.process_batch((Event.from_dict(e),), expected)
                    ev = Event.from_dict(e)
                    main.process_batch((ev,), got)
                    spread.feed(None, [ev])
        one.advance_time(1e6, expected)
        main.advance_time(1e6, got)
        spread.advance(1e6)
        if not spread.workers:
            spread.launch()
        # (a registration after the last message: answered once the child has all before it)
        spread.register_many([(pattern("//z"), f"last{i}", None) for i in range(n)], lock)
    finally:
        spread.close()
    assert failed == []
    assert sorted(map(key, got)) == sorted(map(key, expected))


def test_queries_are_spread_and_a_feedback_query_is_refused():
    lock = threading.Lock()
    spread = WorkerEngines(3, Engine(), {}, {}, None, lambda rs, arrived: None, lambda name, why: None)
    try:
        ids = spread.register_many([(pattern(QUERIES[i % 3]), f"q{i}", None) for i in range(10)], lock)
        assert sorted(spread.share_of[q] for q in ids) == [0, 0, 1, 1, 1, 1, 2, 2, 2, 2]  # (the main: half a child's)
        (refused,) = spread.register_many([(pattern("PATTERN SEQ(a x, b y) RETURN ab(v = x.v) FEEDBACK"), "fb", None)], lock)
        assert isinstance(refused, YfppError) and "--workers 1" in str(refused)
        gc.freeze()  # (as the service's start does)
        children = [weakref.ref(e.runtime) for e in spread._local[1:]]
        spread.launch()
        assert [ref() for ref in children] == [None, None]  # (the children's engines no longer held here)
    finally:
        spread.close()


def test_the_shares_sources_keep_what_their_engines_keep():
    """A restored share's queries are kept as its engine keeps them (a plan's pattern is made only when asked):
    their texts read without patterns, their patterns when asked, as one engine's ``sources``."""
    restored = Engine()
    texts = {5: QUERIES[0], 6: QUERIES[1]}
    for qid, text in texts.items():
        restored.register(text, f"q{qid}", query_id=qid)
    spread = WorkerEngines(2, Engine(), {1: restored}, {}, None, lambda rs, arrived: None, lambda name, why: None)
    try:
        (mine,) = spread.register_many([(pattern(QUERIES[2]), "p", None)], threading.Lock())
        assert dict(spread._elsewhere.kept()) == dict(restored.sources.kept())  # (the same objects, none made)
        assert {qid: spread.sources.text(qid) for qid in texts} == texts and spread.sources.text(mine) is None
        assert {qid: spread.sources[qid] for qid in texts} == {qid: restored.sources[qid] for qid in texts}
        assert sorted(spread.sources) == sorted([*texts, mine])
    finally:
        spread.close()


# --- the service ----------------------------------------------------------------------------


def config(tmp_path, **kw) -> ServiceConfig:
    opts = dict(port=0, jsonl_port=0, state=str(tmp_path / "state"), dead_letters=str(tmp_path / "dead.jsonl"),
                log_level="warning", workers=2)
    opts.update(kw)
    cfg = ServiceConfig(**opts)
    cfg.check()
    return cfg


def so_far(queries: dict[str, str], events: list[dict]) -> dict[str, set]:
    """Each query's matches in one engine, with no time advanced past the last event."""
    engine = Engine()
    for name, q in queries.items():
        engine.register(pattern(q), name)
    out: list[dict] = []
    engine.process_batch([dict(e) for e in events], out)
    by: dict[str, set] = defaultdict(set)
    for r in out:
        by[r["query"]].add(key(r))
    return by


def test_the_service_with_two_workers_gives_each_subscription_one_engines_matches(tmp_path, listeners):
    queries = {f"q{i}": q for i, q in enumerate(QUERIES)}
    outs = {name: listeners() for name in queries}
    events = stream(300, 3)
    expected = so_far(queries, events)  # (a stop does not end stream time: the matches made so far)
    assert all(expected[name] for name in ("q0", "q1", "q5"))  # (the queries do match)
    with BackgroundService(config(tmp_path)) as svc:
        c = Client(f"http://127.0.0.1:{svc.port}")
        for name, q in queries.items():
            c.subscribe(q, name=name, sink=outs[name].url)
        main = {p.name for p in [*svc.engine.queries.values(), *(m.plan for m in svc.engine.set_queries.values())]}
        assert 0 < len(main) < len(queries)  # (the others: the child's)
        (child,) = c.health()["workers"]
        c.post_events(jsonl(events))
        for name in queries:
            outs[name].wait_lines(len(expected[name]))
            assert {key(json.loads(x)) for x in outs[name].lines} == expected[name], name
        sid = next(s["id"] for s in c.subscriptions() if s["name"] not in main)
        usage = wait_for(lambda: (u := c.subscription(sid)["usage"])["engine"] == "worker 1" and u, what="its usage")
        assert usage["pid"] == child["pid"] and usage["cpu_s"] >= 0
        assert scrape(svc.port)["yfpp_live_runs"] == svc.live_runs


def test_put_delete_and_a_refused_feedback_query_with_workers(tmp_path, listeners):
    out = listeners()
    with BackgroundService(config(tmp_path)) as svc:
        c = Client(f"http://127.0.0.1:{svc.port}")
        c.subscribe("PATTERN SEQ(c x)", name="first")
        c.subscribe("PATTERN SEQ(c x)", name="second", sink=out.url)  # (the child's: the main engine has one)
        assert [p.name for p in svc.engine.queries.values()] == ["first"]
        with pytest.raises(ServiceError) as refused:
            c.subscribe("PATTERN SEQ(a x, b y) RETURN ab(v = x.v) FEEDBACK", name="fb")
        assert refused.value.status == 400 and "--workers 1" in str(refused.value.body)
        c.post_events(jsonl([{"type": "c", "ts": 1}]))
        assert [json.loads(x)["query"] for x in out.wait_lines(1)] == ["second"]
        c._request("PUT", "/subscriptions/s2", json.dumps({"query": "PATTERN SEQ(b x)"}).encode())
        c.post_events(jsonl([{"type": "c", "ts": 2}, {"type": "b", "ts": 3}]))
        assert json.loads(out.wait_lines(2)[1])["start"] == 3  # (the changed query's: c no longer matches)
        c.unsubscribe("s2")
        c.post_events(jsonl([{"type": "b", "ts": 4}]))
        wait_for(lambda: svc.events_in == 4, what="the events taken")
        assert svc.workers.share_of == {0: 0} and svc.status == "ok"
        c.unsubscribe("s1")  # the main engine's: its share's count goes down too (it places the next queries)
        wait_for(lambda: not svc.engine.queries, what="the main engine's query removed")
        assert svc.workers.share_of == {}


def test_checkpoints_with_workers_restore_each_share_and_fewer_workers_are_refused(tmp_path, listeners):
    queries = {f"q{i}": q for i, q in enumerate(QUERIES[:4])}
    outs = {name: listeners() for name in queries}
    events = stream(240, 11)
    with BackgroundService(config(tmp_path)) as svc:
        c = Client(f"http://127.0.0.1:{svc.port}")
        for name, q in queries.items():
            c.subscribe(q, name=name, sink=outs[name].url)
        checkpoint_between(svc, c, events, 80, 160)
    state = tmp_path / "state"
    assert [p.name for p in state.glob("worker-*.json")] == ["worker-1.json"]
    with pytest.raises(YfppError, match="--workers 2"):
        BackgroundService(config(tmp_path, workers=1))
    with BackgroundService(config(tmp_path, workers=3)) as svc:  # (more workers: the new share starts empty)
        c = Client(f"http://127.0.0.1:{svc.port}")
        assert sorted(svc.workers.share_of.values()) == [0, 0, 1, 1]
        c.post_events(jsonl(events[160:]))
        expected = so_far(queries, events)
        for name in queries:  # (a result kept at a stop may come twice)
            wait_for(lambda: len({key(r) for r in outs[name].results()}) >= len(expected[name]), what=name)
            assert {key(r) for r in outs[name].results()} == expected[name], name


def test_a_worker_that_dies_fails_the_service(tmp_path):
    with BackgroundService(config(tmp_path)) as svc:
        c = Client(f"http://127.0.0.1:{svc.port}")
        (child,) = c.health()["workers"]
        os.kill(child["pid"], signal.SIGKILL)
        wait_for(lambda: svc.failed is not None, what="the service failed")
        assert "worker engine" in svc.failed


@pytest.mark.parametrize("kw, message", [({"workers": 0}, "at least 1"), ({"workers": "many"}, "auto"),
                                         ({"workers": 2, "max_isolated": 1}, "max_isolated")])
def test_the_configuration_refuses_bad_workers(kw, message):
    with pytest.raises(YfppError, match=message):
        ServiceConfig(**kw).check()


def test_workers_auto_is_the_cores_available():
    from yfpp.cli import build_parser
    from yfpp.service.cli import serve_config

    cfg = serve_config(build_parser().parse_args(["serve", "--workers", "auto", "--no-state"]))
    assert cfg.workers == len(os.sched_getaffinity(0)) and cfg.state is None


def test_workers_without_state(tmp_path, listeners):
    out = listeners()
    with BackgroundService(config(tmp_path, state=None)) as svc:
        c = Client(f"http://127.0.0.1:{svc.port}")
        c.subscribe("PATTERN SEQ(c x)", name="main")
        c.subscribe("PATTERN SEQ(a x, c y)", name="child", sink=out.url)
        c.post_events(jsonl([{"type": "a", "ts": 1}, {"type": "c", "ts": 2}]))
        assert [json.loads(x)["bindings"] for x in out.wait_lines(1)] == [{"x": [0], "y": [1]}]


def test_a_query_over_its_cpu_share_in_a_worker_is_suspended_and_the_others_go_on(tmp_path, listeners):
    out = listeners()
    with BackgroundService(config(tmp_path, max_cpu_share=0.5)) as svc:
        c = Client(f"http://127.0.0.1:{svc.port}")
        for name, q in (("light0", "PATTERN SEQ(ping p)"), ("heavy", "//a//b"), ("light1", "PATTERN SEQ(ping p)")):
            c.subscribe(q, name=name, sink=out.url if name == "light1" else None)
        assert svc.workers.share_of == {0: 0, 1: 1, 2: 1}  # (heavy and light1: the child's)
        ts = 0
        end = time.monotonic() + 60
        while c.subscription("s2")["suspended"] is None:
            assert time.monotonic() < end, "the heavy subscription was never suspended"
            ts += 301
            c.post_events(jsonl([{"type": "a", "ts": ts - 301 + i} for i in range(300)] + [{"type": "b", "ts": ts}]))
            wait_for(lambda: svc.workers.workers[0].events_in == svc.events_in, 30, "the child caught up")
        assert "max_cpu_share" in c.subscription("s2")["suspended"]
        c.post_events(jsonl([{"type": "ping", "ts": ts + 1}]))
        assert [json.loads(x)["query"] for x in out.wait_lines(1)] == ["light1"]
        assert svc.workers.share_of == {0: 0, 2: 1} and svc.status == "ok"


@pytest.mark.parametrize("seed", [1, 2])
def test_subscriptions_added_and_deleted_between_events_match_as_in_one_engine(tmp_path, seed):
    """The service with two workers against one engine given the same registrations and removals at the same
    points of the stream: every subscription alive at the end has exactly one engine's matches, a deleted one
    those it made before its removal (or fewer: the last may be dropped with it)."""
    import random

    rnd = random.Random(seed)
    events = stream(160, seed)
    one = Engine()
    expected: list[dict] = []
    alive: dict[str, tuple[int, LineListener]] = {}  # name -> (id in one, its sink)
    deleted: dict[str, LineListener] = {}
    taken = 0
    with BackgroundService(config(tmp_path)) as svc:
        c = Client(f"http://127.0.0.1:{svc.port}")
        for step in range(14):
            if alive and rnd.random() < 0.3:
                name = rnd.choice(sorted(alive))
                qid, sink = alive.pop(name)
                c.unsubscribe(next(s["id"] for s in c.subscriptions() if s["name"] == name))
                one.unregister(qid)
                deleted[name] = sink
            elif rnd.random() < 0.5:
                name, query, sink = f"q{step}", rnd.choice(QUERIES), LineListener()
                c.subscribe(query, name=name, sink=sink.url)
                alive[name] = (one.register(pattern(query), name), sink)
            else:
                batch = events[taken:taken + rnd.randint(5, 30)]
                c.post_events(jsonl(batch))
                one.process_batch([dict(e) for e in batch], expected)
                taken += len(batch)
                wait_for(lambda: svc.events_in == taken, what="the events taken")
        by: dict[str, set] = defaultdict(set)
        for r in expected:
            by[r["query"]].add(key(r))
        try:
            for name, (_, sink) in alive.items():
                sink.wait_lines(len(by[name]))
                assert {key(r) for r in sink.results()} == by[name], name
            for name, sink in deleted.items():
                assert {key(r) for r in sink.results()} <= by[name], name
        finally:
            for _, sink in alive.values():
                sink.close()
            for sink in deleted.values():
                sink.close()


def test_a_worker_checkpoint_that_does_not_load_starts_its_queries_afresh(tmp_path, listeners):
    out = listeners()
    with BackgroundService(config(tmp_path)) as svc:
        c = Client(f"http://127.0.0.1:{svc.port}")
        c.subscribe("PATTERN SEQ(c x)", name="main")
        c.subscribe("PATTERN SEQ(a x, c y)", name="child", sink=out.url)
        c.post_events(jsonl([{"type": "a", "ts": 1}]))
        wait_for(lambda: svc.events_in == 1, what="the event taken")
    (tmp_path / "state" / "worker-1.json").write_text("{}")
    with BackgroundService(config(tmp_path)) as svc:
        c = Client(f"http://127.0.0.1:{svc.port}")
        assert sorted(s["name"] for s in c.subscriptions()) == ["child", "main"]
        assert sorted(svc.workers.share_of.values()) == [0, 1]
        c.post_events(jsonl([{"type": "a", "ts": 2}, {"type": "c", "ts": 3}]))
        # (its run of the first event is lost with its checkpoint; the next ones match)
        assert [json.loads(x)["bindings"] for x in out.wait_lines(1)] == [{"x": [1], "y": [2]}]
