"""The embedded engine (SPEC §6): register queries, push events, get matches.

``Engine`` owns stream order: it assigns ``seq`` to events that have none,
reorders within ``max_delay`` (default 0: no reordering) and reports late
events to its :class:`~yfpp.dead_letters.DeadLetters` instead of dropping
them silently.  Matching itself is the :class:`~yfpp.runtime.Runtime`'s.
"""

from __future__ import annotations

import dataclasses
import heapq
import sys
from itertools import count
from typing import Any, Iterable, Mapping

from yfpp.dead_letters import DeadLetters
from yfpp.errors import YfppError
from yfpp.event_sets import STRATEGIES, SetMatcher, set_matcher, windowable
from yfpp.events import Event
from yfpp.nfa_compiler import QueryPlan, compile_pattern
from yfpp.pattern import Pattern
from yfpp.query_text import parse_query
from yfpp.runtime import Runtime


class Engine:
    """Many queries over one event stream.

    >>> eng = Engine()
    >>> qid = eng.register("PATTERN SEQ(shelf a, exit c) WHERE [tag_id]", name="out")
    >>> eng.process({"type": "shelf", "ts": 1, "tag_id": 7})
    []
    >>> eng.process({"type": "exit", "ts": 5, "tag_id": 7})
    [{'query': 'out', 'id': '4e1110d1828aaf3b', 'bindings': {'a': [0], 'c': [1]}, 'start': 1, 'end': 5}]
    """

    def __init__(
        self,
        *,
        max_delay: float = 0.0,
        dead_letters: DeadLetters | None = None,
        policy: str | None = None,
        strategy: str = "direct",
    ):
        if strategy not in STRATEGIES:
            raise YfppError(f"unknown evaluation strategy {strategy!r} (expected one of {', '.join(STRATEGIES)})")
        self.runtime = Runtime()
        self.strategy = strategy  # for event-set queries (docs/event_sets.md)
        self.set_queries: dict[int, SetMatcher] = {}
        self.max_delay = max_delay
        self.dead_letters = dead_letters if dead_letters is not None else DeadLetters(sys.stderr)
        self.default_policy = policy
        self.queries: dict[int, QueryPlan] = {}
        self._ids = count()
        self._next_seq = 0
        self._held: list[tuple[float, int, Event]] = []  # reorder buffer
        self._stream_time = float("-inf")  # ts of the last event released to the runtime

    # --- queries --------------------------------------------------------------------

    def register(self, query: str | Pattern, name: str | None = None, *, policy: str | None = None) -> int:
        """Compile and add a query (SASE+ text, extended-XPath text or a Pattern); return its id."""
        pattern = parse_query(query) if isinstance(query, str) else query.validate()
        policy = policy or self.default_policy
        if policy is not None and policy != pattern.policy:
            pattern = dataclasses.replace(pattern, policy=policy).validate()
        qid = next(self._ids)
        if pattern.has_sets or (self.strategy == "match-window" and windowable(pattern)):
            self.set_queries[qid] = set_matcher(pattern, name if name is not None else qid, self.strategy)
            return qid
        plan = compile_pattern(pattern, name if name is not None else qid)
        self.queries[qid] = plan
        self.runtime.add(plan)
        return qid

    def unregister(self, qid: int) -> None:
        """Remove a query: it emits nothing more and its runs are freed."""
        if self.set_queries.pop(qid, None) is not None:
            return
        plan = self.queries.pop(qid, None)
        if plan is None:
            raise YfppError(f"no query with id {qid}")
        self.runtime.remove(plan)

    # --- events ---------------------------------------------------------------------

    def process(self, event: Event | Mapping[str, Any]) -> list[dict]:
        """Feed one event; return the matches it completes (and deadlines it passes)."""
        if isinstance(event, Event):
            ev = event
        else:
            ev = self._from_record(event)
            if ev is None:
                return []
        if ev.seq < 0:
            ev.seq = self._next_seq
        self._next_seq = ev.seq + 1
        if ev.ts < self._stream_time:
            self.dead_letters.report(ev.seq, f"seq {ev.seq}", f"late event: ts {ev.ts} < stream time {self._stream_time} (max_delay {self.max_delay})")
            return []
        if self.max_delay <= 0:
            self._stream_time = ev.ts
            return self._step(ev)
        heapq.heappush(self._held, (ev.ts, ev.seq, ev))
        return self._release(ev.ts - self.max_delay)

    def _from_record(self, record: Mapping[str, Any]) -> Event | None:
        """A plain dict as an Event, or None after reporting it as malformed."""
        etype, ts = record.get("type"), record.get("ts")
        if isinstance(etype, str) and type(ts) in (int, float) and ts == ts:
            return Event.from_dict(record)
        seq = self._next_seq
        self._next_seq += 1
        why = "missing or non-string type" if not isinstance(etype, str) else "missing or non-numeric ts"
        self.dead_letters.report(seq, f"seq {seq}", f"malformed record: {why}", repr(dict(record))[:500])
        return None

    def _release(self, upto: float) -> list[dict]:
        out: list[dict] = []
        while self._held and self._held[0][0] <= upto:
            _, _, ev = heapq.heappop(self._held)
            self._stream_time = ev.ts
            out.extend(self._step(ev))
        return out

    def _step(self, ev: Event) -> list[dict]:
        """One event in stream order through the shared NFA and every set query's matcher."""
        out = self.runtime.process(ev)
        return self._count_sets(out, [m.process(ev) for m in self.set_queries.values()])

    def _count_sets(self, out: list[dict], found: list[list[dict]]) -> list[dict]:
        for matches in found:
            for m in matches:
                self.runtime.counters.matches[m["query"]] += 1
            out.extend(matches)
        return out

    def process_all(self, events: Iterable[Event | Mapping[str, Any]]) -> Iterable[dict]:
        """Feed a whole stream, yielding matches as they complete, then flush."""
        for ev in events:
            yield from self.process(ev)
        yield from self.flush()

    def advance_time(self, ts: float) -> list[dict]:
        """Move stream time to ``ts`` with no event: held events and deadlines before it are released."""
        out = self._release(ts - self.max_delay) if self._held else []
        out.extend(self.runtime.advance_time(ts))
        return self._count_sets(out, [m.advance_time(ts) for m in self.set_queries.values()])

    def flush(self) -> list[dict]:
        """End of input: release held events, decide pending trailing negations."""
        out = self._release(float("inf"))
        out.extend(self.runtime.flush())
        return self._count_sets(out, [m.flush() for m in self.set_queries.values()])

    @property
    def stats(self):
        return self.runtime.counters
