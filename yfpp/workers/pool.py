"""``yfpp run --workers N``: one stream matched by N engine processes (docs/operations.md, "Workers").

The queries are grouped by the plan ``yfpp spark`` uses (:mod:`yfpp.spark.plan`): a **keyed** group's
events go to the worker of their equivalence-key value (its hash modulo N; an event lacking the key
goes nowhere), an unkeyed group with a window is cut into **time slices** overlapping by its largest
window (:class:`~yfpp.spark.plan.Slicing`, slices dealt round-robin, each slice's engine keeping the
matches that start in it), and a **whole** group (no window, or ``non_overlapping`` without a key) runs
in one worker. Each worker runs one engine per group and slice; together they find one engine's matches.

A regular JSON-lines file (no ``--max-delay``, checkpoint or progress line) is read by the workers
themselves, each block scanned by one of them and each worker parsing only its own lines
(:mod:`yfpp.workers.reading`; an XML file of one event element a line likewise:
:mod:`yfpp.workers.xml_reading`): shipping a parsed event costs more CPU than reading it (benchmarks/RESULTS.md,
"Workers"). Otherwise — a pipe or an MQTT feed, which can be
read once, other XML, a checkpoint — the parent reads and parses the input with the one reader and puts the events
through one engine's reorder buffer (:class:`Sequencer`: ``seq`` numbers, dead letters, late events and
stream order are one engine's), routes them — compact tuples ``(type, ts, attrs, seq[, xml])`` per engine,
pickled. Each worker encodes its matches as the output's lines (:class:`~yfpp.output.writer.LineEncoder`) and the
parent writes the bytes as they come, each worker's in its stream order (so per key in stream order). A worker
sends its scans and results over pipes from its matching thread (:mod:`yfpp.workers.pipes`: no feeder thread).
"""

from __future__ import annotations

import gc
import json
import multiprocessing
import os
import queue
import signal
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Callable, Sequence

from lxml import etree

from yfpp.engine import Engine
from yfpp.errors import YfppError
from yfpp.input.dead_letters import DeadLetters
from yfpp.input.events import MISSING, Event
from yfpp.state.checkpoint import write_checkpoint, write_json
from yfpp.state.memory_cap import RARE_COLLECTIONS
from yfpp.output.stats import run_figures
from yfpp.output.writer import LineEncoder
from yfpp.input.record_fields import ReaderOptions
from yfpp.spark.plan import Group, Runner, Slicing, XmlEvent, group_queries, needs_xml
from yfpp.workers.pipes import Inbox, Outbox
from yfpp.workers.reading import (KeptDeadLetters, Share, common_reads, compiled_spec, file_format, file_head, last_ts,
                                  plan_slices, reads_itself)
from yfpp.workers.xml_reading import XmlShare, last_xml_ts, reads_xml_itself

WORKERS = Runner("with --workers", "run with --workers 1")
#: at most about this many events per time slice of an unkeyed group (at least its window long): short enough that
#: the slices deal about evenly to the workers (what a slice costs more: its window's events read twice, an engine
#: made, ~0.15 ms a query; benchmarks/RESULTS.md "Workers")
SLICE_EVENTS = 5_000
SEND_ROWS = 4096  #: rows gathered before they are sent (the readers' batches can be a few dozen events)
INBOX = 64  #: messages a worker's inbox holds before the reader waits (so it can run ahead of a busy worker)
_POLL = 0.5  #: seconds between checks that the workers are alive while the reader waits


def _context(forked: bool = False) -> Any:
    """``forkserver`` where there is one (one process imports yfpp, each worker is forked from it: a worker starts
    in milliseconds, not the half second of an import), else ``spawn``; never a plain fork of a threaded parent.
    ``forked``: a plain ``fork`` of this process while it has one thread (workers that read the input start
    at once, not after the fork server's import of yfpp, which is most of a second)."""
    methods = multiprocessing.get_all_start_methods()
    if forked and "fork" in methods and threading.active_count() == 1:
        return multiprocessing.get_context("fork")
    if "forkserver" not in methods:
        return multiprocessing.get_context("spawn")
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["yfpp.workers.pool"])
    return ctx


