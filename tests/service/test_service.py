"""``yfpp serve`` over real sockets on 127.0.0.1: subscriptions, feeds, sinks, restart, errors (each wait bounded)."""

from __future__ import annotations

import asyncio
import http.server
import io
import json
import os
import re
import signal
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip("fastapi", reason="the service needs pip install -e '.[serve]' in yfpp's clone")

from tests.service_helpers import TIMEOUT, jsonl, listeners, send, wait_for  # noqa: E402
from yfpp.cli import main  # noqa: E402
from yfpp.engine import Engine  # noqa: E402
from yfpp.errors import YfppError  # noqa: E402
from yfpp.input.readers import read_events  # noqa: E402
from yfpp.service.client import Client, ServiceError  # noqa: E402
from yfpp.service.config import ServiceConfig  # noqa: E402
from yfpp.service.registry import Registry  # noqa: E402
from yfpp.service.server import BackgroundService, Service  # noqa: E402
from yfpp.service.subscriptions import Subscription, SubscriptionSpec  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "yfpp" / "data" / "sample_rfid.jsonl"
SHOPLIFTING = "\n".join(x for x in (ROOT / "queries" / "shoplifting.sase").read_text().splitlines()
                        if not x.startswith("#"))
EXITS = "[tag_id]&&//shelf//exit&&(1 hour)"
ADMIN_KEY = "an admin key of 16+ characters"


def config(tmp_path: Path, **kw) -> ServiceConfig:
    opts = dict(port=0, jsonl_port=0, xml_port=0, state=str(tmp_path / "state"),
                dead_letters=str(tmp_path / "dead.jsonl"), file_sink_dir=str(tmp_path), log_level="warning")
    opts.update(kw)
    return ServiceConfig(**opts)


def expected(query: str, name: str, records: list[bytes] | None = None) -> list[dict]:
    """What ``yfpp run`` gives for ``query`` over the sample (or over ``records``)."""
    eng = Engine()
    eng.register(query, name=name)
    src = SAMPLE if records is None else io.BytesIO(b"".join(records))
    return list(eng.process_all(read_events(src, "jsonl")))


def test_subscribe_feed_over_tcp_and_receive_on_tcp_sink_and_pull_stream(tmp_path, listeners):
    out = listeners()
    xml_out = listeners()
    want = expected(SHOPLIFTING, "shop")
    with BackgroundService(config(tmp_path)) as svc:
        c = Client(f"http://127.0.0.1:{svc.port}")
        shop = c.subscribe(SHOPLIFTING, sink=out.url, name="shop")
        assert shop["id"] == "s1" and shop["language"] is None and shop["counters"]["matches"] == 0
        c.subscribe(SHOPLIFTING, sink=xml_out.url, name="shop_xml", format="xml")
        pulled = c.subscribe(EXITS, name="exits")  # no sink: pull stream only
        got: list[dict] = []
        stream = threading.Thread(target=lambda: got.extend(
            r for _, r in zip(range(len(expected(EXITS, "exits"))), c.matches(pulled["id"], timeout=TIMEOUT))))
        stream.start()
        wait_for(lambda: svc.subs["s3"].listeners, what="the pull stream to attach")
        send(svc.feed_port("jsonl"), SAMPLE.read_bytes())
        assert out.wait_lines(len(want)) and [json.loads(x) for x in out.lines] == want
        xml_lines = xml_out.wait_lines(len(want))
        assert xml_lines[0].startswith(b'<match query="shop_xml" id="') and b'<bind var="a" seq="5"/>' in xml_lines[0]
        stream.join(TIMEOUT)
        assert got == expected(EXITS, "exits")
        info = c.subscription("s1")
        assert info["counters"]["matches"] == info["counters"]["delivered"] == len(want)
        assert info["counters"]["dropped"] == 0 and info["counters"]["last_error"] is None
        assert [s["id"] for s in c.subscriptions()] == ["s1", "s2", "s3"]
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{svc.port}/metrics", timeout=TIMEOUT).read().decode()
        assert "yfpp_events_in_total 300.0" in metrics
        assert f'yfpp_subscription_delivered_total{{name="shop",subscription="s1"}} {len(want)}.0' in metrics
        assert 'yfpp_subscription_queue_depth{name="shop",subscription="s1"} 0.0' in metrics
        assert c.health()["status"] == "ok"


def test_add_and_remove_subscriptions_mid_feed(tmp_path, listeners):
    lines = SAMPLE.read_bytes().splitlines(keepends=True)
    parts = [lines[:100], lines[100:200], lines[200:]]
    a_out, b_out = listeners(), listeners()
    with BackgroundService(config(tmp_path)) as svc:
        c = Client(f"http://127.0.0.1:{svc.port}")
        a = c.subscribe(EXITS, sink=a_out.url, name="a")
        fed = 0
        for i, part in enumerate(parts):
            if i == 1:
                c.subscribe(EXITS, sink=b_out.url, name="b")
            if i == 2:
                c.unsubscribe(a["id"])
            send(svc.feed_port("jsonl"), b"".join(part))
            fed += len(part)
            wait_for(lambda: svc.events_in == fed, what=f"{fed} events in")
        # The same steps on an embedded engine.
        eng = Engine()
        names = {}
        want: dict[str, list] = {"a": [], "b": []}
        for i, part in enumerate(parts):
            if i == 1:
                names["b"] = eng.register(EXITS, name="b")
            if i == 0:
                names["a"] = eng.register(EXITS, name="a")
            if i == 2:
                eng.unregister(names.pop("a"))
            for ev in read_events(io.BytesIO(b"".join(part)), "jsonl"):
                ev.seq = -1
                for m in eng.process(ev):
                    want[m["query"]].append(m)
        assert want["a"] and want["b"]
        b_out.wait_lines(len(want["b"]))
        a_out.wait_lines(len(want["a"]))
        assert a_out.results() == want["a"] and b_out.results() == want["b"]
        with pytest.raises(ServiceError) as e:
            c.subscription(a["id"])
        assert e.value.status == 404


