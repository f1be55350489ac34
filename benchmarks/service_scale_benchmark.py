"""``yfpp serve`` against ``yfpp run``: CPU per event, registration, stop, restart, checkpoint stall.

All on 127.0.0.1, the service as its own process (``yfpp serve --state DIR``, a JSON-lines feed port):

* N subscriptions of the correlated RFID template of ``subscriptions_benchmark.py`` are registered in
  ``POST /subscriptions`` of 4,000 each (JSON arrays): the service's CPU seconds for it; then 300 more one request each
  (service CPU per request: the median of 5 rounds of 60, as a periodic checkpoint adds its CPU to one round);
* ``--rounds`` K rounds of E events (``build_events``, as JSON lines) are written to the feed, one round after
  the other: the service's CPU seconds from a round's first write until it has taken every event of it, per
  event; against ``yfpp run``'s own loop (``yfpp.cli.write_matches``: the reader, the engine, each match a JSON
  line to /dev/null) over the same events (a file) and the same N queries (a query file), in a process of its
  own, its CPU seconds apart from registering the queries, per event of each round; the ratio round by round,
  and its median (one round is 0.2-2 s of CPU: the machine's noise moves one round's figures by a fifth);
* SIGTERM: seconds until the process has ended (and its CPU seconds meanwhile), and that the final checkpoint
  was written;
* the service started again on that state: seconds until ``/health`` answers 200 (every subscription
  registered again), and its CPU seconds;
* the engine thread's seconds for each periodic checkpoint (the service's log, ``engine_thread_s``; one every
  5 s while the events are taken, ``--checkpoint-every``);
* once every event is taken, the service idle for three checkpoint periods (with ``--checkpoint-every`` up
  to 10 s): its CPU seconds per periodic checkpoint written meanwhile (the idle loop's counted in);
* ``--runs R``: in this process, an engine holding R partial matches, the seconds ``checkpoint.take`` holds
  the caller (the service's engine thread) and the seconds until the checkpoint is written (``Staged.write``,
  on the service's checkpoint thread).

    python benchmarks/service_scale_benchmark.py --subs 100 --events 20000
    python benchmarks/service_scale_benchmark.py --subs 10000 --events 20000 --runs 240000
    python benchmarks/service_scale_benchmark.py --subs 100000 --events 20000 --checkpoint-every 3600  # (none)
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_common import commit  # noqa: E402
from subscriptions_benchmark import TEMPLATES, build_events  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
SINGLES, ROUND = 300, 60  #: subscriptions registered one request each, in rounds (the median round is reported:
#: a periodic checkpoint that falls in a round adds its CPU to that round's requests)
BATCH = 4000  #: subscriptions per POST /subscriptions


def cpu_seconds(pid: int, children: bool = False) -> float:
    """The process's CPU seconds (user + system); ``children``: with those of its children it has waited for."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(x) for x in fields[11:15 if children else 13]) / os.sysconf("SC_CLK_TCK")


class Serve:
    """``yfpp serve`` on ``state``: its log lines gathered by a thread."""

    def __init__(self, state: Path, subs: int, checkpoint_every: float, extra: tuple[str, ...] = ()):
        self.started_at = time.perf_counter()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "yfpp.cli", "serve", "--port", "0", "--jsonl-port", "0", "--state", str(state),
             "--log-level", "info", "--max-subscriptions", str(subs + 1000), "--no-subscription-metrics",
             "--checkpoint-every", str(checkpoint_every), *extra],
            cwd=ROOT, stderr=subprocess.PIPE, text=True, env=ENV)
        self.log: list[dict] = []
        self.ready = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()
        if not self.ready.wait(600):
            raise SystemExit("the service did not start")
        info = next(x for x in self.log if x.get("msg") == "service started")
        self.url, self.feed = f"http://{info['http']}", info["feeds"]["jsonl"]

    def _read(self) -> None:
        for line in self.proc.stderr:  # type: ignore[union-attr]
            try:
                self.log.append(json.loads(line))
            except ValueError:
                continue
            if self.log[-1].get("msg") == "service started":
                self.ready.set()

    def request(self, method: str, path: str, body: object = None) -> object:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=600) as r:
            return json.loads(r.read())

    def cpu(self) -> float:
        return cpu_seconds(self.proc.pid)

    def stop(self) -> tuple[float, float]:
        """SIGTERM; the seconds until the process ended, and the CPU seconds it (and any child it waited for:
        ``os.wait4`` counts them) spent meanwhile."""
        cpu0 = cpu_seconds(self.proc.pid, children=True)
        t0 = time.perf_counter()
        self.proc.terminate()
        _, _, usage = os.wait4(self.proc.pid, 0)
        wall = time.perf_counter() - t0
        self.proc.wait(120)  # (reaped already: the Popen learns so)
        return wall, usage.ru_utime + usage.ru_stime - cpu0

    def __enter__(self) -> "Serve":
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)


