"""One shared NFA for every registered query (YFilter, YFilter++ §4.2, §5, §6).

Queries are merged into a trie of :class:`Node` s: a node is a positive
component reached by a chain of component signatures (type test, kind,
contiguity, canonical predicates, equivalence key, Kleene state layout —
``ComponentSpec.signature``).  Queries that agree up to a component share
its node, and so the runs in it.  A node records the queries that end there
(``accepts``); what differs between queries sharing nodes is checked per query
at acceptance by the runtime.

Runs wait in :class:`State` s:

* ``in`` — inside a Kleene node (take / ignore / proceed);
* ``wait`` — after a node, waiting to begin one of its children.  Children
  under strict, partition or skip-till-any contiguity share one wait state per
  contiguity: whether a run may ignore an event does not depend on the child.
  Under skip-till-next each child has its own (ignore iff *that* child cannot
  begin).

Each wait state, and the root level, finds the children an event can begin
through a :class:`TransitionTable`: children grouped by event type (``None``
for any type), and within a type indexed by an equality or range predicate on
an attribute when the child has one — so an event of type ``exit`` with
``door = 'D17'`` finds the one child ``exit[@door='D17']`` among ten thousand
without testing the others.
"""

from __future__ import annotations

import re
from bisect import bisect_left, bisect_right, insort
from collections import Counter
from dataclasses import dataclass, field
from itertools import count
from typing import Any, Callable, Hashable, Iterable, Iterator, Sequence

from yfpp.input.events import MISSING, Event
from yfpp.nfa.compiler import ComponentSpec, QueryPlan
from yfpp.language.pattern import Compare, Contiguity, Index, Literal, Ref, XPathTest
from yfpp.nfa.predicates import AggSlot, Check, is_number

_ids = count()


@dataclass(eq=False)
class Node:
    """A positive component shared by every query whose prefix leads here."""

    parent: "Node | None"
    signature: Hashable
    index: int
    event_type: str | None
    kleene: bool
    contiguity: Contiguity
    inner: Contiguity
    begin: tuple[Check, ...]
    take: tuple[Check, ...]
    final: tuple[Check, ...]
    agg_slots: tuple[AggSlot, ...]
    keep_events: bool
    partition_by: tuple[str, ...]
    index_key: tuple | None  # how a TransitionTable can find this node, if at all
    root: "Node | None" = None  # the first node of this branch of the trie (itself for a root)
    id: int = field(default_factory=lambda: next(_ids))
    children: dict[Hashable, "Node"] = field(default_factory=dict)
    waits: dict[Hashable, "State"] = field(default_factory=dict)  # contiguity or child -> wait state
    inside: "State | None" = None
    accepts: list[QueryPlan] = field(default_factory=list)
    users: int = 0  # queries through this node
    windows: Counter = field(default_factory=Counter)  # window -> queries through here with it
    window: float | None = None  # the largest of them (None: unbounded): runs here live that long
    # kept on a branch's root node by the runtime: its runs now, when the caps count its queries' runs again
    # (yfpp.runtime.caps), its last "growing" report
    live: int = 0
    cap_check: int = 0
    reported: int = 0

    def count_window(self, window: float | None, delta: int) -> None:
        self.windows[window] += delta
        if not self.windows[window]:
            del self.windows[window]
        bounded = [w for w in self.windows if w is not None]
        self.window = None if None in self.windows or not bounded else max(bounded)

    def wait_states(self) -> Iterable["State"]:
        return self.waits.values()

    def __repr__(self) -> str:
        return f"<node {self.id} {self.event_type or '*'}{'+' if self.kleene else ''}>"


class TransitionTable:
    """The nodes an event may begin, by type and by indexed predicate."""

    def __init__(self) -> None:
        self.by_type: dict[str | None, _TypeGroup] = {}
        self.types: Counter = Counter()

    def add(self, node: Node) -> None:
        self.by_type.setdefault(node.event_type, _TypeGroup()).add(node)
        self.types[node.event_type] += 1

    def remove(self, node: Node) -> None:
        group = self.by_type[node.event_type]
        group.remove(node)
        self.types[node.event_type] -= 1
        if not self.types[node.event_type]:
            del self.types[node.event_type]
            del self.by_type[node.event_type]

    def groups(self, etype: str) -> tuple["_TypeGroup", ...]:
        """The groups an event of type ``etype`` looks in: its type's, then any type's."""
        return tuple(g for g in (self.by_type.get(etype), self.by_type.get(None)) if g is not None)

    def candidates(self, ev: Event) -> Sequence[Node]:
        """Children of the event's type or of any type, narrowed by the predicate indexes."""
        group = self.by_type.get(ev.type)
        anyg = self.by_type.get(None)
        if anyg is None:
            return () if group is None else group.candidates(ev)
        if group is None:
            return anyg.candidates(ev)
        return group.candidates(ev) + anyg.candidates(ev)

    def __len__(self) -> int:
        return sum(self.types.values())


