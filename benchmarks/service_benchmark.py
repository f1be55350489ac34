"""Load benchmark of ``yfpp serve`` (issue 10, item 10): N subscriptions, each with its own TCP sink.

Setup, all on 127.0.0.1:

* the service runs as its own process (``yfpp serve --no-state``, a JSON-lines feed port);
* N subscriptions (the correlated RFID template of ``subscriptions_benchmark.py``,
  ``SEQ(shelf a, exit c)`` with zone/door ``k``), registered over HTTP, subscription
  k sending to its own TCP listener; the listeners live in ``--receivers``
  receiver processes (asyncio, N/R listeners each) that record every result line
  with its arrival time;
* with ``--faulty``, two more subscriptions of ``PATTERN SEQ(shelf a)`` (a result
  for every shelf reading, a third of the feed) with a queue of 1,000: one whose
  sink is a closed port (dead), one whose listener accepts and never reads (slow);
* one feeder connection writes the E events (``build_events`` of
  ``subscriptions_benchmark.py``, as JSON lines) in chunks of ``--chunk`` lines,
  noting when each chunk was written, unpaced or at ``--rate`` events/s.

Figures: ingest events/s (E over the time from the first write until the
service has taken every event, from ``/health``), the service process's CPU
seconds, end-to-end latency p50/p99/max from the write of a result's last event
(its chunk's write time) to the result's arrival, and the check that nothing
is lost or invented: every subscriber receives exactly the results ``yfpp run``
gives for its query (computed here with the embedded Engine over the same
events), compared by match id.

    python benchmarks/service_benchmark.py --subs 1000 --events 100000
    python benchmarks/service_benchmark.py --subs 1000 --events 100000 --faulty
    python benchmarks/service_benchmark.py --subs 10000 --events 100000 --receivers 2 --plot benchmarks/service.png
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import resource
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_common import commit  # noqa: E402
from subscriptions_benchmark import TEMPLATES, build_events  # noqa: E402
from yfpp.engine import Engine  # noqa: E402
from yfpp.service.client import Client  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
FAULTY_QUERY = "PATTERN SEQ(shelf a)"


# --- receivers (one process each) -------------------------------------------------------------


def receiver(count: int, conn, never_read: bool = False) -> None:
    """Open ``count`` listeners; send their ports; record (line, time) per listener until told to stop."""

    async def main() -> None:
        got: list[list[tuple[bytes, float]]] = [[] for _ in range(count)]

        def handler(i: int):
            async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
                if never_read:
                    try:
                        await asyncio.sleep(3600)
                    except asyncio.CancelledError:
                        return
                while line := await reader.readline():
                    got[i].append((line, time.time()))
            return handle

        servers = [await asyncio.start_server(handler(i), "127.0.0.1", 0, limit=1 << 20) for i in range(count)]
        conn.send([s.sockets[0].getsockname()[1] for s in servers])
        while not conn.poll():
            await asyncio.sleep(0.05)
        conn.recv()
        conn.send([[(json.loads(line)["id"], json.loads(line)["bindings"], t) for line, t in lines] for lines in got])

    asyncio.run(main())


def start_receivers(n: int, procs: int, never_read: bool = False) -> tuple[list[int], list]:
    ports, handles = [], []
    per = -(-n // procs)
    for start in range(0, n, per):
        parent, child = mp.Pipe()
        p = mp.Process(target=receiver, args=(min(per, n - start), child, never_read), daemon=True)
        p.start()
        ports.extend(parent.recv())
        handles.append((p, parent))
    return ports, handles


def collect(handles: list) -> list:
    out = []
    for p, parent in handles:
        parent.send("stop")
        out.extend(parent.recv())
        p.join(10)
    return out


# --- the run ----------------------------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def start_service(subs: int) -> tuple[subprocess.Popen, dict]:
    proc = subprocess.Popen([sys.executable, "-m", "yfpp.cli", "serve", "--port", "0", "--jsonl-port", "0",
                             "--no-state", "--log-level", "info", "--queue-size", "100000",
                             "--max-subscriptions", str(max(subs, 10_000))],
                            cwd=ROOT, stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    for line in proc.stderr:
        if '"service started"' in line:
            info = json.loads(line)
            break
    else:
        raise SystemExit("the service did not start")
    threading.Thread(target=proc.stderr.read, daemon=True).start()  # keep draining its log
    return proc, info


def expected_ids(events, n: int, language: str) -> list[set[str]]:
    eng = Engine()
    for k in range(1, n + 1):
        eng.register(TEMPLATES[language].format(k=k), name=f"q{k}")
    out: list[set[str]] = [set() for _ in range(n)]
    for ev in events:
        ev.seq = -1
        for m in eng.process(ev):
            out[int(m["query"][1:]) - 1].add(m["id"])
    return out  # no flush: the service never ends its stream (and these queries hold nothing back)


def raise_fd_limit(subs: int) -> int:
    """Raise this process's (and so its children's) open-file limit to what ``subs`` sinks need; the limit set."""
    need = 2 * subs + 4096  # a receiver process: its listeners and their accepted connections; the service: a socket per sink
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft >= need:
        return soft
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (need, max(hard, need)))  # raising the hard limit needs root
    except (ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def run(args) -> dict:
    raise_fd_limit(args.subs)
    events = build_events(args.events, args.subs, args.subs, "correlated", args.seed)
    lines = [json.dumps({"type": e.type, "ts": e.ts, **e.attrs}).encode() + b"\n" for e in events]
    t0 = time.process_time()
    want = expected_ids(events, args.subs, args.language)
    engine_cpu = time.process_time() - t0  # the embedded engine alone (registering and matching), for comparison
    ports, handles = start_receivers(args.subs, args.receivers)
    faulty = []
    dead = socket.socket()
    if args.faulty:
        slow_ports, slow_handles = start_receivers(1, 1, never_read=True)
        dead.bind(("127.0.0.1", 0))  # bound, never listening, for the whole run: connects are refused
        faulty = [("dead", dead.getsockname()[1]), ("slow", slow_ports[0])]
    proc, info = start_service(args.subs + 2)
    try:
        url = f"http://{info['http']}"
        client = Client(url, timeout=60)
        t0 = time.perf_counter()
        for k in range(1, args.subs + 1):
            client.subscribe(TEMPLATES[args.language].format(k=k), sink=f"tcp://127.0.0.1:{ports[k - 1]}", name=f"q{k}")
        for name, port in faulty:
            client.subscribe(FAULTY_QUERY, sink=f"tcp://127.0.0.1:{port}", name=name, queue=1000)
        register_s = time.perf_counter() - t0
        cpu0 = cpu_seconds(proc.pid)
        sent_at: list[float] = []
        feed = socket.create_connection(("127.0.0.1", info["feeds"]["jsonl"]))
        start = time.time()
        for i in range(0, len(lines), args.chunk):
            if args.rate:
                delay = start + i / args.rate - time.time()
                if delay > 0:
                    time.sleep(delay)
            feed.sendall(b"".join(lines[i:i + args.chunk]))
            sent_at.append(time.time())
        feed.close()
        while client.health()["events_in"] < len(lines):
            time.sleep(0.05)
        ingest_s = time.time() - start
        cpu = cpu_seconds(proc.pid) - cpu0
        total = sum(len(w) for w in want)
        deadline = time.time() + 120
        while sum(s["counters"]["delivered"] for s in client.subscriptions()[:args.subs]) < total:
            if time.time() > deadline:
                break
            time.sleep(1.0)  # the listing of 10,000 subscriptions is itself work for the service
        done_s = time.time() - start
        cpu_all = cpu_seconds(proc.pid) - cpu0
        time.sleep(0.5)
        subs = {s["name"]: s["counters"] for s in client.subscriptions()}
    finally:
        proc.terminate()
        proc.communicate(timeout=30)
        dead.close()
    got = collect(handles)
    if faulty:
        collect(slow_handles)
    latencies, lost, extra = [], 0, 0
    tenths: list[list[float]] = [[] for _ in range(10)]  # latencies by the tenth of the feed the event was in
    for k, results in enumerate(got):
        ids = [r[0] for r in results]
        lost += len(want[k] - set(ids))
        extra += len(ids) - len(want[k] & set(ids))
        for _, bindings, t in results:
            last = max(s for seqs in bindings.values() for s in seqs)
            latencies.append(t - sent_at[last // args.chunk])
            tenths[min(9, 10 * last // len(lines))].append(latencies[-1])
    latencies.sort()
    p99_by_tenth = [sorted(x)[int(0.99 * len(x))] * 1000 if x else float("nan") for x in tenths]

    def pct(p: float) -> float:
        return latencies[min(len(latencies) - 1, int(p * len(latencies)))] * 1000 if latencies else float("nan")

    return {"subs": args.subs, "events": len(lines), "language": args.language, "faulty": args.faulty,
            "rate": args.rate, "register_s": register_s, "ingest_s": ingest_s, "events_per_s": len(lines) / ingest_s,
            "service_cpu_s": cpu, "embedded_engine_cpu_s": engine_cpu, "delivered_s": done_s, "service_cpu_all_s": cpu_all, "results": total, "received": sum(len(r) for r in got), "lost": lost,
            "extra": extra, "p50_ms": pct(0.5), "p99_ms": pct(0.99), "max_ms": pct(1.0), "p99_by_tenth_ms": p99_by_tenth,
            "faulty_counters": {name: subs.get(name) for name, _ in faulty}, "latencies": latencies}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--subs", type=int, default=1000)
    ap.add_argument("--events", type=int, default=100_000)
    ap.add_argument("--language", choices=sorted(TEMPLATES), default="sase")
    ap.add_argument("--faulty", action="store_true", help="add a dead and a slow subscriber")
    ap.add_argument("--rate", type=float, default=0, help="events/s the feeder keeps to (default: as fast as it can)")
    ap.add_argument("--chunk", type=int, default=500, help="lines per write")
    ap.add_argument("--receivers", type=int, default=1, help="receiver processes")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--plot", help="write a latency CDF plot here")
    ap.add_argument("--record", help="append the figures (JSON, one line) to this file")
    args = ap.parse_args()
    r = run(args)
    lat = r.pop("latencies")
    print(f"commit {commit()}  {args.subs:,} subscriptions ({args.language}), {r['events']:,} events"
          f"{', one dead and one slow subscriber' if args.faulty else ''}"
          f"{f', fed at {args.rate:,.0f} ev/s' if args.rate else ', fed unpaced'}")
    print(f"register over HTTP  {r['register_s']:.1f} s ({1000 * r['register_s'] / args.subs:.1f} ms/subscription)")
    print(f"ingest              {r['events_per_s']:,.0f} events/s ({r['ingest_s']:.1f} s; service CPU {r['service_cpu_s']:.1f} s)")
    print(f"embedded engine     {r['embedded_engine_cpu_s']:.1f} s CPU for the same events and queries (yfpp run's work)")
    print(f"all delivered       {r['delivered_s']:.1f} s after the first write (service CPU {r['service_cpu_all_s']:.1f} s)")
    print(f"results             {r['results']:,} expected, {r['received']:,} received, {r['lost']} lost, {r['extra']} extra")
    print(f"latency             p50 {r['p50_ms']:.0f} ms, p99 {r['p99_ms']:.0f} ms, max {r['max_ms']:.0f} ms")
    print(f"p99 by tenth of feed {', '.join(f'{x:.0f}' for x in r['p99_by_tenth_ms'])} ms")
    if args.faulty:
        print(f"faulty subscribers  {json.dumps(r['faulty_counters'])}")
    print(json.dumps(r))
    if args.record:
        with open(args.record, "a") as f:
            f.write(json.dumps({"commit": commit(), **r}) + "\n")
    if args.plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 3.5))
        ax.plot([x * 1000 for x in lat], [i / max(len(lat) - 1, 1) for i in range(len(lat))])
        ax.set_xscale("log")
        ax.set_xlabel("end-to-end latency, ms (event written → result received)")
        ax.set_ylabel("fraction of results")
        fed = f"fed at {args.rate:,.0f} ev/s" if args.rate else "fed unpaced"
        ax.set_title(f"yfpp serve: {args.subs:,} subscriptions, {r['events']:,} events, {fed}")
        ax.grid(True, which="both", alpha=0.3)
        fig.tight_layout()
        fig.savefig(args.plot, dpi=120)
    if r["lost"] or r["extra"]:
        raise SystemExit("results lost or invented")


if __name__ == "__main__":
    main()