def test_dead_and_slow_sinks_do_not_delay_the_others(tmp_path, listeners):
    good = listeners()
    slow = listeners(read=False, rcvbuf=4096)
    dead = listeners()
    dead_url = dead.url
    dead.close()  # nothing listens there any more
    n = 30_000
    records = [{"type": "tick", "ts": i, "v": i, "pad": "x" * 100} for i in range(n)]
    with BackgroundService(config(tmp_path)) as svc:
        c = Client(f"http://127.0.0.1:{svc.port}")
        c.subscribe("PATTERN SEQ(tick t)", sink=dead_url, name="dead", queue=100)
        c.subscribe("PATTERN SEQ(tick t)", sink=slow.url, name="slow", queue=100)
        c.subscribe("PATTERN SEQ(tick t)", sink=good.url, name="good")
        send(svc.feed_port("jsonl"), jsonl(records))
        good.wait_lines(n, timeout=30)
        assert [r["bindings"]["t"][0] for r in good.results()] == list(range(n))
        d, s, g = (c.subscription(x)["counters"] for x in ("s1", "s2", "s3"))
        assert g["delivered"] == n and g["dropped"] == 0
        assert d["delivered"] == 0 and d["matches"] == n and "Connect" in d["last_error"]
        assert d["dropped"] >= n - 100 and s["dropped"] > 0  # bounded queues, drops counted
        assert s["matches"] == n and s["delivered"] + s["dropped"] + s["queued"] == n


def test_restart_keeps_subscriptions(tmp_path, listeners):
    out = listeners()
    cfg = config(tmp_path)
    with BackgroundService(cfg) as svc:
        c = Client(f"http://127.0.0.1:{svc.port}")
        c.subscribe(EXITS, sink=out.url, name="kept")
        gone = c.subscribe(EXITS, name="gone")
        c.unsubscribe(gone["id"])
    with BackgroundService(cfg) as svc:
        c = Client(f"http://127.0.0.1:{svc.port}")
        assert [(s["id"], s["name"], s["sink"]) for s in c.subscriptions()] == [("s1", "kept", out.url)]
        assert c.subscribe(EXITS, name="new")["id"] == "s3"  # ids are never reused
        send(svc.feed_port("jsonl"), SAMPLE.read_bytes())
        want = expected(EXITS, "kept")
        out.wait_lines(len(want))
        assert out.results() == want


def test_bad_requests_get_clear_errors(tmp_path):
    with BackgroundService(config(tmp_path, admin_key=ADMIN_KEY, max_subscriptions=2, max_query_chars=200)) as svc:
        url = f"http://127.0.0.1:{svc.port}"
        with pytest.raises(ServiceError) as e:
            Client(url).subscriptions()
        assert e.value.status == 401
        c = Client(url, token=ADMIN_KEY)
        with pytest.raises(ServiceError) as e:
            c.subscribe("PATTERN SEQ(shelf a, exit c WITHIN 1 hour")
        assert e.value.status == 400
        assert {k: e.value.body[k] for k in ("line", "column")} == {"line": 1, "column": 29}
        assert "unexpected 'WITHIN'" in e.value.body["message"]
        with pytest.raises(ServiceError) as e:
            c.subscribe("PATTERN SEQ(a x)" + " " * 300)
        assert e.value.status == 413
        with pytest.raises(ServiceError) as e:
            c.subscribe("PATTERN SEQ(a x)", sink="udp://127.0.0.1:1")
        assert e.value.status == 422 and "tcp://HOST:PORT" in json.dumps(e.value.body)
        c.subscribe("PATTERN SEQ(a x)", name="x")
        with pytest.raises(ServiceError) as e:
            c.subscribe("PATTERN SEQ(a x)", name="x")
        assert e.value.status == 409
        c.subscribe("PATTERN SEQ(a x)")
        with pytest.raises(ServiceError) as e:
            c.subscribe("PATTERN SEQ(a x)")
        assert e.value.status == 409 and "limit" in e.value.body["error"]
        with pytest.raises(ServiceError) as e:
            c.unsubscribe("s99")
        assert e.value.status == 404
        api = json.loads(urllib.request.urlopen(url + "/openapi.json", timeout=TIMEOUT).read())  # open, like /docs
        assert {"/subscriptions", "/subscriptions/{sid}", "/subscriptions/{sid}/matches", "/events"} <= set(api["paths"])


def test_the_api_takes_a_query_as_its_file_holds_it_with_comments(tmp_path, listeners):
    """The text of queries/shoplifting.sase, ``#`` comments and all, as ``yfpp subscribe -q FILE`` takes it;
    an error's position is a line of that text; ``@query`` blocks are yfpp subscribe's to split."""
    out = listeners()
    text = (ROOT / "queries" / "shoplifting.sase").read_text()
    want = expected(SHOPLIFTING, "shop")
    with BackgroundService(config(tmp_path)) as svc:
        c = Client(f"http://127.0.0.1:{svc.port}")
        assert c.subscribe(text, sink=out.url, name="shop")["query"] == text  # stored and shown as given
        with pytest.raises(ServiceError) as e:
            c.subscribe(text.replace("exit c)", "exit c"))  # line 3 of the file
        assert e.value.status == 400 and (e.value.body["line"], e.value.body["column"]) == (4, 1)
        assert e.value.body["error"].startswith("query: line 4, column 1: unexpected 'WHERE'\n  WHERE ")
        with pytest.raises(ServiceError) as e:
            c.subscribe(f"@query a\n{THEFT}\n@query b\n{THEFT}\n")
        assert e.value.status == 400 and "@query" in e.value.body["error"]
    with BackgroundService(config(tmp_path)) as svc:  # the stored text registers again
        send(svc.feed_port("jsonl"), SAMPLE.read_bytes())
        assert out.wait_lines(len(want)) and out.results() == want


