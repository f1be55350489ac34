"""The scan plan's cost model: per-event task CPU against ``yfpp run``'s, at 2, 16 and 128 tasks, and a job's fixed cost.

Two parts, on one JSON-lines feed (``generate_rfid(N)``, the shoplifting query,
keyed by tag_id — see ``spark_vs_run.py``):

* **Counting work** (no Spark; first, side by side, ``yfpp``'s reader
  alone and the reader and one engine over the feed — ``yfpp run``'s work —
  in this process; ``--tasks``, default 2 16 128): the scan plan's
  read tasks (``yfpp.spark.scan.read_task``, one per byte range, as many ranges
  as tasks but none below ``MIN_RANGE_BYTES`` — 4 MB — save the last) and matching tasks (``match_task``) run one after the other in this
  process, each timed with ``time.process_time``; the blobs between them kept
  in a dict (Spark's shuffle is not in these figures: its JVM side is in the
  Spark part). Printed per task count: bytes parsed (all tasks together, and
  the most one task parsed — the input is parsed once), the task CPU per event
  (read, match, both), the largest task's share, the events decoded per input
  event (copies sent), and the shuffle bytes per event (the blobs' size).
  With numba installed the read tasks ship the feed's plain lines unparsed
  (``yfpp.spark.line_scan``); a first small job warms the scan's kernels
  (compiled, or loaded from numba's cache) before anything is counted.
* **Spark** (``--spark``: ``yfpp spark --plan scan --stats --master local[T]``
  as a subprocess, T = ``--spark-tasks``, default 2): over an empty file (the
  fixed cost) and over the feed; the CPU of the driver, the JVM and the Python
  workers from ``--stats`` ("all steps"), and per event the Python workers'
  CPU beyond the empty job's.

``yfpp run``'s CPU per event is also measured as a command: its subprocess's
CPU over the feed less its CPU over an empty file (the start-up). The task
CPU is held against ``yfpp run``'s work measured here (target ≤ 1.1×): its reader and engine, and
(``× run+lines``) those with the match lines encoded, as ``yfpp run`` and the matching tasks do. ``--plot FILE`` draws the per-event
figures against the task count (matplotlib).

    python benchmarks/spark_cost_model.py --events 100000 1000000 --spark --plot benchmarks/spark_cost_model.png
"""

from __future__ import annotations

import argparse
import json
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

from spark_vs_run import feed  # noqa: E402

from yfpp.input.readers import read_event_batches  # noqa: E402
from yfpp.language.query_text import load_patterns  # noqa: E402
from yfpp.output.writer import encode_match  # noqa: E402
from yfpp.spark import line_scan  # noqa: E402
from yfpp.spark.plan import effective_queries, group_queries, rare_collections  # noqa: E402
from yfpp.spark.ranges import unpack_summaries  # noqa: E402
from yfpp.spark.scan import SUMMARY, ScanJob, match_task, read_task, ship_order  # noqa: E402

QUERIES = ROOT / "queries" / "shoplifting.sase"
READING = {"format": None, "ts_field": "ts", "ts_unit": "s", "type_field": None}


def child_cpu(cmd: list[str]) -> tuple[float, str]:
    """The CPU seconds of a command run to its end (its whole reaped process tree) and its stderr."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode:
        sys.exit(f"failed: {' '.join(cmd)}\n{done.stderr[-2000:]}")
    return after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime, done.stderr


def run_cpu(path: Path, out: Path) -> float:
    """``yfpp run``'s CPU seconds over ``path``."""
    return child_cpu([sys.executable, "-m", "yfpp", "run", "-q", str(QUERIES), "-i", str(path), "-o", str(out)])[0]


def in_process(path: Path) -> tuple[float, float, float]:
    """CPU µs per event, here: ``yfpp``'s reader alone over ``path``, the reader and one engine (``yfpp run``'s
    work), and that with the matches' lines encoded as ``yfpp run`` writes them (the matching tasks encode them too)."""
    groups = group_queries(effective_queries([(q.name, p) for q, p in load_patterns([str(QUERIES)])]))
    t0 = time.process_time()
    with rare_collections():
        n = sum(len(b) for b in read_event_batches(str(path)))
    t1 = time.process_time()
    with rare_collections():
        eng, out = groups[0].engine(), []
        for b in read_event_batches(str(path)):
            eng.process_batch(b, out)
        out += eng.flush()
    t2 = time.process_time()
    for m in out:
        encode_match(m)
    t3 = time.process_time()
    return (t1 - t0) / n * 1e6, (t2 - t1) / n * 1e6, (t3 - t1) / n * 1e6


