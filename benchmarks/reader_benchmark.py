"""CPU seconds to read a feed with :func:`yfpp.input.readers.read_events` (no engine).

Usage: ``python benchmarks/reader_benchmark.py FILE [FILE …] [--repeat N] [--baseline REV]``; make
the feeds with ``yfpp generate rfid --events 1000000 -o /tmp/rfid.xml`` (and ``.jsonl``). Prints
events, CPU seconds (best of N, ``time.process_time``) and µs per event for each file. With
``--baseline REV`` it also reads each file with ``yfpp/input/readers.py`` as of git revision ``REV`` (a
single-module reader, as before the split), alternating the two, so both see the same machine load.
"""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parent.parent)]

from bench_common import commit  # noqa: E402
from yfpp.input.dead_letters import DeadLetters  # noqa: E402
from yfpp.input.readers import read_events  # noqa: E402


def cpu_seconds(path: str, reader=read_events) -> tuple[int, float, int]:
    """(events, CPU seconds, dead letters) of one full read of ``path``."""
    dead = DeadLetters()
    t0 = time.process_time()
    n = sum(1 for _ in reader(path, dead_letters=dead))
    return n, time.process_time() - t0, dead.count


def reader_at(rev: str):
    """``read_events`` of ``yfpp/input/readers.py`` at git revision ``rev``, loaded as a separate module."""
    root = Path(__file__).resolve().parent.parent
    text = subprocess.run(["git", "show", f"{rev}:yfpp/input/readers.py"], cwd=root, check=True, capture_output=True).stdout
    path = Path(tempfile.mkdtemp()) / "baseline_readers.py"
    path.write_bytes(text)
    spec = importlib.util.spec_from_file_location("baseline_readers", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.read_events


def report(label: str, path: str, runs: list[tuple[int, float, int]]) -> None:
    n, cpu, dead = min(runs, key=lambda r: r[1])
    print(f"{label:<10} {Path(path).name:<20} {n:>9,} events  {dead} dead letters  {cpu:7.2f} s CPU  "
          f"{cpu / max(n, 1) * 1e6:6.2f} µs/event")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("files", nargs="+")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--baseline", metavar="REV", help="also time yfpp/input/readers.py of this git revision")
    args = ap.parse_args()
    print(f"commit {commit()}")
    old = reader_at(args.baseline) if args.baseline else None
    for path in args.files:
        runs, old_runs = [], []
        for _ in range(args.repeat):
            if old is not None:
                old_runs.append(cpu_seconds(path, old))
            runs.append(cpu_seconds(path))
        if old is not None:
            report(args.baseline, path, old_runs)
        report("now", path, runs)


if __name__ == "__main__":
    main()
