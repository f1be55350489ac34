"""The ``yfpp`` command line: ``run``, ``generate``, ``explain``, ``examples``, ``spark``."""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time
from collections import Counter
from typing import Any, BinaryIO, Callable, Iterable, Iterator

from yfpp import examples
from yfpp._version import __version__
from yfpp.input.dead_letters import DeadLetters
from yfpp.engine import MAX_BUFFER_PER_QUERY, MAX_HELD, MAX_RUNS_PER_QUERY, Engine
from yfpp.errors import InputError, YfppError
from yfpp.input.events import Event
from yfpp.runtime.feedback import MAX_DEPTH as MAX_FEEDBACK_DEPTH
from yfpp.runtime.feedback import MAX_DERIVED
from yfpp.output.writer import MatchWriter, check_writable, is_live_input, open_for_writing
from yfpp.language.query_text import load_patterns
from yfpp.input.record_fields import MAX_DEPTH, MAX_RECORD_BYTES, check_ts_unit
from yfpp.output.ordered import OrderedMatches
from yfpp.output.stats import Progress, format_figures, run_figures, write_figures_json
from yfpp.output.vocabulary import Vocabulary
from yfpp.state.memory_cap import RARE_COLLECTIONS

CHECKPOINT_EVERY = 100_000  #: events between checkpoints of ``yfpp run --checkpoint``
MAX_SYMBOLS, MAX_TAGS = 1_000_000, 100_000  #: yfpp generate's: a price per symbol, a lifecycle per tag is held

RUN_EXAMPLES = """\
examples:
  yfpp run -q example:shoplifting.sase -i example:sample_rfid.xml
  yfpp run -q "[tag_id]&&//shelf//!register//exit&&(12 hours)" -i feed.jsonl --stats
  yfpp run -q queries/stock_templates.sase -i ticks.xml --policy non_overlapping -o matches.jsonl
  yfpp run -q queries/count.xpe -i yfpp/data/count_shelves.xml --events
  tail -f feed.xml | yfpp run -q queries/shoplifting.xpe -i - --format xml
  yfpp run -q queries/shoplifting.sase -i feed.jsonl --workers auto --ordered -o matches.jsonl
"""

GENERATE_EXAMPLES = """\
examples:
  yfpp generate stock --events 100000 --p-up 0.55 -o ticks.xml
  yfpp generate rfid --events 5000 --theft-rate 0.05 -o feed.jsonl
"""