def counted(path: Path, tasks: int) -> dict:
    """The scan plan's tasks over ``path`` with ``tasks`` matching tasks and as many byte ranges, run here one by one."""
    groups = group_queries(effective_queries([(q.name, p) for q, p in load_patterns([str(QUERIES)])]))
    job = ScanJob.plan(groups, [f"file://{path}"], True, tasks, READING, pieces=tasks)
    shipped: dict[int, list[tuple]] = {t: [] for t in range(tasks)}
    read_cpu, parsed, blob_bytes = [], 0, 0
    for r in range(len(job.ranges)):
        t0 = time.process_time()
        with rare_collections():
            for rows in read_task(job, [r]):
                for row in rows:
                    shipped[row[0]].append(row)
                    blob_bytes += len(row[4])
        read_cpu.append(time.process_time() - t0)
    match_cpu, decoded, records, matches = [], 0, 0, 0
    for t in range(tasks):
        t0 = time.process_time()
        with rare_collections():
            rows = list(match_task(job, t, sorted(shipped[t], key=ship_order)))  # as Spark sorts them
        match_cpu.append(time.process_time() - t0)
        stats = json.loads(rows[-1][5])
        decoded += stats["rows"]
        records = stats["records"]
        matches += len(rows) - 1
        if t == 0:
            parsed = stats["read"]["bytes"]
    range_bytes = [s.bytes for s in unpack_summaries([r[4] for r in shipped[0] if r[3] == SUMMARY])]  # task 0: all
    return {"tasks": tasks, "ranges": len(job.ranges), "events": records, "matches": matches,
            "bytes": parsed, "max_task_bytes": max(range_bytes), "read_cpu": sum(read_cpu),
            "match_cpu": sum(match_cpu), "max_task_cpu": max(max(read_cpu), max(match_cpu)),
            "decoded": decoded, "blob_bytes": blob_bytes}


def spark_stats(path: Path, out: Path, tasks: int) -> tuple[float, dict[str, float]]:
    """``yfpp spark --plan scan --stats`` over ``path``: the CPU of its whole run (its own count of its process
    tree, JVM and Python workers included), and the "all steps" wall time and CPU by kind."""
    _, err = child_cpu([sys.executable, "-m", "yfpp", "spark", "-q", str(QUERIES), "-i", str(path), "-o", str(out),
                          "--master", f"local[{tasks}]", "--plan", "scan", "--stats", "--mode", "overwrite"])
    m = re.search(r"all steps\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)", err)
    whole = re.search(r"process CPU s, the whole run\s+([\d.]+)", err)
    if not m or not whole:
        sys.exit(f"no 'all steps' or 'the whole run' line in:\n{err[-2000:]}")
    return float(whole[1]), {"wall": float(m[1]), "driver": float(m[2]), "JVM": float(m[3]), "Python workers": float(m[4])}


