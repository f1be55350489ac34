"""``GET /metrics`` of ``yfpp serve``: counters of the process, gauges of the state, totals, scrapes off the loop
(docs/service.md, "Metrics"); over real sockets on 127.0.0.1, each wait bounded."""

from __future__ import annotations

import json
import threading
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip("fastapi", reason="the service needs pip install -e '.[serve]' in yfpp's clone")

from tests.service_helpers import TIMEOUT  # noqa: E402
from yfpp.service import metrics  # noqa: E402
from yfpp.service.config import ServiceConfig  # noqa: E402
from yfpp.service.server import BackgroundService  # noqa: E402


def config(tmp_path: Path, **kw) -> ServiceConfig:
    opts = dict(port=0, jsonl_port=0, state=str(tmp_path / "state"), dead_letters=str(tmp_path / "dead.jsonl"),
                log_level="warning")
    opts.update(kw)
    return ServiceConfig(**opts)


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
