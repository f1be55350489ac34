"""Throughput on a standalone Spark cluster (``spark://``): one, then two executors of one task slot (``--pin``: one CPU).

The script starts a master and one worker (``spark-class …deploy.master.Master`` / ``…deploy.worker.Worker``,
one core each, on loopback, under a temp folder), runs ``yfpp spark --master spark://… --plan scan --stats``
(the shoplifting query over ``generate_rfid(N)`` as JSON lines, the feed of ``spark_cost_model.py``) for
each ``--events`` size, then starts a second worker and runs the same jobs again; at the end it stops the
workers and the master by their PIDs. yfpp reaches the executors as ``yfpp spark`` ships it (a zip of its
packages, docs/spark.md, "Running on a cluster"). With each executor count it first runs a job over an empty
file: its cluster CPU (executors starting, yfpp shipped and imported) is the fixed cost, taken off per event, and
its timeline (``--stats``: when the driver JVM was up, the session ready, each executor registered, the check job and
each Spark job submitted, its first task launched, done; the session stopped) says where its wall time went.

Printed per job: the events; three wall times — the command's (from its start to its exit, measured here), its
``elapsed`` (``yfpp spark``'s own: from the job's start in the driver — the JVM, the session and the executors'
check done — to its last write; the listing and planning inside) and Spark's duration of the matching job
(``--stats``' ``matching job``: its first stage submitted to its last stage completed, as Spark's UI shows a job's
duration: the cluster's own time for the events) — and the events per second on the last two; the driver's CPU (``yfpp spark``'s own count of its process tree: the
driver's Python and JVM), and the cluster's CPU — executors, their Python workers, the worker and master
daemons: the growth of the daemons' own and reaped children's CPU (``/proc``: an executor ends with its
application and its worker reaps it), plus what this script reaps (it is a child subreaper, so a Python
worker orphaned at an executor's end comes to it, and is reaped here), less the driver's;
per event beyond the empty job's, against ``yfpp run``'s CPU per event over the same feed (its command less its
start-up); and the matching tasks' own CPU (their ``--stats`` seconds: the engines' side alone) per event.
The cluster count comes out *below* the matching tasks' own CPU on 5M events: some of the executors' Python
workers' CPU escapes it (not found how), so read it as a lower bound. On a machine with fewer free cores than executors the executors share them: the wall figures
then show the machine, not the cluster's scaling.

With ``--pin`` each executor has one CPU of its own: worker k's daemon starts with its CPU affinity set to CPU k,
and its executor's JVM and Python workers inherit it (``spark_pinning.py``; the master and the driver stay
unpinned). A ``--cores 1`` worker is one task slot, not one core: unpinned, its executor's JVM (reading the
ranges, the Arrow hand-off, writing) runs beside its Python worker on the other core, so on a 2-core machine one
executor already keeps more than one core busy and a second adds little. The first job of each executor count
prints the ``Cpus_allowed_list`` of the workers' processes seen while it ran. ``--pin`` is refused when this
process may use fewer CPUs than the executors.

At the end: the throughput (events a wall second) with each executor count against the first's, on each basis —
the command, the job's ``elapsed``, Spark's matching job, and ``elapsed`` beyond the empty job's — and (``--local T``,
default 2) ``yfpp spark --master local[T] --stats`` over an empty file and each feed, as ``spark_cost_model.py
--spark`` runs it — the Python workers' CPU per event beyond the empty job's against ``yfpp run``'s.

    python benchmarks/spark_standalone.py --events 5000000     # about 8 minutes on a quiet 2-core machine
    python benchmarks/spark_standalone.py --events 5000000 --local 0 --pin
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

from spark_cost_model import QUERIES, child_cpu, run_cpu, with_spark  # noqa: E402
from spark_pinning import cpus_allowed, descendants, executor_cpus, pin_to  # noqa: E402
from spark_vs_run import feed  # noqa: E402

from yfpp.spark.costs import keep_orphans  # noqa: E402

STARTUP = 120.0  #: seconds a daemon has to come up (a worker: to register with the master)


def spark_class() -> str:
    import pyspark

    return os.path.join(os.path.dirname(pyspark.__file__), "bin", "spark-class")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Cluster:
    """A standalone master on loopback and its workers (one core each), processes of this script; with ``pins``,
    worker k's daemon (and so its executor, the executor's Python workers) confined to CPU ``pins[k]``."""

    def __init__(self, folder: Path, worker_memory: str, pins: list[int] | None = None):
        self.folder, self.worker_memory, self.pins = folder, worker_memory, pins
        self.port, self.ui = free_port(), free_port()
        self.url = f"spark://127.0.0.1:{self.port}"
        self.procs: list[subprocess.Popen] = []
        self._start("master", "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port",
                    str(self.port), "--webui-port", str(self.ui))

    def _start(self, name: str, *args: str, cpu: int | None = None) -> None:
        # (daemons start while no other thread of this script runs: a preexec_fn is safe here)
        log = (self.folder / f"{name}.log").open("w")
        self.procs.append(subprocess.Popen([spark_class(), *args], stdout=log, stderr=subprocess.STDOUT,
                                           env={**os.environ, "SPARK_NO_DAEMONIZE": "1"},
                                           preexec_fn=None if cpu is None else pin_to(cpu)))

    def add_worker(self) -> None:
        n = len(self.procs) - 1  # the workers so far
        work = self.folder / f"worker{n}"
        work.mkdir()
        self._start(f"worker{n}", "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1", "--cores", "1",
                    "--memory", self.worker_memory, "--webui-port", str(free_port()), "--work-dir", str(work), self.url,
                    cpu=None if self.pins is None else self.pins[n])
        self.wait_workers(n + 1)

    def wait_workers(self, n: int) -> None:
        deadline = time.monotonic() + STARTUP
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.ui}/json/", timeout=5) as r:
                    if json.load(r).get("aliveworkers", 0) >= n:
                        return
            except (OSError, ValueError):  # not up yet, or its page not yet JSON
                pass
            time.sleep(0.5)
        self.stop()
        sys.exit(f"{n} worker(s) did not register in {STARTUP:.0f} s (logs under {self.folder})")

    def workers_cpus(self) -> dict[int, set[tuple[str, str]]]:
        """Per worker, its daemon's and its live descendants' (the executor, its Python workers) command names
        with their ``Cpus_allowed_list``."""
        seen: dict[int, set[tuple[str, str]]] = {}
        for k, p in enumerate(self.procs[1:]):
            seen[k] = {c for pid in (p.pid, *descendants(p.pid)) if (c := cpus_allowed(pid))}
        return seen

    def stop(self) -> None:
        for p in reversed(self.procs):  # workers first (they kill their executors), then the master
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(30)
        self.procs.clear()


def cluster_cpu(cluster: Cluster) -> float:
    """CPU seconds so far of the cluster's daemons with the children they reaped, and of what this script
    reaped (the zombies orphaned to it reaped first; the jobs' ``yfpp spark`` processes too)."""
    while True:
        try:
            if os.waitpid(-1, os.WNOHANG)[0] == 0:
                break
        except ChildProcessError:
            break
    tick = os.sysconf("SC_CLK_TCK")
    daemons = 0
    for p in cluster.procs:
        try:
            f = Path(f"/proc/{p.pid}/stat").read_text().rpartition(")")[2].split()
        except OSError:
            continue
        daemons += sum(int(x) for x in f[11:15])
    mine = resource.getrusage(resource.RUSAGE_CHILDREN)
    return daemons / tick + mine.ru_utime + mine.ru_stime


class AffinityWatch:
    """Samples, once a second while a job runs, the CPUs each worker's processes may use."""

    def __init__(self, cluster: Cluster):
        self.cluster, self.seen = cluster, {k: set() for k in range(len(cluster.procs) - 1)}
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def _watch(self) -> None:
        while not self._done.wait(1.0):
            for k, found in self.cluster.workers_cpus().items():
                self.seen[k] |= found

    def __enter__(self) -> AffinityWatch:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._done.set()
        self._thread.join()

    def line(self) -> str:
        """One line: per worker, each command name seen with the CPUs it was allowed."""
        def names(found: set[tuple[str, str]]) -> str:
            by_cpus: dict[str, set[str]] = {}
            for name, cpus in found:
                by_cpus.setdefault(cpus, set()).add(name)
            return "; ".join(f"CPUs {cpus}: {', '.join(sorted(n))}" for cpus, n in sorted(by_cpus.items()))
        return "executor processes' Cpus_allowed_list during the job: " + " | ".join(
            f"worker {k} ({names(found)})" for k, found in self.seen.items())


def job_figures(err: str) -> dict[str, float]:
    """From a ``yfpp spark --stats`` run's stderr: its ``events``, ``elapsed`` (wall s from the job's start in the
    driver to its last write), ``spark`` (Spark's duration of the matching step: its first stage submitted to its
    last stage completed; NaN when not printed), ``driver`` (the process tree's CPU s) and ``tasks`` (the
    matching tasks' own CPU s); a :class:`ValueError` naming what is missing."""
    found = {k: re.search(p, err, re.MULTILINE) for k, p in (("events", r"^events\s+([\d,]+)"), ("elapsed", r"^elapsed\s+([\d.]+) s"),
                                                ("driver", r"process CPU s, the whole run\s+([\d.]+)"))}
    lacking = [k for k, m in found.items() if m is None]
    if lacking:
        raise ValueError(f"no {', '.join(lacking)} line(s) in:\n{err[-2000:]}")
    spark = re.search(r"^matching job\s+([\d.]+) s", err, re.MULTILINE)
    return {"events": int(found["events"][1].replace(",", "")), "elapsed": float(found["elapsed"][1]),  # type: ignore[index]
            "spark": float(spark[1]) if spark else float("nan"), "driver": float(found["driver"][1]),  # type: ignore[index]
            "tasks": sum(float(t) for t in re.findall(r"^  task \d+ .* ([\d.]+) s$", err, re.MULTILINE))}


def timeline_lines(err: str) -> list[str]:
    """The ``timeline`` block of a ``yfpp spark --stats`` run's stderr, and its stop line (when it stopped)."""
    block = re.search(r"^timeline \(s since the process started\):\n((?:  .*\n)+)", err, re.MULTILINE)
    stop = re.search(r"^stop session.*stopped ([\d.]+) s after the process started", err, re.MULTILINE)
    return (block[1].splitlines() if block else []) + (
        [f"  {float(stop[1]):8.2f}  session stopped"] if stop else [])


def job(cluster: Cluster, path: Path, out: Path, partitions: int, executor_memory: str,
        show_cpus: bool = False, show_timeline: bool = False) -> dict[str, float]:
    """One ``yfpp spark`` job on the cluster: :func:`job_figures`, ``command`` (the command's wall s, its start to
    its exit) and the cluster's CPU; with ``show_cpus``, printed first: the CPUs the workers' processes were
    allowed while it ran; with ``show_timeline``, its timeline (:func:`timeline_lines`)."""
    before = cluster_cpu(cluster)
    with AffinityWatch(cluster) as watch:
        started = time.perf_counter()
        _, err = child_cpu([sys.executable, "-m", "yfpp", "spark", "-q", str(QUERIES), "-i", str(path), "-o",
                            str(out), "--master", cluster.url, "--plan", "scan", "--partitions", str(partitions),
                            "--stats", "--mode", "overwrite", "--conf", "spark.executor.cores=1",
                            "--conf", f"spark.executor.memory={executor_memory}"])
        command = time.perf_counter() - started
    if show_cpus:
        print(watch.line(), flush=True)
    if show_timeline:
        print("\n".join(["  the empty job's timeline, s since its process started:"]
                        + [f"  {ln}" for ln in timeline_lines(err)]), flush=True)
    time.sleep(3)  # the executors end with the application: reaped by their workers by now
    after = cluster_cpu(cluster)
    (out.parent / f"job-{len(cluster.procs) - 1}-{path.stem}.log").write_text(err)
    try:
        figures = job_figures(err)
    except ValueError as e:
        sys.exit(str(e))
    total = after - before  # (the driver included: it is a child of this script)
    return {**figures, "command": command, "cluster": total - figures["driver"]}


BASES = {"command": "the command (start to exit)", "elapsed": "the job's elapsed",
         "spark": "Spark's matching job", "beyond": "elapsed beyond the empty job's"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, nargs="*", default=[1_000_000, 5_000_000],
                    help="feed sizes; none: the empty jobs alone (the fixed part)")
    ap.add_argument("--executors", type=int, nargs="+", default=[1, 2], help="executor counts, ascending")
    ap.add_argument("--partitions", type=int, default=4, help="the scan plan's tasks (byte ranges), every job")
    ap.add_argument("--executor-memory", default="768m")
    ap.add_argument("--local", type=int, default=2, metavar="T",
                    help="then yfpp spark --master local[T] --stats over the same feeds: the Python workers' CPU per "
                         "event against yfpp run's (spark_cost_model.py --spark); 0: not")
    ap.add_argument("--pin", action="store_true",
                    help="give each executor one CPU of its own: worker k's daemon, and so its executor JVM and "
                         "Python workers, confined to CPU k (the master and the driver are not)")
    args = ap.parse_args()
    if not keep_orphans():
        sys.exit("needs Linux (a child subreaper, /proc) to count the executors' CPU")
    try:
        pins = executor_cpus(max(args.executors)) if args.pin else None
    except ValueError as e:
        sys.exit(str(e))
    print("executors pinned: " + ", ".join(f"executor {k + 1} to CPU {c}" for k, c in enumerate(pins))
          + "; the master and the driver unpinned" if pins else
          "executors not pinned: each may use every CPU (a --cores 1 worker is one task slot, not one core)")
    tmp = Path(tempfile.mkdtemp(prefix="yfpp_standalone_"))
    empty = tmp / "empty.jsonl"
    empty.write_text("")
    base = run_cpu(empty, tmp / "run_empty.jsonl")
    runs = {n: (run_cpu(feed(n, 8, 1), tmp / "run.jsonl") - base) / n * 1e6 for n in args.events}
    print(f"yfpp run, CPU-µs per event (less its start-up): "
          f"{', '.join(f'{n:,} events {us:.2f}' for n, us in runs.items())}")
    print(f"{'executors':>9} {'events':>10} {'command s':>9} {'elapsed s':>9} {'Spark job s':>11} "
          f"{'events/s elapsed':>16} {'events/s Spark job':>18} {'driver CPU s':>12} {'cluster CPU s':>13} "
          f"{'cluster µs/ev beyond empty':>26} {'× run':>6} {'matching tasks µs/ev':>20} {'× run':>6}")
    cluster = Cluster(tmp, worker_memory="1200m", pins=pins)
    wall: dict[tuple[int, int], dict[str, float]] = {}  # (executors, events) → wall s on each basis (BASES)
    try:
        workers = 0
        for executors in args.executors:
            while workers < executors:
                cluster.add_worker()
                workers += 1
            fixed = job(cluster, empty, tmp / "out", args.partitions, args.executor_memory, show_timeline=True)
            print(f"{executors:>9} {0:>10} {fixed['command']:>9.1f} {fixed['elapsed']:>9.1f} {fixed['spark']:>11.1f} "
                  f"{'':>16} {'':>18} {fixed['driver']:>12.1f} {fixed['cluster']:>13.1f}", flush=True)
            for i, n in enumerate(args.events):
                r = job(cluster, feed(n, 8, 1), tmp / "out", args.partitions, args.executor_memory, show_cpus=i == 0)
                wall[executors, n] = {"command": r["command"], "elapsed": r["elapsed"], "spark": r["spark"],
                                      "beyond": r["elapsed"] - fixed["elapsed"]}
                per = (r["cluster"] - fixed["cluster"]) / r["events"] * 1e6
                print(f"{executors:>9} {r['events']:>10,} {r['command']:>9.1f} {r['elapsed']:>9.1f} {r['spark']:>11.1f} "
                      f"{r['events'] / r['elapsed']:>16,.0f} {r['events'] / r['spark']:>18,.0f} "
                      f"{r['driver']:>12.1f} {r['cluster']:>13.1f} {per:>26.2f} {per / runs[n]:>6.2f} "
                      f"{r['tasks'] / r['events'] * 1e6:>20.2f} {r['tasks'] / r['events'] * 1e6 / runs[n]:>6.2f}", flush=True)
    finally:
        cluster.stop()
    one = args.executors[0]
    for executors in args.executors[1:]:
        for n in args.events:
            print(f"throughput, {n:,} events, {executors} executors against {one}: " + ", ".join(
                f"{what} {wall[one, n][basis] / wall[executors, n][basis]:.2f}x" for basis, what in BASES.items()))
    if args.local:
        with_spark(args.events, args.local, tmp, base)


if __name__ == "__main__":
    main()
