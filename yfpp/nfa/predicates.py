"""Predicate compilation: expression trees → closures ``f(ev, vec) -> bool``.

Each conjunct is compiled once, for the place the compiler put it:

* ``ev`` is the event being tested at that place (``None`` for checks that
  look only at what a run has bound: Kleene *final* checks and RETURN);
* ``vec`` is the run's computation-state vector (SIGMOD 2008 §5.2): one slot
  per positive component, an :class:`~yfpp.input.events.Event` for a single
  variable, a :class:`KleeneState` for a Kleene variable, ``None`` while
  unbound.  Aggregates live in :class:`KleeneState` and are updated
  incrementally on every take; nothing is recomputed from the buffer.

Value semantics (docs/semantics.md §4): a missing attribute, a type mismatch, a division
by zero, an overflow (a huge integer meeting a float, an integer result of more than 4,300 digits, a float result that is
not finite — in arithmetic, ``sum`` and ``avg``) yields ``MISSING``; any comparison with ``MISSING`` is false, so
``NOT`` of it is true.  Numbers are int/float (bool is not a number).
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from functools import lru_cache
from itertools import product
from typing import Any, Callable, Hashable, Iterator

from yfpp.errors import PatternError
from yfpp.nfa.check_objects import AllOf, AnyOf, AttrOfPicked, EndOfRunAttr, FirstOrEvent, NotOf, compare_with
from yfpp.input.events import MISSING, PSEUDO_ATTRS, Event
from yfpp.language.pattern import (
    Aggregate,
    And,
    Arith,
    Compare,
    Expr,
    Index,
    Length,
    Literal,
    Neg,
    Not,
    Or,
    Ref,
    XPathTest,
    walk,
)

Getter = Callable[[Any, tuple], Any]
Check = Callable[[Any, tuple], bool]


_INF = float("inf")
#: int results are kept below this (at most 4,300 digits): the most Python converts to text
#: (``sys.int_info.default_max_str_digits``) and the most the readers take in
_INT_LIMIT = 10**4300


def is_number(v: Any) -> bool:
    return (type(v) is int or type(v) is float) and v == v  # NaN compares false anyway


# --- comparison and arithmetic with docs/semantics.md §4 semantics ------------------------

_CMP = {"=": operator.eq, "!=": operator.ne, "<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge}


INCOMPARABLE = frozenset({type(MISSING), type(None), list, dict})  #: values that compare with nothing


def comparable(a: Any, b: Any, ordered: bool) -> bool:
    """May ``a`` and ``b`` be compared (same kind, not missing, null, a list or a dict; bools only for = and !=)?"""
    ta, tb = type(a), type(b)
    if ta is tb:
        if ta is str or ta is int or ta is float:
            return True
        return ta not in INCOMPARABLE and not (ordered and ta is bool)
    return (ta is int or ta is float) and (tb is int or tb is float)


def _make_compare(op: str) -> Callable[[Any, Any], bool]:
    fn, ordered = _CMP[op], op not in ("=", "!=")
    return lambda a, b: comparable(a, b, ordered) and fn(a, b)


_COMPARE = {op: _make_compare(op) for op in _CMP}  # (one function per operator, shared by every predicate)
_EQUAL = _COMPARE["="]
_OP_OF = {fn: op for op, fn in _COMPARE.items()}


def compare_fn(op: str) -> Callable[[Any, Any], bool]:
    """``a op b`` as a function: false on MISSING and on a type mismatch."""
    return _COMPARE[op]


def arith(op: str, a: Any, b: Any) -> Any:
    """``a op b``; MISSING for a non-number, a zero divisor, or an overflow (a float result that is not finite)."""
    if not (is_number(a) and is_number(b)):
        return MISSING
    try:
        if op == "+":
            r = a + b
        elif op == "-":
            r = a - b
        elif op == "*":
            r = a * b
        elif b == 0:
            return MISSING
        else:
            r = a / b if op == "/" else a % b
    except OverflowError:  # a huge int meeting a float, or a quotient beyond a float
        return MISSING
    if type(r) is int:
        return r if r.bit_length() <= 14_284 or -_INT_LIMIT < r < _INT_LIMIT else MISSING  # (2**14284 < _INT_LIMIT)
    return r if -_INF < r < _INF else MISSING


def truthy(v: Any) -> bool:
    return v is True


# --- computation state of a Kleene variable ----------------------------------


@dataclass(frozen=True)
class AggSlot:
    func: str
    attr: str


class KleeneState:
    """What a run keeps of a Kleene variable: first, last, length, aggregates.

    ``aggs[i]`` is the running value of slot ``i``: ``(sum, count)`` for avg,
    the sum, min, max or count — ``MISSING`` once an event lacked a number.
    ``events`` is a cons list ``(event, rest)`` kept only when a predicate
    quantifies over every bound event.
    """

    __slots__ = ("first", "last", "n", "aggs", "events")

    def __init__(self, first: Event, last: Event, n: int, aggs: tuple, events: tuple | None):
        self.first = first
        self.last = last
        self.n = n
        self.aggs = aggs
        self.events = events

    def iter_events(self) -> Iterator[Event]:
        out = []
        node = self.events
        while node is not None:
            out.append(node[0])
            node = node[1]
        return reversed(out)


def _agg_start(func: str, v: Any) -> Any:
    if func == "count":
        return 0 if v is MISSING else 1
    if not is_number(v):
        return MISSING
    return (v, 1) if func == "avg" else v


def _agg_add(func: str, acc: Any, v: Any) -> Any:
    if func == "count":
        return acc if v is MISSING else acc + 1
    if acc is MISSING or not is_number(v):
        return MISSING
    if func == "avg":
        total = arith("+", acc[0], v)
        return MISSING if total is MISSING else (total, acc[1] + 1)
    if func == "sum":
        return arith("+", acc, v)
    if func == "min":
        return v if v < acc else acc
    return v if v > acc else acc


def _agg_value(func: str, acc: Any) -> Any:
    if func == "avg" and acc is not MISSING:
        return arith("/", acc[0], acc[1])
    return acc


def kleene_start(ev: Event, slots: tuple[AggSlot, ...], keep: bool) -> KleeneState:
    aggs = tuple(_agg_start(s.func, ev.get(s.attr)) for s in slots)
    return KleeneState(ev, ev, 1, aggs, (ev, None) if keep else None)


def kleene_take(ks: KleeneState, ev: Event, slots: tuple[AggSlot, ...]) -> KleeneState:
    aggs = tuple(_agg_add(s.func, acc, ev.get(s.attr)) for s, acc in zip(slots, ks.aggs))
    return KleeneState(ks.first, ev, ks.n + 1, aggs, (ev, ks.events) if ks.events is not None else None)


# --- compilation ---------------------------------------------------------------


@dataclass(frozen=True)
class Place:
    """Where a compiled expression runs.

    ``current``: the variable whose event is ``ev`` (the component being
    begun/taken, or the negated variable), or ``None``.  ``mode`` ``"iter"``
    means ``ev`` is a new iteration of Kleene ``current`` (``vec`` holds the
    iterations before it); ``"event"`` a single/negated event; ``"bound"`` no
    current event (final checks, RETURN).
    """

    current: str | None
    mode: str  # "iter" | "event" | "bound"


class Scope:
    """Variable layout of one pattern: positive index and Kleene flag per variable."""

    def __init__(self, slot_of: dict[str, int], kleene: set[str], agg_slots: dict[str, tuple[AggSlot, ...]]):
        self.slot_of = slot_of
        self.kleene = kleene
        self.agg_slots = agg_slots

    def agg_index(self, var: str, func: str, attr: str) -> int:
        return self.agg_slots[var].index(AggSlot(func, attr))


def quantified_vars(expr: Expr, place: Place, scope: Scope) -> list[str]:
    """Kleene variables read as ``v.attr`` outside their own iteration: ∀ over bound events."""
    out: list[str] = []
    if not scope.kleene:
        return out
    for n in walk(expr):
        if isinstance(n, (Ref, XPathTest)) and n.var in scope.kleene and (getattr(n, "index", Index.EACH) is Index.EACH):
            if not (place.mode == "iter" and n.var == place.current) and n.var not in out:
                out.append(n.var)
    return out


def compile_check(expr: Expr, place: Place, scope: Scope, xpath_compiler: Callable | None = None) -> Check:
    """Compile a boolean expression (one conjunct) for ``place``."""
    return _Compiler(place, scope, xpath_compiler).boolean(expr)


def compile_value(expr: Expr, place: Place, scope: Scope) -> Getter:
    """Compile a value expression (a RETURN attribute); Kleene ``v.attr`` gives a list."""
    return _Compiler(place, scope, None, list_each=True).value(expr)


@lru_cache(maxsize=4096)
def _event_attr(attr: str) -> Getter:
    """The getter of attribute ``attr`` of the event being tested (one per attribute, shared by predicates)."""
    get = lambda ev, vec: ev.attrs.get(attr, MISSING)
    get.event_attr = attr  # type: ignore[attr-defined]  # what it reads: _compare calls no getter for it
    return get


class _AttrCompare:
    """``ev.attr op lit``, the commonest predicate of all, as a callable slotted object: half the memory of a
    ``partial`` over a function (which keeps an empty keywords dict), 64 bytes less than its bound method
    (a million subscriptions hold millions of checks). Its price: calling the object costs about 150 ns more
    than calling a bound method on Python 3.11 (``__call__`` has no vectorcall); a check runs only where the
    index did not decide, and ``yfpp run`` side by side showed no change (benchmarks/RESULTS.md)."""

    __slots__ = ("cmp", "attr", "lit")

    def __init__(self, cmp: Callable[[Any, Any], bool], attr: str, lit: Any) -> None:
        self.cmp = cmp
        self.attr = attr
        self.lit = lit

    def __call__(self, ev: Event, vec: tuple) -> bool:
        return self.cmp(ev.attrs.get(self.attr, MISSING), self.lit)

    def atom_key(self) -> tuple:
        """What it computes (:func:`atom_key`): an equality with a string or a number as its index key is written
        (``("eq", attr, value)``: ``x = 1`` and ``x = 1.0`` hold for the same values), else with the constant's type."""
        lit = self.lit
        if self.cmp is _EQUAL and (type(lit) is str or is_number(lit)):
            return ("eq", self.attr, lit)
        return (_OP_OF[self.cmp], self.attr, type(lit), lit)


