"""The embedded engine (README, "Python API"): register queries, push events, get matches.

``Engine`` owns stream order: it assigns ``seq`` to events that have none,
reorders within ``max_delay`` (default 0: no reordering) and reports late
events to its :class:`~yfpp.input.dead_letters.DeadLetters` instead of dropping
them silently.  Matching itself is the :class:`~yfpp.runtime.runtime.Runtime`'s;
once a feedback query is registered, events go through
:class:`~yfpp.runtime.feedback.Feedback`, which also processes the derived events.

Stream order is ``(ts, seq)``: the reorder buffer releases events in that
order (events whose ``seq`` is not an int — derived events — after the
int-seq events of the same ts, in arrival order).  The *watermark* is the
``(ts, seq)`` of the last event released, or ``ts - max_delay`` of the last
:meth:`Engine.advance_time`; an event below it is late.
"""

from __future__ import annotations

import copy
import dataclasses
import heapq
import json
import math
import numbers
import os
import sys
from decimal import Decimal
from itertools import count
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Protocol, Sequence, TextIO, TypeVar

from yfpp.input.dead_letters import DeadLetters
from yfpp.errors import YfppError
from yfpp.input.events import Event
from yfpp.runtime.feedback import MAX_DEPTH, MAX_DERIVED, Feedback
from yfpp.nfa.compiler import QueryPlan, compile_pattern
from yfpp.language.pattern import POLICIES, SET_POLICIES, STRATEGIES, Pattern
from yfpp.language.query_limits import MAX_QUERY_CHARS, check_text
from yfpp.language.query_text import QueryShapes, parse_query
from yfpp.nfa.shape_plans import QuerySources, ShapePlan, ShapePlans
from yfpp.runtime.runtime import Runtime
from yfpp.state.memory_cap import MemoryCap, collection_paused, default_cap_mib

if TYPE_CHECKING:
    from yfpp.sets.strategies import SetMatcher  # imported when an event-set query is registered
    from yfpp.state.checkpoint import StreamState

#: Default caps per query (per branch of the shared NFA, see docs/operations.md); the environment
#: variables YFPP_MAX_RUNS_PER_QUERY / YFPP_MAX_BUFFER_PER_QUERY override them (how `yfpp spark`
#: passes its flags to the engines on the executors).
MAX_RUNS_PER_QUERY = 250_000
MAX_BUFFER_PER_QUERY = 1_000_000
MAX_HELD = 1_000_000  #: events the reorder buffer holds at most (docs/operations.md)
#: queries an engine holds at most (docs/operations.md, "Memory caps"; YFPP_MAX_QUERIES overrides it): at the
#: memory a subscription takes (benchmarks/RESULTS.md, "Million subscriptions"), a bound on what registering takes
MAX_QUERIES = 2_000_000
STDERR: Any = type("Stderr", (), {"__repr__": lambda self: "sys.stderr"})()  # the default report stream, looked up when used


class _Extendable(Protocol):
    def extend(self, matches: list[dict], /) -> Any: ...


MatchOut = TypeVar("MatchOut", bound=_Extendable)  #: where matches go as they are made: a list, a writer…

_LAST = float("inf")  # the order key of a derived event's non-int seq: after the int seqs of its ts


