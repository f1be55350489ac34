"""Live sources of ``yfpp spark --stream`` (``yfpp.spark.live_sources``): ``-i tcp://…`` from a TCP server
the test starts, ``-i mqtt://…`` from a real Mosquitto broker (tests/mosquitto.py), both on loopback.

The receivers and readers alone (no JVM): what the receivers spool and publish, the offsets, a micro-batch
planned again after a restart, the AUTH line, an MQTT persistent session across a restart, MQTT drops. Through Spark (the two-worker cluster of
tests/conftest.py): the matches of ``yfpp spark --stream -i tcp://…`` / ``-i mqtt://…`` equal ``yfpp run``'s
over the same events, also across a restart and a failure after a batch's outputs were written. Every
wait is bounded; the servers and the broker are stopped by the test (the broker by its PID).
"""

from __future__ import annotations

import json
import pickle
import re
import shutil
import socket
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

pytest.importorskip("pyspark", reason="pyspark is not installed (pip install '.[spark]')")
paho = pytest.importorskip("paho.mqtt.client", reason="paho-mqtt is not installed (pip install -e '.[serve]')")

from tests.mosquitto import Mosquitto  # noqa: E402
from tests.spark.test_spark_hot_keys import SHOP, skewed_feed  # noqa: E402
from yfpp.cli import main  # noqa: E402
from yfpp.input.generate import generate_rfid  # noqa: E402
from yfpp.spark.live_parse import frame  # noqa: E402
from yfpp.spark.live_receiver import Feed, MqttReceiver  # noqa: E402
from yfpp.spark.live_sources import _MqttReader, _TcpReader  # noqa: E402
from yfpp.spark.live_spool import Spool  # noqa: E402

TIMEOUT = 30.0
ACCEPT_TIMEOUT = 600.0  #: the stream's JVM and session may take minutes to start on a loaded machine
QUERIES = ["PATTERN SEQ(shelf a, ~register b, exit c) WHERE [tag_id] WITHIN 1 hour",
           "[tag_id]&&//shelf//exit&&(1 hour)"]
needs_broker = pytest.mark.skipif(shutil.which("mosquitto") is None,
                                  reason="mosquitto is not installed (apt-get install -y mosquitto; .ci/run installs it)")


class Producer:
    """A TCP server on loopback: each connection gets ``chunks`` (the first connection only; later ones
    nothing), a pause between them, then the server closes it. Records the first line each sends."""

    def __init__(self, chunks: list[bytes], pause: float = 0.0):
        self.chunks, self.pause = chunks, pause
        self.server = socket.create_server(("127.0.0.1", 0))
        self.server.settimeout(ACCEPT_TIMEOUT)
        self.port = self.server.getsockname()[1]
        self.first_lines: list[bytes] = []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        served = 0
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:  # closed, or no connection for ACCEPT_TIMEOUT
                return
            with conn:
                conn.settimeout(0.5)
                try:
                    self.first_lines.append(conn.recv(256))
                except TimeoutError:
                    self.first_lines.append(b"")
                for chunk in self.chunks if not served else []:
                    conn.sendall(chunk)
                    time.sleep(self.pause)
            served += 1

    def close(self) -> None:
        close_server(self.server)
        self.thread.join(TIMEOUT)


def close_server(server: socket.socket) -> None:
    """Closes a listening socket and wakes a thread blocked in its ``accept`` (on Linux ``shutdown`` does; a bare
    ``close`` leaves it blocked until its timeout, and the thread's ``join`` waiting as long)."""
    try:
        server.shutdown(socket.SHUT_RDWR)
    except OSError:  # (where a listening socket cannot be shut down, its accept ends at its timeout)
        pass
    server.close()


def feed_lines(n: int, seed: int) -> list[bytes]:
    records = list(generate_rfid(n, tags=6, gap=15, seed=seed))
    records.append({"type": "heartbeat", "ts": records[-1]["ts"] + 10**5})  # lets the last deadlines pass
    return [json.dumps(r).encode() + b"\n" for r in records]


def run_lines(path: Path, capsys) -> Counter:
    """``yfpp run``'s match lines over ``path``."""
    assert main(["run", *[a for q in QUERIES for a in ("-q", q)], "-i", str(path)]) == 0
    return Counter(capsys.readouterr().out.splitlines())


