"""``yfpp spark``: the ``run`` job on PySpark, batch or streaming (pyspark imported only when it runs)."""

from __future__ import annotations

import argparse
import json
import logging
import os
import posixpath
import re
import signal
import sys
import threading
import time
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

from yfpp import examples
from yfpp.errors import QueryError, YfppError
from yfpp.runtime.feedback import MAX_DEPTH, MAX_DERIVED
from yfpp.spark.errors import Jvm, error_text, jvm_gone, known_cause, root_cause
from yfpp.spark.inputs import PLANS, check_live_url, is_live, local_path, qualify, socket_address
from yfpp.spark.starting import StartingSession
from yfpp.language.pattern import Pattern
from yfpp.language.query_text import load_patterns
from yfpp.input.record_fields import check_ts_unit, reading_unit, window_unit

if TYPE_CHECKING:
    from yfpp.spark.plan import EffectiveQueries

EXAMPLES = """\
examples:
  yfpp spark -q queries/shoplifting.sase -i yfpp/data/sample_rfid.xml -o out/
  yfpp spark -q queries/shoplifting.xpe -i feeds/ --master 'local[4]' --partitions 8 -o out/
  yfpp spark -q queries/shoplifting.sase -i hdfs://nn:8020/feeds/ --master yarn -o hdfs://nn:8020/out/
  yfpp spark --stream -q queries/shoplifting.sase -i incoming/ -o out/ --checkpoint ck/
  yfpp spark --stream -q "[tag_id]//shelf//exit(1 h)" --socket localhost:9999 -o out/
  yfpp spark --stream -q queries/shoplifting.sase -i 'mqtt://broker:1883/rfid/#?qos=1&client_id=yfpp&clean=0' -o out/

output (OUTDIR): matches.jsonl/ (the lines yfpp run prints), matches.parquet/ (query, bindings map<string,
array<bigint>>, start, end, emit), dead_letters.jsonl/; streaming writes a batch=N folder per micro-batch.
"""


