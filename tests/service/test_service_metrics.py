"""``GET /metrics`` of ``yfpp serve``: counters of the process, gauges of the state, totals, scrapes off the loop
(docs/service.md, "Metrics"); over real sockets on 127.0.0.1, each wait bounded."""

from __future__ import annotations

import json
import threading
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip("fastapi", reason="the service needs pip install -e '.[serve]' in yfpp's clone")

from tests.service_helpers import TIMEOUT, jsonl, listeners, scrape, send, wait_for  # noqa: E402
from yfpp.errors import YfppError  # noqa: E402
from yfpp.service import metrics  # noqa: E402
from yfpp.service.client import Client  # noqa: E402
from yfpp.service.config import ServiceConfig  # noqa: E402
from yfpp.service.server import BackgroundService  # noqa: E402

THEFT = "PATTERN SEQ(shelf a, exit c) WHERE [tag_id]"


def config(tmp_path: Path, **kw) -> ServiceConfig:
    opts = dict(port=0, jsonl_port=0, state=str(tmp_path / "state"), dead_letters=str(tmp_path / "dead.jsonl"),
                log_level="warning")
    opts.update(kw)
    return ServiceConfig(**opts)


def theft(tag: int, ts: int) -> bytes:
    """A shelf then an exit reading of ``tag``: one match of THEFT."""
    return jsonl([{"type": "shelf", "ts": ts, "tag_id": tag}, {"type": "exit", "ts": ts + 1, "tag_id": tag}])


def test_counters_start_at_0_in_every_process_and_the_state_counts_are_gauges(tmp_path):
    """A restart (a crash as much as a stop) never takes a ``_total`` backwards; what the restored state has
    taken is a gauge, as /health shows it."""
    feed = jsonl([{"type": "shelf", "ts": 100, "tag_id": 1}, {"type": "shelf", "ts": 5}]) + b"not json\n"
    with BackgroundService(config(tmp_path)) as svc:
        send(svc.feed_port("jsonl"), feed)  # 2 events (the second late: a dead letter) and a malformed record
        wait_for(lambda: svc.events_in == 2 and svc.dead_letters.count == 2, what="2 events, 2 dead letters")
        m = scrape(svc.port)
        assert (m["yfpp_events_in_total"], m["yfpp_state_events_in"]) == (2, 2)
        assert (m["yfpp_dead_letters_total"], m["yfpp_state_dead_letters"]) == (2, 2)
    with BackgroundService(config(tmp_path)) as svc:  # restored from the checkpoint of the stop
        m = scrape(svc.port)
        assert (m["yfpp_events_in_total"], m["yfpp_state_events_in"]) == (0, 2)
        assert (m["yfpp_dead_letters_total"], m["yfpp_state_dead_letters"]) == (0, 2)
        assert m["yfpp_dead_letters_lost_total"] == m["yfpp_checkpoint_errors_total"] == 0
        health = Client(f"http://127.0.0.1:{svc.port}").health()
        assert (health["events_in"], health["dead_letters"]) == (2, 2)
        send(svc.feed_port("jsonl"), jsonl([{"type": "shelf", "ts": 200, "tag_id": 2}]))
        wait_for(lambda: svc.events_in == 3, what="the third event")
        m = scrape(svc.port)
        assert (m["yfpp_events_in_total"], m["yfpp_state_events_in"]) == (1, 3)


def test_a_scrape_renders_off_the_event_loop(tmp_path, monkeypatch):
    """While a scrape renders (held up here by a test hook), the loop serves the API."""
    entered, release = threading.Event(), threading.Event()
    render = metrics.render

    def held(registry):
        entered.set()
        release.wait(TIMEOUT)
        return render(registry)

    monkeypatch.setattr(metrics, "render", held)
    with BackgroundService(config(tmp_path)) as svc:
        scraped: list[bytes] = []
        scraper = threading.Thread(target=lambda: scraped.append(
            urllib.request.urlopen(f"http://127.0.0.1:{svc.port}/metrics", timeout=TIMEOUT).read()))
        scraper.start()
        try:
            assert entered.wait(TIMEOUT)
            with urllib.request.urlopen(f"http://127.0.0.1:{svc.port}/health", timeout=2) as r:
                assert json.loads(r.read())["status"] == "ok"
        finally:
            release.set()
            scraper.join(TIMEOUT)
        assert b"yfpp_events_in_total 0.0" in scraped[0]


