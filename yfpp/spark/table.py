"""``yfpp spark --table NAME --mode append``: a table appended to on every run.

Spark's default catalog lives in the session's memory: a table that one run
saved is gone from the next run's catalog while its folder stays in the
warehouse, and saving the table again fails (``LOCATION_ALREADY_EXISTS``).
Appending then first registers that folder as the table (its schema and
partition columns read from its files; an external table to Spark: it keeps
its files when dropped), and appends to it. A catalog that keeps its tables
(Hive's metastore) knows the table and is left to append by itself.
"""

from __future__ import annotations

from typing import Any


def adopt_folder(spark: Any, name: str) -> bool:
    """Register table ``name`` over its managed folder in the warehouse when the catalog does not know
    the table but that folder exists (a table saved by an earlier session); whether it did."""
    if spark.catalog.tableExists(name):
        return False
    folder = managed_folder(spark, name)
    path = spark.sparkContext._jvm.org.apache.hadoop.fs.Path(folder)
    if not path.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration()).exists(path):
        return False
    spark.catalog.createTable(name, path=folder)
    return True


def managed_folder(spark: Any, name: str) -> str:
    """Where Spark keeps managed table ``name`` (``db.table`` or ``table``, backquotes allowed): its
    database's folder and the table's name in lower case, as Spark's session catalog names it."""
    db, _, table = name.replace("`", "").rpartition(".")
    location = spark.catalog.getDatabase(db or spark.catalog.currentDatabase()).locationUri
    return location.rstrip("/") + "/" + table.lower()