def add_parser(sub: Any) -> None:
    """Add the ``spark`` subcommand to the ``yfpp`` parser's subparsers."""
    p = sub.add_parser(
        "spark",
        help="match queries on PySpark (batch or streaming)",
        description="The 'run' job on PySpark: partitioned by the queries' equivalence keys, "
                    "time-sliced otherwise; the same matches as 'yfpp run'. Needs pip install -e '.[spark]' in yfpp's clone.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("-q", "--query", action="extend", nargs="+", required=True, metavar="QUERY_OR_FILE",
                   help="query text or a query file, as for 'yfpp run'; repeatable")
    p.add_argument("-i", "--input", action="extend", nargs="+", metavar="PATH",
                   help="files, directories (read recursively, files in path order) or globs, read as one stream "
                        "in the order given (a glob's matches sorted); any URI Spark reads (file://, hdfs://, s3a://), "
                        "relative paths from here; --stream: one directory, or a live source tcp://HOST:PORT, "
                        "mqtt://HOST[:PORT]/TOPIC[?qos=1&client_id=ID&clean=0] or kafka://BROKERS/TOPIC (Spark's "
                        "connector; docs/spark.md, 'Live sources')")
    p.add_argument("-o", "--output", required=True, metavar="OUTDIR", help="output directory")
    p.add_argument("--master", help="Spark master, e.g. local[4] or spark://host:7077 (default: spark-submit's, else local[*])")
    p.add_argument("--format", choices=["xml", "jsonl"], help="input format (default: from each file's extension or content)")
    p.add_argument("--policy", choices=["all", "non_overlapping"], help="output policy for every query")
    p.add_argument("--ts-field", default="ts", help="timestamp field name (default: ts)")
    p.add_argument("--ts-unit", default="s", help="timestamp unit: s, ms, us, ns, min, h (default: s); a window written "
                                                  "without a unit (WITHIN 500) is in this unit too (in s with --ts-format iso)")
    p.add_argument("--ts-format", choices=["number", "iso"], default="number",
                   help="timestamps are numbers in --ts-unit (default), or ISO-8601 text; with iso, a match's start/end "
                        "are written as ISO-8601 UTC too (matches.jsonl; matches.parquet keeps seconds), as 'yfpp run'")
    p.add_argument("--type-field", metavar="NAME",
                   help="the event type is this JSON field / XML attribute or leaf child (default: JSON 'type', XML element name)")
    p.add_argument("--max-runs-per-query", type=int, metavar="N", help="cap on each query's live runs per engine (see docs/operations.md)")
    p.add_argument("--max-buffer-per-query", type=int, metavar="N", help="cap on each query's buffered events per engine")
    p.add_argument("--events", action="store_true",
                   help="add each bound event in full (seq, type, ts, attrs) to every match, as 'yfpp run --events'; "
                        "matches.parquet gets an events column (JSON)")
    p.add_argument("--max-feedback-depth", type=int, default=MAX_DEPTH, metavar="N",
                   help=f"batch: feedback loop guard, per engine: drop derived events deeper than N (default {MAX_DEPTH})")
    p.add_argument("--max-derived", type=int, default=MAX_DERIVED, metavar="N",
                   help=f"batch: feedback loop guard, per engine: at most N derived events per input event (default {MAX_DERIVED})")
    p.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE", help="a Spark setting; repeatable")
    p.add_argument("--mode", choices=["error", "append", "overwrite"], default="error",
                   help="batch: when the outputs exist — fail (default, Spark's errorifexists), append or overwrite")
    p.add_argument("--table", help="batch: also save the matches' columns as this table (saveAsTable)")
    p.add_argument("--partition-by", action="append", default=[], metavar="COLUMN",
                   help="batch: partition matches.parquet (and --table) by this column, e.g. query; repeatable")
    p.add_argument("--stats", action="store_true", help="batch: also print the plan, the rows, engines and seconds of every matching "
                        "task, and the time per step (docs/spark.md, 'Where the time goes'); --stream: the stages of "
                        "each streaming query, where they ran, and the CPU of driver, JVM and Python workers")
    p.add_argument("--plan", choices=PLANS, default="auto",
                   help="batch: 'scan' — tasks read byte ranges of the input with yfpp's readers and send each event "
                        "to its matching tasks in compact batches (local files only); 'shuffle' — Spark reads the "
                        "input, its rows are numbered, shuffled and sorted to the tasks; "
                        "'auto' (default) — scan when the input is local files (docs/spark.md)")
    p.add_argument("--partitions", type=int,
                   help="shuffle partitions (default: spark.sql.shuffle.partitions if configured, else 2 × the cores); "
                        "with --plan scan, its tasks (default: the cores)")
    p.add_argument("--hot-keys", choices=["auto", "off"], default="auto",
                   help="batch, a directory or live stream: cut a keyed group's hot keys (a key with at least half a "
                        "task's share of the first events; of all events with --plan shuffle) into overlapping time slices, as "
                        "unkeyed queries are "
                        "(default auto); off: one task per key (docs/spark.md, 'Hot keys')")
    p.add_argument("--class-archive", metavar="FILE", default="off",
                   help="a class-data-sharing archive for the driver JVM this command starts: written when the first "
                        "run's JVM exits (that run is several times slower), used by later runs (about half the "
                        "JVM's start-up CPU; about 180 MB); 'auto': one cached under ~/.cache/yfpp per PySpark, Java and "
                        "class path; 'off' (default): none (docs/spark.md)")
    p.add_argument("--stream", action="store_true", help="watch the input directory (or --socket) for new data")
    p.add_argument("--socket", metavar="HOST:PORT", help="stream: read lines from a socket (a demo source, not replayable)")
    p.add_argument("--checkpoint", help="stream: checkpoint directory (default OUTDIR/_checkpoint)")
    p.add_argument("--max-files", type=int, help="stream: at most this many new files per micro-batch")
    p.add_argument("--max-spool", type=int, metavar="MIB",
                   help="stream from tcp:// or mqtt://: the most received data (MiB) held for micro-batches Spark "
                        "has not committed (default 1024); then TCP stops reading (the producer waits) and MQTT drops "
                        "messages, reported as one dead letter per run of drops (docs/spark.md)")
    p.add_argument("--trigger", type=float, metavar="SECONDS", help="stream: micro-batch interval, 0.001 to 86400 (default: as soon as data arrives)")
    p.add_argument("--idle-stop", type=float, metavar="SECONDS",
                   help="stream: stop after this long with no micro-batch running or due (default: run until Ctrl-C)")
    p.set_defaults(func=cmd_spark)


MAX_PARTITIONS = 10_000  #: --partitions: above it tasks (each compiling its groups' queries) cost more than they spread
MAX_FILES = 2**31 - 1  #: --max-files: Spark's maxFilesPerTrigger is an int
MIN_TRIGGER, MAX_TRIGGER = 0.001, 86_400  #: --trigger, seconds: Spark's interval is in milliseconds; at most a day


def load(query_args: list[str], policy: str | None = None, ts_unit: str = "s") -> EffectiveQueries:
    """The ``-q`` arguments (``example:NAME`` too) as :func:`~yfpp.spark.plan.effective_queries` (a window
    without a unit in ``ts_unit``); a query refused is reported with its file and line, as ``yfpp run``
    reports it."""
    from yfpp.spark.plan import effective_queries

    loaded = load_patterns([examples.resolve(arg) for arg in query_args], ts_unit)
    try:
        return effective_queries([(source.name, pattern) for source, pattern in loaded], policy)
    except QueryError:
        for source, pattern in loaded:  # (only when one is refused: find it)
            with source.blame():
                effective_queries([(source.name, pattern)], policy)
        raise


