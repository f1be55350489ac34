"""Batch reading: an input path as an event DataFrame with global seq numbers and late-event reports.

Spark reads the files on the executors (plain JSON lines split at line
boundaries, everything else one task per file, see :mod:`yfpp.spark.parse`);
each split's summary row, collected in the job that parses and persists the
input, gives its record count and largest ts, from which the driver computes
every split's first seq number and the largest ts before it; a broadcast join
applies them.
"""

from __future__ import annotations

import json
import os
from contextlib import nullcontext
from functools import reduce
from typing import Any, Callable, ContextManager, NamedTuple, Sequence
from urllib.parse import unquote

from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from yfpp.engine import event_raw, late_reason
from yfpp.errors import InputError
from yfpp.spark import inputs
from yfpp.spark.parse import PARSED_SCHEMA, parse_batches

#: The splits' offsets (:func:`split_offsets`, by split id), given to the executors as one JSON literal (no Python job).
_OFFSETS_SCHEMA = "array<struct<split long, seq_base long, line_base long, before double, prefix string>>"


class Parsed(NamedTuple):
    """An input parsed on the executors: ``df`` (persisted; :data:`PARSED_SCHEMA` rows), the splits'
    summaries and first seq numbers, and whether a late event is possible."""

    df: DataFrame
    stats: list[Any]
    offsets: list[tuple]
    late: bool

    @property
    def records(self) -> int:
        """Records (events and malformed ones) in the input."""
        return sum(s["n"] for s in self.stats)

    @property
    def malformed(self) -> int:
        """Malformed records in the input (dead letters other than late events)."""
        return sum(s["dead"] for s in self.stats)

    def time_range(self) -> tuple[float | None, float | None]:
        """The smallest and largest ts of the input's events (late ones included)."""
        lows = [s["prev_max"] for s in self.stats if s["prev_max"] is not None]
        highs = [s["ts"] for s in self.stats if s["ts"] is not None]
        return (min(lows) if lows else None, max(highs) if highs else None)


def read_events_df(spark: SparkSession, path: str | os.PathLike[str] | Sequence[str], format: str | None = None, *,
                   ts_field: str = "ts", ts_unit: str = "s", type_field: str | None = None,
                   step: Callable[[str], ContextManager[Any]] | None = None) -> DataFrame:
    """Every record of a file, a directory's files (recursively) or a glob's, in path order, as a
    persisted DataFrame (``unpersist()`` it when done).

    ``path``: any URI Spark reads, or a local path (relative: to the driver's
    working directory); or several, read as one stream in the order given
    (:func:`yfpp.spark.inputs.list_inputs`). Columns: ``seq`` (global: the record's index in its
    file plus the records of the files before it), ``type``, ``ts``, ``attrs``
    (a JSON object), ``xml`` (the event's element, XML input only), and for a
    dead letter ``reason``, ``position``, ``raw``. Malformed records and late
    events (ts below the largest earlier ts, as ``yfpp run`` with
    ``max_delay`` 0) are dead letters; :func:`yfpp.spark.match` skips them.
    Raises :class:`~yfpp.errors.InputError` for a missing or empty input.
    ``ts_field``, ``ts_unit`` (``iso``: ISO-8601 text), ``type_field``: as :func:`yfpp.input.readers.read_events`'s.
    ``step``: names the Spark jobs of each reading step (:meth:`yfpp.spark.costs.Steps.step`).
    """
    step = step or (lambda name: nullcontext())
    parsed = parse_input(spark, path, format, ts_field=ts_field, ts_unit=ts_unit, type_field=type_field, step=step)
    events = events_of(spark, parsed).drop("key_hashes").persist(StorageLevel.MEMORY_AND_DISK)
    with step("seq numbers, late events, cache"):
        events.count()
    parsed.df.unpersist()
    return events