def test_bodies_that_cannot_be_echoed_are_still_422_and_id_like_names_are_refused(tmp_path):
    """FastAPI's own 422 echoes the input back: a lone surrogate or 1e400 made it a 500."""
    with BackgroundService(config(tmp_path)) as svc:
        c = Client(f"http://127.0.0.1:{svc.port}")
        for body in (rb'{"query": "PATTERN SEQ(shelf a, exit c) \ud800"}', b'{"query": "PATTERN SEQ(e a)", "queue": 1e400}',
                     b'{"query": NaN}', rb'{"query": "PATTERN SEQ(e a)", "sink": "file:/tmp/\udfff"}'):
            with pytest.raises(ServiceError) as e:
                c._request("POST", "/subscriptions", body)
            assert e.value.status == 422 and e.value.body["detail"][0]["loc"][0] == "body", body
        with pytest.raises(ServiceError) as e:  # s1, s2, … name the unnamed subscriptions
            c.subscribe("PATTERN SEQ(e a)", name="s2")
        assert e.value.status == 422 and "form of a subscription id" in json.dumps(e.value.body)
        assert [c.subscribe("PATTERN SEQ(e a)")["id"] for _ in range(2)] == ["s1", "s2"]


def test_gzip_bodies_are_held_to_the_body_limit_unpacked(tmp_path, listeners):
    import gzip

    out = listeners()
    with BackgroundService(config(tmp_path, max_body_bytes=10_000)) as svc:
        c = Client(f"http://127.0.0.1:{svc.port}")
        c.subscribe("PATTERN SEQ(a x)", sink=out.url, name="x")
        assert c.post_events(gzip.compress(b'{"type": "a", "ts": 1}\n')) == {"events": 1, "dead_letters": 0}
        assert [r["start"] for r in map(json.loads, out.wait_lines(1))] == [1]
        for body, status in ((gzip.compress(b"\n" * 10_001), 413), (gzip.compress(gzip.compress(b"\n")), 400),
                             (gzip.compress(b'{"type": "a", "ts": 2}\n')[:-8], 400)):
            with pytest.raises(ServiceError) as e:
                c.post_events(body)
            assert e.value.status == status
        assert svc.events_in == 1  # the refused bodies were not read


def test_a_name_taken_again_after_the_checkpoint_does_not_inherit_the_old_query(tmp_path, listeners):
    """Restore keeps a checkpointed query by name only while it is the same query (else: a crash after
    'delete x, add x with another query' would run the old query for the new subscription)."""
    out = listeners()
    cfg = config(tmp_path)
    saved = tmp_path / "checkpoint-before"
    with BackgroundService(cfg) as svc:
        c = Client(f"http://127.0.0.1:{svc.port}")
        old = c.subscribe("PATTERN SEQ(e a)", name="x")
        assert svc.save_checkpoint()
        saved.write_bytes((tmp_path / "state" / "engine-checkpoint.json").read_bytes())
        c.unsubscribe(old["id"])
        c.subscribe("PATTERN SEQ(f a)", name="x", sink=out.url)
    (tmp_path / "state" / "engine-checkpoint.json").write_bytes(saved.read_bytes())  # as if it had crashed
    records = [b'{"type": "e", "ts": 10}\n', b'{"type": "f", "ts": 11}\n']
    with BackgroundService(cfg) as svc:
        assert svc.restored
        Client(f"http://127.0.0.1:{svc.port}").post_events(b"".join(records))
        want = expected("PATTERN SEQ(f a)", "x", records)
        out.wait_lines(len(want))
    assert out.results() == want


def test_a_damaged_registry_is_one_error_and_a_bad_stored_subscription_is_left_out(tmp_path):
    import sqlite3

    cfg = config(tmp_path)
    (tmp_path / "state").mkdir()
    registry = Registry(str(tmp_path / "state" / "subscriptions.sqlite"))
    for query in ("PATTERN SEQ(e a)", "PATTERN SEQ(f a)", "PATTERN SEQ(g a)"):
        registry.add({"query": query})
    registry.close()
    with sqlite3.connect(tmp_path / "state" / "subscriptions.sqlite") as db:
        db.execute("UPDATE subscriptions SET spec = 'not json' WHERE id = 's1'")
        db.execute("""UPDATE subscriptions SET spec = '{"query": "PATTERN SEQ(f a)", "sink": "ftp://x"}' WHERE id = 's2'""")
    with BackgroundService(cfg) as svc:
        assert list(svc.subs) == ["s3"]
    (tmp_path / "state" / "subscriptions.sqlite").write_bytes(b"garbage, not a database" * 100)
    with pytest.raises(YfppError, match="subscription registry .*subscriptions.sqlite"):
        Service(cfg)


def test_a_stop_does_not_wait_for_ever_on_an_engine_stuck_on_an_event(tmp_path, monkeypatch, caplog):
    from yfpp.service import server

    monkeypatch.setattr(server, "STOP_WAIT", 1.0)
    release = threading.Event()
    background = BackgroundService(config(tmp_path))
    with background as svc:
        real = svc.engine.process_batch
        def stuck(events, out):  # each event taken, then the engine stuck on it
            for ev in events:
                release.wait(TIMEOUT)
                real((ev,), out)
            return out

        monkeypatch.setattr(svc.engine, "process_batch", stuck)
        send(svc.feed_port("jsonl"), b'{"type": "a", "ts": 1}\n')
        wait_for(lambda: svc.events_in == 1, what="the engine to take the event")
        with caplog.at_level("ERROR", logger="yfpp.service"):
            background.stop()
        stopped = not background._thread.is_alive()
        release.set()
    assert stopped and "did not finish in time" in caplog.text
UNUSABLE_SINKS = ["http://127.0.0.1:99999/", "http://127.0.0.1:9/\0", "http://127.0.0.1:0/", "tcp://127.0.0.1:0",
                  "tcp://" + "a" * 64 + ":9000", "tcp://a\0b:9000", "file:/tmp/x\0y",
                  "http://☃.net/", "http://xn--zz.com/"]  # (the last two: IDNA 2003 but not 2008, as httpx wants)