def _check_arguments(args: argparse.Namespace) -> None:
    """What can be refused before a JVM starts."""
    from yfpp.input.readers import field_clash  # (lxml: only when 'spark' runs)

    if not args.input and not (args.stream and args.socket):
        raise YfppError("give an input with -i (or --stream --socket HOST:PORT)")
    if args.max_feedback_depth < 1 or args.max_derived < 1:
        raise YfppError("--max-feedback-depth and --max-derived must be at least 1")
    if args.partitions is not None and not 1 <= args.partitions <= MAX_PARTITIONS:
        raise YfppError(f"--partitions must be from 1 to {MAX_PARTITIONS:,}")
    check_ts_unit(args.ts_unit)
    clash = field_clash(args.ts_field, args.type_field, args.format)  # (without --format: the readers refuse it)
    if clash:
        raise YfppError(clash)
    for flag, value in (("--max-files", args.max_files), ("--max-spool", args.max_spool), ("--trigger", args.trigger),
                        ("--idle-stop", args.idle_stop)):
        if value is not None and not value > 0:
            raise YfppError(f"{flag} must be above 0, got {value}")
    if args.max_files is not None and args.max_files > MAX_FILES:
        raise YfppError(f"--max-files must be at most {MAX_FILES:,}")
    if args.trigger is not None and not MIN_TRIGGER <= args.trigger <= MAX_TRIGGER:
        raise YfppError(f"--trigger must be from {MIN_TRIGGER} to {MAX_TRIGGER:,} seconds, got {args.trigger}")
    if args.socket is not None and socket_address(args.socket) is None:
        raise YfppError(f"--socket must be HOST:PORT (a port from 1 to 65535), not {args.socket!r}")
    if args.input:
        args.input = [examples.resolve(p) for p in args.input]
    live = [p for p in args.input or () if is_live(p)]
    if args.stream and args.input:
        if len(args.input) > 1:
            raise YfppError(f"--stream watches one input directory, not {len(args.input)}: give one -i")
        args.input = args.input[0]
    if live:
        if not args.stream or args.socket:
            raise YfppError(f"-i {live[0]} is a live source: read it with --stream (and no --socket)")
        check_live_url(live[0])
    elif args.stream and args.input and not args.socket and not args.input.startswith("kafka://"):
        for flag, path in (("-o", args.output), ("--checkpoint", args.checkpoint)):
            if path is not None and within(path, args.input):
                raise YfppError(f"{flag} {path} is inside the watched directory {args.input}: the stream would read "
                                f"its own {'output' if flag == '-o' else 'checkpoint'}; give a folder outside it")
    out = local_path(args.output) if ":" in args.output else args.output
    if out is not None and os.path.isfile(out):
        raise YfppError(f"-o names a file, {args.output}: give a directory (it is created)")


def within(path: str, folder: str) -> bool:
    """Is ``path`` ``folder`` or below it? Local paths (and ``file:`` URIs) by their real paths, other
    URIs by scheme, host and path."""
    def place(p: str) -> tuple[str, str]:
        local = local_path(p)
        if local is not None:
            return "", os.path.realpath(local)
        u = urlparse(p)
        return f"{u.scheme}://{u.netloc}", posixpath.normpath(u.path or "/")

    (where, p), (where_f, f) = place(path), place(folder)
    return where == where_f and (p == f or p.startswith(f.rstrip("/") + "/"))


def reading(args: argparse.Namespace) -> dict[str, Any]:
    """The readers' options: ``ts_field``, ``ts_unit`` (``iso`` with ``--ts-format iso``), ``type_field``."""
    return {"ts_field": args.ts_field, "ts_unit": reading_unit(args.ts_unit, args.ts_format),
            "type_field": args.type_field or None}


def cmd_spark(args: argparse.Namespace) -> int:
    """Check the arguments, start the JVM and session — in the background while the queries are read
    and checked, the two sharing the cores — and run the batch or streaming job. Ctrl-C: the jobs
    cancelled, the streaming queries stopped, one line ``yfpp: interrupted``, exit 130 (as ``yfpp run``)."""
    try:
        return _spark_job(args)
    except KeyboardInterrupt:
        print("yfpp: interrupted", file=sys.stderr)
        return 130


