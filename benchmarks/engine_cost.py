"""The engine's own per-event cost, a baseline commit against the working tree: instructions and CPU.

Usage::

    python benchmarks/engine_cost.py [--baseline main] [--instructions-events 15000] [--events 200000] [--rounds 2]

For each query (one that never matches, shoplifting) and each feed (the issue-12 benchmark's JSON lines and XML,
``benchmarks/data/shoplifting_1000000.*``, read with ``yfpp.input.readers.read_events``):

* instructions per event — ``valgrind --tool=callgrind`` of ``Engine.process`` over the first
  ``--instructions-events`` events, minus the same script without the loop (``PYTHONHASHSEED=0``), divided by
  the events: deterministic, so a shared machine's load does not move it (skipped without valgrind or with
  ``--no-instructions``);
* µs per event — the same loop over ``--events`` pre-read events, CPU time (``time.process_time``), three
  passes per process (a fresh engine each, the best kept), the two trees alternating, ``--rounds`` rounds.

The baseline is extracted with ``git archive``; each figure is a separate process with ``PYTHONPATH`` on one tree.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parent.parent)]

from bench_common import ROOT, callgrind_instructions, commit  # noqa: E402
from hotpath_benchmark import NEVER, QUERY, extract, feed  # noqa: E402

LOOP = """
import itertools, sys, time
from yfpp.engine import Engine
from yfpp.input.readers import read_events
path, n, query, passes = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
if query.endswith('.sase'):
    query = ''.join(line for line in open(query) if not line.startswith('#'))
events = list(itertools.islice(read_events(path), n))
best = None
for _ in range(max(passes, 1)):  # passes = 0: everything but the loop (the callgrind baseline)
    for ev in events:
        ev.pos = -1
    eng = Engine()
    eng.register(query, name='q')
    t0 = time.process_time()
    if passes:
        matches = sum(len(eng.process(ev)) for ev in events) + len(eng.flush())
    t = time.process_time() - t0
    best = t if best is None else min(best, t)
print(best, len(events))
"""


def instructions(tree: str, path: Path, n: int, query: str, passes: int) -> int:
    """Instructions callgrind counts for the loop script with ``passes`` passes."""
    return callgrind_instructions(["-c", LOOP, str(path), str(n), query, str(passes)], tree, tree)


def cpu_per_event(tree: str, path: Path, n: int, query: str) -> float:
    """µs per event of the loop, best of three passes in one process."""
    env = {**os.environ, "PYTHONPATH": tree}
    proc = subprocess.run([sys.executable, "-c", LOOP, str(path), str(n), query, "3"], cwd=tree, env=env,
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"the loop failed in {tree}:\n{proc.stderr[-2000:]}")
    t, events = proc.stdout.split()
    return float(t) / int(events) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--baseline", default="main", help="git revision to compare with (default main)")
    ap.add_argument("--instructions-events", type=int, default=15_000)
    ap.add_argument("--events", type=int, default=200_000, help="events of the CPU loop")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--formats", nargs="+", default=["jsonl", "xml"], choices=["jsonl", "xml"])
    ap.add_argument("--no-instructions", action="store_true", help="skip callgrind")
    ap.add_argument("--no-cpu", action="store_true", help="skip the CPU loops")
    args = ap.parse_args()
    feeds = {fmt: feed(1_000_000, fmt) for fmt in args.formats}
    queries = {"never matches": NEVER, "shoplifting": QUERY}
    with tempfile.TemporaryDirectory(prefix="yfpp-baseline-") as tmp:
        trees = {args.baseline: extract(args.baseline, tmp), f"now ({commit()}+wt)": str(ROOT)}
        labels = list(trees)
        if not args.no_instructions and shutil.which("valgrind"):
            n = args.instructions_events
            print(f"instructions per event (callgrind, first {n:,} events, loop minus no loop):")
            for what, query in queries.items():
                for fmt, path in feeds.items():
                    figures = [(instructions(trees[label], path, n, query, 1)
                                - instructions(trees[label], path, n, query, 0)) / n for label in labels]
                    print(f"  {what:<14} {fmt:<5} " + "  ".join(f"{label}: {f:,.0f}" for label, f in zip(labels, figures))
                          + f"  ({figures[1] / figures[0] - 1:+.1%})", flush=True)
        if not args.no_cpu:
            print(f"engine only, µs per event over {args.events:,} pre-read events (best of 3 passes per process):")
            for rnd in range(args.rounds):
                order = labels if rnd % 2 == 0 else labels[::-1]
                for what, query in queries.items():
                    for fmt, path in feeds.items():
                        figures = {label: cpu_per_event(trees[label], path, args.events, query) for label in order}
                        print(f"  round {rnd + 1} {what:<14} {fmt:<5} "
                              + "  ".join(f"{label}: {figures[label]:.2f}" for label in labels), flush=True)


if __name__ == "__main__":
    main()