def worker_count(text: str) -> int:
    """``--workers``' value: a count of at least 1, or ``auto``: the cores this process may run on."""
    if text == "auto":
        return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    try:
        n = int(text)
    except ValueError:
        raise YfppError(f"--workers takes a number of processes or 'auto', not {text!r}") from None
    if n < 1:
        raise YfppError(f"--workers must be at least 1, got {n}")
    return n


class Workers:
    """N worker processes matching ``queries`` (``[(name, pattern)]`` in registration order).

    :meth:`process_batch` routes a batch of the reader's events (an ``out`` is taken, as
    :meth:`Engine.process_batch` takes one, but matches go to the ``out`` given to the constructor,
    from a collector thread, as the workers send them: ``out.write_encoded`` takes the lines its ``out.encoder``
    made in the workers); :meth:`flush` ends the stream, waits for the
    workers and returns their ``--stats`` figures summed. ``engine_opts``: the workers' engines'
    options (caps, ``merge_runs``, ``strategy``); ``dead``: where late events and the workers' dead
    letters (events whose processing failed) are reported; ``slice_events``: see :data:`SLICE_EVENTS`;
    ``live``: the input is live (a pipe, a socket), so each batch is sent at once rather than gathered;
    ``max_delay``, ``max_held``: the reorder buffer's, as one engine's (:class:`Sequencer`); ``resume``: a
    checkpoint's data (:meth:`checkpoint`) and the ``folder`` of its files, with its restored ``sequencer``;
    ``source``: an input file, its format (None: from its name or first byte) and its reader options, which
    the workers read themselves where :func:`yfpp.workers.reading.reads_itself` says they can (then
    :attr:`source` is kept: no batch is routed, :meth:`flush` waits for the workers, and :attr:`events` and
    :attr:`vocabulary` are what they read).
    """

    def __init__(self, queries: Sequence[tuple[Any, Any]], n: int, out: Any, dead: DeadLetters, *,
                 full_events: bool = False, feedback_limits: tuple[int, int] | None = None,
                 engine_opts: dict[str, Any] | None = None, slice_events: int = SLICE_EVENTS, live: bool = False,
                 max_delay: float = 0.0, max_held: int | None = None, resume: dict[str, Any] | None = None,
                 sequencer: Sequencer | None = None, source: tuple[str, str | None, ReaderOptions] | None = None):
        limits = {"feedback_limits": feedback_limits} if feedback_limits is not None else {}
        self.groups = group_queries(queries, full_events=full_events, runner=WORKERS, **limits)
        self.names = [str(name) for name, _ in queries]
        self.n = n
        self.out = out
        self.dead = dead
        self.xml = needs_xml(self.groups)
        self.slice_events = slice_events
        self.live = live
        self._parts: list[dict[tuple[int, int], list[tuple]]] = [{} for _ in range(n)]  # rows not sent yet
        self._pending = 0
        self.slicings: dict[int, Slicing | None] = {}  # a sliced group's, fixed at the first batch
        self._open = {g: 0 for g, grp in enumerate(self.groups) if grp.sliced}  # its first slice not yet closed
        self._mark = float("-inf")  # the stream time: the ts of the last event routed
        self._sequencer = sequencer or Sequencer(max_delay=max_delay, max_held=max_held, dead_letters=dead)
        self._error: str | None = None  # a worker's failure
        self._failure: BaseException | None = None  # the collector's failed write
        self.stats = Tally()  # for the progress line: the matches written so far
        self._acked = threading.Condition()  # the workers that wrote their part of a checkpoint
        self._acks = 0
        self._files: list[str] = []  # the workers' files of the last checkpoint
        self._figures: list[dict] = []
        self._cpu: list[float] = []  # each worker's CPU seconds, as it ended
        head = file_head(source[0]) if source is not None else None  # (None: not a regular, uncompressed file)
        share = None if source is None or head is None else Share if reads_itself(*source, self.groups, head) else \
            XmlShare if reads_xml_itself(*source, self.groups, head) else None
        spec = compiled_spec(source[2], self.groups, head, os.path.getsize(source[0])) if share is Share else None
        if spec is not None:
            share = partial(Share, spec=spec)
        self.source = source if share is not None else None
        #: how the workers read the input: each scans every block itself (``compiled line scan``), one scans each
        #: block for the others (``scans relayed``), or the parent reads it and sends them the events (``parent``)
        self.reading = "parent" if share is None else "scans relayed" if spec is None else "compiled line scan"
        #: the ts of the last event of a file the parent reads, where its last lines tell (the slices planned to it)
        self._last = _last_event_ts(*source, head) if head is not None and share is None and self._open else None
        self.events = 0  #: the events the workers read (when they read the input)
        self.vocabulary: dict[str, set[str]] = {}  #: the attribute names per type they saw (likewise)
        ctx = _context(forked=self.source is not None)
        results = [ctx.Pipe(duplex=False) for _ in range(n)]  # (a pipe each: written a message at a time)
        self._results = Inbox([r for r, _ in results])
        ends: list[Any] = [w for _, w in results]
        if self.source is None:  # (the parent's messages: a bounded queue, so that it can run ahead of a busy worker)
            self._inboxes = [ctx.Queue(INBOX) for _ in range(n)]
            jobs = [(_work, (i, self._inboxes[i], (results[i][1], out.encoder), self.groups, engine_opts or {}))
                    for i in range(n)]
        else:  # (a worker's inbox pipe holds the scans the others send it)
            self._inboxes = []
            pipes = [ctx.Pipe(duplex=False) for _ in range(n)]
            ends += [end for pipe in pipes for end in pipe]
            jobs = [(_read_work, (i, (pipes[i][0], [w for _, w in pipes]), (source[0], source[2], share),
                                  (results[i][1], out.encoder), self.groups, engine_opts or {}, slice_events))
                    for i in range(n)]
        self._procs = [ctx.Process(target=target, args=args, name=f"yfpp-worker-{i}", daemon=True)
                       for i, (target, args) in enumerate(jobs)]
        for p in self._procs:
            p.start()
        for end in ends:  # (the workers' ends: once the workers are gone, the results pipe reads as ended)
            end.close()
        self._started = False
        self._collector = threading.Thread(target=self._collect, name="yfpp-collector", daemon=True)
        self._collector.start()
        if resume is not None:
            self._resume(resume["workers"], resume["folder"])

    # --- routing ----------------------------------------------------------------------------

    def process_batch(self, batch: list[Event], out: Any = None) -> Any:
        """Route one batch of events (``seq`` set) to the workers, in stream order; ``out`` is returned as it is.
        The rows are sent once :data:`SEND_ROWS` are pending (with a live input, at each batch)."""
        self._sequencer.process_batch(batch, [])
        self._route(self._sequencer.take())
        if self._pending >= SEND_ROWS or (self.live and self._started):
            self._send(self._closing(self._mark))
        return out

    def _route(self, events: list[Event]) -> None:
        """Events in stream order (the sequencer's) into the pending rows of the workers."""
        if not events:
            return
        if not self._started:
            self._start(events)
        self._mark = events[-1].ts
        if self.xml:
            rows = [(ev.type, ev.ts, ev.attrs, ev.seq, etree.tostring(ev.element, encoding="unicode")) for ev in events]
        else:
            rows = [(ev.type, ev.ts, ev.attrs, ev.seq) for ev in events]
        for g, grp in enumerate(self.groups):
            if grp.key:
                self._route_keyed(g, grp.key, events, rows)
            elif grp.sliced and (sl := self.slicings[g]) is not None:
                parts, n = self._parts, self.n
                if (reads := common_reads(sl, events)) is not None:  # (all read by the same slices: at once)
                    for s in reads:
                        parts[(s + g) % n].setdefault((g, s), []).extend(rows)
                else:
                    for ev, row in zip(events, rows):
                        for s in sl.reads(ev.ts):
                            parts[(s + g) % n].setdefault((g, s), []).append(row)
            else:
                self._parts[g % self.n].setdefault((g, 0), []).extend(rows)
        self._pending += len(rows)

    def _route_keyed(self, g: int, key: tuple[str, ...], events: list[Event], rows: list[tuple]) -> None:
        """Each row of an event with the key to the worker of its key value's hash (a one-attribute key: the hash of
        the value, read without building a tuple)."""
        n = self.n
        lists = [self._parts[w].setdefault((g, 0), []) for w in range(n)]
        if len(key) == 1:
            a = key[0]
            for ev, row in zip(events, rows):
                v = ev.attrs.get(a, MISSING)
                if v is MISSING and (v := ev.get(a)) is MISSING:
                    continue
                try:
                    h = hash(v)
                except TypeError:
                    h = _hash(v)
                lists[h % n].append(row)
        else:
            for ev, row in zip(events, rows):
                k = tuple(ev.get(x) for x in key)
                if MISSING not in k:
                    lists[_hash(k) % n].append(row)

    def _send(self, closes: list[list[tuple[int, int]]]) -> None:
        """The pending rows (and the slices to close) to the workers."""
        for i in range(self.n):
            routed = [(target, rows) for target, rows in self._parts[i].items() if rows]
            if routed or closes[i]:
                self._put(i, (routed, closes[i]))
            self._parts[i] = {}
        self._pending = 0

    def _start(self, batch: list[Event]) -> None:
        """Fix each sliced group's slices: from the first event's ts, about so many events long
        (``slice_events``) at the first batch's rate, at least the group's window (None: one slice, when the window is
        0); where the input file's last event is known, as many up to it as deal evenly to the workers."""
        self.slicings.update(plan_slices(self.groups, self._open, [ev.ts for ev in batch], self.slice_events,
                                         self._last, self.n))
        self._begin()

    def _begin(self, restore: Sequence[str | None] | None = None) -> None:
        """The workers' first message: the slicings, and each one's checkpoint file to restore."""
        for i in range(self.n):
            self._put(i, {"slicings": dict(self.slicings), "restore": restore[i] if restore else None})
        self._started = True

    def _closing(self, ts: float, end: bool = False) -> list[list[tuple[int, int]]]:
        """Per worker, the slices no event at ``ts`` or later reads (``end``: every slice): their engines are
        flushed and dropped."""
        closes: list[list[tuple[int, int]]] = [[] for _ in range(self.n)]
        for g, first in self._open.items():
            sl = self.slicings[g]
            if sl is None:
                continue
            upto = (sl.own(ts) + 1 if ts > float("-inf") else first) if end else sl.reads(ts).start
            for s in range(first, upto):
                closes[(s + g) % self.n].append((g, s))
            self._open[g] = max(first, upto)
        return closes

    def _put(self, i: int, msg: Any) -> None:
        """``msg`` into worker ``i``'s inbox, waiting while it is full; a worker's failure is raised here."""
        while True:
            self._check()
            try:
                self._inboxes[i].put(msg, timeout=_POLL)
                return
            except queue.Full:
                if not self._procs[i].is_alive():
                    self._check()
                    raise YfppError(f"worker {i} stopped (exit status {self._procs[i].exitcode})")

    def _check(self) -> None:
        """Raise what stopped the run: a failed write of matches as it was raised, a worker's failure as an error."""
        if self._failure is not None:
            raise self._failure
        if self._error is not None:
            raise YfppError(self._error)

    # --- results ----------------------------------------------------------------------------

    def _collect(self) -> None:
        """The collector thread: the workers' matches into ``out``, their dead letters into ``dead``."""
        done = 0
        while done < self.n:
            try:
                i, kind, payload = self._results.get()
            except (EOFError, OSError):
                return
            if kind == "matches":
                lines, counts, dead = payload
                try:
                    for report in dead:
                        self.dead.report(*report)
                    if counts:
                        self.out.write_encoded(lines, sum(counts.values()))
                        self.stats.matches.update(counts)
                except BaseException as e:  # a failed write (a full disk, the reader gone): the run stops
                    self._failure = e
                    return
            elif kind == "read":
                events, names = payload
                self.events += events
                for t, attrs in names.items():
                    self.vocabulary.setdefault(t, set()).update(attrs)
            elif kind == "checkpointed":
                with self._acked:
                    self._acks += 1
                    self._acked.notify()
            elif kind == "done":
                self._cpu.append(round(payload.pop("cpu_s"), 3))
                self._figures.append(payload)
                done += 1
            else:
                self._error = self._error or f"worker {i}: {payload}"
                return

    def flush(self, out: Any = None) -> Any:
        """End of the stream: every worker flushes its engines; wait for their last matches (``out`` is returned)."""
        if self.source is None:
            self._end()
        while self._collector.is_alive():
            self._collector.join(_POLL)
            stopped = [(i, p.exitcode) for i, p in enumerate(self._procs) if p.exitcode not in (None, 0)]
            if stopped and self._collector.is_alive():  # (a worker that ends well has sent all it had)
                self._error = self._error or f"worker {stopped[0][0]} stopped (exit status {stopped[0][1]})"
                break
        self._check()
        for p in self._procs:
            p.join()
        return out

    def _end(self) -> None:
        """The last events routed, every slice closed, and the end of the stream to every worker."""
        self._sequencer.flush([])
        self._route(self._sequencer.take())
        if not self._started:
            self._start([])
        self._send(self._closing(self._mark, end=True))
        for i in range(self.n):
            self._put(i, None)

    def checkpoint(self, path: str, catalog: Engine, extra: dict[str, Any]) -> None:
        """Write a checkpoint: each worker's engines to ``PATH.wI.K`` (K counts the checkpoints), then — once every
        worker wrote its file and its matches before it were written and flushed — the manifest ``path``:
        ``catalog``'s snapshot (the queries and options, as one engine's checkpoint) with ``extra`` and
        ``"workers"``: their count and files, the reorder buffer's state, the slicings. A crash leaves the
        previous manifest and the files it names intact (the older files are removed after the rename)."""
        if not self._started:
            self._start([])
        self._send(self._closing(self._mark))
        name = os.path.basename(path)
        generation = int(self._files[0].rsplit(".", 1)[1]) + 1 if self._files else 1
        files = [f"{name}.w{i}.{generation}" for i in range(self.n)]
        folder = os.path.dirname(path) or "."
        with self._acked:
            self._acks = 0
        for i, f in enumerate(files):
            self._put(i, os.path.join(folder, f))
        with self._acked:
            while self._acks < self.n:
                self._check()
                if not all(p.is_alive() for p in self._procs):
                    raise YfppError("a worker stopped before it wrote its checkpoint")
                self._acked.wait(_POLL)
        self.out.flush()
        write_checkpoint(catalog, path, {**extra, "workers": {
            "n": self.n, "files": files, "sequencer": self._sequencer.snapshot(), "mark": self._mark,
            "slicings": {str(g): None if sl is None else [sl.t0, sl.length, sl.window] for g, sl in self.slicings.items()},
            "open": {str(g): s for g, s in self._open.items()}}})
        for old in self._files:
            try:
                os.unlink(os.path.join(folder, old))
            except OSError:
                pass
        self._files = files

    def _resume(self, saved: dict[str, Any], folder: str) -> None:
        """Start from a checkpoint's ``"workers"`` entry (its files in ``folder``)."""
        try:
            self.slicings = {int(g): None if sl is None else Slicing(*sl) for g, sl in saved["slicings"].items()}
            self._open = {int(g): int(s) for g, s in saved["open"].items()}
            self._mark = float(saved["mark"])
            files = [os.path.join(folder, f) for f in saved["files"]]
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise YfppError(f"corrupt checkpoint: bad 'workers' entry ({e})") from None
        if set(self.slicings) != set(self._open) or len(files) != self.n:
            raise YfppError("corrupt checkpoint: its 'workers' entry does not fit its queries")
        missing = [f for f in files if not os.path.isfile(f)]
        if missing:
            raise YfppError(f"cannot read checkpoint {missing[0]}: No such file (a worker's part of the checkpoint)")
        self._files = list(saved["files"])
        self._begin(files)

    def figures(self, events: int, elapsed: float) -> dict[str, Any]:
        """The ``--stats`` figures of the run (:func:`yfpp.output.stats.run_figures`' keys), summed over the
        workers' engines (peaks too: an upper bound of what was held at once); ``dead_letters`` are the parent's."""
        total: dict[str, Any] = {}
        for f in self._figures:
            _add(total, f)
        touched = total.pop("runs_touched", 0)
        matches = total.get("matches", {})
        shed = total.get("runs_shed", {})
        return {
            "events": events,
            "elapsed_s": round(elapsed, 6),
            "events_per_s": round(events / max(elapsed, 1e-9), 1),
            "runs_started": total.get("runs_started", 0),
            "runs_created": total.get("runs_created", 0),
            "runs_touched_per_event": round(touched / max(events, 1), 4),
            "peak_runs": total.get("peak_runs", 0),
            "peak_buffer": total.get("peak_buffer", 0),
            "dead_letters": self.dead.count,
            "dead_letters_by_reason": dict(self.dead.by_reason),
            "failed_events": total.get("failed_events", 0),
            "runs_shed": {name: shed.get(name, 0) for name in self.names},
            "derived_events": total.get("derived_events", 0),
            "derived_dropped": total.get("derived_dropped", 0),
            "matches": {name: matches.get(name, 0) for name in self.names},
            "event_sets": total.get("event_sets", {}),
            "workers": self.n,
            "worker_cpu_s": sorted(self._cpu, reverse=True),
            "workers_reading": self.reading,
        }

    def close(self) -> None:
        """Stop the workers (after :meth:`flush`, they have stopped already)."""
        for p in self._procs:
            if p.is_alive():
                p.terminate()
        for p in self._procs:
            p.join()
            p.close()  # (its sentinel's file descriptors)
        for q in self._inboxes:
            q.cancel_join_thread()
            q.close()
        self._collector.join(_POLL)  # (it reads the end of the results pipe, every worker gone)
        self._results.close()  # (a collector still busy, writing matches, finds it closed when it reads again)


