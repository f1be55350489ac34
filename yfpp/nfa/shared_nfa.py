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

import math
import re
from bisect import bisect_left, bisect_right, insort
from collections import Counter
from dataclasses import dataclass, field
from itertools import count
from types import MappingProxyType
from typing import Any, Callable, Hashable, Iterable, Iterator, Mapping, Sequence

from yfpp.input.events import MISSING, Event
from yfpp.nfa.compiler import ComponentSpec, QueryPlan
from yfpp.language.pattern import Compare, Contiguity, Index, Literal, Or, Ref, XPathTest
from yfpp.nfa.predicates import AggSlot, Check, is_number
from yfpp.nfa.shared_atoms import HASHED as _HASHED, SharedAtoms

_ids = count()
_STRICT, _PARTITION, _NEXT = Contiguity.STRICT, Contiguity.PARTITION, Contiguity.SKIP_TILL_NEXT
#: what a node without children or wait states holds (read-only: the first one added takes its place, a second makes
#: a dict of both)
_NO_ENTRIES: Any = MappingProxyType({})


class _InBooks:
    """A figure of a node kept in its :class:`NodeBooks` (0 while it has none)."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, node: "Node | None", owner: type | None = None) -> Any:
        if node is None:
            return self
        return 0 if node.books is None else getattr(node.books, self.name)

    def __set__(self, node: "Node", value: int) -> None:
        setattr(node._books(), self.name, value)


@dataclass(eq=False, slots=True)
class Node:
    """A positive component shared by every query whose prefix leads here.

    (A subscription's nodes are most of what it costs: what every node of a kind of component shares is read from
    its signature's first item, what few nodes use is kept aside in :class:`NodeBooks`, each container is made
    when first needed.)"""

    parent: "Node | None"
    signature: Hashable  # (what the component is — ComponentSpec.signature, one tuple for every one alike —, …)
    index: int
    event_type: str | None
    kleene: bool
    contiguity: Contiguity
    inner: Contiguity
    begin: tuple[Check, ...]
    take: tuple[Check, ...]
    final: tuple[Check, ...]
    partition_by: tuple[str, ...]
    index_key: tuple | None  # how a TransitionTable can find this node, if at all
    root: "Node | None" = None  # the first node of this branch of the trie (itself for a root)
    id: int = field(default_factory=_ids.__next__)
    # signature -> child: _NO_ENTRIES, the only child itself (children_of, child_at), else a dict
    children: "Mapping[Hashable, Node] | Node" = field(default_factory=lambda: _NO_ENTRIES)
    # contiguity or child's id -> wait state: _NO_ENTRIES, the only wait state itself (a State is a mapping of
    # itself alone), else a dict
    waits: "Mapping[Hashable, State]" = field(default_factory=lambda: _NO_ENTRIES)
    inside: "State | None" = None
    # the queries accepting here: () none, the only one itself (most nodes that accept), else a list (accepting)
    accepts: "QueryPlan | list[QueryPlan] | tuple" = ()
    users: int = 0  # queries through this node
    window: float | None = None  # the largest window of the queries through here (None: unbounded): runs live that long
    live: int = 0  # on a branch's root node, kept by the runtime: its runs now
    books: "NodeBooks | None" = None

    @property
    def agg_slots(self) -> tuple[AggSlot, ...]:
        return self.signature[0][4]  # type: ignore[index]

    @property
    def keep_events(self) -> bool:
        return self.signature[0][5]  # type: ignore[index]

    #: on a branch's root node: when the caps count its queries' runs again (yfpp.runtime.caps), the size of its
    #: last "growing" report (yfpp.runtime.pruning)
    cap_check = _InBooks()
    reported = _InBooks()

    def _books(self) -> "NodeBooks":
        if self.books is None:
            self.books = NodeBooks()
        return self.books

    def count_window(self, window: float | None, delta: int) -> None:
        """One more (``delta`` +1, after ``users`` counted it) or one less (-1) query through here with ``window``."""
        ws = self.books.windows if self.books is not None else None
        if ws is None:
            if delta > 0 and self.users == 1:  # (a new node)
                self.window = window
                return
            if window == self.window:
                return
            ws = self._books().windows = {self.window: self.users - delta}
        ws[window] = ws.get(window, 0) + delta
        if not ws[window]:
            del ws[window]
        bounded = [w for w in ws if w is not None]
        self.window = None if None in ws or not bounded else max(bounded)
        if len(ws) == 1:
            self.books.windows = None  # type: ignore[union-attr]

    def wait_states(self) -> Iterable["State"]:
        return self.waits.values()

    def __repr__(self) -> str:
        return f"<node {self.id} {self.event_type or '*'}{'+' if self.kleene else ''}>"


class NodeBooks:
    """What few nodes keep: the windows of their queries when these differ, and on a branch's root the caps' and the
    growth reports' figures."""

    __slots__ = ("cap_check", "reported", "windows")

    def __init__(self) -> None:
        self.windows: dict | None = None  # window -> queries through the node with it; None: all have Node.window
        self.cap_check = 0
        self.reported = 0


