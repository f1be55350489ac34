"""Feedback cost: the YFilter++ §6.2 count example at scale, and a self-feeding query stopped by the guards.

    python benchmarks/feedback_benchmark.py [--shelves 100000]

Prints CPU seconds (time.process_time) for the count example with and without
feedback (without it, count_step matches once and nothing is derived), the
derived events per CPU second, and the cost of a self-feeding query that the
depth guard stops at every input event.
"""

from __future__ import annotations

import argparse
import time

from bench_common import commit

from yfpp.input.dead_letters import DeadLetters
from yfpp.engine import Engine
from yfpp.input.events import Event


def run(queries: list[tuple[str, str]], events: list[Event], **opts) -> tuple[float, int, Engine]:
    eng = Engine(dead_letters=DeadLetters(), **opts)
    for name, q in queries:
        eng.register(q, name=name)
    t = time.process_time()
    n = sum(len(eng.process(e)) for e in events) + len(eng.flush())
    return time.process_time() - t, n, eng


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shelves", type=int, default=100_000)
    args = ap.parse_args()
    n = args.shelves
    print(f"commit {commit()}, {n:,} shelf events")
    for fb in ("", " feedback"):
        queries = [("count_step", f"//count/shelf => count(total = e1.total + 1){fb}"), ("count_over_50", "//count[@total>50]")]
        events = [Event("count", 0, {"total": 0})] + [Event("shelf", i, {"tag_id": i}) for i in range(1, n + 1)]
        cpu, matches, eng = run(queries, events)
        rate = f", {eng.feedback.derived / cpu:,.0f} derived ev/CPU s" if fb else ""
        print(f"count example{fb or ' without feedback'}: {cpu:.2f} s CPU, {matches:,} matches, "
              f"{eng.feedback.derived:,} derived{rate}")
    loops = n // 100
    events = [Event("x", i, {"n": 0}) for i in range(loops)]
    cpu, matches, eng = run([("loop", "//x => x(n = e1.n + 1) feedback")], events)
    print(f"self-feeding //x => x, {loops:,} input events, depth guard 16: {cpu:.2f} s CPU, {matches:,} matches, "
          f"{eng.feedback.dropped:,} dropped, {cpu / loops * 1e6:,.0f} µs CPU per input event")


if __name__ == "__main__":
    main()