def test_pull_streams_count_apart_from_the_push_sink(tmp_path, listeners):
    """``delivered`` is the push sink's alone: matches - delivered - dropped is its queue, pull streams or not."""
    out = listeners()
    with BackgroundService(config(tmp_path)) as svc:
        c = Client(f"http://127.0.0.1:{svc.port}")
        sid = c.subscribe(THEFT, sink=out.url, name="thefts")["id"]
        pulled: list[dict] = []
        stream = threading.Thread(target=lambda: pulled.extend(
            r for _, r in zip(range(1), c.matches(sid, timeout=TIMEOUT))))
        stream.start()
        wait_for(lambda: svc.subs[sid].listeners, what="the pull stream to attach")
        send(svc.feed_port("jsonl"), theft(7, 1))
        stream.join(TIMEOUT)
        assert len(pulled) == 1 and len(out.wait_lines(1)) == 1
        counters = wait_for(lambda: (x := c.subscription(sid)["counters"])["pulled"] == 1 and x)
        assert (counters["matches"], counters["delivered"], counters["dropped"], counters["queued"]) == (1, 1, 0, 0)
        m = scrape(svc.port)
        labels = f'{{name="thefts",subscription="{sid}"}}'
        assert m[f"yfpp_subscription_delivered_total{labels}"] == m[f"yfpp_subscription_pulled_total{labels}"] == 1
        assert m["yfpp_delivered_total"] == m["yfpp_pulled_total"] == m["yfpp_matches_total"] == 1
        c.unsubscribe(sid)  # the totals keep what a deleted subscription counted
        m = scrape(svc.port)
        assert not [k for k in m if k.startswith("yfpp_subscription_")]
        assert m["yfpp_delivered_total"] == m["yfpp_pulled_total"] == m["yfpp_matches_total"] == 1


def test_failed_deliveries_are_counted(tmp_path, listeners):
    down = listeners(listen=False)  # refuses connections
    with BackgroundService(config(tmp_path)) as svc:
        c = Client(f"http://127.0.0.1:{svc.port}")
        sid = c.subscribe(THEFT, sink=down.url, name="thefts")["id"]
        send(svc.feed_port("jsonl"), theft(7, 1))
        labels = f'{{name="thefts",subscription="{sid}"}}'
        m = wait_for(lambda: (x := scrape(svc.port)).get(f"yfpp_subscription_sink_errors_total{labels}", 0) >= 2 and x,
                     what="two failed connects")  # the first and a retry after its backoff
        assert m["yfpp_sink_errors_total"] >= 2 and m[f"yfpp_subscription_queue_depth{labels}"] == 1
        counters = c.subscription(sid)["counters"]
        assert counters["sink_errors"] >= 2 and counters["last_error"].startswith(down.url)


def test_per_subscription_series_can_be_left_out(tmp_path, listeners):
    out = listeners()
    with BackgroundService(config(tmp_path, subscription_metrics=False)) as svc:
        c = Client(f"http://127.0.0.1:{svc.port}")
        c.subscribe(THEFT, sink=out.url, name="thefts")
        send(svc.feed_port("jsonl"), theft(7, 1))
        out.wait_lines(1)
        m = wait_for(lambda: (x := scrape(svc.port))["yfpp_delivered_total"] == 1 and x, what="the delivery")
        assert not [k for k in m if k.startswith("yfpp_subscription_")]
        assert (m["yfpp_subscriptions"], m["yfpp_matches_total"], m["yfpp_queue_depth"], m["yfpp_sink_errors_total"]) \
            == (1, 1, 0, 0)


def test_the_switch_is_a_flag_and_a_key(tmp_path):
    from yfpp.cli import build_parser
    from yfpp.service.cli import serve_config

    assert serve_config(build_parser().parse_args(["serve"])).subscription_metrics is True
    assert serve_config(build_parser().parse_args(["serve", "--no-subscription-metrics"])).subscription_metrics is False
    toml = tmp_path / "service.toml"
    toml.write_text("subscription_metrics = false\n")
    assert ServiceConfig.load(str(toml), {}).subscription_metrics is False
    toml.write_text('subscription_metrics = "no"\n')
    with pytest.raises(YfppError, match="subscription_metrics must be true or false"):
        ServiceConfig.load(str(toml), {})
