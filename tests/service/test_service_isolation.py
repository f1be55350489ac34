"""Isolation engines (yfpp.service.isolation): a heavy query moved to a child process of its own matches
exactly as it does alone, before, during and after the move; the service moves it, says where it runs,
and reports a child that ends. Real sockets on 127.0.0.1, each wait bounded."""

from __future__ import annotations

import json
import os
import signal
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("fastapi", reason="the service needs pip install -e '.[serve]' in yfpp's clone")

from tests.service_helpers import TIMEOUT, checkpoint_between, jsonl, listeners, wait_for  # noqa: E402,F401
from yfpp.engine import Engine  # noqa: E402
from yfpp.input.events import Event  # noqa: E402
from yfpp.service.client import Client, ServiceError  # noqa: E402
from yfpp.service.config import ServiceConfig  # noqa: E402
from yfpp.service.isolation import Isolation  # noqa: E402
from yfpp.service.server import BackgroundService  # noqa: E402

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="isolation engines are forked")

QUERIES = ["//a//b", "PATTERN SEQ(a x, b y) WHERE x.v = y.v", "PATTERN SEQ(a x, c+ y[], b z) WITHIN 6",
           "PATTERN SEQ(a x, ~(c y), b z)", "//a[@v = 1]//c//b"]


def config(tmp_path, **kw) -> ServiceConfig:
    """(The children at nice 10 rather than the default, idle: on a test host whose cores are all busy a SCHED_IDLE
    child gets almost no CPU and the bounded waits would fail; the default has its own test below.)"""
    opts = dict(port=0, jsonl_port=0, state=str(tmp_path / "state"), dead_letters=str(tmp_path / "dead.jsonl"),
                log_level="warning", max_isolated=1, isolation_priority=10)
    opts.update(kw)
    return ServiceConfig(**opts)


def key(r: dict) -> tuple:
    return r["id"], json.dumps(r["bindings"], sort_keys=True)


def alone(query: str, events: list[dict]) -> list[tuple]:
    """The matches of ``query`` registered alone in an engine of its own, to the end of time."""
    engine = Engine()
    engine.register(query, name="heavy")
    out: list[dict] = []
    engine.process_batch([dict(e) for e in events], out)
    engine.advance_time(1e6, out)
    return sorted(key(r) for r in out if r["query"] == "heavy")


def stream(n: int, seed: int) -> list[dict]:
    import random

    rnd = random.Random(seed)
    return [{"type": rnd.choice("aabc"), "ts": i, "v": rnd.randint(0, 2)} for i in range(n)]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(QUERIES), st.integers(0, 2**16), st.integers(0, 40), st.lists(st.sampled_from(QUERIES), max_size=3))
def test_moved_at_any_point_a_query_matches_as_alone(query, seed, at, sharers):
    """The property: a query moved after any prefix of the stream, beside any sharers, has the matches it has
    alone (those made in the main engine before the move, then those of its child)."""
    events = stream(40, seed)
    got: list[dict] = []
    failed: list[str] = []
    iso = Isolation(lambda rs, arrived: got.extend(rs), lambda name, why: failed.append(why), most=1)
    engine = Engine()
    qid = engine.register(query, name="heavy")
    for i, q in enumerate(sharers):
        engine.register(q, name=f"sharer{i}")
    out: list[dict] = []
    for n, e in enumerate(events):
        if n == at:
            iso.move(engine, qid)
        ev = Event.from_dict(e)
        engine.process_batch((ev,), out)
        iso.feed(None, [ev])
    if at >= len(events):
        iso.move(engine, qid)
    iso.advance(1e6)  # (the end of the stream, as alone() gives it)
    iso.close()
    assert not failed
    assert "heavy" not in [p.name for p in engine.queries.values()]
    mine = [r for r in out if r["query"] == "heavy"] + got
    assert sorted(key(r) for r in mine) == alone(query, events)


FEEDBACK = "PATTERN SEQ(a x, b y) RETURN d(v = x.v) FEEDBACK"  #: derives a d event from each a, b
READERS = ["PATTERN SEQ(d x, c y)", "//d//b", "PATTERN SEQ(a x, d y) WHERE x.v = y.v", "PATTERN SEQ(d x, d y) WITHIN 8"]


def with_feedback(engine: Engine, events: list[dict], out: list[dict], reg: int, unreg: int,
                  before=lambda n: None, after=lambda ev: None) -> None:
    """``events`` through ``engine``, the feedback query registered before event ``reg`` and unregistered before
    event ``unreg`` (``before(n)``, and the calls the service makes beside the engine's, first; ``after(ev)``
    once the engine took event ``ev``)."""
    fb = None
    for n, e in enumerate(events):
        before(n)
        if n == reg:
            fb = engine.register(FEEDBACK, name="fb")
            before(("registered", fb))
        if n == unreg and fb is not None:
            engine.unregister(fb)
            before(("unregistered", fb))
        ev = Event.from_dict(e)
        engine.process_batch((ev,), out)
        after(ev)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(READERS), st.integers(0, 2**16), st.integers(0, 40), st.integers(0, 40), st.integers(0, 45),
       st.booleans())
