"""yfpp against Apache Flink's MATCH_RECOGNIZE on the same shoplifting feeds, 1 to 100 queries.

For each number of queries N, the same JSON-lines RFID feed (``yfpp generate rfid`` plus an input
position field ``n``) goes through ``yfpp run`` with N shoplifting subscriptions and through one Flink
job with N MATCH_RECOGNIZE statements (``flink_job.py``, run with the Python of a virtual
environment holding ``apache-flink``: ``pip install -e '.[peers]'`` there, see RESULTS.md).  Both
are whole processes; their CPU seconds are measured (yfpp's as a waited-for child; Flink's as the
job script's own plus its JVM's, read from /proc by the script just before it exits), and Flink's start-up —
the same job over an empty feed — is reported apart and subtracted.  The match sets must agree
exactly (the script exits 1 otherwise).  Prints a table and draws ``benchmarks/peers.png``.

    python benchmarks/peers/peer_benchmark.py --flink-python /work/flinkenv/bin/python
    python benchmarks/peers/peer_benchmark.py --flink-python PY --events 1000000 --queries 1 10 100
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import resource
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from bench_common import ROOT, commit  # noqa: E402
from shoplifting_queries import query_file  # noqa: E402

from yfpp.input.generate import generate_rfid  # noqa: E402

DATA = HERE.parent / "data"
PLOT = HERE.parent / "peers.png"


def feed(n: int, seed: int) -> Path:
    """The RFID feed of ``n`` events with input positions, written once."""
    path = DATA / f"peers_rfid_n{n}_s{seed}.jsonl"
    if not path.exists():
        DATA.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        with open(tmp, "w") as f:
            for i, rec in enumerate(generate_rfid(n, seed=seed)):
                f.write(json.dumps({"n": i, **rec}) + "\n")
        tmp.replace(path)
    return path


def children_cpu(cmd: list[str], **kw) -> float:
    """CPU seconds (user + system) of ``cmd`` and everything it started."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(cmd, check=True, **kw)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def run_yfpp(path: Path, n_queries: int, work: Path) -> tuple[float, set]:
    qfile = work / f"q{n_queries}.sase"
    qfile.write_text(query_file(n_queries))
    out = work / f"yfpp_{n_queries}.jsonl"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cpu = children_cpu([sys.executable, "-m", "yfpp.cli", "run", "-q", str(qfile), "-i", str(path), "-o", str(out)], env=env)
    found = set()
    with open(out) as f:
        for line in f:
            m = json.loads(line)
            found.add((m["query"], m["bindings"]["a"][0], m["bindings"]["c"][0]))
    return cpu, found


def run_flink(python: str, path: Path, n_queries: int, work: Path, tag: str) -> tuple[float, set]:
    out = work / f"flink_{tag}_{n_queries}"
    cmd = [python, str(HERE / "flink_job.py"), "--input", str(path), "--queries", str(n_queries), "--out", str(out)]
    done = subprocess.run(cmd, check=True, capture_output=True, text=True)
    cpu = json.loads(done.stdout.strip().splitlines()[-1])["cpu_seconds"]
    found = set()
    for part in out.rglob("*"):
        if part.is_file() and not part.name.startswith("."):
            with open(part) as f:
                found.update((q, int(a), int(c)) for q, a, c in csv.reader(f))
    return cpu, found


def plot(rows: list[dict]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    qs = [r["queries"] for r in rows]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(qs, [r["yfpp_us"] for r in rows], "o-", label="yfpp run (whole process)")
    ax.plot(qs, [r["flink_us"] for r in rows], "s-", label="Flink MATCH_RECOGNIZE (start-up excluded)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("subscriptions (shoplifting queries)")
    ax.set_ylabel("CPU µs per event")
    ax.set_title(f"Cost per event, {rows[0]['events']:,} RFID events")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(PLOT, dpi=110)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--flink-python", required=True, help="python of a virtual environment with apache-flink")
    ap.add_argument("--events", type=int, default=200_000)
    ap.add_argument("--queries", type=int, nargs="+", default=[1, 10, 100])
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--no-plot", action="store_true")
    args = ap.parse_args(argv)
    path = feed(args.events, args.seed)
    empty = DATA / "peers_empty.jsonl"
    empty.write_text("")
    print(f"# commit {commit()}: python benchmarks/peers/peer_benchmark.py {shlex.join(sys.argv[1:])}")
    print(f"# {args.events:,} RFID events; CPU seconds of the whole process tree; Flink start-up = same job, empty feed")
    print("| queries | matches | yfpp CPU s | yfpp ev/cpu-s | Flink CPU s | Flink start-up s | Flink ev/cpu-s "
          "(start-up excluded) | Flink / yfpp |")
    print("|---|---|---|---|---|---|---|---|")
    rows, ok = [], True
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for nq in args.queries:
            y_cpu, y_found = run_yfpp(path, nq, work)
            f_start, _ = run_flink(args.flink_python, empty, nq, work, "empty")
            f_cpu, f_found = run_flink(args.flink_python, path, nq, work, "feed")
            if y_found != f_found:
                ok = False
                print(f"# MISMATCH at {nq} queries: yfpp only {sorted(y_found - f_found)[:5]}, "
                      f"Flink only {sorted(f_found - y_found)[:5]}", file=sys.stderr)
            f_work = max(f_cpu - f_start, 1e-9)
            rows.append({"queries": nq, "events": args.events, "yfpp_us": y_cpu / args.events * 1e6,
                         "flink_us": f_work / args.events * 1e6})
            print(f"| {nq} | {len(y_found):,} | {y_cpu:.1f} | {args.events / y_cpu:,.0f} | {f_cpu:.1f} | {f_start:.1f} "
                  f"| {args.events / f_work:,.0f} | {f_work / y_cpu:.2f} |", flush=True)
    if not args.no_plot:
        plot(rows)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
