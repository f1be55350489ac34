"""Shoplifting on Apache Flink's MATCH_RECOGNIZE: N queries in one job (run with PyFlink's Python).

Each query i is yfpp's shoplifting query with window W_i = 12 h − i min::

    PATTERN SEQ(shelf a, ~register b, exit c)
    WHERE skip_till_next_match(a, b, c) { [tag_id] } WITHIN W_i

written for Flink as ``PATTERN (A N* C)`` partitioned by ``tag_id``, where ``N`` is any event but a
register or an exit (so C is the first exit after A and no register lies between), ``AFTER MATCH
SKIP TO NEXT ROW`` (every shelf starts a run, SASE+'s all-matches semantics), ordered by event time
then input position ``n``, with a watermark 1 s behind the latest timestamp (timestamps are whole
seconds and non-decreasing; a watermark equal to the latest ts would make every later event of the
same second late, and Flink drops late rows silently), and ``WITHIN W_i + 1 s``: Flink's window is strict, yfpp's inclusive, and
timestamps are whole seconds.  Matches go to CSV files ``query,a,c`` (``n`` of the shelf and exit
events) under ``--out``.

    /path/to/flink-venv/bin/python benchmarks/peers/flink_job.py --input feed.jsonl --queries 10 --out out/
"""

from __future__ import annotations

import argparse
import json
import os
import resource

from pyflink.table import EnvironmentSettings, TableEnvironment

from shoplifting_queries import window


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--input", required=True)
    ap.add_argument("--queries", type=int, default=1)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    env = TableEnvironment.create(EnvironmentSettings.in_streaming_mode())
    conf = env.get_config()
    conf.set("parallelism.default", "1")
    conf.set("pipeline.name", f"shoplifting x{args.queries}")
    env.execute_sql(f"""
        CREATE TABLE events (
            n BIGINT, `type` STRING, ts BIGINT, tag_id BIGINT, zone STRING, `register` BIGINT, door STRING,
            rt AS TO_TIMESTAMP_LTZ(ts * 1000, 3),
            WATERMARK FOR rt AS rt - INTERVAL '1' SECOND
        ) WITH ('connector' = 'filesystem', 'path' = '{args.input}', 'format' = 'json')""")
    env.execute_sql(f"""
        CREATE TABLE found (q STRING, a BIGINT, c BIGINT)
        WITH ('connector' = 'filesystem', 'path' = '{args.out}', 'format' = 'csv')""")
    stmts = env.create_statement_set()
    for i in range(args.queries):
        stmts.add_insert_sql(f"""
            INSERT INTO found
            SELECT 'q{i}', a, c FROM events MATCH_RECOGNIZE (
                PARTITION BY tag_id ORDER BY rt, n
                MEASURES A.n AS a, C.n AS c
                ONE ROW PER MATCH
                AFTER MATCH SKIP TO NEXT ROW
                PATTERN (A N* C) WITHIN INTERVAL '{window(i) + 1}' SECOND(6)
                DEFINE A AS A.`type` = 'shelf',
                       N AS N.`type` <> 'register' AND N.`type` <> 'exit',
                       C AS C.`type` = 'exit'
            )""")
    stmts.execute().wait()
    print(json.dumps({"cpu_seconds": own_cpu() + descendants_cpu(os.getpid())}))


def own_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def descendants_cpu(pid: int) -> float:
    """CPU seconds of the live processes below ``pid`` (the JVM PyFlink started, still running now:
    it is not waited for when Python exits, so the parent's RUSAGE_CHILDREN never sees it)."""
    tick = os.sysconf("SC_CLK_TCK")
    children: dict[int, list[int]] = {}
    cpu: dict[int, float] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(entry))
        cpu[int(entry)] = (int(fields[11]) + int(fields[12])) / tick
    total, todo = 0.0, list(children.get(pid, []))
    while todo:
        p = todo.pop()
        total += cpu.get(p, 0.0)
        todo.extend(children.get(p, []))
    return total


if __name__ == "__main__":
    main()