def test_a_moved_query_reads_the_derived_events_of_feedback_queries_as_alone(query, seed, at, reg, unreg, follow):
    """The property: a moved query that reads the derived events of a feedback query registered (and later
    unregistered, the children told by ``drop`` or, as a start does, by ``follow``) before or after the move has
    the matches it has alone beside that feedback query."""
    events = stream(40, seed)
    expected: list[dict] = []
    engine = Engine()
    engine.register(query, name="heavy")
    with_feedback(engine, events, expected, reg, unreg)
    engine.advance_time(1e6, expected)

    got: list[dict] = []
    failed: list[str] = []
    iso = Isolation(lambda rs, arrived: got.extend(rs), lambda name, why: failed.append(why), most=1)
    engine = Engine()
    qid = engine.register(query, name="heavy")

    def beside(step) -> None:  # (what the service does beside the engine: Service._register_patterns, _drop_query)
        if step == at:
            iso.move(engine, qid)
        elif isinstance(step, tuple) and step[0] == "registered":
            iso.registered(engine, [step[1]])
        elif isinstance(step, tuple) and follow:
            iso.follow(engine)
        elif isinstance(step, tuple):
            iso.drop(step[1])

    out: list[dict] = []
    with_feedback(engine, events, out, reg, unreg, beside, lambda ev: iso.feed(None, [ev]))
    if at >= len(events):
        iso.move(engine, qid)
    iso.advance(1e6)
    iso.close()
    assert not failed
    mine = [r for r in out if r["query"] == "heavy"] + got
    assert sorted(key(r) for r in mine) == sorted(key(r) for r in expected if r["query"] == "heavy")


def test_a_feedback_query_over_isolate_degree_is_refused_saying_why(tmp_path):
    with BackgroundService(config(tmp_path, isolate_degree=1)) as svc:
        c = Client(f"http://127.0.0.1:{svc.port}")
        with pytest.raises(ServiceError) as e:
            c.subscribe("//a//b => d feedback", name="loop")  # degree 2, and it cannot be isolated
        assert e.value.status == 403 and "isolate_degree=1" in str(e.value) and "feedback query" in str(e.value)
        c.subscribe("PATTERN SEQ(a x) RETURN d(v = x.v) FEEDBACK", name="fb")  # degree 1: in the main engine
        c.subscribe("//d//b", name="heavy")  # degree 2: isolated, reading fb's derived events from its own copy
        assert [p.name for p in svc.engine.queries.values()] == ["fb"] and list(svc.isolation.by_qid) == [1]
        c.post_events(jsonl([{"type": "a", "ts": 1, "v": 0}, {"type": "b", "ts": 2}]))
        wait_for(lambda: c.subscription("s2")["counters"]["matches"] == 1, what="the isolated reader matching")


def test_a_query_moved_by_the_service_matches_as_alone_and_says_where_it_runs(tmp_path, listeners):
    heavy_out, light_out = listeners(), listeners()
    events = stream(300, 7)
    with BackgroundService(config(tmp_path)) as svc:
        c = Client(f"http://127.0.0.1:{svc.port}")
        c.subscribe("//a//b", name="heavy", sink=heavy_out.url)
        c.subscribe("PATTERN SEQ(c x)", name="light", sink=light_out.url)
        assert c.subscription("s1")["usage"]["engine"] == "main"
        c.post_events(jsonl(events[:100]))  # before the move: its runs so far go with it
        wait_for(lambda: svc.events_in == 100, what="the first events taken")
        with svc.engine_lock:
            assert svc._isolate(svc.subs["s1"])
        assert [p.name for p in svc.engine.queries.values()] == ["light"]
        c.post_events(jsonl(events[100:200]))
        c.post_events(jsonl(events[200:]))
        expected = alone("//a//b", events)
        lines = heavy_out.wait_lines(len(expected))
        assert sorted(key(json.loads(x)) for x in lines) == expected
        assert len(light_out.wait_lines(sum(e["type"] == "c" for e in events))) == sum(e["type"] == "c" for e in events)
        usage = wait_for(lambda: (u := c.subscription("s1")["usage"])["engine"] == "isolated" and u, what="its usage")
        assert usage["pid"] == c.health()["isolated"][0]["pid"] and c.subscription("s1")["suspended"] is None
        pid = usage["pid"]
        c.unsubscribe("s1")
        wait_for(lambda: not _alive(pid), what="its child reaped once deleted")
        assert svc.status == "ok"