def _spark_job(args: argparse.Namespace) -> int:
    _check_arguments(args)
    confs = []
    for kv in args.conf:
        key, eq, value = kv.partition("=")
        if not eq or not key:
            raise YfppError(f"--conf takes KEY=VALUE, not {kv!r}")
        confs.append((key.strip(), value))
    try:
        from pyspark.sql import SparkSession
    except ImportError as e:
        raise YfppError("yfpp spark needs PySpark: pip install -e '.[spark]' in yfpp's clone") from e
    from pyspark import SparkContext

    active = SparkSession.getActiveSession()
    if active is None and SparkContext._active_spark_context is not None:
        active = SparkSession.builder.getOrCreate()  # the session of this process, active in another thread: borrowed
    owned = active is None
    from yfpp.spark.costs import ClassArchive, keep_orphans, process_age, tree_cpu_by_kind, tree_cpu_seconds

    if owned:
        keep_orphans()  # a Python worker whose daemon dies first stays in the tree --stats counts

    started, cpu = time.perf_counter(), tree_cpu_by_kind()
    driver_start = ("driver: start, imports", process_age(), {"driver": time.process_time()})
    from yfpp.spark.timeline import Timeline

    args.timeline = timeline = Timeline()
    timeline.mark("driver: imports done, the JVM starting")
    archive = ClassArchive(class_archive(args, new_jvm=SparkContext._gateway is None))
    builder = SparkSession.builder.appName("yfpp").config("spark.ui.showConsoleProgress", "false")  # counters on stderr
    # a JVM this command starts (not spark-submit's, nor a borrowed session's): cheap to start; --conf overrides
    builder = builder.config("spark.driver.extraJavaOptions", archive.options)
    quiet = owned and dict(confs).get("spark.log.level", "OFF").upper() == "OFF"
    for key, value in own_session_settings().items() if owned else ():
        builder = builder.config(key, value)
    if quiet:
        logging.getLogger("py4j").setLevel(logging.CRITICAL)  # (its report of a failed foreachBatch too)
        logging.getLogger().addFilter(_not_py4j)  # (py4j reports a connection the dead JVM dropped on the root logger)
    for cap in ("max_runs_per_query", "max_buffer_per_query"):  # the engines on the executors read these
        if getattr(args, cap) is not None:
            os.environ[f"YFPP_{cap.upper()}"] = str(getattr(args, cap))
            builder = builder.config(f"spark.executorEnv.YFPP_{cap.upper()}", str(getattr(args, cap)))
    if args.master:
        builder = builder.master(args.master)
    for key, value in confs:
        builder = builder.config(key, value)
    if args.partitions:
        builder = builder.config("spark.sql.shuffle.partitions", str(args.partitions))
    starting = StartingSession(builder, quiet) if owned else None  # a new JVM: started while the queries are read
    try:
        # validated and compiled once (the job reuses them); a window without a unit: seconds for ISO-8601 times, as yfpp run
        queries = load(args.query, args.policy, window_unit(args.ts_unit, args.ts_format))
        from yfpp.spark.plan import group_queries

        group_queries(queries, streaming=args.stream)  # refuses unsupported feedback before the job
    except BaseException:
        if starting is not None:  # the JVM is not left running: killed, its messages dropped
            starting.cancel()
            archive.finish(SparkContext)
        raise
    queries_wall = time.perf_counter() - started
    # a borrowed session gets its SQL options back afterwards (getOrCreate sets them on it)
    keys = [key for key, _ in confs] + ["spark.sql.shuffle.partitions"]
    saved = {} if owned else {k: active.conf.get(k, None) for k in keys if active.conf.isModifiable(k)}
    try:
        spark = starting.result() if starting is not None else builder.getOrCreate()
    except KeyboardInterrupt:  # Ctrl-C while the JVM starts: it is killed, not left starting
        if starting is not None:
            starting.cancel()
            archive.finish(SparkContext)
        raise
    except YfppError:  # the cause found (StartingSession.result)
        raise
    except Exception as e:  # no JVM (JAVA_HOME, --master), and nothing said why: one line
        first = next((ln.strip() for ln in error_text(e).splitlines() if ln.strip()), type(e).__name__)
        raise YfppError(f"cannot start Spark: {first} (Java 17 on PATH or JAVA_HOME? --master {args.master or 'local[*]'}?)") from None
    start_cpu = {k: v - cpu.get(k, 0.0) for k, v in tree_cpu_by_kind().items()}
    if starting is not None and starting.jvm_up is not None:
        timeline.mark("driver JVM up (its gateway answers)", starting.jvm_up)
    timeline.mark("session ready")
    args.before_steps = [driver_start, (f"start JVM + session (queries {queries_wall:.2f} s alongside)",
                                        time.perf_counter() - started, start_cpu)] if owned else []
    interrupt = Interrupt(spark) if owned else None  # (a borrowed session's owner has its own Ctrl-C handling)
    args.interrupted = interrupt.hit if interrupt is not None else threading.Event()
    failed = True
    try:
        if not args.partitions and not spark.sparkContext.getConf().contains("spark.sql.shuffle.partitions"):
            spark.conf.set("spark.sql.shuffle.partitions", str(2 * spark.sparkContext.defaultParallelism))
        from yfpp.spark.shipping import ship_packages

        # a cluster's executors: yfpp's packages sent, what they need checked, their Python workers warmed
        args.warm = ship_packages(spark, timeline.mark)
        code = (stream if args.stream else batch)(spark, queries, args)
        failed = False
    except Exception as e:  # a failed Spark job: one line, not a Java and Python traceback
        if args.interrupted.is_set():  # a job cancelled, a query stopped by Ctrl-C
            raise KeyboardInterrupt from None
        if isinstance(e, YfppError):
            raise
        text = error_text(e)  # (now: a Py4J error asks the JVM for its text)
        jvm = starting.jvm(wait=5.0 if jvm_gone(text) else 0.0) if starting is not None else None
        raise YfppError(job_error(e, spark.sparkContext.master, jvm, text)) from None
    finally:
        if interrupt is not None:
            interrupt.close()
        if owned:
            stopping, stop_cpu = time.perf_counter(), tree_cpu_seconds()
            try:
                spark.stop()
            except Exception:  # the JVM has died: the job's failure says why
                if not failed:
                    raise
            archive.finish(SparkContext)
            if args.stats and not args.stream:
                what = "stop session, write the class archive" if archive.writing else "stop session"
                total = tree_cpu_seconds()
                print(f"{what:<34} {time.perf_counter() - stopping:6.2f}  (wall s, after the steps; "
                      f"{total - stop_cpu:.1f} CPU s; stopped {timeline.since(time.time()):.2f} s after the process "
                      f"started)\nprocess CPU s, the whole run  {total:.1f}", file=sys.stderr)
        for k, v in saved.items():
            if v is None:
                spark.conf.unset(k)
            else:
                spark.conf.set(k, v)
    if args.interrupted.is_set():  # (Ctrl-C after the last job: its outputs are whole, but the user asked to stop)
        raise KeyboardInterrupt
    return code


