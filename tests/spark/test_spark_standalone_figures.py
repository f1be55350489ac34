"""``spark_standalone.py``'s reading of a ``yfpp spark --stats`` run: the figures of each row, and the timeline it prints."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

pytest.importorskip("pyspark", reason="pyspark is not installed (pip install '.[spark]')")
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from spark_standalone import job_figures, timeline_lines  # noqa: E402

#: The stderr of a job over 1,000 events (the lines the script reads, and some it does not).
STATS = """\
events            1,000
elapsed           12.500 s
events/s          80
dead letters      0
matches per query:
  shoplifting              7
plan              scan (2 matching tasks)
rows per task (matching):
  task 0                 600 rows      4 engines     0.250 s
  task 1                 400 rows      4 engines     0.125 s
time per step:                                   wall s   CPU s: driver    JVM  Python workers
  all steps                                       24.46           1.33  13.72            0.21
process CPU s (driver + JVM + Python workers on this machine)  16.6
timeline (s since the process started):
      0.44  driver: imports done, the JVM starting
      2.80  driver JVM up (its gateway answers)
     14.14  executor 0 registered
    job  submitted  1st task      done  Spark s  group
      0      15.21     15.36     18.74     3.47  check the executors' Python
      1      22.05     22.12     26.66     4.58  scan: read + match, 2 tasks; write jsonl
matching job      4.580 s  (Spark's duration of the step 'scan: read + match, 2 tasks; write jsonl': its first stage submitted to its last stage completed)
stop session                         1.08  (wall s, after the steps; 0.2 CPU s; stopped 35.70 s after the process started)
process CPU s, the whole run  14.2
"""


def test_a_rows_figures_are_read_from_the_stats():
    assert job_figures(STATS) == {"events": 1000, "elapsed": 12.5, "spark": 4.58, "driver": 14.2, "tasks": 0.375}


def test_without_the_matching_job_line_its_duration_is_nan_and_a_missing_count_is_named():
    without = "\n".join(ln for ln in STATS.splitlines() if not ln.startswith("matching job"))
    assert math.isnan(job_figures(without)["spark"])
    with pytest.raises(ValueError, match="^no elapsed line"):
        job_figures(STATS.replace("elapsed  ", "took  "))


def test_the_timeline_is_the_block_and_when_the_session_stopped():
    lines = timeline_lines(STATS)
    assert lines[0] == "      0.44  driver: imports done, the JVM starting"
    assert lines[-2] == "      1      22.05     22.12     26.66     4.58  scan: read + match, 2 tasks; write jsonl"
    assert lines[-1] == "     35.70  session stopped"
    assert len(lines) == 3 + 3 + 1
