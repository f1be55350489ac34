"""The SIGMOD 2008 §6 stock workload: throughput of the 12 (P, ES, W) queries.

Query template (SASE+)::

    PATTERN SEQ(stock+ a[], stock b)
    WHERE ES(a, b) { [symbol] AND a[1].price % 500 = 0 AND P AND b.volume < 150 }
    WITHIN 2*W

P = p1 (none), p2 (``a[i].price > a[i-1].price``), p3 (``a[i].price >
min(a[..i-1].price)``); ES = s2 (partition_contiguity), s3
(skip_till_next_match). W counts events of one partition (paper); with two
symbols and ts = global event index, W events of one symbol span about 2·W ts
units, hence ``WITHIN 2*W``.

Streams come from :func:`yfpp.input.generate.generate_stock` (2 symbols) and are
written once per (size, p_up, seed) as JSON lines under ``benchmarks/data/``.
Each engine pass reads the file with :func:`yfpp.input.readers.read_events`; a
parse-only pass over the same file runs before and after every engine pass
(same process), and their mean rate gives the ratio engine time / parse time.

Default ``--p-up`` is 1/3, not the paper's 0.7: generate_stock's walk (reflected
at 1 and 1000) drifts up for any p_up > 1/3 and hovers near 1000, so
``a[1].price % 500 = 0`` holds for 7–12 % of the events instead of ~1/500 and
runs no longer "start rarely" (see benchmarks/RESULTS.md).

    python benchmarks/stock_benchmark.py --quick
    python benchmarks/stock_benchmark.py --windows 500 --sizes 200000
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from yfpp.engine import Engine
from yfpp.input.generate import generate_stock, write_events
from yfpp.input.readers import read_events
from bench_common import commit

DATA = Path(__file__).resolve().parent / "data"
PLOT = Path(__file__).resolve().parent / "stock.png"
PREDICATES = {"p1": "", "p2": " AND a[i].price > a[i-1].price", "p3": " AND a[i].price > min(a[..i-1].price)"}
STRATEGIES = {"s2": "partition_contiguity", "s3": "skip_till_next_match"}
TEMPLATE = ("PATTERN SEQ(stock+ a[], stock b) WHERE {es}(a, b) "
            "{{ [symbol] AND a[1].price % 500 = 0{p} AND b.volume < 150 }} WITHIN {within}")


def query(p: str, s: str, w: int) -> str:
    """The template for predicate ``p``, strategy ``s`` and partition window ``w`` (events)."""
    return TEMPLATE.format(es=STRATEGIES[s], p=PREDICATES[p], within=2 * w)


def stream_file(n: int, p_up: float, seed: int) -> Path:
    """The JSON-lines stock stream of ``n`` events, generated on first use."""
    path = DATA / f"stock_n{n}_p{p_up:.3f}_s{seed}.jsonl"
    if not path.exists():
        DATA.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        write_events(generate_stock(n, symbols=2, p_up=p_up, seed=seed), tmp, "jsonl")
        tmp.replace(path)
    return path


def parse_rate(path: Path) -> float:
    """Events/s of read_events alone over ``path``."""
    t0 = time.perf_counter()
    n = sum(1 for _ in read_events(path))
    return n / max(time.perf_counter() - t0, 1e-9)


@dataclass
class Row:
    p: str
    s: str
    w: int
    size: int  # events in the file
    events: int = 0  # events processed (< size when cut by the budget)
    seconds: float = 0.0
    parse_rate: float = 0.0
    runs_touched: int = 0
    runs_created: int = 0
    peak_runs: int = 0
    matches: int = 0
    bound: int = 0  # events over all matches' bindings

    @property
    def rate(self) -> float:
        return self.events / max(self.seconds, 1e-9)

    @property
    def cells(self) -> list[str]:
        n = max(self.events, 1)
        size = f"{self.size:,}" if self.events == self.size else f"{self.events:,} of {self.size:,} (cut)"
        return [self.p, self.s, str(self.w), str(2 * self.w), size, f"{self.rate:,.0f}", f"{self.parse_rate:,.0f}",
                f"{self.parse_rate / max(self.rate, 1e-9):.1f}", f"{self.runs_touched / n:.2f}", f"{self.runs_created:,}",
                f"{self.peak_runs:,}", f"{self.matches:,}", f"{self.bound / max(self.matches, 1):.1f}"]


HEADER = ["P", "ES", "W", "WITHIN", "events", "ev/s", "parse ev/s", "engine/parse",
          "runs touched/ev", "runs created", "peak runs", "matches", "avg match len"]


def run_engine(row: Row, path: Path, budget: float) -> None:
    """Read ``path`` through a fresh engine with the row's query; fill the row (stop after ``budget`` s)."""
    eng = Engine()
    eng.register(query(row.p, row.s, row.w), name=f"{row.p}{row.s}")
    n = matches = bound = 0
    t0 = time.perf_counter()
    deadline = t0 + budget
    for ev in read_events(path):
        n += 1
        for m in eng.process(ev):
            matches += 1
            bound += sum(map(len, m["bindings"].values()))
        if n & 63 == 0 and time.perf_counter() > deadline:
            break
    else:
        for m in eng.flush():
            matches += 1
            bound += sum(map(len, m["bindings"].values()))
    row.seconds = time.perf_counter() - t0
    c = eng.stats
    row.events, row.runs_touched, row.runs_created, row.peak_runs = n, c.runs_touched, c.runs_created, c.peak_runs
    row.matches, row.bound = matches, bound


