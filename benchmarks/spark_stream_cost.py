"""Streaming against batch CPU per event on Spark: many keys, 1,000 subscriptions (issue 39, item 5).

The feed is ``generate_rfid(N, zones=Q, doors=Q)`` (about one key, ``tag_id``, per 4 events; correlated, :func:`feed`) and the
queries are Q subscriptions ``[tag_id]&&//shelf[@zone='Zk']//exit[@door='Dk']&&(1 hour)`` — one keyed group.

``--part state`` (no Spark): the streaming state function (:func:`yfpp.spark.plan.advance_key`)
driven as Spark drives it over M micro-batches — per batch, each state key that got events, then
each whose timeout the watermark passed, the watermark one batch behind — with the state keys

* ``per key, replay``: one per key value, each call a fresh engine replaying the key's kept events (the
  queries compiled per key and batch: the design before buckets);
* ``buckets B, replay``: the key hash modulo B, each call a fresh engine (a worker that lost its engines);
* ``buckets B, live``: as ``yfpp.spark.stream`` runs them, the worker's engine of the bucket continued
  (:class:`yfpp.spark.plan.LiveEngines`: compiled once, no replay);

against ``batch task``: the batch job's matching work on the same events, B tasks each one engine
over its share (the key hash modulo B) in one pass. Process CPU seconds (``time.process_time``).

``--part spark``: whole jobs on ``local[2]`` in one session, the Python workers' CPU (``/proc``, the
process tree): the batch job (``read_events_df`` + ``match``, one JSON-lines file) against the stream
(``start_stream`` over the same events in M files, ``max_files=1``: M micro-batches, ``finish``).
Both include reading and parsing. Matches compared.

    PYTHONPATH=. python benchmarks/spark_stream_cost.py --part state --events 2000 --subscriptions 1000
    PYTHONPATH=. python benchmarks/spark_stream_cost.py --part state --events 500 --per-key
    PYTHONPATH=. python benchmarks/spark_stream_cost.py --part spark --events 2000
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any, Callable

from yfpp.input.events import Event
from yfpp.input.generate import generate_rfid, write_events
from yfpp.spark.parse import key_hash
from yfpp.spark.plan import Group, LiveEngines, advance_key, effective_queries, group_queries, make_event


def subscriptions(q: int) -> dict[str, str]:
    return {f"s{k}": f"[tag_id]&&//shelf[@zone='Z{k}']//exit[@door='D{k}']&&(1 hour)" for k in range(1, q + 1)}


def feed(n: int, q: int, seed: int) -> list[dict]:
    """``generate_rfid``'s feed, correlated as ``subscriptions_benchmark.py``'s: an exit's door is the number of
    its tag's first shelf zone, so every tag that leaves matches a subscription."""
    records, first = list(generate_rfid(n, zones=q, doors=q, seed=seed)), {}
    for r in records:
        if r["type"] == "shelf":
            first.setdefault(r["tag_id"], r["zone"][1:])
        elif r["type"] == "exit" and r["tag_id"] in first:
            r["door"] = "D" + first[r["tag_id"]]
    return records


class _State:
    """The part of pyspark's GroupState the state function uses."""

    def __init__(self) -> None:
        self.value: tuple | None = None
        self.timeout: int | None = None

    exists = property(lambda self: self.value is not None)
    get = property(lambda self: self.value)

    def update(self, value: tuple) -> None:
        self.value = value

    def remove(self) -> None:
        self.value = self.timeout = None

    def setTimeoutTimestamp(self, ms: int) -> None:
        self.timeout = ms


def _row(ev: Event) -> tuple:
    return ev.ts, ev.seq, ev.type, json.dumps(ev.attrs), None


def stream_state(grp: Group, events: list[Event], batches: int, state_key: Callable[[Event], Any],
                 live: LiveEngines | None) -> tuple[Counter, int]:
    """Matches and state-function calls of the stream over ``batches`` equal micro-batches."""
    size = math.ceil(len(events) / batches)
    chunks = [events[i:i + size] for i in range(0, len(events), size)] + [[]]
    states: dict[Any, _State] = defaultdict(_State)
    out: Counter = Counter()
    wm_ms, calls = 0, 0
    for chunk in chunks:
        rows: dict[Any, list[tuple]] = defaultdict(list)
        for ev in chunk:
            rows[state_key(ev)].append(_row(ev))
        for k, r in rows.items():
            out.update(m["id"] for m in advance_key(grp, states[k], r, wm_ms, live=live))
            calls += 1
        for k, st in list(states.items()):
            if k not in rows and st.timeout is not None and st.timeout < wm_ms:
                out.update(m["id"] for m in advance_key(grp, st, [], wm_ms, live=live))
                calls += 1
        if chunk:
            wm_ms = max(wm_ms, math.floor(max(ev.ts for ev in chunk) * 1000) - 1)
    return out, calls


def batch_tasks(grp: Group, events: list[Event], tasks: int) -> Counter:
    """The batch job's matching work: ``tasks`` engines, each over its keys' events (rows decoded as a task does)."""
    share: dict[int, list[tuple]] = defaultdict(list)
    for ev in events:
        share[key_hash(ev, grp.key) % tasks].append(_row(ev))
    out: Counter = Counter()
    for rows in share.values():
        engine = grp.engine()
        for ts, seq, t, a, x in rows:
            out.update(m["id"] for m in engine.process(make_event(t, ts, seq, a, x)))
        out.update(m["id"] for m in engine.flush())
    return out


def timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    t = time.process_time()
    result = fn()
    return result, time.process_time() - t


def part_state(args: argparse.Namespace) -> None:
    (grp,) = group_queries(effective_queries(subscriptions(args.subscriptions)), streaming=True)
    events = [Event.from_dict(r, seq=i) for i, r in enumerate(feed(args.events, args.subscriptions, args.seed))]
    events.append(Event("heartbeat", events[-1].ts + 10**6, {"tag_id": -1}, len(events)))  # lets the last windows close
    n = len(events)
    keys = len({ev.attrs.get("tag_id") for ev in events})
    print(f"{n:,} events, {keys:,} keys, {args.subscriptions:,} subscriptions, {args.batches} micro-batches")
    want, batch_s = timed(lambda: batch_tasks(grp, events, args.buckets))
    print(f"  {'batch task (' + str(args.buckets) + ' tasks)':<30} {batch_s:8.2f} CPU s {batch_s / n * 1e6:10.1f} us/event")
    bucket = lambda ev: key_hash(ev, grp.key) % args.buckets  # noqa: E731
    designs: list[tuple[str, Callable[[Event], Any], LiveEngines | None]] = [
        (f"stream, buckets {args.buckets}, replay", bucket, None),
        (f"stream, buckets {args.buckets}, live", bucket, LiveEngines())]
    if args.per_key:
        designs.insert(0, ("stream, per key, replay", lambda ev: ev.attrs.get("tag_id"), None))
    for name, state_key, live in designs:
        (got, calls), s = timed(lambda: stream_state(grp, events, args.batches, state_key, live))
        print(f"  {name:<30} {s:8.2f} CPU s {s / n * 1e6:10.1f} us/event  {s / batch_s:6.2f}x batch  "
              f"{calls:,} calls  {'same matches' if got == want else 'MATCHES DIFFER'} ({sum(got.values())})")


def part_spark(args: argparse.Namespace) -> None:
    from pyspark.sql import SparkSession

    from yfpp.spark import match, read_events_df
    from yfpp.spark.costs import tree_cpu_by_kind
    from yfpp.spark.stream import finish, start_stream

    records = feed(args.events, args.subscriptions, args.seed)
    records.append({"type": "heartbeat", "ts": records[-1]["ts"] + 10**6, "tag_id": -1})
    queries = subscriptions(args.subscriptions)
    tmp = Path(tempfile.mkdtemp(prefix="yfpp_stream_cost_"))
    try:
        write_events(records, tmp / "all.jsonl")
        inbox = tmp / "inbox"
        inbox.mkdir()
        size = math.ceil(len(records) / args.batches)
        for i in range(0, len(records), size):
            f = inbox / f"part-{i // size:04d}.jsonl"
            write_events(records[i:i + size], f)
            os.utime(f, (1e9 + i, 1e9 + i))  # modification times in name order: the stream's file order
        spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
                 .config("spark.ui.showConsoleProgress", "false").config("spark.sql.shuffle.partitions", "4")
                 .getOrCreate())
        spark.range(1).count()  # the session's first job (class loading) charged to neither
        n = len(records)

        def python_cpu(fn: Callable[[], Any]) -> tuple[Any, float, float]:
            before, wall = tree_cpu_by_kind(), time.perf_counter()
            result = fn()
            after = tree_cpu_by_kind()
            return result, after["Python workers"] - before["Python workers"], time.perf_counter() - wall

        def batch() -> Counter:
            events = read_events_df(spark, str(tmp / "all.jsonl"))
            found = Counter(r.json for r in match(spark, queries, events).select("json").collect())
            events.unpersist()
            return found

        def stream() -> Counter:
            finish(start_stream(spark, queries, str(tmp / "out"), str(tmp / "ck"), path=str(inbox), max_files=1,
                                log=open(os.devnull, "w")))
            return Counter(r.value for r in spark.read.text(str(tmp / "out" / "matches.jsonl")).collect())

        print(f"{n:,} events, {args.subscriptions:,} subscriptions, local[2], {args.batches} micro-batches")
        want, b_cpu, b_wall = python_cpu(batch)
        print(f"  batch job   Python workers {b_cpu:8.2f} CPU s {b_cpu / n * 1e6:10.1f} us/event  wall {b_wall:6.1f} s")
        got, s_cpu, s_wall = python_cpu(stream)
        print(f"  stream      Python workers {s_cpu:8.2f} CPU s {s_cpu / n * 1e6:10.1f} us/event  wall {s_wall:6.1f} s  "
              f"{s_cpu / b_cpu:5.2f}x batch  {'same matches' if got == want else 'MATCHES DIFFER'} ({sum(got.values())})")
        spark.stop()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--part", choices=["state", "spark"], default="state")
    ap.add_argument("--events", type=int, default=2000)
    ap.add_argument("--subscriptions", type=int, default=1000)
    ap.add_argument("--batches", type=int, default=4, help="micro-batches (files, for --part spark)")
    ap.add_argument("--buckets", type=int, default=4, help="state keys per group (the stream's: 2 x cores)")
    ap.add_argument("--per-key", action="store_true", help="also the state key per key value (slow: an engine per key)")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    (part_state if args.part == "state" else part_spark)(args)


if __name__ == "__main__":
    main()