class Sequencer(Engine):
    """An engine without queries whose events come out in stream order (:meth:`take`): one engine's numbering,
    reorder buffer (``max_delay``, ``max_held``) and late events (reported to its dead letters), before the
    routing — so N workers see the events one engine would match, in its order."""

    def __init__(self, **opts: Any):
        self.released: list[Event] = []
        super().__init__(**opts)

    def _route_events(self) -> None:
        """Every event released in stream order goes to :attr:`released` (there is no query to match)."""
        self._plain = True
        self._one, self._into = self._keep, self._keep_into

    def _keep(self, ev: Event) -> list[dict]:
        self.released.append(ev)
        return []

    def _keep_into(self, ev: Event, out: Any) -> Any:
        self.released.append(ev)
        return out

    def take(self) -> list[Event]:
        """The events released since the last call, in stream order."""
        out, self.released = self.released, []
        return out

    @property
    def watermark(self) -> tuple[float, float]:
        """The (ts, seq) of the last event released: an event below it is late."""
        return self._mark

    def skip_to(self, ts: float, seq: float, next_seq: int) -> None:
        """The watermark after events released elsewhere (read by another worker), the last at (``ts``, ``seq``),
        and the next ``seq`` to give; only for an empty reorder buffer without delay."""
        self._mark = (ts, seq)
        self._next_seq = next_seq