def children_of(node: Node) -> Iterable[Node]:
    """``node``'s children."""
    children = node.children
    return (children,) if type(children) is Node else children.values()  # type: ignore[union-attr]


def child_at(node: Node, sig: Hashable) -> Node | None:
    """``node``'s child of signature ``sig``, if any."""
    children = node.children
    if type(children) is Node:
        return children if children.signature == sig else None  # type: ignore[union-attr]
    return children.get(sig)  # type: ignore[union-attr]


def _with(entries: Any, key: Hashable, value: "Node | State") -> Any:
    """``Node.children`` or ``Node.waits`` with ``key`` -> ``value`` added: the first entry stands for the mapping of
    itself alone, a second makes a dict of both."""
    if entries is _NO_ENTRIES:
        return value
    if type(entries) is not dict:
        entries = {entries.signature if type(entries) is Node else entries.key: entries}
    entries[key] = value
    return entries


def _without(entries: Any, key: Hashable) -> Any:
    """``Node.children`` or ``Node.waits`` without ``key`` (which it has)."""
    if type(entries) is not dict:
        return _NO_ENTRIES
    del entries[key]
    return entries


class TransitionTable:
    """The nodes an event may begin, by type and by indexed predicate.

    A table of one node (a wait state of a subscription of its own: most of them) holds just that node, in
    ``only``, and gives it as the candidate of every event of its type (its begin checks decide, as for any
    candidate); a second node, or :meth:`groups`, spreads it into ``by_type``."""

    __slots__ = ("by_type", "only")

    def __init__(self) -> None:
        self.by_type: dict[str | None, _TypeGroup] = _NO_ENTRIES  # (a dict once a second node is added)
        self.only: Node | None = None

    def add(self, node: Node) -> Node | None:
        """Add ``node``; return another node of its (hash) index key that an event finds with it here, if any."""
        if self.only is not None:
            self._spread()
        elif not self.by_type:
            self.only = node
            return None
        return self._add(node)

    def _add(self, node: Node) -> Node | None:
        if self.by_type is _NO_ENTRIES:
            self.by_type = {}
        group = self.by_type.get(node.event_type)
        if group is None:
            group = self.by_type[node.event_type] = _TypeGroup()
        return group.add(node)

    def _spread(self) -> None:
        """Put ``only`` into ``by_type``."""
        if self.only is not None:
            self._add(self.only)
            self.only = None

    def remove(self, node: Node) -> None:
        if self.only is node:
            self.only = None
            return
        group = self.by_type[node.event_type]
        group.remove(node)
        if not group.size:
            del self.by_type[node.event_type]

    def has_type(self, etype: str | None) -> bool:
        """Does a node of type ``etype`` (None: of any type) begin here?"""
        only = self.only
        return etype in self.by_type if only is None else only.event_type == etype

    def groups(self, etype: str) -> tuple["_TypeGroup", ...]:
        """The groups an event of type ``etype`` looks in: its type's, then any type's."""
        self._spread()
        return tuple(g for g in (self.by_type.get(etype), self.by_type.get(None)) if g is not None)

    def candidates(self, ev: Event) -> Sequence[Node]:
        """Children of the event's type or of any type, narrowed by the predicate indexes."""
        only = self.only
        if only is not None:
            return (only,) if only.event_type is None or only.event_type == ev.type else ()
        group = self.by_type.get(ev.type)
        anyg = self.by_type.get(None)
        if anyg is None:
            return () if group is None else group.candidates(ev)
        if group is None:
            return anyg.candidates(ev)
        return group.candidates(ev) + anyg.candidates(ev)

    def size(self) -> int:
        """How many nodes it holds (not ``__len__``: a :class:`State`, its own table, is a mapping of itself alone)."""
        return 1 if self.only is not None else sum(g.size for g in self.by_type.values())


