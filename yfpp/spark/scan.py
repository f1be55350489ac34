"""The scan plan of a batch job: every task reads the whole input itself and runs only its share.

Task ``i`` of ``n`` opens the input files (local paths) in path order with
``yfpp``'s own readers — the same events, seq numbers, dead letters and late
events (``max_delay`` 0) as ``yfpp run`` — and feeds the engines of the
routes :func:`yfpp.spark.batch.routes` would send it: a keyed group's events
whose key hash (:func:`value_hash`) modulo ``n`` is ``i``, a
whole group when its number modulo ``n`` is ``i``, and a sliced group's slices
``s`` with ``(s + g) mod n = i``. One Spark stage, no shuffle, no row in the
JVM; the input is read and parsed ``n`` times. Only task 0 reports the dead
letters (each once). Inputs the executors cannot open as local files
(``hdfs://``, ``s3a://``, …) take the shuffle plan (:func:`yfpp.spark.inputs.choose_plan`).

A sliced group's slices start at the stream's first event and are each at
least :data:`SLICE_WINDOWS` windows and the span of the first
:data:`SLICE_EVENTS` events long: chosen from the stream alone, so every task
agrees without a pass to find the time range (see :func:`slicing_of`).
"""

from __future__ import annotations

import json
import time
import zlib
from typing import Any, Callable, Iterator, Sequence

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.pandas.types import from_arrow_schema

from yfpp.input.dead_letters import DeadLetters
from yfpp.engine import Engine, event_raw, late_reason
from yfpp.input.events import MISSING, PSEUDO_ATTRS, Event
from yfpp.runtime.feedback import MAX_DEPTH, MAX_DERIVED
from yfpp.input.readers import read_event_batches
from yfpp.input.record_fields import ISO_UNIT_NAME
from yfpp.spark.batch import _ARROW_SCHEMA, _ID_ARROW_SCHEMA, _batch
from yfpp.spark.hot_keys import HotKeys, sliceable
from yfpp.spark.inputs import local_path
from yfpp.spark.parse import reader_kwargs
from yfpp.spark.plan import Group, Slicing, effective_queries, group_queries, match_row, rare_collections
from yfpp.spark.read import split_offsets

#: The dead-letter columns after the match columns (``dead_seq`` is the record's seq).
DEAD_COLUMNS = [("dead_seq", pa.int64()), ("position", pa.string()), ("reason", pa.string()), ("raw", pa.string())]
#: A sliced group's slices span at least this many windows (the overlap read twice is 1/SLICE_WINDOWS) …
SLICE_WINDOWS = 4
#: … and at least the time span of the stream's first SLICE_EVENTS events, or SLICE_EVENTS_PER_QUERY
#: per query of the group if more: each slice's engine compiles the group's queries anew (~1 ms a query).
SLICE_EVENTS = 10_000
SLICE_EVENTS_PER_QUERY = 100


def scan_match(spark: SparkSession, queries: Any, files: Sequence[str], *, single: bool, tasks: int,
               format: str | None = None, ts_field: str = "ts", ts_unit: str = "s", type_field: str | None = None,
               policy: str | None = None, full_events: bool = False,
               feedback_limits: tuple[int, int] = (MAX_DEPTH, MAX_DERIVED), slice_events: int | None = None,
               hot_keys: bool = True) -> DataFrame:
    """The rows of :func:`yfpp.spark.batch.match_with_stats` (matches, then a stats row per task with
    also ``records`` and ``dead``) and the dead letters (:data:`DEAD_COLUMNS` set, the rest null) of
    the ``files`` (listed URIs, path order; ``single``: one file named, positions without its name),
    matched by ``tasks`` tasks that each read them all. ``slice_events``: see :func:`slicing_of`
    (default: :data:`SLICE_EVENTS`, or :data:`SLICE_EVENTS_PER_QUERY` per query if more). ``ts_unit``
    ``iso``: ISO-8601 timestamps, and the matches' lines have ISO-8601 start and end, as ``yfpp run
    --ts-format iso``. ``hot_keys``: cut a keyed group's hot keys into time slices (:mod:`yfpp.spark.hot_keys`)."""
    groups = group_queries(effective_queries(queries, policy), full_events=full_events, feedback_limits=feedback_limits,
                           iso_times=ts_unit == ISO_UNIT_NAME)
    ids_as_text = any(p.feedback for g in groups for _, p in g.queries)
    inputs = scan_inputs(files, single)
    reading = {"format": format, "ts_field": ts_field, "ts_unit": ts_unit, "type_field": type_field}
    run = _scanner(groups, inputs, reading, tasks, ids_as_text, slice_events, hot_keys)
    # the schema as a StructType, not DDL text: no first use of Spark's SQL parser (0.2–0.3 JVM CPU-s)
    return spark.range(tasks, numPartitions=tasks).mapInArrow(run, from_arrow_schema(_arrow_schema(ids_as_text)))


