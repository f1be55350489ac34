"""``--stats``' timeline (:mod:`yfpp.spark.timeline`): the driver's milestones and Spark's — executors registered,
jobs submitted, first tasks launched, jobs done — in seconds since the process started, and a step's Spark duration."""

from __future__ import annotations

import re
import time

import pytest

pytest.importorskip("pyspark", reason="pyspark is not installed (pip install '.[spark]')")

from yfpp.spark.costs import Steps  # noqa: E402
from yfpp.spark.timeline import SparkJob, Timeline, duration, executors_added, spark_jobs  # noqa: E402


def test_a_steps_spark_duration_runs_from_its_first_stage_submitted_to_its_last_completed():
    jobs = [SparkJob(1, "g", 10.0, 10.5, 14.0, first_stage=10.1, last_stage=13.9),
            SparkJob(2, "g", 14.2, 14.3, 20.0, first_stage=14.25, last_stage=19.5)]
    assert duration(jobs) == pytest.approx(19.5 - 10.1)
    assert duration([SparkJob(3, "g", 1.0, None, None, None, None)]) is None  # no stage ran (all skipped)
    assert duration([]) is None


def test_the_timeline_has_the_executors_the_jobs_and_the_marks_in_time_order(spark):
    sc = spark.sparkContext
    timeline = Timeline(origin=sc.startTime / 1e3 - 1.0)  # (the session may be older than this test)
    timeline.mark("before the step")
    steps = Steps(spark)
    started = time.time()
    with steps.step("count in two stages"):
        spark.range(1000, numPartitions=3).repartition(2).count()
    took = time.time() - started
    timeline.mark("after the step")

    mine = [j for j in spark_jobs(sc) if j.group == "count in two stages"]
    assert mine, spark_jobs(sc)
    for j in mine:
        assert j.submitted is not None and j.completed is not None and j.first_task is not None
        assert started - 0.5 <= j.submitted <= j.first_task <= j.completed <= started + took + 0.5
        assert j.first_stage is not None and j.last_stage is not None and j.first_stage <= j.last_stage
    assert 0 < duration(mine) <= took + 0.5
    added = executors_added(sc)  # local-cluster[2, …]: the job's first task ran on one registered before it
    assert 1 <= len(added) <= 2 and min(at for _, at in added) <= min(j.first_task for j in mine)

    lines = timeline.report(sc)
    assert lines[0] == "timeline (s since the process started):"
    marks = [ln for ln in lines[1:] if re.match(r" +\d+\.\d\d  [^\d\s]", ln)]  # (not the jobs' rows)
    seconds = [float(ln.split()[0]) for ln in marks]
    assert seconds == sorted(seconds) and seconds[0] >= 0
    names = [ln.split(None, 1)[1] for ln in marks]
    assert names.index("before the step") < names.index("after the step")
    assert sum(n.startswith("executor ") and n.endswith(" registered") for n in names) >= len(added)
    assert "Spark application started (SparkContext)" in names
    rows = [ln for ln in lines if ln.endswith("count in two stages")]
    assert len(rows) == len(mine)
    assert all(float(r.split()[3]) >= float(r.split()[1]) for r in rows)  # done after submitted
