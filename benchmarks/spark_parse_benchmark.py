"""CPU seconds of the Spark parse function (``yfpp.spark.parse.parse_batches``) alone, without Spark.

The rows are made as Spark hands them to the ``mapInArrow`` function: a JSON-lines
feed as ``text`` rows (one line each, ending with ``\\n`` as the JVM appends it,
10,000 per Arrow batch, Spark's ``maxRecordsPerBatch``) and as one
``binaryFile`` row (the whole file); the equivalence key ``tag_id`` is hashed
as for the shoplifting query. Best of three; ``yfpp.input.readers`` alone on the same
file for comparison.

    PYTHONPATH=. python benchmarks/spark_parse_benchmark.py /tmp/yfpp_spark_bench/feed_n100000_z1000_s0.jsonl
"""

from __future__ import annotations

import argparse
import time
from typing import Callable

import pyarrow as pa

from yfpp.input.dead_letters import DeadLetters
from yfpp.input.readers import read_event_batches
from yfpp.spark.parse import parse_batches


def best(run: Callable[[], int]) -> tuple[int, float]:
    times, n = [], 0
    for _ in range(3):
        t = time.process_time()
        n = run()
        times.append(time.process_time() - t)
    return n, min(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("feed", help="a JSON-lines file")
    args = ap.parse_args()
    data = open(args.feed, "rb").read()
    lines = [ln + b"\n" for ln in data.split(b"\n")[:-1]]
    path = f"file:{args.feed}"
    text = [pa.record_batch({"path": [path] * len(c), "block": [0] * len(c), "content": pa.array(c, pa.binary()),
                             "whole": [False] * len(c)}) for c in (lines[i:i + 10000] for i in range(0, len(lines), 10000))]
    whole = [pa.record_batch({"path": [path], "block": [0], "content": pa.array([data], pa.binary()), "whole": [True]})]
    parse = parse_batches({"keys": [["tag_id"]], "xml": False})
    for name, batches in (("text rows (a split's lines)", text), ("binaryFile row (whole file)", whole)):
        n, cpu = best(lambda: sum(b.num_rows for b in parse(iter(batches))))
        print(f"parse_batches, {name:<28} {n:>10,} rows  {cpu:.3f} CPU s")
    n, cpu = best(lambda: sum(len(b) for b in read_event_batches(args.feed, dead_letters=DeadLetters())))
    print(f"yfpp.input.readers alone{'':<29} {n:>10,} events {cpu:.3f} CPU s")


if __name__ == "__main__":
    main()