RUN_LOOP = """
import gc, json, sys, time
from yfpp.cli import write_matches
from yfpp.engine import Engine
from yfpp.input.readers import read_event_batches
from yfpp.language.query_text import load_queries
from yfpp.output.writer import MatchWriter
from yfpp.state.memory_cap import RARE_COLLECTIONS
t0 = time.process_time()
engine = Engine()
for q in load_queries([sys.argv[1]]):
    engine.register(q.text, name=q.name)
gc.freeze()  # (as yfpp run before its loop)
gc.set_threshold(*RARE_COLLECTIONS)
t1 = time.process_time()
size, marks = int(sys.argv[3]), [t1]

def rounds(batches):  # (the batches cut at each round's end; the CPU time when the loop asks past it)
    n = 0
    for batch in batches:
        while batch:
            part, batch = batch[:size - n % size], batch[size - n % size:]
            yield part
            n += len(part)
            if n % size == 0:
                marks.append(time.process_time())

out = MatchWriter("/dev/null", live_input=False)
n = write_matches(engine, rounds(read_event_batches(sys.argv[2], "jsonl")), out, None)
out.close()
print(json.dumps({"register_s": t1 - t0, "events": n, "round_s": [b - a for a, b in zip(marks, marks[1:])]}))
"""


def run_cpu(queries: Path, feed: Path, size: int) -> dict:
    """``yfpp run``'s own loop (``yfpp.cli.write_matches``: reading the feed, the engine, matches written as
    JSON lines to /dev/null; the collector set as ``yfpp run`` sets it) over ``feed`` with the queries of
    ``queries``, in a process of its own: the CPU seconds of registering, and of the loop over each round of
    ``size`` events."""
    done = subprocess.run([sys.executable, "-c", RUN_LOOP, str(queries), str(feed), str(size)], cwd=ROOT, env=ENV,
                          check=True,
                          capture_output=True, text=True)
    return json.loads(done.stdout)


def _written(svc: Serve) -> int:
    """The checkpoints the service's log says it has written so far."""
    return sum(1 for x in list(svc.log) if x.get("msg") == "checkpoint written")


