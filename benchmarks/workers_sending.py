"""What sending costs a busy worker: a ``multiprocessing.Queue`` (a feeder thread writes) against
:mod:`yfpp.workers.pipes` (the sending thread writes).

A sender process alternates a unit of pure-Python work (about a keyed worker's matching between two scans it
sends) with sending a message of about a scan's size to a receiver process as busy; the sender's CPU seconds (all
its threads) and context switches, from ``getrusage``, against the same work sending nothing. Transports in turn,
A B A B.

    python benchmarks/workers_sending.py                   # 2,000 messages of 3 kB, 3 rounds
    python benchmarks/workers_sending.py --messages 5000 --size 30000
"""

from __future__ import annotations

import argparse
import multiprocessing
import resource
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from yfpp.workers.pipes import Inbox, Outbox

CTX = multiprocessing.get_context("fork")


def work(units: int) -> int:
    """About a millisecond of pure-Python work at ``units`` = 20,000."""
    total = 0
    for i in range(units):
        total += i * i % 7
    return total


def _sender(transport: str, end: Any, messages: int, size: int, units: int, report: Any) -> None:
    put = end.put if transport == "queue" else Outbox(end, 0).put if transport == "pipe" else None
    payload = bytes(size)
    for i in range(messages):
        work(units)
        if put is not None:
            put((i, payload))
    if transport == "queue":
        end.close()
        end.join_thread()  # (what the feeder thread still has to write is its CPU too)
    r = resource.getrusage(resource.RUSAGE_SELF)
    report.send((r.ru_utime + r.ru_stime, r.ru_nvcsw, r.ru_nivcsw))


def _receiver(transport: str, end: Any, messages: int, units: int) -> None:
    """As busy as the sender between two messages (a peer matching), so that a message mostly waits in the pipe for
    it rather than waking it."""
    get = end.get if transport == "queue" else Inbox([end]).get
    for _ in range(messages):
        work(units)
        get()


def one_run(transport: str, messages: int, size: int, units: int) -> tuple[float, int, int]:
    """The sender's CPU seconds and voluntary and involuntary context switches."""
    if transport == "queue":
        sending = receiving = CTX.Queue(64)
    else:
        receiving, sending = CTX.Pipe(duplex=False)
    results, report = CTX.Pipe(duplex=False)
    procs = [CTX.Process(target=_sender, args=(transport, sending, messages, size, units, report))]
    if transport != "none":
        procs.append(CTX.Process(target=_receiver, args=(transport, receiving, messages, units)))
    for p in procs:
        p.start()
    got = results.recv()
    for p in procs:
        p.join()
    return got


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages", type=int, default=2000)
    ap.add_argument("--size", type=int, default=3000, help="bytes a message")
    ap.add_argument("--units", type=int, default=20_000, help="work units between two messages")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args(argv)
    runs: dict[str, list[tuple[float, int, int]]] = {"none": [], "queue": [], "pipe": []}
    for _ in range(args.repeat):
        for transport in runs:
            runs[transport].append(one_run(transport, args.messages, args.size, args.units))
    base = statistics.median(cpu for cpu, _, _ in runs["none"])
    print(f"{args.messages:,} messages of {args.size:,} bytes, {args.units:,} work units between two; "
          f"medians of {args.repeat} runs (A B A B)")
    print(f"{'transport':<10} {'CPU s':>7} {'extra CPU µs/message':>21} {'voluntary':>10} {'involuntary':>12}")
    for transport, got in runs.items():
        cpu = statistics.median(c for c, _, _ in got)
        print(f"{transport:<10} {cpu:>7.3f} {(cpu - base) / args.messages * 1e6:>21.1f} "
              f"{statistics.median(v for _, v, _ in got):>10,.0f} {statistics.median(i for _, _, i in got):>12,.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