def test_a_query_over_its_cpu_share_is_moved_not_suspended_and_keeps_matching(tmp_path, listeners):
    out = listeners()
    with BackgroundService(config(tmp_path, max_cpu_share=0.3)) as svc:
        c = Client(f"http://127.0.0.1:{svc.port}")
        c.subscribe("//a//b", name="heavy")
        c.subscribe("PATTERN SEQ(ping p)", name="light", sink=out.url)
        ts = 0

        def burst() -> bytes:
            nonlocal ts
            ts += 2001
            return jsonl([{"type": "a", "ts": ts - 2001 + i} for i in range(2000)] + [{"type": "b", "ts": ts}])

        end = time.monotonic() + 6 * TIMEOUT
        while c.subscription("s1")["usage"]["engine"] != "isolated":
            assert time.monotonic() < end, "the heavy subscription was never moved"
            assert c.subscription("s1")["suspended"] is None
            c.post_events(burst())
        assert [p.name for p in svc.engine.queries.values()] == ["light"]
        matched = c.subscription("s1")["counters"]["matches"]
        c.post_events(jsonl([{"type": "b", "ts": ts + 1}, {"type": "ping", "ts": ts + 2}]))
        assert [json.loads(x)["query"] for x in out.wait_lines(1)] == ["light"]
        wait_for(lambda: c.subscription("s1")["counters"]["matches"] > matched, what="the moved query matching on")


def test_isolate_degree_starts_a_costly_query_isolated_and_a_child_that_dies_is_reported(tmp_path):
    with BackgroundService(config(tmp_path, isolate_degree=1)) as svc:
        c = Client(f"http://127.0.0.1:{svc.port}")
        c.subscribe("PATTERN SEQ(ping p)", name="light")  # degree 1: stays
        c.subscribe("//a//b", name="heavy")  # degree 2: isolated from the start
        assert [p.name for p in svc.engine.queries.values()] == ["light"]
        c.subscribe("//a//c", name="second")  # max_isolated=1: stays in the main engine
        assert sorted(p.name for p in svc.engine.queries.values()) == ["light", "second"]
        c.post_events(jsonl([{"type": "a", "ts": 1}]))
        (child,) = wait_for(lambda: c.health()["isolated"], what="the child listed")
        os.kill(child["pid"], signal.SIGKILL)
        why = wait_for(lambda: c.subscription("s2")["suspended"], what="the subscription suspended")
        assert "isolation engine ended" in why
        c.post_events(jsonl([{"type": "c", "ts": 2}]))
        wait_for(lambda: c.subscription("s3")["counters"]["matches"] == 1, what="the others going on")
        assert c.health()["isolated"] == [] and svc.status == "ok"


def _alive(pid: int) -> bool:
    """Whether process ``pid`` is there (a zombie not yet reaped is)."""
    return os.path.exists(f"/proc/{pid}")


def test_an_isolated_query_is_checkpointed_with_the_service_and_restored_in_a_child(tmp_path, listeners):
    out = listeners()
    events = stream(240, 11)
    with BackgroundService(config(tmp_path, isolate_degree=1)) as svc:
        c = Client(f"http://127.0.0.1:{svc.port}")
        c.subscribe("//a//b", name="heavy", sink=out.url)  # isolated from the start
        c.subscribe("PATTERN SEQ(c x)", name="light")
        checkpoint_between(svc, c, events, 80, 160)
    state = tmp_path / "state"
    assert [p.name for p in state.glob("isolated-q*.json")] == ["isolated-q0.json"]
    with BackgroundService(config(tmp_path, isolate_degree=1)) as svc:  # (the stop's checkpoint, restored)
        c = Client(f"http://127.0.0.1:{svc.port}")
        assert [p.name for p in svc.engine.queries.values()] == ["light"] and list(svc.isolation.by_qid) == [0]
        c.post_events(jsonl(events[160:]))
        expected = alone("//a//b", events)
        wait_for(lambda: len({key(json.loads(x)) for x in out.lines}) >= len(expected), what="all its matches")
        assert {key(json.loads(x)) for x in out.lines} == set(expected)  # (a result kept at a stop may come twice)


@pytest.mark.parametrize("field, value", [("max_isolated", -1), ("isolate_degree", 0), ("key_max_runs", 0),
                                          ("key_max_cpu_share", 1.5), ("queue_bytes", 0), ("health_port", 70000),
                                          ("isolation_priority", 20), ("isolation_priority", "low")])
def test_the_configuration_refuses_bad_values_by_name(field, value):
    from yfpp.errors import YfppError

    with pytest.raises(YfppError, match=field):
        ServiceConfig.load(None, {field: value})


