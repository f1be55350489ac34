"""The fast path of XPath predicates (``xpath_ext.xpath_predicates``): a parsed predicate of the common forms made
into a tree of small slotted objects that read the raw attribute text (or each leaf child's text) of an event
and compare exactly as elementpath does — the same values (``UntypedAtomic`` for an attribute or a child, the
literal's own value), the same Python operators, conversions and evaluation order.

A node of the tree answers one method: a boolean node ``holds(el)``, a single-valued node ``read(el)`` (None:
the empty sequence), a sequence node ``items(el)``; ``el`` is what :func:`read_view` gives of the event.  Objects,
not closures: a subscription's predicate is one object a node, where a closure is a function, a tuple of cells
and a cell a variable, each an object Python's cyclic collector walks for as long as the subscription is held.
A child that is not a leaf raises :class:`Slow`: elementpath decides that event.
"""

from __future__ import annotations

import operator
from decimal import Decimal
from typing import Any, Callable

from elementpath import ElementPathError, XPathToken
from elementpath.datatypes import UntypedAtomic
from elementpath.helpers import get_double

from yfpp.input.events import Event
from yfpp.input.xml_element import AttributeView

#: Errors that make a predicate false: elementpath's and those of the Python
#: operations both paths share (decimal.InvalidOperation is an ArithmeticError; a KeyError is what
#: elementpath raises for a QName whose prefix has no namespace).
ERRORS = (ElementPathError, ArithmeticError, TypeError, ValueError, LookupError)

