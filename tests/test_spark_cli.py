"""``yfpp spark``'s command line: Ctrl-C, arguments refused before the JVM starts, a failure as one line."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

pytest.importorskip("pyspark", reason="pyspark is not installed (pip install '.[spark]')")

from yfpp.cli import main  # noqa: E402
from yfpp.dead_letters import DeadLetters  # noqa: E402
from yfpp.engine import Engine  # noqa: E402
from yfpp.generate import generate_rfid, write_events  # noqa: E402
from yfpp.readers import read_events  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
QUERY = "PATTERN SEQ(shelf a, ~register b, exit c) WHERE [tag_id] WITHIN 1 hour"
#: What a clean stop or failure may not print (the JVM's start-up WARN lines may come before).
NOISE = ("Traceback", "Exception", "Error", "\tat ")


def descendants(pid: int) -> list[int]:
    """The processes below ``pid`` (Linux: /proc)."""
    children: dict[int, list[int]] = {}
    for p in filter(str.isdigit, os.listdir("/proc")):
        try:
            ppid = int(Path(f"/proc/{p}/stat").read_text().rpartition(")")[2].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(p))
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def python_worker_runs(pid: int) -> bool:
    """Has the command started a Spark task's Python worker (its job is running)?"""
    for p in descendants(pid):
        try:
            if b"pyspark.daemon" in Path(f"/proc/{p}/cmdline").read_bytes():
                return True
        except OSError:
            continue
    return False


def interrupt(args: list[str], tmp_path: Path, ready, timeout: float = 300) -> tuple[int, str]:
    """``yfpp spark ARGS`` in a process of its own, sent SIGINT (as Ctrl-C) once ``ready(pid, stderr)``
    holds: its exit status and stderr."""
    err = tmp_path / "stderr.txt"
    with err.open("wb") as f:
        proc = subprocess.Popen([sys.executable, "-m", "yfpp", "spark", *args, "--master", "local[2]"], cwd=ROOT,
                                stdout=subprocess.DEVNULL, stderr=f, env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        deadline = time.monotonic() + timeout
        while not ready(proc.pid, err.read_text()):
            assert proc.poll() is None, f"ended before the signal:\n{err.read_text()}"
            assert time.monotonic() < deadline, err.read_text()
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        code = proc.wait(120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return code, err.read_text()


def assert_quiet_stop(code: int, err: str) -> None:
    assert code == 130, err
    assert err.endswith("\nyfpp: interrupted\n"), err
    assert not [ln for ln in err.splitlines() if any(w in ln for w in NOISE)], err


def engine_lines(path: Path) -> Counter:
    """What ``yfpp run`` prints for ``path``, as a multiset of lines."""
    eng = Engine(dead_letters=DeadLetters())
    eng.register(QUERY, name="q")
    return Counter(json.dumps(m) for m in eng.process_all(read_events(path, dead_letters=DeadLetters())))


def output(path: Path) -> Counter:
    return Counter(ln for f in sorted(path.rglob("part-*")) if f.suffix != ".crc" for ln in f.read_text().splitlines())


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="Linux")
def test_ctrl_c_stops_a_batch_job_quietly(tmp_path):
    write_events(generate_rfid(100_000, tags=50, gap=3, seed=5), tmp_path / "feed.jsonl")
    code, err = interrupt(["-q", QUERY, "-i", str(tmp_path / "feed.jsonl"), "-o", str(tmp_path / "out")], tmp_path,
                          lambda pid, err: python_worker_runs(pid))  # a task is running
    assert_quiet_stop(code, err)


def test_ctrl_c_stops_a_stream_quietly_and_its_checkpoint_goes_on(spark, tmp_path):
    """Stopped by SIGINT in the middle, restarted (here, with the tests' session) until idle: the matches
    of yfpp run, none lost or repeated."""
    records = list(generate_rfid(800, tags=6, gap=15, seed=3))
    records.append({"type": "heartbeat", "ts": records[-1]["ts"] + 10**6})  # lets the last deadlines pass
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    write_events(records, tmp_path / "all.jsonl")
    step = len(records) // 4 + 1
    for i in range(4):
        write_events(records[i * step:(i + 1) * step], inbox / f"part{i}.jsonl")
        os.utime(inbox / f"part{i}.jsonl", (1e9 + i, 1e9 + i))  # files go by modification time
    args = ["--stream", "-q", QUERY, "-i", str(inbox), "-o", str(tmp_path / "out"), "--max-files", "1"]
    code, err = interrupt(args, tmp_path, lambda pid, err: "batch 0:" in err)
    assert_quiet_stop(code, err)
    assert "batch 3:" not in err  # stopped in the middle
    timer = threading.Timer(600, lambda: [q.stop() for q in spark.streams.active])
    timer.start()
    try:
        assert main(["spark", *args[:-2], "--idle-stop", "2"]) == 0  # the rest in one micro-batch
    finally:
        timer.cancel()
    assert output(tmp_path / "out" / "matches.jsonl") == engine_lines(tmp_path / "all.jsonl")
