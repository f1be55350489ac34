"""``yfpp spark``: the ``run`` job on PySpark, batch or streaming (pyspark imported only when it runs)."""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

from yfpp.errors import YfppError
from yfpp.pattern import Pattern
from yfpp.query_text import load_patterns

EXAMPLES = """\
examples:
  yfpp spark -q queries/shoplifting.sase -i yfpp/data/sample_rfid.xml -o out/
  yfpp spark -q queries/shoplifting.xpe -i feeds/ --master 'local[4]' --partitions 8 -o out/
  yfpp spark --stream -q queries/shoplifting.sase -i incoming/ -o out/ --checkpoint ck/
  yfpp spark --stream -q "[tag_id]//shelf//exit(1 h)" --socket localhost:9999 -o out/

output (OUTDIR): matches.jsonl/ (SPEC §5 lines), matches.parquet/ (query, bindings map<string,
array<bigint>>, start, end, emit), dead_letters.jsonl/; streaming writes a batch=N folder per micro-batch.
"""


def add_parser(sub: Any) -> None:
    """Add the ``spark`` subcommand to the ``yfpp`` parser's subparsers."""
    p = sub.add_parser(
        "spark",
        help="match queries on PySpark (batch or streaming)",
        description="The 'run' job on PySpark: partitioned by the queries' equivalence keys, "
                    "time-sliced otherwise; the same matches as 'yfpp run'. Needs pip install 'yfpp[spark]'.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("-q", "--query", action="extend", nargs="+", required=True, metavar="QUERY_OR_FILE",
                   help="query text or a query file, as for 'yfpp run'; repeatable")
    p.add_argument("-i", "--input", help="an .xml / .jsonl file or a directory of them (files in name order)")
    p.add_argument("-o", "--output", required=True, metavar="OUTDIR", help="output directory")
    p.add_argument("--master", help="Spark master, e.g. local[4] or spark://host:7077 (default: spark-submit's, else local[*])")
    p.add_argument("--format", choices=["xml", "jsonl"], help="input format (default: from each file's extension or content)")
    p.add_argument("--policy", choices=["all", "non_overlapping"], help="output policy for every query")
    p.add_argument("--ts-field", default="ts", help="timestamp field name (default: ts)")
    p.add_argument("--ts-unit", default="s", help="timestamp unit: s, ms, us, ns, min, h (default: s)")
    p.add_argument("--partitions", type=int,
                   help="shuffle partitions (default: spark.sql.shuffle.partitions if configured, else 2 × the cores)")
    p.add_argument("--stream", action="store_true", help="watch the input directory (or --socket) for new data")
    p.add_argument("--socket", metavar="HOST:PORT", help="stream: read lines from a socket (a demo source, not replayable)")
    p.add_argument("--checkpoint", help="stream: checkpoint directory (default OUTDIR/_checkpoint)")
    p.add_argument("--max-files", type=int, help="stream: at most this many new files per micro-batch")
    p.add_argument("--trigger", type=float, metavar="SECONDS", help="stream: micro-batch interval (default: as soon as data arrives)")
    p.add_argument("--idle-stop", type=float, metavar="SECONDS",
                   help="stream: stop after this long with no micro-batch running or due (default: run until Ctrl-C)")
    p.set_defaults(func=cmd_spark)


def load(query_args: list[str]) -> list[tuple[str, Pattern]]:
    """``[(name, pattern)]`` of the ``-q`` arguments."""
    return [(source.name, pattern) for source, pattern in load_patterns(query_args)]


def cmd_spark(args: argparse.Namespace) -> int:
    queries = load(args.query)
    if not args.input and not (args.stream and args.socket):
        raise YfppError("give an input with -i (or --stream --socket HOST:PORT)")
    try:
        from pyspark.sql import SparkSession
    except ImportError as e:
        raise YfppError("yfpp spark needs PySpark: pip install 'yfpp[spark]'") from e
    owned = SparkSession.getActiveSession() is None
    builder = SparkSession.builder.appName("yfpp").config("spark.ui.showConsoleProgress", "false")  # counters on stderr
    if args.master:
        builder = builder.master(args.master)
    if args.partitions:
        builder = builder.config("spark.sql.shuffle.partitions", str(args.partitions))
    spark = builder.getOrCreate()
    if not args.partitions and not spark.sparkContext.getConf().contains("spark.sql.shuffle.partitions"):
        spark.conf.set("spark.sql.shuffle.partitions", str(2 * spark.sparkContext.defaultParallelism))
    try:
        return (stream if args.stream else batch)(spark, queries, args)
    finally:
        if owned:
            spark.stop()


def batch(spark: Any, queries: list[tuple[str, Pattern]], args: argparse.Namespace) -> int:
    from pyspark.sql import functions as F

    from yfpp.spark.batch import match, read_events_df

    started = time.perf_counter()
    events = read_events_df(spark, args.input, args.format, ts_field=args.ts_field, ts_unit=args.ts_unit)
    matches = match(spark, queries, events, policy=args.policy, partitions=args.partitions).persist()
    out = args.output
    matches.select("json").write.mode("overwrite").text(os.path.join(out, "matches.jsonl"))
    matches.drop("json").write.mode("overwrite").parquet(os.path.join(out, "matches.parquet"))
    dead = events.where(F.col("reason").isNotNull())
    dead.select(F.to_json(F.struct("seq", "position", "reason", "raw"), {"ignoreNullFields": "false"})) \
        .write.mode("overwrite").text(os.path.join(out, "dead_letters.jsonl"))
    counts = {r["query"]: r["count"] for r in matches.groupBy("query").count().collect()}
    n_dead = dead.count()
    n_events = events.count() - n_dead
    elapsed = time.perf_counter() - started
    lines = [f"events            {n_events:,}", f"elapsed           {elapsed:.3f} s",
             f"events/s          {n_events / max(elapsed, 1e-9):,.0f}", f"dead letters      {n_dead:,}",
             "matches per query:"]
    lines += [f"  {name:<24} {counts.get(name, 0):,}" for name in dict.fromkeys(n for n, _ in queries)]
    print("\n".join(lines), file=sys.stderr)
    matches.unpersist()
    events.unpersist()
    return 0


def stream(spark: Any, queries: list[tuple[str, Pattern]], args: argparse.Namespace) -> int:
    from yfpp.spark.stream import read_stream, stream_matches, write_stream

    events = read_stream(spark, None if args.socket else args.input, socket=args.socket, format=args.format,
                         ts_field=args.ts_field, ts_unit=args.ts_unit, max_files=args.max_files)
    query = write_stream(stream_matches(spark, queries, events, policy=args.policy), args.output,
                         args.checkpoint or os.path.join(args.output, "_checkpoint"),
                         interval=f"{args.trigger} seconds" if args.trigger else None)
    last_active = time.monotonic()
    try:
        while not query.awaitTermination(1):
            status = query.status
            if status["isTriggerActive"] or status["isDataAvailable"]:
                last_active = time.monotonic()
            elif args.idle_stop is not None and time.monotonic() - last_active > args.idle_stop:
                break
    except KeyboardInterrupt:
        pass
    finally:
        query.stop()
    return 0
