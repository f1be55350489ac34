"""Where a Spark job's time goes: per step of ``yfpp spark``, the driver's wall time and the
Spark stages it ran (tasks, the tasks' run time, their JVM CPU), and the CPU of the whole
process tree (driver, JVM, Python workers). Printed by ``yfpp spark --stats``.

Stage figures come from Spark's status store (what the web UI shows): ``executorRunTime``
is the tasks' wall time — including the time their Python workers spend — and
``executorCpuTime`` the JVM threads' CPU only (a Python worker's CPU is its own process's,
counted in the process tree's CPU).
"""

from __future__ import annotations

import os
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator


#: The driver JVM's options when ``yfpp spark`` starts it: the C1 compiler only (C2's compile
#: threads cost more CPU than they save in a job of seconds to minutes — in local mode the data
#: passes through this JVM, see docs/spark.md "Where the time goes") and the serial collector
#: (no parallel GC threads competing with the Python workers for the cores).
DRIVER_JAVA_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


def driver_java_options(class_archive: str | None = None) -> str:
    """:data:`DRIVER_JAVA_OPTIONS`, with ``class_archive`` a class-data-sharing archive of the classes
    the JVM loaded: written when the JVM exits if the file does not exist yet, used when it does
    (JDK ≥ 13; a stale or foreign archive is ignored by the JVM with a warning)."""
    if not class_archive:
        return DRIVER_JAVA_OPTIONS
    flag = "SharedArchiveFile" if os.path.isfile(class_archive) else "ArchiveClassesAtExit"
    return f"{DRIVER_JAVA_OPTIONS} -XX:{flag}={os.path.abspath(class_archive)}"


def tree_cpu_seconds() -> float:
    """CPU seconds of this process and all its live descendants (JVM, Python workers), with their
    reaped children (Linux: from ``/proc``; NaN elsewhere)."""
    return sum(tree_cpu_by_kind().values()) if os.path.isdir("/proc") else float("nan")


def tree_cpu_by_kind() -> dict[str, float]:
    """:func:`tree_cpu_seconds` split into ``driver`` (this process), ``JVM`` (``java`` processes)
    and ``Python workers`` (every other descendant: Spark's Python daemon and its workers);
    empty without ``/proc``."""
    if not os.path.isdir("/proc"):
        return {}
    stats: dict[int, tuple[str, list[str]]] = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            text = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        head, _, rest = text.rpartition(")")
        stats[int(pid)] = (head.partition("(")[2], rest.split())
    me = os.getpid()
    tree, grew = {me}, True
    while grew:
        new = {pid for pid, (_, f) in stats.items() if int(f[1]) in tree} - tree
        tree |= new
        grew = bool(new)
    out = {"driver": 0.0, "JVM": 0.0, "Python workers": 0.0}
    for pid in tree & stats.keys():
        comm, f = stats[pid]
        kind = "driver" if pid == me else "JVM" if comm == "java" else "Python workers"
        out[kind] += sum(int(x) for x in f[11:15]) / os.sysconf("SC_CLK_TCK")  # utime stime cutime cstime
    return out


class Steps:
    """Named steps of a job: each step's jobs run in a Spark job group of its own, and its wall time
    and the process tree's CPU per kind (:func:`tree_cpu_by_kind`) are kept."""

    def __init__(self, spark: Any, start_seconds: float | None = None, start_cpu: dict[str, float] | None = None):
        self.sc = spark.sparkContext
        self.rows: list[tuple[str, float, dict[str, float]]] = (
            [] if start_seconds is None else [("start JVM + session", start_seconds, start_cpu or {})])

    @contextmanager
    def step(self, name: str) -> Iterator[None]:
        self.sc.setJobGroup(f"yfpp: {name}", name)
        started, cpu = time.perf_counter(), tree_cpu_by_kind()
        try:
            yield
        finally:
            after = tree_cpu_by_kind()
            self.rows.append((name, time.perf_counter() - started, {k: after[k] - cpu.get(k, 0.0) for k in after}))
            self.sc.setLocalProperty("spark.jobGroup.id", None)

    def stages(self, name: str) -> list[dict]:
        """``{stage, tasks, run, cpu}`` of the stages the step ``name`` ran (skipped ones left out)."""
        tracker, store = self.sc.statusTracker(), self.sc._jsc.sc().statusStore()
        quantiles = self.sc._gateway.new_array(self.sc._jvm.double, 0)
        out = []
        for job in tracker.getJobIdsForGroup(f"yfpp: {name}"):
            info = tracker.getJobInfo(job)
            for sid in sorted(info.stageIds if info else []):
                attempts = store.stageData(sid, False, None, False, quantiles)
                if attempts.isEmpty():
                    continue
                s = attempts.head()
                if str(s.status()) == "SKIPPED":
                    continue
                out.append({"stage": sid, "tasks": s.numTasks(), "run": s.executorRunTime() / 1e3,
                            "cpu": s.executorCpuTime() / 1e9})
        return out

    def report(self) -> list[str]:
        """The ``--stats`` lines: per step its wall time and CPU (driver, JVM, Python workers), then its stages."""
        lines = ["time per step:                    wall s   CPU s: driver    JVM  Python workers",
                 "      stage  tasks  task run s  task JVM CPU s"]
        total: dict[str, float] = {}
        for name, wall, cpu in self.rows:
            lines.append(f"  {name:<32} {wall:>6.2f}  {_kinds(cpu)}")
            lines += [f"  {'':<4} {s['stage']:>5}  {s['tasks']:>5}  {s['run']:>10.2f}  {s['cpu']:>14.2f}"
                      for s in self.stages(name)]
            for k, v in cpu.items():
                total[k] = total.get(k, 0.0) + v
        lines.append(f"  {'all steps':<32} {sum(r[1] for r in self.rows):>6.2f}  {_kinds(total)}")
        lines.append(f"process CPU s (driver + JVM + Python workers on this machine)  {tree_cpu_seconds():.1f}")
        return lines


def _kinds(cpu: dict[str, float]) -> str:
    return (f"{cpu.get('driver', 0.0):>13.2f} {cpu.get('JVM', 0.0):>6.2f} {cpu.get('Python workers', 0.0):>15.2f}"
            if cpu else "")