EXPLAIN_EXAMPLES = """\
examples:
  yfpp explain -q example:sharing.xpe
  yfpp explain -q example:sharing.xpe --format json > nfa.json
  yfpp explain -q example:sharing.xpe --dot nfa.dot --png nfa.png
  yfpp explain -q subscriptions.sase --full     # every node, even of over 200 queries
"""


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        return args.func(args)
    except YfppError as e:
        print(f"yfpp: error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # the reader went away (| head): stop quietly, also at interpreter exit
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except OSError as e:  # a file that went away, a full disk: one line, not a traceback
        print(f"yfpp: error: {e.filename + ': ' if e.filename else ''}{e.strerror or e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C outside the input loop (which handles it itself)
        return 130


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="yfpp",
        description="Match event patterns (SASE+ or extended XPath) over XML / JSON-lines streams, many queries at once.",
        epilog="Run 'yfpp COMMAND --help' for a command's options and examples.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser(
        "run",
        help="match queries over an input stream on this machine",
        description="Match queries over an event stream; print one JSON line per match (docs/semantics.md §10).",
        epilog=RUN_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    run.add_argument("-q", "--query", action="extend", nargs="+", metavar="QUERY_OR_FILE",
                     help="query text or a query file (.sase, .xpe, or any file: language from the text); repeatable "
                          "(required unless --restore)")
    run.add_argument("-i", "--input", required=True,
                     help="input file (.xml, .jsonl, optionally .gz), - for stdin, or mqtt(s)://HOST[:PORT]/TOPIC "
                          "(docs/service.md: MQTT)")
    run.add_argument("--idle-stop", type=float, metavar="SECONDS",
                     help="with an MQTT input: stop after this many seconds without a message (default: at Ctrl-C)")
    run.add_argument("--format", choices=["xml", "jsonl"], help="input format (default: from the extension or content)")
    run.add_argument("-o", "--output", help="write matches here instead of stdout")
    run.add_argument("--policy", choices=["all", "non_overlapping", "earliest_maximal"],
                     help="output policy for every query (default: each query's own, else all); "
                          "earliest_maximal is for event-set queries")
    run.add_argument("--strategy", choices=["direct", "match-window"],
                     help="evaluation strategy of event-set queries (docs/event_sets.md; default direct)")
    run.add_argument("--ts-field", help="timestamp field name (default: ts)")
    run.add_argument("--ts-unit", help="timestamp unit: s, ms, us, ns, min, h (default: s); a window written "
                                       "without a unit (WITHIN 500) is in this unit too")
    run.add_argument("--ts-format", choices=["number", "iso"],
                     help="timestamps are numbers in --ts-unit (default), or ISO-8601 text; with iso, "
                          "a match's start/end are written as ISO-8601 UTC too")
    run.add_argument("--type-field", metavar="NAME",
                     help="the event type is this JSON field / XML attribute or leaf child (default: JSON 'type', XML element name)")
    run.add_argument("--max-record-bytes", type=int, metavar="N",
                     help=f"a record (XML event element, JSON line) longer than this is a dead letter (default {MAX_RECORD_BYTES})")
    run.add_argument("--max-depth", type=int, metavar="N",
                     help=f"a record nested deeper than this is a dead letter (default {MAX_DEPTH})")
    run.add_argument("--strict", action="store_true", help="exit 1 if any record was a dead letter")
    run.add_argument("--max-delay", type=float, help="reorder buffer for out-of-order events, in seconds (default 0)")
    run.add_argument("--max-held", type=_count(1), metavar="N",
                     help=f"events the reorder buffer holds at most; over it the oldest go early (default $YFPP_MAX_HELD, else {MAX_HELD:,})")
    run.add_argument("--dead-letters", metavar="FILE", help="write malformed and late records here as JSON lines (default: stderr)")
    run.add_argument("--max-runs-per-query", type=int, metavar="N",
                     help="cap on each query's live runs; over it its oldest runs are shed and reported "
                          f"(default $YFPP_MAX_RUNS_PER_QUERY, else {MAX_RUNS_PER_QUERY:,})")
    run.add_argument("--max-buffer-per-query", type=int, metavar="N",
                     help=f"cap on each query's buffered events, same policy (default $YFPP_MAX_BUFFER_PER_QUERY, else {MAX_BUFFER_PER_QUERY:,})")
    run.add_argument("--merge-runs", action=argparse.BooleanOptionalAction, default=None,
                     help="merge equivalent runs into one (SIGMOD 2008 §5.2.2): same matches, fewer runs stepped "
                          "(default: off; with --restore, the checkpoint's setting)")
    run.add_argument("--checkpoint", metavar="FILE", help="write the engine's state to FILE (atomically) every --checkpoint-every events")
    run.add_argument("--checkpoint-every", type=int, metavar="N", help="events between checkpoints (default 100,000)")
    run.add_argument("--restore", metavar="FILE",
                     help="resume from a checkpoint over the SAME input: its queries, options and way of reading the "
                          "input (--format, --ts-*, --type-field, --max-record-bytes, --max-depth), skipping the "
                          "records it consumed")
    run.add_argument("--events", action="store_true", default=None,
                     help="add each bound event in full (seq, type, ts, attrs; a derived event's provenance) to every match")
    run.add_argument("--max-feedback-depth", type=int, metavar="N",
                     help=f"feedback loop guard: drop derived events deeper than N in one cascade (default {MAX_FEEDBACK_DEPTH})")
    run.add_argument("--max-derived", type=int, metavar="N",
                     help=f"feedback loop guard: at most N derived events per input event (default {MAX_DERIVED})")
    run.add_argument("--workers", metavar="N|auto",
                     help="match in N processes (auto: one per core available), the events partitioned by each "
                          "query's equivalence key or cut into time slices, as 'yfpp spark' does; the same matches, "
                          "each worker's in stream order (default $YFPP_WORKERS, else 1; docs/operations.md: Workers)")
    run.add_argument("--ordered", action="store_true",
                     help="write the matches at the end, ordered by end, query, start and id (the same lines for any "
                          "--workers; holds every match until the end of the input)")
    run.add_argument("--stats", action="store_true", help="print events/s, peak runs, buffer size and matches per query to stderr")
    run.add_argument("--stats-json", metavar="FILE", help="write the --stats figures to FILE as one JSON object")
    run.add_argument("--progress", choices=["auto", "always", "never"], default="auto",
                     help="progress line on stderr (auto: when stderr is a terminal)")
    run.set_defaults(func=cmd_run)

    gen = sub.add_parser(
        "generate",
        help="write a synthetic stock or RFID stream",
        description="Write a synthetic stream: the SIGMOD 2008 §6 stock ticks, or an RFID shelf/register/exit feed.",
        epilog=GENERATE_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    gen.add_argument("kind", choices=["stock", "rfid"])
    gen.add_argument("--events", type=_count(0), default=10000, help="number of events (default 10000)")
    gen.add_argument("-o", "--output", default="-", help="output file (.xml or .jsonl; default stdout)")
    gen.add_argument("--format", choices=["xml", "jsonl"], help="output format (default: from the extension, else jsonl)")
    gen.add_argument("--seed", type=int, default=0)
    gen.add_argument("--symbols", type=_count(1, MAX_SYMBOLS), default=2,
                     help=f"stock: number of symbols (at most {MAX_SYMBOLS:,}: each holds a price)")
    gen.add_argument("--p-up", type=_probability, default=0.5, help="stock: probability that a price goes up")
    gen.add_argument("--tags", type=_count(1, MAX_TAGS), default=20,
                     help=f"rfid: tag lifecycles under way at once (at most {MAX_TAGS:,}: each is held, about 2 KB)")
    gen.add_argument("--zones", type=_count(1), default=5, help="rfid: number of shelf zones")
    gen.add_argument("--doors", type=_count(1), default=2, help="rfid: number of exit doors")
    gen.add_argument("--theft-rate", type=_probability, default=0.1, help="rfid: fraction of tags that skip the register")
    gen.set_defaults(func=cmd_generate)

    exp = sub.add_parser(
        "explain",
        help="show the shared NFA of a set of queries",
        description="Merge the queries into one shared NFA and print it: nodes, edges, which queries share what.",
        epilog=EXPLAIN_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    exp.add_argument("-q", "--query", action="extend", nargs="+", required=True, metavar="QUERY_OR_FILE")
    exp.add_argument("--format", choices=["text", "json", "dot"], default="text",
                     help="what to print: the indented trie (default), the graph as JSON for tools, or Graphviz DOT")
    exp.add_argument("--dot", metavar="FILE", help="also write the graph in Graphviz DOT")
    exp.add_argument("--png", metavar="FILE.png", help="also draw it as a PNG picture (Graphviz dot if installed, else matplotlib)")
    exp.add_argument("--full", action="store_true", help="print every node however many queries: over 200, text and json "
                     "give the figures and the most shared nodes unless --full is given")
    exp.set_defaults(func=cmd_explain)

    ex = sub.add_parser(
        "examples",
        help="list the example queries and sample feeds that ship with yfpp",
        description="List the example queries and sample feeds installed with yfpp; "
                    "give one to run or explain as example:NAME (a file name, or its stem when unique).",
        epilog="examples:\n  yfpp run -q example:shoplifting.sase -i example:sample_rfid.xml",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ex.set_defaults(func=cmd_examples)

    from yfpp.spark.cli import add_parser as add_spark_parser  # pyspark is imported only when 'spark' runs

    add_spark_parser(sub)
    from yfpp.service.cli import add_parsers as add_service_parsers  # server libraries imported only when 'serve' runs

    add_service_parsers(sub)
    return parser


# --- run ----------------------------------------------------------------------------------


def _count(least: int, most: int | None = None) -> Callable[[str], int]:
    """An argparse type: an integer of at least ``least`` (and at most ``most``)."""
    def count(text: str) -> int:
        n = int(text)
        if n < least:
            raise argparse.ArgumentTypeError(f"must be at least {least}, got {n}")
        if most is not None and n > most:
            raise argparse.ArgumentTypeError(f"must be at most {most:,}, got {n:,}")
        return n
    count.__name__ = "integer"  # argparse names the type in its message for a non-integer
    return count


def _probability(text: str) -> float:
    """An argparse type: a number from 0 to 1."""
    p = float(text)
    if not 0 <= p <= 1:
        raise argparse.ArgumentTypeError(f"must be from 0 to 1, got {text}")
    return p


def build_engine(query_args: Iterable[str], ts_unit: str = "s", **engine_opts: Any) -> Engine:
    """An Engine with the queries of ``-q`` arguments registered (windows without a unit in ``ts_unit``)."""
    engine = Engine(**engine_opts)
    for source, pattern in load_patterns([examples.resolve(arg) for arg in query_args], ts_unit):
        with source.blame():
            engine.register(pattern, name=source.name)
    return engine


#: ``yfpp run``'s options that decide how the input is read, and their defaults: a checkpoint keeps them, so
#: that ``--restore`` reads the input as the run that wrote it did (another unit would give other matches)
READER_DEFAULTS: dict[str, Any] = {"format": None, "ts_field": "ts", "ts_unit": "s", "ts_format": "number",
                                   "type_field": None, "max_record_bytes": MAX_RECORD_BYTES, "max_depth": MAX_DEPTH}


def reader_options(args: argparse.Namespace, stored: Any = None) -> dict[str, Any]:
    """Set ``args``' reader options: those given, else the checkpoint's (``stored``), else the defaults; an
    option given with another value than the checkpoint's is an error.  Returns them, for the next checkpoint."""
    given = {k: getattr(args, k) for k in READER_DEFAULTS if getattr(args, k) is not None}
    opts = dict(READER_DEFAULTS)
    if stored is not None:
        if not (isinstance(stored, dict) and stored.keys() <= READER_DEFAULTS.keys()):
            raise YfppError("corrupt checkpoint: 'reader' is not a set of reader options")
        opts.update(stored)
        clash = [f"--{k.replace('_', '-')} {opts[k]}" for k, v in given.items() if opts[k] != v]
        if clash:
            raise YfppError(f"the checkpoint's run read its input with {', '.join(clash)}: "
                            "--restore reads it the same way (leave the option out)")
    opts.update(given)
    check_ts_unit(opts["ts_unit"])
    if opts["format"] not in (None, "xml", "jsonl") or opts["ts_format"] not in ("number", "iso") \
            or not isinstance(opts["ts_field"], str) or not isinstance(opts["type_field"], (str, type(None))):
        raise YfppError("corrupt checkpoint: bad reader options")
    if not all(type(opts[k]) is int and opts[k] >= 1 for k in ("max_record_bytes", "max_depth")):
        raise YfppError("--max-record-bytes and --max-depth must be positive")
    for k, v in opts.items():
        setattr(args, k, v)
    return opts


def cmd_run(args: argparse.Namespace) -> int:
    from yfpp.input.readers import read_event_batches, reading_options
    from yfpp.input.record_fields import reading_unit, window_unit

    stored = None
    if args.restore:
        from yfpp.state.checkpoint import read_checkpoint

        stored = read_checkpoint(args.restore)
    reading = reader_options(args, stored.get("reader") if isinstance(stored, dict) else None)
    if args.checkpoint_every is not None and not args.checkpoint:
        raise YfppError("--checkpoint-every needs --checkpoint FILE")
    if args.checkpoint_every is None:
        args.checkpoint_every = CHECKPOINT_EVERY
    if args.checkpoint_every < 1:
        raise YfppError("--checkpoint-every must be at least 1")
    args.input = examples.resolve(args.input)
    mqtt_input = args.input.startswith(("mqtt://", "mqtts://"))
    if mqtt_input and (args.restore or args.checkpoint):
        raise YfppError("--checkpoint and --restore read a file again; an MQTT input is not read again")
    if args.idle_stop is not None and not (mqtt_input and args.idle_stop > 0):
        raise YfppError("--idle-stop takes a number of seconds > 0, with an MQTT input")
    for path, what in ((args.output, "output"), (args.dead_letters, "dead-letter file"), (args.stats_json, "stats file"),
                       (args.checkpoint, "checkpoint")):
        if path:
            check_writable(path, what)  # before the run, not after it
            if args.input != "-" and not mqtt_input and os.path.exists(path) and os.path.samefile(path, args.input):
                raise YfppError(f"the {what} {path} is the input file: writing it would destroy the input")
    if args.input == "-" and sys.stdin is None:
        raise YfppError("standard input is closed: give the input with -i FILE")
    if not args.output and sys.stdout is None:
        raise YfppError("standard output is closed: give an output file with -o FILE")
    dead_file = open_for_writing(args.dead_letters, "dead-letter file") if args.dead_letters else None
    dead = DeadLetters(dead_file or sys.stderr)
    caps = {"max_runs_per_query": args.max_runs_per_query, "max_buffer_per_query": args.max_buffer_per_query,
            "max_held": args.max_held, "merge_runs": args.merge_runs}
    feedback_opts = {k: v for k, v in (("full_events", args.events), ("max_feedback_depth", args.max_feedback_depth),
                                       ("max_derived_per_event", args.max_derived)) if v is not None}  # (else: the
    # checkpoint's with --restore, the engine's defaults without)
    skip = sequencer = None
    if args.restore:
        from yfpp.state.checkpoint import SkipConsumed

        if args.query:
            raise YfppError("--restore takes the queries from the checkpoint: leave out -q")
        kept = [flag for flag, v in (("--policy", args.policy), ("--strategy", args.strategy),
                                     ("--max-delay", args.max_delay)) if v is not None]
        if kept:
            raise YfppError(f"--restore keeps the checkpoint's {', '.join(kept)}: leave {'them' if len(kept) > 1 else 'it'} out")
        engine = Engine.restore(stored, dead_letters=dead,
                                **{k: v for k, v in caps.items() if v is not None}, **feedback_opts)
        reported = stored.get("dead_letters_reported", -1)
        if type(reported) is not int:
            raise YfppError("corrupt checkpoint: dead_letters_reported is not an integer")
        if "workers" in stored:  # written by workers: their reorder buffer says what was consumed
            from yfpp.workers.pool import Sequencer

            sequencer = Sequencer.restore(stored["workers"].get("sequencer") or {}, dead_letters=dead)
        skip = SkipConsumed(sequencer or engine, dead, reported)  # records the checkpoint consumed: neither matched nor reported again
    elif not args.query:
        raise YfppError("give at least one query with -q (or --restore FILE)")
    else:
        caps["merge_runs"] = bool(args.merge_runs)
        engine = build_engine(args.query, window_unit(args.ts_unit, args.ts_format), max_delay=args.max_delay or 0.0,
                              dead_letters=dead, policy=args.policy, **caps,
                              **feedback_opts, strategy=args.strategy or "direct")
    workers = _workers(args, stored)
    show = args.progress == "always" or (args.progress == "auto" and sys.stderr.isatty())
    live = is_live_input(args.input)
    source, progress = args.input, None
    if show and not live:  # a regular file: read it through a handle whose position gives percentage and ETA
        source = _open_input(args.input)
        progress = Progress(sys.stderr, total=os.fstat(source.fileno()).st_size, position=source.tell)
    elif show:
        progress = Progress(sys.stderr)
    read_opts = {"ts_field": args.ts_field, "ts_unit": reading_unit(args.ts_unit, args.ts_format),
                 "type_field": args.type_field, "max_record_bytes": args.max_record_bytes, "max_depth": args.max_depth}
    if mqtt_input:
        from yfpp.service.mqtt import read_batches

        reader = read_batches(args.input, read_opts, dead, args.idle_stop, args.format)
    else:
        reader = read_event_batches(source, args.format, dead_letters=skip if skip is not None else dead, **read_opts)
    events = InputFeed(reader)
    # Runs, buffer entries and events form no reference cycles: keep the cyclic collector from
    # rescanning millions of them (it took a third of the time on large runs).
    gc.freeze()
    gc.set_threshold(*RARE_COLLECTIONS)
    plans = [*engine.queries.values(), *(m.plan for m in engine.set_queries.values())]
    vocabulary = Vocabulary(plan.pattern for plan in plans)
    started = time.perf_counter()
    interrupted = False
    pool = None
    try:
        out = MatchWriter(args.output, live_input=live, iso_times=args.ts_format == "iso")
        if args.ordered:
            out = OrderedMatches(out, [str(plan.name) for plan in plans])
        try:
            if workers > 1:
                direct = None if live or mqtt_input or progress is not None or args.checkpoint or stored is not None \
                    or engine.max_delay else (args.input, args.format, reading_options(**read_opts))
                pool = _start_workers(engine, workers, out, dead, caps, args, live, stored, sequencer, direct)
            if pool is not None and pool.source is not None:  # the workers read the input themselves
                events = InputFeed([])
            write_matches(engine if pool is None else pool,
                          events if skip is None else skip.batches(events, vocabulary.note), out, progress,
                          (args.checkpoint, args.checkpoint_every,
                           lambda: {"reader": reading, "dead_letters_reported": dead.last_seq}) if args.checkpoint else None,
                          vocabulary, engine)
            if pool is not None and pool.source is not None:
                events.count = pool.events
                for t, names in pool.vocabulary.items():
                    vocabulary.attrs.setdefault(t, set()).update(names)
        except KeyboardInterrupt:
            interrupted = True
        finally:
            if pool is not None:
                pool.close()
            out.close()
    finally:
        dead.close()
        if dead_file is not None:
            dead_file.close()
        if source is not args.input:
            source.close()
    if vocabulary.attrs and not interrupted:
        for plan in plans:
            vocabulary.add_emitted(plan.pattern)
        for plan in plans:
            for warning in vocabulary.unknown_names(str(plan.name), plan.pattern):
                print(f"yfpp: warning: {warning}", file=sys.stderr)
    elapsed = time.perf_counter() - started
    figures = run_figures(engine, events.count, elapsed, dead) if pool is None else pool.figures(events.count, elapsed)
    if args.stats:
        sys.stderr.write(format_figures(figures))
    if args.stats_json:
        with open_for_writing(args.stats_json, "stats file") as f:
            write_figures_json(figures, f)
    return run_status(args, events, dead.by_reason, skip.skipped if skip is not None else Counter(), interrupted)


def _workers(args: argparse.Namespace, stored: dict | None) -> int:
    """``--workers``' count (else $YFPP_WORKERS', else 1; with ``--restore``, else the checkpoint's): a checkpoint
    is resumed by as many workers as wrote it."""
    from yfpp.workers.pool import worker_count

    written = (stored["workers"].get("n") if isinstance(stored["workers"], dict) else None) \
        if stored is not None and "workers" in stored else 1 if stored is not None else None
    if written is not None and (type(written) is not int or written < 1):
        raise YfppError("corrupt checkpoint: bad 'workers' entry")
    text = args.workers if args.workers is not None else os.environ.get("YFPP_WORKERS") if written is None \
        else str(written)
    n = worker_count(text or "1")
    if written is not None and n != written:
        raise YfppError(f"the checkpoint was written by {written} worker{'s' if written > 1 else ''}: "
                        f"restore it with --workers {written}")
    return n


def _start_workers(engine: Engine, n: int, out: Any, dead: DeadLetters, caps: dict[str, Any],
                   args: argparse.Namespace, live: bool, stored: dict | None, sequencer: Any,
                   source: tuple[str, str | None, Any] | None = None) -> Any:
    """The :class:`yfpp.workers.pool.Workers` running ``engine``'s queries (as registered: names, policies) in ``n``
    processes; ``live``: the input is live (each batch is sent on at once); ``stored``, ``sequencer``: the
    checkpoint to resume from (``--restore``) and its restored reorder buffer; ``source``: the input file, its
    format and reader options, for the workers to read themselves where they can."""
    from yfpp.workers.pool import Workers

    resume = None
    if stored is not None and sequencer is not None:
        resume = {"workers": stored["workers"], "folder": os.path.dirname(args.restore) or "."}

    queries = [(name, pattern) for _, (pattern, _, name) in sorted(engine.sources.items())]
    opts = {k: v for k, v in caps.items() if v is not None and k != "max_held"}
    return Workers(queries, n, out, dead, full_events=bool(args.events),
                   feedback_limits=(engine.feedback.max_depth, engine.feedback.max_derived),
                   engine_opts={**opts, "strategy": engine.strategy}, live=live, max_delay=engine.max_delay,
                   max_held=engine.max_held, resume=resume, sequencer=sequencer, source=source)


class InputFeed:
    """The reader's batches of events, counted; an :class:`InputError` (a corrupt or truncated gzip
    stream) ends the feed like the end of the input — so the engine is flushed and the matches so far are
    written — and is kept for the exit status."""

    def __init__(self, batches: Iterable[list[Event]]):
        self.batches = batches
        self.count = 0
        self.error: InputError | None = None

    def __iter__(self) -> Iterator[list[Event]]:
        try:
            for batch in self.batches:
                self.count += len(batch)
                yield batch
        except InputError as e:
            self.error = e


def run_status(args: argparse.Namespace, events: InputFeed, dead: Counter[str], consumed: Counter[str],
               interrupted: bool) -> int:
    """The exit status of ``yfpp run``: 130 on Ctrl-C, 2 (raised) when the input broke off or held
    records but no event, 1 with ``--strict`` if there were dead letters, else 0.  ``dead`` counts the
    dead letters by reason; ``consumed``, those a restored checkpoint's run already reported."""
    if interrupted:
        print("yfpp: interrupted", file=sys.stderr)
        return 130
    if events.error is not None:
        raise events.error
    bad = dead + consumed
    if events.count == 0 and bad:
        reasons = ", ".join(f"{reason}: {n}" for reason, n in bad.most_common())
        raise YfppError(f"no events in {args.input}: {bad.total()} record(s) were dead letters ({reasons}); is --format right?")
    if args.strict and dead:
        print(f"yfpp: error: {dead.total()} dead letter(s) (--strict)", file=sys.stderr)
        return 1
    return 0


def _open_input(path: str) -> BinaryIO:
    try:
        return open(path, "rb")
    except OSError as e:
        raise YfppError(f"cannot read {path!r}: {e.strerror or e}") from e


def write_matches(engine: Any, batches: Iterable[list[Event]], out: MatchWriter, progress: Progress | None,
                  checkpoint: tuple[str, int, Callable[[], dict]] | None = None,
                  vocabulary: Vocabulary | None = None, catalog: Engine | None = None) -> int:
    """Stream batches of events through the engine (or a :class:`yfpp.workers.pool.Workers`), writing matches as they
    complete; return the event count.

    With ``checkpoint = (path, every, extra)`` the engine's state (and the fields ``extra()`` gives) is
    written to ``path`` every ``every`` events, after the matches written so far are flushed (workers: with
    ``catalog``, the engine holding their queries); ``vocabulary`` notes each batch's types and attribute names.
    """
    n = 0
    process = engine.process_batch
    every = checkpoint[1] if checkpoint else 0
    for batch in batches:
        if vocabulary is not None:
            vocabulary.note(batch)
        for part in _parts(batch, n, every):
            process(part, out)  # each event's matches written as it completes them (so before a Ctrl-C)
            n += len(part)
            if every and n % every == 0:
                from yfpp.state.checkpoint import write_checkpoint

                if isinstance(engine, Engine):
                    out.flush()
                    write_checkpoint(engine, checkpoint[0], checkpoint[2]())
                else:  # workers: each writes its engines, then the manifest (yfpp.workers.pool.Workers.checkpoint)
                    engine.checkpoint(checkpoint[0], catalog, checkpoint[2]())
        if progress is not None:
            progress.update(n, engine)
    engine.flush(out)  # (matches into the writer as they are made: the end can complete many windows)
    if progress is not None:
        progress.done(n, engine)
    return n


def _parts(batch: list[Event], n: int, every: int) -> list[list[Event]]:
    """``batch`` cut after each event that brings the count from ``n`` to a multiple of ``every`` (0: never)."""
    if not every:
        return [batch]
    starts = [0, *range(every - n % every, len(batch), every)]
    return [batch[a:b] for a, b in zip(starts, starts[1:] + [len(batch)])]


# --- explain ------------------------------------------------------------------------------


def cmd_explain(args: argparse.Namespace) -> int:
    from pathlib import Path

    from yfpp.output.explain import as_dot, as_json, as_text, nfa_graph, set_queries, write_picture

    if args.png and Path(args.png).suffix.lower() != ".png":
        raise YfppError(f"--png writes a PNG file: give a file name ending in .png, not {args.png!r}")
    for path, what in ((args.dot, "dot file"), (args.png, "picture")):
        if path:
            check_writable(path, what)
    engine = build_engine(args.query)
    if not (args.full or args.dot or args.png or args.format == "dot"):
        from yfpp.output.explain_summary import LIMIT, summary, summary_json, summary_text

        if len(engine.queries) + len(engine.set_queries) > LIMIT:
            s = summary(engine)
            print(summary_text(s) if args.format == "text" else summary_json(s))
            return 0
    g = nfa_graph(engine)
    sets = set_queries(engine)
    dot = as_dot(g, sets)
    print({"text": lambda: as_text(engine, g), "json": lambda: as_json(engine, g), "dot": lambda: dot.rstrip("\n")}[args.format]())
    if args.dot:
        Path(args.dot).write_text(dot, encoding="utf-8")
    if args.png:
        try:
            how = write_picture(g, dot, Path(args.png), sets)
        except RuntimeError as e:
            raise YfppError(str(e)) from e
        print(f"drew {args.png} with {how}", file=sys.stderr)
    return 0


def cmd_examples(args: argparse.Namespace) -> int:
    print(examples.listing())
    return 0


# --- generate -----------------------------------------------------------------------------


def cmd_generate(args: argparse.Namespace) -> int:
    from yfpp.input.generate import generate_rfid, generate_stock, write_events
    from yfpp.input.readers import format_of

    if args.kind == "stock":
        records = generate_stock(args.events, symbols=args.symbols, p_up=args.p_up, seed=args.seed)
    else:
        records = generate_rfid(args.events, tags=args.tags, zones=args.zones, doors=args.doors,
                                theft_rate=args.theft_rate, seed=args.seed)
    fmt = args.format or ("jsonl" if args.output == "-" else format_of(args.output))
    if fmt is None:
        raise YfppError(f"cannot tell the output format of {args.output!r}: name it .xml or .jsonl "
                        "(optionally .gz), or give --format xml|jsonl")
    if args.output != "-":
        check_writable(args.output, "output")
    elif sys.stdout is None:
        raise YfppError("standard output is closed: give an output file with -o FILE")
    write_events(records, sys.stdout if args.output == "-" else args.output, fmt)
    return 0


if __name__ == "__main__":
    sys.exit(main())
