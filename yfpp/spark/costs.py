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


def tree_cpu_seconds() -> float:
    """CPU seconds of this process and all its live descendants (JVM, Python workers), with their
    reaped children (Linux: from ``/proc``; NaN elsewhere)."""
    if not os.path.isdir("/proc"):
        return float("nan")
    stats: dict[int, list[str]] = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            stats[int(pid)] = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
    tree, grew = {os.getpid()}, True
    while grew:
        new = {pid for pid, f in stats.items() if int(f[1]) in tree} - tree
        tree |= new
        grew = bool(new)
    return sum(sum(int(x) for x in stats[pid][11:15]) for pid in tree if pid in stats) / os.sysconf("SC_CLK_TCK")


class Steps:
    """Named steps of a job: each step's jobs run in a Spark job group of its own."""

    def __init__(self, spark: Any, start_seconds: float | None = None):
        self.sc = spark.sparkContext
        self.rows: list[tuple[str, float]] = [] if start_seconds is None else [("start JVM + session", start_seconds)]

    @contextmanager
    def step(self, name: str) -> Iterator[None]:
        self.sc.setJobGroup(f"yfpp: {name}", name)
        started = time.perf_counter()
        try:
            yield
        finally:
            self.rows.append((name, time.perf_counter() - started))
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
        """The ``--stats`` lines: per step its wall time, then its stages."""
        lines = ["time per step:                      wall s  stage  tasks  task run s  task JVM CPU s"]
        for name, wall in self.rows:
            lines.append(f"  {name:<32} {wall:>7.2f}")
            lines += [f"  {'':<32} {'':>7}  {s['stage']:>5}  {s['tasks']:>5}  {s['run']:>10.2f}  {s['cpu']:>14.2f}"
                      for s in self.stages(name)]
        lines.append(f"process CPU s (driver + JVM + Python workers on this machine)  {tree_cpu_seconds():.1f}")
        return lines