def test_sinks_that_cannot_work_are_refused(tmp_path, capsys):
    with BackgroundService(config(tmp_path)) as svc:
        url = f"http://127.0.0.1:{svc.port}"
        c = Client(url)
        for sink in UNUSABLE_SINKS:
            with pytest.raises(ServiceError) as e:
                c.subscribe("PATTERN SEQ(a x)", sink=sink)
            assert e.value.status == 422, sink
        assert main(["subscribe", "--server", url, "-q", "PATTERN SEQ(a x)", "--sink", "tcp://a:65536"]) == 2
        assert "sink port must be 1-65535" in capsys.readouterr().err
        assert c.subscriptions() == []


def test_a_stored_subscription_no_longer_valid_is_skipped_at_start(tmp_path, listeners):
    """One stored before the sink checks tightened does not stop the service; the others still deliver."""
    out = listeners()
    cfg = config(tmp_path)
    with BackgroundService(cfg):
        pass
    registry = Registry(str(tmp_path / "state" / "subscriptions.sqlite"))
    registry.add(SubscriptionSpec(query=EXITS, name="bad").model_dump() | {"sink": UNUSABLE_SINKS[0]})
    registry.add(SubscriptionSpec(query=EXITS, name="good", sink=out.url).model_dump())
    registry.close()
    with BackgroundService(cfg) as svc:
        assert [s["name"] for s in Client(f"http://127.0.0.1:{svc.port}").subscriptions()] == ["good"]
        send(svc.feed_port("jsonl"), SAMPLE.read_bytes())
        want = expected(EXITS, "good")
        out.wait_lines(len(want))
        assert out.results() == want


def test_subscribe_and_unsubscribe_report_bad_arguments_in_one_line(tmp_path, capsys):
    with BackgroundService(config(tmp_path)) as svc:
        url = f"http://127.0.0.1:{svc.port}"
        assert main(["subscribe", "--server", url, "-q", "PATTERN SEQ(a x)", "--name", "x"]) == 0
        assert capsys.readouterr().out == "s1\n"
        for typo in ("s1#typo", "s1?x", "x y"):  # quoted: never another path, query or an invalid request
            assert main(["unsubscribe", "--server", url, typo]) == 2
            assert capsys.readouterr().err == f"yfpp: error: HTTP 404: no subscription {typo!r}\n"
        for slashed in ("s1/matches", "../s1", "s1/"):  # the server decodes %2F before routing: refused here
            assert main(["unsubscribe", "--server", url, slashed]) == 2
            assert capsys.readouterr().err == f"yfpp: error: HTTP 404: no subscription {slashed!r}: ids and names hold no '/'\n"
        with pytest.raises(ServiceError, match="hold no '/'"):
            Client(url).subscription("s1/matches")
        assert main(["subscribe", "--server", url, "-q", "PATTERN SEQ(a x)", "--queue", "0"]) == 2
        assert capsys.readouterr().err.startswith("yfpp: error: HTTP 422: ")
        assert [s["id"] for s in Client(url).subscriptions()] == ["s1"]
    assert main(["subscribe", "--server", "http://[::1", "-q", "PATTERN SEQ(a x)"]) == 2
    assert capsys.readouterr().err == "yfpp: error: invalid server URL 'http://[::1': Invalid IPv6 URL\n"


def test_bad_feeds_are_dead_letters_and_the_stream_goes_on(tmp_path, listeners):
    out = listeners()
    with BackgroundService(config(tmp_path)) as svc:
        c = Client(f"http://127.0.0.1:{svc.port}")
        c.subscribe("PATTERN SEQ(a x)", sink=out.url, name="x")
        send(svc.feed_port("jsonl"), b'{"type": "a", "ts": 1}\nnot json\n{"type": "a"}\n{"type": "a", "ts": 2}\n')
        out.wait_lines(2)
        assert c.post_events(b'{"type": "a", "ts": 3}\n{oops\n') == {"events": 1, "dead_letters": 1}
        assert c.post_events(b'<a ts="4"/><a ts="5"/>', format="xml") == {"events": 2, "dead_letters": 0}
        out.wait_lines(5)
        assert [r["start"] for r in out.results()] == [1, 2, 3, 4, 5]
        dead = [json.loads(x) for x in (tmp_path / "dead.jsonl").read_text().splitlines()]
        assert [d["raw"] for d in dead] == ["not json", '{"type": "a"}', "{oops"]
        assert re.fullmatch(r"jsonl feed 127\.0\.0\.1:\d+ line 2", dead[0]["position"])
        assert dead[1]["position"].endswith(" line 3") and dead[2]["position"] == "POST /events line 2"
        assert c.health()["dead_letters"] == 3


def test_xml_feed_whose_root_never_closes_is_matched_as_it_arrives(tmp_path, listeners):
    out = listeners()
    with BackgroundService(config(tmp_path)) as svc:
        c = Client(f"http://127.0.0.1:{svc.port}")
        c.subscribe("PATTERN SEQ(shelf a, exit c) WHERE [tag_id]", sink=out.url)
        conn = send(svc.feed_port("xml"), b'<stream><shelf ts="1" tag_id="7"/>\n<exit ts="2" tag_id="7"/>\n', close=False)
        try:
            assert json.loads(out.wait_lines(1)[0])["bindings"] == {"a": [0], "c": [1]}
        finally:
            conn.close()


def test_advance_idle_fires_trailing_negations_on_a_quiet_feed(tmp_path, listeners):
    out = listeners()
    with BackgroundService(config(tmp_path, advance_idle=0.2)) as svc:
        c = Client(f"http://127.0.0.1:{svc.port}")
        c.subscribe("PATTERN SEQ(shelf a, ~exit b) WITHIN 1 second", sink=out.url, name="unsold")
        send(svc.feed_port("jsonl"), b'{"type": "shelf", "ts": 100, "tag_id": 1}\n')
        assert json.loads(out.wait_lines(1, timeout=5)[0])["bindings"] == {"a": [0]}


class _Hook(http.server.BaseHTTPRequestHandler):
    bodies: list[bytes] = []

    def do_POST(self) -> None:
        self.bodies.append(self.rfile.read(int(self.headers["content-length"])))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args) -> None:
        pass


