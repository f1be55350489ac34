"""The basic algorithm against the backtrack baseline (SIGMOD 2008 §5.3, Figure 8(d)).

Both orders run on the reference evaluator's run step (``yfpp/reference/backtrack.py``):
breadth first (every run of a partition advances on each event: the basic
algorithm's order) and depth first (one singleton run per partition, postponed
runs on a stack, events re-read after each backtrack: the backtrack
algorithm).  Same moves, same predicates, same matches; what differs is the
order, the stack and the re-reading.  The engine's own throughput on the same
stream is printed beside them for scale.

    python benchmarks/backtrack_benchmark.py                 # 20,000 events, W = 500
    python benchmarks/backtrack_benchmark.py --events 50000 --windows 500 1000
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time

from yfpp.reference.backtrack import Backtrack, BreadthFirst
from yfpp.engine import Engine
from yfpp.input.readers import read_events
from yfpp.language.sase_parser import parse_sase
from bench_common import commit
from stock_benchmark import PREDICATES, STRATEGIES, query, stream_file


# The paper's Expt 4 variant p*3: a third component whose predicates are selective, so that runs which
# proceeded to b usually fail at c (and the backtrack algorithm must try other runs).
STAR_TEMPLATE = ("PATTERN SEQ(stock+ a[], stock b, stock c) WHERE {es}(a, b, c) "
                 "{{ [symbol] AND a[1].price % 500 = 0 AND a[i].price > min(a[..i-1].price) AND b.volume < 150 "
                 "AND c.price > a[1].price AND c.price < a[a.len].price }} WITHIN {within}")


def queries(w: int) -> list[tuple[str, str]]:
    """(label, SASE+ text) of the template's six queries and the two p*3 ones, at window ``w``."""
    out = [(f"{p}{s}", query(p, s, w)) for s in STRATEGIES for p in PREDICATES]
    return out + [(f"p*3{s}", STAR_TEMPLATE.format(es=STRATEGIES[s], within=2 * w)) for s in STRATEGIES]


def cpu(fn) -> tuple[float, object]:
    t0 = time.process_time()
    out = fn()
    return time.process_time() - t0, out


def engine_matches(text: str, events) -> int:
    eng = Engine()
    eng.register(text)
    return sum(len(eng.process(e)) for e in events) + len(eng.flush())


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--events", type=int, default=20_000)
    ap.add_argument("--windows", type=int, nargs="+", default=[500])
    ap.add_argument("--p-up", type=float, default=1 / 3)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args(argv)
    events = list(read_events(stream_file(args.events, args.p_up, args.seed)))
    print(f"# commit {commit()}: python benchmarks/backtrack_benchmark.py {shlex.join(sys.argv[1:])}")
    print(f"# {len(events)} stock events, p_up={args.p_up:.3f}; ev/cpu-s = events per CPU second")
    print("| query | W | matches | basic ev/cpu-s | backtrack ev/cpu-s | basic / backtrack | run steps/event "
          "| re-reads/event | backtracks | engine ev/cpu-s |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for w in args.windows:
        for label, text in queries(w):
            pattern = parse_sase(text)
            bfs, dfs = BreadthFirst(pattern), Backtrack(pattern)
            t_bfs, m_bfs = cpu(lambda: bfs.matches(events))
            t_dfs, m_dfs = cpu(lambda: dfs.matches(events))
            t_eng, n_eng = cpu(lambda: engine_matches(text, events))
            assert len(m_bfs) == len(m_dfs) == n_eng, (len(m_bfs), len(m_dfs), n_eng)
            assert bfs.steps == dfs.steps
            n = len(events)
            print(f"| {label} | {w} | {len(m_bfs)} | {n / t_bfs:,.0f} | {n / t_dfs:,.0f} | {t_dfs / t_bfs:.2f} "
                  f"| {bfs.steps / n:.2f} | {dfs.rereads / n:.2f} | {dfs.backtracks} | {n / t_eng:,.0f} |",
                  flush=True)


if __name__ == "__main__":
    main()