def scan_inputs(files: Sequence[str], single: bool) -> list[tuple[str, str]]:
    """``(local path, dead-letter position prefix)`` of each listed file: the prefix is its path below
    the files' common folder, as the shuffle plan writes it (:func:`yfpp.spark.read.split_offsets`)."""
    prefixes = [o[5] for o in split_offsets([(f, 0, 0, 0, None) for f in files], single, order=files)]
    return [(local_path(f), prefix) for f, prefix in zip(files, prefixes)]


def _arrow_schema(ids_as_text: bool) -> pa.Schema:
    """The scan rows' columns: a match's (bindings as text with feedback queries), then :data:`DEAD_COLUMNS`."""
    return pa.schema(list(_ID_ARROW_SCHEMA if ids_as_text else _ARROW_SCHEMA) + [pa.field(k, t) for k, t in DEAD_COLUMNS])


def _scanner(groups: list[Group], inputs: list[tuple[str, str]], reading: dict[str, Any], n: int,
             ids_as_text: bool, slice_events: int | None, hot_keys: bool) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The mapInArrow function: for each task number it is given, :func:`scan_task`'s rows as Arrow batches."""

    schema = _arrow_schema(ids_as_text)

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for rb in batches:
            for task in rb.column(0).to_pylist():
                rows: list[tuple] = []
                with rare_collections():
                    for row in scan_task(groups, inputs, reading, task, n, ids_as_text, slice_events, hot_keys):
                        rows.append(row)
                        if len(rows) >= 4096:
                            yield _batch(rows, schema)
                            rows.clear()
                if rows:
                    yield _batch(rows, schema)

    return run


class _Collect(DeadLetters):
    """The readers' dead letters as ``(seq, position, reason, raw)``, positions prefixed, seq made global."""

    def __init__(self) -> None:
        super().__init__()
        self.items: list[tuple[int, str, str, str | None]] = []
        self.prefix, self.base, self.last = "", 0, -1

    def report(self, seq: int, position: str, reason: str, raw: str | None = None) -> None:
        super().report(seq, position, reason, raw)
        self.last = max(self.last, seq)
        self.items.append((self.base + seq, self.prefix + position, reason, raw))


def scan_events(inputs: Sequence[tuple[str, str]], reading: dict[str, Any], dead: _Collect,
                report: bool) -> Iterator[list[Event]]:
    """The events of the files in order, a reader's batch at a time, seq numbers global, late ones (ts
    below an earlier event's: ``max_delay`` 0) left out; with ``report``, ``dead.items`` gets the
    malformed and late records too (the caller drains it)."""
    hi = float("-inf")
    for path, prefix in inputs:
        dead.prefix, dead.last = prefix, -1
        base = dead.base
        last = -1
        for events in read_event_batches(path, reading["format"], **reader_kwargs(reading), dead_letters=dead):
            if not events:
                continue
            last = events[-1].seq
            if base:
                for ev in events:
                    ev.seq += base
            kept = events
            for i, ev in enumerate(events):
                ts = ev.ts
                if ts < hi:  # a late event: the rest of the batch is checked one by one
                    kept = events[:i]
                    for ev in events[i:]:
                        ts = ev.ts
                        if ts < hi:
                            if report:
                                dead.items.append((ev.seq, f"seq {ev.seq}", late_reason(ts, hi, 0.0),
                                                   event_raw(ev.type, ts, ev.attrs)))
                        else:
                            hi = ts
                            kept.append(ev)
                    break
                hi = ts
            yield kept
        dead.base = base + max(last, dead.last) + 1


def _copy(ev: Event) -> Event:
    """A copy for a second engine (an engine sets an event's stream position ``pos``: engines must not share one)."""
    return Event(ev.type, ev.ts, ev.attrs, ev.seq, ev._element)


class _Share:
    """One group's engines in one task: what the task feeds them, their matches kept. ``copies``:
    its engines get copies of the events (another group's engines of the task take the originals)."""

    def __init__(self, g: int, grp: Group, task: int, n: int, ids_as_text: bool, copies: bool):
        self.g, self.grp, self.task, self.n, self.text, self.copies = g, grp, task, n, ids_as_text, copies
        self.rows = self.engines = 0
        self.per_query: dict[str, int] = {}

    def engine(self) -> Engine:
        self.engines += 1
        return self.grp.engine()

    def keep(self, ms: list[dict], out: list[tuple], owned: Callable[[dict], bool] | None = None) -> None:
        for m in ms:
            if owned is None or owned(m):
                out.append(match_row(m, self.text, self.grp.iso_times) + (None, None, None, None))
                q = str(m["query"])
                self.per_query[q] = self.per_query.get(q, 0) + 1

    def run(self, eng: Engine, events: list[Event], out: list[tuple]) -> None:
        """Feed ``events`` to ``eng``, keeping its matches."""
        self.rows += len(events)
        ms: list[dict] = []
        eng.process_batch(map(_copy, events) if self.copies else events, ms)
        self.keep(ms, out)

    def feed(self, events: list[Event], out: list[tuple]) -> None:
        raise NotImplementedError

    def finish(self, out: list[tuple]) -> None:
        raise NotImplementedError