def spark_lines(out: Path) -> Counter:
    return Counter(ln for f in sorted(out.glob("matches.jsonl/batch=*/part-*")) for ln in f.read_text().splitlines())


def poll(reader, start: dict, want: int) -> dict:
    """Take offsets until ``want`` records are spooled after ``start`` (bounded); the last offset."""
    end = time.monotonic() + TIMEOUT
    offset = reader.latestOffset()
    while offset["records"] - start["records"] < want and time.monotonic() < end:
        time.sleep(0.05)
        offset = reader.latestOffset()
    return offset


def parsed(reader, start: dict, end: dict) -> list[dict]:
    """The rows of the micro-batch from ``start`` to ``end``, as an executor reads them (a pickled reader)."""
    worker = pickle.loads(pickle.dumps(reader))
    return [row for chunk in reader.partitions(start, end) for b in worker.read(chunk) for row in b.to_pylist()]


def records(rows: list[dict]) -> list[tuple]:
    """``(pos, type, ts, reason, line)`` of the records (not the summaries), in ``pos`` order."""
    return [(r["pos"], r["type"], r["ts"], r["reason"] and r["reason"].split(":")[0], r["line"])
            for r in sorted((r for r in rows if r["n"] is None), key=lambda r: (r["pos"] is None, r["pos"] or 0))]


def test_the_tcp_receiver_spools_sends_its_key_and_a_batch_is_planned_again(tmp_path, monkeypatch):
    from tests.spark.test_spark_live_spool import receiving

    monkeypatch.setenv("YFPP_FEED_KEY", "k-123")
    producer = Producer([b'{"type": "a", "ts": 1}\n{"type": "b", "ts": 0}\n{"type": "c", "ts"', b': 2}\nnot json\n',
                         b'{"type": "d", "ts": 3}'], pause=0.3)  # a last line without its newline
    options = {"url": f"tcp://127.0.0.1:{producer.port}", "spool": str(tmp_path / "ck" / "live" / "spool")}
    feed = Feed.of(options["url"], options["spool"], {})  # (made on the driver: the key travels with the task)
    reader = _TcpReader(options)
    start = reader.initialOffset()
    with receiving(feed):
        mid = poll(reader, start, 2)
        end = poll(reader, start, 5)
    assert end == {"pos": 101, "records": 5}
    first, rest = parsed(reader, start, mid), parsed(reader, mid, end)
    # parsed on the executors: a record's index in its chunk, a dead letter's line in the whole feed (its
    # position, "line 2" of its chunk, becomes "line 4" when the stager numbers the records)
    assert records(first) == [(0, "a", 1.0, None, None), (1, "b", 0.0, None, None)]
    assert records(rest) == [(0, "c", 2.0, None, None), (1, None, None, "bad JSON", 4), (2, "d", 3.0, None, None)]
    rows = first + rest
    summaries = [r for r in rows if r["n"] is not None]
    assert sum(s["n"] for s in summaries) == 5 and sum(s["dead"] for s in summaries) == 1
    assert producer.first_lines[0] == b"AUTH k-123\n"  # the line a feed connection to yfpp serve sends
    spool = Path(options["spool"])
    (segment,) = [f for f in spool.iterdir() if "-" in f.name]
    with segment.open("ab") as f:
        f.write(b'{"type": "cut')  # a receiver that died in the middle of a write
    again = _TcpReader(options)  # a restarted query: a new reader over the same spool
    assert again.partitions(start, end) == reader.partitions(start, end)  # planned again identically
    with receiving(feed):  # a receiver started again: connects again, the producer has nothing more
        deadline = time.monotonic() + TIMEOUT
        while len(producer.first_lines) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
    assert again.latestOffset() == end
    assert segment.stat().st_size == end["pos"]  # the cut tail dropped
    producer.close()


class SteppedReceiver(MqttReceiver):
    """An MQTT receiver whose task loop (:meth:`step`: publication and acknowledgements) runs on a thread of its
    own until :meth:`close`, as :func:`yfpp.spark.live_receiver.receive` runs it."""

    def connect(self) -> None:
        super().connect()
        self.stepping = threading.Event()
        self.loop = threading.Thread(target=self._loop, daemon=True)
        self.loop.start()

    def _loop(self) -> None:
        while not self.stepping.is_set():
            self.step()

    def close(self) -> None:
        self.stepping.set()
        self.loop.join(TIMEOUT)
        super().close()