@dataclass
class Tally:
    """What the progress line shows of a run with workers: no live runs (they are the workers'), the matches."""

    live_runs: int = 0
    matches: Counter = field(default_factory=Counter)


def _last_event_ts(path: str, fmt: str | None, opts: ReaderOptions, head: bytes) -> float | None:
    """The ts of the last event of ``path``, a regular, uncompressed JSON-lines or XML file (``fmt``: its format,
    None: from its name or first byte; ``head``: its :func:`~yfpp.workers.reading.file_head`), where its last lines
    tell; else None."""
    fmt = file_format(path, fmt, head)
    if fmt not in ("jsonl", "xml"):
        return None
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        return (last_ts if fmt == "jsonl" else last_xml_ts)(f.fileno(), size, opts)


def _hash(key: tuple) -> int:
    """The routing hash of a key value (one of unhashable values, such as a list, by its JSON text)."""
    try:
        return hash(key)
    except TypeError:
        return hash(json.dumps(key, sort_keys=True, default=str))


def _add(total: dict[str, Any], part: dict[str, Any]) -> None:
    """``part``'s numbers added into ``total``, nested dicts key by key."""
    for k, v in part.items():
        if isinstance(v, dict):
            _add(total.setdefault(k, {}), v)
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            total[k] = total.get(k, 0) + v
        else:
            total.setdefault(k, v)


