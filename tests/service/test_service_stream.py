"""``yfpp serve`` hands results to the loop as the engine makes them: in bounded chunks, in order, with no
deadlock while the engine thread waits for the loop in the middle of an event (loopback sockets, bounded waits)."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("fastapi", reason="the service needs pip install -e '.[serve]' in yfpp's clone")

from tests.service_helpers import TIMEOUT, jsonl, listeners, scrape, wait_for  # noqa: E402,F401
from yfpp.engine import Engine  # noqa: E402
from yfpp.service import server  # noqa: E402
from yfpp.service.client import Client  # noqa: E402
from yfpp.service.config import ServiceConfig  # noqa: E402
from yfpp.service.server import CHUNK, BackgroundService, Service  # noqa: E402

#: one match per partition k, known when the stream passes ts + 1: one late event (or a quiet feed) releases all
QUIET = "PATTERN SEQ({A a}, ~N n) WHERE [k] WITHIN 1"
N = 5000  #: partitions, so matches released at once: several CHUNKs, more than HANDED_OVER below
OPENS = [{"type": "A", "ts": 0, "k": k} for k in range(N)]
LATE = {"type": "X", "ts": 10, "k": -1}


def config(tmp_path: Path, **kw) -> ServiceConfig:
    opts = dict(port=0, jsonl_port=0, state=None, dead_letters=str(tmp_path / "dead.jsonl"), log_level="warning")
    opts.update(kw)
    return ServiceConfig(**opts)


def expected(query: str, records: list[dict], idle_to: float | None = None) -> list[dict]:
    eng = Engine()
    eng.register(query, name="q")
    out = [m for r in records for m in eng.process(r)]
    return out + (eng.advance_time(idle_to) if idle_to is not None else [])


class HandOvers:
    """Records what the engine thread hands to the loop: the largest list, the most results waiting at once, and
    the most one turn of the loop routed."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch):
        self.largest = self.waiting = self.routed = 0
        self._turn = 0  # the results the current turn routed
        hand_over, route, route_batch = Service._hand_over, Service._route_turn, Service._route_batch

        def record_hand_over(svc: Service, results: list[dict]) -> None:
            self.largest = max(self.largest, len(results))
            hand_over(svc, results)
            with svc._room:
                self.waiting = max(self.waiting, svc._handed_over)

        monkeypatch.setattr(Service, "_hand_over", record_hand_over)
        def record_turn(svc: Service, everything: bool = False) -> None:
            with svc._room:
                self.waiting = max(self.waiting, svc._handed_over)
            self._turn = 0
            route(svc, everything)
            if not everything:
                self.routed = max(self.routed, self._turn)

        def record_batch(svc: Service, batch: list[dict], arrived: float | None) -> None:
            self._turn += len(batch)
            route_batch(svc, batch, arrived)

        monkeypatch.setattr(Service, "_route_turn", record_turn)
        monkeypatch.setattr(Service, "_route_batch", record_batch)


@pytest.mark.parametrize("query", [QUIET, QUIET.replace("{A a}", "A a")])  # an event-set query, a pattern query
@pytest.mark.parametrize("release", ["late event", "advance_idle"])
def test_matches_one_event_releases_reach_the_loop_in_chunks_in_order(tmp_path, listeners, monkeypatch, release, query):
    monkeypatch.setattr(server, "HANDED_OVER", 2 * CHUNK)
    monkeypatch.setattr(server, "ROUTE_TURN", 1)  # (one hand-over a turn of the loop: the rest on the next turns)
    seen = HandOvers(monkeypatch)
    out = listeners()
    idle = release == "advance_idle"
    with BackgroundService(config(tmp_path, advance_idle=0.3 if idle else None)) as svc:
        c = Client(f"http://127.0.0.1:{svc.port}")
        c.subscribe(query, sink=out.url, name="q", queue=N)
        c.post_events(jsonl(OPENS if idle else OPENS + [LATE]))
        out.wait_lines(N, timeout=30)
        svc_idle_to = svc._advanced
    want = expected(query, OPENS if idle else OPENS + [LATE], idle_to=svc_idle_to if idle else None)
    assert len(want) == N and out.results() == want
    assert seen.largest <= CHUNK  # not the event's N
    assert seen.waiting < server.HANDED_OVER + CHUNK and 0 < seen.routed <= CHUNK


def test_an_event_the_engine_fails_on_is_a_dead_letter_and_the_batch_goes_on(tmp_path, listeners, monkeypatch):
    """Its matches made before the fault are delivered; the events after it, in the same batch, are processed."""
    out = listeners()
    with BackgroundService(config(tmp_path)) as svc:
        c = Client(f"http://127.0.0.1:{svc.port}")
        c.subscribe("PATTERN SEQ(tick t)", sink=out.url, name="ticks")
        real = svc.engine.process_batch

        def process_batch(events, results):  # (the engine takes a batch in one call: a fault ends that call)
            for ev in events:
                real((ev,), results)
                if ev.attrs.get("bug"):
                    raise RuntimeError("a fault after the event's first matches")
            return results

        monkeypatch.setattr(svc.engine, "process_batch", process_batch)
        assert c.post_events(jsonl([{"type": "tick", "ts": i, "bug": i == 1} for i in range(3)]))["events"] == 3
        out.wait_lines(3)
        assert [r["bindings"]["t"] for r in out.results()] == [[0], [1], [2]]
        wait_for(lambda: svc.dead_letters.count == 1, what="the dead letter")
    [letter] = [json.loads(x) for x in (tmp_path / "dead.jsonl").read_text().splitlines()]
    assert letter["seq"] == 1 and letter["reason"] == "engine error: RuntimeError: a fault after the event's first matches"


