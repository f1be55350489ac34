"""The live sources' spool and TCP reconnects (``yfpp.spark.live_sources``), without a JVM: a micro-batch cut
into chunks at record boundaries, segments deleted once Spark commits what they hold, and a TCP producer
killed and started again, by PID, on loopback — nothing spooled is lost or spooled twice."""

from __future__ import annotations

import json
import os
import pickle
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("pyspark", reason="pyspark is not installed (pip install '.[spark]')")

from yfpp.errors import InputError  # noqa: E402
from yfpp.spark import live_sources  # noqa: E402
from yfpp.spark.live_parse import frame, frame_ends  # noqa: E402
from yfpp.spark.live_sources import (  # noqa: E402
    Spool,
    _MqttReader,
    _TcpReader,
    spooled,
    whole_frames,
    whole_lines,
)

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


def test_a_micro_batch_is_cut_into_chunks_of_whole_records(tmp_path, monkeypatch):
    monkeypatch.setattr(live_sources, "CHUNK_BYTES", 100)
    spool = Spool(str(tmp_path / "spool"), whole_lines)
    data = lines(0, 10) + b"x" * 150 + b"\n" + b"not json\n"  # a line longer than a chunk, then a dead letter
    spool.append(data, 12)
    reader = _TcpReader({"url": "tcp://127.0.0.1:9", "spool": str(tmp_path / "spool")})
    chunks = reader.partitions(reader.initialOffset(), spool.offset())
    assert b"".join(c.data for c in chunks) == data and len(chunks) > 3
    assert all(c.data.endswith(b"\n") for c in chunks) and max(len(c.data) for c in chunks) == 151
    assert [c.block for c in chunks] == [sum(len(d.data) for d in chunks[:i]) for i in range(len(chunks))]
    assert [c.before for c in chunks] == [sum(d.data.count(b"\n") for d in chunks[:i]) for i in range(len(chunks))]
    worker = pickle.loads(pickle.dumps(reader))
    rows = [r for c in chunks for b in worker.read(c) for r in b.to_pylist()]
    assert sorted(r["line"] for r in rows if r["reason"]) == [11, 12]  # lines of the whole feed
    assert sum(r["n"] for r in rows if r["n"] is not None) == 12
    spool.close()


def test_mqtt_frames_are_cut_whole_and_numbered_as_messages(tmp_path, monkeypatch):
    monkeypatch.setattr(live_sources, "CHUNK_BYTES", 64)
    spool = Spool(str(tmp_path / "spool"), whole_frames)
    messages = [frame("t", json.dumps({"type": "a", "ts": i}).encode()) for i in range(6)]
    messages[2] = frame("t", json.dumps({"type": "a", "ts": 2, "pad": "x" * 100}).encode())  # larger than a chunk
    messages.append(frame("t", b"oops"))
    for m in messages:
        spool.append(m, 1)
    reader = _MqttReader({"url": "mqtt://127.0.0.1/t", "spool": str(tmp_path / "spool")})
    chunks = reader.partitions(reader.initialOffset(), spool.offset())
    assert b"".join(c.data for c in chunks) == b"".join(messages) and len(chunks) > 1
    assert [c.before for c in chunks] == [len(frame_ends(b"".join(d.data for d in chunks[:i]))) for i in range(len(chunks))]
    rows = [r for c in chunks for b in reader.read(c) for r in b.to_pylist()]
    (dead,) = [r for r in rows if r["reason"]]
    assert dead["position"] == "mqtt t message 7" and dead["pos"] is None
    spool.close()


def test_the_spool_is_trimmed_to_what_spark_has_not_committed(tmp_path):
    folder = str(tmp_path / "spool")
    spool = Spool(folder, whole_lines, segment_bytes=100)
    offsets = [spool.offset()]
    for i in range(20):
        spool.append(lines(i, 1), 1)
        offsets.append(spool.offset())
    whole = lines(0, 20)
    assert spooled(folder, 0, len(whole)) == whole and len(os.listdir(folder)) == 5
    reader = _TcpReader({"url": "tcp://127.0.0.1:9", "spool": folder})
    reader.commit(offsets[12])  # Spark committed the micro-batches up to record 12
    kept = sorted(os.listdir(folder))
    first = int(kept[0].split("-")[0])
    assert 0 < first <= offsets[12]["pos"] and first > offsets[12]["pos"] - 100 - len(lines(0, 1))  # < one segment
    assert spooled(folder, offsets[12]["pos"], len(whole)) == whole[offsets[12]["pos"]:]  # what is left to read
    with pytest.raises(InputError, match="lacks bytes 0 to"):
        spooled(folder, 0, len(whole))
    reader.commit(offsets[20])
    assert len(os.listdir(folder)) == 1  # the segment being appended to is kept
    spool.close()
    again = Spool(folder, whole_lines, segment_bytes=100)  # a restart over the trimmed spool
    assert again.offset() == offsets[20]
    again.append(lines(20, 1), 1)
    assert spooled(folder, offsets[20]["pos"], again.offset()["pos"]) == lines(20, 1)
    again.close()


