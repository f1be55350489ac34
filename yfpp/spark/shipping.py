"""Jobs that ship themselves: yfpp's pure-Python packages sent to the executors at job start.

With yfpp installed on the driver only, ``yfpp spark --master spark://…``
zips the installed packages (:data:`PACKAGES`, as the driver imports them),
caches the zip under ``$XDG_CACHE_HOME/yfpp/pyfiles`` (``~/.cache``), named by
yfpp's version and a hash of the files' names and contents — the next run
with the same code reuses it — and hands it to ``SparkContext.addPyFile``:
every executor's Python finds yfpp there, ahead of any copy installed on the
worker, so driver and executors run the same code.

What cannot be shipped — the compiled libraries (lxml, orjson, pyarrow…) and
Python itself — must be on the workers already. A one-task-per-core job checks
that before the real job starts (:func:`check_workers`), and a missing piece is
one ``yfpp: error:`` line that names it; a missing optional one (:data:`OPTIONAL`)
one ``yfpp: note:`` line, and the job runs without it. The same tasks warm the
executors' Python workers for the job: they import the plans' modules and load
the line scan's kernels, in the workers the job's tasks then reuse. Local masters (``local``,
``local[N]``) run their Python workers on this machine, with the driver's
packages: nothing is shipped or checked.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import re
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from typing import Any, Callable

from yfpp._version import __version__
from yfpp.errors import YfppError
from yfpp.spark.machine_cache import cache_folder

#: The packages shipped to the executors (pure Python).
PACKAGES = ("yfpp", "xpath_ext")
#: What the executors' Python must have installed (import names: yfpp's dependencies, PySpark's Arrow and pandas).
NEEDED = ("lxml", "orjson", "elementpath", "lark", "networkx", "pyarrow", "pandas")
#: The check job's description (Spark's UI, ``--stats``' timeline).
CHECK_JOB = "check the executors' Python"
#: What the check's tasks import after :data:`PACKAGES`, for the job's tasks to find loaded: the plans' modules.
WARM_MODULES = ("yfpp.spark.scan",)
#: What speeds the executors up where installed, and what it is for.
OPTIONAL = {"numba": "the scan plan's read tasks then parse every JSON line rather than ship plain ones unparsed"}


def ships(master: str) -> bool:
    """Do the executors of ``master`` run their Python apart from the driver's packages (not ``local[…]``)?"""
    return not re.fullmatch(r"local(\[[^\]]*\])?", master)


def ship_packages(spark: Any, mark: Callable[[str], None] = lambda _: None) -> Warm | None:
    """Add the packages' zip (:func:`package_zip`) to the session's Python path on every executor and
    check and warm the workers (:func:`check_workers`), unless the master is local; what the check reached,
    or None. ``mark``: told when the zip is added and when the workers are checked (``--stats``' timeline)."""
    sc = spark.sparkContext
    if not ships(sc.master):
        return None
    sc.addPyFile(package_zip())
    mark("yfpp's zip added to the session")
    warmed = check_workers(spark)
    mark("the executors' Python checked (check job done)")
    return Warm(len({r["executor"] for r in warmed}), registered_executors(sc))


def registered_executors(sc: Any) -> int:
    """The executors registered with the driver now (Spark's list of them holds the driver too)."""
    return max(len(sc._jsc.sc().statusTracker().getExecutorInfos()) - 1, 0)


def package_files() -> list[tuple[str, str]]:
    """``(name in the zip, file)`` of every file of :data:`PACKAGES` as installed (compiled ``.pyc`` left
    out), in name order."""
    found = []
    for name in PACKAGES:
        root = os.path.dirname(importlib.import_module(name).__file__ or "")
        base = os.path.dirname(root)
        for folder, dirs, files in os.walk(root):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            found += [(os.path.relpath(os.path.join(folder, f), base).replace(os.sep, "/"), os.path.join(folder, f))
                      for f in files if not f.endswith((".pyc", ".pyo"))]
    return sorted(found)