class _TypeGroup:
    def __init__(self) -> None:
        self.plain: list[Node] = []
        self.eq: dict[str, dict[Any, list[Node]]] = {}
        # XPath equalities, by (kind, name): @a = 'text' ("xeq"), @a = 12 ("xnum"), a = 'text' ("ceq"), a = 12
        # ("cnum"); looked up by what xpath_ext.xpath_predicates.index_keys reads of the event
        self.xpath: dict[tuple[str, str], dict[Any, list[Node]]] = {}
        # range predicates, by (source, attribute, op): a SASE+ attribute's value (source None), an XPath
        # attribute's or child's text cast as XPath casts it ("xnum", "cnum"); sorted (bound, node id) keys
        self.ranges: dict[tuple[str | None, str, str], tuple[list[tuple[Any, int]], dict[int, Node]]] = {}
        #: xpath_ext.xpath_predicates.index_keys, once an XPath index is made (a run without XPath never loads it)
        self.xpath_keys: Callable[[str, str, Event], list[Any] | None] | None = None

    def add(self, node: Node) -> None:
        key = node.index_key
        if key is not None and key[0] not in ("eq", "range") and self.xpath_keys is None:
            from xpath_ext.xpath_predicates import index_keys

            self.xpath_keys = index_keys
        if key is None:
            self.plain.append(node)
        elif key[0] in ("range", "xrange"):
            slot, c = _range_slot(key)
            keys, nodes = self.ranges.setdefault(slot, ([], {}))
            insort(keys, (c, node.id))
            nodes[node.id] = node
        else:
            kind, attr, value = key
            table = self.eq.setdefault(attr, {}) if kind == "eq" else self.xpath.setdefault((kind, attr), {})
            table.setdefault(value, []).append(node)

    def remove(self, node: Node) -> None:
        key = node.index_key
        if key is None:
            self.plain.remove(node)
        elif key[0] in ("range", "xrange"):
            slot, c = _range_slot(key)
            keys, nodes = self.ranges[slot]
            keys.pop(bisect_left(keys, (c, node.id)))
            del nodes[node.id]
        else:
            kind, attr, value = key
            tables: dict = self.eq if kind == "eq" else self.xpath
            table = tables[attr if kind == "eq" else (kind, attr)]
            lst = table[value]
            lst.remove(node)
            if not lst:
                del table[value]

    def finder(self) -> tuple[tuple[Node, ...], tuple[tuple[str, dict], ...], "_TypeGroup | None"]:
        """How the runtime finds this group's candidates without a call: ``(plain, eq, None)`` — the nodes every
        event of the type gets, and the equality indexes (attribute, value -> nodes) to look its values up in,
        in :meth:`candidates`' order — or ``((), (), self)`` when an XPath or range index needs :meth:`candidates`.
        A snapshot of ``plain`` (made again after every registration change), live index tables."""
        if self.xpath or self.ranges:
            return (), (), self
        return tuple(self.plain), tuple(self.eq.items()), None

    def candidates(self, ev: Event) -> Sequence[Node]:
        if not (self.eq or self.xpath or self.ranges):
            return self.plain
        out = list(self.plain)
        for attr, table in self.eq.items():
            v = ev.attrs.get(attr, MISSING)
            if v is not MISSING:
                try:
                    out += table.get(v, ())
                except TypeError:  # unhashable value
                    pass
        index_keys = self.xpath_keys
        if self.xpath:
            for (kind, name), table in self.xpath.items():
                keys = index_keys(kind, name, ev)  # type: ignore[misc]
                if keys is None:  # (a child the index does not read: every node of the table checks it)
                    out += [n for nodes in table.values() for n in nodes]
                else:
                    for k in keys:
                        out += table.get(k, ())
        for (source, attr, op), (keys, nodes) in self.ranges.items():
            if source is None:
                v = ev.attrs.get(attr, MISSING)
                values = (v,) if is_number(v) else ()
            else:
                found = index_keys(source, attr, ev)  # type: ignore[misc]
                if found is None:  # (as above)
                    out += nodes.values()
                    continue
                values = tuple(v for v in found if v == v)  # (NaN compares false)
            if len(values) == 1:
                out += [nodes[nid] for _, nid in _in_range(keys, op, values[0])]
            elif values:  # (several children: each node once)
                out += {nid: nodes[nid] for v in values for _, nid in _in_range(keys, op, v)}.values()
        return out


