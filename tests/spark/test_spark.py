"""yfpp on Spark (a two-worker local cluster, tests/conftest.py): batch and streaming matches equal the local engine's, as multisets."""

from __future__ import annotations

import io
import json
import os
import pickle
import shutil
import socket
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

pytest.importorskip("pyspark", reason="pyspark is not installed (pip install '.[spark]')")

from yfpp.cli import main  # noqa: E402
from yfpp.input.dead_letters import DeadLetters  # noqa: E402
from yfpp.engine import Engine  # noqa: E402
from yfpp.errors import InputError  # noqa: E402
from yfpp.input.generate import generate_rfid, generate_stock, write_events  # noqa: E402
from yfpp.input.readers import read_events  # noqa: E402
from yfpp.spark import match, read_events_df  # noqa: E402
from yfpp.spark.stream import finish, read_stream, start_stream  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
RFID_QUERIES = {
    "shop_sase": "PATTERN SEQ(shelf a, ~register b, exit c) WHERE [tag_id] WITHIN 1 hour",
    "shop_xpath": "[tag_id]&&//shelf//!register//exit&&(1 hour)",
    "out_xpath": "[tag_id]&&//shelf//exit&&(1 hour)",
    "zone_xpath": "[tag_id]&&//shelf[@zone='Z1']//exit[@door='D1']&&(1 hour)",
    "unkeyed": "//register//exit&&(60)",
    "strict_keyed": "PATTERN SEQ(shelf a, exit c) WHERE strict_contiguity(a, c) {[tag_id]} WITHIN 10 min",
    "quiet": "PATTERN SEQ(register a, ~exit b) WITHIN 100",
    "quiet_tag": "PATTERN SEQ(shelf a, ~exit b) WHERE [tag_id] WITHIN 300",
    "first_out": "PATTERN SEQ(shelf a, exit c) WHERE [tag_id] WITHIN 1 hour OUTPUT non_overlapping",
    "theft": "PATTERN SEQ(shelf a, ~register b, exit c) WHERE [tag_id] WITHIN 12 hours RETURN theft(tag = a.tag_id, door = c.door)",
    "same_zone": "PATTERN SEQ(shelf a, shelf b) WHERE [tag_id, zone] WITHIN 1 hour",
}


def local(queries: dict[str, str], path: Path) -> Counter:
    """What ``yfpp run`` prints for ``path``, as a multiset of JSON lines."""
    eng = Engine(dead_letters=DeadLetters())
    for name, q in queries.items():
        eng.register(q, name=name)
    return Counter(json.dumps(m) for m in eng.process_all(read_events(path, dead_letters=DeadLetters())))


def lines(df) -> Counter:
    return Counter(r[0] for r in df.collect())


