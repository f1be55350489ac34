"""The driver JVM's class-data-sharing archive (``yfpp.spark.costs``): where it is kept, when it is
written and used — without starting a JVM (a stand-in process plays the JVM that writes it at exit)."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import types

import pytest

pytest.importorskip("pyspark", reason="pyspark is not installed (pip install '.[spark]')")

from yfpp.cli import build_parser  # noqa: E402
from yfpp.spark.cli import class_archive  # noqa: E402
from yfpp.spark.costs import DRIVER_JAVA_OPTIONS, ClassArchive, default_class_archive, process_age  # noqa: E402

#: Reads its stdin to the end (as Spark's gateway JVM does), then writes its archive and exits.
_FAKE_JVM = "import sys; sys.stdin.read(); open(sys.argv[1], 'wb').write(b'classes')"


def _context_with_jvm(writes_to: str) -> type:
    """A stand-in for ``SparkContext``: a gateway whose ``proc`` is a process that writes ``writes_to`` at exit."""
    proc = subprocess.Popen([sys.executable, "-c", _FAKE_JVM, writes_to], stdin=subprocess.PIPE)
    gateway = types.SimpleNamespace(proc=proc, shutdown=lambda: None)
    return type("FakeContext", (), {"_gateway": gateway, "_jvm": object()})


def test_first_run_writes_the_archive_under_a_temporary_name_and_moves_it_into_place(tmp_path):
    path = tmp_path / "driver.jsa"
    first = ClassArchive(str(path))
    assert first.writing and first.writing != str(path) and not path.exists()
    assert first.options.startswith(DRIVER_JAVA_OPTIONS) and f"-XX:ArchiveClassesAtExit={first.writing}" in first.options
    assert "-Xlog:cds=off" in first.options  # a stale archive is ignored without a warning
    ctx = _context_with_jvm(first.writing)
    first.finish(ctx)
    assert path.read_bytes() == b"classes" and not list(tmp_path.glob("*.tmp"))
    assert ctx._gateway is None and ctx._jvm is None  # a later session in this process starts a new JVM
    later = ClassArchive(str(path))
    assert later.writing is None and f"-XX:SharedArchiveFile={path}" in later.options
    later.finish(ctx)  # nothing to wait for
    assert path.read_bytes() == b"classes"


def test_a_killed_runs_temporary_archive_is_removed_by_the_next_run(tmp_path):
    path = tmp_path / "driver.jsa"
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    orphan = tmp_path / f"driver.jsa.{dead.stdout.strip()}.tmp"
    live = tmp_path / f"driver.jsa.{os.getppid()}.tmp"  # a run still going
    orphan.write_bytes(b"half")
    live.write_bytes(b"half")
    ClassArchive(str(path))
    assert not orphan.exists() and live.exists()


def test_a_failed_dump_leaves_no_archive(tmp_path):
    path = tmp_path / "driver.jsa"
    archive = ClassArchive(str(path))
    proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read(); open(sys.argv[1], 'wb'); sys.exit(1)",
                             archive.writing], stdin=subprocess.PIPE)
    archive.finish(type("FakeContext", (), {"_gateway": types.SimpleNamespace(proc=proc, shutdown=lambda: None)}))
    assert list(tmp_path.iterdir()) == []  # the next run writes one


def test_the_cached_archive_is_kept_per_class_path(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    plain = default_class_archive({})
    assert plain is not None and plain.startswith(str(tmp_path / "cache" / "yfpp") + "/") and plain.endswith(".jsa")
    assert default_class_archive({"spark.sql.shuffle.partitions": "8"}) == plain  # not a class-path setting
    assert default_class_archive({"spark.jars": "/x/hadoop-aws.jar"}) != plain
    (tmp_path / "ro").write_text("")  # a cache folder that cannot be made: no archive
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "ro"))
    assert default_class_archive({}) is None


def test_no_archive_for_a_jvm_this_command_does_not_start(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv("PYSPARK_GATEWAY_PORT", raising=False)

    def args(archive: str = "auto", *conf: str) -> argparse.Namespace:
        return argparse.Namespace(class_archive=archive, conf=list(conf))

    assert class_archive(args(), new_jvm=True) == default_class_archive({})
    assert class_archive(args("/x/my.jsa"), new_jvm=True) == "/x/my.jsa"
    assert class_archive(args(), new_jvm=False) is None  # a session or gateway of this process already runs
    assert class_archive(args("off"), new_jvm=True) is None
    assert build_parser().parse_args(["spark", "-q", "Q", "-i", "I", "-o", "O"]).class_archive == "off"  # opt-in: the first run is slow
    assert class_archive(args("auto", "spark.driver.extraJavaOptions=-Xmx2g"), new_jvm=True) is None  # the user's options
    monkeypatch.setenv("PYSPARK_GATEWAY_PORT", "4040")  # spark-submit started the JVM
    assert class_archive(args(), new_jvm=True) is None


def test_process_age_is_the_wall_time_since_the_process_started():
    assert 0 < process_age() < 24 * 3600


#: Runs a command as a child subreaper (its orphans come back to it), reaps every descendant, prints
#: their CPU seconds: the process tree's CPU, measured from outside.
_MEASURE = """
import ctypes, os, resource, subprocess, sys
ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)
code = subprocess.call(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=open(os.environ["ERR"], "w"))
while True:
    try:
        os.wait()
    except ChildProcessError:
        break
