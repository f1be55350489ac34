"""What ``yfpp serve`` holds when one event releases N matches at once (a memory measurement, not a timing).

The query ``SEQ({A a}, ~N n) WHERE [k] WITHIN 1`` (``--pattern``: ``SEQ(A a, ~N n)``, a pattern query) over N
``A`` events of distinct ``k`` at ts 0 holds N matches until the stream passes ts 1; one event at ts 10 releases
them all. The service runs in this process (loopback sockets only); the script prints the matches routed, the
largest list the engine thread handed to the loop at once, the most results waiting for the loop, and the peak
RSS before the releasing event and at the end.

    python benchmarks/service_release_memory.py 200000
    python benchmarks/service_release_memory.py 200000 --pattern
"""

from __future__ import annotations

import argparse
import json
import resource
import socket
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from yfpp.service import server  # noqa: E402
from yfpp.service.client import Client  # noqa: E402
from yfpp.service.config import ServiceConfig  # noqa: E402


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def measure(n: int, query: str) -> dict:
    seen = {"largest_hand_over": 0, "most_waiting_for_the_loop": 0}
    hand_over, route = server.Service._hand_over, server.Service._route

    def recorded_hand_over(svc: server.Service, results: list[dict]) -> None:
        seen["largest_hand_over"] = max(seen["largest_hand_over"], len(results))
        hand_over(svc, results)

    def recorded_route(svc: server.Service) -> None:
        with svc._room:
            seen["most_waiting_for_the_loop"] = max(seen["most_waiting_for_the_loop"], sum(map(len, svc._results)))
        route(svc)

    server.Service._hand_over, server.Service._route = recorded_hand_over, recorded_route
    cfg = ServiceConfig(port=0, jsonl_port=0, state=None, log_level="warning")
    with server.BackgroundService(cfg) as svc:
        Client(f"http://127.0.0.1:{svc.port}").subscribe(query, name="q")
        feed = socket.create_connection(("127.0.0.1", svc.feed_port("jsonl")))
        feed.sendall(b"".join(b'{"type":"A","ts":0,"k":%d}\n' % k for k in range(n)))
        end = time.monotonic() + 600
        while svc.events_in < n and time.monotonic() < end:
            time.sleep(0.05)
        before = peak_rss_mb()
        feed.sendall(b'{"type":"X","ts":10,"k":-1}\n')
        feed.close()
        counters = svc.by_name["q"].counters
        while counters.matches < n and time.monotonic() < end:
            time.sleep(0.05)
        return {"matches": counters.matches, **seen, "peak_rss_before_the_release_mb": round(before),
                "peak_rss_mb": round(peak_rss_mb())}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("n", type=int, nargs="?", default=200_000, help="partitions, so matches released (200,000)")
    p.add_argument("--pattern", action="store_true", help="a pattern query, not an event-set query")
    args = p.parse_args()
    query = "PATTERN SEQ(A a, ~N n) WHERE [k] WITHIN 1" if args.pattern else "PATTERN SEQ({A a}, ~N n) WHERE [k] WITHIN 1"
    print(json.dumps(measure(args.n, query)))


if __name__ == "__main__":
    main()
