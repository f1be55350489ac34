"""``yfpp run --workers N`` scaling: events per wall second and CPU per event at N = 1, 2, … .

Two workloads, each a JSON-lines feed (``--xml``: an XML one, one event element a line) from
:mod:`yfpp.input.generate` (written once under the temp directory, then reused):

* ``keyed``: ``queries/shoplifting.sase`` over ``generate_rfid(E, tags=1000)`` — one keyed group
  (``tag_id``): each event goes to one worker;
* ``unkeyed``: ``PATTERN SEQ(stock a, stock b) WHERE b.price > a.price + 4 WITHIN 3`` over
  ``generate_stock(E, symbols=10)`` — no equivalence list: time slices overlapping by the window.

Each command (``python -m yfpp run -q … -i FEED --workers N -o OUT``) runs as a subprocess; its
wall time is the subprocess's, its CPU the whole process tree's (the command and its workers). The
workers read the feed themselves (a JSON-lines file: yfpp/workers/reading.py — each worker scanning every
block with the compiled line scan where the plan and the file allow, yfpp/workers/compiled.py, else the scans
relayed; each N = 2 row names the path its run took; XML: yfpp/workers/xml_reading.py). ``path CPU s`` is the
CPU of the longest path — the parent's (its start, the matches it writes) plus the busiest worker's
(``worker_cpu_s`` of ``--stats-json``) — and ``free cores`` the speed-up over N = 1 it allows where each
process has a core of its own: what the wall time says on a quiet machine, read on a busy one. The
matches of every N are compared with N = 1's (as multisets of lines). Before the runs, the cores two
busy processes get at once is measured (a shared machine may give two of them well under two cores).

    python benchmarks/workers_benchmark.py                          # 1M events, N = 1, 2, both workloads
    python benchmarks/workers_benchmark.py --events 5000000
    python benchmarks/workers_benchmark.py --xml                    # the same events as XML feeds
    python benchmarks/workers_benchmark.py --max-workers 16         # N = 1, 2, 4, 8, 16 on a bigger machine
    python benchmarks/workers_benchmark.py --events 1000000 --costs # and the CPU of reading vs shipping an event,
                                                                    # and the parts of one engine's and a worker's work
    python benchmarks/workers_benchmark.py --events 200000 --instructions [--code OTHER_CHECKOUT]
                                                                    # instructions per event of a worker's reading share
    python benchmarks/workers_benchmark.py --events 200000 --run-instructions [--code OTHER_CHECKOUT]
                                                                    # instructions of each process of whole commands
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_common import commit
from spark_vs_run import cores_for_two, timed

from yfpp.input.generate import generate_rfid, generate_stock, write_events

ROOT = Path(__file__).resolve().parent.parent
DATA = Path(tempfile.gettempdir()) / "yfpp-workers-bench"
UNKEYED = "PATTERN SEQ(stock a, stock b) WHERE b.price > a.price + 4 WITHIN 3"


def feed(workload: str, events: int, fmt: str = "jsonl") -> Path:
    """The workload's feed of ``events`` events in ``fmt`` (``jsonl`` or ``xml``; generated once)."""
    path = DATA / f"{workload}_{events}.{fmt}"
    if not path.is_file():
        DATA.mkdir(parents=True, exist_ok=True)
        records = generate_rfid(events, tags=1000, seed=1) if workload == "keyed" else generate_stock(
            events, symbols=10, seed=1)
        tmp = path.with_suffix(".tmp")
        write_events(records, str(tmp), fmt)
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