class _AttrAmong:
    """``ev.attr = 'x' OR ev.attr = 'y' OR …`` (strings): one object where an ``AnyOf`` of comparisons is four (its
    parts' tuple and each part: a subscription's objects are walked at every full collection)."""

    __slots__ = ("attr", "texts")

    def __init__(self, attr: str, texts: tuple[str, ...]) -> None:
        self.attr = attr
        self.texts = texts

    def __call__(self, ev: Event, vec: tuple) -> bool:
        v = ev.attrs.get(self.attr, MISSING)
        return type(v) is str and v in self.texts  # (what _EQUAL answers of each: a string equal to one)

    @classmethod
    def of(cls, parts: tuple[Check, ...]) -> "_AttrAmong | None":
        """The check of the disjunction of ``parts`` when each is ``ev.attr = 'text'`` of one attribute, else None."""
        if not all(type(p) is _AttrCompare and p.cmp is _EQUAL and type(p.lit) is str for p in parts) \
                or len({p.attr for p in parts}) != 1:  # type: ignore[attr-defined]
            return None
        return cls(parts[0].attr, tuple(p.lit for p in parts))  # type: ignore[attr-defined]


class EqualityKey(tuple):
    """The index key ``("eq", attr, value)`` of ``ev.attr = value`` (``yfpp.nfa.shared_nfa.index_key``) that is the
    equality's check too: called as one it answers what ``_AttrCompare(compare_fn("="), attr, value)`` does.  A
    component whose begin condition is that equality alone (the components of most subscriptions) keeps one object
    for its signature's key, its index key and its check, not two."""

    __slots__ = ()

    def __call__(self, ev: Event, vec: tuple) -> bool:
        return _EQUAL(ev.attrs.get(self[1], MISSING), self[2])

    def atom_key(self) -> tuple:
        """What it computes (:func:`atom_key`): itself, as the equality's :class:`_AttrCompare` writes it."""
        return self


