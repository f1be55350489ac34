"""The dashboard at ``/`` in a real browser (headless Chromium, tests/chromium.py) against a live service;
``/docs`` and the page's assets served from installed files (no CDN)."""

from __future__ import annotations

import json
import os
import re
import shutil
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip("fastapi", reason="the service needs pip install -e '.[serve]' in yfpp's clone")

from tests.chromium import Browser, executable  # noqa: E402
from tests.service_helpers import wait_for  # noqa: E402
from yfpp.service.client import Client  # noqa: E402
from yfpp.service.config import ServiceConfig  # noqa: E402
from yfpp.service.server import BackgroundService  # noqa: E402

QUERY = "PATTERN SEQ(shelf a, exit c) WHERE [tag_id] WITHIN 1 hour RETURN gone(tag = a.tag_id)"
EVENTS = b'{"type":"shelf","ts":1,"tag_id":7}\n{"type":"exit","ts":5,"tag_id":7}\n'


def get(url: str) -> tuple[int, bytes]:
    with urllib.request.urlopen(url, timeout=10) as r:
        return r.status, r.read()


def test_page_assets_and_docs_are_local(tmp_path):
    with BackgroundService(ServiceConfig(port=0, state=None, log_level="warning")) as svc:
        base = f"http://127.0.0.1:{svc.port}"
        page = get(base + "/")[1].decode()
        for path in ("/static/dashboard.js", "/static/dashboard.css", "/docs-assets/swagger-ui-bundle.js",
                     "/docs-assets/redoc.standalone.js"):
            assert get(base + path)[0] == 200
        docs = get(base + "/docs")[1].decode() + get(base + "/redoc")[1].decode()
        nfa = json.loads(get(base + "/nfa")[1])
    assert "http" not in page.replace("http-equiv", "")  # nothing from elsewhere
    assert "cdn" not in docs and "googleapis" not in docs and "/docs-assets/swagger-ui-bundle.js" in docs
    assert nfa["nodes"][0]["id"] == "start" and nfa["hidden"] == 0


def test_nfa_and_api_keep_the_keys(tmp_path):
    with BackgroundService(ServiceConfig(port=0, state=None, log_level="warning",
                                         admin_key="sesame-sesame-sesame")) as svc:
        base = f"http://127.0.0.1:{svc.port}"
        assert get(base + "/")[0] == 200  # the page itself; what it shows needs a key
        with pytest.raises(urllib.error.HTTPError) as e:
            get(base + "/nfa")
        assert e.value.code == 401


@pytest.mark.skipif(executable() is None, reason="chromium is not installed (apt-get install -y chromium; .ci/run installs it)")
def test_dashboard_in_headless_chromium_shows_a_subscription_and_its_live_match(tmp_path):
    with BackgroundService(ServiceConfig(port=0, state=None, log_level="warning")) as svc:
        base = f"http://127.0.0.1:{svc.port}"
        client = Client(base)
        sid = client.subscribe(QUERY, name="gone_tags")["id"]
        browser = Browser(tmp_path / "profile")
        try:
            browser.goto(f"{base}/?sub={sid}")
            browser.wait_until("document.querySelector('#subs tbody').textContent.includes('gone_tags')")
            browser.wait_until("document.querySelectorAll('#nfa svg rect').length >= 3")
            wait_for(lambda: svc.subs[sid].listeners, 30, "the page's live stream")
            client.post_events(EVENTS)
            shown = browser.wait_until("[...document.querySelectorAll('#live li.result')].map(li => li.textContent)"
                                       ".find(t => t.includes('gone_tags'))")
            browser.wait_until("document.querySelector('#subs tbody td:nth-child(4)').textContent === '1'")
            cells = json.loads(browser.wait_until(  # latency p50 / p99, live runs, CPU s: once the page got the match
                "(() => { const t = [9, 10, 11].map(i => document.querySelector(`#subs tbody td:nth-child(${i})`)"
                ".textContent); return t[0] ? JSON.stringify(t) : null; })()"))
            shot = browser.screenshot(tmp_path / "dashboard.png")
            browser.goto(f"{base}/docs")
            browser.wait_until("document.querySelectorAll('.opblock').length > 0")  # Swagger UI ran, offline
        finally:
            browser.close()
    result = json.loads(shown)
    assert result["emit"] == {"type": "gone", "attrs": {"tag": 7}} and result["bindings"] == {"a": [0], "c": [1]}
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    number = r"\d+(\.\d+)?"
    assert re.fullmatch(f"{number} / {number}", cells[0]) and all(re.fullmatch(number, c) for c in cells[1:]), cells
    keep = os.environ.get("YFPP_SCREENSHOTS")
    if keep:  # CI keeps it as an artifact
        shutil.copy(shot, Path(keep) / "dashboard.png")
    print(f"screenshot: {shot}")
