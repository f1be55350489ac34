"""Shared fixtures: one Spark session per test session, on a real multi-process cluster.

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


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under pytest-xdist (the README's ``-n 2 --dist loadgroup``), every test that uses Spark runs in one
    worker, in turn, so that one Spark session serves them all; the other worker takes the rest."""
    if not config.pluginmanager.hasplugin("xdist"):
        return
    for item in items:
        if "spark" in getattr(item, "fixturenames", ()) or item.path.parent.name == "spark":
            item.add_marker(pytest.mark.xdist_group("spark"))


@pytest.fixture(scope="session")
def spark():
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