def own_session_settings() -> dict[str, str]:
    """The settings of a session this command starts (``--conf`` overrides them): Spark's own log off (a
    failure is one line; ``spark.log.level=WARN``, Spark's default, shows it) and, unless spark-submit
    started the JVM with settings of its own, no web UI in the driver (an empty job's command 0.6–1.9 s
    shorter: benchmarks/RESULTS.md; ``spark.ui.enabled=true`` serves it)."""
    settings = {"spark.log.level": "OFF"}
    if not os.environ.get("PYSPARK_GATEWAY_PORT"):
        settings["spark.ui.enabled"] = "false"
    return settings


def _not_py4j(record: logging.LogRecord) -> bool:
    """A log filter: drops what Py4J's gateway logs on the root logger."""
    return os.path.basename(os.path.dirname(record.pathname)) != "py4j"


class Interrupt:
    """Ctrl-C while a session runs: :attr:`hit` is set, and a thread of its own stops the streaming
    queries and cancels the Spark jobs (again every half second, until :meth:`close`: a job the main
    thread starts meanwhile too). The handler makes no call to the JVM itself — the main thread is
    usually waiting in one, on the same connection — and raises nothing: the main thread's call returns
    (its job cancelled, its query stopped) and the job sees :attr:`hit`. A second Ctrl-C exits at once."""

    def __init__(self, spark: Any):
        self.spark, self.hit, self.done = spark, threading.Event(), threading.Event()
        self.previous: Any = None
        if threading.current_thread() is threading.main_thread():
            self.previous = signal.signal(signal.SIGINT, self._handler)

    def _handler(self, signum: int, frame: Any) -> None:
        if self.hit.is_set():
            print("yfpp: interrupted", file=sys.stderr)
            os._exit(130)  # the JVM ends when our end of its stdin closes
        self.hit.set()
        threading.Thread(target=self._cancel, name="yfpp: Ctrl-C", daemon=True).start()

    def _cancel(self) -> None:
        try:
            for q in self.spark.streams.active:
                q.stop()
            while not self.done.is_set():
                self.spark.sparkContext.cancelAllJobs()
                self.done.wait(0.5)
        except Exception:  # the session is being stopped
            pass

    def close(self) -> None:
        """Stop cancelling; give SIGINT back its handler."""
        self.done.set()
        if self.previous is not None:
            signal.signal(signal.SIGINT, self.previous)


def class_archive(args: argparse.Namespace, new_jvm: bool) -> str | None:
    """The driver JVM's class-data-sharing archive (``--class-archive``): None when this command starts
    no JVM (``new_jvm`` false, or spark-submit's), with ``off``, or when ``--conf`` sets the JVM's options."""
    confs = dict(kv.partition("=")[::2] for kv in args.conf)
    confs = {k.strip(): v for k, v in confs.items()}
    if (not new_jvm or args.class_archive == "off" or os.environ.get("PYSPARK_GATEWAY_PORT")
            or "spark.driver.extraJavaOptions" in confs):
        return None
    if args.class_archive != "auto":
        return args.class_archive
    from yfpp.spark.costs import default_class_archive

    return default_class_archive(confs)


