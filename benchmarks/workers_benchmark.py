"""``yfpp run --workers N`` scaling: events per wall second and CPU per event at N = 1, 2, … .

Two workloads, each a JSON-lines feed from :mod:`yfpp.input.generate` (written once under the temp
directory, then reused):

* ``keyed``: ``queries/shoplifting.sase`` over ``generate_rfid(E, tags=1000)`` — one keyed group
  (``tag_id``): each event goes to one worker;
* ``unkeyed``: ``PATTERN SEQ(stock a, stock b) WHERE b.price > a.price + 4 WITHIN 3`` over
  ``generate_stock(E, symbols=10)`` — no equivalence list: time slices overlapping by the window.

Each command (``python -m yfpp run -q … -i FEED --workers N -o OUT``) runs as a subprocess; its
wall time is the subprocess's, its CPU the whole process tree's (the command and its workers). The
workers read the feed themselves (a JSON-lines file: yfpp/workers_reading.py). ``path CPU s`` is the
CPU of the longest path — the parent's (its start, the matches it writes) plus the busiest worker's
(``worker_cpu_s`` of ``--stats-json``) — and ``free cores`` the speed-up over N = 1 it allows where each
process has a core of its own: what the wall time says on a quiet machine, read on a busy one. The
matches of every N are compared with N = 1's (as multisets of lines). Before the runs, the cores two
busy processes get at once is measured (a shared machine may give two of them well under two cores).

    python benchmarks/workers_benchmark.py                          # 1M events, N = 1, 2, both workloads
    python benchmarks/workers_benchmark.py --events 5000000
    python benchmarks/workers_benchmark.py --max-workers 16         # N = 1, 2, 4, 8, 16 on a bigger machine
    python benchmarks/workers_benchmark.py --events 200000 --costs  # and the CPU of reading vs shipping an event,
                                                                    # and of two ways a worker reads its share
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_common import commit
from spark_vs_run import cores_for_two, timed

from yfpp.input.generate import generate_rfid, generate_stock, write_events

ROOT = Path(__file__).resolve().parent.parent
DATA = Path(tempfile.gettempdir()) / "yfpp-workers-bench"
UNKEYED = "PATTERN SEQ(stock a, stock b) WHERE b.price > a.price + 4 WITHIN 3"


def feed(workload: str, events: int) -> Path:
    """The workload's feed of ``events`` events (generated once)."""
    path = DATA / f"{workload}_{events}.jsonl"
    if not path.is_file():
        DATA.mkdir(parents=True, exist_ok=True)
        records = generate_rfid(events, tags=1000, seed=1) if workload == "keyed" else generate_stock(
            events, symbols=10, seed=1)
        tmp = path.with_suffix(".tmp")
        write_events(records, str(tmp), "jsonl")
        tmp.rename(path)
    return path


def query(workload: str) -> str:
    return str(ROOT / "queries" / "shoplifting.sase") if workload == "keyed" else UNKEYED


def counts(n_max: int) -> list[int]:
    """1, 2, 4, … up to ``n_max`` (and ``n_max`` itself)."""
    ns = [1]
    while ns[-1] * 2 <= n_max:
        ns.append(ns[-1] * 2)
    return ns if ns[-1] == n_max else [*ns, n_max]


def shipping_costs(path: Path) -> dict[str, float]:
    """CPU µs per event, in this process, of what the two ways to split the work cost: reading (the reader over
    the feed: what each worker would pay for every record if it read the input itself), and shipping a parsed event
    to a worker (a row tuple pickled, unpickled and made an Event again: what reading in the parent adds)."""
    import pickle
    import time

    from yfpp.input.dead_letters import DeadLetters
    from yfpp.input.events import Event
    from yfpp.input.readers import read_event_batches

    started = time.process_time()
    events = [ev for batch in read_event_batches(str(path), None, dead_letters=DeadLetters()) for ev in batch]
    read = time.process_time() - started
    started = time.process_time()
    rows = [(ev.type, ev.ts, ev.attrs, ev.seq) for ev in events]
    blobs = [pickle.dumps(rows[i:i + 4096], protocol=pickle.HIGHEST_PROTOCOL) for i in range(0, len(rows), 4096)]
    shipped = [Event(*r) for blob in blobs for r in pickle.loads(blob)]
    ship = time.process_time() - started
    assert len(shipped) == len(events)
    return {"read": read / len(events) * 1e6, "ship": ship / len(events) * 1e6}


