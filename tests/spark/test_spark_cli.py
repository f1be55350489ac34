"""``yfpp spark``'s command line: Ctrl-C, arguments refused before the JVM starts, a failure as one line."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from pathlib import Path

import pytest

pytest.importorskip("pyspark", reason="pyspark is not installed (pip install '.[spark]')")

from tests.process_helpers import default_sigint  # noqa: E402
from yfpp.cli import main  # noqa: E402
from yfpp.input.dead_letters import DeadLetters  # noqa: E402
from yfpp.engine import Engine  # noqa: E402
from yfpp.input.generate import generate_rfid, write_events  # noqa: E402
from yfpp.input.readers import read_events  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
QUERY = "PATTERN SEQ(shelf a, ~register b, exit c) WHERE [tag_id] WITHIN 1 hour"
#: What a clean stop or failure may not print.
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
                                stdout=subprocess.DEVNULL, stderr=f, env={**os.environ, "PYTHONPATH": str(ROOT)},
                                preexec_fn=default_sigint)
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
    assert ("\n" + err).endswith("\nyfpp: interrupted\n"), err  # the last line
    assert not [ln for ln in err.splitlines() if any(w in ln for w in NOISE)], err


def bounded(spark, args: list[str], seconds: float = 120) -> int:
    """``main(args)``, its streams stopped after ``seconds`` (one that should have been refused may never idle)."""
    timer = threading.Timer(seconds, lambda: [q.stop() for q in spark.streams.active])
    timer.start()
    try:
        return main(args)
    finally:
        timer.cancel()


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
    assert err == "yfpp: interrupted\n"  # and nothing the JVM said while it started (Spark's log is off)


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
    assert bounded(spark, ["spark", *args[:-2], "--idle-stop", "2"], 600) == 0  # the rest in one micro-batch
    assert output(tmp_path / "out" / "matches.jsonl") == engine_lines(tmp_path / "all.jsonl")


@pytest.mark.parametrize("where", ["-o", "--checkpoint", "-o = -i"])
def test_a_stream_writing_into_its_input_directory_is_refused_before_the_jvm_starts(spark, tmp_path, capsys, where):
    inbox = tmp_path / "in"
    (inbox / "sub").mkdir(parents=True)
    out = {"-o": inbox / "sub" / "out", "-o = -i": inbox}.get(where, tmp_path / "out")
    args = ["spark", "--stream", "-q", QUERY, "-i", str(inbox), "-o", str(out), "--idle-stop", "1"]
    if where == "--checkpoint":
        args += ["--checkpoint", str(inbox / "ck")]
    assert bounded(spark, args) == 2
    flag = "--checkpoint" if where == "--checkpoint" else "-o"
    assert capsys.readouterr().err == (f"yfpp: error: {flag} {inbox / 'ck' if flag == '--checkpoint' else out} is inside "
                                       f"the watched directory {inbox}: the stream would read its own "
                                       f"{'checkpoint' if flag == '--checkpoint' else 'output'}; give a folder outside it\n")


def test_within():
    from yfpp.spark.cli import within

    assert within("/a/b", "/a") and within("/a", "/a/") and within("file:///a/b", "/a") and within("/", "/")
    assert not within("/ab", "/a") and not within("/a", "/a/b")
    assert within("hdfs://nn:8020/in/out", "hdfs://nn:8020/in") and not within("hdfs://nn:8020/in/out", "hdfs://mm/in")
    assert not within("hdfs://nn/in", "/in")


class FakeQuery:
    """A streaming query that ended by itself (``failed``: with that error) or runs until stopped; a stop
    of a running one may leave ``stopped`` as its error (the interruption of its micro-batch)."""

    def __init__(self, failed: Exception | None = None, stopped: Exception | None = None):
        self.isActive, self.error, self.stopped = failed is None, failed, stopped
        self.id = str(uuid.uuid4())  # (as a StreamingQuery's: a stop looks up its live receiver by it)

    def processAllAvailable(self) -> None:
        pass

    def awaitTermination(self, timeout: float | None = None) -> bool:
        return True

    def stop(self) -> None:
        if self.isActive:
            self.isActive, self.error = False, self.stopped

    def exception(self) -> Exception | None:
        return self.error


FAILED = Exception("[STREAM_FAILED] Query [id = 1, runId = 2] terminated with exception: [FOREACH_BATCH_USER_FUNCTION_ERROR]"
                   " …\nTraceback (most recent call last):\n  …\nyfpp.errors.InputError: cannot tell the format of 'x'\n")
INTERRUPTED = Exception("[STREAM_FAILED] Query [id = 1] terminated with exception: … py4j.protocol.Py4JJavaError: "
                        "An error occurred while calling o854.collectToPython. : java.lang.InterruptedException")


def test_finish_raises_the_error_of_a_query_that_failed_before_its_stop():
    from yfpp.spark.stream import finish

    queries = [FakeQuery(failed=FAILED), FakeQuery()]  # the ingest query failed after its last processAllAvailable
    with pytest.raises(Exception, match="cannot tell the format"):
        finish(queries)
    assert not any(q.isActive for q in queries)
    finish([FakeQuery(stopped=INTERRUPTED), FakeQuery()])  # a micro-batch interrupted by the stop: no failure


def test_a_stream_whose_query_failed_exits_2_with_one_line(spark, tmp_path, capsys, monkeypatch):
    """(The tests' session, its queries replaced: the query that failed as the stream stopped, which exited 0.)"""
    from yfpp.spark import stream

    monkeypatch.setattr(stream, "start_stream", lambda *a, **k: [FakeQuery(failed=FAILED), FakeQuery()])
    (tmp_path / "in").mkdir()
    code = bounded(spark, ["spark", "--stream", "-q", QUERY, "-i", str(tmp_path / "in"), "-o", str(tmp_path / "out"),
                           "--idle-stop", "1"])
    assert (code, capsys.readouterr().err) == (2, "yfpp: error: cannot tell the format of 'x'\n")


@pytest.mark.parametrize("option, value, line", [
    ("--socket", "localhost", "--socket must be HOST:PORT (a port from 1 to 65535), not 'localhost'"),
    ("--socket", "127.0.0.1:0", "--socket must be HOST:PORT (a port from 1 to 65535), not '127.0.0.1:0'"),
    ("--trigger", "inf", "--trigger must be from 0.001 to 86,400 seconds, got inf"),
    ("--trigger", "0.0001", "--trigger must be from 0.001 to 86,400 seconds, got 0.0001"),
    ("--max-files", str(2**31), "--max-files must be at most 2,147,483,647"),
])
def test_bad_stream_options_are_refused_before_the_jvm_starts(spark, tmp_path, capsys, option, value, line):
    (tmp_path / "in").mkdir()
    source = ["--socket", value] if option == "--socket" else ["-i", str(tmp_path / "in"), option, value]
    assert bounded(spark, ["spark", "--stream", "-q", QUERY, *source, "-o", str(tmp_path / "out"), "--idle-stop", "1"]) == 2
    assert capsys.readouterr().err == f"yfpp: error: {line}\n"


def free_port() -> int:
    """A port on 127.0.0.1 nothing listens on (bound, then closed)."""
    import socket

    with socket.create_server(("127.0.0.1", 0)) as s:
        return s.getsockname()[1]


def test_a_socket_nothing_listens_on_is_one_error_line(tmp_path):
    """The command as a user runs it (its own JVM): the failed stream is one line, no trace of Spark's."""
    port = free_port()
    proc = subprocess.run([sys.executable, "-m", "yfpp", "spark", "--stream", "-q", QUERY, "--socket", f"127.0.0.1:{port}",
                           "-o", str(tmp_path / "out"), "--master", "local[2]"], capture_output=True, text=True,
                          cwd=ROOT, timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr == f"yfpp: error: cannot connect to 127.0.0.1:{port}: Connection refused\n"


def test_a_failed_spark_job_or_stream_is_one_line_saying_why():
    from yfpp.spark.cli import job_error

    refused = ("[STREAM_FAILED] Query [id = 7, runId = 8] terminated with exception: [PYTHON_STREAMING_DATA_SOURCE_RUNTIME_ERROR]"
               " Failed when Python streaming data source perform latestOffset: Traceback (most recent call last):\n"
               '  File "/x/socket.py", line 836, in create_connection\n    sock.connect(sa)\n'
               "ConnectionRefusedError: [Errno 111] Connection refused\n SQLSTATE: 38000\n\tat org.apache.spark.X(X.scala:1)")
    assert job_error(Exception(refused)) == "streaming query failed: ConnectionRefusedError: [Errno 111] Connection refused"
    assert job_error(Exception(refused.replace("ConnectionRefusedError: [Errno 111]",
                                               "yfpp.errors.InputError: cannot connect to h:1:"))) == "cannot connect to h:1: Connection refused"
    other = "[STREAM_FAILED] Query [id = 7, runId = 8] terminated with exception: Disk quota exceeded\n\tat x"
    assert job_error(Exception(other)) == "streaming query failed: Disk quota exceeded"
    assert job_error(Exception("An error occurred while calling o1.save.\n: java.io.IOException: No space left")) == (
        "No space left")


def test_a_job_started_from_another_thread_borrows_the_process_session_and_leaves_it_running(spark, tmp_path):
    """Spark's active session is per thread: ``yfpp spark`` called from a thread other than the one that made
    the session still borrows it (and its settings), and never stops it."""
    write_events(generate_rfid(300, tags=5, gap=3, seed=4), tmp_path / "feed.jsonl")
    codes: list[int] = []
    args = ["spark", "-q", QUERY, "-i", str(tmp_path / "feed.jsonl"), "-o", str(tmp_path / "out")]
    job = threading.Thread(target=lambda: codes.append(main(args)))
    job.start()
    job.join(300)
    assert codes == [0]
    assert output(tmp_path / "out" / "matches.jsonl") == engine_lines(tmp_path / "feed.jsonl")
    assert spark.range(3).count() == 3  # the session still runs


def test_a_session_of_its_own_starts_without_the_web_ui_unless_spark_submit_set_it_up(monkeypatch):
    from yfpp.spark.cli import own_session_settings

    monkeypatch.delenv("PYSPARK_GATEWAY_PORT", raising=False)
    assert own_session_settings() == {"spark.log.level": "OFF", "spark.ui.enabled": "false"}
    monkeypatch.setenv("PYSPARK_GATEWAY_PORT", "41234")  # (spark-submit's JVM: its settings are the user's)
    assert own_session_settings() == {"spark.log.level": "OFF"}
