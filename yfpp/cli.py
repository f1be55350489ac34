"""The ``yfpp`` command line: ``run``, ``generate`` (and more as they land)."""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from typing import Any, Iterable, Iterator, TextIO

from yfpp.dead_letters import DeadLetters
from yfpp.engine import Engine
from yfpp.errors import InputError, YfppError
from yfpp.events import Event
from yfpp.query_text import load_queries, parse_query
from yfpp.record_fields import MAX_DEPTH, MAX_RECORD_BYTES

RUN_EXAMPLES = """\
examples:
  yfpp run -q queries/shoplifting.sase -i yfpp/data/sample_rfid.xml
  yfpp run -q "[tag_id]&&//shelf//!register//exit&&(12 hours)" -i feed.jsonl --stats
  yfpp run -q queries/stock.sase -i ticks.xml --policy non_overlapping -o matches.jsonl
  cat feed.xml | yfpp run -q queries/shoplifting.xpe -i - --format xml
"""

GENERATE_EXAMPLES = """\
examples:
  yfpp generate stock --events 100000 --p-up 0.55 -o ticks.xml
  yfpp generate rfid --events 5000 --theft-rate 0.05 -o feed.jsonl
"""

EXPLAIN_EXAMPLES = """\
examples:
  yfpp explain -q queries/sharing.xpe
  yfpp explain -q queries/sharing.xpe --dot nfa.dot --png nfa.png
"""


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except YfppError as e:
        print(f"yfpp: error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 0
    except KeyboardInterrupt:  # Ctrl-C outside the input loop (which handles it itself)
        return 130


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="yfpp",
        description="Match event patterns (SASE+ or extended XPath) over XML / JSON-lines streams, many queries at once.",
        epilog="Run 'yfpp COMMAND --help' for a command's options and examples.",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser(
        "run",
        help="match queries over an input stream on this machine",
        description="Match queries over an event stream; print one JSON line per match (SPEC §5).",
        epilog=RUN_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    run.add_argument("-q", "--query", action="extend", nargs="+", required=True, metavar="QUERY_OR_FILE",
                     help="query text or a query file (.sase, .xpe, or any file: language from the text); repeatable")
    run.add_argument("-i", "--input", required=True, help="input file (.xml, .jsonl, optionally .gz) or - for stdin")
    run.add_argument("--format", choices=["xml", "jsonl"], help="input format (default: from the extension or content)")
    run.add_argument("-o", "--output", help="write matches here instead of stdout")
    run.add_argument("--policy", choices=["all", "non_overlapping", "earliest_maximal"],
                     help="output policy for every query (default: each query's own, else all); "
                          "earliest_maximal is for event-set queries")
    run.add_argument("--strategy", choices=["direct", "match-window"], default="direct",
                     help="evaluation strategy of event-set queries (docs/event_sets.md; default direct)")
    run.add_argument("--ts-field", default="ts", help="timestamp field name (default: ts)")
    run.add_argument("--ts-unit", default="s", help="timestamp unit: s, ms, us, ns, min, h (default: s)")
    run.add_argument("--type-field", metavar="NAME",
                     help="the event type is this JSON field / XML attribute or leaf child (default: JSON 'type', XML element name)")
    run.add_argument("--max-record-bytes", type=int, default=MAX_RECORD_BYTES, metavar="N",
                     help=f"a record (XML event element, JSON line) longer than this is a dead letter (default {MAX_RECORD_BYTES})")
    run.add_argument("--max-depth", type=int, default=MAX_DEPTH, metavar="N",
                     help=f"a record nested deeper than this is a dead letter (default {MAX_DEPTH})")
    run.add_argument("--strict", action="store_true", help="exit 1 if any record was a dead letter")
    run.add_argument("--max-delay", type=float, default=0.0, help="reorder buffer for out-of-order events, in seconds (default 0)")
    run.add_argument("--dead-letters", metavar="FILE", help="write malformed and late records here as JSON lines (default: stderr)")
    run.add_argument("--stats", action="store_true", help="print events/s, peak runs, buffer size and matches per query to stderr")
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
    gen.add_argument("--events", type=int, default=10000, help="number of events (default 10000)")
    gen.add_argument("-o", "--output", default="-", help="output file (.xml or .jsonl; default stdout)")
    gen.add_argument("--format", choices=["xml", "jsonl"], help="output format (default: from the extension, else jsonl)")
    gen.add_argument("--seed", type=int, default=0)
    gen.add_argument("--symbols", type=int, default=2, help="stock: number of symbols")
    gen.add_argument("--p-up", type=float, default=0.5, help="stock: probability that a price goes up")
    gen.add_argument("--tags", type=int, default=20, help="rfid: tag lifecycles under way at once")
    gen.add_argument("--zones", type=int, default=5, help="rfid: number of shelf zones")
    gen.add_argument("--doors", type=int, default=2, help="rfid: number of exit doors")
    gen.add_argument("--theft-rate", type=float, default=0.1, help="rfid: fraction of tags that skip the register")
    gen.set_defaults(func=cmd_generate)

    exp = sub.add_parser(
        "explain",
        help="show the shared NFA of a set of queries",
        description="Merge the queries into one shared NFA and print it: nodes, edges, which queries share what.",
        epilog=EXPLAIN_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    exp.add_argument("-q", "--query", action="extend", nargs="+", required=True, metavar="QUERY_OR_FILE")
    exp.add_argument("--dot", metavar="FILE", help="also write the graph in Graphviz DOT")
    exp.add_argument("--png", metavar="FILE", help="also draw it (Graphviz dot if installed, else matplotlib)")
    exp.set_defaults(func=cmd_explain)

    from yfpp.spark.cli import add_parser as add_spark_parser  # pyspark is imported only when 'spark' runs

    add_spark_parser(sub)
    return parser


# --- run ----------------------------------------------------------------------------------


def build_engine(query_args: Iterable[str], **engine_opts: Any) -> Engine:
    engine = Engine(**engine_opts)
    for arg in query_args:
        for name, text, language in load_queries(arg):
            try:
                engine.register(parse_query(text, language), name=name)
            except YfppError as e:
                raise YfppError(f"query {name!r}: {e}") from e
    return engine


def cmd_run(args: argparse.Namespace) -> int:
    from yfpp.readers import read_events

    dead = DeadLetters(args.dead_letters if args.dead_letters else sys.stderr)
    engine = build_engine(args.query, max_delay=args.max_delay, dead_letters=dead, policy=args.policy, strategy=args.strategy)
    if args.max_record_bytes < 1 or args.max_depth < 1:
        raise YfppError("--max-record-bytes and --max-depth must be positive")
    try:
        reader = read_events(args.input, args.format, ts_field=args.ts_field, ts_unit=args.ts_unit, type_field=args.type_field,
                             max_record_bytes=args.max_record_bytes, max_depth=args.max_depth, dead_letters=dead)
    except ValueError as e:  # an unknown --ts-unit
        raise YfppError(str(e)) from e
    events = InputFeed(reader)
    # Runs, buffer entries and events form no reference cycles: keep the cyclic collector from
    # rescanning millions of them (it took a third of the time on large runs).
    gc.freeze()
    gc.set_threshold(100_000, 50, 100)
    show = args.progress == "always" or (args.progress == "auto" and sys.stderr.isatty())
    out = open(args.output, "w", encoding="utf-8") if args.output else sys.stdout
    started = time.perf_counter()
    interrupted = False
    try:
        write_matches(engine, events, out, Progress(sys.stderr) if show else None)
    except KeyboardInterrupt:
        interrupted = True
    finally:
        if args.output:
            out.close()
        dead.close()
    if args.stats:
        print_stats(engine, events.count, time.perf_counter() - started, dead, sys.stderr)
    return run_status(args, events, dead, interrupted)


class InputFeed:
    """The reader's events, counted; an :class:`InputError` (a corrupt or truncated gzip stream) ends the
    feed like the end of the input — so the engine is flushed and the matches so far are written — and is
    kept for the exit status."""

    def __init__(self, events: Iterable[Event]):
        self.events = events
        self.count = 0
        self.error: InputError | None = None

    def __iter__(self) -> Iterator[Event]:
        try:
            for ev in self.events:
                self.count += 1
                yield ev
        except InputError as e:
            self.error = e


def run_status(args: argparse.Namespace, events: InputFeed, dead: DeadLetters, interrupted: bool) -> int:
    """The exit status of ``yfpp run``: 130 on Ctrl-C, 2 (raised) when the input broke off or held
    records but no event, 1 with ``--strict`` if there were dead letters, else 0."""
    if interrupted:
        print("yfpp: interrupted", file=sys.stderr)
        return 130
    if events.error is not None:
        raise events.error
    if events.count == 0 and dead.count:
        reasons = ", ".join(f"{reason}: {n}" for reason, n in dead.by_reason.most_common())
        raise YfppError(f"no events in {args.input}: {dead.count} record(s) were dead letters ({reasons}); is --format right?")
    if args.strict and dead.count:
        print(f"yfpp: error: {dead.count} dead letter(s) (--strict)", file=sys.stderr)
        return 1
    return 0


def write_matches(engine: Engine, events: Iterable[Event], out: TextIO, progress: "Progress | None") -> int:
    """Stream events through the engine, writing matches as JSON lines; return the event count."""
    n = 0
    dumps = json.dumps
    for ev in events:
        n += 1
        for m in engine.process(ev):
            out.write(dumps(m) + "\n")
        if progress is not None and n % 4096 == 0:
            progress.update(n, engine)
    for m in engine.flush():
        out.write(dumps(m) + "\n")
    if progress is not None:
        progress.done(n, engine)
    return n


class Progress:
    """A one-line progress display: events, rate, live runs, matches."""

    def __init__(self, stream: TextIO, every: float = 0.5):
        self.stream = stream
        self.every = every
        self.start = self.last = time.perf_counter()

    def update(self, n: int, engine: Engine, force: bool = False) -> None:
        now = time.perf_counter()
        if not force and now - self.last < self.every:
            return
        self.last = now
        c = engine.stats
        rate = n / max(now - self.start, 1e-9)
        self.stream.write(f"\r{n:,} events  {rate:,.0f} ev/s  {c.live_runs:,} runs  {sum(c.matches.values()):,} matches ")
        self.stream.flush()

    def done(self, n: int, engine: Engine) -> None:
        self.update(n, engine, force=True)
        self.stream.write("\n")


def print_stats(engine: Engine, n: int, elapsed: float, dead: DeadLetters, stream: TextIO) -> None:
    c = engine.stats
    lines = [
        f"events            {n:,}",
        f"elapsed           {elapsed:.3f} s",
        f"events/s          {n / max(elapsed, 1e-9):,.0f}",
        f"runs started      {c.runs_started:,}",
        f"run objects made  {c.runs_created:,}  (starts, splits, Kleene takes)",
        f"runs touched/ev   {c.runs_touched / max(n, 1):.2f}",
        f"peak runs         {c.peak_runs:,}",
        f"peak buffer       {c.peak_buffer:,} entries",
        f"dead letters      {dead.count:,}" + (f"  ({dict(dead.by_reason)})" if dead.count else ""),
        "matches per query:",
    ]
    for plan in engine.queries.values():
        lines.append(f"  {str(plan.name):<24} {c.matches.get(plan.name, 0):,}")
    for matcher in engine.set_queries.values():
        name = matcher.plan.name
        details = ", ".join(f"{k} {v:,}" for k, v in matcher.stats().items())
        lines.append(f"  {str(name):<24} {c.matches.get(name, 0):,}  (event sets, {engine.strategy}: {details})")
    stream.write("\n".join(lines) + "\n")


# --- explain ------------------------------------------------------------------------------


def cmd_explain(args: argparse.Namespace) -> int:
    from pathlib import Path

    from yfpp.explain import as_dot, as_text, nfa_graph, write_picture

    engine = build_engine(args.query)
    g = nfa_graph(engine)
    print(as_text(engine, g))
    for matcher in engine.set_queries.values():  # not part of the shared NFA
        print(f"{matcher.plan.name}: event-set query, evaluated by its own matcher (docs/event_sets.md)")
    dot = as_dot(g)
    if args.dot:
        Path(args.dot).write_text(dot, encoding="utf-8")
    if args.png:
        try:
            how = write_picture(g, dot, Path(args.png))
        except RuntimeError as e:
            raise YfppError(str(e)) from e
        print(f"drew {args.png} with {how}", file=sys.stderr)
    return 0


# --- generate -----------------------------------------------------------------------------


def cmd_generate(args: argparse.Namespace) -> int:
    from yfpp.generate import generate_rfid, generate_stock, write_events

    if args.kind == "stock":
        records = generate_stock(args.events, symbols=args.symbols, p_up=args.p_up, seed=args.seed)
    else:
        records = generate_rfid(args.events, tags=args.tags, zones=args.zones, doors=args.doors,
                                theft_rate=args.theft_rate, seed=args.seed)
    out = sys.stdout if args.output == "-" else args.output
    fmt = args.format or (None if args.output != "-" else "jsonl")
    write_events(records, out, fmt)
    return 0


if __name__ == "__main__":
    sys.exit(main())