class Engine:
    """Many queries over one event stream.

    >>> eng = Engine()
    >>> qid = eng.register("PATTERN SEQ(shelf a, exit c) WHERE [tag_id]", name="out")
    >>> eng.process({"type": "shelf", "ts": 1, "tag_id": 7})
    []
    >>> eng.process({"type": "exit", "ts": 5, "tag_id": 7})
    [{'query': 'out', 'id': '4e1110d1828aaf3b', 'bindings': {'a': [0], 'c': [1]}, 'start': 1.0, 'end': 5.0}]

    ``max_runs_per_query`` / ``max_buffer_per_query`` cap the live runs and the
    buffered events of each query; over a cap the query's oldest runs are shed,
    counted in ``stats.shed_runs`` and reported (a line on ``reports``, kept in
    ``self.reports``).  ``reports`` also gets the "state is growing" warnings of
    queries without a window.  ``full_events``: every match also lists its
    bound events in full (``"events"``); ``max_feedback_depth`` /
    ``max_derived_per_event``: the loop guards of feedback queries
    (``yfpp.runtime.feedback``).  ``merge_runs``: merge equivalent runs into one
    (SIGMOD 2008 §5.2.2, ``yfpp.runtime.run_merging``): the same matches, fewer runs
    to step when many runs of a partition agree on what lies ahead.  ``max_queries``: how many queries
    it holds at most (default ``MAX_QUERIES``; a registration beyond is refused with an error).  ``max_memory_mb``:
    the resident set (MiB) past which a registration is refused with an error (default ``YFPP_MAX_MEMORY_MB``, else
    80 % of physical memory; ``yfpp.state.memory_cap``).  ``freeze_registered``: every registration ends with
    ``gc.freeze()``, so that Python's collector never walks the registered queries again (one at a time, a
    registration no longer pays for full collections over every query registered before) — process-wide: the
    application's objects of the moment are frozen too, and what an unregistered query leaves in reference cycles
    stays until ``gc.unfreeze()``; for a process whose work is holding subscriptions (docs/internals.md).

    ``copy.deepcopy(engine)``, ``copy.copy`` and ``pickle`` give an engine in the same state
    (queries, options, runs, held events, counters, the ``reports`` lines):
    it is ``Engine.restore(engine.snapshot())``, so it goes on with the same
    matches.  The outputs are not copied: the copy's dead letters and warnings
    go to stderr, as a new engine's do (``Engine.restore(engine.snapshot(),
    dead_letters=…, reports=…)`` gives a copy other outputs).
    """

    def __init__(
        self,
        *,
        max_delay: float = 0.0,
        max_held: int | None = None,
        dead_letters: DeadLetters | None = None,
        policy: str | None = None,
        max_runs_per_query: int | None = None,
        max_buffer_per_query: int | None = None,
        reports: TextIO | None | object = STDERR,
        full_events: bool = False,
        max_feedback_depth: int = MAX_DEPTH,
        max_derived_per_event: int = MAX_DERIVED,
        strategy: str = "direct",
        merge_runs: bool = False,
        max_queries: int | None = None,
        max_memory_mb: int | None = None,
        freeze_registered: bool = False,
    ):
        if strategy not in STRATEGIES:
            raise YfppError(f"unknown evaluation strategy {strategy!r} (expected one of {', '.join(STRATEGIES)})")
        self._held: list[tuple[float, float, int, Event]] = []  # the reorder buffer: a heap by (ts, seq key, arrival)
        self.max_delay = max_delay
        self.max_held = _cap("max_held", max_held, MAX_HELD)
        self.released_early = 0  # events the reorder buffer released over max_held, before their delay was up
        max_runs_per_query = _cap("max_runs_per_query", max_runs_per_query, MAX_RUNS_PER_QUERY)
        max_buffer_per_query = _cap("max_buffer_per_query", max_buffer_per_query, MAX_BUFFER_PER_QUERY)
        self.max_queries = _cap("max_queries", max_queries, MAX_QUERIES)
        self.freeze_registered = bool(freeze_registered)
        self._memory = MemoryCap(default_cap_mib() if max_memory_mb is None else _cap("max_memory_mb", max_memory_mb, 1))
        _check_policy(policy)
        self.runtime = Runtime(int(max_runs_per_query), int(max_buffer_per_query), self._failed, self._report,
                               merge_runs=bool(merge_runs))
        self.runtime.full_events = full_events
        self.strategy = strategy  # for event-set queries (docs/event_sets.md)
        self.set_queries: dict[int, SetMatcher] = {}
        self.dead_letters = dead_letters if dead_letters is not None else DeadLetters(sys.stderr)
        self.feedback = Feedback(self.runtime, self.dead_letters, max_feedback_depth, max_derived_per_event, self._step)
        self.default_policy = policy
        self.queries: dict[int, QueryPlan] = {}
        self.sources = QuerySources()  # (pattern, text, name) by id, for checkpoints
        self.reports: list[str] = []
        self._report_stream = sys.stderr if reports is STDERR else reports
        if reports is not None and not callable(getattr(self._report_stream, "write", None)):
            raise YfppError(f"reports must be a text stream or None, not {type(reports).__name__}")
        self._shapes = QueryShapes()  # query texts that differ only by constants are parsed once
        self._plans = ShapePlans(lambda p: not merge_runs and self._for_nfa(p))  # and compiled once
        self._names: set[str] = set()  # the queries' names (one without a name is known by its id: not kept here)
        self._ids = count()
        self._next_seq = 0
        self._arrivals = count()
        self._mark_ts = self._mark_sk = float("-inf")  # the watermark, (ts, seq key): see _mark
        self._route_events()

    # --- queries --------------------------------------------------------------------

    def register(self, query: str | Pattern, name: str | None = None, *, policy: str | None = None,
                 feedback: bool = False, query_id: int | None = None,
                 split: tuple[Sequence[str], list[str]] | None = None) -> int:
        """Compile and add a query (SASE+ text, extended-XPath text or a Pattern); return its id.

        ``name`` (a non-empty string) names its matches; without one they carry the id.
        ``feedback=True`` routes its result events back into the stream, as
        its own ``FEEDBACK`` clause does (``yfpp.runtime.feedback``).  ``query_id``: the id
        to give it (a restored query keeps its own), else the next one.  ``split``: the text
        around the query text's constants and its constants (``yfpp.language.query_text.split_constants``),
        when the caller has them (a checkpoint keeps its queries so).  A query refused
        (an error raised) leaves the engine as it was.  No garbage collection runs meanwhile
        (``yfpp.state.memory_cap.collection_paused``): what a registration makes and drops goes by reference
        counting, and only what it keeps is counted towards the next collection.
        """
        with collection_paused(self.freeze_registered):
            return self._register(query, name, policy, feedback, query_id, split)

    def _register(self, query: str | Pattern, name: str | None, policy: str | None, feedback: bool,
                  query_id: int | None = None, split: tuple[Sequence[str], list[str]] | None = None) -> int:
        """:meth:`register`, the collector paused by the caller (its arguments by position: a batch calls it per
        query)."""
        if name is not None or query_id is not None:
            self._check_name_id(name, query_id)
        shape, constants, pattern = None, [], None
        if isinstance(query, str):
            shape, constants = self._shapes.shape_of(query, "s", split)
            if shape is None:
                pattern = parse_query(query)
        elif isinstance(query, Pattern):
            pattern = query.validate()
        else:
            raise YfppError(f"register() takes query text or a Pattern, not {type(query).__name__}")
        self._check_room(name)
        if policy is not None:
            _check_policy(policy)
        policy = policy or self.default_policy
        splan = None
        if shape is not None:  # (a query of a shape met before: made from the shape's plan, when it has one)
            splan = self._plans.get(shape, policy, feedback)
            if splan is None:
                pattern = shape.instance(query, constants)  # type: ignore[arg-type]
        qid = next(self._ids) if query_id is None else self._claim_id(query_id)
        name_or_id = name if name is not None else qid
        if splan is not None:
            return self._add_planned(splan, qid, constants, query, name)  # type: ignore[arg-type]
        assert pattern is not None
        if policy is not None and policy != pattern.policy:
            pattern = dataclasses.replace(pattern, policy=policy).validate()
        if feedback and not pattern.feedback:
            pattern = dataclasses.replace(pattern, feedback=True).validate()
        source = (pattern, query if isinstance(query, str) else None, name)
        if not self._for_nfa(pattern):
            from yfpp.sets.matcher import Limits
            from yfpp.sets.strategies import set_matcher

            limits = Limits(self.runtime.max_runs, self.runtime.max_buffer, self._shed_sets, self._matched_sets)
            matcher = self.set_queries[qid] = set_matcher(pattern, name_or_id, self.strategy, limits)
            matcher.plan.full_events = self.runtime.full_events
            self.sources[qid] = source
            if name is not None:
                self._names.add(name)
            if pattern.feedback:
                self.feedback.order[matcher.plan] = qid
            self._route_events()
            return qid
        plan = compile_pattern(pattern, name_or_id)
        self.sources[qid] = source
        return self._add(qid, plan, name)

    def _check_name_id(self, name: str | None, query_id: int | None) -> None:
        """Refuse a name that is not a non-empty string, and a ``query_id`` (when given) that is not free."""
        if name is not None and not (isinstance(name, str) and name):
            raise YfppError(f"a query name must be a non-empty string, not {_printable(name)!r:.80}")
        if query_id is not None and (type(query_id) is not int or query_id < 0 or query_id in self.sources):
            raise YfppError(f"query id {query_id!r} is not a free id (a non-negative integer no query has)")

    def _check_room(self, name: str | None) -> None:
        """Refuse a name taken, or one more query over ``max_queries`` or the memory cap."""
        if name is not None and name in self._names:
            raise YfppError(f"a query named {name!r} is already registered")
        if len(self.queries) + len(self.set_queries) >= self.max_queries:
            raise YfppError(f"the engine holds max_queries={self.max_queries:,} queries: unregister some, or give "
                            f"Engine(max_queries=…) / YFPP_MAX_QUERIES more (docs/operations.md, \"Memory caps\")")
        self._memory.admit()

    def shape_plan(self, text: str, split: tuple[Sequence[str], list[str]], policy: str | None,
                   feedback: bool) -> ShapePlan | None:
        """The compiled plan of the shape of query ``text`` (``split``: its text around the constants and its
        constants) for a registration with ``policy`` and ``feedback``, as :meth:`register` finds it; None when
        its queries compile one by one.  With :meth:`register_planned`, queries of one shape are registered with
        the shape found once (a checkpoint's restore)."""
        shape, _ = self._shapes.shape_of(text, split=split)
        if shape is None:
            return None
        _check_policy(policy)
        return self._plans.get(shape, policy or self.default_policy, feedback)

    def register_planned(self, splan: ShapePlan, text: str, constants: list[str], name: str | None,
                         query_id: int) -> int:
        """:meth:`register` of query ``text`` of the shape whose plan is ``splan`` (:meth:`shape_plan`), whose
        constants as written are ``constants`` (the caller vouches for both), under ``query_id``; its id."""
        self._check_name_id(name, query_id)
        if len(text) > MAX_QUERY_CHARS:
            check_text(text)
        self._check_room(name)
        return self._add_planned(splan, self._claim_id(query_id), constants, text, name)

    def _add_planned(self, splan: ShapePlan, qid: int, constants: list[str], text: str, name: str | None) -> int:
        """Add query ``qid``, ``text`` of the shape whose plan is ``splan`` with ``constants``; its id."""
        plan = splan.plan(constants, name if name is not None else qid, text)
        self.sources.keep_planned(qid, plan)
        return self._add(qid, plan, name)

    def _add(self, qid: int, plan: QueryPlan, name: str | None) -> int:
        """Add a compiled query (its source kept) to the shared NFA; return its id."""
        self.queries[qid] = plan
        if name is not None:
            self._names.add(name)
        self.runtime.add(plan)
        plan.release_specs()
        if plan.feedback:
            self.feedback.order[plan] = qid
            self._route_events()  # (an NFA query without feedback leaves the route as it is)
        return qid

    def _claim_id(self, qid: int) -> int:
        """``qid``, given by the caller: the ids given from now on are past it."""
        from yfpp.state.checkpoint import peek

        after, self._ids = peek(self._ids)
        if qid >= after:
            self._ids = count(qid + 1)
        return qid

    def _for_nfa(self, pattern: Pattern) -> bool:
        """Does ``pattern`` go to the shared NFA (else to a set matcher: event sets, or ``match-window``)?"""
        return not (pattern.has_sets or (self.strategy == "match-window" and _windowable(pattern)))

    def register_many(self, queries: Iterable[str | Pattern | tuple[str | Pattern, str | None]], *,
                      policy: str | None = None, feedback: bool = False) -> list[int | YfppError]:
        """:meth:`register` each query (text or Pattern, or a ``(query, name)`` pair) in turn; return, per item in
        order, its id or the error that refused it (a :class:`~yfpp.errors.QueryError` says where in the text):
        a bad query refuses only itself.  Queries that differ only by constants are parsed and compiled once (as by
        :meth:`register`); the runtime's dispatch per event type is made again once, at the next event.  No
        garbage collection runs meanwhile (``yfpp.state.memory_cap.collection_paused``)."""
        out: list[int | YfppError] = []
        with collection_paused(self.freeze_registered):
            for item in queries:
                query, name = item if isinstance(item, tuple) and len(item) == 2 else (item, None)
                try:
                    out.append(self._register(query, name, policy, feedback))
                except YfppError as err:
                    out.append(err)
        return out

    def unregister(self, qid: int) -> None:
        """Remove a query: it emits nothing more and its runs are freed."""
        if not isinstance(qid, int):
            raise YfppError(f"unregister() takes a query id (an int, as register returned), not {_printable(qid)!r:.80}")
        matcher = self.set_queries.pop(qid, None)
        if matcher is not None:
            del self.sources[qid]
            self._names.discard(matcher.plan.name)
            self.feedback.order.pop(matcher.plan, None)
            self._route_events()
            return
        plan = self.queries.pop(qid, None)
        if plan is None:
            raise YfppError(f"no query with id {_printable(qid)}")
        del self.sources[qid]
        self._names.discard(plan.name)
        self.runtime.remove(plan)
        self.feedback.order.pop(plan, None)
        self._route_events()

    # --- events ---------------------------------------------------------------------

    def process(self, event: Event | Mapping[str, Any]) -> list[dict]:
        """Feed one event; return the matches it completes (and deadlines it passes).

        A record with a missing or empty type, or a ts that is not a finite real
        number, is reported to the dead letters (and returns ``[]``); so is a
        late event, with its record so that it can be replayed.
        """
        if isinstance(event, Event):  # (a subclass too)
            ts = event.ts
            seq = event.seq
            etype = event.type
            # the fast path: a finite float ts, a fresh int seq, past the watermark (a later ts, or the same ts and a
            # later seq), no reordering
            if (type(ts) is float and ts - ts == 0.0 and type(seq) is int and seq >= self._next_seq
                    and type(etype) is str and etype and self._direct):
                mark_ts = self._mark_ts
                if ts > mark_ts or (ts == mark_ts and seq > self._mark_sk):
                    self._next_seq = seq + 1
                    self._mark_ts = ts
                    self._mark_sk = seq
                    return self._one(event)
            return self._in_order(event)
        ev = self._as_event(event)
        return [] if ev is None else self._in_order(ev)

    def _as_event(self, event: Any) -> Event | None:
        """An Event, or a mapping as one (None: reported as malformed); anything else is refused."""
        if isinstance(event, Event):
            return event
        if isinstance(event, Mapping):
            return self._from_record(event)
        raise YfppError(f"process() takes an Event or a mapping, not {type(event).__name__}")

    def process_batch(self, events: Iterable[Event | Mapping[str, Any]], out: MatchOut) -> MatchOut:
        """:meth:`process` of each event in turn, their matches appended to ``out`` (returned), in order:
        ``out.extend(matches)`` as they are made (a list, or a writer).

        The same results as one ``process`` call per event, for less: an event that takes ``process``'s
        fast path goes to the runtime from this loop, with no call of ``process`` between.  Matches are
        appended as they are made — those of the shared NFA after each event, those of event-set
        queries a search at a time (``EMIT_CHUNK`` matches at most per ``extend``) — so what is held at
        once is not all the matches one event releases (docs/operations.md, "Memory caps").  When an
        exception escapes ``out.extend`` (Ctrl-C, a failed write), it ends the call with that event
        partly processed: go no further with this engine.
        """
        if not self._plain:  # event-set or feedback queries: matches into out as they are made
            in_order, as_event = self._in_order, self._as_event
            for event in events:
                ev = event if type(event) is Event else as_event(event)
                if ev is not None:
                    in_order(ev, out)
            return out
        one, process, extend = self._one, self.process, out.extend
        direct = self._direct
        for event in events:
            if type(event) is not Event:  # (a subclass or a mapping takes process)
                found = process(event)
            else:  # process's fast path, inline: the same test, the watermark moved before the runtime's step
                ts = event.ts
                seq = event.seq
                etype = event.type
                if (type(ts) is float and ts - ts == 0.0 and type(seq) is int and seq >= self._next_seq
                        and type(etype) is str and etype and direct
                        and (ts > self._mark_ts or (ts == self._mark_ts and seq > self._mark_sk))):
                    self._next_seq = seq + 1
                    self._mark_ts = ts
                    self._mark_sk = seq
                    found = one(event)
                else:
                    found = self._in_order(event)
            if found:
                extend(found)
        return out

    def _in_order(self, ev: Event, out: Any = None) -> Any:
        """:meth:`process` of an Event the fast path did not take: checked, given a seq, reported if late, held
        for reordering or passed on.  Its matches come back as a list, or go into ``out`` (returned) as they
        are made."""
        ts = ev.ts
        if not (type(ts) is float and ts - ts == 0.0 and type(ev.type) is str and ev.type):  # else not a finite float
            checked = self._checked(ev)
            if checked is None:
                return [] if out is None else out
            ev = checked
            ts = ev.ts
        seq = ev.seq
        if type(seq) is int:
            nxt = self._next_seq
            if seq >= nxt:
                self._next_seq = seq + 1
            elif seq < 0:
                ev.seq = seq = nxt
                self._next_seq = nxt + 1
            sk = seq
        else:
            sk = _LAST
        mark_ts, mark_sk = self._mark_ts, self._mark_sk
        if ts <= mark_ts and (ts < mark_ts or sk < mark_sk):
            self.dead_letters.report(
                seq, f"seq {seq}", late_reason(ts, mark_ts, self.max_delay), _raw(ev)
            )
            return [] if out is None else out
        if self._direct:
            self._mark_ts, self._mark_sk = ts, sk
            if out is None:
                return self._one(ev)
            return self._into(ev, out)
        heapq.heappush(self._held, (ts, sk, next(self._arrivals), ev))
        return self._release(ts - self.max_delay, [] if out is None else out)

    @property
    def max_delay(self) -> float:
        """How far (in ts) an event may arrive after later ones and still be reordered into place."""
        return self._max_delay

    @max_delay.setter
    def max_delay(self, value: float) -> None:
        value = _real(value, "max_delay")
        if value < 0:
            raise YfppError(f"max_delay must be a finite number >= 0, not {value!r}")
        self._max_delay = value
        # events go straight on, not through the reorder buffer, once it holds none (else they would overtake)
        self._direct = value <= 0 and not self._held

    def stream_state(self) -> StreamState:
        """Where the engine stands in its stream: what a checkpoint keeps besides the queries and the runtime."""
        from yfpp.state.checkpoint import StreamState, peek

        next_id, self._ids = peek(self._ids)
        next_arrival, self._arrivals = peek(self._arrivals)
        return StreamState(self._next_seq, self._mark, next_arrival, next_id, sorted(self._held, key=lambda h: h[:3]))

    def resume_stream(self, state: StreamState) -> None:
        """Take the stream up where ``state`` left it (an engine restored from a checkpoint, before any event)."""
        self._next_seq, self._mark = state.next_seq, state.watermark
        self._arrivals, self._ids = count(state.next_arrival), count(state.next_query_id)
        self._held = list(state.held)
        heapq.heapify(self._held)
        self.max_delay = self.max_delay  # (with events held, the next events go through the reorder buffer)

    @property
    def _mark(self) -> tuple[float, float]:
        """The watermark, (ts, seq key)."""
        return self._mark_ts, self._mark_sk

    @_mark.setter
    def _mark(self, mark: tuple[float, float]) -> None:
        self._mark_ts, self._mark_sk = mark

    def _checked(self, ev: Event) -> Event | None:
        why = _bad_type(ev.type)
        if why is None:
            ts = _ts(ev.ts)
            if ts is None:
                why = _ts_problem(ev.ts)
            else:
                ev.ts = ts
                return ev
        seq = ev.seq
        if type(seq) is int and seq < 0:  # given a seq, as a malformed mapping is
            seq = self._next_seq
            self._next_seq += 1
        self.dead_letters.report(seq, f"seq {seq}", f"malformed record: {why}", _raw(ev))
        return None

    def _from_record(self, record: Mapping[str, Any]) -> Event | None:
        """A plain dict as an Event, or None after reporting it as malformed."""
        etype, raw_ts = record.get("type"), record.get("ts")
        why = _bad_type(etype)
        ts = _ts(raw_ts)
        if why is None and ts is not None:
            return Event(etype, ts, {k: v for k, v in record.items() if k != "type" and k != "ts"})
        if why is None:
            why = _ts_problem(raw_ts)
        seq = self._next_seq
        self._next_seq += 1
        self.dead_letters.report(seq, f"seq {seq}", f"malformed record: {why}", _record_text(record))
        return None

    def _release(self, upto: float, out: MatchOut) -> MatchOut:
        """The held events up to ``upto`` released in stream order, and the oldest beyond ``max_held``; their
        matches into ``out`` (returned)."""
        held = self._held
        while held and (held[0][0] <= upto or len(held) > self.max_held):
            if held[0][0] > upto:
                self._released_early()
            ts, sk, _, ev = heapq.heappop(held)
            self._mark_ts, self._mark_sk = ts, sk
            self._into(ev, out)
        if not held and self._max_delay <= 0:
            self._direct = True  # (max_delay was lowered to 0 with events held: they are out now)
        return out

    def _released_early(self) -> None:
        self.released_early += 1
        if self.released_early == 1:
            self._report(f"the reorder buffer is over max_held={self.max_held:,} events: the oldest are released "
                         f"before max_delay has passed, and an event arriving behind them is a late event")

    def _route_events(self) -> None:
        """Set what an event in stream order goes through: ``_one`` (its matches as a list) and ``_into``
        (its matches into an ``out``): the runtime alone when there is no feedback or set query, else
        :meth:`_process`."""
        self._plain = not (self.feedback.order or self.set_queries)  # (the runtime alone)
        if self._plain:
            self._one, self._into = self.runtime.process, self._runtime_into
        else:
            self._one, self._into = self._process_list, self._process

    def _runtime_into(self, ev: Event, out: MatchOut) -> MatchOut:
        found = self.runtime.process(ev)
        if found:
            out.extend(found)
        return out

    def _process_list(self, ev: Event) -> list[dict]:
        return self._process(ev, [])

    def _process(self, ev: Event, out: MatchOut) -> MatchOut:
        """One event in stream order, with the derived events of feedback queries; matches into ``out``."""
        return self.feedback.process(ev, out) if self.feedback.order else self._step(ev, out)

    def _step(self, ev: Event, out: MatchOut) -> MatchOut:
        """One event (input or derived) through the shared NFA and every set query's matcher; matches
        into ``out`` (returned): the runtime's, then each set query's as its matcher makes them.

        The runtime gives it its stream position ``pos``; an event it rolled back has none, and
        only moves stream time.
        """
        found = self.runtime.process(ev)
        if found:
            out.extend(found)
        if self.set_queries:
            if ev.pos >= 0:
                for m in self.set_queries.values():
                    m.process(ev, out)
                    if m.fed:
                        self._drain_fed(m)
            else:  # rolled back: only its time counts, as for the runtime
                self._sets_to(ev.ts, out)
        return out

    def _sets_to(self, ts: float, out: MatchOut) -> MatchOut:
        """Stream time moves to ``ts`` (``inf``: the end) for every set query; matches into ``out``."""
        for m in self.set_queries.values():
            m.advance_time(ts, out)
            if m.fed:
                self._drain_fed(m)
        return out

    def _drain_fed(self, matcher: SetMatcher) -> None:
        """A feedback set query's matches to the runtime's ``fed``, where the feedback cascade takes them."""
        if matcher.plan in self.feedback.order:
            self.runtime.fed.extend((matcher.plan, m, r, 0) for m, r in matcher.fed)
        matcher.fed = []

    def _matched_sets(self, query: str | int, n: int) -> None:
        """A set query put ``n`` matches out (``yfpp.sets.matcher.Limits``)."""
        self.runtime.counters.matches[query] += n

    def _shed_sets(self, query: str | int, n: int, report: str | None) -> None:
        """A set query's cap dropped ``n`` partial matches or events (``yfpp.sets.matcher.Limits``)."""
        self.runtime.counters.shed_runs[query] += n
        if report is not None:
            self._report(report)

    def _failed(self, ev: Event, exc: Exception) -> None:
        """The runtime rolled back an event whose processing raised: it is that record's dead letter."""
        self.dead_letters.report(ev.seq, f"seq {ev.seq}", f"event failed: {type(exc).__name__}: {exc}"[:500], _raw(ev))

    def _report(self, message: str) -> None:
        self.reports.append(message)
        if self._report_stream is not None:
            self._report_stream.write(f"yfpp: warning: {message}\n")
            self._report_stream.flush()

    def process_all(self, events: Iterable[Event | Mapping[str, Any]]) -> Iterable[dict]:
        """Feed a whole stream, yielding matches as they complete, then flush."""
        for ev in events:
            yield from self.process(ev)
        yield from self.flush()

    def advance_time(self, ts: float, out: MatchOut | None = None) -> Any:
        """The stream time moves to ``ts`` with no event, as an event at ``ts`` would move it.

        Held events up to ``ts - max_delay`` are released, trailing-negation
        deadlines before ``ts - max_delay`` fire (so none fires while the
        reorder buffer may still hold an event that kills it), and the
        watermark moves there: an event below it afterwards is late.
        The matches come back as a list, or go into ``out`` (returned) as they
        are made, as in :meth:`process_batch`.
        """
        t = _ts(ts)
        if t is None:
            raise YfppError(f"advance_time() takes a finite real number, not {ts!r}")
        mark = t - self.max_delay
        out = [] if out is None else out
        if self._held:
            self._release(mark, out)
        if (mark, float("-inf")) > self._mark:
            self._mark = (mark, float("-inf"))
        if self.feedback.order:
            self.feedback.advance_time(mark, out)
        else:
            out.extend(self.runtime.advance_time(mark))
        return self._sets_to(mark, out)

    def flush(self, out: MatchOut | None = None) -> Any:
        """End of input: release held events, decide pending trailing negations, complete every match window.

        The matches come back as a list, or go into ``out`` (returned) as they are made, as in
        :meth:`process_batch`.
        """
        out = self._release(float("inf"), [] if out is None else out)
        if self.feedback.order:
            self.feedback.flush(out)
        else:
            out.extend(self.runtime.flush())
        return self._sets_to(float("inf"), out)

    # --- checkpoints ----------------------------------------------------------------

    def snapshot(self) -> dict:
        """The whole engine state as versioned JSON-safe data (format: docs/operations.md)."""
        from yfpp.state.checkpoint import snapshot

        return snapshot(self)

    @classmethod
    def restore(cls, snapshot: dict, **engine_opts: Any) -> "Engine":
        """An engine in the state of ``snapshot``; ``engine_opts`` (dead_letters, reports, …) override its options."""
        from yfpp.state.checkpoint import restore

        return restore(snapshot, cls, **engine_opts)

    def __reduce__(self) -> tuple:
        """``copy.deepcopy`` and ``pickle``: the engine restored from its snapshot (see the class docstring)."""
        return _copy_of, (self.snapshot(), self.reports)

    def __copy__(self) -> "Engine":
        """``copy.copy`` is a whole copy too (a snapshot shares the engine's match dicts and attributes)."""
        return copy.deepcopy(self)

    @property
    def stats(self):
        return self.runtime.counters

    @property
    def held(self) -> int:
        """Events waiting in the reorder buffer."""
        return len(self._held)

    @property
    def next_seq(self) -> int:
        """The seq the next event without one gets: how many events the engine has numbered (a restored
        engine: since its state began)."""
        return self._next_seq

    @property
    def latest_ts(self) -> float:
        """The largest ts the engine's state knows it has taken in, held or past the watermark (-inf before any;
        after :meth:`advance_time`, that time less ``max_delay``)."""
        return max(self._mark_ts, max((h[0] for h in self._held), default=float("-inf")))


