"""Per-key quotas sampled while the service runs (yfpp.service.quotas.over_keys): a subscriber key over
``key_max_runs``, ``key_max_buffered`` or ``key_max_cpu_share`` gives up its costliest subscription, reported to its owner; the
other keys' subscriptions go on. Real sockets on 127.0.0.1, each wait bounded."""

from __future__ import annotations

import os
import time

import pytest

pytest.importorskip("fastapi", reason="the service needs pip install -e '.[serve]' in yfpp's clone")

from tests.service_helpers import TIMEOUT, jsonl, listeners, wait_for  # noqa: E402,F401
from yfpp.service.client import Client, ServiceError  # noqa: E402
from yfpp.service.config import ServiceConfig  # noqa: E402
from yfpp.service.server import BackgroundService  # noqa: E402

ADMIN = "the admin key, 16+ characters"


def serve(tmp_path, **kw) -> BackgroundService:
    """(Isolation engines at nice 10, not the default idle: as tests.service.test_service_isolation.config says.)"""
    kw.setdefault("isolation_priority", 10)
    return BackgroundService(ServiceConfig(port=0, jsonl_port=0, state=str(tmp_path / "state"), admin_key=ADMIN,
                                           dead_letters=str(tmp_path / "dead.jsonl"), log_level="warning", **kw))


def clients(svc) -> tuple[Client, Client, Client]:
    admin = Client(f"http://127.0.0.1:{svc.port}", ADMIN)
    alice = Client(admin.url, admin.create_key("alice", "subscriber")["key"])
    bob = Client(admin.url, admin.create_key("bob", "subscriber")["key"])
    return admin, alice, bob


def test_a_key_over_its_runs_gives_up_its_costliest_subscription(tmp_path):
    with serve(tmp_path, key_max_runs=100) as svc:
        admin, alice, bob = clients(svc)
        heavy = alice.subscribe("//a//b", name="heavy")["id"]
        small = alice.subscribe("PATTERN SEQ(c x)", name="small")["id"]
        admins = admin.subscribe("//a//e", name="admins")["id"]  # (shares heavy's branch: it counts half; no quota)
        bobs = bob.subscribe("PATTERN SEQ(d x, a y)", name="bobs")["id"]
        admin.post_events(jsonl([{"type": "a", "ts": i} for i in range(300)]))  # alice: 150 runs
        why = wait_for(lambda: alice.subscription(heavy)["suspended"], what="alice's costliest suspended")
        assert "key_max_runs=100" in why
        time.sleep(2.5)  # (two more samples)
        assert alice.subscription(small)["suspended"] is None
        assert bob.subscription(bobs)["suspended"] is None and admin.subscription(admins)["suspended"] is None
        admin.post_events(jsonl([{"type": t, "ts": 300 + i} for i, t in enumerate("dace")]))
        wait_for(lambda: bob.subscription(bobs)["counters"]["matches"] == 1, what="bob's query matching on")
        wait_for(lambda: alice.subscription(small)["counters"]["matches"] == 1, what="alice's other one on")
        wait_for(lambda: admin.subscription(admins)["counters"]["matches"] == 301, what="the admin's on")


def test_a_key_over_its_cpu_share_gives_up_its_costliest_subscription(tmp_path):
    with serve(tmp_path, key_max_cpu_share=0.3) as svc:
        admin, alice, bob = clients(svc)
        heavy = alice.subscribe("//a//b", name="heavy")["id"]
        light = bob.subscribe("PATTERN SEQ(ping p)", name="light")["id"]
        ts = 0
        end = time.monotonic() + 6 * TIMEOUT
        while alice.subscription(heavy)["suspended"] is None:  # each b completes a match with every a before it
            assert time.monotonic() < end, "the heavy subscription was never suspended"
            ts += 2001
            admin.post_events(jsonl([{"type": "a", "ts": ts - 2001 + i} for i in range(2000)] + [{"type": "b", "ts": ts}]))
        assert "key_max_cpu_share=0.3" in alice.subscription(heavy)["suspended"]
        admin.post_events(jsonl([{"type": "ping", "ts": ts + 1}]))
        wait_for(lambda: bob.subscription(light)["counters"]["matches"] == 1, what="bob's query matching on")
        assert bob.subscription(light)["suspended"] is None


#: one run that buffers every b after its a: a key's buffered events grow while its runs stay few
KLEENE = "PATTERN SEQ(a x, b+ y, c z)"


def a_and_bs(start: int, n: int = 300) -> bytes:
    """An ``a`` and ``n`` ``b`` events from ``ts`` ``start``: the Kleene query's run buffers them all."""
    return jsonl([{"type": "a", "ts": start}] + [{"type": "b", "ts": start + 1 + i} for i in range(n)])