@pytest.fixture(scope="module")
def rfid(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("rfid")
    records = list(generate_rfid(2000, tags=8, gap=12, seed=7))
    write_events(records, d / "feed.xml")
    write_events(records, d / "feed.jsonl")
    return d


@pytest.mark.parametrize("fmt", ["xml", "jsonl"])
def test_batch_equals_engine_on_rfid(spark, rfid, fmt):
    path = rfid / f"feed.{fmt}"
    got = lines(match(spark, RFID_QUERIES, read_events_df(spark, path)).select("json"))
    expected = local(RFID_QUERIES, path)
    assert got == expected
    assert {json.loads(x)["query"] for x in got} == set(RFID_QUERIES)


def test_batch_stock_kleene_from_a_flat_dataframe(spark):
    records = [{**r, "ts": float(r["ts"]), "seq": i} for i, r in enumerate(generate_stock(1500, symbols=3, seed=4))]
    queries = {
        "rise": "PATTERN SEQ(stock+ a[], stock b) WHERE [symbol] AND a[i].price > a[i-1].price "
                "AND b.price < a[a.len].price WITHIN 20",
        "pair": "PATTERN SEQ(stock a, stock b) WHERE strict_contiguity(a, b) { a.price < b.price } WITHIN 5",
        "jump": "PATTERN SEQ(stock a, stock b) WHERE [symbol] AND b.price > a.price + 9",
    }
    df = spark.createDataFrame(records)  # attributes as columns, seq given
    got = lines(match(spark, queries, df).select("json"))
    eng = Engine(dead_letters=DeadLetters())
    for name, q in queries.items():
        eng.register(q, name=name)
    expected = Counter(json.dumps(m) for m in eng.process_all({k: v for k, v in r.items() if k != "seq"} for r in records))
    assert got == expected and len(expected) > 100


@pytest.mark.parametrize("kind", ["timestamp", "timestamp_ntz"])
def test_timestamp_columns_are_seconds_since_the_epoch(spark, kind):
    """A TimestampType ``ts`` is its instant in seconds (session time zone irrelevant), fractions kept;
    a TimestampNTZType one is read as UTC."""
    from datetime import datetime, timezone

    records = [{**r, "ts": 1_700_000_000.125 + r["ts"]} for r in generate_rfid(800, tags=5, gap=20, seed=2)]
    queries = {k: RFID_QUERIES[k] for k in ("shop_sase", "unkeyed", "quiet_tag")}
    tz = timezone.utc if kind == "timestamp" else None
    rows = [(i, r["type"], datetime.fromtimestamp(r["ts"], timezone.utc).replace(tzinfo=tz), r.get("tag_id"))
            for i, r in enumerate(records)]
    old_tz = spark.conf.get("spark.sql.session.timeZone")
    spark.conf.set("spark.sql.session.timeZone", "America/New_York")
    try:
        df = spark.createDataFrame(rows, f"seq long, type string, ts {kind}, tag_id long")
        got = lines(match(spark, queries, df).select("json"))
    finally:
        spark.conf.set("spark.sql.session.timeZone", old_tz)
    eng = Engine(dead_letters=DeadLetters())
    for name, q in queries.items():
        eng.register(q, name=name)
    expected = Counter(json.dumps(m) for m in eng.process_all(records))
    assert got == expected and sum(expected.values()) > 20


def test_directory_seq_dead_letters_and_late_events(spark, tmp_path):
    feeds = tmp_path / "feeds"
    feeds.mkdir()
    recs = [json.dumps(r) for r in generate_rfid(600, tags=6, seed=9)]
    parts = [recs[:200], recs[200:400] + ["not json", '{"type": "exit", "ts": 3, "tag_id": 1}'], recs[400:]]
    for i, part in enumerate(parts):
        (feeds / f"part-{i}.jsonl").write_text("\n".join(part) + "\n")
    whole = tmp_path / "whole.jsonl"
    whole.write_text("".join((feeds / f"part-{i}.jsonl").read_text() for i in range(3)))
    queries = {k: RFID_QUERIES[k] for k in ("shop_sase", "unkeyed", "quiet")}
    events = read_events_df(spark, feeds)
    assert lines(match(spark, queries, events).select("json")) == local(queries, whole)
    buf = io.StringIO()
    dead = DeadLetters(buf)  # the reader's malformed line, then the engine's late event
    eng = Engine(dead_letters=dead)
    kept = []
    for ev in read_events(whole, dead_letters=dead):
        eng.process(ev)
        kept.append((ev.seq, ev.type))
    letters = [json.loads(x) for x in buf.getvalue().splitlines()]
    letters[0]["position"] = "part-1.jsonl line 201"  # the position within its file
    got = events.where("reason is not null").select("seq", "position", "reason", "raw").orderBy("seq").collect()
    assert [r.asDict() for r in got] == letters and [x["seq"] for x in letters] == [400, 401]
    assert sorted((r.seq, r.type) for r in events.where("reason is null").collect()) == [k for k in kept if k[0] != 401]


@pytest.mark.parametrize("plan", ["scan", "shuffle"])
def test_cli_spark_writes_jsonl_parquet_and_counters(spark, tmp_path, capsys, plan):
    sample = ROOT / "yfpp" / "data" / "sample_rfid.xml"
    query = str(ROOT / "queries" / "shoplifting.sase")
    assert main(["spark", "-q", query, "-q", "//register//exit&&(60)", "-i", str(sample), "-o", str(tmp_path / "out"),
                 "--plan", plan]) == 0
    err = capsys.readouterr().err
    assert main(["run", "-q", query, "-q", "//register//exit&&(60)", "-i", str(sample)]) == 0
    expected = Counter(capsys.readouterr().out.splitlines())
    assert lines(spark.read.text(str(tmp_path / "out" / "matches.jsonl"))) == expected
    parquet = spark.read.parquet(str(tmp_path / "out" / "matches.parquet"))
    assert dict(parquet.dtypes)["bindings"] == "map<string,array<bigint>>"
    assert parquet.count() == sum(expected.values())
    assert "shoplifting" in err and "matches per query" in err


def split_feed(records: list[dict], folder: Path, parts: int) -> list[Path]:
    folder.mkdir()
    step = -(-len(records) // parts)
    files = []
    for i in range(parts):
        files.append(folder / f"feed-{i}.jsonl")
        write_events(records[i * step:(i + 1) * step], files[-1])
    return files


def run_stream(spark, queries: dict[str, str], inbox: Path, out: Path, checkpoint: Path, max_files: int | None = None) -> None:
    finish(start_stream(spark, queries, str(out), str(checkpoint), path=str(inbox), max_files=max_files))


STREAM_QUERIES = {k: RFID_QUERIES[k] for k in ("shop_sase", "out_xpath", "unkeyed", "quiet_tag", "first_out")}


@pytest.fixture(scope="module")
def feed(spark, tmp_path_factory) -> tuple[Path, Counter]:
    """Three feed files, the last ending with a heartbeat (a much later event that lets deadlines pass),
    and the batch job's matches over them."""
    d = tmp_path_factory.mktemp("feed")
    records = list(generate_rfid(900, tags=6, gap=15, seed=11))
    records.append({"type": "heartbeat", "ts": records[-1]["ts"] + 10**6})
    files = split_feed(records, d / "all", 3)
    with files[1].open("a") as f:
        f.write("not json\n")  # a dead letter: line 302 of file 1, seq 301 + 301
    # a stream takes files in order of modification time: make it the names' order (the append above made
    # file 1 newer than file 2 whenever the clock ticked in between; copytree keeps these times)
    base = files[0].stat().st_mtime
    for i, f in enumerate(files):
        os.utime(f, (base + i, base + i))
    return d / "all", lines(match(spark, STREAM_QUERIES, read_events_df(spark, d / "all")).select("json"))


def test_stream_over_three_micro_batches_equals_batch(spark, feed, tmp_path, capsys):
    folder, batch = feed
    inbox = tmp_path / "inbox"
    shutil.copytree(folder, inbox)
    running = start_stream(spark, STREAM_QUERIES, str(tmp_path / "out"), str(tmp_path / "ck"), path=str(inbox), max_files=1)
    finish(running)
    assert lines(spark.read.text(str(tmp_path / "out" / "matches.jsonl"))) == batch
    (dead,) = [json.loads(r.value) for r in spark.read.text(str(tmp_path / "out" / "dead_letters.jsonl")).collect()]
    assert dead["seq"] == 602 and dead["position"] == "feed-1.jsonl line 302"
    log = capsys.readouterr().err
    assert all(f"batch {i}:" in log for i in range(3))
    # the files were read by tasks on the executors (Spark's file scan), not by the driver
    read = bytes_read_per_executor(spark, running[0])
    assert sum(read.values()) >= sum(f.stat().st_size for f in inbox.iterdir()) > 0
    listed = spark.sparkContext._jsc.sc().statusStore().executorList(True)
    executors = {listed.apply(i).id() for i in range(listed.size())} - {"driver"}
    assert set(read) <= executors, read


def bytes_read_per_executor(spark, query) -> Counter:
    """Input bytes the tasks of ``query``'s jobs read, per executor id (Spark's status store: the web UI's figures)."""
    sc = spark.sparkContext
    sc._jsc.sc().listenerBus().waitUntilEmpty()
    tracker, store = sc.statusTracker(), sc._jsc.sc().statusStore()
    read: Counter = Counter()
    for job in tracker.getJobIdsForGroup(str(query.runId)):
        for stage in tracker.getJobInfo(job).stageIds:
            tasks = store.taskList(stage, 0, 10_000)
            for i in range(tasks.size()):
                task = tasks.apply(i)
                metrics = task.taskMetrics()
                if metrics.isDefined() and metrics.get().inputMetrics().bytesRead():
                    read[task.executorId()] += metrics.get().inputMetrics().bytesRead()
    return read


def test_stream_restarts_from_its_checkpoint(spark, feed, tmp_path):
    folder, batch = feed
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    files = sorted(folder.iterdir())
    for f in files[:2]:
        shutil.copy(f, inbox)
    run_stream(spark, STREAM_QUERIES, inbox, tmp_path / "out", tmp_path / "ck")
    first = lines(spark.read.text(str(tmp_path / "out" / "matches.jsonl")))
    shutil.copy(files[2], inbox)
    run_stream(spark, STREAM_QUERIES, inbox, tmp_path / "out", tmp_path / "ck")  # a new query, same checkpoint
    assert lines(spark.read.text(str(tmp_path / "out" / "matches.jsonl"))) == batch
    assert 0 < sum(first.values()) < sum(batch.values())


class Killed(Exception):
    """The driver killed here: the query fails at this point, leaving its checkpoint as a kill would."""


def kill_once(monkeypatch, owner, name: str, after: bool, when=lambda *a: True) -> None:
    """Make ``owner.name`` fail (before or after doing its work) the first time ``when(*args)`` holds."""
    original = getattr(owner, name)
    fired = []

    def killed(*args):
        if fired or not when(*args):
            return original(*args)
        fired.append(1)
        if after:
            original(*args)
        raise Killed(f"killed {'after' if after else 'before'} {name}")

    monkeypatch.setattr(owner, name, killed)


def test_stream_killed_at_five_points_loses_and_repeats_nothing(spark, feed, tmp_path, monkeypatch):
    """Killed while staging batch 1 (before its rename; after it, before its record), between the two
    queries (ingest ran alone), in the matching query before its outputs and after them (before its
    commit); each time restarted from the checkpoint: the batch job's matches, every record staged once."""
    from yfpp.spark import ingest, stream

    folder, batch = feed
    inbox, out, ck = tmp_path / "inbox", tmp_path / "out", tmp_path / "ck"
    shutil.copytree(folder, inbox)
    staged_1 = lambda self, tmp, final: final.endswith("/staged/batch-000000000001")  # noqa: E731
    kills = [(ingest.Files, "publish", False, staged_1), (ingest.Files, "publish", True, staged_1), None,
             (stream, "write_batch", False), (stream, "write_batch", True)]
    for kill in kills:
        with monkeypatch.context() as m:
            if kill is None:  # the ingest query alone: it stages the rest, the matching query never sees it
                finish([read_stream(spark, str(inbox), checkpoint=str(ck), max_files=1)[1]])
                continue
            kill_once(m, *kill)
            with pytest.raises(Exception, match="Killed: killed"):
                finish(start_stream(spark, STREAM_QUERIES, str(out), str(ck), path=str(inbox), max_files=1))
        assert not spark.streams.active
    finish(start_stream(spark, STREAM_QUERIES, str(out), str(ck), path=str(inbox), max_files=1))
    assert lines(spark.read.text(str(out / "matches.jsonl"))) == batch
    (dead,) = [json.loads(r.value) for r in spark.read.text(str(out / "dead_letters.jsonl")).collect()]
    assert dead["seq"] == 602
    seqs = [r.seq for r in spark.read.option("recursiveFileLookup", "true").parquet(str(ck / "staged")).select("seq").collect()]
    assert sorted(seqs) == list(range(902))
    assert sorted(p.name for p in (ck / "staged").iterdir()) == [f"batch-{i:012d}" for i in range(3)]


def run_cli_bounded(spark, args: list[str], seconds: float = 600) -> int:
    """``yfpp`` with ``args`` (in this thread: the active session is per thread, and a thread
    without one would start and stop its own); a timer stops the stream if it runs ``seconds``."""
    timer = threading.Timer(seconds, lambda: [q.stop() for q in spark.streams.active])
    timer.start()
    started = time.monotonic()
    try:
        code = main(args)
    finally:
        timer.cancel()
    assert time.monotonic() - started < seconds, f"yfpp {' '.join(args[:2])} did not stop by itself"
    return code


def test_idle_stop_stops_a_fresh_and_a_restarted_stream(spark, tmp_path, capsys):
    """The bound (600 s) only catches a stream that never stops: on a quiet machine each run takes seconds."""
    inbox, out = tmp_path / "inbox", tmp_path / "out"
    inbox.mkdir()
    args = ["spark", "--stream", "-q", "[tag_id]//shelf//exit(10)", "-i", str(inbox), "-o", str(out), "--idle-stop", "2"]
    write_events([{"type": "shelf", "ts": 0, "tag_id": 1}, {"type": "exit", "ts": 1, "tag_id": 1}], inbox / "a.jsonl")
    assert run_cli_bounded(spark, args) == 0
    write_events([{"type": "shelf", "ts": 2, "tag_id": 2}, {"type": "exit", "ts": 3, "tag_id": 2}], inbox / "b.jsonl")
    assert run_cli_bounded(spark, args) == 0  # restarted from OUTDIR/_checkpoint: one new file, then idle
    assert run_cli_bounded(spark, args) == 0  # restarted with nothing new
    assert not spark.streams.active
    log = capsys.readouterr().err
    assert log.count(": 1 matches (q 1)") == 2, log  # one per file (batches without input may come between)


def test_socket_source_reads_lines_as_they_come():
    from yfpp.spark.source import _SocketReader

    server = socket.create_server(("localhost", 0))
    port = server.getsockname()[1]

    def serve() -> None:
        conn, _ = server.accept()
        conn.sendall(b'{"type": "a", "ts": 1}\n{"type": "b", "ts": 0}\n{"type": "c", "ts"')
        conn.close()

    threading.Thread(target=serve, daemon=True).start()
    reader = _SocketReader({"socket": f"localhost:{port}"})
    rows, end = reader.read(reader.initialOffset())
    rows = list(rows)
    assert [(r[0], r[1], r[5] and r[5].split(":")[0]) for r in rows] == [(0, "a", None), (1, "b", "late event")]
    assert end == {"seq": 2, "max_ts": 1.0}
    assert pickle.loads(pickle.dumps(reader)).sock is None  # Spark pickles readers
    with pytest.raises(InputError, match="cannot read a micro-batch again"):
        reader.readBetweenOffsets({"seq": 0, "max_ts": None}, end)
    reader.stop()
    server.close()


def test_stream_from_ts_0_matches_everything_and_reports_late_rows(spark, tmp_path):
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    pairs = [r for i in range(400) for r in ({"type": "shelf", "ts": 2 * i, "tag_id": i},
                                             {"type": "exit", "ts": 2 * i + 1, "tag_id": i})]
    write_events(pairs[:400], inbox / "a.jsonl")
    write_events(pairs[400:] + [{"type": "exit", "ts": 5, "tag_id": 2}], inbox / "b.jsonl")  # the last row is late
    a_time = (inbox / "a.jsonl").stat().st_mtime
    os.utime(inbox / "b.jsonl", (a_time + 1, a_time + 1))  # across micro-batches files go by modification time
    queries = {"out": "PATTERN SEQ(shelf a, exit c) WHERE [tag_id] WITHIN 10"}
    run_stream(spark, queries, inbox, tmp_path / "out", tmp_path / "ck", max_files=1)
    assert sum(lines(spark.read.text(str(tmp_path / "out" / "matches.jsonl"))).values()) == 400
    (dead,) = [json.loads(r.value) for r in spark.read.text(str(tmp_path / "out" / "dead_letters.jsonl")).collect()]
    assert dead["seq"] == 800 and dead["reason"].startswith("late event")


@pytest.mark.parametrize("plan", ["scan", "shuffle"])
def test_feedback_on_spark_equals_run(spark, rfid, tmp_path, capsys, plan):
    qfile = tmp_path / "fb.xpe"
    qfile.write_text(
        "@query theft_fb\n[tag_id]&&//shelf//!register//exit&&(1 hour)&&=> theft(tag_id = e1.tag_id, zone = e1.zone) feedback\n"
        "@query shelf_then_theft\n[tag_id]&&//shelf//theft&&(1 hour)&&=> seen_theft(tag_id = e1.tag_id) feedback\n"
        "@query twice\n[tag_id]&&//theft//seen_theft&&(1 hour)\n"
        "@query zone_pairs\n[zone]&&//shelf//shelf&&(30)\n")
    feed = str(rfid / "feed.xml")
    assert main(["spark", "-q", str(qfile), "-i", feed, "-o", str(tmp_path / "out"), "--plan", plan]) == 0
    capsys.readouterr()
    assert main(["run", "-q", str(qfile), "-i", feed]) == 0
    expected = Counter(capsys.readouterr().out.splitlines())
    assert lines(spark.read.text(str(tmp_path / "out" / "matches.jsonl"))) == expected
    assert {json.loads(x)["query"] for x in expected} == {"theft_fb", "shelf_then_theft", "twice", "zone_pairs"}
    parquet = spark.read.parquet(str(tmp_path / "out" / "matches.parquet"))
    assert dict(parquet.dtypes)["bindings"] == "map<string,array<string>>"
    guard = ["--max-feedback-depth", "1"]  # the loop guards pass through: seen_theft (depth 2) is dropped
    assert main(["spark", "-q", str(qfile), "-i", feed, "-o", str(tmp_path / "guarded"), *guard, "--plan", plan]) == 0
    capsys.readouterr()
    assert main(["run", "-q", str(qfile), "-i", feed, *guard]) == 0
    guarded = Counter(capsys.readouterr().out.splitlines())
    assert lines(spark.read.text(str(tmp_path / "guarded" / "matches.jsonl"))) == guarded
    assert {json.loads(x)["query"] for x in guarded} == {"theft_fb", "shelf_then_theft", "zone_pairs"}


@pytest.mark.parametrize("plan", ["scan", "shuffle"])
def test_set_queries_on_spark_equal_run(spark, rfid, tmp_path, capsys, plan):
    from tests.spark.test_spark_plan import SETS

    files = []
    for ext in ("sase", "xpe"):
        files.append(str(tmp_path / f"sets.{ext}"))
        queries = {**SETS, "shop": RFID_QUERIES["shop_sase"]}.items()
        Path(files[-1]).write_text("".join(f"@query {n}\n{q}\n" for n, q in queries if q.startswith("P") == (ext == "sase")))
    feed = str(rfid / "feed.jsonl")
    assert main(["spark", "-q", *files, "-i", feed, "-o", str(tmp_path / "out"), "--partitions", "3", "--plan", plan]) == 0
    assert spark.conf.get("spark.sql.shuffle.partitions") == "4"  # a borrowed session gets its options back
    capsys.readouterr()
    assert main(["run", "-q", *files, "-i", feed]) == 0
    expected = Counter(capsys.readouterr().out.splitlines())
    assert lines(spark.read.text(str(tmp_path / "out" / "matches.jsonl"))) == expected
    assert {json.loads(x)["query"] for x in expected} == {*SETS, "shop"}


@pytest.mark.parametrize("plan", ["scan", "shuffle"])
def test_full_events_on_spark_equal_run(spark, rfid, tmp_path, capsys, plan):
    qfile = tmp_path / "fb.xpe"
    qfile.write_text(
        "@query theft_fb\n[tag_id]&&//shelf//!register//exit&&(1 hour)&&=> theft(tag_id = e1.tag_id, zone = e1.zone) feedback\n"
        "@query shelf_then_theft\n[tag_id]&&//shelf//theft&&(1 hour)\n")
    feed = str(rfid / "feed.xml")
    assert main(["spark", "-q", str(qfile), "-i", feed, "-o", str(tmp_path / "out"), "--events", "--plan", plan]) == 0
    capsys.readouterr()
    assert main(["run", "-q", str(qfile), "-i", feed, "--events"]) == 0
    expected = Counter(capsys.readouterr().out.splitlines())
    assert lines(spark.read.text(str(tmp_path / "out" / "matches.jsonl"))) == expected
    derived = [json.loads(x) for x in expected if json.loads(x)["query"] == "shelf_then_theft"]
    assert derived and all("from" in m["events"]["e2"][0] for m in derived)  # a derived event's provenance
    parquet = spark.read.parquet(str(tmp_path / "out" / "matches.parquet"))  # the same events, as a JSON column
    canon = lambda events: json.dumps(events, sort_keys=True)  # noqa: E731
    assert Counter(canon(json.loads(r["events"])) for r in parquet.select("events").collect()) == \
        Counter(canon(json.loads(x)["events"]) for x in expected.elements())
