"""Spark benchmark: keyed RFID workloads, local engine vs Spark, side by side in one run.

Workloads (``--workload``), both over ``generate_rfid(N, zones=Q, doors=Q)``
written as feed files (``--format`` xml or jsonl):

* ``subscriptions``: Q subscriptions
  ``[tag_id]&&//shelf[@zone='Zk']//exit[@door='Dk']&&(1 hour)`` (k = 1..Q),
  all in one keyed group;
* ``shoplifting``: ``queries/shoplifting.sase`` (keyed by tag_id, 12 hours).

Measured:

* the local engine (``yfpp run``'s loop: read_events → Engine) on the same files;
* ``yfpp.spark`` (read_events_df → match → count) on each master (local[1],
  local[2] by default), each in a fresh process: the job after a warm-up job
  on the bundled sample (``job`` columns), and the whole process from its
  start — JVM, session, warm-up and job (``process`` columns). CPU seconds are
  those of the process tree (driver, JVM, Python workers).

Prints a Markdown table and the command line; ``--out FILE`` also writes it.

    python benchmarks/spark_benchmark.py                       # 2M events, 1000 subscriptions
    python benchmarks/spark_benchmark.py --events 200000 --queries 100 --masters 'local[1]'
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from itertools import islice
from pathlib import Path
from typing import Any

from yfpp.input.dead_letters import DeadLetters
from yfpp.engine import Engine
from yfpp.input.generate import generate_rfid, write_events
from yfpp.language.query_text import load_patterns
from yfpp.input.readers import read_events
from yfpp.spark.costs import tree_cpu_seconds

DATA = Path(tempfile.gettempdir()) / "yfpp_spark_bench"  # large: kept out of the repository
_STARTED = time.perf_counter()  # the process start, near enough (imports before it are small)


SHOPLIFTING = Path(__file__).resolve().parent.parent / "queries" / "shoplifting.sase"


def queries(q: int, workload: str = "subscriptions") -> list[tuple[str, Any]]:
    if workload == "shoplifting":
        return [(q.name, pattern) for q, pattern in load_patterns([str(SHOPLIFTING)])]
    return [(f"s{k}", f"[tag_id]&&//shelf[@zone='Z{k}']//exit[@door='D{k}']&&(1 hour)") for k in range(1, q + 1)]


def feed_dir(events: int, q: int, files: int, seed: int, fmt: str = "xml") -> Path:
    """The workload as ``files`` feed files under the temp directory (generated once, then reused)."""
    d = DATA / f"rfid_n{events}_z{q}_f{files}_s{seed}_{fmt}"
    if d.is_dir() and len(list(d.glob(f"*.{fmt}"))) == files:
        return d
    d.mkdir(parents=True, exist_ok=True)
    records = generate_rfid(events, zones=q, doors=q, seed=seed)
    per = -(-events // files)
    for i in range(files):
        write_events(islice(records, per), d / f"part-{i:03d}.{fmt}")
    return d


def run_local(d: Path, q: int, workload: str) -> dict:
    started = time.perf_counter()
    eng = Engine(dead_letters=DeadLetters())
    for name, text in queries(q, workload):
        eng.register(text, name=name)
    n = matches = 0
    for f in sorted(p for p in d.iterdir() if p.suffix in (".xml", ".jsonl")):
        for ev in read_events(f, dead_letters=DeadLetters()):
            ev.seq = n  # global seq across files, as the Spark job numbers them
            n += 1
            matches += len(eng.process(ev))
    matches += len(eng.flush())
    return {"events": n, "matches": matches, "seconds": time.perf_counter() - started}


def run_spark(d: Path, q: int, workload: str, master: str, partitions: int) -> dict:
    from pyspark.sql import SparkSession

    from yfpp.spark import match, read_events_df

    process_started = _STARTED
    spark = (SparkSession.builder.master(master).config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false").config("spark.sql.shuffle.partitions", str(partitions))
             .config("spark.driver.memory", "4g").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    started = time.perf_counter()
    cpu_started = tree_cpu_seconds()
    sample = Path(__file__).resolve().parent.parent / "yfpp" / "data" / "sample_rfid.xml"
    match(spark, queries(2), read_events_df(spark, sample)).count()  # warm-up: JVM, Python workers, imports
    warm = time.perf_counter() - started
    started, cpu_started = time.perf_counter(), tree_cpu_seconds()
    events = read_events_df(spark, d)
    n = events.count()
    read = time.perf_counter() - started
    matches = match(spark, queries(q, workload), events).count()
    total = time.perf_counter() - started
    process_cpu = tree_cpu_seconds()
    cpu = process_cpu - cpu_started
    spark.stop()
    return {"events": n, "matches": matches, "seconds": total, "read_seconds": read, "warmup_seconds": warm, "cpu": cpu,
            "process_seconds": time.perf_counter() - process_started, "process_cpu": process_cpu}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--events", type=int, default=2_000_000)
    ap.add_argument("--queries", type=int, default=1000)
    ap.add_argument("--files", type=int, default=8, help="feed files (one read task each)")
    ap.add_argument("--masters", nargs="+", default=["local[1]", "local[2]"])
    ap.add_argument("--partitions", type=int, default=8, help="shuffle partitions")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workload", choices=["subscriptions", "shoplifting"], default="subscriptions")
    ap.add_argument("--format", choices=["xml", "jsonl"], default="xml", help="feed file format")
    ap.add_argument("--out", help="also write the table (and the command) to this Markdown file")
    ap.add_argument("--spark-child", metavar="MASTER", help=argparse.SUPPRESS)
    args = ap.parse_args()
    d = feed_dir(args.events, args.queries, args.files, args.seed, args.format)
    if args.spark_child:
        print(json.dumps(run_spark(d, args.queries, args.workload, args.spark_child, args.partitions)))
        return 0
    load = [os.getloadavg()[0]]
    before = tree_cpu_seconds()
    local = run_local(d, args.queries, args.workload)
    rows = [("local engine (1 process)", {**local, "cpu": tree_cpu_seconds() - before})]
    load.append(os.getloadavg()[0])
    print(f"local engine: {rows[0][1]}", file=sys.stderr)
    for master in args.masters:
        child = subprocess.run([sys.executable, __file__, *sys.argv[1:], "--spark-child", master],
                               capture_output=True, text=True, env={**os.environ, "PYTHONWARNINGS": "ignore"})
        if child.returncode:
            sys.exit(f"Spark {master} failed:\n{child.stderr[-3000:]}")
        rows.append((f"Spark {master}", json.loads(child.stdout.strip().splitlines()[-1])))
        load.append(os.getloadavg()[0])
        print(f"{master}: {rows[-1][1]}", file=sys.stderr)
    base = rows[0][1]
    first_spark = rows[1][1]["seconds"] if len(rows) > 1 else None
    what = f"{args.queries:,} subscriptions" if args.workload == "subscriptions" else "the shoplifting query"
    lines = [f"Keyed RFID workload: {base['events']:,} events in {args.files} {args.format} files, {what}, "
             f"{args.partitions} shuffle partitions, {os.cpu_count()} cores; 1-minute load average before and "
             f"after each run: {' → '.join(f'{x:.1f}' for x in load)} (this machine is shared: read the timings with it).", "",
             "| run | seconds | events/s | matches | read+seq (s) | µs/event over local | speed-up vs first Spark run "
             "| warm-up (s) | CPU s (JVM + Python) | cores busy | process s | process CPU s |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name, r in rows:
        over = "" if r is base else f"{(r['seconds'] - base['seconds']) / r['events'] * 1e6:+.1f}"
        speed = "" if r is base or first_spark is None else f"{first_spark / r['seconds']:.2f}×"
        read, warm = (f"{r['read_seconds']:.1f}", f"{r['warmup_seconds']:.1f}") if r is not base else ("", "")
        whole = (f"{r['process_seconds']:.1f} | {r['process_cpu']:.1f}" if r is not base
                 else f"{r['seconds']:.1f} | {r['cpu']:.1f}")
        lines.append(f"| {name} | {r['seconds']:.1f} | {r['events'] / r['seconds']:,.0f} | {r['matches']:,} | {read} | {over} "
                     f"| {speed} | {warm} | {r['cpu']:.1f} | {r['cpu'] / r['seconds']:.2f} | {whole} |")
    if any(r["matches"] != base["matches"] for _, r in rows):
        lines += ["", "**The match counts differ.**"]
    lines += ["", "Command: `python benchmarks/spark_benchmark.py " + " ".join(sys.argv[1:]) + "`"]
    table = "\n".join(lines)
    print(table)
    if args.out:
        Path(args.out).write_text(table + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
