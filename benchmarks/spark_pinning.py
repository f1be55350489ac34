"""One CPU per executor for ``spark_standalone.py --pin`` (Linux).

A standalone worker started with ``--cores 1`` offers one *task slot*, not one core: its executor's JVM (reading
the ranges, the Arrow hand-off, writing) runs beside the Python worker of its task. Started with its CPU affinity
set to one CPU, the worker daemon passes it on to what it starts — the executor JVM, its Python daemon and the
Python workers forked from it (affinity is inherited across ``fork`` and ``exec``) — so the executor has exactly
that CPU.
"""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path


def executor_cpus(executors: int, available: set[int] | None = None) -> list[int]:
    """The CPU each of ``executors`` executors gets (executor k: the k-th lowest of ``available``, by default
    this process's allowed CPUs); a :class:`ValueError` saying why when there are fewer CPUs than executors."""
    cpus = sorted(os.sched_getaffinity(0) if available is None else available)
    if len(cpus) < executors:
        raise ValueError(f"--pin gives each executor a CPU of its own: {executors} executors need {executors} CPUs, "
                         f"this process may use {len(cpus)} ({', '.join(map(str, cpus))}; os.cpu_count() "
                         f"{os.cpu_count()})")
    return cpus[:executors]


def pin_to(cpu: int) -> Callable[[], None]:
    """A ``preexec_fn`` for :class:`subprocess.Popen` that confines the child (and all it starts) to ``cpu``."""
    return lambda: os.sched_setaffinity(0, {cpu})


def descendants(root: int, proc: Path = Path("/proc")) -> list[int]:
    """The PIDs of the live processes below ``root`` (children, their children…), from ``/proc/PID/stat``."""
    children: dict[int, list[int]] = defaultdict(list)
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rpartition(")")[2].split()[1])
        except (OSError, IndexError, ValueError):  # ended meanwhile
            continue
        children[ppid].append(int(entry.name))
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), ()):
            found.append(child)
            todo.append(child)
    return found


def cpus_allowed(pid: int, proc: Path = Path("/proc")) -> tuple[str, str] | None:
    """A process's command name and ``Cpus_allowed_list`` (``"0"``, ``"0-1"``…); ``None`` once it has ended."""
    try:
        status = (proc / str(pid) / "status").read_text()
    except OSError:
        return None
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    return fields["Name"].strip(), fields["Cpus_allowed_list"].strip()