def share_costs(path: Path, key: str, n: int = 2) -> dict[str, float]:
    """CPU µs per line, in this process, of worker 0 of ``n`` reading its share of a keyed feed, two ways:
    ``scan`` — the ts and key scans of every line, then its own lines parsed (what each worker did before the
    scans were shared: yfpp/workers_reading.py now has each block scanned by one worker);
    ``bulk`` — each block parsed once by orjson, the records routed by their key, events made of its own only."""
    import time

    from yfpp.input.dead_letters import DeadLetters
    from yfpp.input.jsonl_reader import LineBlocks, _bulk, _plain_events, parse_block
    from yfpp.input.jsonl_scan import routing_text, scan_block
    from yfpp.input.readers import reading_options
    from yfpp.workers_reading import BLOCK

    opts, dead = reading_options(), DeadLetters()
    with open(path, "rb") as f:
        blocks = list(LineBlocks(f, opts.max_record_bytes, dead, BLOCK))
    lines = sum(body.count(b"\n") for body in blocks)

    def scan() -> None:
        for body in blocks:
            _, (values,) = scan_block(body, opts, [key])
            split = body.split(b"\n")
            parse_block(b"\n".join([split[j] for j, v in enumerate(values) if hash(v) % n == 0]), 0, 0, opts, dead)

    def bulk() -> None:
        for body in blocks:
            own = [r for r in _bulk(body, (b'"ts"', b'"type"')) if hash(routing_text(r[key])) % n == 0]
            _plain_events(own, 0, opts, [])

    best = {}
    for name, way in [("scan", scan), ("bulk", bulk)] * 3:
        started = time.process_time()
        way()
        best[name] = min(best.get(name, float("inf")), (time.process_time() - started) / lines * 1e6)
    return best


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--max-workers", type=int, default=2, help="largest N (N = 1, 2, 4, … up to it)")
    ap.add_argument("--workloads", default="keyed,unkeyed")
    ap.add_argument("--repeat", type=int, default=1, help="run the N = 1, 2, … sequence this many times, in turn")
    ap.add_argument("--costs", action="store_true",
                    help="also measure reading and shipping an event, per event (why the parent reads)")
    args = ap.parse_args()
    print(f"commit {commit()}, {args.events:,} events; two busy processes get {cores_for_two():.2f} cores")
    print(f"{'workload':<9} {'N':>3} {'wall s':>7} {'events/s':>10} {'speed-up':>8} {'CPU s':>7} {'CPU µs/ev':>9} "
          f"{'path CPU s':>10} {'free cores':>10}  matches")
    with tempfile.TemporaryDirectory(prefix="yfpp-workers-") as tmp:
        for workload in args.workloads.split(","):
            path = feed(workload, args.events)
            base_wall = base_cpu = 1.0
            base = None
            if args.costs:
                c = shipping_costs(path)
                print(f"{workload:<9} reading {c['read']:.2f} CPU µs/event; shipping a parsed event to a worker "
                      f"{c['ship']:.2f} CPU µs/event", flush=True)
                if workload == "keyed":
                    c = share_costs(path, "tag_id")
                    print(f"{workload:<9} a worker's share of 2 (CPU µs/line, best of 3): scan every line, parse its own "
                          f"{c['scan']:.2f}; parse every block once, route the records, make its own events "
                          f"{c['bulk']:.2f}", flush=True)
            for n in [n for _ in range(args.repeat) for n in counts(args.max_workers)]:  # N = 1, 2, 1, 2, …
                out, stats = Path(tmp) / f"{workload}_{n}.jsonl", Path(tmp) / "stats.json"
                wall, cpu, _ = timed([sys.executable, "-m", "yfpp", "run", "-q", query(workload), "-i", str(path),
                                      "--workers", str(n), "-o", str(out), "--progress", "never",
                                      "--stats-json", str(stats)])
                workers = json.loads(stats.read_text()).get("worker_cpu_s", [])
                path_cpu = cpu - sum(workers) + max(workers, default=0.0)
                found = Counter(out.read_text().splitlines())
                if n == 1:  # (speed-ups: against the N = 1 run just before)
                    base_wall, base_cpu = wall, cpu
                base = base if base is not None else found
                same = "same as N=1" if found == base else "DIFFERENT from N=1"
                print(f"{workload:<9} {n:>3} {wall:>7.2f} {args.events / wall:>10,.0f} {base_wall / wall:>7.2f}x "
                      f"{cpu:>7.2f} {cpu / args.events * 1e6:>9.1f} {path_cpu:>10.2f} {base_cpu / path_cpu:>9.2f}x  "
                      f"{sum(found.values()):,} ({same})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