def _in_range(keys: list[tuple[Any, int]], op: str, v: Any) -> list[tuple[Any, int]]:
    """The (bound, node id) keys whose predicate ``v op bound`` holds."""
    if op == ">":  # v > c
        return keys[: bisect_left(keys, (v, -1))]
    if op == ">=":
        return keys[: bisect_right(keys, (v, float("inf")))]
    if op == "<":
        return keys[bisect_right(keys, (v, float("inf"))) :]
    return keys[bisect_left(keys, (v, -1)) :]


def _range_slot(key: tuple) -> tuple[tuple[str | None, str, str], Any]:
    """A range index key's table in ``_TypeGroup.ranges`` and its bound."""
    if key[0] == "range":
        _, attr, op, c = key
        return (None, attr, op), c
    _, source, name, op, c = key
    return (source, name, op), c


def _reactions(node: Node) -> list[str | None]:
    """What ``node`` adds to :attr:`SharedNFA.reacting`: its type where runs begin or take it (a wait state
    of its parent, its own inside state), ``None`` for a partition-contiguity state (every event moves it)."""
    out: list[str | None] = []
    if node.parent is not None:
        out.append(node.event_type)
        if node.contiguity is Contiguity.PARTITION:
            out.append(None)
    if node.kleene:
        out.append(node.event_type)
        if node.inner is Contiguity.PARTITION:
            out.append(None)
    return out


# @a = 'text' or a = 'text' (a child step), and with an integer literal below 2**53 (exact as a double)
_XPATH_EQ = re.compile(r"""\s*(@?)([A-Za-z_][\w.\-]*)\s*=\s*(?:'([^']*)'|"([^"]*)"|([0-9]{1,15}))\s*\Z""")
_XPATH_NAME, _XPATH_BOUND = r"(@?)([A-Za-z_][\w.\-]*)", r"([0-9]{1,15})"
_XPATH_RANGE = re.compile(rf"\s*{_XPATH_NAME}\s*(<=|>=|<|>)\s*{_XPATH_BOUND}\s*\Z")  # @a > 12, a > 12
_XPATH_RANGE_FLIPPED = re.compile(rf"\s*{_XPATH_BOUND}\s*(<=|>=|<|>)\s*{_XPATH_NAME}\s*\Z")  # 12 < @a
_FLIP = {">": "<", ">=": "<=", "<": ">", "<=": ">=", "=": "="}


def index_key(spec: ComponentSpec) -> tuple | None:
    """An equality (preferred) or range conjunct of ``spec``'s begin condition on its own event."""
    me = f"#{spec.index}"
    found: list[tuple] = []
    for expr, _ in spec.begin:
        if isinstance(expr, XPathTest) and expr.var == me and not expr.namespaces:
            m = _XPATH_EQ.match(expr.source)
            if m:
                attribute, name, single, double, number = m.groups()
                text = single if single is not None else double
                kind = ("x" if attribute else "c") + ("eq" if text is not None else "num")
                found.append((kind, name, text if text is not None else int(number)))
            m = _XPATH_RANGE.match(expr.source)
            if m:
                attribute, name, op, bound = m.groups()
                found.append(("xrange", "xnum" if attribute else "cnum", name, op, int(bound)))
            m = _XPATH_RANGE_FLIPPED.match(expr.source)
            if m:
                bound, op, attribute, name = m.groups()
                found.append(("xrange", "xnum" if attribute else "cnum", name, _FLIP[op], int(bound)))
        elif isinstance(expr, Compare) and expr.op in _FLIP:
            left, right, op = expr.left, expr.right, expr.op
            if isinstance(left, Literal):
                left, right, op = right, left, _FLIP[op]
            if not (isinstance(left, Ref) and left.var == me and isinstance(right, Literal)):
                continue
            if left.index not in (Index.EACH, Index.FIRST) or left.attr in ("ts", "type", "seq"):
                continue
            v = right.value
            if op == "=" and (is_number(v) or type(v) is str):
                found.append(("eq", left.attr, v))
            elif op != "=" and is_number(v):
                found.append(("range", left.attr, op, v))
    found.sort(key=lambda k: k[0] in ("range", "xrange"))
    return found[0] if found else None


