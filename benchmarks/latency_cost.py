"""What keeping each subscription's result latency costs per result (yfpp/service/latency.py).

The service runs in this process (loopback only) with one subscription, ``PATTERN SEQ(r x)`` (a result per
event), whose TCP sink is a reader thread here; N events are written to the JSON-lines feed port, and the
script waits until the sink has delivered all N results. It prints the process's CPU seconds and wall time
from the first write to the last delivery, CPU µs per result, and, apart, the cost of the latency
bookkeeping alone per result (an arrival kept beside the result in its queue, then recorded at delivery).
Run it on two commits side by side to compare whole processes.

    python benchmarks/latency_cost.py 100000
"""

from __future__ import annotations

import argparse
import socket
import sys
import threading
import time
import timeit
from collections import deque
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from yfpp.service import server  # noqa: E402
from yfpp.service.client import Client  # noqa: E402
from yfpp.service.config import ServiceConfig  # noqa: E402


def bookkeeping_ns() -> float | None:
    """ns per result of what latency adds to a result's way through a queue (None before latency existed)."""
    try:
        from yfpp.service.latency import Latency
    except ImportError:
        return None
    lat, arrivals, n = Latency(), deque(), 1024
    first = time.monotonic()
    stamps = [first + i // 256 for i in range(n)]  # (a feed's batch of up to 256 events shares one arrival)

    def one_batch() -> None:
        for at in stamps:
            arrivals.append(at)
        lat.record(stamps[-1] + 0.01, [arrivals.popleft() for _ in range(n)])

    runs = 50
    return min(timeit.repeat(one_batch, number=runs, repeat=5)) / runs / n * 1e9


def measure(n: int) -> dict:
    sink = socket.create_server(("127.0.0.1", 0))
    got = {"lines": 0}

    def read() -> None:
        conn, _ = sink.accept()
        with conn:
            while data := conn.recv(1 << 16):
                got["lines"] += data.count(b"\n")

    threading.Thread(target=read, daemon=True).start()
    cfg = ServiceConfig(port=0, jsonl_port=0, state=None, log_level="warning")
    with server.BackgroundService(cfg) as svc:
        Client(f"http://127.0.0.1:{svc.port}").subscribe("PATTERN SEQ(r x)", name="each",
                                                         sink=f"tcp://127.0.0.1:{sink.getsockname()[1]}")
        body = b"".join(b'{"type":"r","ts":%d}\n' % i for i in range(n))
        cpu, wall = time.process_time(), time.monotonic()
        with socket.create_connection(("127.0.0.1", svc.feed_port("jsonl"))) as feed:
            feed.sendall(body)
        end = wall + 600
        while got["lines"] < n and time.monotonic() < end:
            time.sleep(0.005)
        cpu, wall = time.process_time() - cpu, time.monotonic() - wall
        info = svc.subs["s1"].info()
    return {"results": got["lines"], "cpu_s": cpu, "wall_s": wall, "cpu_us_per_result": cpu / n * 1e6,
            "latency": info.get("latency")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("events", type=int, nargs="?", default=100_000)
    args = ap.parse_args()
    r = measure(args.events)
    print(f"{r['results']:,} results delivered: {r['cpu_s']:.2f} s CPU, {r['wall_s']:.2f} s wall, "
          f"{r['cpu_us_per_result']:.1f} µs CPU per result; latency {r['latency']}")
    ns = bookkeeping_ns()
    if ns is not None:
        print(f"latency bookkeeping alone: {ns:.0f} ns per result")


if __name__ == "__main__":
    main()
