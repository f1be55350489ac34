"""A ``yfpp spark --stream`` job on a standalone cluster survives its processes killed by PID.

The job runs as a user runs it — ``python -m yfpp spark --stream`` in a
process (and session) of its own, on ``local-cluster[2,1,1024]``: a master
and two workers in the driver's JVM, each executor a JVM of its own. Files
arrive over several micro-batches; the executors' Python workers are killed
(SIGKILL) while the stream runs, then one executor JVM, then the driver
process itself, before the last files are done; the same command started
again on the same checkpoint finishes the stream. The outputs must be
``yfpp run``'s matches and dead letters over the files' concatenation, none
lost and none twice. Loopback only; every process the job started is stopped
by its PID; every wait is bounded.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

pytest.importorskip("pyspark", reason="pyspark is not installed (pip install '.[spark]')")

from tests.spark.test_spark_cli import ROOT, output  # noqa: E402
from tests.spark.test_spark_stream_order import QUERIES, dead_letters, feed_files  # noqa: E402
from tests.spark_jvm import EXECUTOR_CONF  # noqa: E402
from yfpp.cli import main  # noqa: E402

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc"), reason="Linux: /proc")

FILES = 6
#: The master for the job's own JVM: a standalone master and two workers, an executor JVM each.
MASTER = "local-cluster[2,1,1024]"
CONF = ["--conf", "spark.executor.memory=512m", "--conf", "spark.driver.memory=1g", "--conf", "spark.ui.enabled=false",
        *EXECUTOR_CONF]


def session_processes(sid: int) -> dict[int, bytes]:
    """The live processes of session ``sid`` (a driver started in a session of its own, and everything it
    started: its JVM, the executors' JVMs, their Python workers), by PID, with their command lines."""
    found = {}
    for p in filter(str.isdigit, os.listdir("/proc")):
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rpartition(")")[2].split()
            if int(fields[3]) == sid and fields[0] != "Z":
                found[int(p)] = Path(f"/proc/{p}/cmdline").read_bytes()
        except (OSError, IndexError, ValueError):
            continue
    return found


def stop_session(sid: int, grace: float = 30) -> None:
    """Waits up to ``grace`` seconds for session ``sid``'s processes to end (a JVM whose driver died ends when
    its stdin closes), then kills those left, each by its PID."""
    deadline = time.monotonic() + grace
    while session_processes(sid) and time.monotonic() < deadline:
        time.sleep(0.2)
    for pid in session_processes(sid):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def wait_for(proc: subprocess.Popen, err: Path, text: str, timeout: float = 240) -> None:
    """Until the driver's stderr holds ``text`` (it must not end before)."""
    deadline = time.monotonic() + timeout
    while text not in err.read_text():
        assert proc.poll() is None, f"ended before {text!r}:\n{err.read_text()}"
        assert time.monotonic() < deadline, f"no {text!r} in {timeout} s:\n{err.read_text()}"
        time.sleep(0.1)


def arrive(pending: Path, inbox: Path, n: int) -> None:
    """Moves file ``n`` into the watched directory (one rename: the stream sees it whole)."""
    name = f"part-{n:02d}.jsonl"
    (pending / name).rename(inbox / name)


@contextmanager
def session_of(proc: subprocess.Popen) -> Iterator[subprocess.Popen]:
    """``proc`` (a driver started by :func:`start_driver`); at the end, it killed if it still runs, and every
    process of its session stopped (:func:`stop_session`)."""
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        stop_session(proc.pid)


def run_again(args: list[str], err: Path) -> None:
    """The same command started again (on the same checkpoint): it must end, and succeed (bounded)."""
    with session_of(start_driver(args, err)) as again:
        assert again.wait(300) == 0, err.read_text()


def start_driver(args: list[str], err: Path) -> subprocess.Popen:
    with err.open("ab") as f:
        return subprocess.Popen([sys.executable, "-m", "yfpp", "spark", *args], cwd=ROOT, stdout=subprocess.DEVNULL,
                                stderr=f, env={**os.environ, "PYTHONPATH": str(ROOT)}, start_new_session=True)


def test_a_stream_survives_killed_python_workers_an_executor_and_the_driver(tmp_path, capsys):
    pending, inbox = tmp_path / "pending", tmp_path / "inbox"
    lines = feed_files(pending, seed=3, files=FILES)  # late events, malformed lines; each file newer than the last
    whole = tmp_path / "all.jsonl"
    whole.write_text("".join(ln + "\n" for ln in lines))
    queries = [a for q in QUERIES for a in ("-q", q)]
    assert main(["run", *queries, "-i", str(whole), "--dead-letters", str(tmp_path / "dead.jsonl")]) == 0
    expected = Counter(capsys.readouterr().out.splitlines())
    assert expected

    inbox.mkdir()
    for n in range(2):
        arrive(pending, inbox, n)
    out, err = tmp_path / "out", tmp_path / "stderr.txt"
    args = ["--stream", *queries, "-i", str(inbox), "-o", str(out), "--checkpoint", str(tmp_path / "ck"),
            "--max-files", "1", "--master", MASTER, *CONF]
    with session_of(start_driver(args, err)) as driver:
        wait_for(driver, err, "batch 0:")
        workers = [p for p, cmd in session_processes(driver.pid).items() if b"pyspark.daemon" in cmd]
        assert workers, err.read_text()  # the executors keep their Python workers between tasks
        for pid in workers:  # every Python worker (and the daemons forking them): the executors start new ones
            os.kill(pid, signal.SIGKILL)
        wait_for(driver, err, "batch 1:")
        executors = [p for p, cmd in session_processes(driver.pid).items() if b"CoarseGrainedExecutorBackend" in cmd]
        assert len(executors) == 2, err.read_text()
        os.kill(executors[0], signal.SIGKILL)  # the stream goes on: the master starts another executor
        for n in range(2, FILES):
            arrive(pending, inbox, n)
        wait_for(driver, err, "batch 2:")  # micro-batches done after the executor's death
        assert executors[0] not in session_processes(driver.pid)
        os.kill(driver.pid, signal.SIGKILL)  # while the last files are being taken
        driver.wait(30)

    err_again = tmp_path / "stderr-again.txt"
    run_again([*args, "--idle-stop", "2"], err_again)  # the same command, the same checkpoint
    assert "batch " in err_again.read_text()  # the driver was killed with work left
    assert output(out / "matches.jsonl") == expected  # none lost, none twice
    assert dead_letters(out / "dead_letters.jsonl") == dead_letters(tmp_path / "dead.jsonl")
