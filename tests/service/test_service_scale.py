"""``yfpp serve`` at scale, over real sockets on 127.0.0.1: batch registration, restarts that keep the results the
sinks held (kill -9 too) and the counters, truthful answers (each wait bounded)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path
from unittest.mock import patch

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("fastapi", reason="the service needs pip install -e '.[serve]' in yfpp's clone")

from tests.service_helpers import TIMEOUT, LineListener, scrape, send, wait_for  # noqa: E402
from yfpp.engine import Engine  # noqa: E402
from yfpp.errors import YfppError  # noqa: E402
from yfpp.service.client import Client, ServiceError  # noqa: E402
from yfpp.service.config import ServiceConfig  # noqa: E402
from yfpp.service.checkpoint import read as stored  # noqa: E402
from yfpp.service.server import BackgroundService, Service  # noqa: E402
from yfpp.state import query_base  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
PAIR = "PATTERN SEQ(a x, b y) WHERE skip_till_any_match(x, y) {{ x.k = {k} AND y.k = {k} }} WITHIN 100"


def config(tmp_path: Path, **kw) -> ServiceConfig:
    opts = dict(port=0, jsonl_port=0, state=str(tmp_path / "state"), dead_letters=str(tmp_path / "dead.jsonl"),
                log_level="warning")
    opts.update(kw)
    return ServiceConfig(**opts)


def pairs(n: int, keys: int) -> list[bytes]:
    """``n`` a/b events over ``keys`` keys, as JSON lines."""
    return [json.dumps({"type": "ab"[i % 2], "ts": i, "k": (i // 2) % keys}).encode() + b"\n" for i in range(n)]


def expected(queries: dict[str, str], records: list[bytes]) -> list[dict]:
    eng = Engine()
    for name, q in queries.items():
        eng.register(q, name=name)
    out = []
    for i, line in enumerate(records):
        r = json.loads(line)
        out += eng.process({**r, "seq": i})
    return out


def yfpp_serve(state: Path, checkpoint_every: float) -> tuple[subprocess.Popen, dict, Client]:
    """``yfpp serve`` as its own process (its log, JSON lines, on its stderr), once it has started: the process,
    its ``service started`` log line and a client of its API."""
    proc = subprocess.Popen([sys.executable, "-m", "yfpp.cli", "serve", "--port", "0", "--jsonl-port", "0",
                             "--state", str(state), "--checkpoint-every", str(checkpoint_every), "--log-level", "info"],
                            cwd=ROOT, stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    started = json.loads(next(line for line in proc.stderr if '"service started"' in line))
    return proc, started, Client(f"http://{started['http']}", timeout=TIMEOUT)


def test_a_batch_registers_each_item_on_its_own_and_refuses_only_the_bad_ones(tmp_path):
    out = LineListener()
    try:
        with BackgroundService(config(tmp_path, max_subscriptions=6)) as svc:
            c = Client(f"http://127.0.0.1:{svc.port}")
            c.subscribe("PATTERN SEQ(a x)", name="taken")
            answers = c.subscribe_many([
                {"query": PAIR.format(k=0), "name": "k0", "sink": out.url},
                {"query": "PATTERN SEQ(a x, b y", "name": "broken"},  # 400, with the position
                {"query": "PATTERN SEQ(a x)", "name": "taken"},  # 409: the name exists
                {"query": PAIR.format(k=1), "name": "k1", "sink": out.url},
                {"query": "PATTERN SEQ(a x)", "queue": 0},  # 422
                "not an object",  # 422
                {"query": PAIR.format(k=1), "name": "k1"},  # 409: taken earlier in this batch
                {"query": PAIR.format(k=2)},
                {"query": PAIR.format(k=3)},
                {"query": PAIR.format(k=4)},  # 409: over max_subscriptions
            ])
            assert [a["status"] for a in answers] == [201, 400, 409, 201, 422, 422, 409, 201, 201, 409]
            assert answers[1]["line"] == 1 and "limit" in answers[9]["error"]
            assert [a["subscription"]["id"] for a in answers if a["status"] == 201] == ["s2", "s3", "s4", "s5"]
            assert answers[7]["subscription"]["name"] == "s4"  # (unnamed: named by its id)
            ndjson = c._request("POST", "/subscriptions", b'{"query": "PATTERN SEQ(c x)"}\n\nnot json\n',
                                "application/x-ndjson")
            assert [a["status"] for a in ndjson] == [201, 400] and "line 3" in ndjson[1]["error"]
            records = pairs(40, 2)
            send(svc.feed_port("jsonl"), b"".join(records))
            want = expected({"k0": PAIR.format(k=0), "k1": PAIR.format(k=1)}, records)
            out.wait_lines(len(want))
            assert sorted(r["id"] for r in out.results()) == sorted(r["id"] for r in want)
        with BackgroundService(config(tmp_path)) as svc:  # stored, as one by one
            assert list(svc.subs) == ["s1", "s2", "s3", "s4", "s5", "s6"]
    finally:
        out.close()


def test_registration_refused_by_the_registry_is_503_for_each_item(tmp_path, monkeypatch):
    from yfpp.service.registry import Registry, RegistryError

    with BackgroundService(config(tmp_path)) as svc:
        c = Client(f"http://127.0.0.1:{svc.port}")

        def failing(self, specs, owner=None):
            raise RegistryError("disk full")

        monkeypatch.setattr(Registry, "add_many", failing)
        answers = c.subscribe_many([{"query": "PATTERN SEQ(a x)"}, {"query": "PATTERN SEQ("}])
        assert [a["status"] for a in answers] == [503, 400] and not svc.subs


def test_kill_9_with_a_sink_backlog_loses_no_result_and_keeps_the_counters(tmp_path):
    """A reader that takes nothing holds results in the sink's queue and connection; the service is killed
    after a checkpoint: the restarted service sends what the sink held (at least once, by id)."""
    state = tmp_path / "state"
    slow = LineListener(read=False, rcvbuf=4096)
    records = pairs(3000, 1)
    want = expected({"p": PAIR.format(k=0)}, records)
    proc, started, c = yfpp_serve(state, 0.3)
    try:
        c.subscribe(PAIR.format(k=0), name="p", sink=slow.url, queue=100_000)
        send(started["feeds"]["jsonl"], b"".join(records))
        for line in proc.stderr:  # a checkpoint past every event
            if '"checkpoint written"' in line and json.loads(line)["events_in"] == len(records):
                break
        counters = c.subscription("s1")["counters"]
        assert counters["matches"] == len(want) and counters["queued"] > 0  # a backlog
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(TIMEOUT)
        proc.stderr.close()
    got = slow.drain()  # what reached the slow reader's socket before the kill
    slow.close()
    out = LineListener()
    try:
        with sqlite3.connect(state / "subscriptions.sqlite") as db:  # the reader is now a quick one
            db.execute("UPDATE subscriptions SET spec = json_set(spec, '$.sink', ?)", (out.url,))
        with BackgroundService(config(tmp_path, jsonl_port=None)) as svc:
            # (read through the API: the counts as the loop has them at one instant, not torn by another thread)
            api = Client(f"http://127.0.0.1:{svc.port}", timeout=TIMEOUT)
            assert api.subscription("s1")["counters"]["matches"] == len(want)  # restored, not from 0
            c = wait_for(lambda: (n := api.subscription("s1")["counters"])["queued"] == 0 and n,
                         what="the kept results sent")
            assert c["matches"] - c["delivered"] - c["dropped"] == c["queued"] == 0 and c["dropped"] == 0
        ids = {json.loads(x)["id"] for x in got} | {r["id"] for r in out.results()}
        assert ids >= {r["id"] for r in want}
    finally:
        out.close()


def test_a_crash_just_after_a_checkpoint_stored_the_kept_results_keeps_the_counts_that_go_with_them(
        tmp_path, monkeypatch):
    """What a kill -9 leaves on disk right after a checkpoint stored what the sinks held: the counters restored
    from it agree with the results restored from it (kept in one transaction with them, not written after)."""
    from yfpp.service.registry import Registry

    out = LineListener(listen=False)  # refuses connections: the first checkpoint keeps every result queued
    records = pairs(40, 1)
    want = expected({"p": PAIR.format(k=0)}, records)
    crash = tmp_path / "crash"
    try:
        with BackgroundService(config(tmp_path)) as svc:
            Client(f"http://127.0.0.1:{svc.port}").subscribe(PAIR.format(k=0), name="p", sink=out.url)
            sub = svc.subs["s1"]
            send(svc.feed_port("jsonl"), b"".join(records))
            wait_for(lambda: sub.counters.matches == len(want), what="the matches")
            assert svc.save_checkpoint() and sub.queued == len(want)  # kept: every result, delivered 0
            out.listen()
            wait_for(lambda: sub.counters.delivered == len(want), what="the results delivered")
            keep = Registry.keep_queued

            def keep_then_crash(self, *args):  # the files as a kill -9 right after this write leaves them
                keep(self, *args)
                if not crash.exists():
                    shutil.copytree(tmp_path / "state", crash / "state")

            monkeypatch.setattr(Registry, "keep_queued", keep_then_crash)
            assert svc.save_checkpoint()  # kept: none queued, every result delivered
        with BackgroundService(config(crash)) as svc:
            c = svc.subs["s1"].counters
            assert (c.matches, c.delivered, c.dropped, svc.subs["s1"].queued) == (len(want), len(want), 0, 0)
    finally:
        out.close()


def test_the_counters_file_of_an_earlier_version_is_read_then_superseded_by_the_registry(tmp_path):
    state = tmp_path / "state"
    with BackgroundService(config(tmp_path)) as svc:
        Client(f"http://127.0.0.1:{svc.port}").subscribe("PATTERN SEQ(a x)", name="x")
        svc.subs["s1"].counters.matches = svc.subs["s1"].counters.dropped = 5
    with sqlite3.connect(state / "subscriptions.sqlite") as db:  # as an earlier version kept them: in a file
        counts = {sid: json.loads(c) for sid, c in db.execute("SELECT sub, counts FROM counts")}
        db.execute("DROP TABLE counts")
    assert counts["s1"]["matches"] == 5
    (state / "counts.json").write_text(json.dumps(counts))
    with BackgroundService(config(tmp_path)) as svc:
        assert svc.subs["s1"].counts() == counts["s1"]
    assert not (state / "counts.json").exists()
    with BackgroundService(config(tmp_path)) as svc:
        assert svc.subs["s1"].counts() == counts["s1"]


def test_an_empty_or_missing_registry_beside_a_checkpoint_refuses_to_start(tmp_path):
    with BackgroundService(config(tmp_path)) as svc:
        Client(f"http://127.0.0.1:{svc.port}").subscribe("PATTERN SEQ(a x)", name="x")
    (tmp_path / "state" / "subscriptions.sqlite").unlink()
    with pytest.raises(YfppError, match="holds no subscription, but the checkpoint .* holds 1 queries: start with "
                                        "--registry-lost"):
        Service(config(tmp_path))
    with BackgroundService(config(tmp_path, registry_lost=True)) as svc:
        assert not svc.subs and not svc.engine.sources


def test_subscriptions_without_a_push_sink_keep_the_metrics_identity(tmp_path):
    """matches - delivered - dropped = queued: with no push sink, a result with no pull stream listening is
    dropped, one given to the pull streams delivered."""
    with BackgroundService(config(tmp_path)) as svc:
        c = Client(f"http://127.0.0.1:{svc.port}")
        c.subscribe("PATTERN SEQ(a x)", name="pull")
        c.post_events(b'{"type": "a", "ts": 1}\n{"type": "a", "ts": 2}\n')
        wait_for(lambda: svc.subs["s1"].counters.matches == 2, what="the matches")
        got: list[dict] = []
        stream = threading.Thread(target=lambda: got.append(next(c.matches("s1", timeout=TIMEOUT))))
        stream.start()
        wait_for(lambda: svc.subs["s1"].listeners, what="the pull stream")
        c.post_events(b'{"type": "a", "ts": 3}\n')
        stream.join(TIMEOUT)
        assert got[0]["bindings"] == {"x": [2]}
        counters = c.subscription("s1")["counters"]
        assert (counters["matches"], counters["delivered"], counters["dropped"], counters["queued"]) == (3, 1, 2, 0)
        metrics = scrape(svc.port)
        assert metrics["yfpp_matches_total"] - metrics["yfpp_delivered_total"] - metrics["yfpp_dropped_total"] == \
            metrics["yfpp_queue_depth"]


def test_post_events_answers_what_it_did_with_the_body(tmp_path):
    with BackgroundService(config(tmp_path)) as svc:
        c = Client(f"http://127.0.0.1:{svc.port}")
        xml = b'<stream><a ts="1" k="0"/><b ts="2" k="0"/></stream>'
        assert c._request("POST", "/events", xml, "application/octet-stream") == {"events": 2, "dead_letters": 0}
        wait_for(lambda: svc.events_in == 2, what="the events taken")
        with pytest.raises(ServiceError) as e:  # said to be JSON lines, evidently XML: refused, nothing taken
            c.post_events(xml, "jsonl")
        assert e.value.status == 400 and "format=xml" in e.value.body["error"]
        with pytest.raises(ServiceError) as e:  # every record a dead letter: not a 202
            c.post_events(b'{"ts": 3}\n{"type": "a"}\nnot json\n')
        assert e.value.status == 400 and (e.value.body["events"], e.value.body["dead_letters"]) == (0, 3)
        assert e.value.body["first"].startswith("line 1: missing type")
        assert c.post_events(b'{"ts": 3}\n{"type": "a", "ts": 4}\n') == {"events": 1, "dead_letters": 1}
        wait_for(lambda: svc.events_in == 3, what="the events taken")  # (the refused XML body: none)


def test_no_state_says_what_it_discards_at_the_stop(tmp_path, caplog):
    down = LineListener(listen=False)  # refuses connections: its results stay queued
    try:
        with caplog.at_level("WARNING", logger="yfpp.service"):
            with BackgroundService(config(tmp_path, state=None)) as svc:
                c = Client(f"http://127.0.0.1:{svc.port}")
                c.subscribe("PATTERN SEQ(a x)", sink=down.url)
                c.subscribe(PAIR.format(k=0))
                c.post_events(b"".join(pairs(5, 1)))
                wait_for(lambda: svc.subs["s1"].queued == 3, what="the results queued")
        [record] = [r for r in caplog.records if "discarded at the stop" in r.getMessage()]
        assert (record.queued_results, record.subscriptions, record.partial_matches) == (3, 2, 3)  # (an a: a run each)
        assert not [r for r in caplog.records if "kept for the next start" in r.getMessage()]
    finally:
        down.close()


def test_put_changes_a_subscription_in_place(tmp_path):
    first, second = LineListener(), LineListener()
    try:
        with BackgroundService(config(tmp_path)) as svc:
            c = Client(f"http://127.0.0.1:{svc.port}")
            c.subscribe(PAIR.format(k=0), name="p", sink=first.url)
            c.post_events(b"".join(pairs(4, 1)))  # a0 b1 a2 b3: 3 results, a run of a2 left
            first.wait_lines(3)
            changed = c._request("PUT", "/subscriptions/s1", json.dumps({"sink": second.url}).encode())
            assert changed["id"] == "s1" and changed["counters"]["matches"] == 3
            assert svc.engine.stats.live_runs == 2  # same query: its partial matches kept
            c.post_events(b'{"type": "b", "ts": 5, "k": 0}\n')
            assert len(second.wait_lines(2)) == 2 and len(first.lines) == 3
            longer = PAIR.format(k=0).replace("WITHIN 100", "WITHIN 101")
            c._request("PUT", "/subscriptions/s1", json.dumps({"query": longer}).encode())
            with pytest.raises(ServiceError) as e:
                c._request("PUT", "/subscriptions/s1", json.dumps({"query": "PATTERN SEQ("}).encode())
            assert e.value.status == 400 and svc.subs["s1"].spec.query == longer
            c.post_events(b'{"type": "b", "ts": 6, "k": 0}\n{"type": "a", "ts": 7, "k": 0}\n{"type": "b", "ts": 8, "k": 0}\n')
            # a new query starts afresh: b6 completes nothing (the runs of a0, a2 went with the old query)
            assert [json.loads(x)["bindings"] for x in second.wait_lines(3)[2:]] == [{"x": [6], "y": [7]}]
        with BackgroundService(config(tmp_path)) as svc:  # the change is stored
            longer = PAIR.format(k=0).replace("WITHIN 100", "WITHIN 101")
            assert svc.subs["s1"].spec.query == longer and svc.subs["s1"].spec.sink == second.url
    finally:
        first.close()
        second.close()


def test_yfpp_subscriptions_lists_them(tmp_path, capsys):
    from yfpp.cli import main

    with BackgroundService(config(tmp_path)) as svc:
        url = f"http://127.0.0.1:{svc.port}"
        Client(url).subscribe_many([{"query": "PATTERN SEQ(a x)", "name": "ax"}, {"query": "PATTERN SEQ(b x)"}])
        assert main(["subscriptions", "--server", url]) == 0
        lines = capsys.readouterr().out.splitlines()
        assert [line.split("\t")[:2] for line in lines] == [["s1", "ax"], ["s2", "s2"]]
        assert "matches=0 delivered=0 dropped=0 queued=0" in lines[0] and lines[0].endswith("pull")
        assert main(["subscriptions", "--server", url, "--json"]) == 0
        assert [json.loads(x)["id"] for x in capsys.readouterr().out.splitlines()] == ["s1", "s2"]


def test_a_stop_while_busy_discards_the_inbox_after_a_while_and_writes_the_final_checkpoint(tmp_path, monkeypatch,
                                                                                            caplog):
    from yfpp.service import server

    monkeypatch.setattr(server, "STOP_DRAIN", 0.2)
    bg = BackgroundService(config(tmp_path))
    with caplog.at_level("INFO", logger="yfpp.service"):
        with bg as svc:
            Client(f"http://127.0.0.1:{svc.port}").subscribe(PAIR.format(k=0), name="p")
            real = svc.engine.process_batch

            def slow(events, out):  # 10 ms an event
                for ev in events:
                    time.sleep(0.01)
                    real((ev,), out)
                return out

            monkeypatch.setattr(svc.engine, "process_batch", slow)
            send(svc.feed_port("jsonl"), b"".join(pairs(3000, 1)))
            wait_for(lambda: svc.inbox.qsize() > 2, what="a busy engine")
    [record] = [r for r in caplog.records if r.getMessage().startswith("events still waiting at the stop")]
    taken = record.resend_from_seq
    assert 0 < taken < 3000 and record.events + taken <= 3000
    assert any(r.getMessage() == "checkpoint written" and r.events_in == taken for r in caplog.records)
    with BackgroundService(config(tmp_path)) as svc:  # the checkpoint holds what was taken, no more
        assert svc.events_in == taken


def test_a_restart_keeps_every_subscription_its_id_owner_and_sink_and_checkpoints_the_same_queries(tmp_path):
    """A batch (with a bad item), a subscriber's own, a deleted one: after a stop and a start every subscription
    is there with its id, name, owner and sink, and the restarted service's checkpoint holds the same queries
    (by their text, or their patterns kept encoded from the one it restored)."""
    admin = "k" * 40
    cfg = config(tmp_path, admin_key=admin, file_sink_dir=str(tmp_path))
    sink = f"file:{tmp_path / 'out.jsonl'}"
    specs = [{"query": PAIR.format(k=k), "name": f"q{k}", **({"sink": sink} if k % 2 else {}),
              **({"language": "sase"} if k == 5 else {})} for k in range(6)]  # (q5: registered as a Pattern)
    with BackgroundService(cfg) as svc:
        c = Client(f"http://127.0.0.1:{svc.port}", admin)
        answers = c.subscribe_many(specs[:3] + [{"query": "PATTERN SEQ("}] + specs[3:])
        assert [a["status"] for a in answers] == [201] * 3 + [400] + [201] * 3
        alice = Client(c.url, c.create_key("alice", "subscriber")["key"])
        alice.subscribe("PATTERN SEQ(a x)")
        c.unsubscribe(answers[1]["subscription"]["id"])
        before = sorted((s["id"], s["name"], s["owner"], s["sink"], s["query"]) for s in c.subscriptions())
    checkpoint = tmp_path / "state" / "engine-checkpoint.json"
    first, service, _ = stored(checkpoint)
    first = first["queries"]
    said = service["queries"]  # (a text the engine's rows hold: not again)
    assert said["q5"] == [PAIR.format(k=5), "sase", None] and all(said[f"q{k}"] == [None, None, None] for k in (0, 2, 3, 4))
    with BackgroundService(cfg) as svc:
        c = Client(f"http://127.0.0.1:{svc.port}", admin)
        assert sorted((s["id"], s["name"], s["owner"], s["sink"], s["query"]) for s in c.subscriptions()) == before
        # (each restored query is kept by its text, as the checkpoint's shapes hold it, or its pattern is kept
        # encoded: none encoded or split again)
        kept = svc.patterns._by_id
        sources = svc.engine.sources.items()
        assert all(text is not None or kept[qid][0] is pattern for qid, (pattern, text, _) in sources)
        splits = svc.patterns._splits  # (and each query kept by its text is kept split, as the checkpoint held it)
        assert all(text is None or splits[qid][0] is text for qid, (_, text, _) in sources)
        assert sorted(text for _, (_, text, name) in sources if name != "q5") == sorted(
            s["query"] for s in c.subscriptions() if s["name"] != "q5")
        assert [text for _, (_, text, name) in sources if name == "q5"] == [None]
        assert len(before) == 6 and svc.save_checkpoint()
    assert stored(checkpoint)[0]["queries"] == first


def test_a_stop_drops_a_periodic_checkpoint_still_being_written_and_writes_the_final_one(tmp_path, monkeypatch,
                                                                                         caplog):
    from yfpp.service import checkpoint

    real = checkpoint.write_pieces
    bg = BackgroundService(config(tmp_path, checkpoint_every=0.2))
    stopping = bg.service.stopping

    def stuck(pieces, path, cancelled=None):  # (a periodic checkpoint's write ends only when cancelled; the final
        if not stopping.is_set():  # one's is written)
            wait_for(cancelled, what="the periodic checkpoint cancelled", timeout=600)
        real(pieces, path, cancelled)

    monkeypatch.setattr(checkpoint, "write_pieces", stuck)
    with caplog.at_level("INFO", logger="yfpp.service"):
        with bg as svc:
            Client(f"http://127.0.0.1:{svc.port}").subscribe(PAIR.format(k=0), name="p")
            wait_for(lambda: svc._writer is not None and svc._writer.is_alive(), what="a periodic checkpoint")
            send(svc.feed_port("jsonl"), b"".join(pairs(10, 1)))
            wait_for(lambda: svc.events_in == 10, what="the events taken")
        assert not bg._thread.is_alive()  # (stopped, not waiting for the stuck child)
    said = [r.getMessage() for r in caplog.records]
    assert "checkpoint dropped at the stop: the final checkpoint supersedes it" in said
    assert said.count("checkpoint written") == 1 and "checkpoint failed" not in said
    with BackgroundService(config(tmp_path)) as svc:
        assert svc.restored and svc.events_in == 10 and [s.name for s in svc.subs.values()] == ["p"]


def test_the_stop_writes_the_final_checkpoint_in_process_and_a_start_restores_every_subscription(tmp_path, monkeypatch,
                                                                                                  caplog):
    """No process is forked at the stop (a fork of a large service cost seconds in copied pages): the final
    checkpoint is written by the stopping process itself; the next start restores every subscription (by
    shape and as a Pattern), its runs and its counters, and goes on as one uninterrupted service."""
    queries = {f"q{k}": PAIR.format(k=k) for k in range(3)}
    records = pairs(60, 3)
    want = expected(queries, records)
    with caplog.at_level("INFO", logger="yfpp.service"):
        with BackgroundService(config(tmp_path, checkpoint_every=3600)) as svc:
            c = Client(f"http://127.0.0.1:{svc.port}")
            c.subscribe_many([{"query": q, "name": n, **({"language": "sase"} if n == "q2" else {})}
                              for n, q in queries.items()])
            send(svc.feed_port("jsonl"), b"".join(records[:31]))
            wait_for(lambda: svc.events_in == 31, what="the events taken")

            def no_fork():
                raise AssertionError("forked at the stop")

            monkeypatch.setattr(os, "fork", no_fork)
    monkeypatch.undo()
    assert [r.getMessage() for r in caplog.records].count("checkpoint written") == 1
    rows = stored(tmp_path / "state" / "engine-checkpoint.json")[0]["queries"]
    assert [row[2] is None for row in rows] == [False, False, True]  # q0, q1 by shape; q2 (a language named) as IR
    with BackgroundService(config(tmp_path)) as svc:
        assert svc.restored and svc.events_in == 31 and sorted(svc.by_name) == sorted(queries)
        before = {s.name: s.counters.matches for s in svc.subs.values()}
        assert sum(before.values()) == sum(1 for m in want if m["bindings"]["y"][0] < 31)
        send(svc.feed_port("jsonl"), b"".join(records[31:]))
        wait_for(lambda: svc.events_in == len(records), what="the rest taken")
        wait_for(lambda: sum(s.counters.matches for s in svc.subs.values()) == len(want), what="every match")


def test_counters_that_are_all_zero_are_not_stored_and_restore_as_zero(tmp_path):
    with BackgroundService(config(tmp_path)) as svc:
        Client(f"http://127.0.0.1:{svc.port}").subscribe_many([{"query": "PATTERN SEQ(a x)", "name": n} for n in "xy"])
        svc.subs["s1"].counters.matches = svc.subs["s1"].counters.dropped = 5
    with sqlite3.connect(tmp_path / "state" / "subscriptions.sqlite") as db:
        assert sorted(sid for sid, in db.execute("SELECT sub FROM counts")) == ["", "s1"]
    with BackgroundService(config(tmp_path)) as svc:
        assert svc.subs["s1"].counts() == {**dict.fromkeys(svc.subs["s2"].counts(), 0), "matches": 5, "dropped": 5}
        assert set(svc.subs["s2"].counts().values()) == {0} and svc.totals.counts()["matches"] == 0


def test_the_registry_syncs_to_the_disk_only_what_a_checkpoint_keeps_and_a_revoked_key(tmp_path):
    """A subscription's commit is not synced (it survives the process, kill -9 too); the commit of what a
    checkpoint keeps is (and with it every commit before), as is a key's removal."""
    from yfpp.service.registry import Registry

    reg = Registry(str(tmp_path / "r.sqlite"))
    said: list[str] = []
    reg._db.set_trace_callback(said.append)
    sids = reg.add_many([{"query": "PATTERN SEQ(a x)"}])
    reg.add_key(("k1", "alice", "subscriber", "d" * 64, 1.0))
    assert not any("synchronous" in s for s in said) and "PRAGMA synchronous=NORMAL" not in said
    assert reg._db.execute("PRAGMA synchronous").fetchone() == (1,)  # NORMAL
    result = {"query": "q", "id": "r1", "bindings": {"x": [0]}}
    for write in (lambda: reg.keep_queued({sids[0]: [result]}, {"": {"matches": 1}}), lambda: reg.remove_key("k1")):
        said.clear()
        write()
        assert said[0] == "PRAGMA synchronous=FULL" and said[1] == "BEGIN IMMEDIATE"
        assert said[-2:] == ["COMMIT", "PRAGMA synchronous=NORMAL"]
    reg.close()
    back = Registry(str(tmp_path / "r.sqlite"))
    assert [sid for sid, _, _ in back.all()] == sids and back.kept_queued() == {sids[0]: [result]}
    assert back.keys() == []


