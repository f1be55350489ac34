"""``yfpp run`` against ``yfpp spark`` on the same feed: whole commands, wall and CPU seconds, matches compared.

The feed is one JSON-lines file, ``generate_rfid(N, zones=Q, doors=Q)``
(generated once under the temp directory, then reused); Spark splits it at
line boundaries into one read task per core. Workloads (``--workloads``):

* ``shoplifting``: ``queries/shoplifting.sase`` (keyed by tag_id, 12 hours);
* ``subscriptions``: Q subscriptions ``[tag_id]&&//shelf[@zone='Zk']//exit[@door='Dk']&&(1 hour)``.

Each command runs as a subprocess (``python -m yfpp.cli run …`` and
``python -m yfpp.cli spark --master M --plan P …`` for each plan of ``--plans``,
a fresh JVM each time); its wall
time is the subprocess's, its CPU the whole process tree's (the command, the
JVM, the Python workers: sampled from ``/proc`` every 0.2 s, and the reaped
children's rusage). The match ids of the two outputs are compared as
multisets. ``--class-archive`` is passed to ``yfpp spark`` (default here ``auto``, while
``yfpp spark``'s own default is ``off``: its cached archive; when the archive does not exist yet a first run writes it —
a warm-up, not reported). Before the runs, the machine's parallelism is
measured: a CPU-bound loop alone, then two at once (on a shared or virtual
machine two busy processes may get well under two cores).

    python benchmarks/spark_vs_run.py                                  # 1M events, local[2], both workloads and plans
    python benchmarks/spark_vs_run.py --events 1000000 --plans scan    # the scan plan only
    python benchmarks/spark_vs_run.py --events 100000 --workloads shoplifting
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shlex
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from yfpp.input.generate import generate_rfid, write_events

ROOT = Path(__file__).resolve().parent.parent
DATA = Path(tempfile.gettempdir()) / "yfpp_spark_bench"


def feed(events: int, q: int, seed: int) -> Path:
    path = DATA / f"feed_n{events}_z{q}_s{seed}.jsonl"
    if not path.is_file():
        DATA.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp.jsonl")
        write_events(generate_rfid(events, zones=q, doors=q, seed=seed), tmp)
        tmp.rename(path)
    return path


def query_args(workload: str, q: int, tmp: Path) -> list[str]:
    if workload == "shoplifting":
        return ["-q", str(ROOT / "queries" / "shoplifting.sase")]
    qfile = tmp / f"subscriptions_{q}.xpe"
    qfile.write_text("".join(f"@query s{k}\n[tag_id]&&//shelf[@zone='Z{k}']//exit[@door='D{k}']&&(1 hour)\n"
                             for k in range(1, q + 1)))
    return ["-q", str(qfile)]


def _tree_cpu(root: int) -> float:
    """utime + stime + reaped children's, over ``root`` and its live descendants."""
    stats: dict[int, list[str]] = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            stats[int(pid)] = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
        except OSError:
            continue
    tree, grew = {root}, True
    while grew:
        new = {pid for pid, f in stats.items() if int(f[1]) in tree} - tree
        tree |= new
        grew = bool(new)
    return sum(sum(int(x) for x in stats[p][11:15]) for p in tree if p in stats) / os.sysconf("SC_CLK_TCK")


def timed(cmd: list[str]) -> tuple[float, float, str]:
    """Run ``cmd``: (wall s, CPU s of its process tree, stderr)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, cwd=ROOT)
        sampled = 0.0
        while proc.poll() is None:
            try:
                sampled = max(sampled, _tree_cpu(proc.pid))
            except (OSError, IndexError, ValueError):
                pass
            time.sleep(0.2)
        wall = time.perf_counter() - started
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        err.seek(0)
        text = err.read().decode(errors="replace")
    reaped = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    if proc.returncode:
        sys.exit(f"failed ({proc.returncode}): {' '.join(cmd)}\n{text[-3000:]}")
    return wall, max(sampled, reaped), text


def _spin(_: int = 0) -> float:
    started = time.perf_counter()
    x = 0
    for i in range(20_000_000):
        x += i
    return time.perf_counter() - started


def cores_for_two() -> float:
    """How many cores two CPU-bound processes get at once: 2 × a loop's time alone / their wall time together."""
    import multiprocessing

    alone = _spin()
    with multiprocessing.Pool(2) as pool:
        started = time.perf_counter()
        pool.map(_spin, [0, 1])
        both = time.perf_counter() - started
    return 2 * alone / both