@dataclass(eq=False)
class State:
    """Where runs wait: inside Kleene ``node``, or after ``node`` for ``table``'s children."""

    node: Node | None  # None: the root level (no runs wait there)
    mode: str  # "wait" | "in"
    contiguity: Contiguity
    table: TransitionTable = field(default_factory=TransitionTable)
    child: Node | None = None  # the one child of a skip-till-next wait state
    id: int = field(default_factory=lambda: next(_ids))
    touch_all: bool = False  # every event moves or kills its runs: strict, or partition without an equivalence list

    def __post_init__(self) -> None:
        c = self.contiguity
        self.touch_all = c is Contiguity.STRICT or (c is Contiguity.PARTITION and not self.node.partition_by)

    def reacts_to(self, etype: str) -> bool:
        """Can an event of this type begin, take or proceed here?"""
        if self.mode == "in":
            node = self.node
            if node.event_type is None or node.event_type == etype:
                return True
            return any(w.table.types.get(etype) or w.table.types.get(None) for w in node.wait_states())
        return bool(self.table.types.get(etype) or self.table.types.get(None))

    def __repr__(self) -> str:
        return f"<{self.mode} {self.node!r} {self.contiguity.value}>"


class SharedNFA:
    """The trie of nodes; registering walks it and appends what is missing."""

    def __init__(self) -> None:
        self.roots: dict[Hashable, Node] = {}
        self.starters = TransitionTable()
        self.states: set[State] = set()
        # event types some state's runs react to (begin, take, proceed), None for every type (a component
        # of any type, or a partition-contiguity state): an event of another type moves no stored run
        self.reacting: Counter = Counter()

    def reacts(self, etype: str) -> bool:
        """May an event of type ``etype`` move (or kill) a run waiting in some state?"""
        r = self.reacting
        return bool(r.get(etype) or r.get(None))

    def add(self, plan: QueryPlan) -> None:
        """Merge ``plan``'s components into the trie (time proportional to the query)."""
        private = plan if plan.policy == "non_overlapping" else None
        parent: Node | None = None
        for spec in plan.specs:
            sig = spec.signature(plan.partition_by, private)
            siblings = parent.children if parent else self.roots
            node = siblings.get(sig)
            if node is None:
                node = self._new_node(parent, spec, sig, plan.partition_by)
                siblings[sig] = node
            node.users += 1
            node.count_window(plan.window, +1)
            plan.nodes.append(node)
            parent = node
        parent.accepts.append(plan)

    def _new_node(self, parent: Node | None, spec: ComponentSpec, sig: Hashable, partition_by) -> Node:
        node = Node(
            parent=parent,
            signature=sig,
            index=spec.index,
            event_type=spec.event_type,
            kleene=spec.kleene,
            contiguity=spec.contiguity,
            inner=spec.inner,
            begin=tuple(c for _, c in spec.begin),
            take=tuple(c for _, c in spec.take),
            final=tuple(c for _, c in spec.final),
            agg_slots=spec.agg_slots,
            keep_events=spec.keep_events,
            partition_by=partition_by,
            index_key=index_key(spec),
        )
        node.root = parent.root if parent is not None else node
        self.reacting.update(_reactions(node))
        if node.kleene:
            node.inside = State(node, "in", node.inner)
            self.states.add(node.inside)
        if parent is None:
            self.starters.add(node)
        else:
            wait_key = node.id if node.contiguity is Contiguity.SKIP_TILL_NEXT else node.contiguity
            wait = parent.waits.get(wait_key)
            if wait is None:
                child = node if node.contiguity is Contiguity.SKIP_TILL_NEXT else None
                wait = parent.waits[wait_key] = State(parent, "wait", node.contiguity, child=child)
                self.states.add(wait)
            wait.table.add(node)
        return node

    def remove(self, plan: QueryPlan) -> list[State]:
        """Take ``plan`` out; return the states that no query uses any more."""
        plan.nodes[-1].accepts.remove(plan)
        dropped: list[State] = []
        for node in reversed(plan.nodes):
            node.users -= 1
            node.count_window(plan.window, -1)
            if node.users:
                continue
            self.reacting.subtract(_reactions(node))
            self.reacting += Counter()  # drop the zeros
            parent = node.parent
            if node.inside is not None:
                dropped.append(node.inside)
            if parent is None:
                del self.roots[node.signature]
                self.starters.remove(node)
            else:
                del parent.children[node.signature]
                wait_key = node.id if node.contiguity is Contiguity.SKIP_TILL_NEXT else node.contiguity
                wait = parent.waits[wait_key]
                wait.table.remove(node)
                if not len(wait.table):
                    del parent.waits[wait_key]
                    dropped.append(wait)
        self.states.difference_update(dropped)
        return dropped

    # --- figures for `yfpp explain` ----------------------------------------------

    def nodes(self) -> Iterator[Node]:
        stack = list(self.roots.values())
        while stack:
            n = stack.pop()
            yield n
            stack.extend(n.children.values())