def test_a_restored_query_whose_text_the_checkpoint_left_to_the_engine_is_kept_only_for_the_same_text(tmp_path):
    """The checkpoint's service field leaves out a query text the engine's rows hold: a start keeps the
    restored query (and its partial match) for the subscription of the same text, and not for one whose text
    changed in the registry meanwhile."""
    records = pairs(2, 1)  # an a, then a b of key 0
    for changed in (False, True):
        state = tmp_path / f"changed-{changed}"
        with BackgroundService(config(state)) as svc:
            Client(f"http://127.0.0.1:{svc.port}").subscribe(PAIR.format(k=0), name="p")
            send(svc.feed_port("jsonl"), records[0])  # (an a: a partial match)
            wait_for(lambda: svc.engine.stats.live_runs == 1, what="the partial match")
        if changed:
            with sqlite3.connect(state / "state" / "subscriptions.sqlite") as db:
                db.execute("UPDATE subscriptions SET spec = json_set(spec, '$.query', ?)", (PAIR.format(k=1),))
        with BackgroundService(config(state)) as svc:
            (pattern, text, _), = svc.engine.sources.values()
            assert text == PAIR.format(k=1 if changed else 0)
            send(svc.feed_port("jsonl"), records[1])  # (the b: a match only with the restored run)
            wait_for(lambda: svc.events_in == 2, what="the b taken")
            time.sleep(0.2)
            assert svc.subs["s1"].counters.matches == (0 if changed else 1)