def ids(path: Path) -> Counter:
    files = [path] if path.is_file() else sorted(p for p in path.iterdir() if p.name.startswith("part-"))
    return Counter(json.loads(line)["id"] for f in files for line in f.read_text().splitlines() if line.strip())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--queries", type=int, default=1000, help="subscriptions (and the feed's zones and doors)")
    ap.add_argument("--workloads", nargs="+", choices=["shoplifting", "subscriptions"], default=["shoplifting", "subscriptions"])
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--plans", nargs="+", choices=["scan", "shuffle", "auto"], default=["scan", "shuffle"],
                    help="yfpp spark --plan values to run, each after yfpp run (default: scan shuffle)")
    ap.add_argument("--partitions", type=int, help="yfpp spark --partitions (default: its own, 2 × the cores)")
    ap.add_argument("--class-archive", metavar="FILE", default="auto",
                    help="yfpp spark --class-archive: FILE, auto (default: the cached one) or off; written first if missing")
    ap.add_argument("--spark-args", default="", help="more yfpp spark arguments, e.g. \"--conf spark.driver.extraJavaOptions=\"")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", help="also write the table to this Markdown file")
    args = ap.parse_args()
    path = feed(args.events, args.queries, args.seed)
    py = [sys.executable, "-m", "yfpp.cli"]
    spark_opts = ["--master", args.master, "--stats", "--class-archive", args.class_archive, *shlex.split(args.spark_args)]
    spark_opts += ["--partitions", str(args.partitions)] if args.partitions else []
    rows = []
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        if args.class_archive != "off":
            from yfpp.spark.costs import default_class_archive

            archive = default_class_archive({}) if args.class_archive == "auto" else args.class_archive
            if archive and not os.path.isfile(archive):
                qa = query_args("shoplifting", args.queries, tmp)
                small = feed(20_000, 100, args.seed)
                wall, _, _ = timed(py + ["spark", *qa, "-i", str(small), "-o", str(tmp / "warm"), *spark_opts])
                print(f"warm-up run (writes the class archive {archive}): {wall:.1f} s", file=sys.stderr)
        cores = cores_for_two()
        print(f"two CPU-bound processes get {cores:.2f} cores", file=sys.stderr)
        for w in args.workloads:
            qa = query_args(w, args.queries, tmp)
            load = os.getloadavg()[0]
            run_wall, run_cpu, _ = timed(py + ["run", *qa, "-i", str(path), "-o", str(tmp / f"{w}.run.jsonl")])
            rows.append((w, "yfpp run", run_wall, run_cpu, ids(tmp / f"{w}.run.jsonl"), load, ""))
            print(f"{w}: yfpp run {run_wall:.1f} s, {run_cpu:.1f} CPU s", file=sys.stderr)
            for plan in args.plans:
                load = os.getloadavg()[0]
                out = tmp / f"{w}.{plan}.spark"
                wall, cpu, err = timed(py + ["spark", *qa, "-i", str(path), "-o", str(out), "--plan", plan, *spark_opts])
                start = next((re.match(r"\s*start JVM \+ session(?: \(.*?\))?\s+(\S+)", ln).group(1)
                              for ln in err.splitlines() if ln.strip().startswith("start JVM + session")), "")
                rows.append((w, f"yfpp spark --master {args.master} --plan {plan}", wall, cpu, ids(out / "matches.jsonl"),
                             load, start))
                print(f"{w}: yfpp spark --plan {plan} {wall:.1f} s, {cpu:.1f} CPU s\n{err[err.find('plan '):]}",
                      file=sys.stderr)
    lines = [f"{args.events:,} RFID events in one JSON-lines file, {os.cpu_count()} cores "
             f"(two CPU-bound processes got {cores:.2f} of them)", "",
             "| workload | command | wall s | CPU s | of which JVM + session start, wall s | matches | same matches as yfpp run | load avg before |",
             "|---|---|---:|---:|---:|---:|---|---:|"]
    base: dict[str, Counter] = {}
    for w, name, wall, cpu, got, load, start in rows:
        same = "" if w not in base else ("yes" if got == base[w] else "**no**")
        base.setdefault(w, got)
        lines.append(f"| {w} | `{name}` | {wall:.1f} | {cpu:.1f} | {start} | {sum(got.values()):,} | {same} | {load:.1f} |")
    lines += ["", "Command: `python benchmarks/spark_vs_run.py " + " ".join(sys.argv[1:]) + "`"]
    print("\n".join(lines))
    if args.out:
        Path(args.out).write_text("\n".join(lines) + "\n", encoding="utf-8")
    return 0 if all(r[4] == base[r[0]] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