def mqtt_receiver(url: str, folder: str, **options: str) -> MqttReceiver:
    """An MQTT receiver on ``folder``, connected and subscribed, its task loop running."""
    receiver = SteppedReceiver(Feed.of(url, folder, options), Spool(folder))
    receiver.connect()
    return receiver


@needs_broker
def test_the_mqtt_receiver_s_persistent_session_keeps_what_came_while_it_was_away(tmp_path):
    broker = Mosquitto(tmp_path).start()
    try:
        url = f"mqtt://127.0.0.1:{broker.port}/rfid/{{reader}}?qos=1&client_id=spark-1&clean=0"
        options = {"url": url, "spool": str(tmp_path / "spool")}
        receiver = mqtt_receiver(url, options["spool"])
        reader = _MqttReader(options)
        start = reader.initialOffset()
        pub = paho.Client(paho.CallbackAPIVersion.VERSION2, protocol=paho.MQTTv311)
        pub.connect("127.0.0.1", broker.port)
        pub.loop_start()
        pub.publish("rfid/r1", b'{"type": "a", "ts": 1}\n{"type": "b", "ts": 2}', 1).wait_for_publish(TIMEOUT)
        pub.publish("rfid/r2", b"[1,", 1).wait_for_publish(TIMEOUT)  # a dead letter
        mid = poll(reader, start, 2)
        first = parsed(reader, start, mid)
        assert [(r["pos"], r["type"], json.loads(r["attrs"])) for r in first if r["type"]] == [
            (0, "a", {"reader": "r1"}), (1, "b", {"reader": "r1"})]
        (dead,) = [r for r in first if r["reason"]]
        assert dead["pos"] is None and dead["position"] == "mqtt rfid/r2 message 2"  # no seq: -1 once staged
        receiver.close()
        receiver.spool.close()
        for i in range(3):  # while the stream is away: kept by the broker for the persistent session
            pub.publish("rfid/r3", json.dumps({"type": "c", "ts": 10 + i}).encode(), 1).wait_for_publish(TIMEOUT)
        again = _MqttReader(options)
        assert parsed(again, start, mid) == first  # the spool, planned again
        receiver = mqtt_receiver(url, options["spool"])
        end = poll(again, mid, 3)
        assert end["records"] == 5
        assert [(r["pos"], r["type"]) for r in parsed(again, mid, end) if r["type"]] == [(0, "c"), (1, "c"), (2, "c")]
        receiver.close()
        receiver.spool.close()
        pub.loop_stop()
        pub.disconnect()
    finally:
        broker.stop()


@needs_broker
def test_an_mqtt_source_drops_what_its_full_spool_cannot_hold_reports_it_and_goes_on(tmp_path):
    """Over ``max_spool_bytes`` not yet committed, messages are dropped and counted; once Spark commits,
    their count is spooled as one dead letter where they were, and the messages after it are spooled."""
    broker = Mosquitto(tmp_path).start()
    size = len(frame("rfid/r1", json.dumps({"type": "a", "ts": 10}).encode()))
    url, folder = f"mqtt://127.0.0.1:{broker.port}/rfid/{{reader}}?qos=1", str(tmp_path / "spool")
    receiver = mqtt_receiver(url, folder, max_spool_bytes=str(3 * size))
    reader = _MqttReader({"url": url, "spool": folder})
    pub = paho.Client(paho.CallbackAPIVersion.VERSION2, protocol=paho.MQTTv311)
    try:
        start = reader.initialOffset()
        pub.connect("127.0.0.1", broker.port)
        pub.loop_start()

        def publish(*tss: int) -> None:
            for ts in tss:
                pub.publish("rfid/r1", json.dumps({"type": "a", "ts": ts}).encode(), 1).wait_for_publish(TIMEOUT)

        publish(*range(10, 20))
        deadline = time.monotonic() + TIMEOUT
        while receiver.dropped < 7 and time.monotonic() < deadline:
            time.sleep(0.05)
        full = reader.latestOffset()
        assert (full["records"], receiver.dropped) == (3, 7)  # three fit, the rest dropped and counted
        reader.commit(full)  # Spark committed: room again
        publish(20, 21)
        end = poll(reader, start, 6)  # the drop report, then the two new messages
        assert end["records"] == 6 and receiver.dropped == 0
        rows = [r for r in parsed(reader, start, end) if r["n"] is None]
        assert [(r["ts"], r["reason"], r["position"]) for r in rows] == [
            (10.0, None, None), (11.0, None, None), (12.0, None, None),
            (None, "spool full: 7 messages dropped (max_spool_bytes), not matched", "mqtt spool"),
            (20.0, None, None), (21.0, None, None)]
        assert [r["pos"] for r in rows] == [0, 1, 2, None, 3, 4]  # the report takes no seq (-1 once staged)
    finally:
        pub.loop_stop()
        pub.disconnect()
        receiver.close()
        receiver.spool.close()
        broker.stop()