@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cut=st.integers(1, 59), more=st.integers(0, 20), with_sink=st.booleans())
def test_a_periodic_checkpoint_is_written_without_a_fork_and_a_kill_9_after_it_loses_nothing(
        tmp_path_factory, monkeypatch, cut, more, with_sink):
    """A periodic checkpoint takes the state on the engine thread and writes it on a thread of its own, no process
    forked; the files as a kill -9 right after it leaves them (the service going on meanwhile) restore every
    subscription, its partial matches and its counters: the events after the cut, fed again, complete every
    match the reference engine finds."""
    tmp = tmp_path_factory.mktemp("state")
    queries = {f"q{k}": PAIR.format(k=k) for k in range(3)}
    records = pairs(60, 3)
    want = expected(queries, records)
    out = LineListener()
    crash = tmp / "crash"

    def no_fork():
        raise AssertionError("forked for a checkpoint")

    monkeypatch.setattr(os, "fork", no_fork)
    try:
        with BackgroundService(config(tmp, checkpoint_every=3600, file_sink_dir=str(tmp))) as svc:
            c = Client(f"http://127.0.0.1:{svc.port}")
            c.subscribe_many([{"query": q, "name": n, **({"sink": out.url} if with_sink else {})}
                              for n, q in queries.items()])
            send(svc.feed_port("jsonl"), b"".join(records[:cut]))
            wait_for(lambda: svc.events_in == cut, what="the events before the cut")
            assert svc.save_checkpoint()  # (what the engine thread does every checkpoint_every seconds)
            shutil.copytree(tmp / "state", crash / "state")  # the files a kill -9 now leaves
            send(svc.feed_port("jsonl"), b"".join(records[cut:cut + more]))  # (lost with the kill -9)
            wait_for(lambda: svc.events_in == min(cut + more, len(records)), what="the events after the cut")
        monkeypatch.undo()
        with BackgroundService(config(crash, jsonl_port=0, file_sink_dir=str(crash))) as svc:
            assert svc.restored and svc.events_in == cut and sorted(svc.by_name) == sorted(queries)
            assert sum(s.counters.matches for s in svc.subs.values()) == sum(
                1 for m in want if m["bindings"]["y"][0] < cut)
            send(svc.feed_port("jsonl"), b"".join(records[cut:]))
            wait_for(lambda: svc.events_in == len(records), what="the rest taken")
            wait_for(lambda: sum(s.counters.matches for s in svc.subs.values()) == len(want), what="every match")
            if with_sink:  # (at least once, by id)
                wait_for(lambda: {r["id"] for r in out.results()} >= {m["id"] for m in want}, what="every result sent")
    finally:
        out.close()