def bench(windows: list[int], sizes: list[int], p_up: float, seed: int, budget: float) -> list[Row]:
    """All (P, ES) for each window; parse-only passes interleaved with the engine passes."""
    rows: list[Row] = []
    for w, size in zip(windows, sizes):
        path = stream_file(size, p_up, seed)
        before = parse_rate(path)
        for p in PREDICATES:
            for s in STRATEGIES:
                row = Row(p, s, w, size)
                run_engine(row, path, budget)
                after = parse_rate(path)
                row.parse_rate, before = (before + after) / 2, after
                rows.append(row)
                print(f"  {p}{s} W={w}: {row.events:,} ev in {row.seconds:.1f} s", file=sys.stderr, flush=True)
    return rows


def smoke_errors(rows: list[Row]) -> list[str]:
    """Invariants a --quick run checks: whole stream read, p1 finds matches, p1s2 = p1s3 (paper §6)."""
    errs = [f"{r.p}{r.s} W={r.w}: read {r.events} of {r.size} events" for r in rows if r.events != r.size]
    for w in {r.w for r in rows}:
        p1 = {r.s: (r.matches, r.bound, r.runs_touched) for r in rows if r.w == w and r.p == "p1"}
        if not p1.get("s2", (0,))[0]:
            errs.append(f"p1s2 W={w}: no matches")
        if p1.get("s2") != p1.get("s3"):
            errs.append(f"W={w}: p1s2 {p1.get('s2')} != p1s3 {p1.get('s3')}")
    return errs


def markdown(rows: Iterable[Row]) -> str:
    """The rows as a Markdown table."""
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    lines += ["| " + " | ".join(r.cells) + " |" for r in rows]
    return "\n".join(lines)


def plot(rows: list[Row], out: Path = PLOT) -> None:
    """events/s by W per (P, ES), if matplotlib is installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, ax = plt.subplots(figsize=(6, 4))
    for p in PREDICATES:
        for s in STRATEGIES:
            pts = sorted((r.w, r.rate) for r in rows if (r.p, r.s) == (p, s))
            if pts:
                ax.plot(*zip(*pts), marker="o", label=f"{p}{s}")
    ax.set(xlabel="W (events per partition)", ylabel="events/s", yscale="log", title="Stock workload (SIGMOD 2008 §6)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out)



def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true",
                    help="smoke test: W 50, 100 over a 20,000-event stream; exit 1 if an invariant fails")
    ap.add_argument("--windows", type=int, nargs="+", default=[500, 1000, 2000], help="W, events per partition")
    ap.add_argument("--sizes", type=int, nargs="+",
                    help="total events per stream, one per window or one for all (default 400·W: 200·W per symbol)")
    ap.add_argument("--p-up", type=float, default=1 / 3, help="probability of a price rise (default 1/3; paper 0.7)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--budget", type=float, default=180.0, help="stop an engine pass after this many seconds")
    ap.add_argument("--no-plot", action="store_true")
    args = ap.parse_args(argv)
    windows = [50, 100] if args.quick else args.windows
    sizes = [20000] if args.quick else args.sizes or [400 * w for w in windows]
    if len(sizes) == 1:
        sizes *= len(windows)
    if len(sizes) != len(windows):
        ap.error("--sizes takes one value or one per window")
    print("command: " + shlex.join(getattr(sys, "orig_argv", [sys.executable, *sys.argv])))
    print(f"yfpp commit: {commit()} (working tree may differ); python {sys.version.split()[0]}")
    print(f"stream: generate_stock(symbols=2, p_up={args.p_up:.3f}, seed={args.seed}), JSON lines in {DATA}")
    rows = bench(windows, sizes, args.p_up, args.seed, args.budget)
    print(markdown(rows))
    if args.quick:
        errs = smoke_errors(rows)
        for e in errs:
            print(f"smoke check failed: {e}", file=sys.stderr)
        return 1 if errs else 0
    if not args.no_plot:
        plot(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