def job_error(e: BaseException, master: str | None = None, jvm: Jvm | None = None, text: str | None = None) -> str:
    """The one line that says why a Spark job failed: a cause with a fix to name (out of memory, a
    missing package or file system: :func:`~yfpp.spark.errors.known_cause`), the reader's or file
    system's message, the Python exception, the root of the Java exception chain (``jvm``: what the
    driver JVM said and its exit status, for when it died); ``text``: ``e``'s, when already taken."""
    text = error_text(e) if text is None else text
    known = known_cause(text, master, jvm)
    if known:
        return known
    for pattern in (r"yfpp\.errors\.\w+: (.+)", r"(?:FileNotFoundException|AccessDeniedException|IOException): (.+)",
                    r"\[PATH_ALREADY_EXISTS\] (.+?)(?: SQLSTATE|$)", r"\[(?:PATH_NOT_FOUND|TABLE_OR_VIEW_ALREADY_EXISTS)\] (.+?)(?: SQLSTATE|$)"):
        m = re.search(pattern, text, re.MULTILINE)
        if m:
            hint = " (--mode overwrite or append)" if "ALREADY_EXISTS" in pattern and "ALREADY_EXISTS" in text else ""
            return m.group(1).strip() + hint
    stream = re.search(r"\[STREAM_FAILED\] Query \[[^\]]*\] terminated with exception: ", text)
    rest = text[stream.end() if stream else 0:]
    why = python_error(text) or root_cause(rest, jvm) or next((ln.strip() for ln in rest.splitlines() if ln.strip()),
                                                              type(e).__name__)
    return f"{'streaming query' if stream else 'Spark job'} failed: {why}"


def python_error(text: str) -> str | None:
    """The exception line that ends the first Python traceback in ``text`` (a Spark error's message), if any."""
    _, found, rest = text.partition("Traceback (most recent call last):")
    return next((ln.strip() for ln in rest.splitlines() if ln.strip() and not ln[0].isspace()), None) if found else None


def batch(spark: Any, queries: list[tuple[str, Pattern]], args: argparse.Namespace) -> int:
    """The batch job, by the scan plan (:mod:`yfpp.spark.scan`) or the shuffle plan (:func:`shuffle_rows`),
    its rows persisted once and written from there: matches.jsonl, matches.parquet, dead letters."""
    from pyspark.sql import Observation
    from pyspark.sql import functions as F

    from yfpp.spark.costs import Steps
    from yfpp.spark.inputs import choose_plan, default_fs

    started, started_at = time.perf_counter(), time.time()
    steps = Steps(spark, getattr(args, "before_steps", ()))
    plan = choose_plan(args.plan, [qualify(spark, p) for p in args.input], default_fs(spark))
    rows, dead_of, what, counted = (scan_rows if plan == "scan" else shuffle_rows)(spark, queries, args, steps)
    matches = rows.where(F.col("query").isNotNull()).select(*rows.columns[:6])
    columns = matches.withColumn("events", F.get_json_object("json", "$.events")) if args.events else matches
    out, mode = qualify(spark, args.output), {"error": "errorifexists"}.get(args.mode, args.mode)
    stats = Observation("task stats")  # the tasks' stats rows, gathered by the first write: no job of their own
    with steps.step(f"{what}; write jsonl"):
        rows.observe(stats, F.collect_list(F.when(F.col("query").isNull(), F.col("json"))).alias("tasks")) \
            .where(F.col("query").isNotNull()).select("json").write.mode(mode).text(os.path.join(out, "matches.jsonl"))
        tasks = sorted((json.loads(t) for t in stats.get["tasks"]), key=lambda t: t["task"])
    with steps.step("write matches.parquet"):
        columns.drop("json").write.mode(mode).partitionBy(*args.partition_by).parquet(os.path.join(out, "matches.parquet"))
        if args.table:
            from yfpp.spark.table import adopt_folder

            if mode == "append":
                adopt_folder(spark, args.table)
            columns.drop("json").write.mode(mode).partitionBy(*args.partition_by).saveAsTable(args.table)
    with steps.step("write dead letters"):
        dead_of(tasks).select(F.to_json(F.struct("seq", "position", "reason", "raw"), {"ignoreNullFields": "false"})) \
            .write.mode(mode).text(os.path.join(out, "dead_letters.jsonl"))
    n_events, n_dead = counted(tasks)
    counts: dict[str, int] = {}  # matches per query: the tasks' own counts
    for t in tasks:
        for name, n in t["matches"].items():
            counts[name] = counts.get(name, 0) + n
    elapsed = time.perf_counter() - started
    lines = [f"events            {n_events:,}", f"elapsed           {elapsed:.3f} s",
             f"events/s          {n_events / max(elapsed, 1e-9):,.0f}", f"dead letters      {n_dead:,}",
             "matches per query:"]
    lines += [f"  {name:<24} {counts.get(str(name), 0):,}" for name in dict.fromkeys(n for n, _ in queries)]
    if args.stats:
        lines.append(f"plan              {plan} ({len(tasks)} matching tasks)")
        lines += warm_line(args)
        lines.append("rows per task (matching):")
        lines += [f"  task {t['task']:<4} {t['rows']:>12,} rows {t['engines']:>6,} engines {t['seconds']:>9.3f} s"
                  for t in tasks]
        lines += task_spread(tasks)
        lines += steps.report()
        lines += spark_timeline(spark, args, f"{what}; write jsonl", since=started_at)
    print("\n".join(lines), file=sys.stderr)
    rows.unpersist()
    return 0