def parse_input(spark: SparkSession, path: str | os.PathLike[str] | Sequence[str], format: str | None = None, *,
                ts_field: str = "ts", ts_unit: str = "s", type_field: str | None = None, xml: bool = True,
                keys: Sequence[Sequence[str]] = (), step: Callable[[str], ContextManager[Any]] | None = None) -> Parsed:
    """The input of :func:`read_events_df` read and parsed by the executors, kept (persisted), with
    the splits' summaries collected — one Spark job. ``xml``: keep XML events' elements (for XPath
    predicates); ``keys``: equivalence lists to hash per event (``key_hashes``, see :mod:`yfpp.spark.parse`)."""
    step = step or (lambda name: nullcontext())
    given = os.fspath(path) if isinstance(path, (str, os.PathLike)) else list(path)
    with step("list input"):
        files = inputs.list_inputs(spark, given)
    opts: dict[str, Any] = {"ts_field": ts_field, "ts_unit": ts_unit, "type_field": type_field, "xml": xml,
                            "keys": [list(k) for k in keys], **({"format": format} if format else {})}
    split = [f for f in files if inputs.splittable(f, format)]
    small = set(small_files(spark, split))
    split = [f for f in split if f not in small]
    whole = [f for f in files if f not in split]
    parts = []
    if whole:
        parts.append(spark.read.format("binaryFile").option("recursiveFileLookup", "true").load([inputs.hadoop_path(f) for f in whole]).select(
            F.col("_metadata.file_path").alias("path"), F.lit(0).cast("long").alias("block"), "content",
            F.lit(True).alias("whole")))
    if split:
        parts.append(spark.read.option("lineSep", "\n").option("recursiveFileLookup", "true").text([inputs.hadoop_path(f) for f in split]).select(
            F.col("_metadata.file_path").alias("path"), F.col("_metadata.file_block_start").alias("block"),
            F.concat("value", F.lit("\n")).cast("binary").alias("content"), F.lit(False).alias("whole")))
    parsed = reduce(DataFrame.union, parts).mapInArrow(parse_batches(opts), PARSED_SCHEMA) \
        .persist(StorageLevel.MEMORY_AND_DISK)
    with step("read + parse (readers), summaries"):
        stats = summaries(parsed)
    offsets = split_offsets(stats, inputs.single_file(given, files), uris=True, order=files)
    return Parsed(parsed, stats, offsets, any_late(stats, offsets))


def small_files(spark: SparkSession, files: list[str]) -> list[str]:
    """The ``files`` Spark's ``text`` source would read in one piece anyway — no larger than its split size
    (``spark.sql.files.maxPartitionBytes``, or the input's bytes per core — ``spark.sql.files.minPartitionNum``,
    by default the default parallelism — when smaller, at least ``spark.sql.files.openCostInBytes``) — to be
    read whole instead (``binaryFile``): a row per file, not a row per line, and no task is lost. Only for up
    to :data:`_SIZED_FILES` files (their sizes are asked one by one)."""
    if not files or len(files) > _SIZED_FILES:
        return []
    jvm, hadoop = spark.sparkContext._jvm, spark.sparkContext._jsc.hadoopConfiguration()
    sizes = {}
    for f in files:
        p = jvm.org.apache.hadoop.fs.Path(unquote(f))  # Path encodes again what listing encoded
        sizes[f] = p.getFileSystem(hadoop).getFileStatus(p).getLen()
    conf = spark.conf
    max_bytes = _bytes(conf.get("spark.sql.files.maxPartitionBytes"))
    open_cost = _bytes(conf.get("spark.sql.files.openCostInBytes"))
    cores = int(conf.get("spark.sql.files.minPartitionNum", None) or conf.get("spark.sql.leafNodeDefaultParallelism", None)
                or spark.sparkContext.defaultParallelism)
    per_core = sum(sizes[f] + open_cost for f in files) // max(cores, 1)
    limit = min(max_bytes, max(open_cost, per_core))  # Spark's own split size (FilePartition.maxSplitBytes)
    return [f for f in files if sizes[f] <= limit]


_SIZED_FILES = 1000


def _bytes(text: str) -> int:
    """A Spark byte size (``134217728``, ``128m``, ``4MB``) in bytes."""
    t = text.strip().lower().removesuffix("b")
    scale = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}.get(t[-1:], 1)
    return int(float(t.rstrip("kmgt")) * scale)


def summaries(parsed: DataFrame) -> list[Any]:
    """The splits' summary rows of a :data:`PARSED_SCHEMA` DataFrame (a job): ``(path, block, n, line, ts,
    pos, prev_max, split, dead)``, the fields :func:`split_offsets`, :func:`any_late` and :class:`Parsed` read."""
    return parsed.where(F.col("n").isNotNull()).select("path", "block", "n", "line", "ts", "pos", "prev_max",
                                                      "split", "dead").collect()


