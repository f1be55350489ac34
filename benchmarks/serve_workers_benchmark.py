"""``yfpp serve --workers N``: server CPU and wall time per event at each N, side by side.

For each round and each N in turn (so that the machine's drift falls on every N alike): ``yfpp serve
--workers N`` as its own process on 127.0.0.1 (a JSON-lines feed port), S subscriptions of the correlated
RFID template of ``subscriptions_benchmark.py`` registered in ``POST /subscriptions`` batches, then E
events (``build_events``, JSON lines) written to the feed. *wall*: from the first write until ``/health``
says the engine thread and every worker engine have taken every event; *CPU*: the user + system seconds
(``/proc``) of the service process and its worker processes over the same span; both per event. On a
shared machine the wall time is the machine's; *speed-up allowed on free cores*: N = first's CPU over the
busiest process's CPU at each N (what the wall time would show on free cores). The matches each N made
are checked to be the same (the subscriptions' counters).

``--plans``: instead, in this process, the engine alone (``Engine.process_batch``, one event at a time) over
the same events and queries, CPU per event of the whole stream: with every subscription; with each second
subscription (what one of two engines holds when the subscriptions are spread, each fed every event);
with every subscription over the events of half the ``tag_id`` keys (what one of two engines takes when the
events are partitioned by the queries' equivalence key, as ``yfpp run --workers`` does).

    python benchmarks/serve_workers_benchmark.py --subs 10000 --events 50000 --workers 1 2 --rounds 2
    python benchmarks/serve_workers_benchmark.py --subs 10000 --events 20000 --plans
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_common import commit  # noqa: E402
from service_scale_benchmark import BATCH, Serve, cpu_seconds  # noqa: E402
from subscriptions_benchmark import TEMPLATES, build_events  # noqa: E402


POLL = 0.05  #: seconds between two looks at /health (each costs the service CPU: not too often)


def tree_cpu(pid: int) -> dict[int, float]:
    """CPU seconds now of process ``pid`` and of each of its children (its worker engines), by pid."""
    children: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        children += [int(c) for c in (task / "children").read_text().split()]
    cpu = {pid: cpu_seconds(pid)}
    for child in children:
        try:
            cpu[child] = cpu_seconds(child)
        except FileNotFoundError:  # (a checkpoint's child that ended meanwhile)
            pass
    return cpu


def one(n: int, specs: list[dict], lines: bytes, events: int) -> dict:
    """``yfpp serve --workers n`` over the events: its figures."""
    with tempfile.TemporaryDirectory() as tmp, \
            Serve(Path(tmp) / "state", len(specs), checkpoint_every=3600, extra=("--workers", str(n))) as svc:
        for i in range(0, len(specs), BATCH):
            answers = svc.request("POST", "/subscriptions", specs[i:i + BATCH])
            assert all(a["status"] == 201 for a in answers), answers[:3]  # type: ignore[union-attr]
        cpu0, t0 = tree_cpu(svc.proc.pid), time.perf_counter()
        with socket.create_connection(("127.0.0.1", svc.feed)) as s:
            s.sendall(lines)
        while True:
            health = svc.request("GET", "/health")
            if health["events_in"] >= events and all(w["events_in"] >= events for w in health["workers"]):  # type: ignore[index]
                break
            time.sleep(POLL)
        wall, cpu1 = time.perf_counter() - t0, tree_cpu(svc.proc.pid)
        spent = {p: cpu1[p] - cpu0.get(p, 0.0) for p in cpu1}
        time.sleep(1.5)  # (the matches routed and counted)
        matches = sum(s["counters"]["matches"] for s in svc.request("GET", "/subscriptions"))  # type: ignore[union-attr]
        svc.stop()
    return {"workers": n, "wall_us": 1e6 * wall / events, "cpu_us": 1e6 * sum(spent.values()) / events,
            "longest_us": 1e6 * max(spent.values()) / events, "matches": matches,
            "by_process_us": [round(1e6 * spent[p] / events, 1) for p in spent]}  # (the service's first)


def plans(specs: list[dict], events: list, rounds: int) -> None:
    """The engine's CPU per event of the whole stream, for each plan's share of two engines (``--plans``)."""
    import gc

    from yfpp.engine import Engine
    from yfpp.input.events import Event

    cases = {"every subscription, every event": (specs, events),
             "half the subscriptions, every event": (specs[::2], events),
             "every subscription, half the keys' events": (specs, [ev for ev in events if ev.attrs["tag_id"] % 2])}
    figures: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(rounds):
        for name, (mine, evs) in cases.items():
            engine = Engine()
            for spec in mine:
                engine.register(spec["query"], name=spec["name"])
            gc.freeze()
            out: list[dict] = []
            t0 = time.process_time()
            for ev in evs:
                engine.process_batch((Event(ev.type, ev.ts, ev.attrs),), out)
            figures[name].append(1e6 * (time.process_time() - t0) / len(events))
    print(f"commit {commit()}  engine alone, {len(specs):,} subscriptions, {len(events):,} events")
    print("| one of two engines holds | engine CPU µs per event of the stream (each round) |")
    print("|---|---|")
    for name, values in figures.items():
        print(f"| {name} | {', '.join(f'{v:.1f}' for v in values)} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--subs", type=int, default=10_000)
    ap.add_argument("--events", type=int, default=20_000)
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--plans", action="store_true", help="the engine alone, for each plan's share (see above)")
    args = ap.parse_args()
    s, e = args.subs, args.events
    events = build_events(e, s, s, "correlated", args.seed)
    lines = b"".join(json.dumps({"type": ev.type, "ts": ev.ts, **ev.attrs}).encode() + b"\n" for ev in events)
    specs = [{"query": TEMPLATES["sase"].format(k=k), "name": f"q{k}"} for k in range(1, s + 1)]
    if args.plans:
        plans(specs, events, args.rounds)
        return
    runs = [one(n, specs, lines, e) for _ in range(args.rounds) for n in args.workers]
    assert len({r["matches"] for r in runs}) == 1, runs
    print(f"commit {commit()}  {s:,} subscriptions, {e:,} events, {runs[0]['matches']:,} matches at every N")
    base = statistics.median(r["wall_us"] for r in runs if r["workers"] == args.workers[0])
    cpu1 = statistics.median(r["cpu_us"] for r in runs if r["workers"] == args.workers[0])
    print("| workers | wall µs/event (median; each run) | events/s | speed-up | CPU µs/event, all processes "
          "(median) | busiest process's CPU µs/event | speed-up allowed on free cores |")
    print("|---:|---|---:|---:|---:|---:|---:|")
    for n in args.workers:
        mine = [r for r in runs if r["workers"] == n]
        wall = statistics.median(r["wall_us"] for r in mine)
        each = ", ".join(f"{r['wall_us']:.1f}" for r in mine)
        longest = statistics.median(r["longest_us"] for r in mine)
        print(f"| {n} | {wall:.1f} ({each}) | {1e6 / wall:,.0f} | {base / wall:.2f} | "
              f"{statistics.median(r['cpu_us'] for r in mine):.1f} | {longest:.1f} | {cpu1 / longest:.2f} |")
    print(json.dumps(runs))


if __name__ == "__main__":
    main()
