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
and ``a`` existence — into a tree of small objects (``xpath_ext.xpath_fast_path``) that read the raw
attribute text (or each leaf child's text) from the element and compare exactly as elementpath does: they build the
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
from functools import lru_cache
from typing import Any, Callable

from elementpath import ElementPathError, XPath2Parser, XPathContext, XPathToken
from elementpath.datatypes import NumericProxy
from elementpath.exceptions import MissingContextError
from elementpath.helpers import get_double
from elementpath.tdop import Parser as TdopParser

from yfpp.errors import QuerySyntaxError
from yfpp.input.events import Event
from xpath_ext.xpath_fast_path import COMPARE, ERRORS, FLIPPED, Slow, attribute_name, boolean, child_elements, read_view

Namespaces = tuple[tuple[str, str], ...]
Test = Callable[[Event], bool]



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
    return test if test is not None else ElementpathTest(token, dict(namespaces))


def _fast_or_none(token: XPathToken, source: str, namespaces: Namespaces) -> Test | None:
    """The test of the parsed predicate ``token`` (of ``source``) without elementpath, but where the fast path
    cannot read an event; None when elementpath must evaluate it for every event."""
    attribute = _attribute_comparison(token)
    if attribute is not None:  # (reads no child: never needs elementpath)
        return AttributeTest(*attribute)
    fast = boolean(token)
    return None if fast is None else FastTest(fast, source, namespaces)


class TestTemplate:
    """A predicate whose literals vary (a query shape's, with stand-ins for its constants), parsed once: the test
    of the predicate with other literals is made without parsing it again (the fast path's objects and
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
    if tok.symbol not in COMPARE or len(tok) != 2:
        return None
    op, atok, ltok = COMPARE[tok.symbol], tok[0], tok[1]
    if atok.symbol in ("(string)", "(integer)") and ltok.symbol == "@":
        op, atok, ltok = FLIPPED[tok.symbol], ltok, atok
    if not (atok.symbol == "@" and ltok.symbol in ("(string)", "(integer)")):
        return None
    name = attribute_name(atok)
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
        raw = read_view(event).get(self.name)
        if raw is None:
            return False
        op, literal = self.op, self.literal
        try:
            return bool(op(get_double(raw, None), literal)) if self.numeric else bool(op(raw, literal))
        except ERRORS:
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
        raw = read_view(event).get(self[1])
        if raw is None:
            return False
        try:
            return bool(raw == self[2])
        except ERRORS:
            return False

    def atom_key(self) -> tuple:
        """What it computes (``yfpp.nfa.predicates.atom_key``): itself, as :meth:`AttributeTest.atom_key` writes it."""
        return self


def by_elementpath(source: str, namespaces: Namespaces = ()) -> bool:
    """Is the (valid) predicate ``[source]`` evaluated by elementpath for every event, not by the fast path?"""
    return boolean(parse_expression(source, namespaces)) is None


class FastTest:
    """A predicate's test by the fast path (``fast``: the tree ``xpath_fast_path.boolean`` made), elementpath
    deciding the events it cannot read: the test of ``source`` (valid), parsed at the first such event (a parsed
    token tree is most of what a predicate would hold; one object, not two: a million subscriptions' tests are
    objects the cyclic collector walks).  Like every test :func:`compile_xpath_test` makes, a check of the shared
    NFA as it is (``test(event, vec)``: the run's bindings, unread)."""

    __slots__ = ("fast", "source", "namespaces", "parsed")

    def __init__(self, fast: Any, source: str, namespaces: Namespaces) -> None:
        self.fast = fast
        self.source = source
        self.namespaces = namespaces
        self.parsed: ElementpathTest | None = None

    def __call__(self, event: Event, vec: tuple = ()) -> bool:
        try:
            return self.fast.holds(read_view(event))
        except ERRORS:
            return False
        except Slow:
            return self.slow(event)

    def slow(self, event: Event) -> bool:
        """The test by elementpath."""
        parsed = self.parsed
        if parsed is None:
            parsed = self.parsed = ElementpathTest(parse_expression(self.source, self.namespaces),
                                                   dict(self.namespaces))
        return parsed(event)


class ElementpathTest:
    """The predicate of the parsed ``token`` evaluated by elementpath on the event's element."""

    __slots__ = ("token", "namespaces")

    def __init__(self, token: XPathToken, namespaces: dict[str, str]) -> None:
        self.token = token
        self.namespaces = namespaces

    def __call__(self, event: Event, vec: tuple = ()) -> bool:
        token = self.token
        try:
            context = XPathContext(event.element, namespaces=self.namespaces, fragment=True)
            items = list(token.select(context))
            if len(items) == 1 and isinstance(items[0], NumericProxy):
                return bool(items[0] == context.position)
            return token.boolean_value(items)
        except ERRORS:
            return False


def index_keys(kind: str, name: str, event: Event) -> list[Any] | None:
    """What a hash index of XPath equalities looks ``event`` up by (``yfpp.nfa.shared_nfa``): for ``@name = 'text'``
    (``xeq``) the attribute's text, for ``@name = 12`` (``xnum``) that text cast as the comparison casts it
    (``get_double``; none when that fails: the predicate is false), for the child step ``name`` (``ceq``,
    ``cnum``) the same of each leaf child, or None when a child named so is not a leaf (the fast path leaves
    those to elementpath, and so does the index: every node of the table checks its predicate)."""
    el = read_view(event)
    if kind[0] == "x":
        text = el.get(name)
        texts = [] if text is None else [text]
    else:
        texts = []
        for c in child_elements(el, name):
            if len(c):
                return None
            texts.append(c.text or "")
    if kind[1:] == "eq":
        return list(dict.fromkeys(texts))  # (two children of one text: each node found once)
    numbers = set()
    for text in texts:
        try:
            numbers.add(get_double(text, None))
        except ERRORS:
            pass
    return list(numbers)
