"""How queries are spread over Spark partitions (no pyspark import here).

Queries are grouped so that each group can run on independent slices of the
stream, one yfpp :class:`~yfpp.engine.Engine` per slice:

* **keyed** — an equivalence list and no strict contiguity: the events of
  one key value never meet another key's runs, so the group is partitioned by
  the key. An event lacking a key attribute belongs to no partition. An
  event-set query is keyed also by the attributes its equality
  relationships give all of a match's events (:func:`spark_key`).
* **sliced** — every other query with a window and the ``all`` policy: the
  stream is cut into time slices overlapping by the group's largest window
  (see :class:`Slicing`). Strict contiguity is global (an event of any key,
  or of none, kills a strict run), so a keyed strict query lands here.
* **whole** — no window, or ``non_overlapping`` without a key (its output
  depends on the whole history): one slice, one engine.

Feedback queries (``yfpp.runtime.feedback``) run in their group's engines, so their
derived events reach only the queries of their own partition:
:func:`check_feedback` accepts them when that is all ``yfpp run`` would
reach too (see its docstring) and refuses them otherwise.
"""

from __future__ import annotations

import gc
import json
import math
import pickle
import uuid
import zlib
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any, Iterable, Iterator, Mapping, Sequence

import orjson
from lxml import etree

from yfpp.input.dead_letters import DeadLetters
from yfpp.engine import Engine
from yfpp.errors import YfppError
from yfpp.state.memory_cap import RARE_COLLECTIONS
from yfpp.sets.plan import partition_attributes
from yfpp.input.events import MISSING, Event
from yfpp.runtime.feedback import MAX_DEPTH, MAX_DERIVED
from yfpp.output.writer import encode_match, match_line
from yfpp.language.pattern import Contiguity, Index, Kind, Pattern, Ref, XPathTest, walk

Query = tuple[Any, Pattern]  # (name — or the engine's id for an unnamed query, pattern)

#: The XML parser for an event's element shipped as text: as hardened as the reader's.
_PARSER = etree.XMLParser(resolve_entities=False, no_network=True, load_dtd=False, huge_tree=False)


class EffectiveQueries(list):
    """The ``[(name, pattern)]`` :func:`effective_queries` returns, with the ``policy`` it applied: given to
    it again (the same policy, or none), it is returned as it is — validated and compiled once per job."""

    def __init__(self, items: Iterable[Query], policy: str | None):
        super().__init__(items)
        self.policy = policy


def effective_queries(queries: Mapping[str, str | Pattern] | Iterable[str | Pattern | tuple[str, str | Pattern]],
                      policy: str | None = None) -> EffectiveQueries:
    """``[(name, pattern)]``, validated and compiled once here (errors surface on the driver).

    ``queries`` is a mapping name → query, or a sequence of queries or
    ``(name, query)`` pairs; an unnamed query is named by its position, as
    :meth:`Engine.register` names it by its id. ``policy`` overrides every query's.
    """
    if isinstance(queries, EffectiveQueries) and policy in (None, queries.policy):
        return queries
    items = queries.items() if isinstance(queries, Mapping) else queries
    engine = Engine(policy=policy)
    for item in items:
        name, query = item if isinstance(item, tuple) else (None, item)
        engine.register(query, name=name)
    plans = {**engine.queries, **{qid: m.plan for qid, m in engine.set_queries.items()}}
    return EffectiveQueries(((plans[qid].name, plans[qid].pattern) for qid in sorted(plans)), policy)


def spark_key(p: Pattern) -> tuple[str, ...]:
    """The attributes a query can be partitioned by: its equivalence list, or for an event-set
    query without one, the attributes its equality relationships give every event of a match
    (``yfpp.sets.plan.partition_attributes``, Definition 6 of the match-windows paper) — unless
    it is ``non_overlapping``: that policy goes by the equivalence list's partitions alone."""
    if p.partition_by or not p.has_sets or p.policy == "non_overlapping":
        return p.partition_by
    return partition_attributes(p)


def is_strict(p: Pattern) -> bool:
    """Does a run of ``p`` depend on every event of the stream (strict contiguity anywhere)?"""
    pos = p.positives
    return any(c.contiguity is Contiguity.STRICT for c in pos[1:]) or any(
        c.kind is Kind.KLEENE and c.inner is Contiguity.STRICT for c in pos)