def test_webhook_and_file_sinks(tmp_path):
    hook = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hook)
    threading.Thread(target=hook.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True).start()
    target = tmp_path / "results.jsonl"
    want = expected(EXITS, "exits")
    try:
        with BackgroundService(config(tmp_path)) as svc:
            c = Client(f"http://127.0.0.1:{svc.port}")
            c.subscribe(EXITS, sink=f"http://127.0.0.1:{hook.server_address[1]}/hook", name="exits")
            c.subscribe(EXITS, sink=f"file:{target}", name="exits_file")
            c.post_events(SAMPLE.read_bytes())
            got = wait_for(lambda: (lines := b"".join(_Hook.bodies).splitlines()) and len(lines) >= len(want) and lines)
            assert [json.loads(x) for x in got] == want
            wait_for(lambda: target.exists() and len(target.read_text().splitlines()) == len(want))
    finally:
        hook.shutdown()
        hook.server_close()
    assert [json.loads(x) for x in target.read_text().splitlines()] == expected(EXITS, "exits_file")


def test_yfpp_serve_subscribe_unsubscribe_end_to_end(tmp_path, listeners):
    """The newcomer's path of docs/service.md, as separate processes; SIGTERM ends it cleanly."""
    out = listeners()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    serve = subprocess.Popen([sys.executable, "-m", "yfpp.cli", "serve", "--port", "0", "--jsonl-port", "0",
                              "--state", str(tmp_path / "st")], cwd=tmp_path, env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        started = None
        for line in serve.stderr:
            if '"service started"' in line:
                started = json.loads(line)
                break
        assert started, "no 'service started' log line"
        server = f"http://{started['http']}"
        cli = [sys.executable, "-m", "yfpp.cli"]
        sub = subprocess.run(cli + ["subscribe", "--server", server, "-q", str(ROOT / "queries" / "shoplifting.sase"),
                                    "--sink", out.url], env=env, capture_output=True, text=True, timeout=30)
        assert sub.returncode == 0 and sub.stdout == "s1\n", sub.stderr
        bad = subprocess.run(cli + ["subscribe", "--server", server, "-q", "PATTERN SEQ(a x"],
                             env=env, capture_output=True, text=True, timeout=30)
        assert bad.returncode == 2 and bad.stderr.startswith("yfpp: error: HTTP 400: query: line 1, column 16")
        send(started["feeds"]["jsonl"], SAMPLE.read_bytes())
        want = expected(SHOPLIFTING, "shoplifting")
        out.wait_lines(len(want))
        assert out.results() == want
        gone = subprocess.run(cli + ["unsubscribe", "--server", server, "s1"], env=env, capture_output=True,
                              text=True, timeout=30)
        assert gone.returncode == 0, gone.stderr
        serve.send_signal(signal.SIGTERM)
        rest = serve.communicate(timeout=TIMEOUT)[1]
        assert serve.returncode == 0 and "Traceback" not in rest and '"service stopped"' in rest
    finally:
        if serve.poll() is None:
            serve.kill()
            serve.communicate()


def test_restart_from_checkpoint_neither_loses_nor_repeats(tmp_path, listeners):
    """Stop mid-stream (a checkpoint on stop), restart, feed the rest: the results of one uninterrupted run."""
    out = listeners()
    lines = SAMPLE.read_bytes().splitlines(keepends=True)
    cfg = config(tmp_path)
    with BackgroundService(cfg) as svc:
        Client(f"http://127.0.0.1:{svc.port}").subscribe(SHOPLIFTING, sink=out.url, name="shop")
        send(svc.feed_port("jsonl"), b"".join(lines[:150]))
        wait_for(lambda: svc.events_in == 150, what="150 events in")
    assert (tmp_path / "state" / "engine-checkpoint.json").is_file()
    with BackgroundService(cfg) as svc:
        assert svc.restored and svc.health()["checkpoints"]
        send(svc.feed_port("jsonl"), b"".join(lines[150:]))
        want = expected(SHOPLIFTING, "shop")  # middle negation only: every match is out without a flush
        out.wait_lines(len(want))
        wait_for(lambda: svc.events_in == len(lines), what="the rest in")  # counted since the state began
    assert out.results() == want


def test_config_file_and_flag_errors(tmp_path):
    toml = tmp_path / "s.toml"
    toml.write_text('port = 0\njsonl_port = 0\nmax_delay = 2.5\nstate = ""\n')
    cfg = ServiceConfig.load(str(toml), {"port": 0, "max_delay": None})
    assert (cfg.port, cfg.jsonl_port, cfg.max_delay, cfg.state) == (0, 0, 2.5, "")
    toml.write_text('prot = 1\n')
    with pytest.raises(YfppError, match="unknown key.*prot"):
        ServiceConfig.load(str(toml), {})
    toml.write_text('port = "x"\n')
    with pytest.raises(YfppError, match="port must be a port number"):
        ServiceConfig.load(str(toml), {})
    toml.write_text('port = [\n')
    with pytest.raises(YfppError, match="s.toml"):
        ServiceConfig.load(str(toml), {})
    for setting, message in (("ts_unit = 'bogus'", "unknown ts_unit 'bogus'"), ("host = 5", "host must be"),
                             ("log_level = 'loud'", "log_level must be one of"), ("dead_letters = 7", "dead_letters must be"),
                             ("input_format = 'csv'", "input_format must be one of"),
                             ("ts_field = 'type'", "ts_field cannot be 'type'")):
        toml.write_text(setting + "\n")
        with pytest.raises(YfppError, match=message):
            ServiceConfig.load(str(toml), {})
    with pytest.raises(YfppError, match="dead-letter file /nonexistent/"):
        Service(config(tmp_path, dead_letters="/nonexistent/dead.jsonl"))
    with BackgroundService(config(tmp_path)) as svc:  # a busy port is one clear error, before anything starts
        port = svc.port
        err = subprocess.run([sys.executable, "-m", "yfpp.cli", "serve", "--port", str(port), "--no-state"],
                             env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=30)
    assert err.returncode == 2 and err.stderr.startswith(f"yfpp: error: cannot listen on 127.0.0.1:{port}")


def test_every_setting_is_a_flag_of_yfpp_serve():
    """docs/service.md: every setting is a flag and a TOML key; each flag's value reaches the config."""
    import dataclasses

    from yfpp.cli import build_parser
    from yfpp.service.cli import serve_config

    args = build_parser().parse_args(["serve"])
    assert [f.name for f in dataclasses.fields(ServiceConfig) if not hasattr(args, f.name)] == []
    args = build_parser().parse_args(["serve", "--max-body-bytes", "5", "--max-feed-connections", "3", "--no-state"])
    cfg = serve_config(args)
    assert (cfg.max_body_bytes, cfg.max_feed_connections, cfg.state, cfg.port) == (5, 3, None, 8765)


def test_input_files_are_read_at_start_for_the_stored_subscriptions(tmp_path, listeners):
    out = listeners()
    with BackgroundService(config(tmp_path)) as svc:
        Client(f"http://127.0.0.1:{svc.port}").subscribe(EXITS, sink=out.url, name="exits")
    with BackgroundService(config(tmp_path, inputs=[str(SAMPLE)])) as svc:
        want = expected(EXITS, "exits")
        out.wait_lines(len(want))
        assert out.results() == want


def test_two_feeds_merge_in_ts_order_within_max_delay(tmp_path, listeners):
    """Feed b runs ahead of feed a by less than max_delay: the reorder buffer puts them in ts order."""
    out = listeners()
    with BackgroundService(config(tmp_path, max_delay=0.5, advance_idle=0.2)) as svc:
        Client(f"http://127.0.0.1:{svc.port}").subscribe("PATTERN SEQ(a x, b y)", sink=out.url)
        send(svc.feed_port("jsonl"), jsonl([{"type": "b", "ts": t} for t in (0.2, 0.4, 0.6)]))
        wait_for(lambda: svc.events_in == 3, what="feed b in")
        send(svc.feed_port("xml"), b"".join(b'<a ts="%.1f"/>' % t for t in (0.1, 0.3, 0.5)))
        # all held in the reorder buffer until the quiet feed's stream time (advance_idle) passes them
        got = [(r["start"], r["end"]) for r in map(json.loads, out.wait_lines(3))]
        assert got == [(0.1, 0.2), (0.3, 0.4), (0.5, 0.6)] and svc.dead_letters.count == 0


THEFT = "PATTERN SEQ(shelf a, exit c) WHERE [tag_id]"


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full, a file every write to fails (ENOSPC)")
def test_a_dead_letter_output_that_fails_stops_neither_the_engine_nor_a_feed(tmp_path, listeners, caplog):
    out = listeners()
    with caplog.at_level("ERROR", logger="yfpp.service"):
        with BackgroundService(config(tmp_path, dead_letters="/dev/full")) as svc:
            c = Client(f"http://127.0.0.1:{svc.port}")
            c.subscribe(THEFT, sink=out.url, name="theft")
            feed = jsonl([{"type": "shelf", "ts": 10, "tag_id": 1}, {"type": "shelf", "ts": 1, "tag_id": 2}])  # late
            feed += b"not json\n[1, 2]\n" + jsonl([{"type": "exit", "ts": 11, "tag_id": 1}])  # on the same connection
            send(svc.feed_port("jsonl"), feed)
            assert json.loads(out.wait_lines(1)[0])["bindings"] == {"a": [0], "c": [2]}
            health = c.health()
            assert health["status"] == "degraded" and health["events_in"] == 3
            assert health["dead_letters"] == health["dead_letters_lost"] == 3
            assert health["dead_letters_error"] == "No space left on device"
            with urllib.request.urlopen(f"http://127.0.0.1:{svc.port}/metrics", timeout=TIMEOUT) as r:
                assert "yfpp_dead_letters_lost_total 3.0" in r.read().decode()
    assert (tmp_path / "state" / "engine-checkpoint.json").is_file()  # the final checkpoint: the engine thread lived
    failing = [r for r in caplog.records if r.getMessage().startswith("dead-letter output failing")]
    assert len(failing) == 1 and failing[0].lost == 1  # logged once, not per record
    assert not [r for r in caplog.records if r.name == "yfpp.service" and r.levelname in ("ERROR", "CRITICAL")]


def test_a_failing_batch_is_logged_and_the_engine_thread_goes_on(tmp_path, listeners, monkeypatch, caplog):
    out = listeners()
    with BackgroundService(config(tmp_path)) as svc:
        c = Client(f"http://127.0.0.1:{svc.port}")
        c.subscribe(THEFT, sink=out.url, name="theft")
        real = svc._process

        def process(events, out):
            if any(ev.type == "bug" for ev in events):
                raise RuntimeError("a fault outside the per-event guard")
            return real(events, out)

        monkeypatch.setattr(svc, "_process", process)
        with caplog.at_level("ERROR", logger="yfpp.service"):
            c.post_events(jsonl([{"type": "bug", "ts": 1}]))
            c.post_events(jsonl([{"type": "shelf", "ts": 2, "tag_id": 1}, {"type": "exit", "ts": 3, "tag_id": 1}]))
            assert json.loads(out.wait_lines(1)[0])["bindings"] == {"a": [0], "c": [1]}
        assert "engine thread: a batch failed" in caplog.text and c.health()["status"] == "ok"


def test_a_dead_engine_thread_fails_health_and_ends_the_process_with_status_1(tmp_path, monkeypatch, caplog):
    from yfpp.service import server

    die = threading.Event()

    def engine_loop(self):
        die.wait(TIMEOUT)
        raise RuntimeError("boom")

    monkeypatch.setattr(Service, "_engine_loop", engine_loop)
    background = BackgroundService(config(tmp_path))
    with background as svc:
        svc.on_failure = lambda: None  # keep serving, to see /health
        die.set()
        wait_for(lambda: svc.failed, what="the engine thread to die")
        with pytest.raises(ServiceError) as e:
            Client(f"http://127.0.0.1:{svc.port}").health()
        assert e.value.status == 503 and e.value.body["status"] == "failed"
        assert e.value.body["error"] == "RuntimeError: boom"
    # yfpp serve itself: stops on its own, exit status 1, the reason logged
    result: list[int] = []
    with caplog.at_level("ERROR", logger="yfpp.service"):
        runner = threading.Thread(target=lambda: result.append(server.run(config(tmp_path / "2"))), daemon=True)
        runner.start()
        runner.join(TIMEOUT)
    assert result == [1]
    assert "the engine thread died: the service stops" in caplog.text
    assert "stopping without the final checkpoint" in caplog.text


def test_health_is_degraded_while_checkpoints_fail(tmp_path):
    blocker = tmp_path / "state" / "engine-checkpoint.json"
    blocker.mkdir(parents=True)  # a directory where the checkpoint goes: every write fails
    with BackgroundService(config(tmp_path, checkpoint_every=0.1)) as svc:
        c = Client(f"http://127.0.0.1:{svc.port}")
        health = wait_for(lambda: (h := c.health())["last_checkpoint_error"] and h, what="a failed checkpoint")
        assert health["status"] == "degraded" and health["error"] is None
        blocker.rmdir()
        wait_for(lambda: c.health()["status"] == "ok", what="the next checkpoint")
        assert svc.checkpoint_errors >= 1 and blocker.is_file()


def test_file_sinks_that_block_hold_up_only_themselves(tmp_path, listeners):
    """A FIFO with no reader blocks open(), one whose reader never reads blocks write(): neither stalls the rest."""
    good = listeners()
    no_reader, not_read = tmp_path / "no-reader.fifo", tmp_path / "not-read.fifo"
    os.mkfifo(no_reader)
    os.mkfifo(not_read)
    reader = os.open(not_read, os.O_RDONLY | os.O_NONBLOCK)
    n = 3000  # about 300 KB of results: more than a pipe holds
    background = BackgroundService(config(tmp_path))
    try:
        with background as svc:
            c = Client(f"http://127.0.0.1:{svc.port}")
            for name, path in (("no_reader", no_reader), ("not_read", not_read)):
                c.subscribe("PATTERN SEQ(tick t)", sink=f"file:{path}", name=name, queue=100)
            c.subscribe("PATTERN SEQ(tick t)", sink=good.url, name="good")
            send(svc.feed_port("jsonl"), jsonl([{"type": "tick", "ts": i} for i in range(n)]))
            good.wait_lines(n)
            assert c.health()["status"] == "ok"
            for sid in ("s1", "s2"):
                k = c.subscription(sid)["counters"]
                assert k["matches"] == n and k["dropped"] > 0 and k["delivered"] + k["dropped"] + k["queued"] == n
        assert not background._thread.is_alive()  # and the stop did not wait for them
    finally:
        os.close(os.open(no_reader, os.O_RDONLY | os.O_NONBLOCK))  # their threads see a broken pipe and end
        os.close(reader)


def test_results_the_loop_has_not_routed_yet_are_bounded(tmp_path, monkeypatch):
    """The engine thread waits while HANDED_OVER results wait for the loop; none is lost."""
    from yfpp.service import server

    monkeypatch.setattr(server, "HANDED_OVER", 3)
    svc = Service(config(tmp_path))
    loop = asyncio.new_event_loop()
    svc.loop = loop
    sub = Subscription("s1", SubscriptionSpec(query=THEFT, name="q"), 0, 100)
    svc.by_name["q"] = sub
    engine = threading.Thread(target=lambda: [svc._hand_over([{"query": "q", "id": str(i)}]) for i in range(5)],
                              daemon=True)
    try:
        engine.start()
        wait_for(lambda: svc._handed_over == 3, what="3 results handed over")
        engine.join(0.2)
        assert engine.is_alive() and svc._handed_over == 3 and sub.counters.matches == 0
        wait_for(lambda: loop.run_until_complete(asyncio.sleep(0.01)) or not engine.is_alive(), what="the rest")
        loop.run_until_complete(asyncio.sleep(0.01))
        assert sub.counters.matches == 5 and svc._handed_over == 0
    finally:
        loop.close()
        svc.registry.close()
        svc.dead_letters.close()


def test_results_still_queued_at_a_stop_are_delivered_after_the_restart(tmp_path, listeners):
    out = listeners(listen=False)  # the subscriber is down
    want = expected(SHOPLIFTING, "shop")
    cfg = config(tmp_path)
    with BackgroundService(cfg) as svc:
        Client(f"http://127.0.0.1:{svc.port}").subscribe(SHOPLIFTING, sink=out.url, name="shop")
        send(svc.feed_port("jsonl"), SAMPLE.read_bytes())
        counters = svc.subs["s1"].counters
        wait_for(lambda: counters.matches == len(want), what="every match queued")
        assert counters.delivered == 0
    assert Registry(str(tmp_path / "state" / "subscriptions.sqlite")).kept_queued() == {"s1": want}
    out.listen()  # the subscriber is back
    with BackgroundService(cfg) as svc:
        out.wait_lines(len(want))
        assert svc.subs["s1"].counters.matches == len(want)
    assert out.results() == want
    assert Registry(str(tmp_path / "state" / "subscriptions.sqlite")).kept_queued() == {}


def test_a_registry_that_cannot_be_written_refuses_changes_with_503_and_changes_nothing(tmp_path, listeners):
    out = listeners()
    cfg = config(tmp_path)
    with BackgroundService(cfg) as svc:
        c = Client(f"http://127.0.0.1:{svc.port}")
        c.subscribe(THEFT, sink=out.url, name="theft")
        svc.registry._db.execute("PRAGMA query_only = ON")  # every write fails, as on a full disk
        for refused in (lambda: c.unsubscribe("s1"), lambda: c.subscribe(EXITS, name="exits")):
            with pytest.raises(ServiceError) as e:
                refused()
            assert e.value.status == 503 and "readonly database" in e.value.body["error"]
        assert [s["id"] for s in c.subscriptions()] == ["s1"]
        c.post_events(jsonl([{"type": "shelf", "ts": 1, "tag_id": 1}, {"type": "exit", "ts": 2, "tag_id": 1}]))
        out.wait_lines(1)  # still matching and delivering
        svc.registry._db.execute("PRAGMA query_only = OFF")
        c.unsubscribe("s1")
        assert c.subscriptions() == []
    with BackgroundService(cfg) as svc:
        assert svc.subs == {}  # the removal was stored


def test_a_restarted_service_goes_on_from_the_checkpoint_with_advance_idle_and_its_counts(tmp_path, listeners):
    out = listeners()
    with BackgroundService(config(tmp_path)) as svc:
        Client(f"http://127.0.0.1:{svc.port}").subscribe("PATTERN SEQ(shelf a, ~exit b) WITHIN 1 second",
                                                        sink=out.url, name="unsold")
        send(svc.feed_port("jsonl"), jsonl([{"type": "shelf", "ts": 100, "tag_id": 1}, {"type": "shelf", "ts": 5}]))
        wait_for(lambda: svc.events_in == 2, what="2 events in")  # the second is late: a dead letter
    with BackgroundService(config(tmp_path, advance_idle=0.2)) as svc:
        health = Client(f"http://127.0.0.1:{svc.port}").health()
        assert (health["events_in"], health["dead_letters"]) == (2, 1)  # both since the state began
        assert json.loads(out.wait_lines(1)[0])["bindings"] == {"a": [0]}  # no event needed: the feed is quiet


def test_events_posted_while_the_service_stops_are_refused_with_how_many_it_took(tmp_path):
    from yfpp.service.feeds import FeedClosed, SharedDeadLetters, pump

    taken: list[int] = []

    def put(batch):  # the inbox of a service that stops after its first batch
        if taken:
            raise FeedClosed()
        taken.append(len(batch))

    body = jsonl([{"type": "a", "ts": i} for i in range(300)])
    n, bad, stopped = pump(io.BytesIO(body + b"oops\n"), "jsonl", "test", put, SharedDeadLetters(None), {})
    assert (n, bad, stopped) == (256, 1, True) and taken == [256]  # (the bad line was read before the 2nd put)
    with BackgroundService(config(tmp_path)) as svc:
        svc.stopping.set()  # what a stop sets first
        with pytest.raises(ServiceError) as e:
            Client(f"http://127.0.0.1:{svc.port}").post_events(body)
        assert e.value.status == 503 and e.value.body["events"] == 0 and "first 0 events" in e.value.body["error"]
    assert svc.events_in == 0


def test_posts_waiting_for_a_full_inbox_do_not_hold_up_subscription_requests(tmp_path, monkeypatch):
    from concurrent.futures import ThreadPoolExecutor

    from yfpp.service import server

    monkeypatch.setattr(server, "INBOX", 1)
    posts = min(32, (os.cpu_count() or 1) + 4) + 2  # more than the loop's default thread pool holds
    with BackgroundService(config(tmp_path)) as svc:
        c = Client(f"http://127.0.0.1:{svc.port}")
        real_put, waiting = svc.put, []

        def put(batch):
            waiting.append(1)
            real_put(batch)

        monkeypatch.setattr(svc, "put", put)
        with ThreadPoolExecutor(posts) as pool:
            with svc.engine_lock:  # the engine is stalled: the inbox fills
                answers = [pool.submit(c.post_events, jsonl([{"type": "a", "ts": i}])) for i in range(posts)]
                wait_for(lambda: len(waiting) >= server.INGEST_THREADS + 2, what="posts waiting for the inbox")
                with pytest.raises(ServiceError) as e:  # a subscription request with a thread of the default pool
                    c.subscribe("PATTERN SEQ(", name="broken")
                assert e.value.status == 400
            assert [a.result(TIMEOUT)["events"] for a in answers] == [1] * posts


def test_iso_timestamps_a_type_field_and_windows_in_the_ts_unit(tmp_path, listeners):
    """The service reads as ``yfpp run`` does: ts_format, type_field, and a window without a unit in ts_unit."""
    out = listeners()
    with BackgroundService(config(tmp_path, ts_format="iso", type_field="kind")) as svc:
        c = Client(f"http://127.0.0.1:{svc.port}")
        c.subscribe("PATTERN SEQ(shelf a, exit c) WHERE [tag_id] WITHIN 90", sink=out.url, name="iso")
        body = b"".join(json.dumps({"kind": k, "ts": ts, "tag_id": t}).encode() + b"\n" for k, ts, t in (
            ("shelf", "2026-11-22T10:00:00Z", 1), ("exit", "2026-11-22T10:01:00Z", 1),
            ("shelf", "2026-11-22T10:02:00Z", 2), ("exit", "2026-11-22T10:04:00Z", 2)))
        assert c.post_events(body) == {"events": 4, "dead_letters": 0}
        assert [r["bindings"] for r in map(json.loads, out.wait_lines(1))] == [{"a": [0], "c": [1]}]
    assert len(out.lines) == 1  # (the service stopped: every result was sent) tag 2 left after 120 s > 90 s
    out2 = listeners()
    with BackgroundService(config(tmp_path / "ms", ts_unit="ms")) as svc:
        c = Client(f"http://127.0.0.1:{svc.port}")
        c.subscribe("PATTERN SEQ(shelf a, exit c) WHERE [tag_id] WITHIN 250", sink=out2.url, name="ms")
        c.post_events(b'{"type": "shelf", "ts": 1000, "tag_id": 1}\n{"type": "exit", "ts": 1200, "tag_id": 1}\n'
                      b'{"type": "shelf", "ts": 2000, "tag_id": 2}\n{"type": "exit", "ts": 2300, "tag_id": 2}\n')
        assert [(r["start"], r["end"]) for r in map(json.loads, out2.wait_lines(1))] == [(1.0, 1.2)]
    assert len(out2.lines) == 1  # 300 ms > 250 ms
    with pytest.raises(YfppError, match="ts_field cannot be 'kind'"):
        ServiceConfig.load(None, {"type_field": "kind", "ts_field": "kind"})
