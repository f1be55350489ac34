"""What shipping yfpp to the executors costs at job start (docs/spark.md, 'Running on a cluster').

Prints the zip's build time (cold, then cached) and, on a ``local-cluster[1,1,1024]`` session, the
wall time of a first trivial Python job (the executor and its Python workers starting: any job pays
it), then of shipping and checking (the zip cached, added, the check's job), then of the check alone.

    PYTHONPATH=$PWD python benchmarks/spark_shipping.py
"""

from __future__ import annotations

import os
import tempfile
import time

from pyspark.sql import SparkSession

from yfpp.spark.shipping import check_workers, package_zip, ship_packages


def main() -> None:
    with tempfile.TemporaryDirectory() as cache:
        for what in ("cold", "cached", "cached"):
            t, cpu = time.perf_counter(), time.process_time()
            path = package_zip(cache)
            print(f"zip {what:<6} {time.perf_counter() - t:6.3f} s wall {time.process_time() - cpu:6.3f} CPU-s  "
                  f"({os.path.getsize(path):,} bytes)")
    spark = (SparkSession.builder.master("local-cluster[1,1,1024]").config("spark.executor.memory", "512m")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .config("spark.log.level", "OFF").getOrCreate())
    try:
        sc = spark.sparkContext
        t = time.perf_counter()
        sc.parallelize(range(sc.defaultParallelism), sc.defaultParallelism).map(lambda x: x).count()
        print(f"first Python job (start-up)  {time.perf_counter() - t:6.2f} s wall")
        t = time.perf_counter()
        ship_packages(spark)
        print(f"ship + check                 {time.perf_counter() - t:6.2f} s wall")
        for _ in range(3):
            t = time.perf_counter()
            check_workers(spark)
            print(f"check again (warm workers)   {time.perf_counter() - t:6.2f} s wall")
    finally:
        spark.stop()


if __name__ == "__main__":
    main()