@dataclass(frozen=True)
class Group:
    """Queries that share one engine per partition or slice."""

    queries: tuple[Query, ...]
    key: tuple[str, ...] = ()  # the equivalence attributes (keyed groups)
    window: float | None = None  # the largest window; None: unbounded
    sliced: bool = False
    full_events: bool = False  # matches list their bound events in full (``Engine(full_events=True)``)
    iso_times: bool = False  # a match's JSON line has its start and end as ISO-8601 UTC text (``yfpp run --ts-format iso``)
    feedback_limits: tuple[int, int] = (MAX_DEPTH, MAX_DERIVED)  # the engine's max_feedback_depth, max_derived_per_event

    def engine(self, **opts: Any) -> Engine:
        """A fresh engine with the group's queries; ``opts``: further :class:`Engine` options (caps, strategy…)."""
        depth, derived = self.feedback_limits
        eng = Engine(full_events=self.full_events, max_feedback_depth=depth, max_derived_per_event=derived,
                     **{"dead_letters": DeadLetters(), **opts})
        for name, pattern in self.queries:
            eng.register(pattern, name=name)
        return eng

    @property
    def trailing_windows(self) -> list[float]:
        """The windows of the queries that end in a negation (their deadlines)."""
        return [p.window for _, p in self.queries if not p.components[-1].positive and p.window is not None]

    def key_of(self, ev: Event) -> Any:
        """The event's equivalence-key value (``None`` if it lacks one); ``()`` for unkeyed groups."""
        vals = tuple(ev.get(a) for a in self.key)
        return None if MISSING in vals else vals


def _max_window(patterns: Iterable[Pattern]) -> float | None:
    windows = [p.window for p in patterns]
    return None if None in windows else max(windows)  # type: ignore[type-var]


def group_queries(queries: Sequence[Query], *, streaming: bool = False, full_events: bool = False,
                  feedback_limits: tuple[int, int] = (MAX_DEPTH, MAX_DERIVED), iso_times: bool = False,
                  runner: Runner | None = None) -> list[Group]:
    """Keyed groups by equivalence list, then at most one sliced and one whole group.

    ``streaming``: every ``non_overlapping`` query gets a group of its own (its
    state is cut after each chosen match, see ``yfpp.spark.stream``), and
    nothing is sliced (an unkeyed group is one state key). ``full_events``: the
    groups' engines list each match's bound events in full; ``feedback_limits``: their
    ``(max_feedback_depth, max_derived_per_event)`` loop guards; ``iso_times``: see :attr:`Group.iso_times`.
    """
    keyed: dict[tuple[str, ...], list[Query]] = {}
    sliced: list[Query] = []
    whole: list[Query] = []
    alone: list[Query] = []
    for q in queries:
        p = q[1]
        if streaming and p.policy == "non_overlapping":
            alone.append(q)
        elif spark_key(p) and not is_strict(p):
            keyed.setdefault(spark_key(p), []).append(q)
        elif p.window is None or p.policy == "non_overlapping" or streaming:
            whole.append(q)
        else:
            sliced.append(q)
    groups = [Group(tuple(qs), key, _max_window(p for _, p in qs)) for key, qs in keyed.items()]
    if sliced:
        groups.append(Group(tuple(sliced), (), _max_window(p for _, p in sliced), sliced=True))
    if whole:
        groups.append(Group(tuple(whole), (), _max_window(p for _, p in whole)))
    for q in alone:
        p = q[1]
        groups.append(Group((q,), spark_key(p) if not is_strict(p) else (), p.window))
    check_feedback(groups, streaming=streaming, runner=runner or SPARK)
    return [replace(g, full_events=full_events, feedback_limits=feedback_limits, iso_times=iso_times) for g in groups]


def value_hash(v: Any) -> int:
    """A hash of one key value that every process computes alike (no salted ``str`` hash) and that
    values Python finds equal share: numbers by Python's numeric hash (``7``, ``7.0``, ``True``/``1``
    alike), text by CRC-32, anything else by its repr's. A job's tasks and the workers of
    ``yfpp run --workers N`` over plain JSON lines (:mod:`yfpp.workers.compiled`) route keys by it, as the
    compiled line scan hashes them (:mod:`yfpp.spark.line_scan`)."""
    t = type(v)
    if t is int or t is bool or (t is float and v == v):  # NaN's hash is its identity
        return hash(v)
    return zlib.crc32((v if t is str else repr(v)).encode("utf-8", "surrogatepass"))


def hashable_keys(groups: Sequence[Group]) -> list[tuple[str, ...]]:
    """The keyed groups' equivalence lists the readers can hash (``yfpp.spark.parse.key_hash``): all but
    those naming the pseudo-attribute ``seq``, whose global value the readers do not know yet."""
    return list(dict.fromkeys(g.key for g in groups if g.key and "seq" not in g.key))