class _TypeGroup:
    # (each index table is made when its first node comes: most groups hold one node of one kind)
    __slots__ = ("eq", "intervals", "plain", "prefixes", "ranges", "size", "xpath", "xpath_keys")

    def __init__(self) -> None:
        self.size = 0  # the nodes in it
        self.plain: list[Node] | tuple = ()
        self.eq: dict[str, dict[Any, Sequence[Node]]] = _NO_ENTRIES
        # XPath equalities, by (kind, name): @a = 'text' ("xeq"), @a = 12 ("xnum"), a = 'text' ("ceq"), a = 12
        # ("cnum"); looked up by what xpath_ext.xpath_predicates.index_keys reads of the event
        self.xpath: dict[tuple[str, str], dict[Any, Sequence[Node]]] = _NO_ENTRIES
        # range predicates, by (source, attribute, op): a SASE+ attribute's value (source None), an XPath
        # attribute's or child's text cast as XPath casts it ("xnum", "cnum"); sorted (bound, node id) keys
        self.ranges: dict[tuple[str | None, str, str], tuple[list[tuple[Any, int]], dict[int, Node]]] = _NO_ENTRIES
        # both bounds of a range (lo <= x < hi), by (source, attribute) as for ranges: stabbed by the value
        self.intervals: dict[tuple[str | None, str], IntervalIndex] = _NO_ENTRIES
        # XPath starts-with(@a, 'p') / starts-with(a, 'p'), by (kind, name): prefix length -> prefix -> nodes
        self.prefixes: dict[tuple[str, str], dict[int, dict[str, Sequence[Node]]]] = _NO_ENTRIES
        #: xpath_ext.xpath_predicates.index_keys, once an XPath index is made (a run without XPath never loads it)
        self.xpath_keys: Callable[[str, str, Event], list[Any] | None] | None = None

    def _table(self, name: str) -> dict:
        """The index table ``name`` (``eq``, ``xpath``…), made now if it is not yet."""
        table = getattr(self, name)
        if table is _NO_ENTRIES:
            table = {}
            setattr(self, name, table)
        return table

    def _read_xpath_keys(self) -> None:
        """From now on, candidates are looked up by the event's XPath values too (``xpath_ext`` is imported only
        once a node of an XPath index key is added)."""
        from xpath_ext.xpath_predicates import index_keys

        self.xpath_keys = index_keys

    def add(self, node: Node) -> Node | None:
        """Index ``node``; for a hash index key, return another node the same lookup finds, if any."""
        key = node.index_key
        self.size += 1
        if key is not None and key[0] in _HASHED:  # (the commonest: an equality with one value)
            if key[0] == "eq":
                tables, at = self.eq, key[1]
                if tables is _NO_ENTRIES:
                    tables = self.eq = {}
            else:  # (an XPath one: by (kind, name))
                tables, at = self.xpath, key[:2]
                if tables is _NO_ENTRIES:
                    tables = self.xpath = {}
                    if self.xpath_keys is None:
                        self._read_xpath_keys()
            table = tables.get(at)
            if table is None:
                table = tables[at] = {}
            value = key[2]
            had = table.get(value)
            if had is None:  # (the commonest: a value no other node is found by)
                table[value] = (node,)
                return None
            table[value] = appended(had, node)
            return had[0] if had else None  # (a node the same lookup finds: TransitionTable.add)
        if key is not None and self.xpath_keys is None and _reads_xpath(key):
            self._read_xpath_keys()
        if key is None:
            if self.plain:
                self.plain.append(node)
            else:
                self.plain = [node]
        elif key[0] in ("range", "xrange"):
            slot, c = _range_slot(key)
            keys, nodes = self._table("ranges").setdefault(slot, ([], {}))
            insort(keys, (c, node.id))
            nodes[node.id] = node
        elif key[0] == "interval":
            _, source, attr, lo, lo_in, hi, hi_in = key
            self._table("intervals").setdefault((source, attr), IntervalIndex()).add(node, lo, lo_in, hi, hi_in)
        elif key[0] == "prefix":
            _, kind, name, prefix = key
            by_len = self._table("prefixes").setdefault((kind, name), {})
            append_to(by_len.setdefault(len(prefix), {}), prefix, node)
        else:
            for kind, attr, value in _eq_keys(key):
                table = (self._table("eq").setdefault(attr, {}) if kind == "eq"
                         else self._table("xpath").setdefault((kind, attr), {}))
                append_to(table, value, node)
        return None

    def remove(self, node: Node) -> None:
        key = node.index_key
        self.size -= 1
        if key is None:
            self.plain.remove(node)
        elif key[0] in ("range", "xrange"):
            slot, c = _range_slot(key)
            keys, nodes = self.ranges[slot]
            keys.pop(bisect_left(keys, (c, node.id)))
            del nodes[node.id]
            if not nodes:
                del self.ranges[slot]
        elif key[0] == "interval":
            _, source, attr, lo, _, hi, _ = key
            index = self.intervals[(source, attr)]
            index.remove(node, lo, hi)
            if not index:
                del self.intervals[(source, attr)]
        elif key[0] == "prefix":
            _, kind, name, prefix = key
            by_len = self.prefixes[(kind, name)]
            drop_from(by_len[len(prefix)], prefix, node)
            if not by_len[len(prefix)]:
                del by_len[len(prefix)]
                if not by_len:
                    del self.prefixes[(kind, name)]
        else:
            for kind, attr, value in _eq_keys(key):
                tables: dict = self.eq if kind == "eq" else self.xpath
                table = tables[attr if kind == "eq" else (kind, attr)]
                drop_from(table, value, node)
                if not table:
                    del tables[attr if kind == "eq" else (kind, attr)]

    def finder(self) -> tuple[tuple[Node, ...], tuple[tuple[str, dict], ...], "_TypeGroup | None"]:
        """How the runtime finds this group's candidates without a call: ``(plain, eq, None)`` — the nodes every
        event of the type gets, and the equality indexes (attribute, value -> nodes) to look its values up in,
        in :meth:`candidates`' order — or ``((), (), self)`` when an XPath or range index needs :meth:`candidates`.
        A snapshot of ``plain`` (made again after every registration change), live index tables."""
        if self.xpath or self.ranges or self.intervals or self.prefixes:
            return (), (), self
        return tuple(self.plain), tuple(self.eq.items()), None

    def candidates(self, ev: Event) -> Sequence[Node]:
        if not (self.eq or self.xpath or self.ranges or self.intervals or self.prefixes):
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
                    out += dict.fromkeys(n for nodes in table.values() for n in nodes)
                elif len(keys) == 1:
                    out += table.get(keys[0], ())
                else:  # (several children: a node of several keys, [@a='x' or @a='y'], found once)
                    out += dict.fromkeys(n for k in keys for n in table.get(k, ()))
        for (source, attr, op), (keys, nodes) in self.ranges.items():
            values = _numbers(source, attr, ev, index_keys)
            if values is None:  # (as above)
                out += nodes.values()
                continue
            if len(values) == 1:
                out += [nodes[nid] for _, nid in _in_range(keys, op, values[0])]
            elif values:  # (several children: each node once)
                out += {nid: nodes[nid] for v in values for _, nid in _in_range(keys, op, v)}.values()
        for (source, attr), index in self.intervals.items():
            values = _numbers(source, attr, ev, index_keys)
            if values is None:  # (as above)
                out += index.nodes()
                continue
            if len(values) == 1:
                out += index.stab(values[0])
            elif values:
                out += dict.fromkeys(n for v in values for n in index.stab(v))
        for (kind, name), by_len in self.prefixes.items():
            texts = index_keys(kind, name, ev)  # type: ignore[misc]
            if texts is None:  # (as above)
                out += [n for table in by_len.values() for nodes in table.values() for n in nodes]
                continue
            found = [n for text in texts for length, table in by_len.items() if len(text) >= length
                     for n in table.get(text[:length], ())]
            out += found if len(texts) < 2 else dict.fromkeys(found)
        return out


