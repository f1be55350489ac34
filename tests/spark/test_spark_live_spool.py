"""The live sources' spool, receiver and planning half (``yfpp.spark.live_spool``, ``live_receiver``,
``live_sources``), without a JVM: the receiver publishes its durable end and record-aligned marks, the planner
cuts a micro-batch into chunks at those marks without reading the bytes, segments are deleted once Spark
commits what they hold, a receiver started again drops what lies past the published end, and a TCP producer
killed and started again, by PID, on loopback — nothing published is lost or spooled twice."""

from __future__ import annotations

import json
import os
import pickle
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("pyspark", reason="pyspark is not installed (pip install '.[spark]')")

from yfpp.errors import InputError  # noqa: E402
from yfpp.spark import live_receiver, live_sources, live_spool  # noqa: E402
from yfpp.spark.live_parse import frame  # noqa: E402
from yfpp.spark.live_receiver import Feed, TcpReceiver, receive  # noqa: E402
from yfpp.spark.live_sources import _MqttReader, _TcpReader  # noqa: E402
from yfpp.spark.live_spool import Mark, Spool, cuts, read_published, spooled  # noqa: E402

TIMEOUT = 30.0

#: A producer process: listens on PORT, sends FILE's bytes to its first connection, then keeps it open.
PRODUCER = """
import socket, sys, time
server = socket.create_server(("127.0.0.1", int(sys.argv[1])))
print(server.getsockname()[1], flush=True)
conn, _ = server.accept()
conn.sendall(open(sys.argv[2], "rb").read())
time.sleep(600)
"""


def lines(start: int, n: int) -> bytes:
    return b"".join(json.dumps({"type": "a", "ts": i, "n": i}).encode() + b"\n" for i in range(start, start + n))


def test_the_planner_cuts_chunks_at_the_published_marks_only(tmp_path, monkeypatch):
    """Marks about MARK_BYTES apart (inside an append too); chunks of at most CHUNK_BYTES between them, a record
    longer than a chunk its own; the bytes read by the executors, dead letters' lines those of the whole feed."""
    monkeypatch.setattr(live_spool, "MARK_BYTES", 40)
    monkeypatch.setattr(live_sources, "CHUNK_BYTES", 100)
    folder = str(tmp_path / "spool")
    spool = Spool(folder)
    head = lines(0, 10)
    spool.append(head, 10, 0, live_spool.line_marks(head, 40))  # one append, marks inside it
    tail = b"x" * 150 + b"\n" + b"not json\n"  # a line longer than a chunk, then a dead letter
    spool.append(tail[:151], 1, 0)
    spool.append(tail[151:], 1, 0)
    published = read_published(folder)
    data = head + tail
    assert published.end == Mark(len(data), 12) and len(published.marks) > 3
    assert all(data[m.pos - 1:m.pos] == b"\n" and data[:m.pos].count(b"\n") == m.records for m in published.marks)
    reader = _TcpReader({"url": "tcp://127.0.0.1:9", "spool": folder})
    assert reader.latestOffset() == {"pos": len(data), "records": 12}
    chunks = reader.partitions(reader.initialOffset(), reader.latestOffset())
    assert [c.block for c in chunks[1:]] == [c.end for c in chunks[:-1]] and chunks[-1].end == len(data)
    assert {c.end for c in chunks[:-1]} <= {m.pos for m in published.marks}
    assert max(c.end - c.block for c in chunks) == 151 and len(chunks) > 3
    assert [c.before for c in chunks] == [data[:c.block].count(b"\n") for c in chunks]
    worker = pickle.loads(pickle.dumps(reader))
    rows = [r for c in chunks for b in worker.read(c) for r in b.to_pylist()]
    assert sorted(r["line"] for r in rows if r["reason"]) == [11, 12]  # lines of the whole feed
    assert sum(r["n"] for r in rows if r["n"] is not None) == 12
    spool.close()