def events_of(spark: SparkSession, parsed: Parsed) -> DataFrame:
    """The records of ``parsed`` with global seq numbers, late events as dead letters (columns as
    :func:`read_events_df`'s, and ``key_hashes``); not persisted: each use reads ``parsed.df``.

    The records carry their split's id (a hash, :func:`yfpp.spark.parse.split_id`), not its path:
    the splits' offsets are joined by that id. Raises :class:`~yfpp.errors.InputError` in the
    (2⁻⁶⁴-per-pair unlikely) case of two splits with one id."""
    ids = {(s["path"], s["block"]): s["split"] for s in parsed.stats}
    if len(set(ids.values())) != len(ids):
        raise InputError("two input splits have the same 64-bit id; rename a file or change "
                         "spark.sql.files.maxPartitionBytes")
    names = ("split", "seq_base", "line_base", "before", "prefix")
    text = json.dumps([dict(zip(names, (ids[(o[0], o[1])], *o[2:]))) for o in parsed.offsets])
    offsets = spark.range(1).select(F.inline(F.from_json(F.lit(text), _OFFSETS_SCHEMA)))
    r = parsed.df.where(F.col("n").isNull()).join(F.broadcast(offsets), "split")
    seq = F.col("seq_base") + F.col("pos")
    stream_time = F.greatest("prev_max", "before")
    late = F.col("reason").isNull() & (F.col("ts") < stream_time)
    line = F.concat(F.lit("line "), (F.col("line") + F.col("line_base")).cast("string"))
    position = F.when(F.col("position") == "", F.regexp_replace("prefix", " $", "")).otherwise(  # a whole file's
        F.concat("prefix", F.regexp_replace("position", r"^line \d+", line)))
    events = r.select(
        seq.alias("seq"), "type", "ts", "attrs", "xml", "reason",
        F.when(late, F.concat(F.lit("seq "), seq)).otherwise(position).alias("position"),
        "raw", "key_hashes", F.coalesce(late, F.lit(False)).alias("late"),  # null (no earlier ts) is not late
        stream_time.alias("stream_time"),
    )
    if not parsed.late:  # an ordered feed: no late event, no Python stage
        return events.drop("late", "stream_time")
    # the engine's reason and raw of a late event, made in Python so that numbers read as in yfpp run (Spark's
    # format_string would print a large ts in Java's form, 1.79533804E9); the UDFs run on the late rows only
    reason = F.udf(lambda ts, mark: late_reason(ts, mark, 0.0), "string")
    raw = F.udf(lambda t, ts, attrs: event_raw(t, ts, json.loads(attrs)), "string")
    return events.where(~F.col("late")).drop("late", "stream_time").unionByName(
        events.where(F.col("late")).withColumn("reason", reason("ts", "stream_time"))
        .withColumn("raw", raw("type", "ts", "attrs")).drop("late", "stream_time"))


def any_late(stats: list[Any], offsets: list[tuple]) -> bool:
    """May a split hold a late event? One below a larger ts before it in its split (counted by the
    reader, ``pos`` of its summary), or a smallest ts (``prev_max``) below the splits' before it."""
    before = {(o[0], o[1]): o[4] for o in offsets}
    return any(s["pos"] or (s["prev_max"] is not None and before[(s["path"], s["block"])] is not None
                            and s["prev_max"] < before[(s["path"], s["block"])]) for s in stats)


def split_offsets(stats: list[Any], single: bool, start: tuple[int, float | None] = (0, None),
                  root: str | None = None, uris: bool = False, order: Sequence[str] | None = None) -> list[tuple]:
    """``(path, block, seq_base, line_base, before, prefix)`` per split from the splits'
    ``(path, block, n, line, ts)`` summaries: the records and largest ts of the
    splits before it (path order; ``start``: those of the input before these splits),
    the lines before it in its file, and the prefix of its dead letters' positions
    (its path below folder ``root``, by default the files' common folder). ``uris``: the paths
    are Spark's percent-encoded URIs, ordered and shown decoded (``a b`` before ``a!``, as on disk).
    ``order``: the files in the order they are read (several inputs: :func:`yfpp.spark.inputs.list_inputs`),
    instead of path order."""
    name = unquote if uris else str
    rank = {inputs.same_file(f): i for i, f in enumerate(order or ())}
    place = {p: (rank.get(inputs.same_file(p), -1), name(p)) for p in {s[0] for s in stats}}  # once a file
    rows = sorted(((s[0], s[1], s[2], s[3], s[4]) for s in stats), key=lambda r: (*place[r[0]], r[1]))
    paths = sorted({name(r[0]) for r in rows})
    common = name(root).rstrip("/") + "/" if root else os.path.commonprefix(paths).rpartition("/")[0] + "/" if paths else ""
    out = []
    (seq, before), line_base, prev = start, 0, None
    for path, block, n, lines, ts in rows:
        if path != prev:
            line_base, prev = 0, path
        prefix = "" if single else name(path)[len(common):] + " "
        out.append((path, block, seq, line_base, before, prefix))
        seq += n
        line_base += lines
        if ts is not None and (before is None or ts > before):
            before = ts
    return out
