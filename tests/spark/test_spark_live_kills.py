"""A ``yfpp spark --stream -i tcp://…`` job survives its driver killed by PID: what was spooled is read again.

The job runs as a user runs it (``python -m yfpp spark --stream`` in a session of its own, on the
standalone ``local-cluster`` of :mod:`tests.spark.test_spark_stream_kills`). A producer on loopback sends the
first half of a feed (late events, malformed lines) to the first connection; once it is all spooled and a
micro-batch is written, the driver is killed (SIGKILL); the same command started again on the same
checkpoint connects again and gets the second half. The outputs must be ``yfpp run``'s matches and dead
letters over the whole feed: none lost, none twice. Every process is stopped by its PID; every wait is bounded.
"""

from __future__ import annotations

import os
import signal
import socket
import threading
import time

import pytest

pytest.importorskip("pyspark", reason="pyspark is not installed (pip install '.[spark]')")

from tests.spark.test_spark_cli import output  # noqa: E402
from tests.spark.test_spark_live import close_server, order_feed  # noqa: E402
from tests.spark.test_spark_stream_kills import (  # noqa: E402
    CONF,
    MASTER,
    run_again,
    session_of,
    start_driver,
    wait_for,
)
from tests.spark.test_spark_stream_order import dead_letters  # noqa: E402

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc"), reason="Linux: /proc")

ACCEPT_TIMEOUT = 600.0


class Halves:
    """A TCP server on loopback: connection k gets ``parts[k]`` (nothing after the last) and is kept open."""

    def __init__(self, parts: list[bytes]):
        self.parts, self.conns = parts, []
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
            if len(self.conns) < len(self.parts):
                conn.sendall(self.parts[len(self.conns)])
            self.conns.append(conn)

    def close(self) -> None:
        close_server(self.server)
        for c in self.conns:
            c.close()
        self.thread.join(30)


def test_a_tcp_stream_survives_its_driver_killed(tmp_path, capsys):
    lines, queries, expected = order_feed(tmp_path, 8, capsys)
    assert expected
    data = (tmp_path / "all.jsonl").read_bytes()
    half = len("".join(ln + "\n" for ln in lines[:len(lines) // 2]).encode())
    producer = Halves([data[:half], data[half:]])
    out, ck = tmp_path / "out", tmp_path / "ck"
    args = ["--stream", *queries, "-i", f"tcp://127.0.0.1:{producer.port}", "-o", str(out), "--checkpoint", str(ck),
            "--master", MASTER, *CONF]
    try:
        err = tmp_path / "stderr.txt"
        with session_of(start_driver(args, err)) as driver:
            wait_for(driver, err, "batch 0:")
            spool, deadline = ck / "live" / "spool", time.monotonic() + 60
            while sum(f.stat().st_size for f in spool.iterdir()) < half:  # the first half, all spooled
                assert time.monotonic() < deadline, err.read_text()
                time.sleep(0.1)
            os.kill(driver.pid, signal.SIGKILL)
            driver.wait(30)
        run_again([*args, "--idle-stop", "4"], tmp_path / "stderr-again.txt")  # the same command and checkpoint
    finally:
        producer.close()
    assert len(producer.conns) >= 2  # the restarted driver connected again
    assert output(out / "matches.jsonl") == expected  # none lost, none twice
    assert dead_letters(out / "dead_letters.jsonl") == dead_letters(tmp_path / "dead.jsonl")
