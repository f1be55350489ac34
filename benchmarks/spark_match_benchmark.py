"""CPU per event of the shuffle plan's matching function (``yfpp.spark.batch._runner``) alone, without Spark.

The rows are made as the shuffle hands them to the ``mapInArrow`` function: the
routed events ``(g, s, seq, type, ts, attrs, xml)`` of one task, sorted by
group, slice, ts and seq, ``attrs`` a JSON object as the readers write it,
10,000 rows per Arrow batch (Spark's ``maxRecordsPerBatch``); the query is the
shoplifting query keyed by ``tag_id`` (one group, one slice: one engine for the
task, as in Spark). Also the event decoding alone (``make_event`` over the
batches' columns). Best of three, process CPU seconds.

    PYTHONPATH=. python benchmarks/spark_match_benchmark.py --events 200000
"""

from __future__ import annotations

import argparse
import time
from typing import Callable

import pyarrow as pa

from yfpp.input.generate import generate_rfid
from yfpp.spark import batch
from yfpp.spark.parse import _json
from yfpp.spark.plan import effective_queries, group_queries, make_event

QUERY = "PATTERN SEQ(shelf a, ~register b, exit c) WHERE [tag_id] WITHIN 1 hour"
SCHEMA = pa.schema([("g", pa.int32()), ("s", pa.int64()), ("seq", pa.int64()), ("type", pa.string()),
                    ("ts", pa.float64()), ("attrs", pa.string()), ("xml", pa.string())])


def routed_batches(n: int) -> list[pa.RecordBatch]:
    """``n`` events as one task's sorted rows, in Arrow batches of 10,000."""
    rows = []
    for seq, r in enumerate(generate_rfid(n, tags=max(n // 100, 1), gap=3, seed=11)):
        attrs = {k: v for k, v in r.items() if k not in ("type", "ts")}
        text = _json(attrs)
        rows.append((0, 0, seq, r["type"], float(r["ts"]), text.decode() if isinstance(text, bytes) else text, None))
    return [pa.RecordBatch.from_pylist([dict(zip(SCHEMA.names, row)) for row in rows[i:i + 10_000]], schema=SCHEMA)
            for i in range(0, len(rows), 10_000)]


def best(run: Callable[[], object]) -> float:
    times = []
    for _ in range(3):
        t = time.process_time()
        run()
        times.append(time.process_time() - t)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--events", type=int, default=200_000)
    args = ap.parse_args()
    batches = routed_batches(args.events)
    groups = group_queries(effective_queries([("q", QUERY)]))
    runner = batch._runner(groups, {})

    def matching() -> int:
        return sum(rb.num_rows for rb in runner(iter(batches)))

    def decoding() -> int:
        n = 0
        for rb in batches:
            c = rb.to_pydict()
            for seq, type_, ts, attrs, xml in zip(c["seq"], c["type"], c["ts"], c["attrs"], c["xml"]):
                make_event(type_, ts, seq, attrs, xml)
                n += 1
        return n

    n = args.events
    match_s, decode_s = best(matching), best(decoding)
    print(f"events                     {n:,}")
    print(f"matching task, CPU us/event {match_s / n * 1e6:8.3f}")
    print(f"decoding alone, CPU us/event {decode_s / n * 1e6:7.3f}")


if __name__ == "__main__":
    main()
