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
from typing import Any, Iterator, Sequence

from yfpp.spark.machine_cache import cache_folder

#: The driver JVM's options when ``yfpp spark`` starts it: the C1 compiler only (C2's compile
#: threads cost more CPU than they save in a job of seconds to minutes — in local mode the data
#: passes through this JVM, see docs/spark.md "Where the time goes") and the serial collector
#: (no parallel GC threads competing with the Python workers for the cores).
DRIVER_JAVA_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


#: Keeps the JVM quiet about class-data sharing: a stale or foreign archive is ignored without a warning,
#: and writing one does not list the classes it leaves out.
_QUIET_CDS = "-Xlog:cds=off,cds+dynamic=off"
#: The settings that change the driver JVM's class path: an archive is kept per value of them.
_CLASS_PATH_CONFS = ("spark.jars", "spark.jars.packages", "spark.driver.extraClassPath")


def driver_java_options(class_archive: str | None = None, writing: str | None = None) -> str:
    """:data:`DRIVER_JAVA_OPTIONS`, with ``class_archive`` a class-data-sharing archive of the classes
    the JVM loads: used when the file exists, else written when the JVM exits — to ``writing`` if given
    (a temporary name, see :class:`ClassArchive`), else to ``class_archive`` itself (JDK ≥ 13; a stale or
    foreign archive is ignored by the JVM)."""
    if not class_archive:
        return DRIVER_JAVA_OPTIONS
    if os.path.isfile(class_archive):
        return f"{DRIVER_JAVA_OPTIONS} {_QUIET_CDS} -XX:SharedArchiveFile={os.path.abspath(class_archive)}"
    return f"{DRIVER_JAVA_OPTIONS} {_QUIET_CDS} -XX:ArchiveClassesAtExit={os.path.abspath(writing or class_archive)}"


def default_class_archive(confs: dict[str, str]) -> str | None:
    """The cached class-data-sharing archive of ``yfpp spark``'s driver JVM: under ``$XDG_CACHE_HOME/yfpp``
    (``~/.cache/yfpp``), named by what the archive depends on — PySpark's version and jars, the ``java``
    found (``JAVA_HOME`` or ``PATH``), the JVM options and the class-path settings in ``confs`` (``--conf``
    values) — so a new PySpark, Java or class path gets an archive of its own. None when the folder
    cannot be made."""
    import hashlib
    import shutil

    import pyspark

    java_home = os.environ.get("JAVA_HOME")
    java = os.path.join(java_home, "bin", "java") if java_home else shutil.which("java")
    jars = os.path.join(os.path.dirname(pyspark.__file__), "jars")
    parts = [pyspark.__version__, jars, os.path.realpath(java) if java else "", DRIVER_JAVA_OPTIONS]
    for path in (java, jars):
        try:
            parts.append(str(os.stat(os.path.realpath(path)).st_mtime_ns) if path else "")
        except OSError:
            parts.append("")
    parts += [f"{k}={confs.get(k, '')}" for k in _CLASS_PATH_CONFS]
    key = hashlib.blake2b("\0".join(parts).encode(), digest_size=8).hexdigest()
    folder = cache_folder()
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError:
        return None
    return os.path.join(folder, f"spark-driver-{pyspark.__version__}-{key}.jsa") if os.access(folder, os.W_OK) else None


class ClassArchive:
    """The class-data-sharing archive of one ``yfpp spark`` run's driver JVM: :attr:`options` for the JVM;
    when the archive does not exist yet the JVM writes it to a temporary name as it exits, and
    :meth:`finish` (after the session stops) ends the JVM, waits for it and moves the archive into place —
    so a run that is killed, or two first runs at once, never leave a half-written archive in use."""

    def __init__(self, path: str | None):
        self.path = path
        self.writing = None if not path or os.path.isfile(path) else f"{path}.{os.getpid()}.tmp"
        self.options = driver_java_options(path, self.writing)
        if self.writing:
            _remove_orphans(path)

    def finish(self, spark_context_class: Any, timeout: float = 120.0) -> None:
        """End the session's JVM (closing its stdin, as the driver's own exit would) and keep the archive
        it wrote; do nothing when no archive is being written. ``spark_context_class``: ``SparkContext``,
        whose gateway is dropped so that a later session in this process starts a new JVM."""
        if self.writing is None:
            return
        gateway = spark_context_class._gateway
        proc = getattr(gateway, "proc", None)
        try:
            if proc is not None:
                gateway.shutdown()
                spark_context_class._gateway = spark_context_class._jvm = None
                proc.stdin.close()
                proc.wait(timeout)
            if proc is not None and proc.returncode == 0 and os.path.isfile(self.writing):
                os.replace(self.writing, self.path)
        except Exception:  # a slow or failed dump: no archive, the next run writes one
            pass
        finally:
            if os.path.exists(self.writing):
                try:
                    os.remove(self.writing)
                except OSError:
                    pass


