"""XPath 2.0 predicates on an event's element (docs/semantics.md §9), compiled once.

:func:`compile_xpath_test` parses the bracket text with elementpath and
returns ``event -> bool``, the predicate's truth on ``event.element`` (the
context item, position 1 of 1): a single number means ``position() = n``,
anything else its effective boolean value; a dynamic error (an attribute
that cannot be cast to a number, …) makes the predicate false.

The fast path turns the common forms — general comparisons ``= != < <= > >=``
between attributes (``@a``), child elements (``a``), literals and arithmetic
(``+ - * div``) on attributes, ``contains``/``starts-with``/``ends-with`` of an
attribute or a child with a string literal, ``and``/``or``/``not(…)``, ``@a``
and ``a`` existence — into closures that read the raw attribute text (or each leaf child's
text) from the element and compare exactly as elementpath does: they build the
same values (``UntypedAtomic`` for an attribute or a child, the literal's own
value) and apply the same Python operators, conversions and evaluation order; a
child that is not a leaf sends that event to elementpath.  The attribute text is read from
``event.element`` rather than the reader's typed ``event.attrs``: the typed
values lose what XPath sees (``@a = '07'`` on ``a="07"`` typed as 7;
"attributes" that came from child elements, which ``@a`` does not see).  Everything else is evaluated by
elementpath on the pre-parsed token.
"""

from __future__ import annotations

import operator
import threading
from decimal import Decimal
from functools import lru_cache
from typing import Any, Callable

from elementpath import ElementPathError, XPath2Parser, XPathContext, XPathToken
from elementpath.datatypes import NumericProxy, UntypedAtomic
from elementpath.exceptions import MissingContextError
from elementpath.helpers import get_double
from elementpath.tdop import Parser as TdopParser

from yfpp.errors import QuerySyntaxError
from yfpp.input.events import Event
from yfpp.input.xml_element import AttributeView

Namespaces = tuple[tuple[str, str], ...]
Test = Callable[[Event], bool]
_Fn = Callable[[Any], Any]  # element -> value (None: the empty sequence)

#: Errors that make a predicate false: elementpath's and those of the Python
#: operations both paths share (decimal.InvalidOperation is an ArithmeticError; a KeyError is what
#: elementpath raises for a QName whose prefix has no namespace).
_ERRORS = (ElementPathError, ArithmeticError, TypeError, ValueError, LookupError)