class IntervalIndex:
    """Nodes whose predicate holds for values in one interval (``lo <= x < hi`` and the like): a stabbing query
    finds those whose interval holds a value.  Intervals are kept by width class (widths in ``[2**(e-1), 2**e)``),
    each class sorted by lower bound: a value ``v`` looks at the lower bounds in ``[v - 2**e, v]`` of each class,
    about twice the intervals that hold it at most, whatever their overlap."""

    __slots__ = ("classes",)

    def __init__(self) -> None:
        # width exponent -> (sorted (lo, node id), node id -> (node, lo inclusive, hi, hi inclusive))
        self.classes: dict[int, tuple[list[tuple[Any, int]], dict[int, tuple[Node, bool, Any, bool]]]] = {}

    def __bool__(self) -> bool:
        return bool(self.classes)

    def add(self, node: Node, lo: Any, lo_in: bool, hi: Any, hi_in: bool) -> None:
        keys, entries = self.classes.setdefault(_width_class(lo, hi), ([], {}))
        insort(keys, (lo, node.id))
        entries[node.id] = (node, lo_in, hi, hi_in)

    def remove(self, node: Node, lo: Any, hi: Any) -> None:
        e = _width_class(lo, hi)
        keys, entries = self.classes[e]
        keys.pop(bisect_left(keys, (lo, node.id)))
        del entries[node.id]
        if not entries:
            del self.classes[e]

    def nodes(self) -> list[Node]:
        return [n for _, entries in self.classes.values() for n, _, _, _ in entries.values()]

    def stab(self, v: Any) -> list[Node]:
        """The nodes whose interval holds ``v`` (a number, not NaN)."""
        out = []
        for e, (keys, entries) in self.classes.items():
            start = bisect_left(keys, (v - 2.0 ** e, -1))
            stop = bisect_right(keys, (v, float("inf")), start)
            for lo, nid in keys[start:stop]:
                node, lo_in, hi, hi_in = entries[nid]
                if (v < hi or (hi_in and v == hi)) and (lo_in or lo < v):
                    out.append(node)
        return out


def _width_class(lo: Any, hi: Any) -> int:
    """The exponent ``e`` with ``hi - lo < 2**e`` (and ``>= 2**(e-1)`` unless 0): an interval's width class."""
    return math.frexp(hi - lo)[1]


