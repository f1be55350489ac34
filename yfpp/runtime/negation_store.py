"""Candidates of middle negations (SASE+ ``~b`` between two components), kept per key in stream order.

A candidate is an event of the negated type that passed the negation's own
predicates (those that mention only the negated variable); a match of the
query is dropped when a candidate of its key lies strictly between the events
bound to the components around ``~b`` and passes the negation's other
predicates on the match's bindings.  Trailing negations, which wait for a
deadline instead, are ``yfpp.runtime.deadlines``'.

Equivalent negations share one store: same negated type, same own predicates
(compared with the variable renamed), same equivalence list and same branch
of the shared NFA (whose oldest run bounds what the store must keep).  A
hundred queries with the same ``~register b`` keep one list of register
events, filtered once per event.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from typing import Any, Hashable, Iterator

from yfpp.input.events import Event
from yfpp.nfa.compiler import NegationPlan, QueryPlan
from yfpp.nfa.predicates import Check
from yfpp.runtime.runs import NO_RUN
from yfpp.nfa.shared_nfa import Node, State, accepting, children_of


class CandidateStore:
    """The candidates of one class of equivalent middle negations: key → (stream positions, events)."""

    __slots__ = ("signature", "event_type", "self_preds", "partition_by", "root", "buckets", "users", "holding")

    def __init__(self, signature: Hashable, event_type: str | None, self_preds: tuple[Check, ...],
                 partition_by: tuple[str, ...], root: Node, holding: set["CandidateStore"]):
        self.signature = signature
        self.event_type = event_type  # the negated type (None: any)
        self.self_preds = self_preds
        self.partition_by = partition_by
        self.root = root
        self.buckets: dict[Any, tuple[list[int], list[Event]]] = {}
        self.users = 0
        self.holding = holding  # NegationStores.holding: this store joins it with its first bucket

    def hold(self, key: Any, tick: int, ev: Event) -> None:
        """Keep ``ev`` (at stream position ``tick``) as a candidate for the runs of ``key``."""
        bucket = self.buckets.get(key)
        if bucket is None:
            self.buckets[key] = ([tick], [ev])
            self.holding.add(self)
        else:
            bucket[0].append(tick)
            bucket[1].append(ev)


class TypeNegations:
    """What an event of one type may be a candidate for, kept up to date as queries come and go (never rebuilt):
    ``entries`` maps each shared store, and each trailing negation, to its route entry ``(owner, neg, ends)``
    (see ``yfpp.runtime.runtime.Route``), in registration order; the same entries are indexed for an event that
    finds them through what is live (``EventSteps._live_negs``): keyed shared stores by branch root, trailing
    negations by query, unkeyed stores apart.  Adding or removing one costs O(1) (O(the query's negations) for
    ``by_plan``), however many are registered."""

    __slots__ = ("entries", "by_root", "by_plan", "plain", "trailing")

    def __init__(self) -> None:
        self.entries: dict[Any, tuple] = {}  # store, or trailing NegationPlan -> (owner, neg, ends)
        self.by_root: dict[Node, dict[CandidateStore, tuple]] = {}
        self.by_plan: dict[QueryPlan, list[tuple]] = {}
        self.plain: dict[CandidateStore, tuple] = {}
        self.trailing = 0  # trailing negations among the entries

    def __len__(self) -> int:
        return len(self.entries)

    def put(self, entry: tuple) -> None:
        """Add ``entry``, or replace the entry of the same store (keeping its place)."""
        owner, neg, _ = entry
        if neg is not None:
            self.entries[neg] = entry
            self.by_plan.setdefault(owner, []).append(entry)
            self.trailing += 1
            return
        self.entries[owner] = entry
        if owner.partition_by:
            self.by_root.setdefault(owner.root, {})[owner] = entry
        else:
            self.plain[owner] = entry

    def drop(self, owner: Any, neg: NegationPlan | None) -> None:
        if neg is not None:
            entry = self.entries.pop(neg)
            entries = self.by_plan[owner]
            entries.remove(entry)
            if not entries:
                del self.by_plan[owner]
            self.trailing -= 1
            return
        del self.entries[owner]
        if owner.partition_by:
            stores = self.by_root[owner.root]
            del stores[owner]
            if not stores:
                del self.by_root[owner.root]
        else:
            del self.plain[owner]


class NegationStores:
    """Every registered negation by the event type it tests, and the shared candidate stores of middle ones.

    ``by_type[type]`` holds what an event of that type (``None``: any type) may
    be a candidate for (:class:`TypeNegations`): an entry per shared store and
    per trailing negation (its pending matches are per query).  A store's entry
    carries the wait states whose runs a candidate ends (:meth:`ends`): made
    again, at the next event, for the stores of a branch a query joined or left
    (``dirty``), never for every store.
    """

    def __init__(self) -> None:
        self.by_type: dict[str | None, TypeNegations] = {}
        self.stores: dict[Hashable, CandidateStore] = {}
        self.of: dict[NegationPlan, CandidateStore] = {}
        self.of_root: dict[Node, dict[CandidateStore, None]] = {}  # the stores of each branch
        self.dirty: set[Node] = set()  # branches whose stores' ``ends`` may be stale
        # the stores that may hold a candidate (each holding one is here): what pruning visits, however many
        # stores are registered
        self.holding: set[CandidateStore] = set()

    def _of_type(self, etype: str | None) -> TypeNegations:
        negs = self.by_type.get(etype)
        if negs is None:
            negs = self.by_type[etype] = TypeNegations()
        return negs

    def add(self, plan: QueryPlan) -> None:
        root = plan.last.root
        for neg in plan.negations:
            if neg.upper is None:
                self._of_type(neg.event_type).put((plan, neg, ()))
                continue
            sig = (neg.signature, plan.partition_by, root)
            store = self.stores.get(sig)
            if store is None:
                store = self.stores[sig] = CandidateStore(sig, neg.event_type, neg.self_preds, plan.partition_by, root,
                                                           self.holding)
                self.of_root.setdefault(root, {})[store] = None
                self._of_type(neg.event_type).put((store, None, ()))
            store.users += 1
            self.of[neg] = store
        if root in self.of_root:  # (_changed, written out: every registration passes here)
            self.dirty.add(root)

    def remove(self, plan: QueryPlan) -> None:
        root = plan.last.root
        for neg in plan.negations:
            if neg.upper is None:
                self._drop(neg.event_type, plan, neg)
                continue
            store = self.of.pop(neg)
            store.users -= 1
            if not store.users:
                del self.stores[store.signature]
                self.holding.discard(store)
                self._drop(neg.event_type, store, None)
                stores = self.of_root[root]
                del stores[store]
                if not stores:
                    del self.of_root[root]
        self._changed(root)

    def _changed(self, root: Node) -> None:
        """A query joined or left branch ``root``: its stores' ``ends`` are made again at the next refresh (a branch
        without stores has none: a million subscriptions without negations cost the refresh nothing)."""
        if root in self.of_root:
            self.dirty.add(root)

    def _drop(self, etype: str | None, owner: Any, neg: NegationPlan | None) -> None:
        negs = self.by_type[etype]
        negs.drop(owner, neg)
        if not negs:
            del self.by_type[etype]

    def refresh(self) -> None:
        """Make the ``ends`` of the stores of the branches changed since the last call again."""
        for root in self.dirty:
            for store in self.of_root.get(root, ()):
                etype = store.event_type
                if etype is not None:  # (any type's: per event type, Runtime._route)
                    self.by_type[etype].put((store, None, self.ends(store, etype)))
        self.dirty.clear()

    def ends(self, store: CandidateStore, etype: str) -> tuple[State, ...]:
        """The wait states whose runs a candidate of ``store`` of type ``etype`` ends at once (of its key, when keyed).

        Such a run has bound the component before the negation of every query it can still complete, and the
        component after it comes later: the candidate lies between them in every match the run could give, and no
        cross predicate could spare one.  So: a wait state (not strict) of the store's branch after node ``n``, no
        child of which ``etype`` can begin, every query below whose children has a negation of this store right
        after ``n`` and without cross predicates.  (A merged run ends with all its members: they share its state
        and key, yfpp.runtime.run_merging.)  Time: that of the store's branch."""
        of = self.of
        out = []
        for st in _wait_states_below(store.root):
            node = st.node
            if st.touch_all:
                continue
            children = [st.child] if st.child is not None else [
                c for c in children_of(node) if c.contiguity is st.contiguity]
            if children and all(c.event_type is not None and c.event_type != etype and all(
                    any(of.get(neg) is store and neg.lower == node.index and neg.upper == c.index
                        and not neg.cross_preds for neg in plan.negations)
                    for plan in _accepting_below(c)) for c in children):
                out.append(st)
        return tuple(out)

    def allows(self, plan: QueryPlan, vec: tuple, key: Any) -> bool:
        """No candidate of ``plan``'s middle negations lies between the components around it in ``vec``."""
        for neg in plan.negations:
            if neg.upper is None:
                continue
            bucket = self.of[neg].buckets.get(key)
            if not bucket:
                continue
            positions, events = bucket
            v = vec[neg.lower]
            lo = v.pos if isinstance(v, Event) else v.last.pos
            v = vec[neg.upper]
            hi = v.pos if isinstance(v, Event) else v.first.pos
            lo = bisect_right(positions, lo)
            hi = bisect_left(positions, hi, lo)
            if lo == hi:
                continue
            cross = neg.cross_preds
            if not cross:
                return False
            for i in range(lo, hi):
                x = events[i]
                for p in cross:
                    if not p(x, vec):
                        break
                else:
                    return False
        return True

    def held(self) -> bool:
        """Does any store hold a candidate?"""
        holding = self.holding
        for store in [s for s in holding if not s.buckets]:
            holding.discard(store)
        return bool(holding)

    def prune(self, floor: dict[Node, int], only: Node | None = None) -> int:
        """Drop candidates before the first event of every live run of their branch; return the buckets left."""
        buckets = 0
        for store in list(self.holding):
            if only is not None and store.root is not only:
                continue
            cut_pos = floor.get(store.root, NO_RUN)
            by_key = store.buckets
            for k in list(by_key):
                positions, events = by_key[k]
                cut = bisect_left(positions, cut_pos)
                if cut:
                    del positions[:cut], events[:cut]
                if not positions:
                    del by_key[k]
            if not by_key:
                self.holding.discard(store)
            buckets += len(by_key)
        return buckets



def _nodes_below(node: Node) -> Iterator[Node]:
    """``node`` and every node of its branch below it."""
    stack = [node]
    while stack:
        n = stack.pop()
        yield n
        stack.extend(children_of(n))


def _wait_states_below(root: Node) -> list[State]:
    """The wait states of ``root``'s branch."""
    return [st for n in _nodes_below(root) for st in n.waits.values()]


def _accepting_below(node: Node) -> list[QueryPlan]:
    """The queries accepting at ``node`` or below it."""
    return [plan for n in _nodes_below(node) for plan in accepting(n)]
