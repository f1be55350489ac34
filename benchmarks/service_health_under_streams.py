"""How long ``GET /health`` on the API port takes while results stream to pull streams.

``yfpp serve --no-state`` runs in its own process on loopback; one subscription
(``PATTERN SEQ(a x)``, no push sink, ``queue`` large enough to drop nothing)
has ``--streams`` readers of ``GET /subscriptions/{id}/matches`` (threads of
this script, each reading its socket as fast as it can); then ``--results``
``a`` events go in on the JSON-lines feed port, one match each, and a prober
asks ``/health`` on the API port every ``--every`` seconds until every stream
has every result. Printed: the probes' wall times (median, p99, max, and when
the slowest was asked), the
seconds until the streams had everything, the service process's CPU seconds
over that time, and each stream's count of results.

    python benchmarks/service_health_under_streams.py --streams 20 --results 50000
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
from bench_common import commit  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def api(port: int, method: str, path: str, body: dict | None = None) -> dict:
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", method=method,
                                 data=None if body is None else json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.loads(r.read() or b"null")


def cpu_seconds(pid: int) -> float:
    """A process's user and system CPU seconds (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Stream(threading.Thread):
    """One pull stream's reader: counts the results (SSE ``data:`` lines) it receives."""

    def __init__(self, port: int, sid: str) -> None:
        super().__init__(daemon=True)
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        self.conn.request("GET", f"/subscriptions/{sid}/matches")
        self.response = self.conn.getresponse()
        self.count = 0
        self.subscribed = threading.Event()

    def run(self) -> None:
        rest = b""
        while True:
            chunk = self.response.read1(1 << 16)
            if not chunk:
                return
            self.subscribed.set()
            *events, rest = (rest + chunk).split(b"\n\n")
            self.count += sum(e.startswith(b"id: ") for e in events)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--streams", type=int, default=20)
    ap.add_argument("--results", type=int, default=50_000)
    ap.add_argument("--every", type=float, default=0.02, help="seconds between /health probes")
    args = ap.parse_args()
    port, feed = free_port(), free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "yfpp", "serve", "--no-state", "--port", str(port),
                             "--jsonl-port", str(feed), "--log-level", "error"], env=env, cwd=ROOT)
    try:
        for _ in range(300):
            try:
                api(port, "GET", "/health")
                break
            except OSError:
                time.sleep(0.1)
        sid = api(port, "POST", "/subscriptions", {"query": "PATTERN SEQ(a x)", "name": "s",
                                                     "queue": args.results})["id"]
        streams = [Stream(port, sid) for _ in range(args.streams)]
        for s in streams:
            s.start()
        for s in streams:
            s.subscribed.wait(30)
        probes: list[float] = []
        cpu0, t0 = cpu_seconds(proc.pid), time.monotonic()
        with socket.create_connection(("127.0.0.1", feed)) as sock:
            sock.sendall(b"".join(b'{"type":"a","ts":%d}\n' % i for i in range(args.results)))
        want = args.results * args.streams
        end = t0 + 300
        while True:
            t = time.monotonic()
            api(port, "GET", "/health")
            probes.append((time.monotonic() - t, t - t0))
            if sum(s.count for s in streams) >= want or time.monotonic() > end:
                break
            time.sleep(args.every)
        took, cpu = time.monotonic() - t0, cpu_seconds(proc.pid) - cpu0
        probes.sort()
        worst, at = probes[-1]
        print(f"commit {commit()}, load {os.getloadavg()[0]:.1f}: {args.streams} streams x {args.results:,} results")
        print(f"/health on the API port: {len(probes)} probes, median {probes[len(probes) // 2][0] * 1e3:.1f} ms, "
              f"p99 {probes[int(len(probes) * 0.99)][0] * 1e3:.1f} ms, max {worst * 1e3:.1f} ms "
              f"(asked {at:.2f} s after the events were sent)")
        print(f"streams complete after {took:.2f} s; service CPU {cpu:.2f} s; "
              f"results per stream {sorted({s.count for s in streams})}")
    finally:
        proc.terminate()
        proc.wait(30)


if __name__ == "__main__":
    main()
