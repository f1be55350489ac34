"""Jobs that ship themselves (:mod:`yfpp.spark.shipping`): on a cluster whose executors' Python lacks yfpp,
``yfpp spark`` sends its packages and gives ``yfpp run``'s matches; a missing dependency is one error line.

The executors' Python is a wrapper (``PYSPARK_PYTHON``) that runs this Python isolated (``-I -S``: no
PYTHONPATH, no ``.pth`` files — so not the editable install of yfpp) with site-packages on its path, and can
hide modules (``YFPP_TEST_HIDE``). The cluster is ``local-cluster[1,1,1024]``: a standalone master and worker
whose executor is a JVM of its own, with Python workers of its own.
"""

from __future__ import annotations

import os
import site
import socket
import subprocess
import sys
import types
import zipfile
from collections import Counter
from pathlib import Path

import pytest

pytest.importorskip("pyspark", reason="pyspark is not installed (pip install '.[spark]')")

from tests.spark_jvm import EXECUTOR_CONF  # noqa: E402
from yfpp.input.generate import generate_rfid, write_events  # noqa: E402
from yfpp.errors import YfppError  # noqa: E402
from yfpp.spark import shipping  # noqa: E402
from yfpp.spark.shipping import _why, check_workers, package_zip, registered_executors, ships  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
QUERY = "[tag_id]&&//shelf//!register//exit&&(1 hour)"
RUNNER = f"""\
import os, runpy, sys
sys.path += {site.getsitepackages()!r}  # without their .pth files: no editable install of yfpp
hide = set(filter(None, os.environ.get("YFPP_TEST_HIDE", "").split(",")))

class Hide:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in hide:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None

sys.meta_path.insert(0, Hide())
args = sys.argv[1:]
while args[0] != "-m":  # Spark starts "python -m pyspark.daemon" (maybe with flags)
    args.pop(0)
sys.argv = [args[1], *args[2:]]
runpy.run_module(args[1], run_name="__main__", alter_sys=True)
"""


class _HereContext:
    """A SparkContext stand-in whose one "executor" is this process: ``parallelize(...).map(f).collect()`` runs ``f``."""

    defaultParallelism = 1

    def setJobDescription(self, text):
        self.description = text

    def setLocalProperty(self, key, value):
        pass

    def parallelize(self, data, slices):
        return self

    def map(self, f):
        self.f = f
        return self

    def collect(self):
        return [self.f(0)]


class _HereSession:
    """A SparkSession stand-in whose one "executor" is this process: ``range(...).mapInArrow(f, …).collect()``
    runs ``f``."""

    def __init__(self):
        self.sparkContext = _HereContext()

    def range(self, n, numPartitions):
        return self

    def mapInArrow(self, f, schema):
        self.f = f
        return self

    def collect(self):
        return [types.SimpleNamespace(**row) for batch in self.f(iter(())) for row in batch.to_pylist()]


def test_the_check_loads_what_the_jobs_tasks_use_in_the_python_worker_it_runs_in():
    from yfpp.spark import line_scan

    line_scan._kernels.cache_clear()
    warmed = check_workers(_HereSession())
    assert [r["worker"] for r in warmed] == [f"{socket.gethostname()}:{os.getpid()}"]
    assert "yfpp.spark.scan" in sys.modules and line_scan._kernels.cache_info().currsize == 1
    kernels = line_scan._kernels()
    assert kernels is None or (kernels.scan.signatures and kernels.group.signatures)  # (None: no numba here)


def test_a_check_whose_sql_job_cannot_run_names_what_is_missing_from_a_plain_job(monkeypatch):
    """A worker without pyarrow (or pandas) fails the SQL job before the probe runs: a plain RDD job then says
    what is missing; where nothing is, the job goes on with no worker warmed."""

    class NoArrow(_HereSession):
        def collect(self):
            raise RuntimeError("Python worker exited unexpectedly: No module named 'pyarrow'")

    assert check_workers(NoArrow()) == []
    monkeypatch.setattr(shipping, "NEEDED", (*shipping.NEEDED, "yfpp_no_such_module"))
    with pytest.raises(YfppError, match=r"^the executors' Python lacks yfpp_no_such_module \(Python "):
        check_workers(NoArrow())