r = resource.getrusage(resource.RUSAGE_CHILDREN)
print(code, r.ru_utime + r.ru_stime)
"""


@pytest.mark.skipif(not os.path.isdir("/proc") or not sys.platform.startswith("linux"), reason="Linux: /proc, prctl")
def test_stats_counts_the_cpu_of_the_whole_process_tree_workers_that_exited_too(tmp_path):
    """A small event-set job whose Python workers exit after each task (no reuse): the total ``--stats``
    reports is the process tree's CPU (every process reaped, orphans too) within 10 %; no step's CPU
    is negative."""
    from pathlib import Path

    from yfpp.input.generate import generate_rfid, write_events

    root = Path(__file__).resolve().parents[2]  # the clone's root: the yfpp of this tree, whatever is installed
    write_events(generate_rfid(20_000, tags=50, gap=3, seed=7), tmp_path / "feed.jsonl")
    query = "PATTERN SEQ(shelf a, {exit b, exit c}) WHERE [tag_id] WITHIN 1 hour"
    cmd = [sys.executable, "-m", "yfpp", "spark", "-q", query, "-i", str(tmp_path / "feed.jsonl"), "-o",
           str(tmp_path / "out"), "--master", "local[2]", "--plan", "shuffle", "--stats",
           "--conf", "spark.python.worker.reuse=false"]
    err = tmp_path / "stderr.txt"
    measured = subprocess.run([sys.executable, "-c", _MEASURE, *cmd], capture_output=True, text=True, timeout=300, cwd=root,
                              env={**os.environ, "PYTHONPATH": str(root), "ERR": str(err)})
    code, tree = measured.stdout.split()
    text = err.read_text()
    assert code == "0", text
    reported = float(text.rsplit("process CPU s, the whole run", 1)[1].split()[0])
    assert abs(reported - float(tree)) <= 0.1 * float(tree), (reported, tree, text)
    steps = text.split("time per step:")[1].split("process CPU s")[0]
    cpu = [float(x) for line in steps.splitlines() if line.startswith("  ") and not line.startswith("      ")
           for x in line.split()[-3:] if line.split()[-1].replace(".", "").replace("-", "").isdigit()]
    assert cpu and min(cpu) >= -0.05, steps
    # the timeline: the driver's milestones in order, and the matching step's Spark duration within the job's elapsed
    marks = [ln.split(None, 1) for ln in text.split("timeline (s since the process started):\n")[1].splitlines()
             if ln.startswith("  ") and "  job  " not in ln and ln.split()[0].count(".") == 1]
    at = {name: float(t) for t, name in marks}
    assert at["driver JVM up (its gateway answers)"] < at["session ready"] < at["outputs written"], marks
    matching = float(text.split("\nmatching job ")[1].split()[0])
    assert 0 < matching <= float(text.split("\nelapsed ")[1].split()[0]), text


#: A stand-in for Spark's Python daemon: waits to be seen, forks three workers that each burn 0.3 CPU-s
#: and exit (reaped by it), burns 0.1 CPU-s itself and exits.
_DAEMON = """
import os, sys, time
def burn(s):
    t = time.process_time()
    while time.process_time() - t < s:
        pass
sys.stdin.readline()
for _ in range(3):
    pid = os.fork()
    if pid == 0:
        burn(0.3)
        os._exit(0)
    os.waitpid(pid, 0)
burn(0.1)
"""


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="Linux: /proc")
def test_the_ledger_keeps_exited_workers_in_their_kind_and_never_goes_back():
    """The daemon's workers exit early and it exits too (reaped by this process): their seconds stay
    Python workers' (the sum of live processes' times moved them to the parent's column), none lost."""
    import resource

    from yfpp.spark.costs import CpuLedger

    ledger = CpuLedger(os.getpid())
    before, reaped = ledger.sample(), resource.getrusage(resource.RUSAGE_CHILDREN)
    daemon = subprocess.Popen([sys.executable, "-c", _DAEMON], stdin=subprocess.PIPE, text=True)
    samples = []
    while not samples or samples[-1]["Python workers"] == before["Python workers"]:  # seen (its start-up counted)
        samples.append(ledger.sample())
    daemon.stdin.write("go\n")
    daemon.stdin.flush()
    while daemon.poll() is None:
        samples.append(ledger.sample())
    samples.append(ledger.sample())
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    used = after.ru_utime + after.ru_stime - reaped.ru_utime - reaped.ru_stime
    workers = samples[-1]["Python workers"] - before["Python workers"]
    assert abs(workers - used) <= 0.1 * used, (workers, used)
    assert workers >= 1.0 - 0.05
    for earlier, later in zip(samples, samples[1:]):
        assert all(later[k] >= earlier[k] - 0.02 for k in later), (earlier, later)