def atom_key(check: Check) -> Hashable | None:
    """What ``check`` computes, when it reads nothing but the event being tested (an attribute of it against a
    constant, SASE+ or XPath): checks of equal keys give the same answer on every event, so one evaluation per
    event serves them all (``yfpp.nfa.shared_atoms``).  None for any other check (one that reads what a run has
    bound cannot be shared between runs; a general XPath test is not compared)."""
    key = getattr(type(check), "atom_key", None)
    return None if key is None else key(check)


def reads_event_only(check: Check) -> bool:
    """Does ``check`` read nothing but the event being tested (has it an :func:`atom_key`)?  Cheaper than the key."""
    return hasattr(type(check), "atom_key")


def equality_key_of(check: Check) -> tuple[type, tuple] | None:
    """For ``check`` the equality of the event's attribute with a constant (SASE+ ``ev.attr = constant``, XPath
    ``@attr = 'text'``): the class of its index key that answers as the check does (:class:`EqualityKey`,
    ``xpath_ext.xpath_predicates.AttributeEquality``) and that key's first two items (``("eq", attr)``,
    ``("xeq", attr)``); else None."""
    if type(check) is _AttrCompare:
        return (EqualityKey, ("eq", check.attr)) if check.cmp is _EQUAL else None
    keyed = getattr(type(check), "equality_key", None)
    return None if keyed is None else keyed(check)


