"""A ``yfpp spark --stream -i tcp://…`` job survives its driver, then the executor running its receiver, killed by PID.

The job runs as a user runs it (``python -m yfpp spark --stream`` in a session of its own, on the
standalone ``local-cluster`` of :mod:`tests.spark.test_spark_stream_kills`). A producer on loopback sends the
first third of a feed (late events, malformed lines) to the first connection; once it is all spooled and a
micro-batch is written, the driver is killed (SIGKILL), and the same command started again on the same
checkpoint connects again and gets the second third. Once that is published, the executor JVM whose Python
worker runs the receiver is killed (SIGKILL), and the receiver started again on an executor connects again and
gets the rest from the first byte the spool lacks. (In this order the restarted driver's ``--stats`` lists the
receiver's job on both executors: a killed driver prints none.) The outputs must be ``yfpp run``'s matches and
dead letters over the whole feed: none lost, none twice. Every process is stopped by its PID; every wait is
bounded.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

pytest.importorskip("pyspark", reason="pyspark is not installed (pip install '.[spark]')")

from tests.spark.test_spark_cli import output  # noqa: E402
from tests.spark.test_spark_live import close_server, order_feed  # noqa: E402
from tests.spark.test_spark_stream_kills import (  # noqa: E402
    CONF,
    MASTER,
    session_of,
    session_processes,
    start_driver,
    wait_for,
)
from tests.spark.test_spark_stream_order import dead_letters  # noqa: E402
from yfpp.spark.live_spool import Mark, Published, read_published  # noqa: E402

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc"), reason="Linux: /proc")

ACCEPT_TIMEOUT = 600.0
EMPTY = Published(Mark(0, 0))  #: the spool before its receiver first published


class Producer:
    """A TCP server on loopback with the feed ``data`` cut at ``cuts``; every connection is kept open. Connection
    k < len(cuts) gets the bytes from cut k - 1 (the start for the first) to cut k: a producer that sends on from
    where it was, never again. Each later one gets the feed from the first byte the spool in ``folder`` lacks (its
    published end: the new receiver has truncated the spool to it before connecting)."""

    def __init__(self, data: bytes, cuts: list[int], folder: Path):
        self.data, self.folder = data, folder
        self.parts = [data[start:end] for start, end in zip([0, *cuts], cuts)]
        self.conns: list[socket.socket] = []
        self.server = socket.create_server(("127.0.0.1", 0))
        self.server.settimeout(ACCEPT_TIMEOUT)
        self.port = self.server.getsockname()[1]
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:  # closed
                return
            conn.sendall(self.part(len(self.conns)))
            self.conns.append(conn)

    def part(self, k: int) -> bytes:
        """What connection ``k`` gets."""
        if k < len(self.parts):
            return self.parts[k]
        published = read_published(str(self.folder))
        return self.data[published.end.pos if published else 0:]

    def close(self) -> None:
        close_server(self.server)
        for c in self.conns:
            c.close()
        self.thread.join(30)


def receiver_executor(sid: int, folder: Path) -> int:
    """The executor JVM whose Python worker holds the spool's lock (the receiver task), by PID."""
    lock = str(folder / "receiver.lock")
    for pid in session_processes(sid):
        try:
            if any(os.readlink(f"/proc/{pid}/fd/{fd}") == lock for fd in os.listdir(f"/proc/{pid}/fd")):
                break
        except OSError:
            continue
    else:
        raise AssertionError("no process holds the receiver's lock")
    while b"CoarseGrainedExecutorBackend" not in Path(f"/proc/{pid}/cmdline").read_bytes():
        pid = int(Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[1])  # its parent
        assert pid > 1, "the receiver runs in no executor"
    return pid


def until(done: Callable[[], object], driver: subprocess.Popen, err: Path, timeout: float) -> None:
    """Waits until ``done()``, the driver running all along (bounded: ``timeout`` seconds)."""
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline and driver.poll() is None, err.read_text()
        time.sleep(0.1)


def test_a_tcp_stream_survives_its_driver_then_the_executor_of_its_receiver_killed(tmp_path, capsys):
    lines, queries, expected = order_feed(tmp_path, 9, capsys)
    assert expected
    data = (tmp_path / "all.jsonl").read_bytes()
    third, two_thirds = (len("".join(ln + "\n" for ln in lines[:len(lines) * k // 3]).encode()) for k in (1, 2))
    out, ck = tmp_path / "out", tmp_path / "ck"
    spool = ck / "live" / "spool"
    producer = Producer(data, [third, two_thirds], spool)
    args = ["--stream", "--stats", *queries, "-i", f"tcp://127.0.0.1:{producer.port}", "-o", str(out),
            "--checkpoint", str(ck), "--idle-stop", "30", "--master", MASTER, *CONF]  # (the receiver's restart fits)
    err, err_again = tmp_path / "stderr.txt", tmp_path / "stderr-again.txt"
    try:
        with session_of(start_driver(args, err)) as driver:
            wait_for(driver, err, "batch 0:")
            until(lambda: sum(f.stat().st_size for f in spool.iterdir()) >= third, driver, err, 60)  # all spooled
            os.kill(driver.pid, signal.SIGKILL)
            driver.wait(30)
        with session_of(start_driver(args, err_again)) as driver:  # the same command and checkpoint
            until(lambda: re.search(r"^batch \d+:", err_again.read_text(), re.M), driver, err_again, 240)
            until(lambda: (read_published(str(spool)) or EMPTY).end.pos >= two_thirds, driver, err_again, 60)
            os.kill(receiver_executor(driver.pid, spool), signal.SIGKILL)
            until(lambda: read_published(str(spool)).end.pos >= len(data), driver, err_again, 240)  # from the new receiver
            assert driver.wait(300) == 0, err_again.read_text()
            deadline = time.monotonic() + 30
            while session_processes(driver.pid) and time.monotonic() < deadline:
                time.sleep(0.2)
            assert not session_processes(driver.pid)  # no executor, receiver or Python worker left behind
    finally:
        producer.close()
    assert len(producer.conns) >= 3  # the restarted driver connected again, then the receiver started again did
    assert output(out / "matches.jsonl") == expected  # none lost, none twice
    assert dead_letters(out / "dead_letters.jsonl") == dead_letters(tmp_path / "dead.jsonl")
    text = err_again.read_text()
    stages = text[text.index(" receiver:"):text.index(" ingest:")]
    rows = [ln.split() for ln in stages.splitlines() if re.match(r"\s+\d+\s+\d+\s", ln)]
    executors = {e for r in rows for e in r[2].split(",")}
    assert len(executors) >= 2 and "driver" not in executors, stages  # ran on an executor, then on another