# --- the worker process ------------------------------------------------------------------------


class _Matching:
    """A worker's engines per (group, slice), made as events come for them; the matches a slice's engine makes
    are kept when they start in it. ``slicings``: the sliced groups' (a dict filled once they are fixed)."""

    def __init__(self, groups: list[Group], engine_opts: dict[str, Any], dead: DeadLetters,
                 slicings: dict[int, Slicing | None], restore: str | None = None):
        self.groups, self.engine_opts, self.dead, self.slicings = groups, engine_opts, dead, slicings
        self.engines: dict[tuple[int, int], Engine] = {}
        self.figures: dict[str, Any] = {}
        self.kept: Counter[str] = Counter()
        self.events = 0
        if restore is not None:  # the engines, figures and match counts of a checkpoint
            with open(restore, encoding="utf-8") as f:
                saved = json.load(f)
            self.engines = {(g, s): Engine.restore(snap, dead_letters=dead) for g, s, snap in saved["engines"]}
            self.figures, self.kept, self.events = saved["figures"], Counter(saved["kept"]), saved["events"]

    def feed(self, routed: Any, closes: list[tuple[int, int]], out: list[dict]) -> None:
        """``routed``: ((group, slice), events) pairs, matched by their engines; then the ``closes`` slices'
        engines flushed and dropped; the matches kept into ``out``."""
        for (g, s), events in routed:
            eng = self.engines.get((g, s))
            if eng is None:
                eng = self.engines[(g, s)] = self.groups[g].engine(dead_letters=self.dead, **self.engine_opts)
            self.events += len(events)
            self._keep(eng.process_batch(events, []), g, s, out)
        for g, s in closes:
            eng = self.engines.pop((g, s), None)
            if eng is not None:
                self._keep(eng.flush(), g, s, out)
                self._retire(eng)

    def finish(self) -> list[dict]:
        """The end of the stream: every engine flushed; their matches."""
        out: list[dict] = []
        self.feed((), list(self.engines), out)
        return out

    def write(self, path: str) -> None:
        """This worker's state into the file ``path`` (its part of a checkpoint)."""
        write_json({"engines": [[g, s, eng.snapshot()] for (g, s), eng in self.engines.items()],
                    "figures": self.figures, "kept": self.kept, "events": self.events}, path)

    def _keep(self, found: list[dict], g: int, s: int, into: list[dict]) -> None:
        sl = self.slicings.get(g)
        for m in found:
            if sl is None or sl.own(m["start"]) == s:
                into.append(m)
                self.kept[str(m["query"])] += 1

    def _retire(self, eng: Engine) -> None:
        f = run_figures(eng, 0, 0.0, self.dead)
        f["runs_touched"] = eng.stats.runs_touched
        for k in ("events", "elapsed_s", "events_per_s", "runs_touched_per_event", "dead_letters",
                  "dead_letters_by_reason", "matches"):
            del f[k]
        _add(self.figures, f)


