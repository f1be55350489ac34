"""When each part of a ``yfpp spark`` run happened: seconds since its process started (``--stats``).

The driver marks its own milestones (the JVM up, the session, yfpp's zip added, the executors'
Python checked, the outputs written); Spark's status store — what the web UI shows — gives the
rest: when the application started, when each executor registered, and per job when it was
submitted, when its first task was launched and when it completed. All are read off the same
clock (the driver's machine), so the fixed part of a job can be told apart step by step: the
driver JVM, the session, the executors starting, the check job, task launch.

A job's **Spark duration** is what Spark's UI shows as its duration: from its first stage's
submission to its last stage's completion (a step of several jobs: the first job's first stage to
the last job's last stage) — the time the cluster spent on it, without the driver's start, the
session, the planning before and the stop after.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

from yfpp.spark.costs import process_age

#: How long to wait for Spark's listener bus to bring the status store up to date (ms).
SETTLE_MS = 5_000


@dataclass(frozen=True)
class SparkJob:
    """A Spark job as the status store has it: times are seconds since the epoch (None: not yet)."""

    job: int
    group: str
    submitted: float | None
    first_task: float | None
    completed: float | None
    first_stage: float | None  # its first stage's submission
    last_stage: float | None  # its last stage's completion


class Timeline:
    """The driver's milestones (:meth:`mark`) and, given the session, Spark's (:meth:`report`)."""

    def __init__(self, origin: float | None = None):
        """``origin``: the epoch second the process started (default: from ``/proc``; now where unknown)."""
        age = process_age()
        self.origin = origin if origin is not None else time.time() - (0.0 if math.isnan(age) else age)
        self.marks: list[tuple[str, float]] = []

    def mark(self, name: str, at: float | None = None) -> None:
        """``name`` happened now (or at the epoch second ``at``)."""
        self.marks.append((name, time.time() if at is None else at))

    def since(self, at: float) -> float:
        return at - self.origin

    def report(self, sc: Any) -> list[str]:
        """The ``--stats`` lines: every milestone in time order, seconds since the process started, then
        each Spark job's group, submission, first task, completion and Spark duration."""
        events = list(self.marks)
        started = app_start(sc)
        if started is not None:
            events.append(("Spark application started (SparkContext)", started))
        events += [(f"executor {e} registered", at) for e, at in executors_added(sc)]
        jobs = spark_jobs(sc)
        lines = ["timeline (s since the process started):"]
        lines += [f"  {self.since(at):8.2f}  {name}" for name, at in sorted(events, key=lambda e: e[1])]
        if jobs:
            lines.append(f"  {'job':>5}  {'submitted':>9}  {'1st task':>8}  {'done':>8}  {'Spark s':>7}  group")
        for j in jobs:
            lines.append(f"  {j.job:>5}  {self._at(j.submitted):>9}  {self._at(j.first_task):>8}  {self._at(j.completed):>8}"
                         f"  {_seconds(duration([j])):>7}  {j.group}")
        return lines

    def _at(self, at: float | None) -> str:
        return "-" if at is None else f"{self.since(at):.2f}"


def duration(jobs: list[SparkJob]) -> float | None:
    """Spark's duration of ``jobs`` together: the first one's first stage submitted to the last stage completed."""
    starts = [j.first_stage for j in jobs if j.first_stage is not None]
    ends = [j.last_stage for j in jobs if j.last_stage is not None]
    return max(ends) - min(starts) if starts and ends else None


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _settle(sc: Any) -> None:
    """Wait (a while at most) until Spark's listeners have taken in every event so far: the status store
    is updated from the listener bus, after a job's end returns to the driver."""
    try:
        sc._jsc.sc().listenerBus().waitUntilEmpty(SETTLE_MS)
    except Exception:  # (a timeout, or a Spark without it: the store as it is)
        pass


def _epoch(option: Any) -> float | None:
    """A Scala ``Option[java.util.Date]`` as epoch seconds."""
    return option.get().getTime() / 1e3 if option.isDefined() else None


def _items(seq: Any) -> list[Any]:
    return [seq.apply(i) for i in range(seq.size())]


def app_start(sc: Any) -> float | None:
    """When the Spark application (the SparkContext) started, epoch seconds."""
    try:
        return sc.startTime / 1e3
    except Exception:
        return None


def executors_added(sc: Any) -> list[tuple[str, float]]:
    """``(executor id, epoch seconds)`` of each executor's registration (the driver's entry left out)."""
    _settle(sc)
    store = sc._jsc.sc().statusStore()
    return sorted(((e.id(), e.addTime().getTime() / 1e3) for e in _items(store.executorList(False))
                   if e.id() != "driver"), key=lambda e: e[1])


def spark_jobs(sc: Any) -> list[SparkJob]:
    """Every job of the session so far, in job order, with its times (:class:`SparkJob`)."""
    _settle(sc)
    store = sc._jsc.sc().statusStore()
    quantiles = sc._gateway.new_array(sc._jvm.double, 0)
    out = []
    for j in sorted(_items(store.jobsList(None)), key=lambda j: j.jobId()):
        first_task, first_stage, last_stage = [], [], []
        for sid in _items(j.stageIds()):
            attempts = store.stageData(sid, False, None, False, quantiles)
            if attempts.isEmpty() or str(attempts.head().status()) == "SKIPPED":
                continue
            s = attempts.head()
            first_task += [t for t in [_epoch(s.firstTaskLaunchedTime())] if t is not None]
            first_stage += [t for t in [_epoch(s.submissionTime())] if t is not None]
            last_stage += [t for t in [_epoch(s.completionTime())] if t is not None]
        group = j.jobGroup().get() if j.jobGroup().isDefined() else \
            j.description().get() if j.description().isDefined() else j.name()
        out.append(SparkJob(j.jobId(), str(group).removeprefix("yfpp: "), _epoch(j.submissionTime()),
                            min(first_task, default=None), _epoch(j.completionTime()), min(first_stage, default=None),
                            max(last_stage, default=None)))
    return out
