"""Helpers the benchmark scripts share: the commit measured, GC time, instruction counts, short paths."""

from __future__ import annotations

import gc
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def commit() -> str:
    """The checked-out commit (read-only git query), or ``?``."""
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
        return out.stdout.strip() or "?"
    except OSError:
        return "?"


class GcTimer:
    """CPU time spent in the cyclic garbage collector (gc.callbacks), and full (gen 2) collections."""

    def __init__(self) -> None:
        self.seconds, self.full, self._t0 = 0.0, 0, 0.0

    def __call__(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._t0 = time.process_time()
        else:
            self.seconds += time.process_time() - self._t0
            self.full += info["generation"] == 2

    def __enter__(self) -> "GcTimer":
        gc.callbacks.append(self)
        return self

    def __exit__(self, *exc) -> None:
        gc.callbacks.remove(self)


def short_path(path: str) -> str:
    """A profiler's file path relative to the project, for tables."""
    p = Path(path)
    try:
        return str(p.resolve().relative_to(ROOT))
    except ValueError:
        return p.name


def callgrind_instructions(args: list[str], cwd: str, pythonpath: str) -> int:
    """Instructions ``valgrind --tool=callgrind`` counts for ``python ARGS…`` run in ``cwd`` with ``PYTHONPATH``
    (and ``PYTHONHASHSEED=0``): deterministic, so a shared machine's load does not move it."""
    with tempfile.TemporaryDirectory(prefix="yfpp-callgrind-") as tmp:
        out = Path(tmp) / "cg.out"
        env = {**os.environ, "PYTHONPATH": pythonpath, "PYTHONHASHSEED": "0"}
        proc = subprocess.run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", sys.executable, *args],
                              cwd=cwd, env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            raise SystemExit(f"callgrind failed in {cwd}:\n{proc.stderr[-2000:]}")
        m = re.search(r"^summary:\s+(\d+)", out.read_text(), re.M) or re.search(r"^totals:\s+(\d+)", out.read_text(), re.M)
        return int(m.group(1))