def constant_of(check: Check, expr: Expr) -> Any:
    """The constant ``check`` (compiled from ``expr``) compares with, when :func:`rebound` can put another in its
    place: of a comparison of the event's attribute with a constant, SASE+ or XPath (``@a op 'text'``); else
    ``MISSING``."""
    if type(check) is _AttrCompare and isinstance(expr, Compare) and isinstance(expr.right, Literal):
        lit, value = check.lit, expr.right.value
        return lit if type(lit) is type(value) and lit == value else MISSING
    if isinstance(expr, XPathTest):
        from xpath_ext.xpath_predicates import attribute_text

        text = attribute_text(check)  # (None for any check but an @name op 'text' test)
        return MISSING if text is None else text
    return MISSING


def rebound(check: Check, constant: Any) -> Check:
    """``check`` remade to compare with ``constant`` in place of :func:`constant_of` it (not ``MISSING``)."""
    global _with_text
    if type(check) is _AttrCompare:
        return _AttrCompare(check.cmp, check.attr, constant)
    if _with_text is None:  # (imported once, at the first XPath check remade: not at each)
        from xpath_ext.xpath_predicates import with_text as _with_text
    return _with_text(check, constant)


_with_text: Callable[[Any, Any], Any] | None = None  # xpath_ext.xpath_predicates.with_text, once rebound needs it