def with_spark(sizes: list[int], tasks: int, tmp: Path, base: float) -> None:
    """Print ``yfpp spark --master local[tasks] --stats``'s CPU over an empty file and over the feed of each size:
    the Python workers' CPU per event beyond the empty job's against ``yfpp run``'s (``base``: its start-up)."""
    empty = tmp / "empty.jsonl"
    empty.write_text("")
    cpu0, s0 = spark_stats(empty, tmp / "spark_empty", tasks)
    print(f"\nyfpp spark local[{tasks}], empty input: {cpu0:.1f} CPU-s the whole run; "
          f"steps {s0['wall']:.1f} s wall, CPU driver {s0['driver']:.2f} JVM {s0['JVM']:.2f} "
          f"Python workers {s0['Python workers']:.2f}")
    for n_events in sizes:
        path = feed(n_events, 8, 1)
        run = (run_cpu(path, tmp / "run.jsonl") - base) / n_events * 1e6
        cpu, s = spark_stats(path, tmp / "spark_out", tasks)
        workers = (s["Python workers"] - s0["Python workers"]) / n_events * 1e6
        print(f"{n_events:,} events: {cpu:.1f} CPU-s the whole run, steps {s['wall']:.1f} s wall; Python workers "
              f"{s['Python workers']:.2f} CPU-s, {workers:.2f} µs/event beyond the empty job "
              f"({workers / run:.2f}× yfpp run's {run:.2f}); JVM {s['JVM']:.2f} "
              f"({(s['JVM'] - s0['JVM']) / n_events * 1e6:.2f} µs/event beyond the empty job)", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, nargs="+", default=[100_000, 1_000_000])
    ap.add_argument("--tasks", type=int, nargs="+", default=[2, 16, 128])
    ap.add_argument("--spark", action="store_true", help="also run yfpp spark (fixed cost, per-event worker CPU)")
    ap.add_argument("--spark-tasks", type=int, default=2)
    ap.add_argument("--plot", type=Path, help="draw the per-event figures into this PNG")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="yfpp_cost_"))
    empty = tmp / "empty.jsonl"
    empty.write_text("")
    base = run_cpu(empty, tmp / "run_empty.jsonl")
    print(f"yfpp run over an empty file: {base:.2f} CPU-s (start-up)")
    warm = time.process_time()
    counted(feed(2_000, 8, 1), 2)  # not per-event work: …
    print(f"a first small job here: {time.process_time() - warm:.2f} CPU-s (… with numba, the line scan's kernels "
          f"compiled or loaded from numba's cache: {'lines scanned' if line_scan.available() else 'no numba'})")
    plotted = []
    for n_events in args.events:
        path = feed(n_events, 8, 1)
        cmd = (run_cpu(path, tmp / "run.jsonl") - base) / n_events * 1e6
        reader, before, before_lines = in_process(path)
        print(f"\n{n_events:,} events ({path.stat().st_size / 1e6:.1f} MB), CPU-µs per event: yfpp run {cmd:.2f} "
              f"(the command, less its start-up); here: the reader {reader:.2f}, reader + engine {before:.2f}, "
              f"with the match lines encoded {before_lines:.2f} (yfpp run's work: × run's base, × run+lines, the "
              f"mean of the measures before and after each row)")
        print(f"{'tasks':>6} {'ranges':>6} {'MB parsed':>9} {'max task MB':>11} {'read µs/ev':>10} {'match µs/ev':>11} "
              f"{'task µs/ev':>10} {'× run':>6} {'× run+lines':>11} {'copies/ev':>9} {'shuffle B/ev':>12} "
              f"{'matches':>8}")
        for n in args.tasks:
            c = counted(path, n)
            _, after, after_lines = in_process(path)  # the base measured again after each task count (noise) …
            run, before = (before + after) / 2, after  # … the row's: the mean of the measures before and after it
            run_lines, before_lines = (before_lines + after_lines) / 2, after_lines
            read, match = c["read_cpu"] / n_events * 1e6, c["match_cpu"] / n_events * 1e6
            plotted.append((n_events, n, read, match, run))
            print(f"{n:>6} {c['ranges']:>6} {c['bytes'] / 1e6:>9.1f} {c['max_task_bytes'] / 1e6:>11.2f} {read:>10.2f} "
                  f"{match:>11.2f} {read + match:>10.2f} {(read + match) / run:>6.2f} "
                  f"{(read + match) / run_lines:>11.2f} {c['decoded'] / n_events:>9.2f} "
                  f"{c['blob_bytes'] / n_events:>12.1f} {c['matches']:>8,}", flush=True)
    if args.spark:
        with_spark(args.events, args.spark_tasks, tmp, base)
    if args.plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6.4, 4))
        for n_events in args.events:
            pts = [p for p in plotted if p[0] == n_events]
            xs = [p[1] for p in pts]
            ax.plot(xs, [p[2] + p[3] for p in pts], "o-", label=f"task CPU, {n_events:,} events")
            ax.plot(xs, [p[2] for p in pts], "s:", label=f"of which the read tasks (read, scan or parse, route), {n_events:,}")
            ax.axhline(pts[0][4], ls="--", lw=0.8, color=ax.lines[-1].get_color(), label=f"yfpp run, {n_events:,}")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("matching tasks (byte ranges: as many, each 4 MB or more)")
        ax.set_ylabel("CPU µs per event")
        ax.set_ylim(bottom=0)
        ax.set_title("yfpp spark scan plan: task CPU per event (shoplifting)")
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(args.plot, dpi=110)
        print(f"\nplot: {args.plot}")


if __name__ == "__main__":
    main()