def _reads_xpath(key: tuple) -> bool:
    """Is ``key`` looked up through ``xpath_ext.xpath_predicates.index_keys`` (an XPath index)?"""
    if key[0] == "anyof":
        key = key[1][0]
    return key[0] not in ("eq", "range") and not (key[0] == "interval" and key[1] is None)


def _eq_keys(key: tuple) -> tuple[tuple, ...]:
    """The equality keys a node is found by: one, or several of one table (``anyof``: ``a = 'x' OR a = 'y'``)."""
    return key[1] if key[0] == "anyof" else (key,)


def accepting(node: Node) -> "Sequence[QueryPlan]":
    """The queries accepting at ``node`` (its ``accepts``: none, the only one itself, or a list)."""
    accepts = node.accepts
    return accepts if type(accepts) is list or not accepts else (accepts,)


def appended(items: tuple | list | None, item: Any) -> tuple | list:
    """``items`` with ``item`` added: a tuple of one (most index keys hold one), else a list
    (changed in place)."""
    if not items:
        return (item,)
    if type(items) is tuple:
        return [*items, item]
    items.append(item)
    return items


def removed(items: tuple | list, item: Any) -> tuple | list:
    """``items`` (made by :func:`appended`) without ``item``: a list changed in place, a tuple of one emptied."""
    if type(items) is tuple:
        return ()
    items.remove(item)
    return items


def append_to(table: dict, key: Any, item: Any) -> None:
    """``item`` (an index entry's node) added to ``table[key]``'s (:func:`appended`)."""
    table[key] = appended(table.get(key), item)


def drop_from(table: dict, key: Any, item: Any) -> None:
    """Take ``item`` out of ``table[key]``'s (:func:`removed`), and the key when that empties it."""
    if not removed(table[key], item):
        del table[key]


def _numbers(source: str | None, attr: str, ev: Event, index_keys: Any) -> tuple | None:
    """The numbers a range or interval index on ``(source, attr)`` looks up for ``ev`` (an attribute's number,
    or what ``index_keys`` reads of an XPath source, NaN left out: it compares false); None when ``index_keys``
    cannot tell, and every node of the index is a candidate."""
    if source is None:
        v = ev.attrs.get(attr, MISSING)
        return (v,) if is_number(v) else ()
    found = index_keys(source, attr, ev)
    return None if found is None else tuple(v for v in found if v == v)


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
_XPATH_PREFIX = re.compile(rf"""\s*starts-with\(\s*{_XPATH_NAME}\s*,\s*(?:'([^']+)'|"([^"]+)")\s*\)\s*\Z""")
#: the index keys that are no plain equality (best_key prefers any equality to them)
NOT_EQUALITY = ("anyof", "prefix", "range", "xrange")
_FLIP = {">": "<", ">=": "<=", "<": ">", "<=": ">=", "=": "="}
_LOWER, _UPPER = (">", ">="), ("<", "<=")


def index_key(spec: ComponentSpec) -> tuple | None:
    """How a transition table finds ``spec``'s node: a conjunct of its begin condition on its own event — an
    equality (preferred), an ``or`` of equalities on one attribute (``anyof``), an XPath ``starts-with``
    (``prefix``), both bounds of a range on one attribute (``interval``), else one bound (``range``).  XPath
    brackets are split at their top-level ``and`` (``[@a='x' and @b > 3]`` as ``[@a='x'][@b > 3]``), SASE+
    conditions are conjuncts already.  None: the node is tested by every event of its type."""
    me = f"#{spec.index}"
    return best_key([k for expr, _ in spec.begin for k in conjunct_keys(expr, me)])


def conjunct_keys(expr: Any, me: str) -> list[tuple]:
    """The index keys of one canonical conjunct of the begin condition of component ``me`` (``#i``)."""
    if isinstance(expr, XPathTest):
        return _xpath_keys(expr.source) if expr.var == me and not expr.namespaces else []
    return _sase_keys(expr, me)


def atom_key(expr: Any, me: str) -> tuple | None:
    """The index key of a conjunct of component ``me``'s begin condition that is nothing but the equality of its
    event's attribute (or child) with a string (``a.zone = 'Z2'``, ``[@zone='Z2']``), else None.  It stands for
    the condition of such a component in its node's signature: one object, its index key too, in place of an
    expression key of its own (a million subscriptions, a million of them)."""
    if isinstance(expr, XPathTest):
        key = _xpath_atom(expr.source) if expr.var == me and not expr.namespaces else None
    else:
        key = _sase_compare(expr, me) if isinstance(expr, Compare) else None
    return key if key is not None and key[0] in ("eq", "xeq", "ceq") and type(key[-1]) is str else None