_COMPARE = {"=": operator.eq, "!=": operator.ne, "<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge}
_FLIPPED = {"=": operator.eq, "!=": operator.ne, "<": operator.gt, "<=": operator.ge, ">": operator.lt, ">=": operator.le}
_LITERALS = ("(integer)", "(decimal)", "(float)", "(string)")


#: XPath 2.0 an event predicate refuses, as its cost has no bound in the event's size: loops over
#: sequences of any length, and replace() (its result can be the text times the replacement)
UNBOUNDED = {"for": "a for expression", "some": "a some expression", "every": "an every expression",
             "replace": "replace()"}
#: what a pattern of matches() and tokenize() must not hold: with no quantifier, group or alternative
#: a regular expression cannot backtrack over text as long as a record
REGEX_FUNCTIONS, BACKTRACKING = ("matches", "tokenize"), frozenset("*+?{}()|")
MAX_RANGE = 10_000  #: items of a range ``m to n`` (integer literals only)
#: functions whose last argument, at this arity, is a collation: refused (only the default codepoint
#: collation applies; another one makes elementpath set the process's locale, and where that locale is
#: missing it raises and leaves its collation lock held, stalling every later use)
COLLATION_ARITY = {"compare": 3, "contains": 3, "starts-with": 3, "ends-with": 3, "substring-before": 3,
                   "substring-after": 3, "index-of": 3, "distinct-values": 2, "deep-equal": 3, "max": 2, "min": 2}
#: what can give many items, as many as the record has characters or elements (or a range has): two of
#: them compared, or one filtered by a predicate holding another, cost the product of their lengths
MANY_FUNCTIONS = frozenset({"tokenize", "string-to-codepoints", "reverse", "subsequence", "remove", "insert-before",
                            "index-of", "data", "unordered", "distinct-values"})
MANY_OPERATORS = frozenset({"to", ",", "/", "//", "|", "union", "intersect", "except", "(name)"})


def parse_expression(source: str, namespaces: Namespaces = ()) -> XPathToken:
    """Parse XPath 2.0 text; raises :class:`elementpath.ElementPathError` (also for a Python error
    elementpath lets out of its static evaluation, and for what :func:`check_bounded` refuses)."""
    parser = XPath2Parser(namespaces=dict(namespaces))
    try:
        # XPath2Parser.parse, with check_bounded between building the tree and its static evaluation
        if parser.tokenizer is None:
            parser.tokenizer = parser.create_tokenizer(parser.symbol_table)
        root = TdopParser.parse(parser, source)
        check_bounded(root)
        if root.label in ("sequence type", "function test"):
            raise root.error("XPST0003", "not allowed in XPath expression")
        try:
            root.evaluate()  # the constant parts, and static errors
        except MissingContextError:
            pass
        return root
    except ElementPathError:
        raise
    except Exception as err:  # (a Python error elementpath lets out: no query may end in a traceback)
        raise ElementPathError(f"a constant part cannot be evaluated: {err!r}") from None


def check_bounded(token: XPathToken) -> None:
    """Refuse what :data:`UNBOUNDED` names, a pattern that could backtrack, a range that is not two integer
    literals at most :data:`MAX_RANGE` apart, a product of two sequences (:func:`_product`), a
    ``string-join`` separator that is not a literal, ``distinct-values``, a collation argument and a variable:
    an event predicate's cost stays within a multiple of the event's size."""
    stack = [token]
    while stack:
        tok = stack.pop()
        what = UNBOUNDED.get(tok.symbol) if tok.label in ("expression", "function") else None
        if what is not None:
            raise tok.error("XPST0003", f"{what} is not allowed in an event predicate: its cost has no bound "
                                        "(docs/semantics.md §9)")
        if tok.symbol == "$":
            raise tok.error("XPST0008", "an event predicate has no variables")
        if tok.label == "function":
            _check_function(tok)
        elif _product(tok):
            raise tok.error("XPST0003", "an event predicate may not compare two sequences, filter a sequence by "
                                        "another or step from one into another: the cost is the product of their "
                                        "lengths (docs/semantics.md §9)")
        if tok.symbol in REGEX_FUNCTIONS and tok.label == "function" and len(tok) > 1 and not (
                tok[1].symbol == "(string)" and BACKTRACKING.isdisjoint(tok[1].value)):
            raise tok.error("XPST0003", f"{tok.symbol}() takes a literal pattern without quantifiers, groups or "
                                        "alternatives in an event predicate: its cost has no bound otherwise "
                                        "(docs/semantics.md §9)")
        if tok.symbol == "to" and tok.label == "operator":
            low, high = (_integer_literal(t) for t in tok)
            if low is None or high is None or high - low >= MAX_RANGE:
                raise tok.error("XPST0003", f"a range in an event predicate is two integer literals at most "
                                            f"{MAX_RANGE:,} apart")
        stack.extend(tok)


def _check_function(tok: XPathToken) -> None:
    """The per-function rules of :func:`check_bounded`."""
    arity = COLLATION_ARITY.get(tok.symbol)
    if arity is not None and len(tok) >= arity:
        raise tok.error("XPST0003", f"{tok.symbol}() takes no collation argument in an event predicate: the "
                                    "default (codepoint) collation applies")
    if tok.symbol == "distinct-values":
        raise tok.error("XPST0003", "distinct-values() is not allowed in an event predicate: its cost is the "
                                    "square of its sequence's length")
    if tok.symbol == "string-join" and len(tok) == 2 and tok[1].symbol != "(string)":
        raise tok.error("XPST0003", "string-join() takes a literal separator in an event predicate: another "
                                    "could make the result the text times itself")


def _product(tok: XPathToken) -> bool:
    """Whether ``tok`` combines two operands that may each be many items: a general comparison, or a filter
    ``E[P]`` whose predicate makes a sequence not tied to the item it filters.  (Steps within the record
    cost at most its size times its nesting cap: they are not products.)"""
    if tok.symbol in ("=", "!=", "<", "<=", ">", ">=") and len(tok) == 2:
        return _many(tok[0]) and _many(tok[1])
    if tok.symbol == "[" and len(tok) == 2:
        return _many(tok[0]) and _makes_a_sequence(tok[1])
    return False


def _many(tok: XPathToken) -> bool:
    """Whether ``tok``'s value may be more than one item (conservatively)."""
    if tok.label == "function":
        return tok.symbol in MANY_FUNCTIONS
    if tok.symbol == "@":
        return len(tok) == 1 and tok[0].symbol == "*"
    if tok.symbol in MANY_OPERATORS or tok.label == "axis":
        return True
    if tok.symbol == "*":
        return len(tok) == 0  # the wildcard step, not the product
    if tok.symbol in ("(", "[") and len(tok) >= 1:
        return _many(tok[0])
    if tok.symbol == "if" and len(tok) == 3:
        return _many(tok[1]) or _many(tok[2])
    return False


def _makes_a_sequence(tok: XPathToken) -> bool:
    """Whether a sequence of values, or a path from the document's root, is made anywhere inside ``tok``:
    evaluated for each item of an outer sequence, its length multiplies."""
    stack = [tok]
    while stack:
        t = stack.pop()
        if (t.label == "function" and t.symbol in MANY_FUNCTIONS) or t.symbol in ("to", ",") \
                or (t.symbol in ("/", "//") and len(t) == 1):
            return True
        if t.symbol != "@":
            stack.extend(t)
    return False


def _integer_literal(tok: XPathToken) -> int | None:
    """The value of ``5`` or ``-5``, else None."""
    if tok.symbol == "-" and len(tok) == 1:
        value = _integer_literal(tok[0])
        return None if value is None else -value
    return tok.value if tok.symbol == "(integer)" else None


def error_location(err: ElementPathError) -> tuple[str, int, int]:
    """``(message, line, column)`` of an elementpath error, 1-based."""
    line, column = err.token.position if err.token is not None else (1, 1)
    return err.message, line, column


@lru_cache(maxsize=4096)
def compile_xpath_test(source: str, namespaces: Namespaces = ()) -> Test:
    """``event -> bool`` for the predicate ``[source]``; bad XPath → QuerySyntaxError."""
    try:
        token = parse_expression(source, namespaces)
    except ElementPathError as err:
        message, line, column = error_location(err)
        raise QuerySyntaxError(f"invalid XPath predicate: {message}", source, line, column) from None
    test = _fast_or_none(token, source, namespaces)
    return test if test is not None else _elementpath_test(token, dict(namespaces))


def _fast_or_none(token: XPathToken, source: str, namespaces: Namespaces) -> Test | None:
    """The test of the parsed predicate ``token`` (of ``source``) without elementpath, but where the fast path
    cannot read an event; None when elementpath must evaluate it for every event."""
    attribute = _attribute_comparison(token)
    if attribute is not None:  # (reads no child: never needs elementpath)
        return AttributeTest(*attribute)
    fast = _boolean(token)
    return None if fast is None else _fast_test(fast, _parsed_when_needed(source, namespaces))


class TestTemplate:
    """A predicate whose literals vary (a query shape's, with stand-ins for its constants), parsed once: the test
    of the predicate with other literals is made without parsing it again (the fast path's closures and
    :class:`AttributeTest` read each literal once, when made)."""

    __slots__ = ("lock", "namespaces", "slots", "token")

    def __init__(self, source: str, namespaces: Namespaces, stand_ins: dict[Any, Any]) -> None:
        """``stand_ins``: the value of each literal that stands for a constant (a string's text, an integer) and
        the key its constant has in :meth:`test`'s ``values``."""
        self.token = parse_expression(source, namespaces)
        self.namespaces = namespaces
        self.lock = threading.Lock()  # (its literals are set while a test is made: one at a time)
        self.slots: list[tuple[XPathToken, Any]] = []  # (literal token, its constant's key)
        stack = [self.token]
        while stack:
            tok = stack.pop()
            stack.extend(tok)
            if tok.symbol in ("(string)", "(integer)") and tok.value in stand_ins:
                self.slots.append((tok, stand_ins[tok.value]))

    def test(self, values: dict[Any, str], source: str) -> Test:
        """What ``compile_xpath_test(source)`` gives, ``source`` being the predicate with the constants ``values``
        (by key; a string's text, an integer's digits) in place of the stand-ins."""
        literals = []
        for tok, key in self.slots:
            value = values[key]
            if tok.symbol == "(integer)" and value.isascii() and value.isdigit():
                value = int(value)
            elif tok.symbol == "(integer)" or "'" in value or '"' in value:  # (a quote is doubled in the text)
                return compile_xpath_test(source, self.namespaces)
            literals.append(value)
        with self.lock:
            kept = [tok.value for tok, _ in self.slots]
            try:
                for (tok, _), value in zip(self.slots, literals):
                    tok.value = value
                made = _fast_or_none(self.token, source, self.namespaces)
            finally:
                for (tok, _), value in zip(self.slots, kept):
                    tok.value = value
        return made if made is not None else compile_xpath_test(source, self.namespaces)


def attribute_text(test: Test) -> str | None:
    """The text literal of a test :func:`compile_xpath_test` made of ``@name op 'text'``, else None."""
    if type(test) is AttributeTest and not test.numeric and type(test.literal) is str:
        return test.literal
    return None


def with_text(test: Test, text: str) -> Test:
    """The test of ``@name op 'text'`` made from that of the same comparison with another text
    (:func:`attribute_text` of ``test`` is not None): what :func:`compile_xpath_test` gives, without parsing."""
    return AttributeTest(test.op, test.name, text, test.numeric)  # type: ignore[attr-defined]


def _attribute_comparison(tok: XPathToken) -> tuple[Callable[[Any, Any], Any], str, Any, bool] | None:
    """``(op, name, literal, numeric)`` of ``@name op 'text'`` / ``@name op 12`` (or the literal first), else None:
    the commonest predicate of subscriptions, one small object each (see :func:`_attribute_with_literal`)."""
    while tok.symbol == "(" and len(tok) == 1:
        tok = tok[0]
    if tok.symbol not in _COMPARE or len(tok) != 2:
        return None
    op, atok, ltok = _COMPARE[tok.symbol], tok[0], tok[1]
    if atok.symbol in ("(string)", "(integer)") and ltok.symbol == "@":
        op, atok, ltok = _FLIPPED[tok.symbol], ltok, atok
    if not (atok.symbol == "@" and ltok.symbol in ("(string)", "(integer)")):
        return None
    name = _attribute_name(atok)
    return None if name is None else (op, name, ltok.value, ltok.symbol == "(integer)")


class AttributeTest:
    """The test of ``@name op literal`` (:func:`_attribute_comparison`), on an event; a value error (a text that is
    no number) is false.  One slotted object: a quarter of the memory of a ``partial`` (with its arguments and
    keywords), which a million subscriptions pay a million times.  It is a check of the shared NFA as it is
    (``test(event, vec)``: the tuple of the run's bindings, unread), not wrapped in another object."""

    __slots__ = ("op", "name", "literal", "numeric")

    def __init__(self, op: Callable[[Any, Any], Any], name: str, literal: Any, numeric: bool) -> None:
        self.op = op
        self.name = name
        self.literal = literal
        self.numeric = numeric

    def __call__(self, event: Event, vec: tuple = ()) -> bool:
        raw = _read_view(event).get(self.name)
        if raw is None:
            return False
        op, literal = self.op, self.literal
        try:
            return bool(op(get_double(raw, None), literal)) if self.numeric else bool(op(raw, literal))
        except _ERRORS:
            return False

    def atom_key(self) -> tuple:
        """What it computes: it reads nothing but the event (``yfpp.nfa.predicates.atom_key``); ``@a = 'text'`` as
        its index key is written (``("xeq", name, text)``)."""
        literal = self.literal
        if self.op is operator.eq and not self.numeric and type(literal) is str:
            return ("xeq", self.name, literal)
        return ("@", self.op, self.name, type(literal), literal, self.numeric)

    def equality_key(self) -> tuple[type, tuple] | None:
        """For ``@name = 'text'``: the class of its index key that answers as this test does
        (:class:`AttributeEquality`) and that key's first two items, ``("xeq", name)``; else None
        (``yfpp.nfa.predicates.equality_key_of``)."""
        if self.op is operator.eq and not self.numeric and type(self.literal) is str:
            return AttributeEquality, ("xeq", self.name)
        return None


class AttributeEquality(tuple):
    """The index key ``("xeq", name, text)`` of ``@name = 'text'`` that is the predicate's test too: called, it
    answers what ``AttributeTest(operator.eq, name, text, False)`` does.  A component whose begin condition is that
    test alone (each step of most XPath subscriptions) keeps one object for its signature's key, its index key, its
    shared-atom key and its check, not three."""

    __slots__ = ()

    def __call__(self, event: Event, vec: tuple = ()) -> bool:
        raw = _read_view(event).get(self[1])
        if raw is None:
            return False
        try:
            return bool(raw == self[2])
        except _ERRORS:
            return False

    def atom_key(self) -> tuple:
        """What it computes (``yfpp.nfa.predicates.atom_key``): itself, as :meth:`AttributeTest.atom_key` writes it."""
        return self


def _parsed_when_needed(source: str, namespaces: Namespaces) -> Test:
    """The elementpath test of ``source`` (valid), parsed at its first call: behind the fast path it decides only
    the events the fast path cannot read, and a parsed token tree is most of what a predicate would hold."""
    made: list[Test] = []

    def test(event: Event) -> bool:
        if not made:
            made.append(_elementpath_test(parse_expression(source, namespaces), dict(namespaces)))
        return made[0](event)

    return test


def by_elementpath(source: str, namespaces: Namespaces = ()) -> bool:
    """Is the (valid) predicate ``[source]`` evaluated by elementpath for every event, not by the fast path?"""
    return _boolean(parse_expression(source, namespaces)) is None


def _fast_test(fast: Callable[[Any], bool], slow: Test) -> Test:
    def test(event: Event) -> bool:
        try:
            return fast(_read_view(event))
        except _ERRORS:
            return False
        except _Slow:
            return slow(event)

    return test


def _read_view(event: Event) -> Any:
    """What the fast path and the indexes read attributes (``.get``) and leaf children of: the attribute texts
    of an XML event that keeps only those (it has no children), else its element, else (an event from JSON)
    an :class:`AttributeView` — no element is built for either."""
    el = event.texts
    if el is None:
        el = event._element
    return el if el is not None else AttributeView(event)


def _elementpath_test(token: XPathToken, namespaces: dict[str, str]) -> Test:
    def test(event: Event) -> bool:
        try:
            context = XPathContext(event.element, namespaces=namespaces, fragment=True)
            items = list(token.select(context))
            if len(items) == 1 and isinstance(items[0], NumericProxy):
                return bool(items[0] == context.position)
            return token.boolean_value(items)
        except _ERRORS:
            return False

    return test


# --- fast path: token -> closure over the element, or None (unsupported) ----


class _Slow(Exception):
    """A child element the fast path does not read (one with children, comments or entity references of its
    own): elementpath decides for that event."""


def _boolean(tok: XPathToken) -> Callable[[Any], bool] | None:
    """A closure for a boolean-valued token (its effective boolean value)."""
    sym = tok.symbol
    if sym == "(" and len(tok) == 1:
        return _boolean(tok[0])
    if sym == "@":
        name = _attribute_name(tok)
        return None if name is None else (lambda el: el.get(name) is not None)
    child = _child_name(tok)
    if child is not None:  # a node sequence: true when not empty
        return lambda el: next(iter(_child_elements(el, child)), None) is not None
    if sym == "not" and tok.label == "function" and len(tok) == 1:
        arg = _boolean(tok[0])
        return None if arg is None else (lambda el: not arg(el))
    if sym in ("and", "or") and len(tok) == 2:
        left, right = _boolean(tok[0]), _boolean(tok[1])
        if left is None or right is None:
            return None
        if sym == "and":
            return lambda el: left(el) and right(el)
        return lambda el: left(el) or right(el)
    if sym in _COMPARE and len(tok) == 2:
        return _comparison(_COMPARE[sym], tok[0], tok[1])
    if sym in _STRING_TESTS and tok.label == "function" and len(tok) == 2 and tok[1].symbol == "(string)":
        return _string_test(_STRING_TESTS[sym], tok[0], tok[1].value)
    return None


#: ``contains``, ``starts-with``, ``ends-with`` with the default (codepoint) collation: Python's own
_STRING_TESTS: dict[str, Callable[[str, str], bool]] = {
    "contains": operator.contains, "starts-with": str.startswith, "ends-with": str.endswith}


def _string_test(test: Callable[[str, str], bool], tok: XPathToken, literal: str) -> Callable[[Any], bool] | None:
    """``contains(x, 'lit')`` and the like for an attribute or a child step ``x``: its text (the empty sequence
    gives ``''``, more than one child is a type error, as elementpath's ``xs:string?`` argument)."""
    values = _values(tok) if tok.symbol == "@" or _child_name(tok) is not None else None
    if values is None:
        return None

    def string_test(el: Any) -> bool:
        items = values(el)
        if len(items) > 1:
            raise TypeError("a sequence of more than one item is not allowed as argument")
        return test(str(items[0]) if items else "", literal)

    return string_test


def _comparison(op: Callable[[Any, Any], Any], ltok: XPathToken, rtok: XPathToken) -> Callable[[Any], bool] | None:
    """A general comparison of two single values, as elementpath's
    ``iter_comparison_data`` does it: both sides evaluated, left first; an
    empty side → false; str with a number → type error (with a child step on
    a side, :func:`_sequence_comparison`)."""
    if _child_name(ltok) is not None or _child_name(rtok) is not None:
        return _sequence_comparison(op, ltok, rtok)
    if ltok.symbol in ("(string)", "(integer)") and rtok.symbol == "@":  # 3 < @a is @a > 3
        return _attribute_with_literal(lambda x, y: op(y, x), rtok, ltok)
    if ltok.symbol == "@" and rtok.symbol in ("(string)", "(integer)"):
        return _attribute_with_literal(op, ltok, rtok)
    left, right = _value(ltok), _value(rtok)
    if left is None or right is None or (ltok.symbol in _LITERALS and rtok.symbol in _LITERALS):
        return None

    def compare(el: Any) -> bool:
        x, y = left(el), right(el)
        if x is None or y is None:
            return False
        return _holds(op, x, y)

    return compare


def _attribute_with_literal(op: Callable[[Any, Any], Any], atok: XPathToken,
                            ltok: XPathToken) -> Callable[[Any], bool] | None:
    """``@a op 'text'`` and ``@a op 12``, the commonest predicates, without the ``UntypedAtomic``: what its
    comparison does — the attribute's text compared with a string as it is, cast with ``get_double`` for an
    integer (a text that is no number: a value error)."""
    name = _attribute_name(atok)
    if name is None:
        return None
    literal = ltok.value
    if ltok.symbol == "(string)":
        return lambda el: (raw := el.get(name)) is not None and bool(op(raw, literal))
    return lambda el: (raw := el.get(name)) is not None and bool(op(get_double(raw, None), literal))  # (no parser)


def index_keys(kind: str, name: str, event: Event) -> list[Any] | None:
    """What a hash index of XPath equalities looks ``event`` up by (``yfpp.nfa.shared_nfa``): for ``@name = 'text'``
    (``xeq``) the attribute's text, for ``@name = 12`` (``xnum``) that text cast as the comparison casts it
    (``get_double``; none when that fails: the predicate is false), for the child step ``name`` (``ceq``,
    ``cnum``) the same of each leaf child, or None when a child named so is not a leaf (the fast path leaves
    those to elementpath, and so does the index: every node of the table checks its predicate)."""
    el = _read_view(event)
    if kind[0] == "x":
        text = el.get(name)
        texts = [] if text is None else [text]
    else:
        texts = []
        for c in _child_elements(el, name):
            if len(c):
                return None
            texts.append(c.text or "")
    if kind[1:] == "eq":
        return list(dict.fromkeys(texts))  # (two children of one text: each node found once)
    numbers = set()
    for text in texts:
        try:
            numbers.add(get_double(text, None))
        except _ERRORS:
            pass
    return list(numbers)


def _holds(op: Callable[[Any, Any], Any], x: Any, y: Any) -> bool:
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


def _sequence_comparison(op: Callable[[Any, Any], Any], ltok: XPathToken,
                         rtok: XPathToken) -> Callable[[Any], bool] | None:
    """A general comparison with a child step on either side (``reading > 30``): true when some pair of a
    left and a right value holds. As elementpath: both sides evaluated first, left then right; then the
    pairs in order (left outer), a pair that cannot be compared before one that holds → type error."""
    left, right = _values(ltok), _values(rtok)
    if left is None or right is None:
        return None

    def compare(el: Any) -> bool:
        xs, ys = left(el), right(el)
        return any(_holds(op, x, y) for x in xs for y in ys)

    return compare


def _values(tok: XPathToken) -> Callable[[Any], list[Any]] | None:
    """A closure for a token's sequence of values: the leaf children named by a child step (each its
    text as ``UntypedAtomic``), else the single value of :func:`_value` (none for the empty sequence)."""
    child = _child_name(tok)
    if child is not None:

        def children(el: Any) -> list[Any]:
            out = []
            for c in _child_elements(el, child):
                if len(c):  # (comments, processing instructions and entity references count too)
                    raise _Slow
                out.append(UntypedAtomic(c.text or ""))
            return out

        return children
    value = _value(tok)
    if value is None:
        return None

    def single(el: Any) -> list[Any]:
        v = value(el)
        return [] if v is None else [v]

    return single


def _child_elements(el: Any, name: str) -> Any:
    """The child elements named ``name`` of what the fast path reads: none for an XML event's attribute
    texts (a childless element), the built element's for an event that came from JSON."""
    if type(el) is dict:
        return ()
    if type(el) is AttributeView:
        el = el.event.element
    return el.iterchildren(name)


def _child_name(tok: XPathToken) -> str | None:
    """``a`` for the child step ``a`` (no prefix, no wildcard, no default element namespace), else None."""
    if (tok.symbol == "(name)" and tok.label == "name" and not len(tok) and isinstance(tok.value, str)
            and ":" not in tok.value and not tok.parser.default_namespace):
        return tok.value
    return None


def _value(tok: XPathToken) -> _Fn | None:
    """A closure for a single-valued token: ``UntypedAtomic`` for ``@a``, the
    literal's value, a float for arithmetic; None for the empty sequence."""
    sym = tok.symbol
    if sym == "(" and len(tok) == 1:
        return _value(tok[0])
    if sym in _LITERALS:
        value = tok.value
        return lambda el: value
    if sym == "@":
        name = _attribute_name(tok)
        if name is None:
            return None

        def attribute(el: Any) -> UntypedAtomic | None:
            raw = el.get(name)
            return None if raw is None else UntypedAtomic(raw)

        return attribute
    if sym in ("+", "-", "*", "div") and len(tok) == 2:
        return _arithmetic(sym, tok[0], tok[1])
    return None


def _arithmetic(sym: str, ltok: XPathToken, rtok: XPathToken) -> _Fn | None:
    """Binary arithmetic with an attribute or arithmetic operand (so the result
    is an xs:double), as elementpath's ``get_operands``: an empty left operand
    gives the empty sequence before the right one is evaluated; untyped
    operands are cast with the parser's xs:double rules."""
    if ltok.symbol in _LITERALS and rtok.symbol in _LITERALS:
        return None  # integer/decimal arithmetic: elementpath
    if "(string)" in (ltok.symbol, rtok.symbol):
        return None
    left, right = _value(ltok), _value(rtok)
    if left is None or right is None:
        return None
    xsd_version = ltok.parser.xsd_version

    def number(v: Any) -> float:
        return get_double(v.value, xsd_version) if isinstance(v, UntypedAtomic) else float(v)

    def arithmetic(el: Any) -> float | None:
        x = left(el)
        if x is None:
            return None
        y = right(el)
        if y is None:
            return None
        a, b = number(x), number(y)
        if sym == "+":
            return a + b
        if sym == "-":
            return a - b
        if sym == "*":
            return a * b
        return _divide(a, b)

    return arithmetic


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


def _attribute_name(tok: XPathToken) -> str | None:
    """``a`` for ``@a`` (no prefix, no wildcard), else None."""
    if len(tok) == 1 and tok[0].symbol == "(name)" and ":" not in tok[0].value:
        return str(tok[0].value)
    return None
