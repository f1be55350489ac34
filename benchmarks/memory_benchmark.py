"""Peak memory against input size for the two runaway cases of issue 8 item 8.

1. ``runaway``: ``SEQ(a x, b+ y[], c z) WHERE skip_till_any_match(x, y, z) WITHIN 1 hour``
   over 1 a, N b, 1 c — every b doubles the runs (each takes it or skips it).
2. ``windowless``: ``SEQ(a x, b y) WHERE skip_till_any_match(x, y)`` over N a's and no b —
   every a starts a run that never ends.
3. ``set_runaway`` (``--sets``): the event-set query ``SEQ({a x, b+ y[]}, c z) WITHIN 1 hour``
   over 1 a, N b, 1 c — 2^N matches, under both evaluation strategies.

Each measurement runs in a fresh subprocess (so peak RSS is its own) and prints
the peak RSS, the CPU seconds, the peak live runs, the runs shed and the reports.

    python benchmarks/memory_benchmark.py                 # default caps, and a few uncapped points
    python benchmarks/memory_benchmark.py --quick         # smaller sizes
    python benchmarks/memory_benchmark.py --sets          # only the event-set case
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.bench_common import ROOT, commit  # noqa: E402

QUERIES = {
    "runaway": "PATTERN SEQ(a x, b+ y[], c z) WHERE skip_till_any_match(x, y, z) WITHIN 1 hour",
    "windowless": "PATTERN SEQ(a x, b y) WHERE skip_till_any_match(x, y)",
    "set_runaway": "PATTERN SEQ({a x, b+ y[]}, c z) WITHIN 1 hour",
}


def measure(case: str, n: int, caps: dict) -> dict:
    """Run one case in this process (called in the child)."""
    import gc
    import resource
    import time

    from yfpp.input.dead_letters import DeadLetters
    from yfpp.engine import Engine
    from yfpp.input.events import Event

    gc.freeze()
    eng = Engine(dead_letters=DeadLetters(), reports=None, **caps)
    eng.register(QUERIES[case], name=case)
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.process_time()
    peak = matches = 0
    if case in ("runaway", "set_runaway"):
        feed = [("a", 0.0)] + [("b", 1.0 + i) for i in range(n)] + [("c", n + 1.0)]
    else:
        feed = (("a", float(i)) for i in range(n))
    for seq, (etype, ts) in enumerate(feed):
        matches += len(eng.process(Event(etype, ts, {}, seq)))
        peak = max(peak, eng.stats.live_runs)
    matches += len(eng.flush())
    return {
        "case": case, "n": n, "caps": caps, "cpu_s": round(time.process_time() - t0, 2),
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "rss_growth_mib": round((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) / 1024, 1),
        "peak_runs": peak, "shed": sum(eng.stats.shed_runs.values()), "matches": matches,
        "buffer": eng.stats.peak_buffer, "reports": len(eng.reports),
    }


def child(case: str, n: int, caps: dict, timeout: float) -> dict:
    cmd = [sys.executable, __file__, "--child", json.dumps([case, n, caps])]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT, check=True)
    except subprocess.TimeoutExpired:
        return {"case": case, "n": n, "caps": caps, "error": f"over {timeout:.0f} s"}
    except subprocess.CalledProcessError as e:
        return {"case": case, "n": n, "caps": caps, "error": (e.stderr.strip().splitlines() or ["failed"])[-1][:80]}
    return json.loads(out.stdout)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--sets", action="store_true", help="only the event-set case")
    ap.add_argument("--timeout", type=float, default=600)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(measure(*json.loads(args.child))))
        return
    uncapped = {"max_runs_per_query": 10**9, "max_buffer_per_query": 10**9}
    plan = [("runaway", n, {}) for n in ([10, 100, 1000] if args.quick else [10, 100, 1000, 10_000])]
    plan += [("runaway", n, uncapped) for n in ([10, 14, 16] if args.quick else [10, 14, 17, 19])]
    sizes = [10_000, 100_000, 300_000] if args.quick else [10_000, 100_000, 250_000, 500_000, 1_000_000]
    plan += [("windowless", n, {}) for n in sizes]
    plan += [("windowless", n, uncapped) for n in sizes]
    set_plan = [("set_runaway", n, {"strategy": s}) for s in ("direct", "match-window") for n in (10, 1000, 3000)]  # within τ
    plan = set_plan if args.sets else plan + set_plan
    print(f"commit {commit()}; peak RSS of a fresh process per row (Python {sys.version.split()[0]})")
    print("| case | caps | input events | CPU s | peak RSS MiB | RSS growth MiB | peak runs | runs shed | peak buffer | matches | reports |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for case, n, caps in plan:
        r = child(case, n, caps, args.timeout)
        label = "none" if "max_runs_per_query" in caps else "default"
        label += f", {caps['strategy']}" if "strategy" in caps else ""
        events = n + 2 if case in ("runaway", "set_runaway") else n
        if "error" in r:
            print(f"| {case} | {label} | {events:,} | {r['error']} | | | | | | | |", flush=True)
            continue
        print(f"| {case} | {label} | {events:,} | {r['cpu_s']} | {r['peak_rss_mib']} | {r['rss_growth_mib']} | {r['peak_runs']:,} | "
              f"{r['shed']:,} | {r['buffer']:,} | {r['matches']:,} | {r['reports']} |", flush=True)


if __name__ == "__main__":
    main()
