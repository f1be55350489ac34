"""The embedded engine (SPEC §6): register queries, push events, get matches.

``Engine`` owns stream order: it assigns ``seq`` to events that have none,
reorders within ``max_delay`` (default 0: no reordering) and reports late
events to its :class:`~yfpp.dead_letters.DeadLetters` instead of dropping
them silently.  Matching itself is the :class:`~yfpp.runtime.Runtime`'s;
once a feedback query is registered, events go through
:class:`~yfpp.feedback.Feedback`, which also processes the derived events.
"""

from __future__ import annotations

import dataclasses
import heapq
import sys
from itertools import count
from typing import Any, Iterable, Mapping

from yfpp.dead_letters import DeadLetters
from yfpp.errors import YfppError
from yfpp.events import Event
from yfpp.feedback import MAX_DEPTH, MAX_DERIVED, Feedback
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

    ``full_events``: every match also lists its bound events in full
    (``"events"``); ``max_feedback_depth`` / ``max_derived_per_event``: the
    loop guards of feedback queries (``yfpp.feedback``).
    """

    def __init__(self, *, max_delay: float = 0.0, dead_letters: DeadLetters | None = None, policy: str | None = None,
                 full_events: bool = False, max_feedback_depth: int = MAX_DEPTH,
                 max_derived_per_event: int = MAX_DERIVED):
        self.runtime = Runtime()
        self.runtime.full_events = full_events
        self.max_delay = max_delay
        self.dead_letters = dead_letters if dead_letters is not None else DeadLetters(sys.stderr)
        self.feedback = Feedback(self.runtime, self.dead_letters, max_feedback_depth, max_derived_per_event)
        self.default_policy = policy
        self.queries: dict[int, QueryPlan] = {}
        self._ids = count()
        self._next_seq = 0
        self._held: list[tuple[float, int, Event]] = []  # reorder buffer
        self._stream_time = float("-inf")  # ts of the last event released to the runtime

    # --- queries --------------------------------------------------------------------

    def register(self, query: str | Pattern, name: str | None = None, *, policy: str | None = None,
                 feedback: bool = False) -> int:
        """Compile and add a query (SASE+ text, extended-XPath text or a Pattern); return its id.

        ``feedback=True`` routes its result events back into the stream, as
        its own ``FEEDBACK`` clause does (``yfpp.feedback``).
        """
        pattern = parse_query(query) if isinstance(query, str) else query.validate()
        policy = policy or self.default_policy
        if policy is not None and policy != pattern.policy:
            pattern = dataclasses.replace(pattern, policy=policy).validate()
        if feedback and not pattern.feedback:
            pattern = dataclasses.replace(pattern, feedback=True).validate()
        qid = next(self._ids)
        plan = compile_pattern(pattern, name if name is not None else qid)
        self.queries[qid] = plan
        self.runtime.add(plan)
        if pattern.feedback:
            self.feedback.order[plan] = qid
        return qid

    def unregister(self, qid: int) -> None:
        """Remove a query: it emits nothing more and its runs are freed."""
        plan = self.queries.pop(qid, None)
        if plan is None:
            raise YfppError(f"no query with id {qid}")
        self.runtime.remove(plan)
        self.feedback.order.pop(plan, None)

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
            return self._process(ev)
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
            out.extend(self._process(ev))
        return out

    def _process(self, ev: Event) -> list[dict]:
        return self.feedback.process(ev) if self.feedback.order else self.runtime.process(ev)

    def process_all(self, events: Iterable[Event | Mapping[str, Any]]) -> Iterable[dict]:
        """Feed a whole stream, yielding matches as they complete, then flush."""
        for ev in events:
            yield from self.process(ev)
        yield from self.flush()

    def advance_time(self, ts: float) -> list[dict]:
        """Move stream time to ``ts`` with no event: held events and deadlines before it are released."""
        out = self._release(ts - self.max_delay) if self._held else []
        out.extend(self.feedback.advance_time(ts) if self.feedback.order else self.runtime.advance_time(ts))
        return out

    def flush(self) -> list[dict]:
        """End of input: release held events, decide pending trailing negations."""
        out = self._release(float("inf"))
        out.extend(self.feedback.flush() if self.feedback.order else self.runtime.flush())
        return out

    @property
    def stats(self):
        return self.runtime.counters