def start_producer(port: int, data: bytes, path: Path) -> tuple[subprocess.Popen, int]:
    path.write_bytes(data)
    proc = subprocess.Popen([sys.executable, "-c", PRODUCER, str(port), str(path)], stdout=subprocess.PIPE, text=True)
    return proc, int(proc.stdout.readline())


def wait_records(reader: _TcpReader, want: int) -> dict:
    deadline = time.monotonic() + TIMEOUT
    offset = reader.latestOffset()
    while offset["records"] < want and time.monotonic() < deadline:
        time.sleep(0.05)
        offset = reader.latestOffset()
    return offset


def test_a_tcp_source_connects_again_when_its_producer_is_killed_and_restarted(tmp_path):
    first, second = lines(0, 300), lines(300, 200)
    proc, port = start_producer(0, first, tmp_path / "first")
    reader = _TcpReader({"url": f"tcp://127.0.0.1:{port}", "spool": str(tmp_path / "spool")})
    try:
        assert wait_records(reader, 300)["records"] == 300
        os.kill(proc.pid, signal.SIGKILL)  # the feed drops
        proc.wait(TIMEOUT)
        assert reader.latestOffset()["records"] == 300  # nothing more; connecting again fails meanwhile
        for _ in range(3):
            time.sleep(0.3)
            assert reader.latestOffset()["records"] == 300  # refused: retried later, no error
        assert reader.backoff > live_sources.BACKOFF
        proc, _ = start_producer(port, second, tmp_path / "second")  # the same port again
        started = time.monotonic()
        end = wait_records(reader, 500)
        assert end == {"pos": len(first) + len(second), "records": 500}
        assert time.monotonic() - started < live_sources.MAX_BACKOFF + 5  # the backoff is bounded
        assert spooled(str(tmp_path / "spool"), 0, end["pos"]) == first + second  # none lost, none twice
    finally:
        proc.kill()
        proc.wait(TIMEOUT)
        reader.stop()


def test_the_first_connection_s_failure_is_one_error(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens on it once closed
    reader = _TcpReader({"url": f"tcp://127.0.0.1:{port}", "spool": str(tmp_path / "spool")})
    with pytest.raises(InputError, match=f"cannot connect to 127.0.0.1:{port}: Connection refused"):
        reader.latestOffset()


def test_a_tcp_source_stops_reading_while_its_spool_holds_too_much_uncommitted(tmp_path):
    feed = lines(0, 2000)
    proc, port = start_producer(0, feed, tmp_path / "feed")
    reader = _TcpReader({"url": f"tcp://127.0.0.1:{port}", "spool": str(tmp_path / "spool"),
                         "max_spool_bytes": "10000"})
    try:
        offset = reader.latestOffset()
        for _ in range(5):
            time.sleep(0.1)
            offset = reader.latestOffset()
        assert 10000 <= offset["pos"] < 10000 + (1 << 16)  # full: the rest waits in the kernel, then the producer
        first, end = offset, offset
        deadline = time.monotonic() + TIMEOUT
        while end["records"] < 2000 and time.monotonic() < deadline:
            reader.commit(end)  # Spark committed what was spooled: reading goes on
            time.sleep(0.05)
            end = reader.latestOffset()
        assert spooled(str(tmp_path / "spool"), first["pos"], end["pos"]) == feed[first["pos"]:]
    finally:
        proc.kill()
        proc.wait(TIMEOUT)
        reader.stop()


def test_a_checkpoint_whose_spool_is_one_file_is_refused_by_name(tmp_path):
    """Made by a yfpp that read live sources on the driver (its offsets carried seq numbers): one line."""
    (tmp_path / "ck" / "live").mkdir(parents=True)
    (tmp_path / "ck" / "live" / "spool").write_bytes(b'{"type": "a", "ts": 1}\n')
    with pytest.raises(InputError, match="read live sources on the driver; start this stream with a fresh checkpoint"):
        live_sources.start_live(None, "tcp://127.0.0.1:9", str(tmp_path / "ck"), {})
