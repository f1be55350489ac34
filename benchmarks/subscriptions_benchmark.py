"""Scale of subscriptions: 1 … 10,000 RFID subscriptions over one feed (issue 4, item 7b).

Subscription k (k = 1..N) is the template

    [tag_id]&&//shelf[@zone='Zk']//exit[@door='Dk']&&(1 hour)                  (xpath)
    PATTERN SEQ(shelf a, exit c) WHERE skip_till_any_match(a, c)
      { [tag_id] AND a.zone = 'Zk' AND c.door = 'Dk' } WITHIN 1 hour            (sase)

registered N at a time in one engine; the shared NFA finds the one
``shelf[@zone='Zk']`` / ``exit[@door='Dk']`` node of an event through its
predicate indexes, so the per-event cost should hardly depend on N.

Streams (``--events``, default 200,000, from :func:`yfpp.input.generate.generate_rfid`,
20 tags in flight, gap 20 s, seed ``--seed``).  One base stream is generated
with zones = doors = L = lcm(sizes) (10,000 by default) and, for size N, zone
``Zz`` becomes ``Z((z-1) mod N + 1)`` and door ``Dd`` becomes
``D((d-1) mod N + 1)``: uniform over 1..N, exactly as ``generate_rfid(zones=N,
doors=N)`` draws them, but the sequence of types, tags and timestamps is the
same event for event at every N (a fresh ``generate_rfid(zones=N)`` would
consume the random generator differently for each N).

* ``uniform`` — zones and doors as above, independent.  Subscription k matches
  a tag whose exit door is Dk after a shelf reading in Zk, so the total match
  count falls as 1/N (~100k at N = 1, ~10 at N = 10,000): N = 1 does the most
  match work.
* ``correlated`` — as ``uniform``, but each exit's door is set to the number of
  the (mapped) zone of the tag's first shelf reading, so every tag that exits
  matches at least one subscription at every N; the match count stays within
  ~2x across N (at N = 1 every shelf reading of the tag matches, at large N
  mostly the first only).  This is the "comparable match output" stream.

Each (language, stream, N) runs in its own worker process (``--worker``),
one at a time, so that memory figures are per configuration: the worker
builds the events (fresh Event objects, ``seq`` given), registers one
throwaway query in a throwaway engine (so lazy imports are not charged to
registration or memory), then measures
registration (wall time) and one engine pass (wall and CPU time; CPU time
spent in Python's cyclic GC via ``gc.callbacks``).  Memory is the growth of
the worker's peak RSS (``resource.getrusage(RUSAGE_SELF).ru_maxrss``) over its
value after building the stream: after registration, and after the pass
(high-water marks, so they include transient allocations).  The pass takes
events off a deque as it goes, so an event (and the lxml element an xpath
``@zone``/``@door`` test builds and caches on it, ``Event.element``) lives on
only while the engine holds it, as with a streaming source; the memory the
consumed events free can be reused by the engine, so "total" is a lower bound
of what the engine allocated during the pass.

``--sweep auto`` is a diagnostic: it sets ``runtime.SWEEP_EVERY`` on the
engine's Runtime instance (engine code unchanged) to at least the number of
NFA nodes + queries, so the periodic sweep, which visits every node and every
query, is amortised over as many events as it visits objects.

    python benchmarks/subscriptions_benchmark.py --quick
    python benchmarks/subscriptions_benchmark.py --languages xpath --streams uniform correlated
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import io
import json
import math
import pstats
import resource
import shlex
import subprocess
import sys
import time
from collections import deque
from pathlib import Path

from yfpp.engine import Engine
from yfpp.input.events import Event
from yfpp.input.generate import generate_rfid
from bench_common import GcTimer, commit, short_path

ROOT = Path(__file__).resolve().parent.parent
TEMPLATES = {
    "xpath": "[tag_id]&&//shelf[@zone='Z{k}']//exit[@door='D{k}']&&(1 hour)",
    "sase": ("PATTERN SEQ(shelf a, exit c) WHERE skip_till_any_match(a, c) "
             "{{ [tag_id] AND a.zone = 'Z{k}' AND c.door = 'D{k}' }} WITHIN 1 hour"),
}
STREAMS = ("uniform", "correlated")
TARGET = 3.0  # per-event(largest N) <= TARGET x per-event(1)


# --- worker ---------------------------------------------------------------------------


def build_events(n_events: int, n: int, base: int, stream: str, seed: int) -> list[Event]:
    """The size-``n`` stream (see the module doc) as fresh Events with seq = index."""
    events = []
    first_zone: dict[int, int] = {}  # tag -> mapped zone number of its first shelf reading
    for i, r in enumerate(generate_rfid(n_events, zones=base, doors=base, seed=seed)):
        etype, ts = r.pop("type"), r.pop("ts")
        if etype == "shelf":
            z = (int(r["zone"][1:]) - 1) % n + 1
            r["zone"] = f"Z{z}"
            first_zone.setdefault(r["tag_id"], z)
        elif etype == "exit":
            if stream == "correlated":
                r["door"] = f"D{first_zone.pop(r['tag_id'])}"
            else:
                r["door"] = f"D{(int(r['door'][1:]) - 1) % n + 1}"
        events.append(Event(etype, ts, r, i))
    return events





def maxrss_kib() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux


def worker(args) -> dict:
    events = build_events(args.events, args.n, args.base, args.stream, args.seed)
    template = TEMPLATES[args.language]
    Engine().register(template.format(k=0))  # warm-up: lazy imports (parser, lxml) before the baselines
    gc.collect()
    rss0 = maxrss_kib()
    eng = Engine()
    t0 = time.perf_counter()
    for k in range(1, args.n + 1):
        eng.register(template.format(k=k), name=f"s{k}")
    reg = time.perf_counter() - t0
    rss_reg = maxrss_kib()
    rt = eng.runtime
    nodes = sum(1 for _ in rt.nfa.nodes())
    if args.sweep == "auto":
        rt.SWEEP_EVERY = max(type(rt).SWEEP_EVERY, nodes + len(eng.queries))
        rt._next_sweep = rt.tick + rt.SWEEP_EVERY
    out = {"n": args.n, "language": args.language, "stream": args.stream, "sweep": args.sweep, "events": len(events),
           "register_s": reg, "nodes": nodes, "states": rt.live_states}
    if args.profile:
        prof = cProfile.Profile()
        prof.enable()
        for ev in events:
            eng.process(ev)
        eng.flush()
        prof.disable()
        out["profile"] = profile_rows(prof, args.top)
        return out
    matches = 0
    queue = deque(events)  # consumed as processed: an event lives on only if the engine keeps it
    del events
    gc.collect()
    with GcTimer() as gct:
        t0, c0 = time.perf_counter(), time.process_time()
        while queue:
            matches += len(eng.process(queue.popleft()))
        matches += len(eng.flush())
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    s = eng.stats
    out.update(wall=wall, cpu=cpu, gc=gct.seconds, full_gcs=gct.full, matches=matches, peak_runs=s.peak_runs,
               runs_created=s.runs_created, runs_touched=s.runs_touched, peak_buffer=s.peak_buffer,
               rss_reg_kib=rss_reg - rss0, rss_kib=maxrss_kib() - rss0)
    return out


def profile_rows(prof: cProfile.Profile, top: int) -> str:
    st = pstats.Stats(prof, stream=io.StringIO())
    total = max(st.total_tt, 1e-9)
    rows = ["| function | calls | own s | cumulative s | cumulative % |", "|---|---|---|---|---|"]
    for (file, line, fn), (cc, nc, tt, ct, _) in sorted(st.stats.items(), key=lambda kv: kv[1][3], reverse=True)[:top]:
        where = f"{short_path(file)}:{line}({fn})" if line else fn
        rows.append(f"| `{where}` | {nc:,} | {tt:.2f} | {ct:.2f} | {100 * ct / total:.0f} |")
    return f"{total:.2f} s under cProfile\n\n" + "\n".join(rows)





# --- driver ---------------------------------------------------------------------------


def run_worker(language: str, stream: str, n: int, args, *, sweep: str, profile: bool = False, events: int | None = None) -> dict:
    cmd = [sys.executable, __file__, "--worker", "--language", language, "--stream", stream, "--n", str(n),
           "--base", str(args.base), "--events", str(events or args.events), "--seed", str(args.seed),
           "--sweep", sweep, "--top", str(args.top)]
    if profile:
        cmd.append("--profile")
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        sys.stderr.write(done.stderr)
        raise SystemExit(f"worker failed: {shlex.join(cmd)}")
    return json.loads(done.stdout.strip().splitlines()[-1])


HEADER = ["subscriptions", "register s", "register ms/sub", "µs/event (CPU)", "µs/event (wall)", "of which GC µs/event",
          "events/s (CPU)", "matches", "peak runs", "runs created", "runs touched/event", "NFA nodes",
          "peak RSS growth MiB: register / total"]


def table(rows: list[dict]) -> str:
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    for r in rows:
        e = r["events"]
        lines.append("| " + " | ".join([
            f"{r['n']:,}", f"{r['register_s']:.2f}", f"{1e3 * r['register_s'] / r['n']:.2f}", f"{1e6 * r['cpu'] / e:.1f}",
            f"{1e6 * r['wall'] / e:.1f}", f"{1e6 * r['gc'] / e:.1f}", f"{e / r['cpu']:,.0f}", f"{r['matches']:,}",
            f"{r['peak_runs']:,}", f"{r['runs_created']:,}", f"{r['runs_touched'] / e:.2f}", f"{r['nodes']:,}",
            f"{r['rss_reg_kib'] / 1024:.1f} / {r['rss_kib'] / 1024:.1f}"]) + " |")
    lo, hi = rows[0], rows[-1]
    cpu, wall = hi["cpu"] / lo["cpu"], hi["wall"] / lo["wall"]
    nogc = (hi["cpu"] - hi["gc"]) / (lo["cpu"] - lo["gc"])
    lines.append("")
    lines.append(f"per-event({hi['n']:,}) / per-event({lo['n']:,}): CPU {cpu:.2f}x, wall {wall:.2f}x, "
                 f"CPU without GC {nogc:.2f}x — target <= {TARGET:g}x: {'met' if cpu <= TARGET else 'MISSED'}")
    return "\n".join(lines)



def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="smoke test: 10,000 events, sizes 1..1,000")
    ap.add_argument("--sizes", type=int, nargs="+", default=[1, 10, 100, 1000, 10000])
    ap.add_argument("--events", type=int, default=200_000)
    ap.add_argument("--languages", nargs="+", choices=list(TEMPLATES), default=list(TEMPLATES))
    ap.add_argument("--streams", nargs="+", choices=STREAMS, default=list(STREAMS))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--sweep", choices=["default", "auto"], nargs="+", default=["default"],
                    help="'auto': diagnostic sweep interval >= NFA nodes + queries (see the module doc)")
    ap.add_argument("--profile", action="store_true", help="cProfile the largest size (done anyway if a target is missed)")
    ap.add_argument("--no-profile", action="store_true")
    ap.add_argument("--profile-events", type=int, default=50_000, help="events of the profiled pass")
    ap.add_argument("--top", type=int, default=20)
    # worker mode (internal)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--language", default="xpath", help=argparse.SUPPRESS)
    ap.add_argument("--stream", default="uniform", help=argparse.SUPPRESS)
    ap.add_argument("--n", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--base", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        args.sweep = args.sweep[0]
        print(json.dumps(worker(args)))
        return 0
    if args.quick:
        args.events, args.sizes = 10_000, [1, 10, 100, 1000]
    args.sizes = sorted(set(args.sizes))
    args.base = math.lcm(*args.sizes)

    print("command: " + shlex.join(getattr(sys, "orig_argv", [sys.executable, *sys.argv])))
    print(f"yfpp commit: {commit()} (working tree may differ); python {sys.version.split()[0]}")
    print(f"stream: generate_rfid({args.events:,}, zones=doors={args.base:,}, seed={args.seed}) mapped to N zones/doors "
          f"(see the module doc); one worker process per row, run one at a time")
    missed: list[tuple[str, str, str]] = []
    for language in args.languages:
        for stream in args.streams:
            for sweep in args.sweep:
                rows = []
                for n in args.sizes:
                    r = run_worker(language, stream, n, args, sweep=sweep)
                    print(f"  {language} {stream} sweep={sweep} N={n:,}: register {r['register_s']:.1f} s, "
                          f"{r['cpu']:.1f} s CPU, {r['matches']:,} matches", file=sys.stderr, flush=True)
                    rows.append(r)
                print()
                title = f"### {language}, {stream} stream" + ("" if sweep == "default" else ", DIAGNOSTIC sweep interval >= NFA nodes + queries")
                print(title)
                print()
                print(f"template: `{TEMPLATES[language].format(k='k')}`")
                print()
                print(table(rows))
                if rows[-1]["cpu"] / rows[0]["cpu"] > TARGET and sweep == "default":
                    missed.append((language, stream, sweep))
    if not args.no_profile and (args.profile or missed) and not (args.quick and not args.profile):
        language, stream, sweep = missed[0] if missed else (args.languages[0], args.streams[0], args.sweep[0])
        n = args.sizes[-1]
        r = run_worker(language, stream, n, args, sweep=sweep, profile=True, events=min(args.profile_events, args.events))
        print()
        print(f"### profile: {language}, {stream} stream, {n:,} subscriptions, first {min(args.profile_events, args.events):,} events")
        print()
        print(r["profile"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