def test_requests_go_on_while_the_engine_thread_waits_for_the_loop_in_the_middle_of_an_event(tmp_path, monkeypatch):
    """The engine thread may wait for room holding engine_lock: subscribing and deleting (which need that lock)
    wait for the event, the loop keeps routing and answering, and nothing deadlocks."""
    monkeypatch.setattr(server, "HANDED_OVER", 1)  # every hand-over after the first waits for the loop
    mid_event, go = threading.Event(), threading.Event()
    with BackgroundService(config(tmp_path)) as svc:
        c = Client(f"http://127.0.0.1:{svc.port}", timeout=TIMEOUT)
        c.subscribe(QUIET, name="q")
        old = c.subscribe("PATTERN SEQ(tick t)", name="old")["id"]
        hand_over = svc._hand_over

        def gated(results: list[dict]) -> None:
            if not go.is_set():  # the first hand-over: CHUNK results, in the middle of the releasing event
                assert svc.engine_lock.locked()
                mid_event.set()
                go.wait(TIMEOUT)
            hand_over(results)

        svc._hand_over = gated
        c.post_events(jsonl(OPENS + [LATE]))
        assert mid_event.wait(TIMEOUT)
        done: dict[str, object] = {}
        requests = {"subscribe": lambda: c.subscribe("PATTERN SEQ(tock t)", name="new")["name"],
                    "delete": lambda: c.unsubscribe(old), "health": lambda: c.health()["status"],
                    "metrics": lambda: scrape(svc.port)["yfpp_engine_up"]}
        threads = [threading.Thread(target=lambda k=k, f=f: done.__setitem__(k, f()), daemon=True)
                   for k, f in requests.items()]
        for t in threads:
            t.start()
        wait_for(lambda: "health" in done and "metrics" in done, what="the loop to answer while the event runs")
        time.sleep(0.2)
        assert "subscribe" not in done and "delete" not in done  # waiting for engine_lock, off the loop
        go.set()
        for t in threads:
            t.join(TIMEOUT)
        assert done == {"health": "ok", "metrics": 1.0, "subscribe": "new", "delete": None}
        wait_for(lambda: svc.by_name["q"].counters.matches == N, what="every match routed")
        assert sorted(svc.by_name) == ["new", "q"]


def test_feedback_queries_stream_their_matches_and_the_derived_events_ones(tmp_path, listeners):
    out = listeners()
    pairs = "PATTERN SEQ(a x, b y) WHERE [k] WITHIN 10 RETURN ab(k = x.k) FEEDBACK"
    after = "PATTERN SEQ(ab z, c w) WHERE [k] WITHIN 10"
    feed = [{"type": t, "ts": i, "k": k} for i, (t, k) in enumerate([("a", 1), ("a", 2), ("b", 1), ("b", 2), ("c", 2)])]
    eng = Engine()
    eng.register(pairs, name="pairs")
    eng.register(after, name="after")
    want = [m for r in feed for m in eng.process(r)]
    with BackgroundService(config(tmp_path)) as svc:
        c = Client(f"http://127.0.0.1:{svc.port}")
        c.subscribe(pairs, sink=out.url, name="pairs")
        c.subscribe(after, sink=out.url, name="after")
        c.post_events(jsonl(feed))
        out.wait_lines(len(want))
    assert sorted(out.results(), key=lambda m: m["id"]) == sorted(want, key=lambda m: m["id"])
    assert [m["query"] for m in want] == ["pairs", "pairs", "after"]


def test_each_result_is_encoded_once_for_every_pull_stream(tmp_path, monkeypatch):
    """Three pull streams of one subscription each get every result; each result is encoded once for all three."""
    from yfpp.service import subscriptions

    encoded: list[str] = []

    def counted(result: dict) -> tuple[bytes, int]:
        encoded.append(result["id"])
        return as_sse_event(result)

    as_sse_event = subscriptions.as_sse_event
    monkeypatch.setattr(subscriptions, "as_sse_event", counted)
    query, events = "PATTERN SEQ(a x, b y)", [{"type": t, "ts": i} for i, t in enumerate("abab" * 50)]
    want = expected(query, events)
    with BackgroundService(config(tmp_path)) as svc:
        c = Client(f"http://127.0.0.1:{svc.port}")
        sid = c.subscribe(query, name="q")["id"]
        got: list[list[dict]] = [[], [], []]
        streams = [threading.Thread(target=lambda out=out: out.extend(
            r for _, r in zip(range(len(want)), c.matches(sid, timeout=TIMEOUT)))) for out in got]
        for stream in streams:
            stream.start()
        wait_for(lambda: len(svc.subs[sid].listeners) == 3, what="the pull streams to attach")
        c.post_events(jsonl(events))
        for stream in streams:
            stream.join(TIMEOUT)
        assert got == [want] * 3 and sorted(encoded) == sorted(r["id"] for r in want)