def needs_xml(groups: Sequence[Group]) -> bool:
    """Does a query read an event's XML element (an XPath predicate), so that it must travel with the event?"""
    return any(isinstance(node, XPathTest) for g in groups for _, p in g.queries
               for expr in [*p.where, *(e for _, e in (p.emit.attrs if p.emit else ()))] for node in walk(expr))


@dataclass(frozen=True)
class Runner:
    """Who runs a partitioned plan, as :func:`check_feedback`'s messages name it."""

    where: str  # "on Spark": a feedback query needs … ``where``
    instead: str  # what to run for one engine's routing of derived events


SPARK = Runner("on Spark", "run 'yfpp run'")


def check_feedback(groups: Sequence[Group], *, streaming: bool = False, runner: Runner = SPARK) -> None:
    """Refuse feedback queries whose derived events a partitioned job would route differently from ``yfpp run``.

    A feedback query is accepted when it is in a keyed group (an equivalence
    list, no strict step), its result event keeps the partition key — for
    each key attribute ``a`` an attribute ``a = v.a`` of a bound event, so
    the derived event belongs to the partition of the events it came from —
    and no query of another group can see a derived event: none tests its
    type or any type, and none uses strict or partition contiguity.
    Streaming jobs refuse feedback queries.
    """
    for grp in groups:
        for name, p in grp.queries:
            if not p.feedback:
                continue
            if streaming:
                raise YfppError(f"query {name!r}: feedback queries run in batch jobs only, not with --stream")
            if not grp.key:
                raise YfppError(f"query {name!r}: {runner.where} a feedback query needs an equivalence list and no strict "
                                "step, so that its derived events stay in the partition of the events they came from")
            kept = {k for k, e in p.emit.attrs if _keeps(p, k, e)}
            missing = [a for a in grp.key if a not in kept]
            if missing:
                want = ", ".join(f"{a} = {p.positives[0].var}.{a}" for a in missing)
                raise YfppError(f"query {name!r}: {runner.where} a feedback query's result event must keep the partition "
                                f"key of the events it came from: add {want} to its RETURN / => attributes")
            derived = p.emit.event_type
            for other in groups:
                if other is grp:
                    continue
                for oname, op in other.queries:
                    if _may_see(op, derived):
                        raise YfppError(f"query {oname!r} would see the events query {name!r} feeds back, but runs in "
                                        f"another partitioning {runner.where} (equivalence list {list(op.partition_by)} "
                                        f"vs {list(grp.key)}): give both the same equivalence list, or {runner.instead}")


def _keeps(p: Pattern, attr: str, expr: Any) -> bool:
    """Is ``expr`` the key attribute ``attr`` of one bound event?"""
    if not isinstance(expr, Ref) or expr.attr != attr:
        return False
    kleene = p.component(expr.var).kind is Kind.KLEENE
    return expr.index in ((Index.FIRST, Index.LAST) if kleene else (Index.EACH,))


def _may_see(p: Pattern, event_type: str) -> bool:
    """Could an event of ``event_type`` change ``p``'s matches (by its type, or by merely occurring)?"""
    if any(c.event_type in (None, event_type) for c in p.components):
        return True
    pos = p.positives
    return any(c.contiguity in (Contiguity.STRICT, Contiguity.PARTITION) for c in pos[1:]) or any(
        c.kind is Kind.KLEENE and c.inner in (Contiguity.STRICT, Contiguity.PARTITION) for c in pos)


#: A slice spans at least this many windows (the overlap read twice is 1/SLICE_WINDOWS).
SLICE_WINDOWS = 4


@dataclass(frozen=True)
class Slicing:
    """Time slices of length ``length`` from ``t0``, each extended by ``window``.

    Slice ``i`` **owns** the matches whose first event has ``ts`` in
    ``[t0 + i·length, t0 + (i+1)·length)`` and reads every event with ``ts`` in
    ``[t0 + i·length, t0 + (i+1)·length + window]``: a match spans at most the
    window (``last.ts − first.ts ≤ W``) and a trailing negation's witnesses
    lie before ``first.ts + W``, so the slice sees everything its matches
    depend on, and each match is kept by exactly one slice.
    """

    t0: float
    length: float
    window: float

    def own(self, ts: float) -> int:
        """The slice that owns a match starting at ``ts`` (also computed with numpy, same arithmetic)."""
        return math.floor((ts - self.t0) / self.length)

    def reads(self, ts: float) -> range:
        """The slices that read an event at ``ts`` (``yfpp.spark.batch._packer`` computes the same with numpy).

        ``ceil(…) − 1`` is the first slice whose extended end reaches ``ts``;
        the ``1e-9`` (in slice lengths) keeps float rounding from losing it.
        """
        rel = ts - self.t0
        return range(max(0, math.ceil((rel - self.window) / self.length - 1e-9) - 1), self.own(ts) + 1)

    @staticmethod
    def plan(t0: float, t1: float, window: float, slices: int) -> "Slicing | None":
        """About ``slices`` slices over ``[t0, t1]``, each at least a window long; None: one slice."""
        length = max(window, (t1 - t0) / max(slices, 1))
        if length <= 0 or t1 - t0 < length:
            return None
        return Slicing(t0, length, window)