def best_key(found: list[tuple]) -> tuple | None:
    """The most selective of the keys found: equality, then ``anyof`` (fewest values), prefix (longest),
    interval (both bounds of one attribute, the first of each), range."""
    if len(found) < 2:
        return found[0] if found else None
    eqs = [k for k in found if k[0] not in NOT_EQUALITY]
    if eqs:
        return eqs[0]
    anyof = [k for k in found if k[0] == "anyof"]
    if anyof:
        return min(anyof, key=lambda k: len(k[1]))
    prefixes = [k for k in found if k[0] == "prefix"]
    if prefixes:
        return max(prefixes, key=lambda k: len(k[3]))
    bounds: dict[tuple, tuple[tuple | None, tuple | None]] = {}
    for k in found:  # ("range", attr, op, c) / ("xrange", source, name, op, c): the attribute, the bound
        slot, c = _range_slot(k)
        source, attr, op = slot
        lo, hi = bounds.get((source, attr), (None, None))
        if op in _LOWER and lo is None:
            lo = (c, op == ">=")
        elif op in _UPPER and hi is None:
            hi = (c, op == "<=")
        bounds[(source, attr)] = (lo, hi)
    for (source, attr), (lo, hi) in bounds.items():
        if lo is not None and hi is not None and lo[0] <= hi[0] and _finite_width(lo[0], hi[0]):
            return ("interval", source, attr, lo[0], lo[1], hi[0], hi[1])
    return found[0]


def _finite_width(lo: Any, hi: Any) -> bool:
    try:
        return math.isfinite(hi - lo)
    except OverflowError:  # (integers beyond a double)
        return False


def _sase_keys(expr: Any, me: str) -> list[tuple]:
    """The index keys of one SASE+ conjunct: a comparison of the event's attribute with a literal, or an ``OR`` of
    equalities of one attribute."""
    if isinstance(expr, Or):
        keys = [_sase_compare(e, me) for e in expr.operands]
        if keys and all(k is not None and k[0] == "eq" and k[1] == keys[0][1] for k in keys):
            return [("anyof", tuple(dict.fromkeys(keys)))]
        return []
    key = _sase_compare(expr, me)
    return [] if key is None else [key]


def _sase_compare(expr: Any, me: str) -> tuple | None:
    if not (isinstance(expr, Compare) and expr.op in _FLIP):
        return None
    left, right, op = expr.left, expr.right, expr.op
    if isinstance(left, Literal):
        left, right, op = right, left, _FLIP[op]
    if not (isinstance(left, Ref) and left.var == me and isinstance(right, Literal)):
        return None
    if left.index not in (Index.EACH, Index.FIRST) or left.attr in ("ts", "type", "seq"):
        return None
    v = right.value
    if op == "=" and (is_number(v) or type(v) is str):
        return ("eq", left.attr, v)
    if op != "=" and is_number(v):
        return ("range", left.attr, op, v)
    return None


def _xpath_keys(source: str) -> list[tuple]:
    """The index keys of an XPath predicate's text: of itself, of each operand of a top-level ``and``, or one
    ``anyof`` for a top-level ``or`` of equalities on one attribute or child."""
    disjuncts = _split_top(source, "or")
    if len(disjuncts) > 1:
        keys = [_xpath_atom(_unparen(d)) for d in disjuncts]
        if all(k is not None and k[0] in ("xeq", "xnum", "ceq", "cnum") and k[:2] == keys[0][:2] for k in keys):
            return [("anyof", tuple(dict.fromkeys(keys)))]  # type: ignore[arg-type]
        return []
    conjuncts = _split_top(source, "and")
    if len(conjuncts) > 1:
        return [k for c in conjuncts for k in _xpath_keys(_unparen(c))]
    key = _xpath_atom(source)
    return [] if key is None else [key]


def _xpath_atom(source: str) -> tuple | None:
    """The index key of one comparison (or ``starts-with``) of an attribute or child with a literal."""
    m = _XPATH_EQ.match(source)
    if m:
        attribute, name, single, double, number = m.groups()
        text = single if single is not None else double
        return (("x" if attribute else "c") + ("eq" if text is not None else "num"), name,
                text if text is not None else int(number))
    m = _XPATH_RANGE.match(source)
    if m:
        attribute, name, op, bound = m.groups()
        return ("xrange", "xnum" if attribute else "cnum", name, op, int(bound))
    m = _XPATH_RANGE_FLIPPED.match(source)
    if m:
        bound, op, attribute, name = m.groups()
        return ("xrange", "xnum" if attribute else "cnum", name, _FLIP[op], int(bound))
    m = _XPATH_PREFIX.match(source)
    if m:
        attribute, name, single, double = m.groups()
        return ("prefix", "xeq" if attribute else "ceq", name, single if single is not None else double)
    return None


