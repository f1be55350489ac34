"""Acceptance (YFilter++ §6.4–6.5): what differs between queries sharing a node — window, negations, RETURN,
registration time — checked when a run reaches an accepting node; the match dict and its id. A mixin of
:class:`~yfpp.runtime.runtime.Runtime`."""

from __future__ import annotations

from typing import Any

from yfpp.input.events import MISSING, Event
from yfpp.nfa.compiler import QueryPlan
from yfpp.nfa.shared_nfa import Node
from yfpp.runtime.deadlines import Pending
from yfpp.runtime.match_buffer import MatchBuffer, Version
from yfpp.runtime.match_id import match_id_of
from yfpp.runtime.policies import overlap_rank
from yfpp.runtime.run_merging import member_completions


def match_maker(plan: QueryPlan) -> tuple:
    """How ``plan``'s matches are built (``Runtime._match``): its match-id function, whether every positive
    component binds one event, and its RETURN as (type, ((attribute, getter, (slot, attr) the getter reads
    from a bound single event or None), …)) or None."""
    emit = None
    if plan.emit is not None:
        etype, attrs = plan.emit
        emit = (etype, tuple((k, g, getattr(g, "slot_attr", None)) for k, g in attrs))
    return match_id_of(plan.name, plan.var_names), not any(node.kleene for node in plan.nodes), emit


class MatchMakers(dict):
    """``match_maker`` of each query, made at its first match (most subscriptions of a big engine never match:
    they keep no closures) and dropped when it is unregistered."""

    def __missing__(self, plan: QueryPlan) -> tuple:
        made = self[plan] = match_maker(plan)
        return made


class Acceptance:
    """Per-query acceptance where a run reaches a node where queries accept, and the match it makes."""

    def _complete(self, node: Node, vec: tuple, entry, version: Version, first_ts: float, key: Any, born: int,
                  accepted: list, ev: Event | None = None, pred=None) -> None:
        """A run bound the last component of the queries accepting at ``node``: post-process per query.

        ``entry`` None (not for a merged run): ``ev`` after ``pred`` ends the run, with no buffer entry of its own
        (nothing can ever walk back from it): a match reads its bindings up to ``pred`` and adds ``ev`` (``pred``
        None: the run had bound only its first event, ``vec[0]``, see :meth:`_start`).
        """
        merged = self.merging_run
        if merged is not None:  # a merged run's step: once per run it stands for (yfpp.runtime.run_merging)
            self.merging_run = None
            try:
                for version, first_ts, born in member_completions(merged, version, entry):
                    self._complete(node, vec, entry, version, first_ts, key, born, accepted)
            finally:
                self.merging_run = merged
            return
        binds = None
        last = entry.event if entry is not None else ev
        last_ts = last.ts
        accepts = node.accepts  # (the only query itself, or a list: yfpp.nfa.shared_nfa.accepting)
        if type(accepts) is not list:
            accepts = (accepts,)
        memo: dict | None = {} if len(accepts) > 1 else None  # equal negation checks give equal answers
        for plan in accepts:
            if born <= plan.since_tick:
                continue  # started before the query was registered
            if plan.window is not None and last_ts - first_ts > plan.window:
                continue
            if plan.negations:
                if memo is None:
                    ok = self.negations.allows(plan, vec, key)
                else:
                    ok = memo.get(plan.negation_key)
                    if ok is None:
                        ok = memo[plan.negation_key] = self.negations.allows(plan, vec, key)
                if not ok:
                    continue
            if binds is None:
                if entry is None:
                    binds = MatchBuffer.extract(pred, version) if pred is not None else [(0, vec[0])]
                    binds.append((node.index, ev))
                else:
                    binds = MatchBuffer.extract(entry, version)
                shared: dict = {}
            match = self._match(plan, binds, vec, shared)
            if plan.trailing is not None:
                if plan.feedback:  # released at the deadline, ranked there like any event's matches
                    depth = max(getattr(e, "depth", 0) for _, e in binds)
                    rank = overlap_rank(len(plan.var_names), binds)
                else:
                    depth, rank = 0, None
                self.to_hold.append(Pending(plan, key, vec, last.pos, first_ts + plan.window, match, depth=depth, rank=rank))
            else:
                accepted.append((plan, key, match, binds))

    def _match(self, plan: QueryPlan, binds: list[tuple[int, Event]], vec: tuple, shared: dict) -> dict:
        """The match dict of ``plan`` for ``binds``; ``shared`` keeps the seq lists per variable names for the other
        queries completing on the same binds (each match gets its own copies)."""
        names = plan.var_names
        match_id, singles, emit = self._makers[plan]
        if singles:  # one event per variable, in order: no lists to share
            seqs = {}
            ints = True
            for name, (_, e) in zip(names, binds):
                s = e.seq
                if type(s) is not int:
                    ints = False
                seqs[name] = [s]
        else:
            got = shared.get(names)
            if got is None:
                lists: list[list[int | str]] = [[] for _ in names]
                ints = True
                for unit, e in binds:
                    s = e.seq
                    if type(s) is not int:
                        ints = False
                    lists[unit].append(s)
                shared[names] = (lists, ints)
                seqs = dict(zip(names, lists))
            else:
                lists, ints = got
                seqs = dict(zip(names, map(list, lists)))
        start, end = binds[0][1].ts, binds[-1][1].ts
        m = {"query": plan.name, "id": match_id(seqs, ints, start, end), "bindings": seqs, "start": start, "end": end}
        if emit is not None:
            values = {}
            for k, g, read in emit[1]:
                if read is None:
                    v = g(None, vec)
                else:  # g, inline: a bound single event's attribute
                    x = vec[read[0]]
                    v = MISSING if x is None else x.attrs.get(read[1], MISSING)
                values[k] = None if v is MISSING else v
            m["emit"] = {"type": emit[0], "attrs": values}
        if self.full_events:
            events: dict[str, list[dict]] = {v: [] for v in names}
            for unit, e in binds:
                events[names[unit]].append(e.describe())
            m["events"] = events
        return m

    def _emitted(self, plan: QueryPlan, m: dict, binds: list, out: list[dict]) -> None:
        """Output match ``m``; a feedback query's also goes to ``fed``, ranked by its bound events."""
        out.append(m)
        self._counters.matches[plan.name] += 1
        if plan.feedback:
            self.fed.append((plan, m, overlap_rank(len(plan.var_names), binds), 0))
