"""The match-windows paper's experiment (§6), in spirit: throughput of event-set
queries evaluated directly against the two-phase match-window strategy with
filtering (f), partitioning (p) and necessary conditions (c) switched on one
by one, relative to a plain match window (baseline), as in Figures 6 and 8.

Data are synthetic stand-ins for the paper's Onco and NYSE sets:

* Onco-like: patients in chemotherapy cycles of 21 days — C and D on day 0,
  Prednisone P on days 1–3 (doses drawn per cycle, so rising or not), R on
  day 0–2, blood counts B and H around days 7 and 14, and unrelated X exams;
  cycles of different patients are shifted in time.
* NYSE-like: trades (type ``trade``, attributes symbol and price) of 20
  symbols, exponentially spaced (mean 1 ms), each price a random walk.

Patterns: Pseq = ⟨{v1}, …, {vk}⟩ and Pset = ⟨{v1, …, vk}⟩ over k distinct
Onco types (consecutive variables related by PID equality), P_onco =
⟨{c, d}, {p+, r+}, {b, h}⟩ and P_nyse = ⟨{a+, g+}, {i+}⟩ (AAPL and GOOG
rising, then IBM falling).  Throughput is events per CPU second
(``time.process_time``) of one matcher fed the whole stream and flushed.

    python benchmarks/match_window_benchmark.py            # the full sweep (a few minutes)
    python benchmarks/match_window_benchmark.py --quick    # a smoke run
    python benchmarks/match_window_benchmark.py --sweeps P_onco,P_nyse --save b.json   # some sweeps
    python benchmarks/match_window_benchmark.py --sweeps none --load a.json b.json     # plot saved ones
    python benchmarks/match_window_benchmark.py --one-window 1200     # one large window, both strategies

``--one-window N``: one partition of N events A or B (drawn at random) within one window,
``[k]//A//B(100)`` and its set forms through ``Engine.process_batch`` under each strategy — CPU
seconds, matches, the most matches handed to one ``out.extend`` and a digest of the matches in output order.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import sys
import time
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.bench_common import ROOT, commit  # noqa: E402
from yfpp.engine import Engine  # noqa: E402
from yfpp.sets.direct import DirectMatcher  # noqa: E402
from yfpp.sets.match_window import MatchWindowMatcher
from yfpp.sets.plan import compile_sets
from yfpp.input.events import Event  # noqa: E402
from yfpp.language.query_text import parse_query  # noqa: E402

DAY = 86400.0
ONCO_TYPES = ["C", "D", "P", "R", "B", "H", "X"]
# name -> how the matcher is built: None is direct evaluation, else the match-window switches
CONFIGS: dict[str, dict[str, bool] | None] = {
    "direct": None,
    "baseline": {"filtering": False, "partitioning": False, "conditions": False},
    "f": {"filtering": True, "partitioning": False, "conditions": False},
    "fp": {"filtering": True, "partitioning": True, "conditions": False},
    "fc": {"filtering": True, "partitioning": False, "conditions": True},
    "fpc": {"filtering": True, "partitioning": True, "conditions": True},
}


# --- data -----------------------------------------------------------------------------------


def onco_events(patients: int, cycles: int, seed: int = 1) -> list[Event]:
    rng = random.Random(seed)
    rows: list[tuple[float, str, int, float]] = []
    for pid in range(patients):
        start = rng.uniform(0, 365) * DAY
        for cycle in range(cycles):
            t0 = start + cycle * 21 * DAY + rng.uniform(-1, 1) * DAY
            rows.append((t0, "C", pid, rng.gauss(1600, 100)))
            rows.append((t0 + rng.uniform(0, 1) * DAY, "D", pid, rng.gauss(80, 5)))
            base = rng.uniform(80, 120)
            for day in (1, 2, 3):
                rows.append((t0 + day * DAY + rng.uniform(0, 0.5) * DAY, "P", pid, base + rng.gauss(day * 4, 6)))
            rows.append((t0 + rng.uniform(0, 2) * DAY, "R", pid, rng.gauss(50, 5)))
            for day in (7, 14):
                rows.append((t0 + (day + rng.uniform(-1, 1)) * DAY, "B", pid, rng.gauss(4000, 800)))
                rows.append((t0 + (day + rng.uniform(-1, 1)) * DAY, "H", pid, rng.gauss(12, 1.5)))
            for _ in range(rng.randint(0, 3)):
                rows.append((t0 + rng.uniform(0, 21) * DAY, "X", pid, rng.gauss(1, 0.2)))
    rows.sort()
    return [Event(typ, t, {"PID": pid, "V": round(v, 1)}, i) for i, (t, typ, pid, v) in enumerate(rows)]


def nyse_events(n: int, seed: int = 2) -> list[Event]:
    rng = random.Random(seed)
    symbols = ["AAPL", "GOOG", "IBM"] + [f"S{i:02d}" for i in range(17)]
    price = {s: rng.uniform(20, 500) for s in symbols}
    t = 0.0
    out = []
    for seq in range(n):
        t += rng.expovariate(1000.0)  # mean 1 ms
        s = rng.choice(symbols)
        price[s] = round(max(1.0, price[s] + rng.choice([-1, 1]) * rng.uniform(0.01, 0.2)), 2)
        out.append(Event("trade", round(t, 4), {"symbol": s, "price": price[s]}, seq))
    return out


# --- patterns -------------------------------------------------------------------------------


def onco_pattern(types: list[str], as_set: bool, tau_days: int) -> str:
    vars_ = [f"v{i}" for i in range(len(types))]
    decls = [f"{t} {v}" for t, v in zip(types, vars_)]
    body = "{" + ", ".join(decls) + "}" if as_set else ", ".join("{" + d + "}" for d in decls)
    rel = " AND ".join(f"{a}.PID = {b}.PID" for a, b in zip(vars_, vars_[1:]))
    return f"PATTERN SEQ({body}) {'WHERE ' + rel if rel else ''} WITHIN {tau_days} days"


def p_onco(tau_days: int) -> str:
    return (
        "PATTERN SEQ({C c, D d}, {P+ p[], R+ r[]}, {B b, H h}) WHERE c.PID = d.PID AND d.PID = p.PID "
        f"AND p.PID = r.PID AND r.PID = b.PID AND b.PID = h.PID AND prev(p.V) < p.V WITHIN {tau_days} days"
    )


def p_nyse(tau_ms: int) -> str:
    return (
        "PATTERN SEQ({trade+ a[], trade+ g[]}, trade+ i[]) WHERE a.symbol = 'AAPL' AND g.symbol = 'GOOG' "
        "AND i.symbol = 'IBM' AND prev(a.price) < a.price AND prev(g.price) < g.price "
        f"AND prev(i.price) > i.price WITHIN {tau_ms} ms"
    )


# --- measuring -------------------------------------------------------------------------------


ONE_WINDOW_QUERIES = [
    "[k]//A//B(100)",
    "PATTERN SEQ({A a}, {B b}) WHERE [k] WITHIN 100",
    "PATTERN {A a, B b} WHERE [k] WITHIN 100",
]


def one_window_events(n: int, seed: int = 1) -> list[Event]:
    """One partition: ``n`` events, each A or B at random, spread over 99 time units (one window of 100)."""
    rng = random.Random(seed)
    return [Event(rng.choice("AB"), round(i * 99.0 / n, 3), {"k": 1}, i) for i in range(n)]


class _Digest:
    """An ``out`` that keeps no match: counts them, the largest ``extend``, a sha256 of them in order."""

    def __init__(self) -> None:
        self.n, self.most, self.sha = 0, 0, hashlib.sha256()

    def extend(self, matches) -> None:
        matches = list(matches)
        self.n += len(matches)
        self.most = max(self.most, len(matches))
        for m in matches:
            self.sha.update(orjson.dumps(m, option=orjson.OPT_SORT_KEYS))


def one_window(n: int) -> None:
    """CPU seconds of each strategy over one window of ``n`` events (Engine.process_batch, then flush)."""
    print(f"commit {commit()}; one partition, {n:,} events in one window")
    for query in ONE_WINDOW_QUERIES:
        for strategy in ("direct", "match-window"):
            events = [Event(e.type, e.ts, dict(e.attrs), e.seq) for e in one_window_events(n)]
            eng = Engine(strategy=strategy)
            eng.register(query, name="q")
            out = _Digest()
            t0 = time.process_time()
            eng.process_batch(events, out)
            eng.flush(out)
            cpu = time.process_time() - t0  # (the digest's orjson.dumps is in it, alike for both)
            print(f"{query:<48} {strategy:<13} {cpu:7.2f} CPU s  {out.n:>9,} matches  at most {out.most:,} per "
                  f"extend  sha256 {out.sha.hexdigest()[:16]}", flush=True)


def measure(query: str, events: list[Event], config: str) -> tuple[float, int, dict]:
    """(events per CPU second, matches, matcher stats) of one matcher over ``events``."""
    plan = compile_sets(parse_query(query), "q")
    switches = CONFIGS[config]
    matcher = DirectMatcher(plan) if switches is None else MatchWindowMatcher(plan, **switches)
    t0 = time.process_time()
    n = 0
    for ev in events:
        n += len(matcher.process(ev))
    n += len(matcher.flush())
    cpu = max(time.process_time() - t0, 1e-6)
    return len(events) / cpu, n, matcher.stats()


def sweep(label: str, cases: list[tuple[str, list[str], list[Event]]], configs: list[str]) -> list[dict]:
    """``cases``: (x value, queries averaged over, events).  One row per x, throughput per config."""
    rows = []
    for x, queries, events in cases:
        row: dict = {"sweep": label, "x": x, "events": len(events)}
        for config in configs:
            rates, matches, seen, candidates = [], set(), 0, 0
            for q in queries:
                rate, n, stats = measure(q, events, config)
                rates.append(rate)
                matches.add((q, n))
                seen += stats.get("windows seen", 0)
                candidates += stats.get("candidate windows", 0)
            if config in ("fc", "fpc"):
                row["candidate share"] = candidates / max(seen, 1)
            row[config] = sum(rates) / len(rates)
            row.setdefault("matches", sorted(matches))
            assert row["matches"] == sorted(matches), f"{label} {x}: {config} found other matches"
        row["matches"] = [list(m) for m in row["matches"]]
        rows.append(row)
        print(format_row(row, configs), flush=True)
    return rows


def format_row(row: dict, configs: list[str]) -> str:
    base = row["baseline"]
    factors = "  ".join(f"{c} {row[c] / base:6.2f}x" for c in configs if c != "baseline")
    n = sum(m for _, m in row["matches"])
    return f"{row['sweep']:<12} x={row['x']:<8} events {row['events']:>7,}  baseline {base:10,.0f} ev/s  {factors}  matches {n:,}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small data, few points")
    ap.add_argument("--plot", default=str(ROOT / "benchmarks" / "match_window.png"))
    ap.add_argument("--patterns", type=int, default=3, help="random patterns averaged per k (paper: 10)")
    ap.add_argument("--sweeps", default="all", help="comma-separated: Pseq, Pset, P_onco, P_nyse (default all; none)")
    ap.add_argument("--save", help="write the results as JSON here after each sweep")
    ap.add_argument("--load", nargs="*", default=[], help="results saved by --save to plot with these")
    ap.add_argument("--one-window", type=int, metavar="N", help="only the one-window workload of N events")
    args = ap.parse_args(argv)
    if args.one_window:
        one_window(args.one_window)
        return 0
    chosen = {"Pseq", "Pset", "P_onco", "P_nyse"} if args.sweeps == "all" else set(args.sweeps.split(","))
    results: dict[str, list[dict]] = {}
    for path in args.load:
        results.update(json.loads(Path(path).read_text()))

    def done(name: str, rows: list[dict]) -> None:
        results[name] = rows
        if args.save:
            Path(args.save).write_text(json.dumps(results))

    rng = random.Random(7)
    quick = args.quick
    onco = onco_events(20 if quick else 60, 4)
    # Pset's plain match window slows down steeply with k: up to 5 variables here, 7 for Pseq
    ks = {"Pseq onco": [2, 3] if quick else [1, 2, 3, 4, 5, 6, 7], "Pset onco": [2, 3] if quick else [1, 2, 3, 4, 5]}
    print(f"commit {commit()}; Onco-like {len(onco):,} events", flush=True)
    onco_cfg = ["direct", "baseline", "f", "fp", "fpc"]
    for name, as_set in (("Pseq onco", False), ("Pset onco", True)):
        if name.split()[0] not in chosen:
            continue
        cases = []
        for k in ks[name]:
            pats = [onco_pattern(rng.sample(ONCO_TYPES, k), as_set, 10) for _ in range(1 if quick else args.patterns)]
            cases.append((str(k), pats, onco))
        done(name, sweep(name, cases, onco_cfg))
    if "P_onco" in chosen:
        taus = [5, 15] if quick else [5, 15, 25, 35, 45]
        done("P_onco", sweep("P_onco", [(f"{t}d", [p_onco(t)], onco) for t in taus], onco_cfg))
    if "P_nyse" in chosen:
        nyse = nyse_events(2000 if quick else 20000)
        nyse_cfg = ["direct", "baseline", "f", "fc"]
        tms = [10, 50] if quick else [10, 30, 50, 70, 90]
        done("P_nyse tau", sweep("P_nyse tau", [(f"{t}ms", [p_nyse(t)], nyse) for t in tms], nyse_cfg))
        sizes = [100, 1000] if quick else [100, 1000, 10000, 100000]
        done("P_nyse |E|", sweep("P_nyse |E|", [(str(n), [p_nyse(20)], nyse_events(n)) for n in sizes], nyse_cfg))
    order = ["Pseq onco", "Pset onco", "P_onco", "P_nyse tau", "P_nyse |E|"]
    ordered = {k: results[k] for k in order if k in results}
    print(markdown(ordered))
    plot(ordered, args.plot)
    return 0


def markdown(results: dict[str, list[dict]]) -> str:
    """One table: throughput of the plain match window, and each configuration's factor over it."""
    configs = [c for c in CONFIGS if c != "baseline"]
    head = "| pattern | x | events | baseline ev/s | " + " | ".join(configs) + " | matches | candidate windows (fpc/fc) |"
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for name, rows in results.items():
        for r in rows:
            cells = [f"{r[c] / r['baseline']:.2f}×" if c in r else "–" for c in configs]
            share = f"{100 * r['candidate share']:.1f} %" if "candidate share" in r else "–"
            n = sum(m for _, m in r["matches"])
            lines.append(f"| {name.replace('|', '&#124;')} | {r['x']} | {r['events']:,} | {r['baseline']:,.0f} | " + " | ".join(cells) + f" | {n:,} | {share} |")
    return "\n".join(lines)


def plot(results: dict[str, list[dict]], path: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no plot", file=sys.stderr)
        return
    if not results:
        return
    fig, axes = plt.subplots(1, len(results), figsize=(4 * len(results), 3.4), squeeze=False)
    axes = axes[0]
    for ax, (name, rows) in zip(axes, results.items()):
        xs = [r["x"] for r in rows]
        for config in [c for c in CONFIGS if c in rows[0] and c != "baseline"]:
            color = {"direct": "C0", "f": "C1", "fp": "C2", "fc": "C4", "fpc": "C3"}[config]
            ax.plot(xs, [r[config] / r["baseline"] for r in rows], marker="o", label=config, color=color)
        ax.set_title(name)
        ax.set_yscale("log")
        ax.set_xlabel({"P_onco": "τ", "P_nyse tau": "τ", "P_nyse |E|": "|E|"}.get(name, "# variables"))
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    axes[0].set_ylabel("throughput / plain match window")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"plot: {path}")


if __name__ == "__main__":
    sys.exit(main())