def _split_top(source: str, word: str) -> list[str]:
    """``source`` cut at each ``word`` (``and``/``or``, between spaces) outside quotes, brackets and parentheses."""
    if word not in source:  # (most predicates: no character walk)
        return [source]
    parts, depth, quote, start, i, n = [], 0, "", 0, 0, len(source)
    token = f" {word} "
    while i < n:
        ch = source[i]
        if quote:
            if ch == quote:
                quote = ""
        elif ch in "'\"":
            quote = ch
        elif ch in "([":
            depth += 1
        elif ch in ")]":
            depth -= 1
        elif depth == 0 and ch.isspace() and source.startswith(word, i + 1) and i + 1 + len(word) < n \
                and source[i + 1 + len(word)].isspace():
            parts.append(source[start:i])
            i += len(token)
            start = i
            continue
        i += 1
    parts.append(source[start:])
    return parts


def _unparen(source: str) -> str:
    """``source`` without parentheses around all of it."""
    s = source.strip()
    while s.startswith("(") and s.endswith(")") and _balanced(s[1:-1]):
        s = s[1:-1].strip()
    return s


def _balanced(source: str) -> bool:
    """Do the parentheses outside quotes of ``source`` pair up left to right (``(a) or (b)`` does not)?"""
    depth, quote = 0, ""
    for ch in source:
        if quote:
            if ch == quote:
                quote = ""
        elif ch in "'\"":
            quote = ch
        elif ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth < 0:
                return False
    return depth == 0


@dataclass(eq=False, slots=True, init=False)
class State(TransitionTable):
    """Where runs wait: inside Kleene ``node``, or after ``node`` for ``table``'s children.  A state is its own
    transition table (``table`` is itself): one object a wait state, not two (a million subscriptions make a
    million wait states, each an object the cyclic collector walks at every full collection)."""

    node: Node | None  # None: the root level (no runs wait there)
    mode: str  # "wait" | "in"
    contiguity: Contiguity
    table: TransitionTable  # itself
    child: Node | None  # the one child of a skip-till-next wait state
    touch_all: bool  # every event moves or kills its runs: strict, or partition without an equivalence list

    def __init__(self, node: Node, mode: str, contiguity: Contiguity, child: Node | None = None) -> None:
        # (written out, not a dataclass's: a million subscriptions make a million wait states)
        self.by_type = _NO_ENTRIES
        self.only = None
        self.node = node
        self.mode = mode
        self.contiguity = contiguity
        self.table = self
        self.child = child
        self.touch_all = contiguity is _STRICT or (contiguity is _PARTITION and not node.partition_by)

    # A node's only wait state stands for the mapping of it alone in ``Node.waits`` (most nodes have one: a dict of
    # one entry, or an object holding the entry, would cost a million subscriptions 50–220 MB).

    @property
    def key(self) -> Hashable:
        """Its key in its node's ``waits``: its child's id under skip-till-next, else its contiguity."""
        return self.child.id if self.child is not None else self.contiguity

    def values(self) -> tuple["State"]:
        return (self,)

    def get(self, key: Hashable, default: Any = None) -> Any:
        return self if key == self.key else default

    def __getitem__(self, key: Hashable) -> "State":
        if key == self.key:
            return self
        raise KeyError(key)

    def __len__(self) -> int:
        return 1

    def reacts_to(self, etype: str) -> bool:
        """Can an event of this type begin, take or proceed here?"""
        if self.mode == "in":
            node = self.node
            if node.event_type is None or node.event_type == etype:
                return True
            return any(w.table.has_type(etype) or w.table.has_type(None) for w in node.wait_states())
        return self.table.has_type(etype) or self.table.has_type(None)

    def __repr__(self) -> str:
        return f"<{self.mode} {self.node!r} {self.contiguity.value}>"


