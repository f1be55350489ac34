"""``yfpp spark --stream --stats``: what each streaming query's Spark stages did, and where.

A streaming query runs its micro-batches' jobs in a Spark job group named by
its run id (a live source's receiver, its job in a group of its own: ``receiver:``); each stage of those jobs is listed with its tasks, the executors
that ran them, its input (bytes and rows read from files), its shuffle
output, its tasks' run and CPU time, and the longest task's run time against
the mean (``max/mean``: how evenly the state keys, a hot key's slices among
them, spread over the tasks; run time, as a task's JVM CPU time leaves out its
Python worker's) — so the stages that read and parse
the files are seen to run as tasks on the executors, and the driver's own CPU
(the process tree's ``driver`` share, :func:`yfpp.spark.costs.tree_cpu_by_kind`)
to stay small: it plans, collects the per-file counts and renames folders.
"""

from __future__ import annotations

import re
from typing import Any, Sequence

from yfpp.spark.costs import KINDS


def stage_rows(spark: Any, group: str) -> list[dict]:
    """The stages of the jobs of job group ``group`` (skipped ones left out)."""
    sc = spark.sparkContext
    sc._jsc.sc().listenerBus().waitUntilEmpty()
    tracker, store = sc.statusTracker(), sc._jsc.sc().statusStore()
    quantiles = sc._gateway.new_array(sc._jvm.double, 0)
    out = []
    for job in sorted(tracker.getJobIdsForGroup(group)):
        info = tracker.getJobInfo(job)
        for sid in sorted(info.stageIds if info else []):
            attempts = store.stageData(sid, False, None, False, quantiles)
            if attempts.isEmpty() or str(attempts.head().status()) == "SKIPPED":
                continue
            s = attempts.head()
            tasks = store.taskList(sid, 0, 100_000)
            listed = [tasks.apply(i) for i in range(tasks.size())]
            executors = sorted({t.executorId() for t in listed})
            runs = [t.taskMetrics().get().executorRunTime() / 1e3 for t in listed if t.taskMetrics().isDefined()]
            out.append({"stage": sid, "name": _call_site(str(s.name())), "tasks": s.numTasks(),
                        "executors": executors, "input_bytes": s.inputBytes(), "input_rows": s.inputRecords(),
                        "shuffle_bytes": s.shuffleWriteBytes(), "run": s.executorRunTime() / 1e3,
                        "cpu": s.executorCpuTime() / 1e9,
                        "spread": max(runs) / (sum(runs) / len(runs)) if runs and sum(runs) > 0 else 1.0})
    return out


def _call_site(name: str) -> str:
    """A stage's name (its job's call site) with the file's folder dropped: ``collect at read.py:151``."""
    return re.sub(r" at (?:\S*/)?([^/\s]+)$", r" at \1", name)


def report(spark: Any, groups: Sequence[tuple[str, str]], cpu: dict[str, float], events: int | None) -> list[str]:
    """The ``--stats`` lines of a stream: per job group (name, group id: a streaming query's run id, a live
    source's receiver's group) its stages, then the process tree's CPU per kind over the stream (``cpu``: the
    growth of :func:`tree_cpu_by_kind`), per event when ``events`` (the records read) is known."""
    lines = ["stages per streaming query (the micro-batches' jobs):",
             "  stage  tasks  executors         input bytes  input rows  shuffle bytes  task run s  task CPU s"
             "  max/mean run  call site"]
    for name, group in groups:
        lines.append(f" {name}:")
        for s in stage_rows(spark, group):
            lines.append(f"  {s['stage']:>5}  {s['tasks']:>5}  {','.join(s['executors']) or '-':<16} {s['input_bytes']:>12,}"
                         f"  {s['input_rows']:>10,}  {s['shuffle_bytes']:>13,}  {s['run']:>10.2f}  {s['cpu']:>10.2f}"
                         f"  {s['spread']:>12.2f}  {s['name']}")
    per = f"  ({', '.join(f'{k} {cpu.get(k, 0.0) / events * 1e6:,.0f}' for k in KINDS)} us/event)" if events else ""
    lines.append("CPU s over the stream: " + ", ".join(f"{k} {cpu.get(k, 0.0):.2f}" for k in KINDS) + per)
    return lines