def checkpoint_stall(runs: int) -> dict:
    """An engine with ``runs`` partial matches: seconds ``checkpoint.take`` holds its caller, then until written."""
    from yfpp.engine import Engine
    from yfpp.input.events import Event
    from yfpp.service import checkpoint

    eng = Engine()
    eng.register("PATTERN SEQ(a x, b y) WHERE skip_till_any_match(x, y) { [id] } WITHIN 1000 hours", name="runs")
    for i in range(runs):
        eng.process(Event("a", float(i), {"id": i}))
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "engine-checkpoint.json"
        t0, c0 = time.perf_counter(), time.thread_time()
        taken = checkpoint.take(eng, path, dict)
        held, held_cpu = time.perf_counter() - t0, time.thread_time() - c0
        taken.write()
        taken.commit()
        written, written_cpu = time.perf_counter() - t0, time.thread_time() - c0
        size = path.stat().st_size
    return {"live_runs": eng.stats.live_runs, "engine_thread_s": held, "engine_thread_cpu_s": held_cpu,
            "written_s": written, "written_cpu_s": written_cpu, "bytes": size}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--subs", type=int, default=100)
    ap.add_argument("--events", type=int, default=20_000, help="events per round")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--runs", type=int, default=0, help="also the checkpoint stall of an engine with this many runs")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--checkpoint-every", type=float, default=5.0,
                    help="the service's periodic checkpoints while it takes the events (seconds; 3600: none)")
    ap.add_argument("--record", help="append the figures (JSON, one line) to this file")
    ap.add_argument("--plot", help="plot every run of the --record file to this PNG (and run nothing)")
    args = ap.parse_args()
    if args.plot:
        plot([json.loads(line) for line in Path(args.record).read_text().splitlines()], args.plot)
        return
    n, e = args.subs, args.events
    events = build_events(e * args.rounds, n, n, "correlated", args.seed)
    lines = [json.dumps({"type": ev.type, "ts": ev.ts, **ev.attrs}).encode() + b"\n" for ev in events]
    feeds = [b"".join(lines[i:i + e]) for i in range(0, len(lines), e)]  # (a round's each)
    texts = [TEMPLATES["sase"].format(k=k) for k in range(1, n + 1)]
    r: dict = {"subs": n, "events": e, "rounds": args.rounds, "checkpoint_every": args.checkpoint_every,
               "http": "httptools" if importlib.util.find_spec("httptools") else "h11"}  # (uvicorn's, as the service's)
    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        feed, queries = tmp_path / "feed.jsonl", tmp_path / "queries.sase"
        feed.write_bytes(b"".join(feeds))
        queries.write_text("".join(f"@query q{k}\n{t}\n" for k, t in enumerate(texts, 1)))
        run = run_cpu(queries, feed, e)
        assert run["events"] == e * args.rounds, run
        r["run_cpu_per_event_us_rounds"] = [1e6 * x / e for x in run["round_s"]]
        r["run_cpu_per_event_us"] = statistics.median(r["run_cpu_per_event_us_rounds"])
        r["run_register_cpu_s"] = run["register_s"]

        state = tmp_path / "state"
        with Serve(state, n, checkpoint_every=args.checkpoint_every) as svc:
            cpu0 = svc.cpu()
            specs = [{"query": t, "name": f"q{k}"} for k, t in enumerate(texts, 1)]
            for i in range(0, n, BATCH):  # (a request body is held to max_request_bytes, 1 MB)
                answers = svc.request("POST", "/subscriptions", specs[i:i + BATCH])
                assert all(a["status"] == 201 for a in answers), answers[:3]  # type: ignore[union-attr]
            r["batch_register_cpu_s"] = svc.cpu() - cpu0
            rounds = []  # (CPU, wall) ms per request of each round
            for j in range(0, SINGLES, ROUND):
                cpu0, t0 = svc.cpu(), time.perf_counter()
                for k in range(j, j + ROUND):
                    svc.request("POST", "/subscriptions", {"query": TEMPLATES["sase"].format(k=n + 1 + k), "name": f"one{k}"})
                rounds.append((1000 * (svc.cpu() - cpu0) / ROUND, 1000 * (time.perf_counter() - t0) / ROUND))
            r["single_register_cpu_ms_rounds"] = [c for c, _ in rounds]
            r["single_register_cpu_ms"] = statistics.median(c for c, _ in rounds)
            r["single_register_wall_ms"] = statistics.median(w for _, w in rounds)
            serve, walls, taken = [], [], 0
            for chunk in feeds:
                cpu0, t0 = svc.cpu(), time.perf_counter()
                with socket.create_connection(("127.0.0.1", svc.feed)) as s:
                    s.sendall(chunk)
                taken += e
                while svc.request("GET", "/health")["events_in"] < taken:  # type: ignore[index]
                    time.sleep(0.05)
                serve.append(1e6 * (svc.cpu() - cpu0) / e)
                walls.append(time.perf_counter() - t0)
            r["serve_cpu_per_event_us_rounds"] = serve
            r["serve_cpu_per_event_us"] = statistics.median(serve)
            r["serve_events_per_s"] = e / statistics.median(walls)
            r["ratio_rounds"] = [a / b for a, b in zip(serve, r["run_cpu_per_event_us_rounds"])]
            r["ratio"] = statistics.median(r["ratio_rounds"])
            time.sleep(min(6.0, args.checkpoint_every + 1))  # (a periodic checkpoint past every event)
            if args.checkpoint_every <= 10:
                written, cpu0 = _written(svc), svc.cpu()
                time.sleep(3 * args.checkpoint_every)
                taken = _written(svc) - written
                r["idle_cpu_s_per_checkpoint"] = (svc.cpu() - cpu0) / taken if taken else None
            r["periodic_checkpoint_engine_thread_s"] = [x["engine_thread_s"] for x in svc.log
                                                        if x.get("msg") == "checkpoint written" and "engine_thread_s" in x]
            r["stop_s"], r["stop_cpu_s"] = svc.stop()
            r["stop_checkpoint_written"] = any(x.get("msg") == "checkpoint written" for x in svc.log[-5:])
        with Serve(state, n, checkpoint_every=60) as svc:
            r["restart_s"] = time.perf_counter() - svc.started_at
            r["restart_cpu_s"] = svc.cpu()
            r["restart_subscriptions"] = svc.request("GET", "/health")["subscriptions"]  # type: ignore[index]
            svc.stop()
    if args.runs:
        r["checkpoint"] = checkpoint_stall(args.runs)
    print(f"commit {commit()}  {n:,} subscriptions, {args.rounds} rounds of {e:,} events")
    print(f"CPU per event       serve {r['serve_cpu_per_event_us']:.1f} µs, yfpp run {r['run_cpu_per_event_us']:.1f} µs "
          f"(medians of the rounds); × {r['ratio']:.2f} (the median round's; rounds "
          f"{', '.join(f'{x:.2f}' for x in r['ratio_rounds'])}); serve took {r['serve_events_per_s']:,.0f} events/s")
    print(f"registration        {n:,} in requests of {BATCH:,}: {r['batch_register_cpu_s']:.1f} s service CPU "
          f"(yfpp run registers them in {r['run_register_cpu_s']:.1f} s); one at a time: "
          f"{r['single_register_cpu_ms']:.2f} ms CPU, {r['single_register_wall_ms']:.1f} ms wall (HTTP read by {r['http']}; "
          f"rounds {', '.join(f'{x:.2f}' for x in r['single_register_cpu_ms_rounds'])} ms)")
    print(f"checkpoints         engine thread {', '.join(f'{x:.3f}' for x in r['periodic_checkpoint_engine_thread_s'])} s")
    if r.get("idle_cpu_s_per_checkpoint") is not None:
        print(f"idle                {r['idle_cpu_s_per_checkpoint']:.3f} s of service CPU per periodic checkpoint")
    print(f"stop (SIGTERM)      {r['stop_s']:.1f} s ({r['stop_cpu_s']:.1f} s CPU), final checkpoint written: "
          f"{r['stop_checkpoint_written']}")
    print(f"restart             /health 200 after {r['restart_s']:.1f} s ({r['restart_cpu_s']:.1f} s CPU), "
          f"{r['restart_subscriptions']:,} subscriptions")
    if args.runs:
        c = r["checkpoint"]
        print(f"checkpoint of {c['live_runs']:,} runs: engine thread {c['engine_thread_cpu_s']:.3f} s CPU "
              f"({c['engine_thread_s']:.3f} s wall), written after {c['written_cpu_s']:.1f} s CPU "
              f"({c['written_s']:.1f} s wall, {c['bytes'] / 1e6:.0f} MB)")
    print(json.dumps(r))
    if args.record:
        with open(args.record, "a") as f:
            f.write(json.dumps({"commit": commit(), **r}) + "\n")


def plot(records: list[dict], path: str) -> None:
    """CPU per event of serve and yfpp run against subscriptions (the last record of each count)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    last = {r["subs"]: r for r in records}
    subs = sorted(last)
    fig, ax = plt.subplots(figsize=(6, 3.5))
    xs = range(len(subs))
    ax.bar([x - 0.2 for x in xs], [last[n]["serve_cpu_per_event_us"] for n in subs], 0.4, label="yfpp serve")
    ax.bar([x + 0.2 for x in xs], [last[n]["run_cpu_per_event_us"] for n in subs], 0.4, label="yfpp run")
    for x, n in zip(xs, subs):
        ax.annotate(f"× {last[n]['ratio']:.2f}", (x, last[n]["serve_cpu_per_event_us"]), ha="center", va="bottom")
    ax.set_xticks(list(xs), [f"{n:,}" for n in subs])
    ax.set_xlabel("subscriptions")
    ax.set_ylabel("CPU µs per event")
    ax.set_title("yfpp serve against yfpp run, same events and queries")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