class SharedNFA:
    """The trie of nodes; registering walks it and appends what is missing."""

    def __init__(self) -> None:
        self.roots: dict[Hashable, Node] = {}
        self.starters = TransitionTable()
        self.states = 0  # how many states there are (the runtime's live_states)
        # event types some state's runs react to (begin, take, proceed), None for every type (a component
        # of any type, or a partition-contiguity state): an event of another type moves no stored run
        self.reacting: Counter = Counter()
        self.atoms = SharedAtoms()  # atomic checks several nodes hold: evaluated once per event

    def reacts(self, etype: str) -> bool:
        """May an event of type ``etype`` move (or kill) a run waiting in some state?"""
        r = self.reacting
        return bool(r.get(etype) or r.get(None))

    def add(self, plan: QueryPlan) -> None:
        """Merge ``plan``'s components into the trie (time proportional to the query)."""
        private = plan if plan.policy == "non_overlapping" else None
        partition_by, window = plan.partition_by, plan.window
        parent: Node | None = None
        new = False  # (below a node made now there is nothing to look up)
        for spec in plan.specs:
            keys, what = spec.keys, spec.what
            if keys is None:
                sig = spec.signature(partition_by, private)
                if len(spec.begin) == 1:  # (one made from its shape's plan has its atom key)
                    atom = atom_key(spec.begin[0][0], f"#{spec.index}")
                    if atom is not None:
                        sig = (sig[0], atom, *sig[2:])
            elif private is None and what is not None and what[6] == partition_by:  # (made from its shape's plan)
                sig = spec.shared_signature
                if sig is None:
                    sig = (what, keys[0]) if keys[1] == () and keys[2] == () else spec.signature(partition_by, None)
            else:
                sig = spec.signature(partition_by, private)
            node = None if new else child_at(parent, sig) if parent else self.roots.get(sig)
            if node is None:
                node = self._new_node(parent, spec, sig, partition_by, window)
                if parent is None:
                    self.roots[sig] = node
                else:
                    parent.children = _with(parent.children, sig, node)
                new = True
            else:
                node.users += 1
                node.count_window(window, +1)
            parent = node
        plan.last = parent
        accepts = parent.accepts
        if not accepts:
            parent.accepts = plan  # (the only query itself, the commonest: no tuple of one)
        elif type(accepts) is list:
            accepts.append(plan)
        else:
            parent.accepts = [accepts, plan]

    def _new_node(self, parent: Node | None, spec: ComponentSpec, sig: Hashable, partition_by,
                  window: float | None) -> Node:
        """A node of ``spec`` under ``parent`` (None: a root), its first query's ``window`` counted."""
        # (positional arguments, in Node's field order: a million subscriptions make two million nodes; users 1 and
        # the window, what count_window sets for a node's first query)
        begin = spec.begin
        key = index_key(spec) if spec.keys is None else spec.keys[3]
        node = Node(parent, sig, spec.index, spec.event_type, spec.kleene, spec.contiguity, spec.inner,
                    (begin[0][1],) if len(begin) == 1 else tuple([c for _, c in begin]),  # (one: no comprehension)
                    tuple([c for _, c in spec.take]) if spec.take else (),
                    tuple([c for _, c in spec.final]) if spec.final else (),
                    partition_by, key, None if parent is None else parent.root, next(_ids), _NO_ENTRIES, _NO_ENTRIES,
                    None, (), 1, window)
        reacting = self.reacting
        for r in _reactions(node):
            reacting[r] += 1
        if node.kleene:
            node.inside = State(node, "in", node.inner)
            self.states += 1
        if parent is None:
            node.root = node
            mate = self.starters.add(node)
            if key is None or key[0] not in _HASHED:  # (not hash_keyed: counted)
                self.atoms.count(node)
            elif mate is not None:  # (else alone under its key: not counted)
                self.atoms.add(node, mate)
        else:
            contiguity = node.contiguity
            wait_key = node.id if contiguity is _NEXT else contiguity
            waits = parent.waits
            wait = None if waits is _NO_ENTRIES else waits.get(wait_key)  # (none under a node made now)
            if wait is None:
                wait = State(parent, "wait", contiguity, node if contiguity is _NEXT else None)
                parent.waits = wait if waits is _NO_ENTRIES else _with(waits, wait_key, wait)
                self.states += 1
                wait.only = node  # (its table's first node: TransitionTable.add)
            else:
                wait.table.add(node)
            self.atoms.count(node)
        return node

    def remove(self, plan: QueryPlan) -> list[State]:
        """Take ``plan`` out; return the states that no query uses any more."""
        last = plan.last
        accepts = last.accepts
        if type(accepts) is list:
            accepts.remove(plan)
        if type(accepts) is not list or not accepts:
            last.accepts = ()
        dropped: list[State] = []
        for node in reversed(plan.nodes):
            node.users -= 1
            node.count_window(plan.window, -1)
            if node.users:
                continue
            self.atoms.remove(node)
            self.reacting.subtract(_reactions(node))
            self.reacting += Counter()  # drop the zeros
            parent = node.parent
            if node.inside is not None:
                dropped.append(node.inside)
            if parent is None:
                del self.roots[node.signature]
                self.starters.remove(node)
            else:
                parent.children = _without(parent.children, node.signature)
                wait_key = node.id if node.contiguity is Contiguity.SKIP_TILL_NEXT else node.contiguity
                wait = parent.waits[wait_key]
                wait.table.remove(node)
                if not wait.size():
                    parent.waits = _without(parent.waits, wait_key)
                    dropped.append(wait)
        self.states -= len(dropped)
        return dropped

    # --- figures for `yfpp explain` ----------------------------------------------

    def nodes(self) -> Iterator[Node]:
        stack = list(self.roots.values())
        while stack:
            n = stack.pop()
            yield n
            stack.extend(children_of(n))
