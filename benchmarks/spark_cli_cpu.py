"""Wall and CPU seconds of one ``yfpp spark`` run: the session start, then the job.

A local session is made first (its wall and process-tree CPU are the start
cost), then ``yfpp.cli.main(["spark", …])`` runs in this process on it, and
the CPU of the process tree (driver, JVM, Python workers) is read before the
session stops. Run it with ``PYTHONPATH`` at the checkout to measure:

    PYTHONPATH=. python benchmarks/spark_cli_cpu.py --master 'local[2]' -- -q queries/shoplifting.sase -i FEED -o OUT --stats
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from spark_benchmark import tree_cpu_seconds  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--session-conf", action="append", default=[], metavar="KEY=VALUE",
                    help="a setting for the session made first (e.g. spark.driver.extraJavaOptions); repeatable")
    ap.add_argument("spark_args", nargs=argparse.REMAINDER, help="arguments of 'yfpp spark' (after --)")
    args = ap.parse_args()
    started = time.perf_counter()
    from pyspark.sql import SparkSession

    builder = (SparkSession.builder.master(args.master).config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false").config("spark.driver.memory", "2g"))
    for kv in args.session_conf:
        builder = builder.config(*kv.split("=", 1))
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    session_s, session_cpu = time.perf_counter() - started, tree_cpu_seconds()
    from yfpp.cli import main as yfpp

    rc = yfpp(["spark", *[a for a in args.spark_args if a != "--"]])
    job_s, cpu = time.perf_counter() - started - session_s, tree_cpu_seconds()
    print(f"rc {rc}  session {session_s:.1f} s, {session_cpu:.1f} CPU s  job {job_s:.1f} s, "
          f"{cpu - session_cpu:.1f} CPU s  process {cpu:.1f} CPU s", file=sys.stderr)
    spark.stop()
    return rc


if __name__ == "__main__":
    sys.exit(main())