@contextmanager
def rare_collections() -> Iterator[None]:
    """The cyclic garbage collector held off while a task matches, as ``yfpp run`` holds it off: the
    objects alive so far frozen, and a collection every 100,000 allocations rather than 700 (runs,
    buffered events and matches form no reference cycles; rescanning them took a tenth to a third of
    a task's time). The Python worker's own settings come back afterwards (workers are reused)."""
    threshold = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(*RARE_COLLECTIONS)
    try:
        yield
    finally:
        gc.set_threshold(*threshold)
        gc.unfreeze()


# --- events as rows ---------------------------------------------------------------------


class XmlEvent(Event):
    """An event whose XML element travels as text and is parsed only when a predicate reads it."""

    __slots__ = ("xml",)

    def __init__(self, type: str, ts: float, attrs: dict[str, Any], seq: int, xml: str):
        super().__init__(type, ts, attrs, seq)
        self.xml = xml

    @property
    def _element(self):
        """The element, parsed from ``xml`` on first use (also by the XPath fast path, which reads ``_element``)."""
        if self._el is None:
            self._el = etree.fromstring(self.xml, _PARSER)
        return self._el

    @_element.setter
    def _element(self, el) -> None:
        self._el = el


def make_event(type: str, ts: float, seq: int, attrs: str, xml: str | None) -> Event:
    """The Event of one row (``attrs`` is a JSON object)."""
    a = load_attrs(attrs)
    return Event(type, ts, a, seq) if xml is None else XmlEvent(type, ts, a, seq, xml)


def load_attrs(text: str) -> dict[str, Any]:
    """An ``attrs`` JSON object as the standard library reads it, by orjson (a fifth of the time) where that
    is exact: orjson reads an integer beyond 64 bits as a float, and refuses ``NaN`` and ``Infinity``
    (which the readers write with the standard library, ``yfpp.spark.parse._json``) — so a float of 2⁶³
    or more, a nested value (not checked) or a refused text is read by the standard library."""
    try:
        a = orjson.loads(text)
    except orjson.JSONDecodeError:
        return json.loads(text)
    kinds = set(map(type, a.values()))
    if (float in kinds and not all(-_BIG < v < _BIG for v in a.values() if type(v) is float)) \
            or dict in kinds or list in kinds:
        return json.loads(text)
    return a


_BIG = 2.0 ** 63  #: a float this large may be an integer orjson rounded


def match_row(m: dict, ids_as_text: bool = False, iso_times: bool = False) -> tuple:
    """``(query, bindings, start, end, emit JSON, docs/semantics.md §10 JSON line)``; ``ids_as_text``: seq numbers
    as strings; ``iso_times``: the line's start and end as ISO-8601 UTC text, as ``yfpp run --ts-format iso`` writes
    them (the columns stay seconds)."""
    emit = m.get("emit")
    binds = {v: [str(s) for s in ids] for v, ids in m["bindings"].items()} if ids_as_text else m["bindings"]
    # (match_line: json.dumps's text, from orjson when that is certain to be the same; ASCII either way)
    return (str(m["query"]), binds, m["start"], m["end"],
            None if emit is None else match_line(emit)[:-1].decode("ascii"),
            encode_match(m, iso_times)[:-1].decode("ascii"))


# --- streaming state ------------------------------------------------------------------


class LiveEngines:
    """Engines kept alive in a Python worker between micro-batches, each under the token of the state it
    has reached: a state key's next call continues its engine (no compiling, no replay) when the state
    it is given carries that token — it is the state this worker's engine left (not one rolled back by
    a failed micro-batch, nor a state key last run by another worker). The oldest are dropped beyond
    ``size`` (an engine of 1,000 subscriptions holds about 8 MB; a worker runs a few state keys)."""

    def __init__(self, size: int = 16):
        self.size = size
        self.engines: dict[str, Engine] = {}

    def take(self, token: str | None) -> Engine | None:
        """The engine left at state ``token`` (no longer kept here), or None."""
        return self.engines.pop(token, None) if token is not None else None

    def keep(self, engine: Engine) -> str:
        """Keep ``engine``; return the token for its state."""
        token = uuid.uuid4().hex
        self.engines[token] = engine
        while len(self.engines) > self.size:
            del self.engines[next(iter(self.engines))]
        return token


