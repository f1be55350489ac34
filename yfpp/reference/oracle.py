"""The reference evaluators' entry points: every match of a pattern (a sequence pattern by
:mod:`yfpp.reference.evaluator`, a set pattern by :mod:`yfpp.reference.sets`) and recursive feedback."""

from __future__ import annotations

from collections import deque
from typing import Any

from yfpp.input.events import Event
from yfpp.language.pattern import Kind, Pattern
from yfpp.reference.evaluator import _NOVALUE, Env, Reference, value
from yfpp.reference.sets import set_reference_matches
from yfpp.runtime.match_id import match_id


def reference_matches(pattern: Pattern, events: list[Event]) -> list[tuple[dict[str, list[int]], int]]:
    """Every match of ``pattern`` over ``events`` (in stream order, seq assigned)."""
    if pattern.has_sets:
        return set_reference_matches(pattern, events)
    return Reference(pattern).matches(events)


# --- recursive feedback (yfpp.runtime.feedback): re-evaluate every prefix ---------------------------


class StreamTooLong(Exception):
    """:func:`reference_feedback` was asked to stop past ``max_stream`` events (its cost is exponential in them)."""


def reference_feedback(
    queries: list[tuple[str, Pattern]], events: list[Event], max_depth: int, max_derived: int,
    max_stream: int | None = None,
) -> list[tuple[str, dict[str, list]]]:
    """Every ``(query, bindings)`` of ``queries`` over ``events`` with feedback queries' results fed back.

    After each event, every query's matches completed by it (the prefix's
    matches that end there) are output in registration order, then match
    order; a feedback query's are appended to a FIFO of derived events (ts of
    the completing event, id the match id) processed before the next input
    event — the same loop guards as the engine. Trailing negations are not
    covered. Bindings hold input seqs and derived ids. Every step re-evaluates
    the whole stream, so past ``max_stream`` events (inputs and derived) it
    raises :class:`StreamTooLong` instead of running for hours.
    """
    stream: list[Event] = []  # copies with seq = stream position
    ids: list[Any] = []  # public id of each position
    found: list[tuple[str, dict[str, list]]] = []

    def step(e: Event, public: Any, d: int) -> list[tuple[Event, Any, int]]:
        if max_stream is not None and len(stream) >= max_stream:
            raise StreamTooLong(f"over {max_stream} events")
        stream.append(Event(e.type, e.ts, e.attrs, len(stream)))
        ids.append(public)
        derived = []
        for name, p in queries:
            done = [b for b, at in reference_matches(p, stream) if at == len(stream) - 1]
            done.sort(key=lambda b: (sorted(s for v in b.values() for s in v), [b[c.var] for c in p.positives]))
            for b in done:
                binds = {v: [ids[s] for s in lst] for v, lst in b.items()}
                found.append((name, binds))
                if p.feedback and p.emit is not None:
                    env = Env({v: [stream[s] for s in lst] for v, lst in b.items()}, {c.var for c in p.positives if c.kind is Kind.KLEENE})
                    attrs = {k: value(x, env) for k, x in p.emit.attrs}
                    attrs = {k: v for k, v in attrs.items() if v is not _NOVALUE and v is not None}  # null: left out
                    bound = [s for lst in b.values() for s in lst]
                    mid = match_id(name, binds, stream[min(bound)].ts, stream[max(bound)].ts)
                    derived.append((Event(p.emit.event_type, e.ts, attrs), mid, d + 1))
        return derived

    for e in events:
        made = 0
        queue: deque = deque()
        new = step(e, e.seq, 0)
        while True:
            for x in new:  # the guards admit derived events in order
                if x[2] <= max_depth and made < max_derived:
                    made += 1
                    queue.append(x)
            if not queue:
                break
            new = step(*queue.popleft())
    return found