def _copy_of(snapshot: dict, reports: list[str]) -> Engine:
    """A copy of an engine (``Engine.__reduce__``): its snapshot restored, with its warnings so far."""
    engine = Engine.restore(snapshot)
    engine.reports = list(reports)
    return engine


def _windowable(pattern: Pattern) -> bool:
    """``yfpp.sets.plan.windowable`` (that module is imported only for event-set queries)."""
    from yfpp.sets.plan import windowable

    return windowable(pattern)


def _cap(what: str, value: int | None, default: int) -> int:
    """A cap: the value given, else the environment's YFPP_<WHAT>, else the default."""
    if value is None:
        env = os.environ.get(f"YFPP_{what.upper()}")
        value = default if env is None else (int(env) if env.strip().isdigit() else env)
    if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < 1:
        raise YfppError(f"{what} must be an integer >= 1, not {value!r}")
    return int(value)


def _is_real(v: Any) -> bool:
    return isinstance(v, (numbers.Real, Decimal)) and not isinstance(v, bool)


def _real(v: Any, what: str) -> float:
    f = _ts(v)
    if f is None:
        raise YfppError(f"{what} must be a finite number >= 0, not {_printable(v)!r:.80}")
    return f


def _ts(v: Any) -> float | None:
    """A timestamp as a float: any finite real number (int, float, Decimal, Fraction, numpy scalars)."""
    if type(v) is float:
        return v if math.isfinite(v) else None
    if not _is_real(v):
        return None
    try:
        f = float(v)
    except (OverflowError, ValueError):
        return None
    return f if math.isfinite(f) else None