def test_a_key_over_its_buffered_events_gives_up_its_costliest_subscription(tmp_path):
    with serve(tmp_path, key_max_runs=10, key_max_buffered=100) as svc:
        admin, alice, bob = clients(svc)
        heavy = alice.subscribe(KLEENE, name="heavy")["id"]
        small = alice.subscribe("PATTERN SEQ(d x, c y)", name="small")["id"]
        bobs = bob.subscribe("PATTERN SEQ(e x, b y)", name="bobs")["id"]
        admin.post_events(jsonl([{"type": "d", "ts": 0}]) + a_and_bs(1))  # alice: 2 runs, 302 buffered events
        why = wait_for(lambda: alice.subscription(heavy)["suspended"], what="alice's costliest suspended")
        assert "key_max_buffered=100" in why and "buffered events" in why
        time.sleep(2.5)  # (two more samples)
        assert alice.subscription(small)["suspended"] is None and bob.subscription(bobs)["suspended"] is None
        admin.post_events(jsonl([{"type": t, "ts": 400 + i} for i, t in enumerate("ebc")]))
        wait_for(lambda: bob.subscription(bobs)["counters"]["matches"] == 1, what="bob's query matching on")
        wait_for(lambda: alice.subscription(small)["counters"]["matches"] == 1, what="alice's other one on")


@pytest.mark.skipif(not hasattr(os, "fork"), reason="isolation engines are forked")
def test_a_key_quota_counts_the_buffered_events_of_its_isolated_queries_too(tmp_path, caplog):
    """Over the quota, the query is moved to an isolation engine (its run and buffered events with it); still over
    it there, by the child's reports, it is suspended."""
    with serve(tmp_path, key_max_buffered=100, max_isolated=1) as svc:
        admin, alice, bob = clients(svc)
        heavy = alice.subscribe(KLEENE, name="heavy")["id"]
        bobs = bob.subscribe("PATTERN SEQ(d x, e y)", name="bobs")["id"]
        admin.post_events(a_and_bs(0))
        # (two usage samples a second apart, an isolation engine forked between them and its first report: on a
        # loaded 2-core host more than TIMEOUT)
        why = wait_for(lambda: alice.subscription(heavy)["suspended"], 3 * TIMEOUT, "alice's isolated query suspended")
        assert "key_max_buffered=100" in why and admin.health()["isolated"] == []
        assert [getattr(r, "query_name", None) for r in caplog.records
                if r.getMessage() == "query moved to an isolation engine"] == ["heavy"]
        admin.post_events(jsonl([{"type": t, "ts": 400 + i} for i, t in enumerate("de")]))
        wait_for(lambda: bob.subscription(bobs)["counters"]["matches"] == 1, what="bob's query matching on")


def test_a_key_quota_counts_the_buffered_events_of_its_queries_in_worker_engines(tmp_path):
    with serve(tmp_path, key_max_buffered=100, workers=2) as svc:
        admin, alice, bob = clients(svc)
        small = alice.subscribe("PATTERN SEQ(d x, e y)", name="small")["id"]
        heavy = alice.subscribe(KLEENE, name="heavy")["id"]
        bobs = bob.subscribe("PATTERN SEQ(d x, c y)", name="bobs")["id"]
        assert svc.workers.share_of == {0: 0, 1: 1, 2: 1}  # (heavy: the child's, its usage from the child's reports)
        admin.post_events(a_and_bs(0))
        why = wait_for(lambda: alice.subscription(heavy)["suspended"], what="alice's query in a worker suspended")
        assert "key_max_buffered=100" in why and "buffered events" in why
        admin.post_events(jsonl([{"type": t, "ts": 400 + i} for i, t in enumerate("dec")]))
        wait_for(lambda: alice.subscription(small)["counters"]["matches"] == 1, what="alice's other one on")
        wait_for(lambda: bob.subscription(bobs)["counters"]["matches"] == 1, what="bob's query matching on")
        assert alice.subscription(small)["suspended"] is None


def test_a_queue_is_capped_in_bytes_as_well_as_in_results():
    from yfpp.service.sinks import Counters, Outbox, as_json_line

    def result(i: int) -> dict:
        return {"query": "q", "id": f"{i:016x}", "bindings": {"x": [i]}, "start": float(i), "end": float(i)}

    size = len(as_json_line(result(10)))
    for overflow, kept in (("drop_oldest", [17, 18, 19]), ("drop_newest", [10, 11, 12])):
        counters = Counters()
        box = Outbox(100, overflow, counters, max_bytes=3 * size + 1)
        for i in range(10, 20):
            box.offer(result(i))
        assert [r["bindings"]["x"][0] for r in box.items] == kept and box.bytes == 3 * size
        assert counters.dropped == 7
        taken = box.take_now(2)
        assert box.bytes == size
        box.give_back(taken)
        assert box.bytes == 3 * size and len(box.items) == 3
    box = Outbox(100, "drop_oldest", Counters(), max_bytes=size - 1)
    box.offer(result(10))  # larger than the whole queue
    assert not box.items and box.counters.dropped == 1 and box.bytes == 0