def test_a_query_changed_to_a_costly_one_is_isolated_and_back_to_a_cheap_one_is_not(tmp_path):
    with BackgroundService(config(tmp_path, isolate_degree=1)) as svc:
        c = Client(f"http://127.0.0.1:{svc.port}")
        c.subscribe("PATTERN SEQ(c x)", name="q")
        assert [p.name for p in svc.engine.queries.values()] == ["q"]
        c._request("PUT", "/subscriptions/s1", json.dumps({"query": "//a//b"}).encode())
        (child,) = c.health()["isolated"]
        assert not svc.engine.queries and c.subscription("s1")["usage"]["engine"] == "isolated"
        c.post_events(jsonl([{"type": "a", "ts": 1}, {"type": "b", "ts": 2}]))
        wait_for(lambda: c.subscription("s1")["counters"]["matches"] == 1, what="the isolated query matching")
        c._request("PUT", "/subscriptions/s1", json.dumps({"query": "PATTERN SEQ(c x)"}).encode())
        assert [p.name for p in svc.engine.queries.values()] == ["q"] and c.health()["isolated"] == []
        wait_for(lambda: not _alive(child["pid"]), what="the child reaped")
        c.post_events(jsonl([{"type": "c", "ts": 3}]))
        wait_for(lambda: c.subscription("s1")["counters"]["matches"] == 2, what="the query back in the main engine")


@pytest.mark.parametrize("priority", [None, "idle", 10])
def test_the_isolation_engines_run_at_the_configured_cpu_priority(tmp_path, priority):
    """Idle (SCHED_IDLE) unless told otherwise."""
    from yfpp.cli import build_parser
    from yfpp.service.cli import serve_config

    flags = ["--isolation-priority", str(priority)] if priority is not None else []
    assert serve_config(build_parser().parse_args(["serve", *flags])).isolation_priority == (priority or "idle")
    given = {"isolation_priority": priority} if priority is not None else {}
    with BackgroundService(ServiceConfig(port=0, jsonl_port=0, state=str(tmp_path / "state"), log_level="warning",
                                         max_isolated=1, isolate_degree=1, **given)) as svc:
        c = Client(f"http://127.0.0.1:{svc.port}")
        c.subscribe("//a//b", name="heavy")  # isolated from the start
        (child,) = c.health()["isolated"]
        if priority != 10:
            wait_for(lambda: os.sched_getscheduler(child["pid"]) == os.SCHED_IDLE, what="the child at SCHED_IDLE")
        else:
            mine = os.getpriority(os.PRIO_PROCESS, 0)
            wait_for(lambda: os.getpriority(os.PRIO_PROCESS, child["pid"]) == min(19, mine + 10), what="the child niced")


def test_an_isolated_querys_results_with_no_destination_are_counted_and_with_one_delivered(tmp_path, listeners):
    """The service unpickles a child's results only for a subscription with a destination; the counts are those
    of a query in the main engine either way."""
    out = listeners()
    events = stream(200, 5)
    with BackgroundService(config(tmp_path, isolate_degree=1)) as svc:
        c = Client(f"http://127.0.0.1:{svc.port}")
        c.subscribe("//a//b", name="heavy")  # isolated from the start; no sink, no stream
        c.post_events(jsonl(events[:100]))
        first = len(alone("//a//b", events[:100]))
        counters = wait_for(lambda: (k := c.subscription("s1")["counters"])["matches"] == first and k, what="counted")
        assert counters["dropped"] == first and counters["delivered"] == 0
        c._request("PUT", "/subscriptions/s1", json.dumps({"query": "//a//b", "sink": out.url}).encode())
        assert c.subscription("s1")["usage"]["engine"] == "isolated"
        c.post_events(jsonl(events[100:]))
        expected = [k for k in alone("//a//b", events) if k not in set(alone("//a//b", events[:100]))]
        assert sorted(key(json.loads(x)) for x in out.wait_lines(len(expected))) == sorted(expected)
        counters = wait_for(lambda: (k := c.subscription("s1")["counters"])["delivered"] == len(expected) and k,
                            what="delivered")
        assert counters["matches"] == first + len(expected) and counters["dropped"] == first


def test_a_pull_stream_gets_an_isolated_querys_results(tmp_path):
    import threading

    events = stream(120, 9)
    expected = alone("//a//b", events)
    got: list[tuple] = []
    with BackgroundService(config(tmp_path, isolate_degree=1)) as svc:
        c = Client(f"http://127.0.0.1:{svc.port}")
        c.subscribe("//a//b", name="heavy")  # isolated from the start; no push sink

        def read() -> None:
            for r in Client(c.url).matches("s1", timeout=TIMEOUT):
                got.append(key(r))
                if len(got) == len(expected):
                    return

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        wait_for(lambda: c.subscription("s1")["counters"]["listeners"] == 1, what="the stream open")
        c.post_events(jsonl(events))
        reader.join(6 * TIMEOUT)
        assert sorted(got) == expected
        assert c.subscription("s1")["counters"]["dropped"] == 0