def package_zip(cache: str | None = None) -> str:
    """The zip of :func:`package_files`, built once per version and content under ``cache`` (default
    ``$XDG_CACHE_HOME/yfpp/pyfiles``; a temporary folder when that cannot be written)."""
    files = package_files()
    digest = hashlib.sha256()
    contents = []
    for arcname, path in files:
        with open(path, "rb") as f:
            data = f.read()
        digest.update(arcname.encode() + b"\0" + len(data).to_bytes(8, "big") + data)
        contents.append((arcname, data))
    name = f"yfpp-{__version__}-{digest.hexdigest()[:16]}.zip"
    folder = cache or cache_folder("pyfiles")
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError:
        folder = tempfile.gettempdir()
    target = os.path.join(folder, name)
    if os.path.exists(target):
        return target
    fd, tmp = tempfile.mkstemp(dir=folder, suffix=".zip.part")
    with os.fdopen(fd, "wb") as out, zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
        for arcname, data in contents:
            z.writestr(zipfile.ZipInfo(arcname, (1980, 1, 1, 0, 0, 0)), data, zipfile.ZIP_DEFLATED)
    os.replace(tmp, target)  # (another run building the same zip at once writes the same bytes)
    return target


@dataclass(frozen=True)
class Warm:
    """What the check job reached: the executors whose Python workers ran it and loaded what the job's tasks
    use, of those registered."""

    reached: int
    registered: int

    def line(self) -> str:
        """The ``--stats`` line."""
        return f"warm workers      {self.reached} of {self.registered}"


def check_workers(spark: Any) -> list[dict]:
    """Run a task per core that imports what the job needs on the executors (:data:`NEEDED`, then the
    shipped :data:`PACKAGES`) and loads what the job's tasks use (:data:`WARM_MODULES`, the line scan's
    kernels); raise :class:`YfppError` with one line naming what is missing, or why the executors' Python
    did not run. A missing :data:`OPTIONAL` module is a note on stderr. The reports of the Python workers
    warmed (:func:`_probe`).

    The tasks are a SQL job's, ``mapInArrow`` as the plans' are: a Python worker ends its task and waits,
    loaded, for the next task of the same kind on its executor (Spark keeps a SQL job's Python workers apart
    from a plain RDD job's), so the job's first tasks find it warm. Where that job fails (no pyarrow or pandas
    there, no Python) or a worker reports a problem, a plain RDD job asks again and says which."""
    sc = spark.sparkContext
    probe = _probe(NEEDED, PACKAGES, tuple(OPTIONAL), WARM_MODULES)
    n = max(sc.defaultParallelism, 1)
    sc.setJobDescription(CHECK_JOB)
    try:
        try:
            reports = _sql_job(spark, probe, n)
        except Exception:  # (the plain job below says why)
            reports = []
        warmed = [r for r in reports if not (r["missing"] or r["broken"])]
        if not reports or any(r["missing"] or r["broken"] for r in reports):
            # (asked again: a worker that started badly once is not the executors' Python)
            reports = [json.loads(r) for r in sc.parallelize(range(n), n).map(probe).collect()]
    except Exception as e:
        raise YfppError(f"cannot run Python on the executors: {_why(str(e))}") from None
    finally:
        sc.setLocalProperty("spark.job.description", None)
    for r in reports:
        where = f"Python {r['python']} on {r['host']}"
        missing = r["missing"]
        if missing:
            raise YfppError(f"the executors' Python lacks {', '.join(missing)} ({where}): install "
                            f"{'it' if len(missing) == 1 else 'them'} there (pip install {' '.join(missing)}), or set "
                            f"spark.pyspark.python (PYSPARK_PYTHON) to a Python that has {'it' if len(missing) == 1 else 'them'}")
        if r["broken"]:
            raise YfppError(f"the executors {r['broken']} ({where})")
    lacking = sorted({m for r in reports for m in r["lacking"]})
    if lacking:
        print(f"yfpp: note: the executors' Python lacks {', '.join(lacking)} (optional: "
              f"{'; '.join(OPTIONAL[m] for m in lacking)}; pip install {' '.join(lacking)} there to speed them up)",
              file=sys.stderr)
    return warmed