def stream_args(source: str, out: Path, *extra: str) -> list[str]:
    return ["spark", "--stream", *[a for q in QUERIES for a in ("-q", q)], "-i", source, "-o", str(out),
            "--idle-stop", "4", *extra]


def run_bounded(spark, args: list[str], seconds: float = 600) -> int:
    """``yfpp`` in this thread (the active session is per thread); a timer stops a stream that never stops."""
    timer = threading.Timer(seconds, lambda: [q.stop() for q in spark.streams.active])
    timer.start()
    try:
        return main(args)
    finally:
        timer.cancel()


def test_yfpp_spark_stream_from_tcp_equals_yfpp_run(spark, tmp_path, capsys):
    lines = feed_lines(400, seed=3)
    (tmp_path / "feed.jsonl").write_bytes(b"".join(lines))
    want = run_lines(tmp_path / "feed.jsonl", capsys)
    assert sum(want.values()) > 20
    chunks = [b"".join(lines[i:i + 150]) for i in range(0, len(lines), 150)]
    producer = Producer(chunks, pause=1.0)  # several micro-batches
    try:
        assert run_bounded(spark, stream_args(f"tcp://127.0.0.1:{producer.port}", tmp_path / "out")) == 0
    finally:
        producer.close()
    assert spark_lines(tmp_path / "out") == want
    assert not spark.streams.active



def test_a_skewed_tcp_stream_cuts_its_hot_key_into_slices_and_is_yfpp_run(spark, tmp_path, capsys):
    """Tag H in half the events of a TCP feed sent in three parts (several micro-batches): the stager decides
    from the first micro-batch that H is hot (``hot.json``), its events go to time slices' state keys, and
    the matches of the three keyed queries are ``yfpp run``'s."""
    path = skewed_feed(tmp_path / "feed.jsonl", 3000, seed=4)
    lines = path.read_bytes().splitlines(keepends=True)
    lines.append(json.dumps({"type": "heartbeat", "ts": 10**6, "tag_id": "beat"}).encode() + b"\n")  # closes the windows
    path.write_bytes(b"".join(lines))
    queries = [a for q in SHOP.values() for a in ("-q", q)]
    assert main(["run", *queries, "-i", str(path)]) == 0
    want = Counter(capsys.readouterr().out.splitlines())
    assert sum(want.values()) > 500
    producer = Producer([b"".join(lines[i:i + 1000]) for i in range(0, len(lines), 1000)], pause=1.0)
    out, ck = tmp_path / "out", tmp_path / "ck"
    try:
        assert run_bounded(spark, ["spark", "--stream", *queries, "-i", f"tcp://127.0.0.1:{producer.port}",
                                   "-o", str(out), "--checkpoint", str(ck), "--idle-stop", "4"]) == 0
    finally:
        producer.close()
    assert spark_lines(out) == want
    (keys,) = json.loads((ck / "hot.json").read_text())["groups"].values()  # one keyed group, H its one hot key
    assert len(keys) == 1
    assert not spark.streams.active