def process_age() -> float:
    """Wall seconds since this process started (Linux: from ``/proc``; NaN elsewhere)."""
    try:
        start_ticks = int(Path("/proc/self/stat").read_text().rpartition(")")[2].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, IndexError, ValueError):
        return float("nan")
    return uptime - start_ticks / os.sysconf("SC_CLK_TCK")


def tree_cpu_seconds() -> float:
    """CPU seconds of this process and all its descendants (JVM, Python workers), those that have
    exited too (:class:`CpuLedger`; Linux: from ``/proc``; NaN elsewhere)."""
    return sum(tree_cpu_by_kind().values()) if os.path.isdir("/proc") else float("nan")


def tree_cpu_by_kind() -> dict[str, float]:
    """:func:`tree_cpu_seconds` split into ``driver`` (this process), ``JVM`` (``java`` processes)
    and ``Python workers`` (every other descendant: Spark's Python daemon and its workers), as
    this process's :class:`CpuLedger` has counted them; empty without ``/proc``."""
    global _ledger
    if not os.path.isdir("/proc"):
        return {}
    if _ledger is None or _ledger.root != os.getpid():
        _ledger = CpuLedger(os.getpid())
    return _ledger.sample()


_ledger: CpuLedger | None = None
KINDS = ("driver", "JVM", "Python workers")
#: ``prctl`` option: orphaned descendants are re-parented to this process, not to init.
_PR_SET_CHILD_SUBREAPER = 36


def keep_orphans() -> bool:
    """Make this process a child subreaper (Linux): a descendant whose parent exits first — a Python
    worker whose daemon was killed — becomes this process's child, not init's, so its CPU stays in the
    tree (as a zombie once it exits: ``/proc`` keeps its times). True when set."""
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        return libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