_LIVE = LiveEngines()  #: this Python worker's live engines


def advance_key(grp: Group, state: Any, rows: list[tuple], wm_ms: int, shift: float = 0.0,
                live: LiveEngines | None = _LIVE, slice_of: tuple[Slicing, int] | None = None) -> list[dict]:
    """One call of the streaming state function for a state key — a bucket of key values (see ``yfpp.spark.stream``).

    Replay the bucket's kept events and its new ``rows`` ``(ts, seq, type, attrs, xml)``
    into a fresh engine — or, when ``live`` holds the engine that left this state, give it the new rows
    alone —, return the matches not emitted before, and update
    ``state`` (a :class:`pyspark.sql.streaming.state.GroupState`: the kept
    events and the ids of the emitted matches that a replay could make again)
    and its timeout. Spark's event time is ``ts + shift`` seconds (``wm_ms`` and
    the timeouts are in that time; 0 means no watermark yet). A ``non_overlapping`` group always replays
    (its cuts read the keys of the replayed events). ``slice_of``: the state key is slice ``s`` of a
    hot key's :class:`Slicing` (``yfpp.spark.stream_hot``; kept in the state for the calls without
    rows): only the matches that start in the slice are returned.
    """
    st = pickle.loads(state.get[0]) if state.exists else {"events": [], "emitted": {}}
    if slice_of is not None:
        st["slice"] = slice_of
    new = _advance(grp, state, st, rows, wm_ms, shift, live)
    if "slice" not in st:
        return new
    sl, s = st["slice"]
    return [m for m in new if sl.own(m["start"]) == s]


def _advance(grp: Group, state: Any, st: dict, rows: list[tuple], wm_ms: int, shift: float,
             live: LiveEngines | None) -> list[dict]:
    """:func:`advance_key`'s work on the state ``st`` as loaded; returns the matches not emitted before."""
    non_overlapping = grp.queries[0][1].policy == "non_overlapping"
    rows = sorted(rows, key=lambda r: (r[0], r[1]))
    kept = sorted(st["events"] + rows, key=lambda r: (r[0], r[1]))
    engine = None if live is None or non_overlapping else live.take(st.get("token"))
    evs = [make_event(t, ts, seq, a, x) for ts, seq, t, a, x in (kept if engine is None else rows)]
    engine = engine or grp.engine()
    out = [m for ev in evs for m in engine.process(ev)]
    wm = wm_ms / 1000 - shift if wm_ms > 0 else None
    if wm is not None:
        out += engine.advance_time(wm)
    emitted = st["emitted"]
    cuts: dict[Any, int] = {}  # non_overlapping: key value → end of its last chosen match
    new = []
    by_seq = {ev.seq: ev for ev in evs} if non_overlapping else {}
    for m in out:
        i = m["id"]
        if i not in emitted:
            emitted[i] = m["start"]
            new.append(m)
        if non_overlapping:
            seqs = [s for lst in m["bindings"].values() for s in lst]
            k = grp.key_of(by_seq[min(seqs)])
            cuts[k] = max(cuts.get(k, -1), max(seqs))
    # Later events have ts ≥ max(last ts, watermark), and pending deadlines before both are decided.
    now = max(kept[-1][0], wm) if wm is not None and kept else kept[-1][0] if kept else -math.inf
    horizon = now - grp.window if grp.window is not None else -math.inf
    keys = [grp.key_of(ev) for ev in evs] if non_overlapping else [None] * len(kept)
    keep = [r for r, k in zip(kept, keys) if r[0] >= horizon and r[1] > cuts.get(k, -1)]
    if not keep:
        state.remove()
        return new
    st = {"events": keep, "emitted": {i: s for i, s in emitted.items() if s >= horizon},
          **({"slice": st["slice"]} if "slice" in st else {})}
    if live is not None and not non_overlapping:
        st["token"] = live.keep(engine)
    state.update((pickle.dumps(st),))
    trailing = grp.trailing_windows
    wakeups = [r[0] + w for r in keep for w in trailing]  # possible deadlines
    if grp.window is not None:
        wakeups.append(keep[-1][0] + grp.window)  # every kept event has left the window
    due = [ms for ms in (math.floor((t + shift) * 1000) for t in wakeups) if ms >= wm_ms]
    if due:
        state.setTimeoutTimestamp(min(due))
    return new
