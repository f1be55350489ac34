"""Plot ``service_benchmark.py --record`` figures against the number of subscriptions.

The last record of each size and feed counts. Left: ingest events/s of the unpaced runs and the service's CPU µs per event.
Right: end-to-end latency p50 / p99 of the paced runs, with and without a dead
and a slow subscriber.

    python benchmarks/service_scale_plot.py benchmarks/service_runs.jsonl benchmarks/service_scale.png
"""

from __future__ import annotations

import json
import sys


def main(records_path: str, out: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    latest = {}  # the last record of each (subscriptions, rate, faulty)
    for line in open(records_path):
        if line.strip():
            r = json.loads(line)
            latest[r["subs"], r["rate"], r["faulty"]] = r
    runs = list(latest.values())
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.8))
    unpaced = sorted((r for r in runs if not r["rate"] and not r["faulty"]), key=lambda r: r["subs"])
    subs = [r["subs"] for r in unpaced]
    left.plot(subs, [r["events_per_s"] for r in unpaced], "o-", label="ingest, events/s (wall)")
    left.plot(subs, [1e6 / (1e6 * r["service_cpu_s"] / r["events"]) for r in unpaced], "s--",
              label="events per service CPU second")
    left.set_xscale("log")
    left.set_xlabel("subscriptions (each with its own TCP sink)")
    left.set_ylabel("events/s")
    left.set_title("unpaced feed, 1M events")
    left.set_ylim(bottom=0)
    left.grid(True, which="both", alpha=0.3)
    left.legend(fontsize=8)
    for faulty, style in ((False, "-"), (True, ":")):
        paced = sorted((r for r in runs if r["rate"] and r["faulty"] == faulty), key=lambda r: r["subs"])
        if not paced:
            continue
        tag = " (+ dead + slow)" if faulty else ""
        xs = [r["subs"] for r in paced]
        right.plot(xs, [r["p50_ms"] for r in paced], "o" + style, label=f"p50{tag}")
        right.plot(xs, [r["p99_ms"] for r in paced], "^" + style, label=f"p99{tag}")
    rates = sorted({r["rate"] for r in runs if r["rate"]})
    right.set_xscale("log")
    right.set_yscale("log")
    right.set_xlabel("subscriptions (each with its own TCP sink)")
    right.set_ylabel("event written → result received, ms")
    right.set_title(f"fed at {', '.join(f'{x:,.0f}' for x in rates)} events/s, 1M events")
    right.grid(True, which="both", alpha=0.3)
    right.legend(fontsize=8)
    fig.suptitle("yfpp serve under load")
    fig.tight_layout()
    fig.savefig(out, dpi=120)


if __name__ == "__main__":
    main(*sys.argv[1:3])