class _Compiler:
    def __init__(self, place: Place, scope: Scope, xpath_compiler: Callable | None, list_each: bool = False):
        self.place = place
        self.scope = scope
        self.xpath_compiler = xpath_compiler
        self.list_each = list_each
        self.cells: dict[str, list] = {}  # quantified var -> one-element cell, while its comparison compiles

    # -- booleans
    def boolean(self, e: Expr) -> Check:
        if isinstance(e, And):
            return AllOf(tuple(self.boolean(x) for x in e.operands))
        if isinstance(e, Or):
            parts = tuple(self.boolean(x) for x in e.operands)
            return _AttrAmong.of(parts) or AnyOf(parts)
        if isinstance(e, Not):
            return NotOf(self.boolean(e.operand))
        qvars = [v for v in quantified_vars(e, self.place, self.scope) if v not in self.cells]
        if qvars and not self.list_each:
            return self._forall(e, qvars)
        if isinstance(e, Compare):
            return self._compare(e)
        if isinstance(e, XPathTest):
            return self._xpath(e)
        get = self.value(e)
        return lambda ev, vec: get(ev, vec) is True

    def _forall(self, e: Expr, qvars: list[str]) -> Check:
        """``e`` for every combination of the bound events of ``qvars``: each ``v.attr`` of them reads the
        event of the combination (a cell); ``v[1]``, ``v[v.len]`` still read the first and last event. The
        cells are this comparison's alone: another operand of an OR quantifies on its own."""
        cells = [self.cells.setdefault(v, [None]) for v in qvars]
        try:
            inner = self.boolean(e)
        finally:
            for v in qvars:
                del self.cells[v]
        slots = [self.scope.slot_of[v] for v in qvars]

        def check(ev, vec):
            for combo in product(*(list(vec[s].iter_events()) for s in slots)):
                for cell, x in zip(cells, combo):
                    cell[0] = x
                if not inner(ev, vec):
                    return False
            return True

        return check

    def _compare(self, e: Compare) -> Check:
        op, left, right = e.op, e.left, e.right
        cmp = compare_fn(op)
        if isinstance(right, Literal) and not isinstance(left, Literal):
            get, lit = self.value(left), right.value
            attr = getattr(get, "event_attr", None)
            if attr is not None:  # the event's attribute against a constant: the most common predicate of all
                return _AttrCompare(cmp, attr, lit)
            return compare_with(cmp, get, lit)
        gl, gr = self.value(left), self.value(right)
        return lambda ev, vec: cmp(gl(ev, vec), gr(ev, vec))

    def _xpath(self, e: XPathTest) -> Check:
        if self.xpath_compiler is None:
            from xpath_ext.xpath_predicates import compile_xpath_test

            self.xpath_compiler = compile_xpath_test
        test = self.xpath_compiler(e.source, e.namespaces)
        if e.var == self.place.current and self.place.mode == "event" and e.var not in self.cells:  # (its event)
            return test  # (a check as it is, ``test(event, vec)``: no wrapper)
        pick = self._event_of(e.var, Index.EACH)
        return lambda ev, vec: test(pick(ev, vec))

    # -- values
    def value(self, e: Expr) -> Getter:
        if isinstance(e, Literal):
            v = e.value
            return lambda ev, vec: v
        if isinstance(e, Ref):
            return self._ref(e)
        if isinstance(e, Length):
            slot = self.scope.slot_of[e.var]
            return lambda ev, vec: vec[slot].n
        if isinstance(e, Aggregate):
            return self._aggregate(e)
        if isinstance(e, Arith):
            op, gl, gr = e.op, self.value(e.left), self.value(e.right)
            return lambda ev, vec: arith(op, gl(ev, vec), gr(ev, vec))
        if isinstance(e, Neg):
            g = self.value(e.operand)

            def neg(ev, vec):
                v = g(ev, vec)
                return -v if is_number(v) else MISSING

            return neg
        check = self.boolean(e)
        return lambda ev, vec: check(ev, vec)

    def _ref(self, r: Ref) -> Getter:
        attr = r.attr
        if self.list_each and r.var in self.scope.kleene and r.index is Index.EACH:
            slot = self.scope.slot_of[r.var]
            return lambda ev, vec: [x.get(attr) for x in vec[slot].iter_events()]
        place = self.place
        quantified = r.index is Index.EACH and r.var in self.cells
        if r.var == place.current and place.mode != "bound" and not quantified and attr not in PSEUDO_ATTRS:
            if place.mode == "event" or r.index is Index.EACH:  # the hot case: the event being tested
                return _event_attr(attr)
            if r.index is Index.PREV:
                slot = self.scope.slot_of[r.var]
                return lambda ev, vec: vec[slot].last.attrs.get(attr, MISSING) if vec[slot] is not None else MISSING
        scope = self.scope
        if (r.var in scope.slot_of and r.var not in scope.kleene and not quantified and attr not in PSEUDO_ATTRS
                and (r.var != place.current or place.mode == "bound")):  # a bound single event's (Event.get, inline)
            slot = scope.slot_of[r.var]

            def bound(ev, vec):
                x = vec[slot]
                return MISSING if x is None else x.attrs.get(attr, MISSING)

            bound.slot_attr = (slot, attr)  # type: ignore[attr-defined]  # what it reads, for callers that inline it
            return bound
        if (r.var in scope.kleene and r.index in (Index.FIRST, Index.LAST) and r.var in scope.slot_of
                and (r.var != place.current or place.mode == "bound")):  # v[1], v[v.len] of a run bound before here
            return EndOfRunAttr(scope.slot_of[r.var], attr, r.index is Index.LAST)
        return AttrOfPicked(self._event_of(r.var, r.index), attr)

    def _event_of(self, var: str, index: Index) -> Callable[[Any, tuple], Event | None]:
        """A function giving the event ``var[index]`` denotes at this place."""
        place = self.place
        if index is Index.EACH and var in self.cells:
            cell = self.cells[var]
            return lambda ev, vec: cell[0]
        if var == place.current and place.mode != "bound":
            if place.mode == "event" or index is Index.EACH:
                return lambda ev, vec: ev
            slot = self.scope.slot_of[var]
            if index is Index.PREV:
                return lambda ev, vec: vec[slot].last if vec[slot] is not None else None
            if index is Index.FIRST:
                return FirstOrEvent(slot)
            raise PatternError(f"{var}[{var}.len] cannot be used while {var} is still taking events", var=var)
        if var not in self.scope.slot_of:
            raise PatternError(f"{var!r} is not bound where this predicate is checked", var=var)
        slot = self.scope.slot_of[var]
        if var not in self.scope.kleene:
            return lambda ev, vec: vec[slot]
        if index is Index.FIRST:
            return lambda ev, vec: vec[slot].first
        if index is Index.LAST:
            return lambda ev, vec: vec[slot].last
        raise PatternError(f"{var}[i-1] is only meaningful inside {var}'s own iterations", var=var)

    def _aggregate(self, a: Aggregate) -> Getter:
        slot = self.scope.slot_of[a.var]
        k = self.scope.agg_index(a.var, a.func, a.attr)
        func = a.func
        own_iter = self.place.mode == "iter" and self.place.current == a.var
        if a.upto_prev and not own_iter:
            raise PatternError(f"{a.func}({a.var}[..i-1].{a.attr}) is only meaningful inside {a.var}'s iterations", var=a.var)
        if not a.upto_prev and own_iter:
            raise PatternError(f"{a.func}({a.var}[..].{a.attr}) needs all of {a.var}: use it after {a.var}", var=a.var)

        def get(ev, vec):
            ks = vec[slot]
            return MISSING if ks is None else _agg_value(func, ks.aggs[k])

        return get