def test_cuts_end_at_marks_within_the_chunk_size_or_at_the_next_one():
    marks = [Mark(p, p // 10) for p in (30, 60, 90, 200, 230)]
    got = cuts(Mark(0, 0), Mark(260, 26), marks, 100)
    assert [(a.pos, b.pos) for a, b in got] == [(0, 90), (90, 200), (200, 260)]
    assert cuts(Mark(60, 6), Mark(90, 9), marks, 100) == [(Mark(60, 6), Mark(90, 9))]  # a replanned batch
    assert cuts(Mark(5, 1), Mark(5, 1), marks, 100) == []


def test_mqtt_frames_are_cut_whole_and_numbered_as_messages(tmp_path, monkeypatch):
    monkeypatch.setattr(live_spool, "MARK_BYTES", 1)
    monkeypatch.setattr(live_sources, "CHUNK_BYTES", 64)
    folder = str(tmp_path / "spool")
    spool = Spool(folder)
    messages = [frame("t", json.dumps({"type": "a", "ts": i}).encode()) for i in range(6)]
    messages[2] = frame("t", json.dumps({"type": "a", "ts": 2, "pad": "x" * 100}).encode())  # larger than a chunk
    messages.append(frame("t", b"oops"))
    for m in messages:
        spool.append(m, 1, 0)
    reader = _MqttReader({"url": "mqtt://127.0.0.1/t", "spool": folder})
    chunks = reader.partitions(reader.initialOffset(), reader.latestOffset())
    ends = [sum(map(len, messages[:i + 1])) for i in range(len(messages))]
    assert len(chunks) > 1 and all(c.end in ends for c in chunks)
    assert [c.before for c in chunks] == [ends.index(c.block) + 1 if c.block else 0 for c in chunks]
    rows = [r for c in chunks for b in reader.read(c) for r in b.to_pylist()]
    (dead,) = [r for r in rows if r["reason"]]
    assert dead["position"] == "mqtt t message 7" and dead["pos"] is None
    spool.close()


def test_the_spool_is_trimmed_to_what_spark_has_not_committed(tmp_path, monkeypatch):
    monkeypatch.setattr(live_spool, "MARK_BYTES", 1)
    folder = str(tmp_path / "spool")
    spool = Spool(folder, segment_bytes=100)
    offsets = [{"pos": 0, "records": 0}]
    for i in range(20):
        spool.append(lines(i, 1), 1, 0)
        offsets.append(read_published(folder).end._asdict())
    whole = lines(0, 20)
    assert spooled(folder, 0, len(whole)) == whole and len(live_spool.segments(folder)) == 5
    reader = _TcpReader({"url": "tcp://127.0.0.1:9", "spool": folder})
    reader.commit(offsets[12])  # Spark committed the micro-batches up to record 12
    first = live_spool.segments(folder)[0][0]
    assert 0 < first <= offsets[12]["pos"] and first > offsets[12]["pos"] - 100 - len(lines(0, 1))  # < one segment
    assert live_spool.read_committed(folder) == offsets[12]["pos"]  # for the receiver's cap
    assert spooled(folder, offsets[12]["pos"], len(whole)) == whole[offsets[12]["pos"]:]  # what is left to read
    with pytest.raises(InputError, match="lacks bytes 0 to"):
        spooled(folder, 0, len(whole))
    spool.append(lines(20, 1), 1, offsets[12]["pos"])
    assert min(m.pos for m in read_published(folder).marks) > offsets[12]["pos"]  # marks before it: not needed
    reader.commit(reader.latestOffset())
    assert len(live_spool.segments(folder)) == 1  # the segment being appended to is kept
    spool.close()
    again = Spool(folder, segment_bytes=100)  # a receiver started again over the trimmed spool
    assert again.end == Mark(len(lines(0, 21)), 21)
    again.append(lines(21, 1), 1, 0)
    assert spooled(folder, len(lines(0, 21)), again.size) == lines(21, 1)
    again.close()


def test_a_receiver_started_again_drops_what_lies_past_the_published_end(tmp_path, monkeypatch):
    """A receiver that died between an append and its publication (a cut write, a segment just started): the
    next one opens at the published end; the planner never saw past it."""
    monkeypatch.setattr(live_spool, "MARK_BYTES", 1)
    folder = str(tmp_path / "spool")
    spool = Spool(folder, segment_bytes=100)
    for i in range(6):
        spool.append(lines(i, 1), 1, 0)
    end = read_published(folder).end
    spool.close()
    segs = live_spool.segments(folder)
    with open(live_spool.segment_path(folder, *segs[-1]), "ab") as f:
        f.write(lines(6, 1) + b'{"type": "cut')  # appended, not published
    Path(live_spool.segment_path(folder, end.pos + 500, 99)).write_bytes(lines(7, 3))  # a segment never published
    marks = read_published(folder).marks
    live_spool.write_atomically(str(Path(folder) / live_spool.MARKS),
                                json.dumps([*map(list, marks), [end.pos + 7, 7]]))  # a mark its end never passed
    again = Spool(folder, segment_bytes=100)
    assert again.end == end and live_spool.segments(folder) == segs and read_published(folder).marks == marks
    again.append(lines(6, 1), 1, 0)
    assert spooled(folder, 0, again.size) == lines(0, 7)
    again.close()


def test_a_spool_made_by_a_driver_receiver_is_refused(tmp_path):
    folder = tmp_path / "spool"
    folder.mkdir()
    Path(live_spool.segment_path(str(folder), 0, 0)).write_bytes(lines(0, 2))  # segments, nothing published
    with pytest.raises(InputError, match="received live sources on the driver; start this stream with a fresh"):
        Spool(str(folder))


def start_producer(port: int, data: bytes, path: Path) -> tuple[subprocess.Popen, int]:
    path.write_bytes(data)
    proc = subprocess.Popen([sys.executable, "-c", PRODUCER, str(port), str(path)], stdout=subprocess.PIPE, text=True)
    return proc, int(proc.stdout.readline())


@contextmanager
def receiving(feed: Feed) -> Iterator[threading.Thread]:
    """The receiver task of ``feed`` (:func:`yfpp.spark.live_receiver.receive`) in a thread, as an executor
    runs it; ended by its ``stop`` file (bounded)."""
    stop = os.path.join(feed.folder, live_spool.STOP)
    if os.path.exists(stop):
        os.remove(stop)
    thread = threading.Thread(target=receive, args=(feed,), daemon=True)
    thread.start()
    try:
        yield thread
    finally:
        Path(stop).touch()
        thread.join(TIMEOUT)
        assert not thread.is_alive()


def wait_records(reader: _TcpReader, want: int) -> dict:
    """The published end once it holds ``want`` records (bounded)."""
    deadline = time.monotonic() + TIMEOUT
    offset = reader.latestOffset()
    while offset["records"] < want and time.monotonic() < deadline:
        time.sleep(0.05)
        offset = reader.latestOffset()
    return offset


def test_a_tcp_receiver_connects_again_when_its_producer_is_killed_and_restarted(tmp_path):
    first, second = lines(0, 300), lines(300, 200)
    proc, port = start_producer(0, first, tmp_path / "first")
    folder = str(tmp_path / "spool")
    feed = Feed(f"tcp://127.0.0.1:{port}", folder)
    reader = _TcpReader({"url": feed.url, "spool": folder})
    receiver = TcpReceiver(feed, Spool(folder))
    try:
        receiver.connect()
        deadline = time.monotonic() + TIMEOUT
        while receiver.spool.end.records < 300 and time.monotonic() < deadline:
            receiver.step()
        assert reader.latestOffset()["records"] == 300
        os.kill(proc.pid, signal.SIGKILL)  # the feed drops
        proc.wait(TIMEOUT)
        for _ in range(20):
            receiver.step()  # refused: retried later, no error
        assert reader.latestOffset()["records"] == 300 and receiver.backoff > live_receiver.BACKOFF
        proc, _ = start_producer(port, second, tmp_path / "second")  # the same port again
        started = time.monotonic()
        while receiver.spool.end.records < 500 and time.monotonic() < started + TIMEOUT:
            receiver.step()
        assert reader.latestOffset() == {"pos": len(first) + len(second), "records": 500}
        assert time.monotonic() - started < live_receiver.MAX_BACKOFF + 5  # the backoff is bounded
        assert spooled(folder, 0, len(first) + len(second)) == first + second  # none lost, none twice
    finally:
        proc.kill()
        proc.wait(TIMEOUT)
        receiver.close()
        receiver.spool.close()


def test_the_first_connection_s_failure_is_one_error_the_planner_raises(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens on it once closed
    folder = str(tmp_path / "spool")
    receive(Feed(f"tcp://127.0.0.1:{port}", folder))  # the task ends at once
    reader = _TcpReader({"url": f"tcp://127.0.0.1:{port}", "spool": folder})
    with pytest.raises(InputError, match=f"^cannot connect to 127.0.0.1:{port}: Connection refused$"):
        reader.latestOffset()


def test_a_tcp_receiver_stops_reading_while_its_spool_holds_too_much_uncommitted(tmp_path):
    feed = lines(0, 2000)
    proc, port = start_producer(0, feed, tmp_path / "feed")
    folder = str(tmp_path / "spool")
    reader = _TcpReader({"url": f"tcp://127.0.0.1:{port}", "spool": folder})
    try:
        with receiving(Feed(f"tcp://127.0.0.1:{port}", folder, max_spool=10000)):
            offset = wait_records(reader, 1)
            time.sleep(0.5)
            offset = reader.latestOffset()
            assert 9000 < offset["pos"] <= 10000  # full: the rest waits in the kernel, then the producer
            first, end = offset, offset
            deadline = time.monotonic() + TIMEOUT
            while end["records"] < 2000 and time.monotonic() < deadline:
                reader.commit(end)  # Spark committed what was spooled: reading goes on
                time.sleep(0.05)
                end = reader.latestOffset()
        assert spooled(folder, first["pos"], end["pos"]) == feed[first["pos"]:]
    finally:
        proc.kill()
        proc.wait(TIMEOUT)


def test_the_receiver_task_ends_at_its_stop_file_and_one_holds_the_spool_at_a_time(tmp_path):
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(TIMEOUT)
    folder = str(tmp_path / "spool")
    feed = Feed(f"tcp://127.0.0.1:{server.getsockname()[1]}", folder)
    reader = _TcpReader({"url": feed.url, "spool": folder})
    try:
        with receiving(feed):
            conn, _ = server.accept()
            with receiving(feed) as second:  # a duplicate task: waits for the lock, connects to nothing
                conn.sendall(lines(0, 5))
                assert wait_records(reader, 5)["records"] == 5
                assert second.is_alive()
                server.settimeout(1)
                with pytest.raises(TimeoutError):
                    server.accept()
            conn.close()
    finally:
        server.close()
    assert read_published(folder).end == Mark(len(lines(0, 5)), 5)


def test_a_checkpoint_whose_spool_is_one_file_is_refused_by_name(tmp_path):
    """Made by a yfpp that read live sources on the driver (its offsets carried seq numbers): one line."""
    (tmp_path / "ck" / "live").mkdir(parents=True)
    (tmp_path / "ck" / "live" / "spool").write_bytes(b'{"type": "a", "ts": 1}\n')
    with pytest.raises(InputError, match="read live sources on the driver; start this stream with a fresh checkpoint"):
        live_sources.start_live(None, "tcp://127.0.0.1:9", str(tmp_path / "ck"), {})


def test_a_spool_the_executors_cannot_share_and_a_stream_of_one_core_are_refused(tmp_path):
    with pytest.raises(InputError, match="must be a folder the driver and the executors share, mounted at the same path"):
        live_sources.start_live(None, "tcp://127.0.0.1:9", "hdfs://nn/ck", {})
    one_core = SimpleNamespace(sparkContext=SimpleNamespace(defaultParallelism=1))
    with pytest.raises(InputError, match="receiver holds one executor core for the stream's life, and the stream has 1"):
        live_sources.start_live(one_core, "tcp://127.0.0.1:9", str(tmp_path / "ck"), {})


@settings(max_examples=60, deadline=None)
@given(appends=st.lists(st.lists(st.integers(0, 60), min_size=1, max_size=8), min_size=1, max_size=12),
       mark_bytes=st.integers(1, 200), chunk_bytes=st.integers(1, 300), data=st.data())
def test_chunks_planned_from_published_marks_are_the_range_cut_at_line_ends(appends, mark_bytes, chunk_bytes, data):
    """Any appends of whole lines, any spacing of marks and chunk size: the chunks of a range between two
    published ends are that range, contiguous, each ending at a line end with the lines before it counted;
    a chunk longer than ``chunk_bytes`` has no mark inside it; marks are ``mark_bytes`` apart or more."""
    with tempfile.TemporaryDirectory() as folder:
        with pytest.MonkeyPatch.context() as m:
            m.setattr(live_spool, "MARK_BYTES", mark_bytes)
            spool = Spool(folder, segment_bytes=97)
            ends, feed = [Mark(0, 0)], b""
            for lengths in appends:
                chunk = b"".join(b"x" * n + b"\n" for n in lengths)
                spool.append(chunk, len(lengths), 0, live_spool.line_marks(chunk, mark_bytes))
                feed += chunk
                ends.append(read_published(folder).end)
            spool.close()
        marks = read_published(folder).marks
        assert all(b.pos - a.pos >= mark_bytes for a, b in zip(marks, marks[1:]))
        i = data.draw(st.integers(0, len(ends) - 1))
        j = data.draw(st.integers(i, len(ends) - 1))
        got = cuts(ends[i], ends[j], marks, chunk_bytes)
        assert [a for a, _ in got[1:]] == [b for _, b in got[:-1]]
        assert (got[0][0], got[-1][1]) == (ends[i], ends[j]) if got else i == j or ends[i] == ends[j]
        for a, b in got:
            assert feed[b.pos - 1:b.pos] == b"\n" and feed[:b.pos].count(b"\n") == b.records
            assert b.pos - a.pos <= chunk_bytes or not any(a.pos < mk.pos < b.pos for mk in marks)
        assert spooled(folder, ends[i].pos, ends[j].pos) == feed[ends[i].pos:ends[j].pos]


def test_the_published_end_is_the_valid_slot_with_the_higher_number(tmp_path):
    """Two slots written in turn: a slot cut by a crash (its CRC wrong) leaves the other, the one before it."""
    folder = str(tmp_path / "spool")
    spool = Spool(folder)
    spool.append(lines(0, 1), 1, 0)
    before = read_published(folder).end
    spool.append(lines(1, 1), 1, 0)
    assert read_published(folder).end == Mark(len(lines(0, 2)), 2)
    number, _ = live_spool.read_end(folder)
    path = Path(folder) / live_spool.PUBLISHED
    raw = bytearray(path.read_bytes())
    raw[number % 2 * live_spool.SLOT.size + 9] ^= 0xFF  # the newer slot's position, torn
    path.write_bytes(bytes(raw))
    assert read_published(folder).end == before
    spool.close()


class FailingContext:
    """A SparkContext stand-in whose receiver jobs fail ``failures`` times (an executor lost), then run."""

    def __init__(self, failures: int):
        self.failures, self.jobs, self.groups = failures, 0, []

    def setJobGroup(self, group: str, description: str, interruptOnCancel: bool = False) -> None:
        self.groups.append(group)

    def parallelize(self, data: list, slices: int) -> FailingContext:
        return self

    def mapPartitions(self, task) -> FailingContext:
        self.task = task
        return self

    def collect(self) -> list:
        self.jobs += 1
        if self.jobs <= self.failures:
            raise RuntimeError(f"Job aborted: executor {self.jobs} lost")
        return list(self.task(iter([0])))


@pytest.mark.parametrize("failures", [2, live_receiver.RESTARTS + 1])
def test_a_failed_receiver_job_is_submitted_again_a_bounded_number_of_times(tmp_path, monkeypatch, failures):
    """Where Spark does not retry the task (``spark.task.maxFailures`` 1), the driver thread submits the job
    again; after RESTARTS more failures the stream fails with one line naming the last."""
    monkeypatch.setattr(live_receiver, "MAX_BACKOFF", 0.01)
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(TIMEOUT)
    folder = str(tmp_path / "spool")
    feed = Feed(f"tcp://127.0.0.1:{server.getsockname()[1]}", folder)
    context = FailingContext(failures)
    job = live_receiver.ReceiverJob(SimpleNamespace(sparkContext=context), feed)
    query = SimpleNamespace(id="q-1", isActive=True)
    job.start(query)
    reader = _TcpReader({"url": feed.url, "spool": folder})
    try:
        if failures > live_receiver.RESTARTS:
            job.thread.join(TIMEOUT)
            assert context.jobs == live_receiver.RESTARTS + 1
            with pytest.raises(InputError, match=f"^the receiver of {feed.url} failed 11 times; the last: Job aborted: "
                                                 "executor 11 lost$"):
                reader.latestOffset()
            return
        conn, _ = server.accept()  # the third job's receiver
        conn.sendall(lines(0, 3))
        assert wait_records(reader, 3)["records"] == 3 and context.jobs == 3
        assert live_receiver.receiver_of(query) is job and set(context.groups) == {job.group}
    finally:
        query.isActive = False  # the ingest query ended: its watcher stops the receiver
        job.thread.join(TIMEOUT)
        server.close()
    assert not job.thread.is_alive()
    deadline = time.monotonic() + TIMEOUT
    while any(n.startswith("stop") for n in os.listdir(folder)):  # its stop file, removed once it ended
        assert time.monotonic() < deadline
        time.sleep(0.05)