def _prepare() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    gc.freeze()  # as yfpp run: runs, buffered events and matches form no reference cycles
    gc.set_threshold(*RARE_COLLECTIONS)


def _sent(encoder: LineEncoder, matches: list[dict], dead: KeptDeadLetters) -> tuple[Any, dict[str, int], list[tuple]]:
    """A ``"matches"`` message's payload: the matches encoded as the output's lines, their count per query, and the
    dead letters reported since the last."""
    return encoder.encode(matches), Counter(str(m["query"]) for m in matches), dead.take()


def _work(index: int, inbox: Any, sending: tuple[Any, LineEncoder], groups: list[Group],
          engine_opts: dict[str, Any]) -> None:
    """A worker fed by the parent: engines per (group, slice) fed the routed rows; matches (a slice's: those
    starting in it, encoded) and dead letters back after each message; its state into a file at a checkpoint (a
    message that is a path); the figures at the end. Its first message gives the slicings and the file to restore,
    if any. ``sending``: the writing end of the results pipe and the encoder of the matches."""
    _prepare()
    results, encoder = Outbox(sending[0], index, exclusive=True), sending[1]
    try:
        dead = KeptDeadLetters()
        start = inbox.get()
        matching = _Matching(groups, engine_opts, dead, start["slicings"], start["restore"])
        while (msg := inbox.get()) is not None:
            if type(msg) is str:  # a checkpoint: this worker's state into the file msg names
                matching.write(msg)
                results.put((index, "checkpointed", msg))
                continue
            routed, closes = msg
            out: list[dict] = []
            matching.feed((((g, s), [Event(*r) if len(r) == 4 else XmlEvent(*r) for r in rows])
                           for (g, s), rows in routed), closes, out)
            results.put((index, "matches", _sent(encoder, out, dead)))
        results.put((index, "matches", _sent(encoder, matching.finish(), dead)))
        results.put((index, "done", {**matching.figures, "matches": dict(matching.kept), "cpu_s": time.process_time()}))
    except BaseException as e:  # the parent reports it and stops the run
        results.put((index, "error", f"{type(e).__name__}: {e}"))


