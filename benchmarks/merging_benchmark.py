"""Run merging (SIGMOD 2008 §5.2.2) on the §6 stock workload: the same queries with and without it.

For every (P, ES, W) of ``stock_benchmark`` (P = p1/p2/p3, ES = s2/s3, W =
500, 1000 by default) the same in-memory stream goes through a fresh engine
with ``merge_runs=False`` and one with ``merge_runs=True``, alternating,
``--repeats`` times each (more, up to 10, for short passes: ``--min-seconds``); the table gives the engine's events per CPU second
(the best pass, reading excluded: events are built before the clock starts;
matches are built as dicts, as ``Engine.process`` returns them), runs touched
per event (``stats.runs_touched``: a merged run counts once), the run
objects created (``stats.runs_created``, merged runs included), and checks that both passes found the same matches
(by match id and count).

    python benchmarks/merging_benchmark.py
    python benchmarks/merging_benchmark.py --windows 500 --size 20000 --repeats 1
"""

from __future__ import annotations

import argparse
import gc
import shlex
import sys
import time
from collections import Counter

from bench_common import commit
from stock_benchmark import PREDICATES, STRATEGIES, query, stream_file
from yfpp.engine import Engine
from yfpp.input.events import Event
from yfpp.input.readers import read_events


def one_pass(text: str, stream: list[Event], merge: bool) -> tuple[float, Counter, int, int, int]:
    """CPU seconds, match ids, runs touched, runs that joined another, runs created: one engine pass over ``stream``."""
    events = [Event(e.type, e.ts, e.attrs, e.seq) for e in stream]
    eng = Engine(merge_runs=merge, reports=None)
    eng.register(text, name="q")
    found: Counter = Counter()
    gc.collect()
    gc.freeze()
    t0 = time.process_time()
    for ev in events:
        for m in eng.process(ev):
            found[m["id"]] += 1
    for m in eng.flush():
        found[m["id"]] += 1
    seconds = time.process_time() - t0
    gc.unfreeze()
    merged = eng.runtime.merger.merged if merge else 0
    return seconds, found, eng.stats.runs_touched, merged, eng.stats.runs_created


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--windows", type=int, nargs="+", default=[500, 1000], help="W, events per partition")
    ap.add_argument("--size", type=int, default=100_000, help="events in the stream (default 100,000)")
    ap.add_argument("--p-up", type=float, default=1 / 3, help="probability of a price rise (as stock_benchmark)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeats", type=int, default=2, help="passes per setting, alternating; the best counts")
    ap.add_argument("--min-seconds", type=float, default=4.0,
                    help="more passes (up to 10) until both settings together took this much CPU")
    args = ap.parse_args(argv)
    print("command: " + shlex.join(getattr(sys, "orig_argv", [sys.executable, *sys.argv])))
    print(f"yfpp commit: {commit()} (working tree may differ); python {sys.version.split()[0]}")
    path = stream_file(args.size, args.p_up, args.seed)
    print(f"stream: {args.size:,} events, generate_stock(symbols=2, p_up={args.p_up:.3f}, seed={args.seed}) ({path.name})")
    stream = list(read_events(path))
    header = ["P", "ES", "W", "matches", "runs touched/ev off", "on", "runs created off", "on", "ev/CPU-s off", "on", "gain", "same matches"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    failed = False
    for w in args.windows:
        for p in PREDICATES:
            for s in STRATEGIES:
                text = query(p, s, w)
                best = {False: float("inf"), True: float("inf")}
                res = {}
                spent, passes = 0.0, 0
                while passes < args.repeats or (spent < args.min_seconds and passes < 10):
                    passes += 1
                    for merge in (False, True):
                        seconds, found, touched, merged, created = one_pass(text, stream, merge)
                        best[merge] = min(best[merge], seconds)
                        res[merge] = (found, touched, merged, created)
                        spent += seconds
                same = res[False][0] == res[True][0]
                failed |= not same
                n = len(stream)
                off, on = n / best[False], n / best[True]
                lines.append(f"| {p} | {s} | {w} | {sum(res[True][0].values()):,} | {res[False][1] / n:.2f} | "
                             f"{res[True][1] / n:.2f} | {res[False][3]:,} | {res[True][3]:,} | {off:,.0f} | {on:,.0f} | {on / off:.2f}× | "
                             f"{'yes' if same else 'NO'} |")
                print(f"  {p}{s} W={w}: off {off:,.0f} ev/s, on {on:,.0f} ev/s", file=sys.stderr, flush=True)
    print("\n".join(lines))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