def value_hash(v: Any) -> int:
    """A hash of one key value that every process computes alike (no salted ``str`` hash) and that
    values Python finds equal share: numbers by Python's numeric hash (``7``, ``7.0``, ``True``/``1``
    alike), text by CRC-32, anything else by its repr's."""
    t = type(v)
    if t is int or t is bool or (t is float and v == v):  # NaN's hash is its identity
        return hash(v)
    return zlib.crc32((v if t is str else repr(v)).encode("utf-8", "surrogatepass"))


class _Keyed(_Share):
    """The keys whose hash (:func:`value_hash`) modulo n is the task's: one engine; events lacking a key attribute go nowhere.
    With ``hot_events`` (a prefix length), hot keys are cut into time slices instead (:mod:`yfpp.spark.hot_keys`)."""

    def __init__(self, *args: Any, hot_events: int | None = None):
        super().__init__(*args)
        self.eng: Engine | None = None
        self.hot: HotKeys | None = None
        if hot_events and self.n > 1 and sliceable(self.grp):
            self.hot = HotKeys(self.grp, self.n, hot_events, lambda i: _Sliced(
                self.g + i, self.grp, self.task, self.n, self.text, self.copies, slice_events=hot_events))

    def feed(self, events: list[Event], out: list[tuple]) -> None:
        hot = self.hot
        if hot is not None:
            if hot.deciding:
                events = hot.hold(events)
            events = hot.split(events, out)
        if events:
            self._plain(events, out)

    def _plain(self, events: list[Event], out: list[tuple]) -> None:
        """The events of the task's keys (by hash) to its engine."""
        key, n, task = self.grp.key, self.n, self.task
        mine = []
        if len(key) == 1 and key[0] not in PSEUDO_ATTRS:  # the common case, inlined
            a = key[0]
            for ev in events:
                v = ev.attrs.get(a, MISSING)
                if v is MISSING:
                    continue
                t = type(v)
                h = hash(v) if t is int or (t is float and v == v) else value_hash(v)
                if h % n == task:
                    mine.append(ev)
        else:
            for ev in events:
                h = 0
                for a in key:
                    v = ev.get(a)
                    if v is MISSING:
                        break
                    h = h * 1_000_003 + value_hash(v)
                else:
                    if h % n == task:
                        mine.append(ev)
        if mine:
            if self.eng is None:
                self.eng = self.engine()
            self.run(self.eng, mine, out)

    def finish(self, out: list[tuple]) -> None:
        hot = self.hot
        if hot is not None:
            if hot.deciding:  # a stream shorter than the prefix
                self._plain(hot.split(hot.decide(), out), out)
            hot.finish(out)
            rows, engines, per_query = hot.counts()
            self.rows, self.engines = self.rows + rows, self.engines + engines
            for q, k in per_query.items():
                self.per_query[q] = self.per_query.get(q, 0) + k
        if self.eng is not None:
            self.keep(self.eng.flush(), out)


class _Whole(_Share):
    """The whole group, on task g mod n."""

    def __init__(self, *args: Any):
        super().__init__(*args)
        self.eng = self.engine()

    def feed(self, events: list[Event], out: list[tuple]) -> None:
        self.run(self.eng, events, out)

    def finish(self, out: list[tuple]) -> None:
        self.keep(self.eng.flush(), out)


def prefix_events(grp: Group, slice_events: int | None) -> int:
    """The events a group's slicing (or hot keys) is chosen from: ``slice_events``, by default
    :data:`SLICE_EVENTS`, or :data:`SLICE_EVENTS_PER_QUERY` per query if more."""
    return slice_events or max(SLICE_EVENTS, SLICE_EVENTS_PER_QUERY * len(grp.queries))


def slicing_of(t0: float, t: float, events: int, window: float, slice_events: int = SLICE_EVENTS) -> Slicing | None:
    """A sliced group's slices once the stream has given ``events`` events from ``t0`` to ``t``: from
    ``t0``, each at least :data:`SLICE_WINDOWS` windows and ``t - t0`` long — when there are
    ``slice_events`` events and ``t > t0``; else None (not yet)."""
    if events < slice_events or t <= t0:
        return None
    return Slicing(t0, max(SLICE_WINDOWS * window, t - t0), window)