class CpuLedger:
    """The CPU of a process tree, by kind, counted so that nothing is lost or counted twice as
    processes exit.

    A process's ``/proc`` times are its own (utime + stime) and those of its children it has
    reaped (cutime + cstime). Summing both over the live tree loses a process that exited without
    being reaped by a process of the tree (an orphan: see :func:`keep_orphans`), and moves a reaped
    child's CPU to its parent's kind — a Python daemon reaped by its JVM took its workers' seconds to
    the JVM's column (a step showed −53 CPU-s of Python workers). Here each sample adds the growth of
    every process's own time to its kind; a parent's reaped-children time grows by what its exited
    children used, less what was already counted of them (their last sample), and the rest — their
    time after that sample, and children never sampled (a worker that lived between two samples) — is
    added to the kind of the children (a ``java`` or Python parent's unseen children are Python
    workers, the driver's are JVMs). Seconds are clock ticks, integers until reported.
    """

    def __init__(self, root: int):
        self.root = root
        self.tick = os.sysconf("SC_CLK_TCK")
        #: (pid, start time) → (kind, own ticks, reaped-children ticks, parent's key) at the last sample
        self.seen: dict[tuple[int, int], tuple[str, int, int, tuple[int, int] | None]] = {}
        self.total = dict.fromkeys(KINDS, 0)
        #: key → ticks of its exited children counted already but not yet in its reaped-children time (read
        #: before the reaping: /proc is not read at one instant)
        self.owed: dict[tuple[int, int], int] = {}

    def _read(self) -> dict[tuple[int, int], tuple[str, int, int, int]]:
        """The tree now: key → (kind, own ticks, reaped-children ticks, parent pid)."""
        procs: dict[int, tuple[str, list[str]]] = {}
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                text = Path(f"/proc/{pid}/stat").read_text()
            except OSError:
                continue
            head, _, rest = text.rpartition(")")
            procs[int(pid)] = (head.partition("(")[2], rest.split())
        tree, grew = {self.root}, True
        while grew:
            new = {pid for pid, (_, f) in procs.items() if int(f[1]) in tree} - tree
            tree |= new
            grew = bool(new)
        out = {}
        for pid in tree & procs.keys():
            comm, f = procs[pid]
            kind = "driver" if pid == self.root else "JVM" if comm == "java" else "Python workers"
            out[(pid, int(f[19]))] = (kind, int(f[11]) + int(f[12]), int(f[13]) + int(f[14]), int(f[1]))
        return out

    def sample(self) -> dict[str, float]:
        """The seconds counted so far per kind (cumulative)."""
        now = self._read()
        by_pid = {key[0]: key for key in now}
        gone: dict[tuple[int, int], list[tuple[str, int]]] = {}  # live parent → its exited children (kind, counted)
        for key, (kind, own, children, parent) in self.seen.items():
            if key in now:
                continue
            while parent is not None and parent not in now:  # its parent exited too: the nearest live ancestor reaped both
                parent = self.seen[parent][3] if parent in self.seen else None
            if parent is not None:
                gone.setdefault(parent, []).append((kind, own + children + self.owed.get(key, 0)))
        seen, owed = {}, {}
        for key, (kind, own, children, ppid) in now.items():
            before = self.seen.get(key)
            if before is None:  # first sight: its children so far (a launcher it exec'd from, reaped workers) are its kind's
                self.total[kind] += own + children
            else:
                self.total[kind] += own - before[1]
                kids = gone.get(key, [])
                grown = children - before[2] - self.owed.get(key, 0) - sum(counted for _, counted in kids)
                if grown < 0:  # children counted, their reaping not seen yet
                    owed[key] = -grown
                else:
                    rest_kind = kids[0][0] if kids else "JVM" if kind == "driver" else "Python workers"
                    self.total[rest_kind] += grown
            seen[key] = (kind, own, children, by_pid.get(ppid))
        self.seen, self.owed = seen, owed
        return {k: v / self.tick for k, v in self.total.items()}


class Steps:
    """Named steps of a job: each step's jobs run in a Spark job group of its own, and its wall time
    and the process tree's CPU per kind (:func:`tree_cpu_by_kind`) are kept."""

    def __init__(self, spark: Any, before: Sequence[tuple[str, float, dict[str, float]]] = ()):
        """``before``: rows of steps taken before the session existed (name, wall s, CPU s per kind)."""
        self.sc = spark.sparkContext
        self.rows: list[tuple[str, float, dict[str, float]]] = list(before)

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
        width = max([32] + [len(name) for name, _, _ in self.rows])  # the step names' column
        lines = [f"{'time per step:':<{width + 3}}{'wall s':>6}   CPU s: driver    JVM  Python workers",
                 "      stage  tasks  task run s  task JVM CPU s"]
        total: dict[str, float] = {}
        for name, wall, cpu in self.rows:
            lines.append(f"  {name:<{width}} {wall:>6.2f}  {_kinds(cpu)}")
            lines += [f"  {'':<4} {s['stage']:>5}  {s['tasks']:>5}  {s['run']:>10.2f}  {s['cpu']:>14.2f}"
                      for s in self.stages(name)]
            for k, v in cpu.items():
                total[k] = total.get(k, 0.0) + v
        lines.append(f"  {'all steps':<{width}} {sum(r[1] for r in self.rows):>6.2f}  {_kinds(total)}")
        lines.append(f"process CPU s (driver + JVM + Python workers on this machine)  {tree_cpu_seconds():.1f}")
        return lines


def _kinds(cpu: dict[str, float]) -> str:
    return (f"{cpu.get('driver', 0.0):>13.2f} {cpu.get('JVM', 0.0):>6.2f} {cpu.get('Python workers', 0.0):>15.2f}"
            if cpu else "")


def _remove_orphans(path: str) -> None:
    """Remove the temporary archives ``PATH.PID.tmp`` whose run has ended without moving them into place
    (killed: its JVM still writes the archive as it exits)."""
    import glob

    if not os.path.isdir("/proc"):  # no way to tell a live run's archive
        return
    for tmp in glob.glob(glob.escape(path) + ".*.tmp"):
        pid = tmp[len(path) + 1:-len(".tmp")]
        if pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
            try:
                os.remove(tmp)
            except OSError:
                pass
