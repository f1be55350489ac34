"""The CPU of one periodic checkpoint of an idle ``yfpp serve`` with many subscriptions, in-process.

A service (``BackgroundService``, its state in a temporary directory) gets N subscriptions of the correlated RFID
template of ``subscriptions_benchmark.py`` in ``POST /subscriptions`` batches of 4,000, E of its events through
its JSON-lines feed port (some subscriptions match, most do not), then S more subscriptions one request each
(queries the checkpoint base does not hold); after two checkpoints, the process's CPU seconds (every thread:
the take on the caller, the write on the checkpoint's thread, what the loop says the sinks hold) of each of
``--checkpoints`` checkpoints (``Service.save_checkpoint``, waiting until it is in place), nothing else running.
The code measured is the one on ``PYTHONPATH`` (this script's checkout by default)::

    python benchmarks/service_idle_checkpoint.py --subs 100000 --events 100000 --singles 300
"""

from __future__ import annotations

import argparse
import json
import resource
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from subscriptions_benchmark import TEMPLATES, build_events  # noqa: E402
from yfpp.service.client import Client  # noqa: E402
from yfpp.service.config import ServiceConfig  # noqa: E402
from yfpp.service.server import BackgroundService  # noqa: E402

BATCH = 4000  #: subscriptions per POST /subscriptions


def cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--subs", type=int, default=100_000)
    ap.add_argument("--events", type=int, default=100_000)
    ap.add_argument("--singles", type=int, default=300)
    ap.add_argument("--checkpoints", type=int, default=5)
    args = ap.parse_args()
    n = args.subs
    with tempfile.TemporaryDirectory() as tmp:
        cfg = ServiceConfig(port=0, jsonl_port=0, state=f"{tmp}/state", log_level="warning", checkpoint_every=3600,
                            max_subscriptions=n + args.singles)
        with BackgroundService(cfg, timeout=600) as svc:
            c = Client(f"http://127.0.0.1:{svc.port}", timeout=600)
            for i in range(0, n, BATCH):
                c.subscribe_many([{"query": TEMPLATES["sase"].format(k=k)} for k in range(i + 1, min(n, i + BATCH) + 1)])
            events = build_events(args.events, n, n, "correlated", 1)
            with socket.create_connection(("127.0.0.1", svc.feed_port("jsonl"))) as s:
                s.sendall(b"".join(json.dumps({"type": e.type, "ts": e.ts, **e.attrs}).encode() + b"\n" for e in events))
            while svc.events_in < len(events):
                time.sleep(0.1)
            for k in range(args.singles):
                c.subscribe(TEMPLATES["sase"].format(k=n + 1 + k), name=f"one{k}")
            subs, live = len(svc.subs), svc.engine.stats.live_runs
            matched = sum(1 for sub in svc.subs.values() if sub.counters.matches)
            svc.save_checkpoint()
            svc.save_checkpoint()
            each = []
            for _ in range(args.checkpoints):
                cpu0 = cpu()
                svc.save_checkpoint()
                each.append(cpu() - cpu0)
    print(f"{subs:,} subscriptions ({matched:,} with matches), {live:,} partial matches: "
          f"{statistics.median(each):.4f} s of CPU per checkpoint (median; each: "
          f"{', '.join(f'{x:.4f}' for x in each)})")


if __name__ == "__main__":
    main()