def test_yfpp_serve_collects_garbage_as_rarely_as_yfpp_run(monkeypatch):
    """(the collector's default, every 700 allocations, cost 10-25 % of the CPU per event at 100,000 subscriptions)"""
    import gc

    from yfpp.service import server
    from yfpp.state.memory_cap import RARE_COLLECTIONS

    seen = []

    class Started(Exception):
        pass

    def service(config):
        seen.append(gc.get_threshold())
        raise Started

    monkeypatch.setattr(server, "Service", service)
    before = gc.get_threshold()
    gc.set_threshold(700, 10, 10)  # (Python's default; a yfpp run or serve in this process before may have set another)
    try:
        with pytest.raises(Started):
            server.run(ServiceConfig(state=None))
    finally:
        gc.set_threshold(*before)
    assert seen == [RARE_COLLECTIONS]


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=st.lists(st.tuples(st.sampled_from(["add", "delete", "update", "events", "checkpoint"]), st.integers(0, 5)),
                      min_size=1, max_size=12))
def test_checkpoints_against_a_base_between_registrations_updates_and_deletions_and_a_kill_9_lose_nothing(
        tmp_path_factory, steps):
    """Periodic checkpoints write the queries once (a base) and then what changed: with subscriptions added,
    changed (PUT) and deleted between them, and a new base after a change or two, the files a kill -9 leaves
    right after a checkpoint restore the subscriptions of then; fed the rest of the events, each counts the
    matches the uninterrupted service counts."""
    tmp = tmp_path_factory.mktemp("state")
    records = pairs(80, 3)
    crash = tmp / "crash"
    fed = 0
    with patch.object(query_base, "MIN_CHANGES", 2):
        with BackgroundService(config(tmp, checkpoint_every=3600)) as svc:
            c = Client(f"http://127.0.0.1:{svc.port}")
            for i, (step, k) in enumerate(steps):
                sids = sorted(svc.subs)
                if step == "add":
                    c.subscribe(PAIR.format(k=k % 3), name=f"n{i}")
                elif step == "delete" and sids:
                    c.unsubscribe(sids[k % len(sids)])
                elif step == "update" and sids:
                    c._request("PUT", f"/subscriptions/{sids[k % len(sids)]}",
                               json.dumps({"query": PAIR.format(k=(k + 1) % 3)}).encode())
                elif step == "events":
                    send(svc.feed_port("jsonl"), b"".join(records[fed:fed + 4 * k]))
                    fed = min(fed + 4 * k, len(records))
                    wait_for(lambda: svc.events_in == fed, what="the events")
                elif step == "checkpoint":
                    assert svc.save_checkpoint()
            assert svc.save_checkpoint()
            shutil.copytree(tmp / "state", crash / "state")  # the files a kill -9 now leaves
            with svc.engine_lock:
                names, runs = sorted(svc.by_name), len(svc.engine.snapshot()["runs"])
            send(svc.feed_port("jsonl"), b"".join(records[fed:]))
            wait_for(lambda: svc.events_in == len(records), what="the rest taken")
        want = {s.name: s.counters.matches for s in svc.subs.values()}
        with BackgroundService(config(crash, jsonl_port=0)) as svc:
            assert svc.restored and svc.events_in == fed and sorted(svc.by_name) == names
            assert len(svc.engine.snapshot()["runs"]) == runs  # (each query kept, with its partial matches)
            send(svc.feed_port("jsonl"), b"".join(records[fed:]))
            wait_for(lambda: svc.events_in == len(records), what="the rest taken")
        assert {s.name: s.counters.matches for s in svc.subs.values()} == want
        assert [p.name for p in (crash / "state").glob("engine-checkpoint.json.base-*")] != []