def _ts_problem(raw: Any) -> str:
    """Why ``raw`` (which :func:`_ts` refused) is no timestamp."""
    if not _is_real(raw):
        return "missing or non-numeric ts"
    if isinstance(raw, int):  # finite, but beyond a float
        return f"ts out of range: an integer of {len(str(raw)) if raw.bit_length() < 14_000 else 'over 4,000'} digits"
    return f"non-finite ts {raw!r}"


def _bad_type(etype: Any) -> str | None:
    if not isinstance(etype, str):
        return "missing or non-string type"
    if not etype:
        return "empty type"
    return None


def _raw(ev: Event) -> str:
    return event_raw(ev.type, ev.ts, ev.attrs)


def late_reason(ts: float, stream_time: float, max_delay: float) -> str:
    """The reason of a late event's dead letter (the same text from ``yfpp run``, ``yfpp spark`` and ``yfpp serve``)."""
    return f"late event: ts {ts} < stream time {stream_time} (max_delay {max_delay})"


def event_raw(etype: str, ts: float, attrs: Mapping[str, Any]) -> str:
    """An event as a JSON line ``yfpp run`` can read again: the ``raw`` of a late or failed event's dead letter."""
    record = {"type": etype, "ts": ts, **attrs}
    try:
        text = json.dumps(record, default=str, ensure_ascii=False)
    except ValueError:  # an integer of more than 4,300 digits, which Python will not print
        text = json.dumps({k: _printable(v) for k, v in record.items()}, default=str, ensure_ascii=False)
    return text[:100_000]


def _record_text(record: Mapping[str, Any]) -> str:
    """A malformed record's ``repr`` for its dead letter, cut to 500 characters."""
    try:
        return repr(dict(record))[:500]
    except ValueError:  # (as in event_raw)
        return repr({k: _printable(v) for k, v in record.items()})[:500]


def _printable(v: Any) -> Any:
    """``v`` with integers too long to print as text saying so."""
    if isinstance(v, int) and v.bit_length() > 14_000:
        return "<an integer of over 4,000 digits>"
    return [_printable(x) for x in v] if isinstance(v, list) else v


_POLICY_NAMES = frozenset((*POLICIES, *SET_POLICIES))


def _check_policy(policy: str | None) -> None:
    if policy is not None and (not isinstance(policy, str) or policy not in _POLICY_NAMES):
        raise YfppError(f"policy must be one of {', '.join(dict.fromkeys(POLICIES + SET_POLICIES))}, not {policy!r}")