def _sql_job(spark: Any, probe: Callable[[Any], str], n: int) -> list[dict]:
    """The reports of ``probe`` run by ``n`` tasks of a ``mapInArrow`` job."""
    from pyspark.sql.types import StringType, StructField, StructType

    def task(batches: Any) -> Any:  # (pickled by value, as the probe)
        import pyarrow as pa

        for _ in batches:
            pass
        yield pa.RecordBatch.from_pydict({"report": [probe(None)]})

    rows = spark.range(n, numPartitions=n).mapInArrow(task, StructType([StructField("report", StringType())])).collect()
    return [json.loads(row.report) for row in rows]


def _probe(needed: tuple[str, ...], packages: tuple[str, ...], optional: tuple[str, ...],
           warm_modules: tuple[str, ...]) -> Callable[[Any], str]:
    """The check's task: a report (JSON) of the Python worker that runs it — its host and Python, the
    worker (host and process id) and its executor (the host and the parent process: an executor's Python
    workers are children of its one daemon), the ``needed`` modules missing, what did not import
    (``broken``), the ``optional`` ones lacking; where nothing is missing, ``packages`` and ``warm_modules``
    imported and the line scan's kernels loaded."""

    # (pickled by value: runs before yfpp is known there)
    def probe(_: Any) -> str:
        import importlib
        import importlib.util
        import json
        import os
        import platform
        import socket

        host = socket.gethostname()
        report = {"host": host, "python": platform.python_version(), "worker": f"{host}:{os.getpid()}",
                  "executor": f"{host}:{os.getppid()}", "missing": [], "broken": None, "lacking": []}
        try:
            os.getcwd()
        except FileNotFoundError:  # (every import would fail: Spark puts the worker's folder, ".", on sys.path)
            try:
                where = os.readlink("/proc/self/cwd").removesuffix(" (deleted)")
            except OSError:
                where = "unknown"
            report["broken"] = f"run Python in a deleted working directory ({where}): the executor's work " \
                               "folder was removed while the application ran"
            return json.dumps(report)
        for module in optional:
            try:
                if importlib.util.find_spec(module) is None:
                    report["lacking"].append(module)
            except ImportError:
                report["lacking"].append(module)
        for module in needed:
            try:
                importlib.import_module(module)
            except ModuleNotFoundError:
                report["missing"].append(module)
            except Exception as e:  # (there, but it does not import: say why)
                report["broken"] = report["broken"] or f"cannot import {module}: {type(e).__name__}: {e}"
        if not report["missing"] and report["broken"] is None:
            for module in packages + warm_modules:
                try:
                    importlib.import_module(module)
                except Exception as e:
                    report["broken"] = f"cannot import {module}: {type(e).__name__}: {e}"
                    break
            else:
                try:
                    importlib.import_module("yfpp.spark.line_scan").warm()
                except Exception as e:
                    report["broken"] = f"cannot load the line scan's kernels: {type(e).__name__}: {e}"
        return json.dumps(report)

    return probe


def _why(text: str) -> str:
    """The line of a failed probe job's error that says why: a Python version mismatch, a Python that
    would not start, or the message's first line."""
    for pattern in (r"\[PYTHON_VERSION_MISMATCH\] (.+?)(?:\.\s|\n|$)", r"(Cannot run program \"[^\"]*\"[^\n]*)",
                    r"^[\w.$]*(?:Error|Exception): (.+)$"):
        m = re.search(pattern, text, re.MULTILINE)
        if m:
            return m.group(1).strip()
    return next((ln.strip() for ln in text.splitlines() if ln.strip()), "unknown error")