@needs_broker
def test_yfpp_spark_stream_from_mqtt_equals_yfpp_run_across_a_restart(spark, tmp_path, capsys):
    """A persistent session (QoS 1): the messages published before each run — also while no stream
    ran — are matched once, as ``yfpp run`` matches the file of them all."""
    lines = feed_lines(400, seed=5)
    (tmp_path / "feed.jsonl").write_bytes(b"".join(lines))
    want = run_lines(tmp_path / "feed.jsonl", capsys)
    broker = Mosquitto(tmp_path).start()
    url = f"mqtt://127.0.0.1:{broker.port}/rfid?qos=1&client_id=yfpp-spark&clean=0"
    try:
        session = paho.Client(paho.CallbackAPIVersion.VERSION2, client_id="yfpp-spark", clean_session=False,
                              protocol=paho.MQTTv311)  # the stream's session, made before it first runs
        subscribed = threading.Event()
        session.on_subscribe = lambda *a: subscribed.set()
        session.connect("127.0.0.1", broker.port)
        session.loop_start()
        session.subscribe("rfid", 1)
        assert subscribed.wait(TIMEOUT)
        session.loop_stop()
        session.disconnect()
        pub = paho.Client(paho.CallbackAPIVersion.VERSION2, protocol=paho.MQTTv311)
        pub.connect("127.0.0.1", broker.port)
        pub.loop_start()
        messages = [b"".join(lines[i:i + 20]) for i in range(0, len(lines), 20)]
        half = len(messages) // 2
        for m in messages[:half]:
            pub.publish("rfid", m, 1).wait_for_publish(TIMEOUT)
        out = tmp_path / "out"
        assert run_bounded(spark, stream_args(url, out)) == 0
        first = spark_lines(out)
        for m in messages[half:]:  # no stream running: the broker keeps them for the session
            pub.publish("rfid", m, 1).wait_for_publish(TIMEOUT)
        assert run_bounded(spark, stream_args(url, out)) == 0  # restarted from OUTDIR/_checkpoint
        pub.loop_stop()
        pub.disconnect()
    finally:
        broker.stop()
    assert 0 < sum(first.values()) < sum(want.values())
    assert spark_lines(out) == want


