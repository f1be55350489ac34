"""The state of event-set matchers in a checkpoint (``set_queries``, docs/operations.md).

``save(matcher, writer)`` gives one matcher's state as JSON-safe data, events
as indices into the checkpoint's event table (``yfpp.state.checkpoint._Writer``);
``load(matcher, data, reader)`` puts it into a freshly registered matcher.
A match in progress is its binding: per variable, its events.
"""

from __future__ import annotations

import heapq
from collections import deque
from typing import Any

from yfpp.state.plans import check_binding, check_bits
from yfpp.state.schema import corrupt
from yfpp.sets.direct import DirectMatcher
from yfpp.sets.match_window import MatchWindow, MatchWindowMatcher, SummaryStatistics
from yfpp.sets.matcher import PendingMatch
from yfpp.sets.search import state_vector
from yfpp.sets.strategies import SetMatcher


def save(m: SetMatcher, w: Any) -> dict:
    """``m``'s state; ``w`` numbers events and encodes values."""

    def binding(b: list) -> list:
        return [[w.event(e) for e in events] for events in b]

    data: dict = {"counters": dict(m.counters), "reported": m.reported, "tick": m.tick, "next_order": m.next_order,
                  "size": m.size, "held": None}
    if m.held is not None:
        data["held"] = [[pos, [binding(b) for b in group]] for pos, group in m.held.groups.items()]
    if isinstance(m, DirectMatcher):
        data["buffers"] = [[w.value(k), [[w.event(ev), bits] for ev, bits in buf]] for k, buf in m.buffers.items()]
        data["events_seen"] = m._events
        data["cuts"] = [[w.value(k), list(cut)] for k, cut in m.cuts.items()]
        data["pending"] = [[order, binding(p.binding), w.value(p.key), p.last_pos, p.first_ts, p.killed]
                           for _, order, p in m.deadlines]
    else:
        data["windows"] = [[w.value(k), win.stats.cnt, win.stats.s, win.stats.epoch, win.due,
                            [[w.event(ev), bits, [list(c) for c in counted]] for ev, bits, counted in win.entries]]
                           for k, win in m.windows.items()]
        data["deadlines"] = [[ts, order, w.value(k)] for ts, order, k in m.deadlines]
    return data


def load(m: SetMatcher, data: dict, rd: Any, where: str = "set_queries") -> None:
    """Put ``data`` (from :func:`save`, its JSON shape checked: ``yfpp.state.schema``) into ``m``; ``rd``
    decodes events and values.  What depends on ``m``'s plan (bindings, bits, sizes) is checked here."""
    plan = m.plan

    def binding(b: list) -> list:
        check_binding(plan, b, where)
        return [[rd.events[i] for i in events] for events in b]

    m.counters.update(data["counters"])
    m.reported, m.tick, m.next_order = data["reported"], data["tick"], data["next_order"]
    if m.held is not None:
        for pos, group in data["held"]:
            bindings = [binding(b) for b in group]
            firsts = {min((e for events in b for e in events), key=lambda e: e.pos) for b in bindings}
            if pos in m.held.groups or [e.pos for e in firsts] != [pos]:
                raise corrupt(where, f"held matches are grouped by the pos of their first event, once: not {pos}")
            m.held.groups[pos] = bindings
            m.held.size += len(bindings)
            heapq.heappush(m.held.heap, (firsts.pop().ts, pos))
    if isinstance(m, DirectMatcher):
        m.buffers = {rd.value(k): deque((rd.events[i], bits) for i, bits in buf) for k, buf in data["buffers"]}
        m._events = data["events_seen"]
        m.cuts = {rd.value(k): tuple(cut) for k, cut in data["cuts"]}
        for order, b, key, last_pos, first_ts, killed in data["pending"]:
            events = binding(b)
            p = PendingMatch(events, state_vector(plan, events), rd.value(key), last_pos, first_ts, killed)
            m.pending.setdefault(p.key, []).append(p)
            heapq.heappush(m.deadlines, (first_ts, order, p))
        buffered = [entry for buf in m.buffers.values() for entry in buf]
    else:
        _load_windows(m, data, rd, where)
        buffered = [entry for w in m.windows.values() for entry in w.entries]
    for _, bits, *_ in buffered:
        check_bits(plan, bits, where)
    if len(buffered) != data["size"]:
        raise corrupt(where, f"size {data['size']} is not the {len(buffered)} events buffered")
    m.size = len(buffered)


def _load_windows(m: MatchWindowMatcher, data: dict, rd: Any, where: str) -> None:
    """The match windows and their deadlines; each window's counters fit the plan and its deadline is there."""
    plan = m.plan
    m.deadlines = [(ts, order, rd.value(k)) for ts, order, k in data["deadlines"]]
    heapq.heapify(m.deadlines)
    dues = {(order, key) for _, order, key in m.deadlines}
    for k, cnt, s, epoch, due, entries in data["windows"]:
        key = rd.value(k)
        if len(cnt) != plan.m or len(epoch) != len(plan.blocks) or (entries and (due, key) not in dues):
            raise corrupt(where, "a window has one counter per variable, one epoch per set, and its deadline")
        if any(not 0 <= i < plan.m for _, _, counted in entries for i, _ in counted):
            raise corrupt(where, "a window's event counted for a variable the query does not have")
        check_bits(plan, s, where)
        stats = SummaryStatistics(plan)
        stats.cnt, stats.s, stats.epoch = list(cnt), s, list(epoch)
        m.windows[key] = MatchWindow(stats, deque((rd.events[i], bits, tuple(tuple(c) for c in counted))
                                                  for i, bits, counted in entries), due)
