"""Recursive feedback (YFilter++ §3, §6.2): result events of feedback queries become stream events.

A query marked for feedback (SASE+ ``RETURN t(…) FEEDBACK``, extended XPath
``=> t(…) feedback``, or ``Engine.register(…, feedback=True)``) has each of
its result events processed by the engine — by every query, exactly like an
input event — right after the event that completed the match and before the
next input event:

* **time** — a derived event's ``ts`` is the stream time of its match's
  completion: the completing event's ts, or for a trailing-negation match its
  deadline ``first.ts + W`` (deadlines fire one at a time, each followed by
  its derived events, so those can still witness later deadlines' negations);
* **order** — breadth first: the derived events of one completing event go
  in query registration order, then match order (the bound events' stream
  positions, docs/semantics.md §6's tie-break), and each is processed in turn, its own
  derived events queued behind;
* **identity** — a derived event's ``seq`` is the id of the match that built
  it (16 hex digits, a string: it cannot collide with an input position, and
  it is the same in every run and on Spark); its provenance — the query and
  the ids of the events it came from — is in :class:`DerivedEvent` and in
  full-event output (``"from"``);
* **attributes** — the RETURN attributes, a ``null`` (missing) value left out.

Loop guards bound the work one input event (or one deadline) can cause: a
derived event deeper than ``max_depth`` in its cascade (an event derived from
an input event has depth 1, one derived from that depth 2, …; a deadline's
match goes one deeper than the deepest derived event it binds, so a chain of
deadlines each re-armed by the last one's derived event ends too) or beyond
``max_derived`` derived events is dropped, and each guard reports once per
cascade and query to the dead letters, with the chain of derivations. The
engine then goes on with the next input event.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Any, Callable

from yfpp.input.dead_letters import DeadLetters
from yfpp.errors import YfppError
from yfpp.input.events import Event
from yfpp.runtime.runtime import Runtime

MAX_DEPTH = 16  # default max_feedback_depth
MAX_DERIVED = 1000  # default max_derived_per_event


class DerivedEvent(Event):
    """A result event fed back into the stream, with its provenance."""

    __slots__ = ("query", "sources", "depth", "parent")

    def __init__(self, type: str, ts: float, attrs: dict[str, Any], seq: str, query: Any, sources: list,
                 depth: int, parent: Event | None):
        super().__init__(type, ts, attrs, seq)
        self.query = query  # the name of the query whose match built it
        self.sources = sources  # the ids (seq) of the events that match bound, in stream order
        self.depth = depth  # 1 + the depth of the event that completed the match (input events: 0), or for a
        # trailing-negation deadline's match, of the deepest derived event it binds
        self.parent = parent  # that completing event (None: a deadline), for guard reports

    def describe(self) -> dict[str, Any]:
        d = super().describe()
        d["from"] = {"query": self.query, "events": self.sources}
        return d


class Feedback:
    """Wraps :class:`Runtime` calls of an engine that has feedback queries."""

    def __init__(self, runtime: Runtime, dead_letters: DeadLetters, max_depth: int, max_derived: int,
                 step: Callable[[Event, Any], Any]):
        if not all(type(v) is int and v >= 1 for v in (max_depth, max_derived)):
            raise YfppError(f"max_feedback_depth and max_derived_per_event must be integers >= 1, "
                            f"not {max_depth!r:.40} and {max_derived!r:.40}")
        self.runtime = runtime
        self.step = step  # one event through every query, its matches into an ``out`` (the Engine's ``_step``)
        self.dead_letters = dead_letters
        self.max_depth = max_depth
        self.max_derived = max_derived
        self.order: dict[Any, int] = {}  # registered feedback queries (QueryPlan, SetPlan) → registration order
        self.derived = 0  # derived events processed
        self.dropped = 0  # derived events the guards dropped
        self._made = 0  # derived events of the current cascade
        self._drops: dict[tuple[str, Any], list] = {}  # (guard, query) → [count, first dropped event]

    # --- the Engine's calls -----------------------------------------------------------

    def process(self, ev: Event, out: Any) -> Any:
        """``Runtime.process`` of an input event, then its derived events; matches into ``out`` (returned)."""
        self._until(ev.ts, False, out)
        self.step(ev, out)
        return self._cascade(ev, out)

    def advance_time(self, ts: float, out: Any) -> Any:
        self._until(ts, False, out)
        out.extend(self.runtime.advance_time(ts))
        return out

    def flush(self, out: Any) -> Any:
        self._until(math.inf, True, out)
        out.extend(self.runtime.flush())  # nothing pending is left; whatever else the runtime does at the end
        return out

    # --- cascades ---------------------------------------------------------------------

    def _until(self, ts: float, everything: bool, out: Any) -> None:
        """Fire deadlines before ``ts`` (all: ``everything``) one deadline at a time, each with its cascade."""
        rt = self.runtime
        while (d := rt.deadlines.earliest()) is not None and (everything or d < ts):
            # (a deadline past every float, first.ts + W overflowing, fires only at the end: with all that are left)
            out.extend(rt.advance_time(math.nextafter(d, math.inf)) if d < math.inf else rt.flush())
            self._cascade(None, out)

    def _cascade(self, cause: Event | None, out: Any) -> Any:
        """Process the derived events of ``cause``'s matches (None: a deadline), breadth first; their matches
        into ``out`` (returned)."""
        self._made = 0
        queue: deque[DerivedEvent] = deque()
        self._derive(cause, queue)
        while queue:
            x = queue.popleft()
            self.derived += 1
            self.step(x, out)
            self._derive(x, queue)
        if self._drops:
            self._report(cause)
        return out

    def _derive(self, cause: Event | None, queue: deque) -> None:
        """Turn the feedback matches the runtime just emitted into queued derived events."""
        fed, self.runtime.fed = self.runtime.fed, []
        if not fed:
            return
        fed.sort(key=lambda item: (self.order.get(item[0], -1), item[2] or (0, [], [])))
        base = getattr(cause, "depth", 0)
        for plan, m, _, bound in fed:
            depth = max(base, bound) + 1  # (bound: a deadline's match, whose cause is no event)
            ev = derived_event(plan, m, depth, cause)
            if depth > self.max_depth:
                self._drop("depth", ev)
            elif self._made >= self.max_derived:
                self._drop("count", ev)
            else:
                self._made += 1
                queue.append(ev)

    def _drop(self, guard: str, ev: DerivedEvent) -> None:
        self.dropped += 1
        entry = self._drops.setdefault((guard, ev.query), [0, ev])
        entry[0] += 1

    def _report(self, cause: Event | None) -> None:
        root = cause
        while isinstance(root, DerivedEvent):
            root = root.parent
        where = f"after seq {root.seq}" if root is not None else "at a trailing-negation deadline"
        for (guard, query), (n, ev) in self._drops.items():
            if guard == "depth":
                why = f"feedback depth limit: query {query!r} derived an event at depth {ev.depth} > max_feedback_depth {self.max_depth}"
            else:
                why = f"feedback limit: query {query!r} derived more than max_derived_per_event {self.max_derived} events for one input event"
            self.dead_letters.report(ev.seq, where, f"{why}; {n} dropped; chain: {chain(ev)}")
        self._drops.clear()


def derived_event(plan: Any, m: dict, depth: int, parent: Event | None) -> DerivedEvent:
    """The event a feedback query's match ``m`` feeds back."""
    emit = m["emit"]
    ts = m["end"] if not plan.trailing else m["start"] + plan.window  # SetPlan.trailing: a tuple
    attrs = {k: v for k, v in emit["attrs"].items() if v is not None}
    sources = [s for ids in m["bindings"].values() for s in ids]
    return DerivedEvent(emit["type"], ts, attrs, m["id"], m["query"], sources, depth, parent)


def chain(ev: Event, keep: int = 4) -> str:
    """``seq 0 (x) → x 1f…  by q → …``: how ``ev`` was derived, from its input event on."""
    links: list[str] = []
    cur: Event | None = ev
    while isinstance(cur, DerivedEvent):
        links.append(f"{cur.type} {cur.seq} by {cur.query!r}")
        cur = cur.parent
    links.append(f"seq {cur.seq} ({cur.type})" if cur is not None else "deadline")
    links.reverse()
    if len(links) > 2 * keep:
        links = links[:keep] + [f"… {len(links) - 2 * keep} more …"] + links[-keep:]
    return " → ".join(links)