def _read_work(index: int, pipes: tuple[Any, list[Any]], source: tuple[str, ReaderOptions, Callable[..., Share]],
               sending: tuple[Any, LineEncoder], groups: list[Group], engine_opts: dict[str, Any],
               slice_events: int) -> None:
    """A worker that reads the input itself (``source``: the file, its reader options and the
    :class:`yfpp.workers.reading.Share` or :class:`yfpp.workers.xml_reading.XmlShare` that reads it;
    ``pipes``: the reading end of its inbox, of the scans the others send it, and the writing end of each worker's):
    its share of each block matched; matches (encoded) and dead letters back every :data:`SEND_ROWS` events or so;
    at the end the count of the events it reported and the names it saw (``"read"``), then the figures."""
    _prepare()
    inbox = Inbox([pipes[0]])
    inboxes = [inbox if w == index else Outbox(end, index, inbox) for w, end in enumerate(pipes[1])]
    results, encoder = Outbox(sending[0], index, inbox, exclusive=True), sending[1]
    try:
        dead = KeptDeadLetters()
        slicings: dict[int, Slicing | None] = {}
        share = source[2](source[0], source[1], groups, index, len(inboxes), slice_events, dead,
                      Sequencer(dead_letters=dead if index == 0 else DeadLetters()), slicings, inboxes)
        matching = _Matching(groups, engine_opts, dead, slicings)
        out: list[dict] = []
        sent = 0
        for routed, closes in share.blocks():
            matching.feed(routed.items(), closes, out)
            if matching.events - sent >= SEND_ROWS or len(out) >= SEND_ROWS:
                results.put((index, "matches", _sent(encoder, out, dead)))
                out, sent = [], matching.events
        out.extend(matching.finish())
        results.put((index, "matches", _sent(encoder, out, dead)))
        results.put((index, "read", (share.events, share.vocabulary.attrs)))
        results.put((index, "done", {**matching.figures, "matches": dict(matching.kept), "cpu_s": time.process_time()}))
    except BaseException as e:  # the parent reports it and stops the run
        results.put((index, "error", f"{type(e).__name__}: {e}"))