class _Sliced(_Share):
    """The slices ``s`` with ``(s + g) mod n`` = task: an engine each, created when the stream
    reaches the slice and flushed when it passes the slice's extended end."""

    def __init__(self, *args: Any, slice_events: int | None = None):
        super().__init__(*args)
        self.slice_events = prefix_events(self.grp, slice_events)
        self.held: list[Event] | None = []  # the first events (this group's own), until the slicing is known
        self.sl: Slicing | None = None
        self.live: dict[int, Engine] = {}  # slice → engine, in slice order

    def feed(self, events: list[Event], out: list[tuple]) -> None:
        for ev in events:
            held = self.held
            if held is None:
                self._route(ev, self.copies, out)
                continue
            held.append(_copy(ev) if self.copies else ev)
            if len(held) >= self.slice_events:
                self.sl = slicing_of(held[0].ts, ev.ts, len(held), self.grp.window, self.slice_events)
                if self.sl is not None:
                    self.held = None
                    for e in held:
                        self._route(e, False, out)

    def _route(self, ev: Event, copy: bool, out: list[tuple]) -> None:
        """Feed ``ev`` to the task's slices that read it (``copy``: not this group's own event)."""
        sl, live = self.sl, self.live
        reads = sl.reads(ev.ts)
        while live and next(iter(live)) < reads.start:
            s = next(iter(live))
            self._close(s, live.pop(s), out)
        g, n, task = self.g, self.n, self.task
        for s in reads:
            if (s + g) % n != task:
                continue
            eng = live.get(s)
            if eng is None:
                eng = live[s] = self.engine()
            self.rows += 1
            ms = eng.process(_copy(ev) if copy else ev)
            copy = True  # a second slice of this task reads it too
            if ms:
                self.keep(ms, out, lambda m, s=s: sl.own(m["start"]) == s)

    def _close(self, s: int, eng: Engine, out: list[tuple]) -> None:
        sl = self.sl
        self.keep(eng.flush(), out, lambda m: sl.own(m["start"]) == s)

    def finish(self, out: list[tuple]) -> None:
        if self.held is not None:  # never sliced: the whole stream on task g mod n
            if self.g % self.n == self.task:
                eng = self.engine()
                self.copies = False  # held events are this group's own
                self.run(eng, self.held, out)
                self.keep(eng.flush(), out)
            return
        for s, eng in self.live.items():
            self._close(s, eng, out)
        self.live.clear()


def scan_task(groups: list[Group], inputs: list[tuple[str, str]], reading: dict[str, Any], task: int, n: int,
          ids_as_text: bool, slice_events: int | None = None, hot_keys: bool = True) -> Iterator[tuple]:
    """Task ``task`` of ``n``: its rows of :func:`scan_match` — its matches, its dead letters (task 0 only),
    then its stats row (``hot``: the hot keys cut into slices). ``inputs``: :func:`scan_inputs`; ``reading``:
    ``format`` and :func:`~yfpp.spark.parse.reader_kwargs`'s; ``hot_keys``: as :func:`scan_match`'s."""
    started = time.process_time()
    shares: list[_Share] = []
    for g, grp in enumerate(groups):
        args = (g, grp, task, n, ids_as_text, bool(shares))  # the first group's engines take the events themselves
        if grp.key:
            shares.append(_Keyed(*args, hot_events=prefix_events(grp, slice_events) if hot_keys else None))
        elif grp.sliced and n > 1:
            shares.append(_Sliced(*args, slice_events=slice_events))
        elif g % n == task:
            shares.append(_Whole(*args))
    dead = _Collect()
    out: list[tuple] = []
    none = (None,) * 6
    n_dead = 0

    def drain() -> None:
        """Task 0's dead letters so far into ``out`` (as they come: memory stays bounded); others drop theirs."""
        nonlocal n_dead
        if task == 0:
            n_dead += len(dead.items)
            out.extend(none + item for item in dead.items)
        dead.items.clear()

    for events in scan_events(inputs, reading, dead, report=task == 0):
        for share in shares:
            share.feed(events, out)
        if dead.items:
            drain()
        if len(out) >= 4096:
            yield from out
            out.clear()
    drain()
    for share in shares:
        share.finish(out)
    yield from out
    records = dead.base
    per_query: dict[str, int] = {}
    for share in shares:
        for q, k in share.per_query.items():
            per_query[q] = per_query.get(q, 0) + k
    stats = {"task": task, "rows": sum(s.rows for s in shares), "engines": sum(s.engines for s in shares),
             "seconds": round(time.process_time() - started, 3), "matches": per_query, "records": records,
             "dead": n_dead if task == 0 else None,
             "hot": [k for s in shares if isinstance(s, _Keyed) and s.hot is not None for k in s.hot.names()]}
    yield (None, None, None, None, None, json.dumps(stats), None, None, None, None)