class Parts:
    """What the in-process measurements of one engine's parts and worker 0 of ``n``'s share over a feed start from:
    the reader options, the query groups and their keys, and the feed's read blocks (an XML feed's as
    yfpp/workers/xml_reading.py cuts them)."""

    def __init__(self, path: Path, workload: str, n: int = 2) -> None:
        from yfpp.input.dead_letters import DeadLetters
        from yfpp.input.jsonl_reader import LineBlocks
        from yfpp.input.readers import reading_options
        from yfpp.spark.plan import group_queries
        from yfpp.workers.pool import WORKERS
        from yfpp.workers.reading import BLOCK
        from yfpp.workers.xml_reading import line_blocks
        import yfpp.workers.reading as reading

        self.path, self.workload, self.n, self.xml = path, workload, n, path.suffix == ".xml"
        self.opts, self.dead = reading_options(), DeadLetters()
        engine = self.loaded()
        queries = [(name, pattern) for _, (pattern, _, name) in sorted(engine.sources.items())]
        self.groups = group_queries(queries, runner=WORKERS)
        self.keys = sorted({g.key[0] for g in self.groups if g.key})
        # (blocks a chunk, as the workers cut them: CHUNK for XML, and in a checkout before chunk_blocks)
        self.chunk = reading.CHUNK if self.xml else getattr(reading, "chunk_blocks", lambda groups: reading.CHUNK)(
            self.groups)
        with open(path, "rb") as f:
            self.blocks = list(line_blocks(f, BLOCK) if self.xml else LineBlocks(f, self.opts.max_record_bytes,
                                                                                  self.dead, BLOCK))
        # (where each worker scans every block itself with the compiled line scan; a checkout before it: never)
        spec_of = getattr(reading, "compiled_spec", None)
        with open(path, "rb") as f:
            self.spec = None if self.xml or spec_of is None else spec_of(self.opts, self.groups, f.read(4096),
                                                                          path.stat().st_size)

    def loaded(self) -> Any:
        """An engine with the workload's queries."""
        from yfpp.engine import Engine
        from yfpp.language.query_text import load_queries

        engine = Engine()
        for q in load_queries([query(self.workload)]):
            engine.register(q.text, q.name)
        return engine

    def read_all(self) -> list[list[Any]]:
        """One reader's events of the feed, a list per block (an XML feed's: per batch of its reader)."""
        from yfpp.input.jsonl_reader import parse_block
        from yfpp.input.readers import read_event_batches

        if self.xml:
            return list(read_event_batches(str(self.path), "xml", dead_letters=self.dead))
        out, seq = [], 0
        for body in self.blocks:
            events, seq, _ = parse_block(body, seq, 0, self.opts, self.dead)
            out.append(events)
        return out

    def scanner(self) -> Any:
        """The scan of a block (JSON lines or XML; the compiled line scan where the workers make it)."""
        from yfpp.workers.reading import scan
        from yfpp.workers.xml_reading import Scanner

        if self.spec is not None:
            import inspect

            from yfpp.workers.reading import compiled_scan

            # (worker 0's: it gathers its own lines; a checkout before that scans for no worker)
            me = (0,) if "me" in inspect.signature(compiled_scan).parameters else ()
            return lambda body: compiled_scan(body, self.spec, self.opts, self.keys, self.n, *me)
        return Scanner(self.opts, self.keys, self.n) if self.xml else lambda body: scan(body, self.opts, self.keys, self.n)

    def scans(self, me: int) -> list[Any]:
        """The scans of worker ``me``'s chunks (chunk ``c`` by worker ``c % n``; with the compiled line scan, every
        block's by each worker)."""
        scan, chunk = self.scanner(), self.chunk
        return [scan(body) for c in range(0, len(self.blocks), chunk)
                if self.spec is not None or c // chunk % self.n == me for body in self.blocks[c:c + chunk]]

    def share(self) -> Any:
        """Worker 0's :class:`~yfpp.workers.reading.Share`, the peers' scans of their chunks in its inbox."""
        import queue

        from yfpp.workers.pool import SLICE_EVENTS, Sequencer
        from yfpp.workers.reading import Relay, Share
        from yfpp.workers.xml_reading import XmlShare

        n, opts, blocks, scan = self.n, self.opts, self.blocks, self.scanner()
        inboxes: list[Any] = [queue.Queue() for _ in range(n)]
        sent = getattr(Relay, "sent", lambda sc: sc)  # (as a peer's scan comes: a checkout before it kept records)
        chunk = self.chunk
        chunks = (len(blocks) + chunk - 1) // chunk
        for c in range(chunks):
            if c % n and self.spec is None:  # (with the compiled line scan, the peers send nothing but their ends)
                inboxes[0].put((c % n, c, [sent(scan(body)) for body in blocks[c * chunk:(c + 1) * chunk]]))
        size = sum(map(len, blocks))  # (the bytes each peer read, which a checkout since one read of the file checks)
        for w in range(1, n):
            inboxes[0].put((w, (chunks, size) if hasattr(Relay, "same_file") else chunks, None))
        spec = {"spec": self.spec} if self.spec is not None else {}
        return (XmlShare if self.xml else Share)(str(self.path), opts, self.groups, 0, n, SLICE_EVENTS, self.dead,
                                                 Sequencer(dead_letters=self.dead), {}, inboxes, **spec)


def path_costs(path: Path, workload: str, n: int = 2) -> dict[str, float]:
    """CPU s, in this process, of the parts of one engine's run and of worker 0 of ``n``'s (the longest path
    but the parent's start, which every N pays): ``read`` — one reader over the whole feed; ``match`` — one
    engine over all its events; ``share`` — worker 0 reading its share (``Share.blocks()``: scanning its chunks,
    parsing its own lines, each block's events dropped; the peers' scans already in its inbox); ``scan`` — of that, the scans of its chunks;
    ``own`` — matching the events it routed to itself. Each the best of 3."""
    import collections
    import gc
    import time

    from yfpp.workers.pool import _Matching

    parts = Parts(path, workload, n)
    best: dict[str, float] = {}

    gc.set_threshold(100_000, 50, 100)  # (as yfpp run and its workers; what is kept from part to part frozen)

    def clock(name: str, work: Any) -> Any:
        gc.collect()
        gc.freeze()
        started = time.process_time()
        got = work()
        best[name] = min(best.get(name, float("inf")), time.process_time() - started)
        return got

    for _ in range(3):
        batches = clock("read", parts.read_all)
        one = parts.loaded()
        clock("match", lambda: [one.process_batch(b, []) for b in batches] + [one.flush()])
        batches = []  # (the events freed before the next parts)
        clock("scan", lambda: parts.scans(0))
        share = parts.share()
        clock("share", lambda: collections.deque(share.blocks(), 0))  # (each block's events dropped, as a worker's
        share = parts.share()                                         # matching drops them; then kept, to match)
        routed = list(share.blocks())
        matching = _Matching(parts.groups, {}, parts.dead, share.slicings)
        clock("own", lambda: [matching.feed(r.items(), closes, []) for r, closes in routed] + [matching.finish()])
    return best


INSTRUCTION_PARTS = ("start", "peers", "share", "read")  #: what --part runs (each after reading the feed's blocks)


def run_part(path: Path, workload: str, part: str) -> None:
    """One part, for :func:`share_instructions`: ``start`` nothing more; ``peers`` worker 1's scans of its chunks;
    ``share`` those and worker 0 reading its share (its events dropped as they come, as its matching drops them);
    ``read`` one reader over the whole feed."""
    parts = Parts(path, workload)
    if part == "peers" and parts.spec is None:  # (with the compiled line scan, worker 1 scans nothing for worker 0)
        parts.scans(1)
    elif part == "share":
        for _ in parts.share().blocks():
            pass
    elif part == "read":
        parts.read_all()


def share_instructions(workload: str, events: int, code: str, fmt: str = "jsonl") -> dict[str, float]:
    """Instructions per event (callgrind; the yfpp at ``code``) of worker 0 of 2 reading its share (scanning its
    chunks, parsing its own lines: ``share`` less ``peers``) and of one reader reading the whole feed (``fmt``:
    ``jsonl`` or ``xml``)."""
    from bench_common import callgrind_instructions

    feed(workload, events, fmt)
    xml = ["--xml"] if fmt == "xml" else []
    got = {part: callgrind_instructions([__file__, "--part", part, "--workloads", workload, "--events", str(events),
                                         *xml], str(ROOT), code) for part in INSTRUCTION_PARTS}
    return {"share": (got["share"] - got["peers"]) / events, "read": (got["read"] - got["start"]) / events,
            "peers": (got["peers"] - got["start"]) / events}


def run_instructions(workload: str, events: int, code: str, n: int, fmt: str = "jsonl",
                     from_source: bool = False) -> list[int]:
    """Instructions (callgrind; the yfpp at ``code``) of each process of ``yfpp run --workers n`` over the feed
    (``fmt``: ``jsonl`` or ``xml``): the parent's first (its start, routing nothing: the workers read the file), then
    each worker's from its fork. yfpp's modules are loaded from byte code compiled beforehand, as an installed
    package has it (``from_source``: compiled from the sources as they are imported, where nothing writes byte code,
    ``PYTHONDONTWRITEBYTECODE``: about a thousand million instructions more at the start)."""
    import glob
    import os
    import re
    import subprocess

    with tempfile.TemporaryDirectory(prefix="yfpp-callgrind-") as tmp:
        env = {**os.environ, "PYTHONPATH": code, "PYTHONHASHSEED": "0"}
        if not from_source:  # (a copy of the package, compiled: the checkout is left as it is)
            import shutil

            shutil.copytree(f"{code}/yfpp", f"{tmp}/code/yfpp")
            subprocess.run([sys.executable, "-m", "compileall", "-q", f"{tmp}/code/yfpp"], check=True)
            env["PYTHONPATH"] = code = f"{tmp}/code"  # (and the working directory: `-m` looks there first)
        subprocess.run(["valgrind", "--tool=callgrind", "--zero-before=PyOS_AfterFork_Child",
                        f"--callgrind-out-file={tmp}/cg.%p", sys.executable, "-m", "yfpp", "run", "-q", query(workload),
                        "-i", str(feed(workload, events, fmt)), "--workers", str(n), "-o", f"{tmp}/out", "--progress", "never"],
                       cwd=code, env=env, check=True, capture_output=True)
        counts = [int(re.search(r"^summary:\s+(\d+)", Path(f).read_text(), re.M).group(1))  # type: ignore[union-attr]
                  for f in sorted(glob.glob(f"{tmp}/cg.*"), key=lambda f: int(f.rsplit(".", 1)[1]))]
    return counts  # (the parent's pid is the lowest: it forks the workers)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--max-workers", type=int, default=2, help="largest N (N = 1, 2, 4, … up to it)")
    ap.add_argument("--workloads", default="keyed,unkeyed")
    ap.add_argument("--xml", action="store_true", help="XML feeds (one event element a line) instead of JSON lines")
    ap.add_argument("--repeat", type=int, default=1, help="run the N = 1, 2, … sequence this many times, in turn")
    ap.add_argument("--costs", action="store_true",
                    help="also measure reading and shipping an event, per event (why the parent reads), and the parts "
                         "of one engine's run and of worker 0 of 2's, in this process (yfpp run's longest path)")
    ap.add_argument("--instructions", action="store_true",
                    help="instead of the runs: instructions per event (callgrind) of worker 0 of 2 reading its share "
                         "and of one reader (try --events 200000)")
    ap.add_argument("--code", default=str(ROOT),
                    help="with --instructions: the yfpp checkout to measure (PYTHONPATH; another commit's for a before)")
    ap.add_argument("--run-instructions", action="store_true",
                    help="instead of the runs: instructions (callgrind) of each process of N = 1 and 2's whole "
                         "commands, and of N = 2's longest path (the parent and the busiest worker; try --events 200000)")
    ap.add_argument("--from-source", action="store_true",
                    help="with --run-instructions: yfpp's modules compiled as they are imported, not read as byte code")
    ap.add_argument("--part", choices=INSTRUCTION_PARTS, help=argparse.SUPPRESS)  # (one part, under callgrind)
    args = ap.parse_args()
    fmt = "xml" if args.xml else "jsonl"
    if args.run_instructions:
        print(f"yfpp at {args.code}, {args.events:,} events, {fmt}; instructions per event (callgrind), each process; "
              f"yfpp {'compiled from its sources' if args.from_source else 'read as byte code'}")
        for workload in args.workloads.split(","):
            (one,), (parent, *workers) = (run_instructions(workload, args.events, args.code, n, fmt, args.from_source)
                                          for n in (1, 2))
            path = parent + max(workers)
            print(f"{workload:<9} N=1 {one / args.events:,.0f}; N=2 parent {parent / args.events:,.0f}, workers "
                  f"{', '.join(f'{w / args.events:,.0f}' for w in workers)}; busiest worker / (N=1 less the parent) "
                  f"{max(workers) / (one - parent):.3f}; N=1 / longest path {one / path:.3f}x", flush=True)
        return 0
    if args.part:
        workload = args.workloads.split(",")[0]
        run_part(feed(workload, args.events, fmt), workload, args.part)
        return 0
    if args.instructions:
        print(f"yfpp at {args.code}, {args.events:,} events, {fmt}; instructions per event (callgrind)")
        for workload in args.workloads.split(","):
            c = share_instructions(workload, args.events, args.code, fmt)
            print(f"{workload:<9} worker 0 of 2 reading its share {c['share']:,.0f} (worker 1's scans of its chunks "
                  f"{c['peers']:,.0f}); one reader {c['read']:,.0f}; share / one reader {c['share'] / c['read']:.3f}",
                  flush=True)
        return 0
    print(f"commit {commit()}, {args.events:,} events, {'XML' if args.xml else 'JSON-lines'} feeds; two busy processes "
          f"get {cores_for_two():.2f} cores")
    print(f"{'workload':<9} {'N':>3} {'wall s':>7} {'events/s':>10} {'speed-up':>8} {'CPU s':>7} {'CPU µs/ev':>9} "
          f"{'path CPU s':>10} {'free cores':>10}  matches")
    with tempfile.TemporaryDirectory(prefix="yfpp-workers-") as tmp:
        for workload in args.workloads.split(","):
            path = feed(workload, args.events, fmt)
            base_wall = base_cpu = 1.0
            base = None
            speedups: dict[int, list[float]] = {}
            if args.costs:
                c = shipping_costs(path)
                print(f"{workload:<9} reading {c['read']:.2f} CPU µs/event; shipping a parsed event to a worker "
                      f"{c['ship']:.2f} CPU µs/event", flush=True)
                c = path_costs(path, workload)
                one, worker = c["read"] + c["match"], c["share"] + c["own"]
                print(f"{workload:<9} CPU s, best of 3: one engine: reading {c['read']:.2f} + matching {c['match']:.2f} "
                      f"= {one:.2f}; worker 0 of 2: its share {c['share']:.2f} (of it scanning its chunks "
                      f"{c['scan']:.2f}) + matching {c['own']:.2f} = {worker:.2f}; allowed (one / worker 0) "
                      f"{one / worker:.2f}x", flush=True)
            for n in [n for _ in range(args.repeat) for n in counts(args.max_workers)]:  # N = 1, 2, 1, 2, …
                out, stats = Path(tmp) / f"{workload}_{n}.jsonl", Path(tmp) / "stats.json"
                wall, cpu, _ = timed([sys.executable, "-m", "yfpp", "run", "-q", query(workload), "-i", str(path),
                                      "--workers", str(n), "-o", str(out), "--progress", "never",
                                      "--stats-json", str(stats)])
                figures = json.loads(stats.read_text())
                workers = figures.get("worker_cpu_s", [])
                reading = f"; {figures['workers_reading']}" if n > 1 and "workers_reading" in figures else ""
                path_cpu = cpu - sum(workers) + max(workers, default=0.0)
                found = Counter(out.read_text().splitlines())
                if n == 1:  # (speed-ups: against the N = 1 run just before)
                    base_wall, base_cpu = wall, cpu
                base = base if base is not None else found
                same = "same as N=1" if found == base else "DIFFERENT from N=1"
                speedups.setdefault(n, []).append(base_wall / wall)
                print(f"{workload:<9} {n:>3} {wall:>7.2f} {args.events / wall:>10,.0f} {base_wall / wall:>7.2f}x "
                      f"{cpu:>7.2f} {cpu / args.events * 1e6:>9.1f} {path_cpu:>10.2f} {base_cpu / path_cpu:>9.2f}x  "
                      f"{sum(found.values()):,} ({same}{reading})", flush=True)
            for n, ratios in speedups.items():
                if n > 1:
                    print(f"{workload:<9} events per wall second N={n} / N=1: median {statistics.median(ratios):.2f}x "
                          f"(min {min(ratios):.2f}, max {max(ratios):.2f}, {len(ratios)} pair{'s' * (len(ratios) > 1)})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