def test_the_probe_names_a_deleted_working_directory(tmp_path, monkeypatch):
    """An executor's Python worker whose working directory is gone cannot import anything (Spark puts ``.`` on
    its ``sys.path``): the check says so and where, not which module failed first."""
    spark = _HereSession()
    check_workers(spark)  # (here everything imports)
    gone = tmp_path / "executor-0"
    gone.mkdir()
    monkeypatch.chdir(gone)
    gone.rmdir()
    with pytest.raises(YfppError, match=r"^the executors run Python in a deleted working directory \(.*executor-0\): "
                                        r"the executor's work folder was removed while the application ran"):
        check_workers(spark)


def test_ships_only_to_masters_whose_python_runs_apart():
    assert not any(ships(m) for m in ("local", "local[4]", "local[*]", "local[2,3]"))
    assert all(ships(m) for m in ("local-cluster[1,1,1024]", "spark://host:7077", "yarn", "k8s://https://h:6443"))


def test_the_zip_is_cached_by_content(tmp_path):
    path = package_zip(str(tmp_path))
    assert package_zip(str(tmp_path)) == path and os.listdir(tmp_path) == [os.path.basename(path)]
    names = zipfile.ZipFile(path).namelist()
    assert "yfpp/engine.py" in names and "yfpp/spark/shipping.py" in names and "xpath_ext/__init__.py" in names
    assert not [n for n in names if n.endswith(".pyc") or "__pycache__" in n]


