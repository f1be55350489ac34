"""CPU per event of the shuffle plan's Python side of matching (``yfpp.spark.batch._packer`` and ``_runner``), without Spark.

The rows are made as Spark hands them to the packing ``mapInArrow`` function:
the numbered events ``(seq, type, ts, attrs, xml, h0)`` of one task, ``attrs`` a
JSON object as the readers write it, ``h0`` the key's hash, 10,000 rows per
Arrow batch (Spark's ``maxRecordsPerBatch``); the packer's blobs (one Arrow IPC
blob per batch, group, slice and task) then go to the matching function as
the shuffle hands them, sorted by group and slice. The query is the
shoplifting query keyed by ``tag_id`` (one group, one slice: one engine for the
task, as in Spark). Printed: packing, matching (unpacking, sorting, the
engine), and the event decoding alone (``make_event`` over the batches'
columns). Best of three, process CPU seconds.

    PYTHONPATH=. python benchmarks/spark_match_benchmark.py --events 200000
"""

from __future__ import annotations

import argparse
import time
from typing import Callable

import pyarrow as pa

from yfpp.input.generate import generate_rfid
from yfpp.spark import batch
from yfpp.input.events import MISSING
from yfpp.spark.parse import _json, key_hash
from yfpp.spark.plan import effective_queries, group_queries, make_event

QUERY = "PATTERN SEQ(shelf a, ~register b, exit c) WHERE [tag_id] WITHIN 1 hour"
SCHEMA = pa.schema([("seq", pa.int64()), ("type", pa.string()), ("ts", pa.float64()), ("attrs", pa.string()),
                    ("xml", pa.string()), ("h0", pa.int64())])


def routed_batches(n: int) -> list[pa.RecordBatch]:
    """``n`` events as one task's rows, in Arrow batches of 10,000."""
    rows = []
    for seq, r in enumerate(generate_rfid(n, tags=max(n // 100, 1), gap=3, seed=11)):
        attrs = {k: v for k, v in r.items() if k not in ("type", "ts")}
        text = _json(attrs)
        rows.append((seq, r["type"], float(r["ts"]), text.decode() if isinstance(text, bytes) else text, None,
                     key_hash(_Row(attrs), ("tag_id",))))
    return [pa.RecordBatch.from_pylist([dict(zip(SCHEMA.names, row)) for row in rows[i:i + 10_000]], schema=SCHEMA)
            for i in range(0, len(rows), 10_000)]


class _Row:
    """Just what :func:`yfpp.spark.parse.key_hash` reads of an event."""

    def __init__(self, attrs: dict):
        self.attrs = attrs

    def get(self, name: str) -> object:
        return self.attrs.get(name, MISSING)


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
    packer, runner = batch._packer(groups, {}, 1), batch._runner(groups, {})
    packed = list(packer(iter(batches)))

    def packing() -> int:
        return sum(rb.num_rows for rb in packer(iter(batches)))

    def matching() -> int:
        return sum(rb.num_rows for rb in runner(iter(packed)))

    def decoding() -> int:
        n = 0
        for rb in batches:
            c = rb.to_pydict()
            for seq, type_, ts, attrs, xml in zip(c["seq"], c["type"], c["ts"], c["attrs"], c["xml"]):
                make_event(type_, ts, seq, attrs, xml)
                n += 1
        return n

    n = args.events
    pack_s, match_s, decode_s = best(packing), best(matching), best(decoding)
    print(f"events                     {n:,}")
    print(f"packing, CPU us/event       {pack_s / n * 1e6:8.3f}")
    print(f"matching task, CPU us/event {match_s / n * 1e6:8.3f}")
    print(f"decoding alone, CPU us/event {decode_s / n * 1e6:7.3f}")


if __name__ == "__main__":
    main()