def test_sigterm_while_busy_stops_yfpp_serve_with_the_final_checkpoint(tmp_path):
    """``yfpp serve`` as its own process, its inbox full (a feed written faster than the engine takes it): SIGTERM
    ends it (exit 0) after the engine thread's bounded drain (what it did not take by then is logged with the seq
    to resend from), with the final checkpoint written at the events it took; a start on that state goes on from
    there."""
    state = tmp_path / "state"
    proc, started, c = yfpp_serve(state, 3600)
    try:
        c.subscribe(PAIR.format(k=0), name="p")  # (one key: each b completes every a of the last 100 events)

        def feed():
            try:
                send(started["feeds"]["jsonl"], b"".join(pairs(200_000, 1)))
            except OSError:  # (the feed port closes at the stop)
                pass

        threading.Thread(target=feed, daemon=True).start()
        wait_for(lambda: c.health()["inbox"] > 2, what="a busy engine")
        proc.send_signal(signal.SIGTERM)
        rest = proc.communicate(timeout=TIMEOUT * 3)[1]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0 and "Traceback" not in rest
    logged = [json.loads(line) for line in rest.splitlines() if line.startswith("{")]
    [written] = [r for r in logged if r["msg"] == "checkpoint written"]
    assert 0 < written["events_in"] <= 200_000
    for waiting in [r for r in logged if r["msg"] == "events still waiting at the stop are discarded"]:
        assert waiting["resend_from_seq"] == written["events_in"]  # (the inbox not taken in time: resent from there)
    with BackgroundService(config(tmp_path)) as svc:
        assert svc.events_in == written["events_in"] and list(svc.by_name) == ["p"]
