"""Each subscription's result latency (yfpp/service/latency.py): the window's percentiles and the histogram,
the arrival times an outbox keeps beside its results (through drops and failed sends), and the figures in
``GET /subscriptions/{id}`` and ``GET /metrics`` of a live service."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from hypothesis import given, strategies as st

pytest.importorskip("fastapi", reason="the service needs pip install -e '.[serve]' in yfpp's clone")

from tests.service_helpers import jsonl, listeners, scrape, send, wait_for  # noqa: E402,F401
from yfpp.service.client import Client  # noqa: E402
from yfpp.service.config import ServiceConfig  # noqa: E402
from yfpp.service.latency import BOUNDS, WINDOW, Latency  # noqa: E402
from yfpp.service.server import BackgroundService  # noqa: E402
from yfpp.service.sinks import Counters, Outbox  # noqa: E402

THEFT = "PATTERN SEQ(shelf a, exit c) WHERE [tag_id]"


def test_percentiles_are_the_nearest_rank_of_the_last_window():
    lat = Latency()
    assert lat.info() == {"p50_ms": None, "p99_ms": None, "window": 0}
    lat.record(100.0, [100.0 - i / 1000 for i in range(1, 101)])  # 1 … 100 ms
    assert lat.info() == {"p50_ms": 50.0, "p99_ms": 99.0, "window": 100}
    lat.record(200.0, [200.0] * (2 * WINDOW))  # the window holds the last WINDOW only
    assert lat.info() == {"p50_ms": 0.0, "p99_ms": 0.0, "window": WINDOW}
    assert lat.count == 100 + 2 * WINDOW and lat.sum == pytest.approx(sum(range(1, 101)) / 1000)


@given(st.lists(st.floats(0, 20, allow_nan=False), max_size=50))
def test_the_histogram_counts_each_latency_once_in_its_bucket(latencies):
    lat = Latency()
    lat.record(100.0, [100.0 - x for x in latencies])
    buckets = lat.cumulative()
    assert [b for b, _ in buckets] == [*map(str, BOUNDS), "+Inf"] and buckets[-1][1] == len(latencies)
    for bound, n in zip(BOUNDS, (n for _, n in buckets)):
        assert n == sum(1 for x in latencies if 100.0 - (100.0 - x) <= bound)


def test_an_outbox_keeps_each_result_s_arrival_through_drops_and_failed_sends():
    async def run() -> Latency:
        lat = Latency()
        box = Outbox(3, "drop_oldest", Counters(), lat)
        for i in range(4):  # the first is dropped, with its arrival
            box.offer({"id": str(i)}, float(i))
        batch = box.take_now(2)
        assert [r["id"] for r in batch] == ["1", "2"] and box.taken == [1.0, 2.0]
        box.offer({"id": "4"}, 4.0)
        box.give_back(batch)  # room for one: the older is dropped
        assert [r["id"] for r in box.items] == ["2", "3", "4"] and list(box.arrivals) == [2.0, 3.0, 4.0]
        box.take_now(3)
        box.delivered()
        return lat

    lat = asyncio.run(run())
    assert lat.count == 3 and [round(lat.recent[0] - x, 6) for x in lat.recent] == [0, 1, 2]  # (now minus 2, 3, 4)


def test_latency_in_the_subscription_and_the_metrics(tmp_path: Path, listeners):
    out = listeners()
    cfg = ServiceConfig(port=0, jsonl_port=0, state=None, log_level="warning")
    with BackgroundService(cfg) as svc:
        client = Client(f"http://127.0.0.1:{svc.port}")
        sid = client.subscribe(THEFT, sink=out.url, name="theft")["id"]
        client.subscribe(THEFT, name="pulled")  # (no sink, no stream: nothing delivered, no latency)
        send(svc.feed_port("jsonl"), b"".join(
            jsonl([{"type": "shelf", "ts": 2 * t, "tag_id": t}, {"type": "exit", "ts": 2 * t + 1, "tag_id": t}])
            for t in range(20)))
        wait_for(lambda: svc.subs[sid].counters.delivered == 20, what="20 results delivered")
        info = client.subscription(sid)
        idle = client.subscription("s2")
        m = scrape(svc.port)
    lat = info["latency"]
    assert lat["window"] == 20 and 0 <= lat["p50_ms"] <= lat["p99_ms"] < 60_000
    assert idle["latency"] == {"p50_ms": None, "p99_ms": None, "window": 0}
    assert set(info["usage"]) == {"runs", "runs_shed", "buffered", "cpu_s", "engine"} and info["usage"]["engine"] == "main"
    labels = 'name="theft",subscription="s1"'
    assert m[f"yfpp_subscription_latency_seconds_count{{{labels}}}"] == 20
    assert m[f'yfpp_subscription_latency_seconds_bucket{{le="+Inf",{labels}}}'] == 20
    assert 0 <= m[f"yfpp_subscription_latency_seconds_sum{{{labels}}}"] <= 20 * 60
    assert m['yfpp_subscription_latency_seconds_count{name="pulled",subscription="s2"}'] == 0