def test_an_executor_parses_queries_from_the_shipped_zip(tmp_path):
    """The grammars and their saved tables are read from the zip (package resources, not paths beside a module)."""
    path = package_zip(str(tmp_path))
    code = (f"import sys; sys.path[:0] = [{path!r}, *{site.getsitepackages()!r}]\n"
            "import yfpp; from yfpp.engine import Engine; from yfpp.language import sase_parser\n"
            "e = Engine(); e.register('PATTERN SEQ(a x, b y) WITHIN 3'); e.register('//a//b&&(3)')\n"
            "print(yfpp.__file__, len(e.queries), sase_parser._PARSER.source_path)")
    out = subprocess.run([sys.executable, "-I", "-S", "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [os.path.join(path, "yfpp", "__init__.py"), "2", "<deserialized>"]


def test_the_check_job_reaches_every_executor_in_the_python_workers_the_plans_use(spark):
    """The check's tasks run on both executors of the shared session, in the Python workers of SQL jobs: those
    a plan's ``mapInArrow`` tasks are given next are children of the same daemons."""
    warmed = check_workers(spark)
    assert len({r["executor"] for r in warmed}) == registered_executors(spark.sparkContext) == 2

    def task(batches):
        import os
        import socket

        import pyarrow as pa

        for _ in batches:
            pass
        yield pa.RecordBatch.from_pydict({"executor": [f"{socket.gethostname()}:{os.getppid()}"]})

    rows = spark.range(4, numPartitions=4).mapInArrow(task, "executor string").collect()
    assert {r.executor for r in rows} <= {r["executor"] for r in warmed}


def test_why_the_executors_python_did_not_run_is_one_line():
    mismatch = ("An error occurred while calling o41.collectAndServe.\n: org.apache.spark.SparkException: Job aborted\n"
                "pyspark.errors.exceptions.base.PySparkRuntimeError: [PYTHON_VERSION_MISMATCH] Python in worker has "
                "different version: 3.10 than that in driver: 3.11, PySpark cannot run with different minor versions.\n"
                "Please check environment variables PYSPARK_PYTHON and PYSPARK_DRIVER_PYTHON are correctly set.\n")
    assert _why(mismatch) == ("Python in worker has different version: 3.10 than that in driver: 3.11, "
                              "PySpark cannot run with different minor versions")
    assert _why('x\njava.io.IOException: Cannot run program "/no/python": error=2, No such file or directory\n\tat y') \
        == 'Cannot run program "/no/python": error=2, No such file or directory'
    assert _why("An error occurred\norg.apache.spark.SparkException: Python worker exited unexpectedly\n\tat x") \
        == "Python worker exited unexpectedly"


@pytest.fixture(scope="module")
def worker_python(tmp_path_factory) -> Path:
    """A Python for the executors that cannot import yfpp (checked)."""
    d = tmp_path_factory.mktemp("worker")
    (d / "runner.py").write_text(RUNNER)
    wrapper = d / "python"
    wrapper.write_text(f'#!/bin/sh\nexec {sys.executable} -I -S {d / "runner.py"} "$@"\n')
    wrapper.chmod(0o755)
    probe = subprocess.run([str(wrapper), "-m", "yfpp"], capture_output=True, text=True, timeout=60, cwd=d)
    assert probe.returncode != 0 and "No module named yfpp" in probe.stderr
    assert subprocess.run([str(wrapper), "-m", "pyspark.find_spark_home"], capture_output=True, timeout=60).returncode == 0
    return wrapper


def spark_job(worker_python: Path, tmp_path: Path, feed: Path, out: Path, *args: str,
              **env: str) -> subprocess.CompletedProcess:
    """``yfpp spark`` on ``local-cluster[1,1,1024]`` with executors' Python ``worker_python`` (``args``: more of
    its arguments); bounded in time."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYSPARK_PYTHON": str(worker_python),
           "XDG_CACHE_HOME": str(tmp_path / "cache"), **env}
    return subprocess.run([sys.executable, "-m", "yfpp", "spark", "-q", QUERY, "-i", str(feed), "-o", str(out),
                           "--master", "local-cluster[1,1,1024]", "--conf", "spark.executor.memory=512m",
                           "--conf", "spark.task.maxFailures=1", *EXECUTOR_CONF, *args], cwd=tmp_path, env=env,
                          capture_output=True,
                          text=True, timeout=400)


def kernel_cache(cache: Path) -> dict[str, int]:
    """The files of numba's cache of the line scan's kernels under ``cache`` (``$XDG_CACHE_HOME``), and when each
    was last written."""
    return {str(p.relative_to(cache)): p.stat().st_mtime_ns for p in (cache / "yfpp" / "kernels").glob("*/__pycache__/*.nb*")}


def test_a_worker_without_yfpp_gets_it_shipped(worker_python, tmp_path):
    feed = tmp_path / "feed.jsonl"
    write_events(generate_rfid(1000, tags=8, gap=12, seed=5), feed)
    done = spark_job(worker_python, tmp_path, feed, tmp_path / "out")
    assert done.returncode == 0, done.stderr[-3000:]
    expected = subprocess.run([sys.executable, "-m", "yfpp", "run", "-q", QUERY, "-i", str(feed)], capture_output=True,
                              text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)}).stdout
    got = Counter(ln for f in sorted((tmp_path / "out" / "matches.jsonl").glob("part-*")) for ln in f.read_text().splitlines())
    assert got == Counter(expected.splitlines()) and got
    assert len(list((tmp_path / "cache" / "yfpp" / "pyfiles").glob("yfpp-*.zip"))) == 1
    compiled = kernel_cache(tmp_path / "cache")  # the line scan's kernels, compiled beside their copy in the cache
    assert any(name.endswith(".nbc") for name in compiled) and not (tmp_path / "cache" / "numba").exists()

    again = spark_job(worker_python, tmp_path, feed, tmp_path / "out4", "--stats")  # a second application
    assert again.returncode == 0, again.stderr[-3000:]
    assert "\nwarm workers      1 of 1\n" in again.stderr
    assert kernel_cache(tmp_path / "cache") == compiled  # loaded from numba's cache: nothing compiled or written
    assert Counter(ln for f in sorted((tmp_path / "out4" / "matches.jsonl").glob("part-*"))
                   for ln in f.read_text().splitlines()) == got

    slower = spark_job(worker_python, tmp_path, feed, tmp_path / "out3", YFPP_TEST_HIDE="numba")
    assert slower.returncode == 0, slower.stderr[-3000:]
    assert "yfpp: note: the executors' Python lacks numba (optional: " in slower.stderr
    assert Counter(ln for f in sorted((tmp_path / "out3" / "matches.jsonl").glob("part-*"))
                   for ln in f.read_text().splitlines()) == got

    missing = spark_job(worker_python, tmp_path, feed, tmp_path / "out2", YFPP_TEST_HIDE="orjson,lark")
    assert missing.returncode == 2
    line = missing.stderr.strip().splitlines()[-1]
    assert line.startswith("yfpp: error: the executors' Python lacks orjson, lark (Python "), line
    assert "pip install orjson lark" in line and not (tmp_path / "out2").exists()