def test_queue_bytes_are_capped_by_the_server_and_per_key(tmp_path, listeners):
    closed = listeners(listen=False)  # (refuses connections: what the sink gets stays queued)
    with serve(tmp_path, max_queue_bytes=10_000, queue_bytes=5_000, key_max_queue_bytes=12_000) as svc:
        admin, alice, _ = clients(svc)
        with pytest.raises(ServiceError) as e:
            alice.subscribe("PATTERN SEQ(a x)", queue_bytes=20_000)
        assert e.value.status == 400 and "max_queue_bytes" in str(e.value)
        sub = alice.subscribe("PATTERN SEQ(a x)", sink=closed.url, queue_bytes=300)
        assert sub["queue_bytes"] == 300
        alice.subscribe("PATTERN SEQ(b x)")  # the server's 5,000: 5,300 bytes in all
        with pytest.raises(ServiceError) as e:
            alice.subscribe("PATTERN SEQ(c x)", queue_bytes=7_000)
        assert e.value.status == 429 and "key_max_queue_bytes" in str(e.value)
        admin.post_events(jsonl([{"type": "a", "ts": i} for i in range(20)]))
        c = wait_for(lambda: (c := alice.subscription(sub["id"])["counters"])["matches"] == 20 and c, what="matches")
        assert 1 <= c["queued"] <= 300 // 60 and c["dropped"] == 20 - c["queued"]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="isolation engines are forked")
def test_a_key_quota_counts_the_runs_of_its_isolated_queries_too(tmp_path):
    with serve(tmp_path, key_max_runs=100, max_isolated=1, isolate_degree=1) as svc:
        admin, alice, bob = clients(svc)
        heavy = alice.subscribe("//a//b", name="heavy")["id"]  # degree 2: in an isolation engine from the start
        small = alice.subscribe("PATTERN SEQ(c x)", name="small")["id"]
        bobs = bob.subscribe("PATTERN SEQ(d x, a y)", name="bobs")["id"]
        assert alice.subscription(heavy)["usage"]["engine"] == "isolated"
        admin.post_events(jsonl([{"type": "a", "ts": i} for i in range(300)]))  # alice: 300 runs, all in the child
        # (two usage samples a second apart, an isolation engine forked between them and its first report: on a
        # loaded 2-core host more than TIMEOUT)
        why = wait_for(lambda: alice.subscription(heavy)["suspended"], 3 * TIMEOUT, "alice's isolated query suspended")
        assert "key_max_runs=100" in why and admin.health()["isolated"] == []
        admin.post_events(jsonl([{"type": t, "ts": 300 + i} for i, t in enumerate("dac")]))
        wait_for(lambda: bob.subscription(bobs)["counters"]["matches"] == 1, what="bob's query matching on")
        wait_for(lambda: alice.subscription(small)["counters"]["matches"] == 1, what="alice's other one on")
        assert alice.subscription(small)["suspended"] is None


def test_a_key_cpu_share_counts_its_isolation_engines_cpu():
    """The parts of a sample: an isolated query's CPU since the last sample over the engines' CPU together."""
    from yfpp.engine import Engine
    from yfpp.service.accounting import Usage

    usage, children = Usage(), {"heavy": {"runs": 7, "runs_shed": 0, "buffered": 9, "cpu_s": 0.0, "engine": "isolated"}}
    usage.elsewhere = lambda: children
    engine = Engine()
    engine.register("PATTERN SEQ(a x, b y)", name="light")
    engine.process_batch([{"type": "a", "ts": 1}], [])
    usage.sample(engine)
    children["heavy"] = {**children["heavy"], "cpu_s": 50.0}  # (far more than the engine thread spent since)
    usage.sample(engine)
    runs, share, buffered = usage.parts["heavy"]
    assert runs == 7 and buffered == 9 and 0.99 < share <= 1.0 and usage.parts["light"][1] == pytest.approx(1.0 - share)
    assert usage.of("heavy")["engine"] == "isolated" and usage.of("light")["engine"] == "main"


def test_a_feedback_query_over_a_quota_is_suspended_not_moved_saying_why(tmp_path):
    with serve(tmp_path, key_max_runs=100, max_isolated=1) as svc:
        admin, alice, _ = clients(svc)
        fb = alice.subscribe("PATTERN SEQ(a x, b y) RETURN d(v = x.v) FEEDBACK", name="fb")["id"]
        admin.post_events(jsonl([{"type": "a", "ts": i} for i in range(300)]))
        why = wait_for(lambda: alice.subscription(fb)["suspended"], what="the feedback query suspended")
        assert "key_max_runs=100" in why and "a feedback query is not moved to an isolation engine" in why
        assert admin.health()["isolated"] == [] and not svc.engine.queries
