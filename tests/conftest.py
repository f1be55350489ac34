"""Shared fixtures: one Spark session per test process, on a real multi-process cluster.

``local-cluster[2,1,1024]`` starts a standalone master and two workers (one
core each) inside the driver's JVM; each worker launches its executor as a
separate JVM whose working directory is its own work folder — not the
driver's, so a relative input path only works if the driver resolves it. Its JVMs run with
``tests.spark_jvm.CHEAP_JVM`` (the C1 compiler only: less CPU for jobs of seconds).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def spark():
    """A Spark session on ``local-cluster[2,1,1024]``, started when a test first needs it and kept for the
    process's other tests. Under pytest-xdist (the README's ``-n 2``) the Spark tests are spread over the
    workers like the rest, and each worker starts its own session when it first needs one (keeping them all in
    one worker, with one session, made the whole suite slower on 2 cores: 25 min against 20.7)."""
    pytest.importorskip("pyspark", reason="pyspark is not installed (pip install '.[spark]')")
    import pyspark
    from pyspark.sql import SparkSession

    from tests.spark_jvm import CHEAP_JVM

    session = (SparkSession.builder.master("local-cluster[2,1,1024]").appName("yfpp-tests")
               .config("spark.driver.extraJavaOptions", CHEAP_JVM).config("spark.executor.extraJavaOptions", CHEAP_JVM)
               .config("spark.executor.memory", "512m").config("spark.driver.memory", "1g")
               .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.shuffle.partitions", "4").config("spark.task.maxFailures", "1")
               .getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    app = session.sparkContext.applicationId
    yield session
    session.stop()
    work = Path(os.path.dirname(pyspark.__file__)) / "work" / app  # the executors' folders
    if not _worked_in(work):
        shutil.rmtree(work, ignore_errors=True)


def _worked_in(folder: Path) -> bool:
    """Whether a live process has its working directory in ``folder``. An application id is the second its
    master took it (``app-YYYYMMDDhhmmss-0000``), so another test run's cluster (another clone's suite on
    the same Python) may have the same id and run its executors in these folders: they stay then."""
    inside = str(folder) + os.sep
    for pid in filter(str.isdigit, os.listdir("/proc") if os.path.isdir("/proc") else ()):
        try:
            if (os.readlink(f"/proc/{pid}/cwd") + os.sep).startswith(inside):
                return True
        except OSError:
            continue
    return False
