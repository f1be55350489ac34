"""Checkpoints: the whole engine state as versioned, JSON-safe data (docs/operations.md).

``snapshot(engine) -> dict`` and ``restore(data, **engine_opts) -> Engine``
(``Engine.snapshot`` / ``Engine.restore``), ``write_checkpoint`` (atomic:
temp file + rename) and ``read_checkpoint``.  Nothing is pickled: queries are
kept as their text, grouped by shape (the text around the constants a subscriber
varies, once per shape; per query its constants: a million subscriptions of a few
shapes are a few dozen bytes each), or as their pattern IR when registered as a
``Pattern`` (plain dataclasses, encoded by class name from ``yfpp.language.pattern``
only), and registered again in registration order, which rebuilds the same shared NFA; runs, buffer entries and negation candidates then refer
to its nodes as ``[query id, component index]``.  Events are stored once in a
table and referred to by index.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import heapq
import json
import math
import os
import tempfile
import types
import typing
from collections import Counter, defaultdict
from itertools import count
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator

from yfpp.language import pattern as ir
from yfpp.language.query_text import split_constants
from yfpp.state import set_checkpoint
from yfpp.state.kept_shapes import KeptShape
from yfpp.state.plans import Plans, check_entries, check_stack
from yfpp.state.memory_cap import collection_paused
from yfpp.state.schema import check_shape, corrupt
from yfpp.errors import YfppError
from yfpp.input.events import MISSING, Event
from yfpp.runtime.feedback import DerivedEvent
from yfpp.runtime.match_buffer import Entry
from yfpp.nfa.predicates import KleeneState
from yfpp.runtime.deadlines import Pending
from yfpp.runtime.run_merging import as_plain_runs
from yfpp.runtime.runs import FullRun

if TYPE_CHECKING:
    from yfpp.state.query_base import QueryBase

FORMAT = "yfpp-checkpoint"
VERSION = 3  # 2: event-set queries (``set_queries``) and the ``strategy`` option; 3: queries grouped by shape
READABLE = (1, 2, 3)
_IR_CLASSES = {c.__name__: c for c in vars(ir).values() if isinstance(c, type) and dataclasses.is_dataclass(c)}
_IR_ENUMS = {c.__name__: c for c in vars(ir).values() if isinstance(c, type) and issubclass(c, enum.Enum) and c is not enum.Enum}


# --- pattern IR <-> JSON ------------------------------------------------------------


def encode_pattern(obj: Any) -> Any:
    """A pattern IR value as JSON: dataclasses as ``{"$ir": name, fields…}``, enums as ``{"$enum": …}``."""
    names = _IR_FIELDS.get(type(obj))
    if names is not None:  # (the IR's own classes: their fields known, not looked up for each value)
        out = {"$ir": type(obj).__name__}
        for name in names:
            out[name] = encode_pattern(getattr(obj, name))
        return out
    if dataclasses.is_dataclass(obj):
        return {"$ir": type(obj).__name__, **{f.name: encode_pattern(getattr(obj, f.name)) for f in dataclasses.fields(obj)}}
    if isinstance(obj, enum.Enum):
        return {"$enum": type(obj).__name__, "value": obj.value}
    if isinstance(obj, tuple):
        return [encode_pattern(x) for x in obj]
    return obj


def decode_pattern(data: Any, as_tuple: bool = False) -> Any:
    """What :func:`encode_pattern` wrote, read back; a field of the wrong type is refused (``ValueError``)."""
    if isinstance(data, dict):
        if "$enum" in data:
            return _IR_ENUMS[data["$enum"]](data["value"])
        cls = _IR_CLASSES.get(data.get("$ir"))
        if cls is None:
            raise YfppError(f"checkpoint: unknown pattern class {data.get('$ir')!r}")
        obj = cls(**{k: decode_pattern(v, True) for k, v in data.items() if k != "$ir"})
        for name, fits, hint in _IR_CHECKS[cls]:
            if not fits(getattr(obj, name)):
                raise ValueError(f"pattern: {cls.__name__}.{name} is not a {hint}: {getattr(obj, name)!r:.60}")
        return obj
    if isinstance(data, list):
        return tuple(decode_pattern(x, True) for x in data)
    return data


def _fits(hint: Any) -> Callable[[Any], bool]:
    """Whether a value is of the pattern IR's type ``hint`` (``Any``: a literal's JSON scalar), as a function
    made once per hint (reading the hint for each value made restoring many queries slow)."""
    if hint is Any:
        return lambda v: v is None or type(v) in (bool, int, float, str)
    origin = typing.get_origin(hint)
    if origin is typing.Union or origin is types.UnionType:
        each = [_fits(h) for h in typing.get_args(hint)]
        return lambda v: any(fits(v) for fits in each)
    if origin is tuple:
        args = typing.get_args(hint)
        if len(args) == 2 and args[1] is Ellipsis:
            item = _fits(args[0])
            return lambda v: type(v) is tuple and all(map(item, v))
        items = [_fits(h) for h in args]
        return lambda v: type(v) is tuple and len(v) == len(items) and all(fits(x) for fits, x in zip(items, v))
    if hint is float:
        return lambda v: type(v) in (int, float)
    return lambda v: type(v) is hint  # (NoneType too)


#: each IR class's fields: (name, whether a value fits its type, the type)
_IR_CHECKS = {c: [(name, _fits(hint), hint) for name, hint in typing.get_type_hints(c).items()]
              for c in _IR_CLASSES.values()}
_IR_FIELDS = {c: tuple(f.name for f in dataclasses.fields(c)) for c in _IR_CLASSES.values()}


# --- snapshot -----------------------------------------------------------------------


def _num(x: Any) -> Any:
    """``x``, or for a float that JSON cannot hold (±inf, NaN) ``{"$float": "inf"}`` and the like."""
    return {"$float": repr(x)} if type(x) is float and not math.isfinite(x) else x


def _unnum(x: Any) -> Any:
    """What :func:`_num` wrote, read back (a number written otherwise is refused)."""
    if isinstance(x, dict) and set(x) == {"$float"} and x["$float"] in ("inf", "-inf", "nan"):
        return float(x["$float"])
    if type(x) is bool or not isinstance(x, (int, float)):
        raise TypeError(f"not a number: {x!r:.40}")
    return x


def _attrs(attrs: dict[str, Any]) -> dict[str, Any]:
    """An event's attributes as JSON: a float JSON cannot hold (given from Python) as :func:`_num` writes it, and
    an object value that looks like such an encoding (``{"$float": …}``, ``{"$dict": …}``) as ``{"$dict": value}``."""
    for v in attrs.values():  # (a loop, not any() over a generator: a checkpoint of 240,000 events calls this for each)
        t = type(v)
        if (t is float or t is dict) and _attr(v) is not v:
            return {k: _attr(v) for k, v in attrs.items()}
    return attrs


def _attr(v: Any) -> Any:
    if type(v) is float:
        return _num(v)
    if type(v) is dict and len(v) == 1 and ("$float" in v or "$dict" in v):
        return {"$dict": v}
    return v


def _unattr(v: Any) -> Any:
    """What :func:`_attr` wrote, read back."""
    if type(v) is dict and len(v) == 1:
        if "$float" in v:
            return _unnum(v)
        if "$dict" in v:
            return v["$dict"]
    return v


class _Writer:
    """Numbers the events and buffer entries a snapshot refers to.

    An event is numbered with its ``pos`` of that moment (a held event gets one later) and written as JSON data
    only by :meth:`event_records`: nothing else of an event changes once the engine holds it, so that may run on
    another thread while the engine goes on (:class:`Taken`)."""

    def __init__(self) -> None:
        self.entries: list[dict] = []
        self._events: list[tuple[Event, int]] = []  # (event, its pos when numbered)
        self._event_ids: dict[int, int] = {}
        self._entry_ids: dict[int, int] = {}

    def event(self, ev: Event) -> int:
        i = self._event_ids.get(id(ev))
        if i is None:
            i = self._event_ids[id(ev)] = len(self._events)
            self._events.append((ev, ev.pos))
        return i

    def event_records(self) -> list[dict]:
        """Every event numbered, as JSON data, in the order of their numbers."""
        return [_event_record(ev, pos) for ev, pos in self._events]

    def entry(self, e: Entry | None) -> int | None:
        if e is None:
            return None
        i = self._entry_ids.get(id(e))
        if i is None:
            i = self._entry_ids[id(e)] = len(self.entries)
            rec: dict = {"event": self.event(e.event), "unit": e.unit}
            self.entries.append(rec)
            rec["preds"] = [[list(v), self.entry(p)] for v, p in e.pointers()]
        return i

    def value(self, v: Any) -> Any:
        """A vec slot, partition key or aggregate: None/numbers/strings, MISSING, tuples, events, Kleene states."""
        t = type(v)
        if v is None or t is int or t is str or t is bool:  # (the common cases first, by exact type)
            return v
        if t is Event:
            return {"$event": self.event(v)}
        if isinstance(v, (bool, int, str)):
            return v
        if isinstance(v, float):
            return _num(v)
        if v is MISSING:
            return {"$missing": True}
        if isinstance(v, tuple):
            return {"$tuple": [self.value(x) for x in v]}
        if isinstance(v, Event):
            return {"$event": self.event(v)}
        if isinstance(v, KleeneState):
            evs = list(v.iter_events()) if v.events is not None else None
            return {"$kleene": [self.event(v.first), self.event(v.last), v.n, self.value(v.aggs),
                                None if evs is None else [self.event(e) for e in evs]]}
        raise YfppError(f"checkpoint: cannot store a value of type {type(v).__name__}: {v!r:.80}")

    def runs(self, store: dict, state_ref: Callable[[Any], list | None], node_ref: NodeRefs) -> list[tuple]:
        """The runs of ``store`` (state -> runs; a merged run as its members) as :meth:`run` takes them: their
        fields as they are now (a run's ``entry`` is set later when it had none: ``first_entry``), the entries
        numbered now (they gain pointers later)."""
        rows = []
        entry = self.entry
        for st, lst in store.items():
            ref = state_ref(st)
            if ref is None:
                continue
            for r in lst:
                for x in ([r] if r.members is None else as_plain_runs(r)):
                    e = x.entry
                    rows.append((ref, x.vec, None if e is None else entry(e), x.version, x.first_ts, x.first_pos,
                                 x.key, x.born, x.tick, x.ptick,
                                 [node_ref.of(n) for n in x.blocked] if x.blocked else []))
        return rows

    def run(self, row: tuple) -> dict:
        """A run as :meth:`runs` took it, as JSON data (its values and events numbered now)."""
        state, vec, entry, version, first_ts, first_pos, key, born, tick, ptick, blocked = row
        return {
            "state": state, "vec": [self.value(x) for x in vec], "entry": entry,
            "version": list(version), "first_ts": first_ts, "first_pos": first_pos, "key": self.value(key),
            "born": born, "tick": tick, "ptick": ptick,
            "blocked": blocked,
        }


def _event_record(ev: Event, pos: int) -> dict:
    """An event as JSON data (``pos``: its stream position when the snapshot was taken)."""
    rec = {"type": ev.type, "ts": ev.ts, "attrs": _attrs(ev.attrs), "seq": ev.seq, "pos": pos}
    if isinstance(ev, DerivedEvent):  # keep the provenance full-event output shows
        rec["from"] = {"query": ev.query, "events": ev.sources, "depth": ev.depth}
    if ev._element is not None:
        from lxml import etree

        rec["xml"] = etree.tostring(ev._element, encoding="unicode", with_tail=False)
    return rec


def _rank(rank: tuple) -> list:
    """A held feedback match's rank (``overlap_rank``) as JSON data of its own."""
    first, flat, lists = rank
    return [first, list(flat), [list(x) for x in lists]]


def peek(counter: count) -> tuple[int, count]:
    """The next value of an ``itertools.count``, and a counter that gives it again."""
    n = next(counter)
    return n, count(n)


@dataclasses.dataclass
class StreamState:
    """An engine's place in its stream (``Engine.stream_state`` / ``Engine.resume_stream``)."""

    next_seq: int  #: the seq the next event without one gets
    watermark: tuple[float, float]  #: (ts, seq key)
    next_arrival: int  #: the reorder buffer's next arrival number
    next_query_id: int
    held: list[tuple[float, float, int, Event]]  #: the reorder buffer: (ts, seq key, arrival, event), in order


_ENCODE = json.JSONEncoder(separators=(",", ":")).encode  #: compact JSON, as json.dumps with these separators
_AROUNDS = 4096  #: shapes whose text around the constants :class:`EncodedPatterns` keeps once


class NodeRefs:
    """Live nodes of the shared NFA -> ``[query id, component index]`` of a query through them, looked up as a take
    needs them. ``known`` (kept from take to take) serves while its query is registered with that node there; a
    node it does not know, or knows by a query gone since, has every query's nodes walked once (the first query
    through a node is then its reference): an engine whose queries did not change is not walked again."""

    def __init__(self, engine, known: dict | None = None) -> None:
        self._queries = engine.queries
        self.known: dict = {} if known is None else known
        self._walked = False

    def add(self, qid: int) -> None:
        """Know the nodes of query ``qid`` (registered since the last walk)."""
        for i, node in enumerate(self._queries[qid].nodes):
            self.known.setdefault(node, [qid, i])

    def get(self, node) -> list | None:
        """``node``'s reference, or None if no registered query goes through it."""
        ref = self.known.get(node)
        if ref is not None:
            plan = self._queries.get(ref[0])
            if plan is not None and ref[1] < len(plan.nodes) and plan.nodes[ref[1]] is node:
                return ref
        if self._walked:
            return None
        self._walked = True
        self.known.clear()
        for qid, plan in self._queries.items():
            for i, n in enumerate(plan.nodes):
                self.known.setdefault(n, [qid, i])
        return self.known.get(node)

    def of(self, node) -> list:
        """The reference of ``node``, which a registered query goes through."""
        ref = self.get(node)
        if ref is None:
            raise KeyError(f"a node of no registered query: {node!r:.60}")
        return ref


def _state_ref(st, node_ref: NodeRefs) -> list | None:
    node = node_ref.get(st.node)
    if node is None:
        return None
    if st.mode == "in":
        return [node, "in"]
    return [node, "wait", st.contiguity.value, node_ref.of(st.child) if st.child is not None else None]


class EncodedPatterns:
    """The queries' patterns as :func:`encode_pattern` writes them, kept by query id for the checkpoints of an
    engine whose queries outlive many checkpoints (encoding 100,000 patterns took seconds at each): an entry
    serves while the engine's query of that id is the very pattern object it was made from. An entry encoded
    here keeps its JSON text too, which :func:`write_checkpoint` writes as it is (JSON-encoding 100,000 patterns
    again took seconds at each checkpoint, the final one at a stop included). A query registered as text may
    have its text kept split around its constants (:meth:`keep_text`): splitting 100,000 texts again took
    0.6 s at each checkpoint."""

    def __init__(self) -> None:
        self._by_id: dict[int, tuple[Any, Any, str | None]] = {}
        self._splits: dict[int, tuple[str, tuple[str, ...], list[str]]] = {}
        self._arounds: dict[tuple[str, ...], tuple[str, ...]] = {}  # (each shape's text around once)

    def keep(self, qid: int, pattern: Any, encoded: Any = None) -> None:
        """Keep query ``qid``'s ``pattern`` encoded (``encoded``: as a checkpoint already holds it; its JSON
        text is then not made: a restore of many queries would pay for it)."""
        if encoded is None:
            encoded = encode_pattern(pattern)
            self._by_id[qid] = (pattern, encoded, _ENCODE(encoded))
        else:
            self._by_id[qid] = (pattern, encoded, None)

    def keep_text(self, qid: int, text: str, split: tuple[list[str], list[str]] | None = None) -> None:
        """Keep query ``qid``'s ``text`` split around its constants (``split``: as a checkpoint holds it)."""
        around, constants = split if split is not None else split_constants(text)
        key = tuple(around)
        if key not in self._arounds and len(self._arounds) >= _AROUNDS:
            self._arounds.pop(next(iter(self._arounds)))
        self._splits[qid] = (text, self._arounds.setdefault(key, key), constants)

    def split(self, qid: int, text: str) -> tuple[tuple[str, ...] | list[str], list[str]]:
        """``split_constants(text)``, kept when ``text`` is the very text kept for query ``qid``, or made now."""
        kept = self._splits.get(qid)
        return (kept[1], kept[2]) if kept is not None and kept[0] is text else split_constants(text)

    def forget(self, qid: int) -> None:
        self._by_id.pop(qid, None)
        self._splits.pop(qid, None)

    def encode(self, qid: int, pattern: Any) -> Any:
        """``encode_pattern(pattern)``, kept or made now."""
        kept = self._by_id.get(qid)
        return kept[1] if kept is not None and kept[0] is pattern else encode_pattern(pattern)

    def text(self, qid: int, encoded: Any) -> str | None:
        """The JSON text of ``encoded`` when it is query ``qid``'s entry and that was encoded here, else None."""
        kept = self._by_id.get(qid)
        return kept[2] if kept is not None and kept[1] is encoded else None


def snapshot(engine, patterns: EncodedPatterns | None = None) -> dict:
    """The engine's whole state as JSON-safe data (``FORMAT``, ``VERSION``; see docs/operations.md);
    ``patterns``: its queries' patterns encoded already (``take(engine, patterns).data()``)."""
    with collection_paused():  # (its lists and dicts hold no cycle: a collection would walk the engine for nothing)
        return take(engine, patterns).data()


class Taken:
    """An engine's state as :func:`take` took it: :meth:`data` makes it JSON-safe data, on any thread, while the
    engine goes on. What the engine changes later (its stores, buffer entries, counters) was copied by the take;
    what it never changes (events, run vecs and keys, patterns) is shared and written out by :meth:`data`."""

    def __init__(self, data: dict, writer: _Writer, runs: list[tuple],
                 queries: Callable[[EncodedPatterns | None], dict], patterns: EncodedPatterns | None,
                 against: Any = None) -> None:
        self._data, self._writer, self._runs, self._queries, self._patterns = data, writer, runs, queries, patterns
        self.against = against  #: the queries as taken against a base (``QueryBase.take``), or None

    def data(self) -> dict:
        """The snapshot (:func:`snapshot`; taken against a base, its queries are what changed since:
        :mod:`yfpp.state.query_base`); the take's references are dropped (call it once)."""
        data, w, runs, queries, patterns = self._data, self._writer, self._runs, self._queries, self._patterns
        self._runs = []
        data.update(queries(patterns))
        data["runs"] = [w.run(row) for row in runs]
        data["events"] = w.event_records()
        data["entries"] = w.entries
        return data


def take(engine, patterns: EncodedPatterns | None = None, base: QueryBase | None = None) -> Taken:
    """The engine's state as it is now (:class:`Taken`; ``patterns``: its queries' patterns encoded already;
    ``base``: the queries as a base file holds them, and what is kept between takes: the queries are then taken
    as what changed since, :mod:`yfpp.state.query_base`). Only this walks the engine: the caller holds it quiet
    meanwhile."""
    rt = engine.runtime
    node_ref = NodeRefs(engine, None if base is None else base.node_refs)
    if base is not None:
        base.prepare(engine, node_ref)
    w = _Writer()
    dead = rt.dead
    refs: dict = {}  # (each state's, found once: a keyed query has a store per key)
    unseen = object()

    def state_ref(st) -> list | None:
        ref = refs.get(st, unseen)
        if ref is unseen:
            ref = refs[st] = _state_ref(st, node_ref) if st not in dead else None
        return ref

    runs = []
    for store in rt._stores():
        runs += w.runs(store, state_ref, node_ref)
    stacks = []
    for node in rt.buffer.stacks():
        ref = node_ref.get(node)
        if ref is not None:
            stacks.append([ref, [w.entry(e) for e in rt.buffer.entries(node)]])
    negations = _negations(engine, w)
    # (each query's plan by id only with deadlines pending: a walk over every query)
    plan_id = {plan: qid for qid, plan in engine.queries.items()} if rt.deadlines.heap else {}
    pending = []
    for deadline, order, p in sorted(rt.deadlines.heap, key=lambda d: (d[0], d[1])):
        if p.plan in plan_id and not p.killed:
            pending.append({"query": plan_id[p.plan], "key": w.value(p.key), "vec": [w.value(x) for x in p.vec],
                            "last_pos": p.last_pos, "deadline": _num(deadline), "order": order, "match": dict(p.match),
                            "depth": p.depth, **({"rank": _rank(p.rank)} if p.rank is not None else {})})
    stream = engine.stream_state()
    (next_root, rt._roots), (next_branch, rt._branches) = peek(rt._roots), peek(rt._branches)
    next_order, rt.deadlines.order = peek(rt.deadlines.order)
    held = [[ts, _num(sk), arrival, w.event(ev)] for ts, sk, arrival, ev in stream.held]
    branches = []
    for root in rt.branch_queries:  # (those whose counts are not yet the 0 a restored branch starts with)
        if root.books is not None and (root.cap_check or root.reported):  # (no books: both 0, read at once)
            ref = node_ref.get(root)
            if ref is not None:
                branches.append([ref, root.cap_check, root.reported])
    c = rt.counters
    data = {
        "format": FORMAT,
        "version": VERSION,
        "options": {"max_delay": engine.max_delay, "max_held": engine.max_held, "policy": engine.default_policy,
                    "max_runs_per_query": rt.max_runs, "max_buffer_per_query": rt.max_buffer, "strategy": engine.strategy,
                    "merge_runs": rt.merger is not None, "full_events": rt.full_events,
                    "max_feedback_depth": engine.feedback.max_depth, "max_derived_per_event": engine.feedback.max_derived},
        "shapes": None, "queries": None,  # (made by Taken.data)
        "next_query_id": stream.next_query_id,
        "stream": {"next_seq": stream.next_seq, "watermark": [_num(x) for x in stream.watermark],
                   "next_arrival": stream.next_arrival, "tick": rt.tick, "now": _num(rt.now), "next_sweep": rt._next_sweep},
        "held": held,
        "runs": None,  # (made by Taken.data)
        "buffer": stacks,
        "negations": negations,
        "pending": pending,
        "partition_ticks": [[list(attrs), [[w.value(k), n] for k, n in ticks.items()]] for attrs, ticks in rt.pticks.items()],
        "branches": branches,
        "versions": {"next_root": next_root, "next_branch": next_branch, "next_order": next_order},
        "counters": {
            "events": c.events, "runs_started": c.runs_started, "runs_created": c.runs_created, "runs_touched": c.runs_touched,
            "peak_runs": c.peak_runs, "peak_buffer": c.peak_buffer, "failed": c.failed,
            "matches": [[k, v] for k, v in c.matches.items()], "shed_runs": [[k, v] for k, v in c.shed_runs.items()],
            "derived": engine.feedback.derived, "derived_dropped": engine.feedback.dropped,
            "released_early": engine.released_early,
        },
        "dead_letters": {"count": engine.dead_letters.count, "by_reason": dict(engine.dead_letters.by_reason)},
        "set_queries": [[qid, set_checkpoint.save(m, w)] for qid, m in engine.set_queries.items()],
        "events": None,  # (made by Taken.data)
        "entries": None,
    }
    against = None if base is None else base.take(engine)  # (last: nothing after it fails, leaving it taken)
    queries = functools.partial(query_rows, taken_queries(engine)) if against is None else against.data
    return Taken(data, w, runs, queries, patterns, against)


def taken_queries(engine, qids: Iterable[int] | None = None) -> list[tuple]:
    """The queries (those of ``qids``, in that order; all in registration order by default) as :func:`query_rows`
    takes them: ``(id, pattern or plan, text, name, since_tick)`` (pattern: the plan of a query with text)."""
    sources, plans = engine.sources, engine.queries
    kept = sources.kept() if qids is None else ((qid, sources.kept_of(qid)) for qid in qids)
    rows = []
    for qid, (pat, text, name) in kept:
        plan = plans.get(qid)
        rows.append((qid, pat, text, name, plan.since_tick if plan is not None else None))
    return rows


def _negations(engine, w: _Writer) -> list[list]:
    """The negation candidates held: ``[[query id, negation index], key, positions, events]``."""
    rt = engine.runtime
    neg_index: dict | None = None  # (made at the first candidate: a walk over every query)
    negations = []
    written: set[int] = set()
    for neg, store in rt.negations.of.items():  # a store shared by equivalent negations: written once
        if id(store) in written or not store.buckets:
            continue
        written.add(id(store))
        if neg_index is None:
            neg_index = {n: [qid, i] for qid, plan in engine.queries.items() for i, n in enumerate(plan.negations)}
        for key, (positions, events) in store.buckets.items():
            negations.append([neg_index[neg], w.value(key), list(positions), [w.event(e) for e in events]])
    return negations


def query_rows(queries: list[tuple], patterns: EncodedPatterns | None, shapes: dict[tuple, int] | None = None) -> dict:
    """``shapes``: ``[text around the constants, policy, feedback]`` once per shape; ``queries``: per query in
    registration order ``[id, name, shape index, its constants, since_tick]``, or ``[id, name, None, pattern IR,
    since_tick]`` for a query registered as a Pattern (since_tick None: an event-set query's); ``queries``: as
    :func:`take` took them, ``(id, pattern or plan, text, name, since_tick)``. With ``shapes`` (the shapes of a
    base, by index; the dict gains the new ones), only the shapes new to it are given, numbered after it."""
    encode = patterns.encode if patterns is not None else lambda _, pat: encode_pattern(pat)
    split = patterns.split if patterns is not None else lambda _, text: split_constants(text)
    if shapes is None:
        shapes = {}
    known = len(shapes)
    rows = []
    for qid, pat, text, name, since in queries:
        if text is None:
            rows.append([qid, name, None, encode(qid, pat), since])
            continue
        around, constants = split(qid, text)
        shape = shapes.setdefault((tuple(around), pat.policy, pat.feedback), len(shapes))
        rows.append([qid, name, shape, constants, since])
    return {"shapes": [[list(around), policy, feedback] for around, policy, feedback in list(shapes)[known:]],
            "queries": rows}


def stored_splits(data: dict) -> dict[int, tuple[list[str], list[str]]]:
    """The text around the constants and the constants of each query a (checked) version-3 checkpoint keeps by
    shape, by query id (the lists of ``data``)."""
    shapes = data.get("shapes")
    if shapes is None:
        return {}
    return {q[0]: (shapes[q[2]][0], q[3]) for q in data["queries"] if q[2] is not None}


def stored_patterns(data: dict) -> dict[int, Any]:
    """The encoded pattern IR of each query a (checked) checkpoint keeps as IR, by query id: every query of
    versions 1 and 2, those registered as a Pattern in version 3 (the others are kept as text)."""
    if data.get("shapes") is None:
        return {q["id"]: q["pattern"] for q in data["queries"]}
    return {q[0]: q[3] for q in data["queries"] if q[2] is None}


def _register_queries(eng, data: dict) -> None:
    """Register the checkpoint's queries again under their own ids (version 3: by shape; 1, 2: their pattern)."""
    shapes = data.get("shapes")
    kept: dict[int, KeptShape] = {}  # by shape index, made at its first row
    for i, q in enumerate(data["queries"]):
        if shapes is None:
            qid, name, since = q["id"], q["name"], q["since_tick"]
            eng.register(decode_pattern(q["pattern"]), name=name, query_id=qid)
            eng.sources[qid] = (eng.sources[qid][0], q["text"], name)
        else:
            qid, name, shape, what, since = q
            if shape is None:
                eng.register(decode_pattern(what), name=name, query_id=qid)
            else:
                ks = kept.get(shape)
                if ks is None:
                    ks = kept[shape] = KeptShape(eng, shape, shapes[shape], what, i)
                ks.register(eng, i, qid, name, what)
        if qid in eng.queries:
            if since is None:
                raise corrupt(f"queries[{i}]", "a pattern query needs since_tick")
            eng.queries[qid].since_tick = since


# --- restore ------------------------------------------------------------------------


class _Reader:
    """The checkpoint's events and entries as objects, and its values decoded."""

    def __init__(self, data: dict) -> None:
        self.events = [self._event(rec) for rec in data["events"]]
        self.entries = [Entry(self.events[rec["event"]], rec["unit"]) for rec in data["entries"]]
        for e, rec in zip(self.entries, data["entries"]):
            for v, p in rec["preds"]:
                e.link(tuple(v), None if p is None else self.entries[p])

    @staticmethod
    def _event(rec: dict) -> Event:
        element = None
        if "xml" in rec:
            from lxml import etree

            parser = etree.XMLParser(resolve_entities=False, no_network=True, load_dtd=False)
            try:
                element = etree.fromstring(rec["xml"], parser)
            except etree.XMLSyntaxError as e:
                raise ValueError(f"an event's xml: {e}") from None
        origin = rec.get("from")
        attrs = rec["attrs"]
        if any(type(v) is dict for v in attrs.values()):
            attrs = {k: _unattr(v) for k, v in attrs.items()}
        if origin is None:
            ev = Event(rec["type"], rec["ts"], attrs, rec["seq"], element)
        else:
            ev = DerivedEvent(rec["type"], rec["ts"], attrs, rec["seq"], origin["query"], origin["events"],
                              origin["depth"], None)
        ev.pos = rec["pos"]
        return ev

    def value(self, v: Any) -> Any:
        if not isinstance(v, dict):
            return v
        if "$float" in v:
            return _unnum(v)
        if "$missing" in v:
            return MISSING
        if "$tuple" in v:
            return tuple(self.value(x) for x in v["$tuple"])
        if "$event" in v:
            return self.events[v["$event"]]
        first, last, n, aggs, evs = v["$kleene"]
        chain = None
        for i in evs or ():
            chain = (self.events[i], chain)
        return KleeneState(self.events[first], self.events[last], n, self.value(aggs), chain if evs is not None else None)


def restore(data: dict, engine_class: type, **engine_opts: Any):
    """A new ``engine_class`` (``Engine``) in the state ``data`` describes; ``engine_opts`` (dead_letters, reports…)
    override its options.

    ``data`` is checked first (``yfpp.state.schema``, ``yfpp.state.plans``): a damaged or hand-edited
    checkpoint is a :class:`YfppError` ``corrupt checkpoint: …`` here, never an error in a later ``process``."""
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise YfppError("not a yfpp checkpoint")
    if "base" in data:
        raise YfppError("this checkpoint keeps its queries in a base file beside it (a service's periodic checkpoint): "
                        "read it with yfpp.state.query_base.read")
    if data.get("version") not in READABLE:
        raise YfppError(f"checkpoint version {data.get('version')!r} is not supported (this yfpp reads versions "
                        f"{', '.join(map(str, READABLE))})")
    try:
        with collection_paused():  # (no collection walks the objects a restore makes, a million queries' among them)
            check_shape(data)
            return _restore(data, engine_class, engine_opts)
    except (KeyError, IndexError, TypeError, ValueError, AttributeError, RecursionError) as e:
        raise YfppError(f"corrupt checkpoint: {type(e).__name__}: {e}") from e


def _restore(data: dict, engine_class: type, engine_opts: dict):
    saved = data["options"].get("strategy", "direct")
    if data.get("set_queries") and engine_opts.get("strategy", saved) != saved:
        raise YfppError(f"this checkpoint's event-set queries were evaluated with strategy {saved!r}: "
                        f"restore it with that strategy, not {engine_opts['strategy']!r}")
    eng = engine_class(**{**data["options"], **engine_opts})
    rt = eng.runtime
    _register_queries(eng, data)
    plans = Plans(eng)
    rd = _Reader(data)
    check_entries(rd.entries)
    s = data["stream"]
    held = [(_unnum(ts), _unnum(sk), arrival, rd.events[i]) for ts, sk, arrival, i in data["held"]]
    eng.resume_stream(StreamState(s["next_seq"], tuple(map(_unnum, s["watermark"])), s["next_arrival"],
                                  data["next_query_id"], held))
    rt.tick, rt.now, rt._next_sweep = s["tick"], _unnum(s["now"]), s["next_sweep"]
    for i, rec in enumerate(data["runs"]):
        where = f"runs[{i}]"
        r = FullRun(plans.state(rec["state"], where), tuple(rd.value(x) for x in rec["vec"]),
                    None if rec["entry"] is None else rd.entries[rec["entry"]], tuple(rec["version"]), rec["first_ts"],
                    rec["first_pos"], rd.value(rec["key"]), rec["born"], rec["tick"], rec["ptick"])
        r.blocked = frozenset(plans.node(n, where) for n in rec["blocked"])
        plans.run(r, where)
        rt._store_many([r])
        r.state.node.root.live += 1
        rt.counters.live_runs += 1
    for i, (ref, entries) in enumerate(data["buffer"]):
        node = plans.node(ref, f"buffer[{i}]")
        stack = [rd.entries[j] for j in entries]
        check_stack(node, stack, f"buffer[{i}]")
        rt.buffer.load(node, stack)
    for i, (ref, key, positions, events) in enumerate(data["negations"]):
        neg = plans.negation(ref, f"negations[{i}]")
        store = rt.negations.of[neg]
        store.buckets[rd.value(key)] = (list(positions), [rd.events[j] for j in events])
        rt.negations.holding.add(store)
    for i, p in enumerate(data["pending"]):
        plan = plans.plan(p["query"], f"pending[{i}]")
        key, vec, deadline = rd.value(p["key"]), tuple(rd.value(x) for x in p["vec"]), _unnum(p["deadline"])
        plans.pending(plan, vec, p["match"], f"pending[{i}]")
        rank = p.get("rank")  # (absent: not a feedback query's)
        pend = Pending(plan, key, vec, p["last_pos"], deadline, p["match"], depth=p.get("depth", 0),
                       rank=None if rank is None else (rank[0], rank[1], rank[2]))
        rt.deadlines.pending[plan].setdefault(key, []).append(pend)
        rt.deadlines.waiting.add(plan)
        rt.deadlines.heap.append((deadline, p["order"], pend))
    heapq.heapify(rt.deadlines.heap)
    for i, (attrs, ticks) in enumerate(data["partition_ticks"]):
        if tuple(attrs) not in rt.pticks:
            raise corrupt(f"partition_ticks[{i}]", f"no query counts partition ticks by {attrs}")
        rt.pticks[tuple(attrs)] = {rd.value(k): n for k, n in ticks}
    for i, (ref, cap_check, reported) in enumerate(data["branches"]):
        root = plans.node(ref, f"branches[{i}]").root
        root.cap_check, root.reported = cap_check, reported
    for i, (qid, state) in enumerate(data.get("set_queries", [])):
        set_checkpoint.load(plans.matcher(qid, state, f"set_queries[{i}]"), state, rd, f"set_queries[{i}]")
    v = data["versions"]
    rt._roots, rt._branches, rt.deadlines.order = count(v["next_root"]), count(v["next_branch"]), count(v["next_order"])
    c, saved = rt.counters, data["counters"]
    for k in ("events", "runs_started", "runs_created", "runs_touched", "peak_runs", "peak_buffer", "failed"):
        setattr(c, k, saved[k])
    c.matches = defaultdict(int, {k: n for k, n in saved["matches"]})
    c.shed_runs = defaultdict(int, {k: n for k, n in saved["shed_runs"]})
    eng.feedback.derived, eng.feedback.dropped = saved.get("derived", 0), saved.get("derived_dropped", 0)
    eng.released_early = saved.get("released_early", 0)
    dl = eng.dead_letters
    dl.count += data["dead_letters"]["count"]
    dl.by_reason.update(data["dead_letters"]["by_reason"])
    return eng


# --- resuming a feed ----------------------------------------------------------------


class SkipConsumed:
    """Re-reading the same input after a restore: drop what the checkpoint already consumed.

    Stands in for the reader's dead-letter sink and filters its events: ``seq``
    below the restored engine's next seq were processed (or are held in its
    reorder buffer), and the reports of records up to ``reported`` (the last
    seq the checkpoint's run had reported: its reader reads ahead of the
    engine) are in the checkpoint's count and output already — neither is
    repeated.
    """

    def __init__(self, engine, dead_letters, reported: int = -1) -> None:
        self.cut = engine.next_seq
        self.reported = reported
        self.dead_letters = dead_letters
        self.skipped: Counter[str] = Counter()  #: reports not repeated, by reason (what the input held is still known)

    def report(self, seq: int, position: str, reason: str, raw: str | None = None) -> None:
        if seq >= self.cut and seq > self.reported:
            self.dead_letters.report(seq, position, reason, raw)
        else:
            self.skipped[reason.split(":", 1)[0]] += 1

    def batches(self, batches, seen: Callable[[list], None] | None = None):
        """The batches of events (``yfpp.input.readers.read_event_batches``) without the consumed events (passed
        to ``seen``, if given)."""
        cut = self.cut
        for batch in batches:
            if batch[0].seq < cut:
                if seen is not None:
                    seen([ev for ev in batch if ev.seq < cut])
                batch = [ev for ev in batch if ev.seq >= cut]
            if batch:
                yield batch


# --- files --------------------------------------------------------------------------


def write_checkpoint(engine, path: str | os.PathLike[str], extra: dict | None = None,
                     patterns: EncodedPatterns | None = None) -> None:
    """Write ``engine``'s snapshot (plus ``extra`` fields; ``patterns``: see :func:`snapshot`) to ``path``
    atomically: a temp file, fsync, rename."""
    data = snapshot(engine, patterns)
    if extra:
        data.update(extra)
    write_pieces(json_pieces(data, patterns), path)


_PIECE = 2000  #: list items JSON-encoded in one call by :func:`json_pieces`


def json_pieces(data: dict, patterns: EncodedPatterns | None = None) -> Iterator[str]:
    """``data`` (a snapshot) as compact JSON, in pieces: a long list :data:`_PIECE` items at a time (the encoder
    holds the GIL through one call: other threads run between the pieces). With ``patterns``, a version-3 query
    row ``[id, name, None, pattern IR, since_tick]`` whose pattern it keeps the JSON text of is written with that
    text, not encoded again."""
    yield "{"
    for i, (key, value) in enumerate(data.items()):
        yield f'{"," if i else ""}{_ENCODE(key)}:'
        if key == "queries" and patterns is not None and data.get("shapes") is not None:
            yield from _query_rows(value, patterns)
        elif type(value) is list and len(value) > _PIECE:
            yield "["
            for j in range(0, len(value), _PIECE):
                yield ("," if j else "") + _ENCODE(value[j:j + _PIECE])[1:-1]
            yield "]"
        else:
            yield _ENCODE(value)
    yield "}"


def _query_rows(rows: list[list], patterns: EncodedPatterns) -> Iterator[str]:
    """The version-3 ``queries`` list, in pieces (:func:`json_pieces`), each made when it is asked for."""
    yield "["
    sep = ""
    plain: list[list] = []  # rows encoded together (one encoder call per row took a second for 100,000 rows)
    for row in rows:
        qid, name, shape, what, since = row
        text = patterns.text(qid, what) if shape is None else None
        if text is None:
            plain.append(row)
            if len(plain) < _PIECE:
                continue
        if plain:
            yield sep + _ENCODE(plain)[1:-1]
            sep, plain = ",", []
        if text is not None:
            yield sep + f"[{qid:d},{_ENCODE(name)},null,{text},{since if type(since) is int else _ENCODE(since)}]"
            sep = ","
    if plain:
        yield sep + _ENCODE(plain)[1:-1]
    yield "]"


class Cancelled(Exception):
    """:func:`write_pieces` was cancelled (nothing was written)."""


def write_json(data: Any, path: str | os.PathLike[str]) -> None:
    """``data`` as JSON in ``path``, atomically (:func:`write_pieces`)."""
    write_pieces([_ENCODE(data)], path)  # (json.dump writes through the slower Python encoder)


def write_pieces(pieces: Iterable[str], path: str | os.PathLike[str],
                 cancelled: Callable[[], bool] | None = None) -> None:
    """The text ``pieces`` in ``path``, atomically: a temp file in the same directory, fsync, rename;
    :class:`Cancelled` (and nothing written) once ``cancelled()`` says so between two pieces."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent or ".")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            for piece in pieces:
                if cancelled is not None and cancelled():
                    raise Cancelled
                f.write(piece)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_checkpoint(path: str | os.PathLike[str]) -> dict:
    """The checkpoint data in ``path`` (restore it with ``Engine.restore``)."""
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except OSError as e:
        raise YfppError(f"cannot read checkpoint {path}: {e.strerror}") from e
    except ValueError as e:
        raise YfppError(f"checkpoint {path} is not valid JSON: {e}") from e
    except RecursionError as e:
        raise YfppError(f"checkpoint {path} is not a checkpoint: nested too deeply") from e