def spark_timeline(spark: Any, args: argparse.Namespace, matching: str, since: float) -> list[str]:
    """``--stats`` lines: the run's timeline (:mod:`yfpp.spark.timeline`; a borrowed session's: its jobs
    before this run's too), and the Spark duration of the step ``matching`` (its jobs submitted from the
    epoch second ``since`` on: the jobs of this run that read and match)."""
    from yfpp.spark.timeline import Timeline, duration, spark_jobs

    timeline = getattr(args, "timeline", None) or Timeline()
    timeline.mark("outputs written")
    took = duration([j for j in spark_jobs(spark.sparkContext)
                     if j.group == matching and j.submitted is not None and j.submitted >= since])
    return timeline.report(spark.sparkContext) + [
        f"matching job      {'-' if took is None else f'{took:.3f}'} s  (Spark's duration of the step "
        f"'{matching}': its first stage submitted to its last stage completed)"]


def warm_line(args: argparse.Namespace) -> list[str]:
    """``--stats``' line of the executors the check job warmed (:class:`~yfpp.spark.shipping.Warm`); none where
    nothing was shipped (a local master)."""
    warm = getattr(args, "warm", None)
    return [] if warm is None else [warm.line()]


def task_spread(tasks: list[dict]) -> list[str]:
    """``--stats`` lines: the matching tasks' CPU seconds, slowest against the mean, and the hot keys cut into slices."""
    seconds = [t["seconds"] for t in tasks]
    if not seconds:
        return []
    mean = sum(seconds) / len(seconds)
    lines = [f"task seconds      min {min(seconds):.3f}, mean {mean:.3f}, max {max(seconds):.3f} "
             f"(max/mean {max(seconds) / mean if mean else 1.0:.2f})"]
    hot = tasks[0].get("hot")
    if hot is not None:
        lines.append(f"hot keys          {', '.join(hot) if hot else 'none'}")
    return lines


def scan_rows(spark: Any, queries: list[tuple[str, Pattern]], args: argparse.Namespace, steps: Any) -> tuple:
    """The scan plan's rows (persisted, computed by the first write); ``dead_of``: its dead letters given
    the task rows (the tasks' stats, which the first write gathers); the name of its matching step; and
    ``counted``: called once the outputs are written, the events and dead letters from the task rows
    (the tasks' counts; the shuffle plan also releases its input cache)."""
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    from yfpp.spark.inputs import list_inputs, single_file
    from yfpp.spark.scan import scan_match

    with steps.step("list input"):
        files = list_inputs(spark, args.input, here=True)
    tasks = args.partitions or spark.sparkContext.defaultParallelism
    with steps.step("plan the scan"):  # the queries compiled and grouped, the job's first DataFrame (SQL's classes load)
        rows = scan_match(spark, queries, files, single=single_file(args.input, files), tasks=tasks, format=args.format,
                          **reading(args), policy=args.policy, full_events=args.events,
                          feedback_limits=(args.max_feedback_depth, args.max_derived), hot_keys=args.hot_keys == "auto"
                          ).persist(StorageLevel.MEMORY_AND_DISK)

    def counted(task_rows: list[dict]) -> tuple[int, int]:
        n_dead = sum(t["dead"] for t in task_rows)  # task 0's, and the late events each task reported
        return task_rows[0]["records"] - n_dead, n_dead

    def dead_of(task_rows: list[dict]) -> Any:
        dead = rows.where(F.col("reason").isNotNull()).select(F.col("dead_seq").alias("seq"), "position", "reason", "raw")
        return dead.limit(0) if counted(task_rows)[1] == 0 else dead  # limit(0): an empty relation, no pass over the rows

    return rows, dead_of, f"scan: read + match, {tasks} tasks", counted