COMPARE = {"=": operator.eq, "!=": operator.ne, "<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge}
#: the operator of each comparison with its operands swapped (``3 < @a`` is ``@a > 3``)
FLIPPED = {"=": operator.eq, "!=": operator.ne, "<": operator.gt, "<=": operator.ge, ">": operator.lt, ">=": operator.le}
_SWAPPED = {COMPARE[symbol]: FLIPPED[symbol] for symbol in COMPARE}
_LITERALS = ("(integer)", "(decimal)", "(float)", "(string)")
Op = Callable[[Any, Any], Any]


class Slow(Exception):
    """A child element the fast path does not read (one with children, comments or entity references of its
    own): elementpath decides for that event."""


def read_view(event: Event) -> Any:
    """What the fast path and the indexes read attributes (``.get``) and leaf children of: the attribute texts
    of an XML event that keeps only those (it has no children), else its element, else (an event from JSON)
    an :class:`AttributeView` — no element is built for either."""
    el = event.texts
    if el is None:
        el = event._element
    return el if el is not None else AttributeView(event)


def child_elements(el: Any, name: str) -> Any:
    """The child elements named ``name`` of what the fast path reads: none for an XML event's attribute
    texts (a childless element), the built element's for an event that came from JSON."""
    if type(el) is dict:
        return ()
    if type(el) is AttributeView:
        el = el.event.element
    return el.iterchildren(name)


def attribute_name(tok: XPathToken) -> str | None:
    """``a`` for ``@a`` (no prefix, no wildcard), else None."""
    if len(tok) == 1 and tok[0].symbol == "(name)" and ":" not in tok[0].value:
        return str(tok[0].value)
    return None


def _child_name(tok: XPathToken) -> str | None:
    """``a`` for the child step ``a`` (no prefix, no wildcard, no default element namespace), else None."""
    if (tok.symbol == "(name)" and tok.label == "name" and not len(tok) and isinstance(tok.value, str)
            and ":" not in tok.value and not tok.parser.default_namespace):
        return tok.value
    return None


# --- booleans: token -> node with holds(el), or None (unsupported) ----


def boolean(tok: XPathToken) -> Any:
    """The node of a boolean-valued token (its effective boolean value), or None."""
    sym = tok.symbol
    if sym == "(" and len(tok) == 1:
        return boolean(tok[0])
    if sym == "@":
        name = attribute_name(tok)
        return None if name is None else _HasAttribute(name)
    child = _child_name(tok)
    if child is not None:  # a node sequence: true when not empty
        return _HasChild(child)
    if sym == "not" and tok.label == "function" and len(tok) == 1:
        arg = boolean(tok[0])
        return None if arg is None else _Not(arg)
    if sym in ("and", "or") and len(tok) == 2:
        left, right = boolean(tok[0]), boolean(tok[1])
        if left is None or right is None:
            return None
        return _And(left, right) if sym == "and" else _either(left, right)
    if sym in COMPARE and len(tok) == 2:
        return _comparison(COMPARE[sym], tok[0], tok[1])
    if sym in _STRING_TESTS and tok.label == "function" and len(tok) == 2 and tok[1].symbol == "(string)":
        return _string_test(_STRING_TESTS[sym], tok[0], tok[1].value)
    return None


class _HasAttribute:
    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def holds(self, el: Any) -> bool:
        return el.get(self.name) is not None


class _HasChild:
    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def holds(self, el: Any) -> bool:
        return next(iter(child_elements(el, self.name)), None) is not None


class _Not:
    __slots__ = ("arg",)

    def __init__(self, arg: Any) -> None:
        self.arg = arg

    def holds(self, el: Any) -> bool:
        return not self.arg.holds(el)


class _And:
    __slots__ = ("left", "right")

    def __init__(self, left: Any, right: Any) -> None:
        self.left = left
        self.right = right

    def holds(self, el: Any) -> bool:
        return self.left.holds(el) and self.right.holds(el)


class _Or(_And):
    __slots__ = ()

    def holds(self, el: Any) -> bool:
        return self.left.holds(el) or self.right.holds(el)


def _either(left: Any, right: Any) -> Any:
    """``left or right``: one :class:`_AttributeAmong` for ``@a = 'x' or @a = 'y' …`` (one object where an ``_Or``
    of comparisons is three: a subscription's objects are walked at every full collection), else an ``_Or``."""
    texts = _equal_texts(left), _equal_texts(right)
    if texts[0] is not None and texts[1] is not None and texts[0][0] == texts[1][0]:
        return _AttributeAmong(texts[0][0], texts[0][1] + texts[1][1])
    return _Or(left, right)


def _equal_texts(test: Any) -> tuple[str, tuple[str, ...]] | None:
    """``(name, texts)`` of ``@name = 'text'`` or of an :class:`_AttributeAmong`, else None."""
    if type(test) is _AttributeText and test.op is operator.eq:
        return test.name, (test.literal,)
    if type(test) is _AttributeAmong:
        return test.name, test.literals
    return None


class _AttributeAmong:
    """``@name = 'x' or @name = 'y' …``: the attribute's text equal to one of ``literals`` (tried in order)."""

    __slots__ = ("name", "literals")

    def __init__(self, name: str, literals: tuple[str, ...]) -> None:
        self.name = name
        self.literals = literals

    def holds(self, el: Any) -> bool:
        raw = el.get(self.name)
        if raw is None:
            return False
        for literal in self.literals:
            if raw == literal:
                return True
        return False


#: ``contains``, ``starts-with``, ``ends-with`` with the default (codepoint) collation: Python's own
_STRING_TESTS: dict[str, Callable[[str, str], bool]] = {
    "contains": operator.contains, "starts-with": str.startswith, "ends-with": str.endswith}


def _string_test(test: Callable[[str, str], bool], tok: XPathToken, literal: str) -> Any:
    """``contains(x, 'lit')`` and the like for an attribute or a child step ``x``, or None."""
    values = _values(tok) if tok.symbol == "@" or _child_name(tok) is not None else None
    return None if values is None else _StringTest(test, values, literal)


class _StringTest:
    """``test(x, literal)`` on the text of ``x`` (the empty sequence gives ``''``, more than one child is a type
    error, as elementpath's ``xs:string?`` argument)."""

    __slots__ = ("test", "values", "literal")

    def __init__(self, test: Callable[[str, str], bool], values: Any, literal: str) -> None:
        self.test = test
        self.values = values
        self.literal = literal

    def holds(self, el: Any) -> bool:
        items = self.values.items(el)
        if len(items) > 1:
            raise TypeError("a sequence of more than one item is not allowed as argument")
        return self.test(str(items[0]) if items else "", self.literal)


def _comparison(op: Op, ltok: XPathToken, rtok: XPathToken) -> Any:
    """A general comparison of two single values, as elementpath's
    ``iter_comparison_data`` does it: both sides evaluated, left first; an
    empty side → false; str with a number → type error (with a child step on
    a side, :class:`_SequenceComparison`)."""
    if _child_name(ltok) is not None or _child_name(rtok) is not None:
        left, right = _values(ltok), _values(rtok)
        return None if left is None or right is None else _SequenceComparison(op, left, right)
    if ltok.symbol in ("(string)", "(integer)") and rtok.symbol == "@":  # 3 < @a is @a > 3
        return _attribute_with_literal(_SWAPPED[op], rtok, ltok)
    if ltok.symbol == "@" and rtok.symbol in ("(string)", "(integer)"):
        return _attribute_with_literal(op, ltok, rtok)
    left, right = _value(ltok), _value(rtok)
    if left is None or right is None or (ltok.symbol in _LITERALS and rtok.symbol in _LITERALS):
        return None
    return _Comparison(op, left, right)


def _holds(op: Op, x: Any, y: Any) -> bool:
    """``op`` on one pair of values, with elementpath's type rules (str with a number → type error)."""
    if isinstance(x, str):
        if not isinstance(y, (str, UntypedAtomic)):
            raise TypeError(f"cannot compare {type(x)!r} and {type(y)!r}")
    elif isinstance(y, str) and not isinstance(x, UntypedAtomic):
        raise TypeError(f"cannot compare {type(x)!r} and {type(y)!r}")
    elif isinstance(x, float) and isinstance(y, Decimal):
        y = float(y)
    elif isinstance(x, Decimal) and isinstance(y, float):
        x = float(x)
    return bool(op(x, y))


class _Comparison:
    """Two single values compared (either empty: false)."""

    __slots__ = ("op", "left", "right")

    def __init__(self, op: Op, left: Any, right: Any) -> None:
        self.op = op
        self.left = left
        self.right = right

    def holds(self, el: Any) -> bool:
        x, y = self.left.read(el), self.right.read(el)
        if x is None or y is None:
            return False
        return _holds(self.op, x, y)


class _SequenceComparison(_Comparison):
    """A general comparison with a child step on either side (``reading > 30``): true when some pair of a
    left and a right value holds. As elementpath: both sides evaluated first, left then right; then the
    pairs in order (left outer), a pair that cannot be compared before one that holds → type error."""

    __slots__ = ()

    def holds(self, el: Any) -> bool:
        op, xs, ys = self.op, self.left.items(el), self.right.items(el)
        return any(_holds(op, x, y) for x in xs for y in ys)


def _attribute_with_literal(op: Op, atok: XPathToken, ltok: XPathToken) -> Any:
    """``@a op 'text'`` and ``@a op 12``, the commonest predicates, without the ``UntypedAtomic``: what its
    comparison does — the attribute's text compared with a string as it is, cast with ``get_double`` for an
    integer (a text that is no number: a value error)."""
    name = attribute_name(atok)
    if name is None:
        return None
    return (_AttributeText if ltok.symbol == "(string)" else _AttributeNumber)(op, name, ltok.value)


class _AttributeText:
    __slots__ = ("op", "name", "literal")

    def __init__(self, op: Op, name: str, literal: Any) -> None:
        self.op = op
        self.name = name
        self.literal = literal

    def holds(self, el: Any) -> bool:
        raw = el.get(self.name)
        return raw is not None and bool(self.op(raw, self.literal))


class _AttributeNumber(_AttributeText):
    __slots__ = ()

    def holds(self, el: Any) -> bool:
        raw = el.get(self.name)
        return raw is not None and bool(self.op(get_double(raw, None), self.literal))  # (no parser)


# --- values: token -> node with read(el) (one value) or items(el) (a sequence), or None ----


def _values(tok: XPathToken) -> Any:
    """The node of a token's sequence of values: the leaf children named by a child step (each its
    text as ``UntypedAtomic``), else the single value of :func:`_value` (none for the empty sequence)."""
    child = _child_name(tok)
    if child is not None:
        return _Children(child)
    value = _value(tok)
    return None if value is None else _Single(value)


class _Children:
    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def items(self, el: Any) -> list[Any]:
        out = []
        for c in child_elements(el, self.name):
            if len(c):  # (comments, processing instructions and entity references count too)
                raise Slow
            out.append(UntypedAtomic(c.text or ""))
        return out


class _Single:
    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value

    def items(self, el: Any) -> list[Any]:
        v = self.value.read(el)
        return [] if v is None else [v]


def _value(tok: XPathToken) -> Any:
    """The node of a single-valued token: ``UntypedAtomic`` for ``@a``, the
    literal's value, a float for arithmetic; None for the empty sequence."""
    sym = tok.symbol
    if sym == "(" and len(tok) == 1:
        return _value(tok[0])
    if sym in _LITERALS:
        return _Constant(tok.value)
    if sym == "@":
        name = attribute_name(tok)
        return None if name is None else _Attribute(name)
    if sym in ("+", "-", "*", "div") and len(tok) == 2:
        return _arithmetic(sym, tok[0], tok[1])
    return None


class _Constant:
    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value

    def read(self, el: Any) -> Any:
        return self.value


class _Attribute:
    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def read(self, el: Any) -> UntypedAtomic | None:
        raw = el.get(self.name)
        return None if raw is None else UntypedAtomic(raw)


def _arithmetic(sym: str, ltok: XPathToken, rtok: XPathToken) -> Any:
    """Binary arithmetic with an attribute or arithmetic operand (so the result
    is an xs:double), as elementpath's ``get_operands``, or None."""
    if ltok.symbol in _LITERALS and rtok.symbol in _LITERALS:
        return None  # integer/decimal arithmetic: elementpath
    if "(string)" in (ltok.symbol, rtok.symbol):
        return None
    left, right = _value(ltok), _value(rtok)
    if left is None or right is None:
        return None
    return _Arithmetic(sym, left, right, ltok.parser.xsd_version)


class _Arithmetic:
    """An empty left operand gives the empty sequence before the right one is evaluated; untyped operands are
    cast with the parser's xs:double rules."""

    __slots__ = ("sym", "left", "right", "xsd_version")

    def __init__(self, sym: str, left: Any, right: Any, xsd_version: str) -> None:
        self.sym = sym
        self.left = left
        self.right = right
        self.xsd_version = xsd_version

    def _number(self, v: Any) -> float:
        return get_double(v.value, self.xsd_version) if isinstance(v, UntypedAtomic) else float(v)

    def read(self, el: Any) -> float | None:
        x = self.left.read(el)
        if x is None:
            return None
        y = self.right.read(el)
        if y is None:
            return None
        a, b, sym = self._number(x), self._number(y), self.sym
        if sym == "+":
            return a + b
        if sym == "-":
            return a - b
        if sym == "*":
            return a * b
        return _divide(a, b)


def _divide(a: float, b: float) -> float:
    """xs:double ``div`` as elementpath computes it (a zero divisor included)."""
    if b != 0:
        return a / b
    if a == 0:
        return float("nan")
    negative = str(b).startswith("-")
    if a > 0:
        return float("-inf") if negative else float("inf")
    return float("inf") if negative else float("-inf")