@pytest.mark.parametrize(("args", "message"), [
    (["-i", "tcp://127.0.0.1:9"], "-i tcp://127.0.0.1:9 is a live source: read it with --stream (and no --socket)"),
    (["--stream", "-i", "tcp://producer"], "a TCP source is tcp://HOST:PORT (a port from 1 to 65535), not 'tcp://producer'"),
    (["--stream", "-i", "mqtt://127.0.0.1:1883"], "'mqtt://127.0.0.1:1883' names no topic: mqtt://HOST:PORT/TOPIC"),
    (["--stream", "-i", "mqtt://127.0.0.1/a/#/b"], "'#' only as the last level"),
    (["--stream", "-i", "mqtt://127.0.0.1/a?qos=2"], "qos must be 0 or 1"),
])
def test_a_live_source_s_url_is_checked_before_any_jvm_starts(tmp_path, capsys, args, message):
    assert main(["spark", "-q", QUERIES[0], *args, "-o", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("yfpp: error: ") and message in err and err.count("\n") == 1, err


def test_kafka_is_spark_s_own_source_and_its_missing_package_is_named(spark, tmp_path, capsys):
    """``--stream -i kafka://…`` passes through to Spark's Kafka source, which is not installed here."""
    assert main(["spark", "--stream", "-q", QUERIES[0], "-i", "kafka://127.0.0.1:9092/rfid", "-o", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("yfpp: error: data source 'kafka' not found") and err.count("\n") == 1, err
    assert "--conf spark.jars.packages=org.apache.spark:spark-sql-kafka-0-10_2.13:" in err
    assert not spark.streams.active


def test_a_tcp_stream_that_fails_after_writing_a_batch_repeats_nothing_on_restart(spark, tmp_path, capsys, monkeypatch):
    """Failed after micro-batch N's outputs were written, before its commit: the restarted stream reads
    batch N again from the spool (the producer has nothing more), rewrites the same outputs, and goes on."""
    from tests.spark.test_spark import kill_once
    from yfpp.spark import stream
    from yfpp.spark.cli import load

    queries = load(QUERIES)  # named as the command names them (q, q2)
    lines = feed_lines(300, seed=4)
    (tmp_path / "feed.jsonl").write_bytes(b"".join(lines))
    want = run_lines(tmp_path / "feed.jsonl", capsys)
    producer = Producer([b"".join(lines)])  # (all before the failure: what TCP sent to a dead reader is lost)
    url, out, ck = f"tcp://127.0.0.1:{producer.port}", tmp_path / "out", tmp_path / "ck"
    try:
        with monkeypatch.context() as m:
            kill_once(m, stream, "write_batch", True, lambda df, outdir, batch_id: df.count() > 0)
            with pytest.raises(Exception, match="Killed: killed"):
                stream.finish(stream.start_stream(spark, queries, str(out), str(ck), path=url))
        assert not spark.streams.active
        stream.finish(stream.start_stream(spark, queries, str(out), str(ck), path=url))
    finally:
        producer.close()
    assert spark_lines(out) == want


def order_feed(tmp_path: Path, seed: int, capsys) -> tuple[list[str], list[str], Counter]:
    """The feed of :func:`tests.spark.test_spark_stream_order.feed_files` (late events, malformed lines) as
    one file, ``tmp_path/all.jsonl``; its queries' arguments; ``yfpp run``'s match lines over it (its dead
    letters in ``tmp_path/dead.jsonl``)."""
    from tests.spark.test_spark_stream_order import QUERIES as ORDER_QUERIES
    from tests.spark.test_spark_stream_order import feed_files

    lines = feed_files(tmp_path / "inbox", seed=seed, files=2)
    (tmp_path / "all.jsonl").write_text("".join(ln + "\n" for ln in lines))
    queries = [a for q in ORDER_QUERIES for a in ("-q", q)]
    assert main(["run", *queries, "-i", str(tmp_path / "all.jsonl"), "--dead-letters", str(tmp_path / "dead.jsonl")]) == 0
    return lines, queries, Counter(capsys.readouterr().out.splitlines())


def test_a_tcp_stream_is_parsed_on_the_executors_and_is_yfpp_run_across_a_producer_restart(spark, tmp_path, capsys):
    """The producer (a process) is killed by PID once the first half of the feed is spooled and started again
    on the same port with the second half: the source connects again, and the stream's matches and dead
    letters (late events, malformed lines, with their seq and positions) are ``yfpp run``'s over the whole
    feed. ``--stats``: the receiver's job and the ingest query's stages — reading the spooled chunks and
    parsing them — ran as tasks on the executors."""
    from tests.spark.test_spark_live_spool import start_producer

    lines, queries, want = order_feed(tmp_path, 7, capsys)
    whole = tmp_path / "all.jsonl"
    dead = [json.loads(ln) for ln in (tmp_path / "dead.jsonl").read_text().splitlines()]
    assert want and any("late" in d["reason"] for d in dead) and any(d["reason"].startswith("bad") for d in dead)
    half = "".join(ln + "\n" for ln in lines[:len(lines) // 2]).encode()
    rest = whole.read_bytes()[len(half):]
    proc, port = start_producer(0, half, tmp_path / "first")
    out = tmp_path / "out"
    spool = out / "_checkpoint" / "live" / "spool"

    def restart() -> None:  # once the first half is spooled: kill the producer, start it again with the rest
        nonlocal proc
        deadline = time.monotonic() + ACCEPT_TIMEOUT
        while time.monotonic() < deadline and sum(f.stat().st_size for f in spool.glob("*")) < len(half):
            time.sleep(0.1)
        proc.kill()
        proc.wait(TIMEOUT)
        proc, _ = start_producer(port, rest, tmp_path / "second")

    restarter = threading.Thread(target=restart, daemon=True)
    restarter.start()
    try:
        assert run_bounded(spark, ["spark", "--stream", "--stats", *queries, "-i", f"tcp://127.0.0.1:{port}",
                                   "-o", str(out), "--idle-stop", "15"]) == 0
    finally:
        restarter.join(TIMEOUT)
        proc.kill()
        proc.wait(TIMEOUT)
    err = capsys.readouterr().err
    assert spark_lines(out) == want
    got = [json.loads(ln) for f in sorted(out.glob("dead_letters.jsonl/batch=*/part-*")) for ln in f.read_text().splitlines()]
    key = lambda d: (d["seq"], d["position"], d["reason"], d["raw"])  # noqa: E731
    assert sorted(map(key, got)) == sorted(map(key, dead))
    for name, then in (("receiver", "ingest"), ("ingest", "match")):  # the receiver's job, the ingest query's
        stages = err[err.index(f" {name}:"):err.index(f" {then}:")]
        rows = [ln.split() for ln in stages.splitlines() if re.match(r"\s+\d+\s+\d+\s", ln)]
        assert rows and all("driver" not in r[2].split(",") for r in rows), stages


def spooled_records(query) -> int:
    """The records of a live stream's last micro-batch's end offset (0 before the first)."""
    progress = query.lastProgress
    end = progress and progress["sources"][0]["endOffset"]
    return (json.loads(end) if isinstance(end, str) else end or {"records": 0})["records"]


def test_spark_commits_trim_the_spool_of_a_live_stream(spark, tmp_path):
    """Through Spark: once micro-batches are committed their spool segments are gone (small segments here),
    and every line was staged once. The test sends the next piece of the feed once Spark took the last."""
    from yfpp.spark.live_sources import start_live
    from yfpp.spark.stream import finish

    lines = feed_lines(300, seed=6)
    pieces = [lines[i:i + 50] for i in range(0, len(lines), 50)]
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(ACCEPT_TIMEOUT)
    ck = tmp_path / "ck"
    query, _ = start_live(spark, f"tcp://127.0.0.1:{server.getsockname()[1]}", str(ck), {"segment_bytes": "2000"})
    try:
        conn, _ = server.accept()
        with conn:
            sent = 0
            for piece in pieces:
                conn.sendall(b"".join(piece))
                sent += len(piece)
                deadline = time.monotonic() + ACCEPT_TIMEOUT
                while spooled_records(query) < sent and time.monotonic() < deadline:
                    time.sleep(0.2)
            finish([query])
    finally:
        server.close()
        query.stop()
    fed = sum(map(len, lines))
    spooled = sorted((ck / "live" / "spool").iterdir())
    first = int(spooled[0].name.split("-")[0])  # the committed micro-batches' segments are gone
    assert first > fed // 2 and sum(f.stat().st_size for f in spooled) < fed // 2, [f.name for f in spooled]
    rows = spark.read.option("recursiveFileLookup", "true").parquet(str(ck / "staged")).select("seq").collect()
    assert sorted(r.seq for r in rows) == list(range(len(lines)))


def test_the_stager_numbers_mqtt_events_only_and_gives_their_dead_letters_seq_minus_one(spark, tmp_path):
    """An MQTT feed's rows as the executors parse them (two micro-batches), staged: events numbered 0, 1, …
    across messages and batches, late ones flagged, a malformed message's dead letter at seq -1 with its
    message's position — as ``yfpp run -i mqtt://`` reports them."""
    import pyarrow as pa

    from yfpp.spark.live_parse import frame
    from yfpp.spark.live_sources import LiveStager
    from yfpp.spark.parse import PARSED_SCHEMA

    folder = str(tmp_path / "spool")
    spool = Spool(folder)
    reader = _MqttReader({"url": "mqtt://127.0.0.1/t", "spool": folder})
    batches = [[b'{"type": "a", "ts": 5}\n{"type": "b", "ts": 6}', b"oops", b'{"type": "c", "ts": 4}'],
               [b'[{"type": "d", "ts": 7}, 1]', b'{"type": "e", "ts": 8}']]
    stager = LiveStager(spark, "mqtt://127.0.0.1/t", str(tmp_path / "ck"), single=True)
    start = reader.initialOffset()
    for batch_id, messages in enumerate(batches):
        for m in messages:
            spool.append(frame("t", m), 1, 0)
        end = reader.latestOffset()
        table = pa.Table.from_batches([b for c in reader.partitions(start, end) for b in reader.read(c)])
        stager(spark.createDataFrame(table.to_pandas(), PARSED_SCHEMA), batch_id)
        start = end
    spool.close()
    staged = spark.read.option("recursiveFileLookup", "true").parquet(str(tmp_path / "ck" / "staged")).collect()
    got = sorted((r.seq, r.type, r.position, (r.reason or "").split(":")[0]) for r in staged)
    assert got == [
        (-1, None, "mqtt t message 2", "neither XML nor JSON"),
        (-1, None, "mqtt t message 4 line 2", "not an object"),
        (0, "a", None, ""), (1, "b", None, ""), (2, "c", "seq 2", "late event"), (3, "d", None, ""), (4, "e", None, "")]