def shuffle_rows(spark: Any, queries: list[tuple[str, Pattern]], args: argparse.Namespace, steps: Any) -> tuple:
    """The shuffle plan: parse and persist the input (one job, its splits' summaries collected), then
    route, match and write from that cache — no second cache of the events, no pass to count them.
    Returns as :func:`scan_rows`."""
    from pyspark.sql import Observation
    from pyspark.sql import functions as F

    from yfpp.spark.batch import match_with_stats
    from yfpp.spark.plan import effective_queries, group_queries, hashable_keys, needs_xml
    from yfpp.spark.read import events_of, parse_input

    limits = (args.max_feedback_depth, args.max_derived)
    groups = group_queries(effective_queries(queries, args.policy), feedback_limits=limits)
    hashed = hashable_keys(groups)
    parsed = parse_input(spark, args.input, args.format, **reading(args), xml=needs_xml(groups), keys=hashed,
                         step=steps.step)
    events = events_of(spark, parsed)
    with steps.step("plan the match"):
        rows = match_with_stats(spark, queries, events, policy=args.policy, partitions=args.partitions,
                                full_events=args.events, feedback_limits=limits, hashed=hashed,
                                time_range=parsed.time_range(), iso_times=args.ts_format == "iso",
                                hot_keys=args.hot_keys == "auto").persist()
    observed = Observation("dead letters")
    dead = events.where(F.col("reason").isNotNull())
    none = not parsed.late and not parsed.malformed  # the summaries show none: an empty output, no pass over the input
    # limit(0) is planned as an empty relation (Spark's OptimizeLimitZero): no job reads the cache
    dead = dead.limit(0) if none else dead.observe(observed, F.count(F.lit(1)).alias("n"))

    def counted(task_rows: list[dict]) -> tuple[int, int]:
        parsed.df.unpersist()
        n_dead = 0 if none else observed.get["n"]
        return parsed.records - n_dead, n_dead

    return rows, lambda task_rows: dead, "route, shuffle, sort, match", counted


def stream(spark: Any, queries: list[tuple[str, Pattern]], args: argparse.Namespace) -> int:
    from yfpp.spark.costs import tree_cpu_by_kind
    from yfpp.spark.stream import finish, start_stream, stop_query

    cpu = tree_cpu_by_kind()
    out = qualify(spark, args.output)
    checkpoint = qualify(spark, args.checkpoint or os.path.join(out, "_checkpoint"))
    path, kafka = None if args.socket else args.input, []
    if path is not None and path.startswith("kafka://"):  # Spark's Kafka source into a folder the stream reads
        from yfpp.spark.live_sources import kafka_inbox

        query, path = kafka_inbox(spark, path, checkpoint.rstrip("/"))
        kafka.append(query)
    running = kafka + start_stream(spark, queries, out, checkpoint, path=path, socket=args.socket, policy=args.policy,
                                   full_events=args.events, format=args.format, **reading(args),
                                   max_files=args.max_files, hot_keys=args.hot_keys == "auto",
                                   max_spool=args.max_spool << 20 if args.max_spool else None,
                                   interval=f"{round(args.trigger * 1000)} milliseconds" if args.trigger else None)
    interrupted = getattr(args, "interrupted", None) or threading.Event()
    try:
        wait_idle(running, args.idle_stop, interrupted)
    except BaseException:
        for q in running:
            stop_query(q)
        raise
    if interrupted.is_set():  # Ctrl-C: stopped where they were (a restart goes on from the checkpoint)
        for q in running:
            stop_query(q)
        raise KeyboardInterrupt
    finish(running)  # idle: the matching query takes what the ingest query staged last; a failed one raises
    if args.stats:
        from yfpp.spark.live_receiver import receiver_of
        from yfpp.spark.stream_stats import report

        after = tree_cpu_by_kind()
        names = ["ingest", "match"] if len(running) == 2 else ["match"]
        progress = running[-1].recentProgress  # the matching query's rows are the records (when it kept every report)
        whole = len(progress) < int(spark.conf.get("spark.sql.streaming.numRecentProgressUpdates"))
        read = sum(p["numInputRows"] for p in progress) if whole else 0
        groups = [(name, str(q.runId)) for name, q in zip(names, running)]
        receiver = receiver_of(running[0])
        if receiver is not None:
            groups.insert(0, ("receiver", receiver.group))
        print("\n".join(warm_line(args) + report(spark, groups, {k: v - cpu.get(k, 0.0) for k, v in after.items()},
                                                read or None)), file=sys.stderr)
    return 0


def wait_idle(queries: list[Any], idle_stop: float | None, stop: threading.Event | None = None) -> None:
    """Wait until a query of ``queries`` ends (a failed one raises its error), ``stop`` is set, or
    (``idle_stop``) until the first — the one reading the input — has read nothing for that long.

    Activity is a finished micro-batch that read rows (its progress report), or
    one running on new data now — not the trigger's polling, which never stops.
    The idle time counts from the first time the query has looked at its
    source (a progress report, or its status waiting for data): a query still
    starting — a restarted one recovering its state — is not idle.
    """
    query = queries[0]
    last_active, last_batch, looked = time.monotonic(), None, False
    while not query.awaitTermination(1) and not (stop is not None and stop.is_set()):
        for other in queries[1:]:
            if not other.isActive:
                other.awaitTermination()  # raises the query's error
                return
        progress, status = query.lastProgress, query.status
        if progress is not None and progress["batchId"] != last_batch:
            last_batch = progress["batchId"]
            if progress["numInputRows"]:
                last_active = time.monotonic()
        if not looked:
            looked = progress is not None or status["message"].startswith("Waiting")
            last_active = time.monotonic()
        elif status["isTriggerActive"] and status["isDataAvailable"]:
            last_active = time.monotonic()
        elif idle_stop is not None and time.monotonic() - last_active > idle_stop:
            return
