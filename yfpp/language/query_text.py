"""Query text and query files: which language, which name, where an error is.

Query file format (documented in the README, "Query files"):

* lines starting with ``#`` are comments;
* a line ``@query NAME`` starts a named query, which runs to the next
  ``@query`` line; text before the first ``@query`` line must be empty;
* a file with no ``@query`` line holds one bare query named after the file;
* names are unique: within a file and across all ``-q`` arguments (inline
  queries are named ``q``, ``q2``, ``q3``, … in order);
* an error in a query is reported with the file name and the line of the file.

Language: extension ``.sase`` is SASE+, ``.xpe`` extended XPath; otherwise
the text decides — SASE+ starts with a word (``PATTERN``; a misspelt keyword
gets a SASE+ hint), or with ``/* comments */`` and then ``PATTERN``; extended
XPath starts with ``/``, ``[`` or ``<``.
"""

from __future__ import annotations

import difflib
import re
import threading
from contextlib import contextmanager
from dataclasses import dataclass, fields, is_dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

from yfpp.errors import QueryError, QuerySyntaxError, YfppError
from yfpp.language.pattern import Literal, Pattern, XPathTest, rebuilt
from yfpp.language.query_limits import MAX_QUERY_CHARS, check_text

_QUERY_LINE = re.compile(r"@query\s+([A-Za-z_][\w.\-]*)\s*$")
_SPACE = re.compile(r"\s*")
_WORD = re.compile(r"[A-Za-z_]\w*")
_SUFFIX_LANGUAGE = {".sase": "sase", ".xpe": "xpath", ".q": None, ".query": None}


def detect_language(text: str) -> str:
    """``"sase"`` or ``"xpath"``, in time linear in the text.

    Text that starts with a word is SASE+.  After a leading ``/*``, which may
    also begin an XPath path (``/*//a``), SASE+ needs the comments to close and
    ``PATTERN`` (or a near miss, for the hint) to follow.
    """
    i = _SPACE.match(text).end()  # type: ignore[union-attr]
    if not text.startswith("/*", i):
        return "sase" if i < len(text) and (text[i].isalpha() or text[i] == "_") else "xpath"
    while text.startswith("/*", i):
        end = text.find("*/", i + 2)
        if end < 0:
            return "xpath"
        i = _SPACE.match(text, end + 2).end()  # type: ignore[union-attr]
    word = _WORD.match(text, i)
    return "sase" if word and difflib.get_close_matches(word.group().upper(), ["PATTERN"], cutoff=0.8) else "xpath"


def parse_query(text: str, language: str | None = None, ts_unit: str = "s") -> Pattern:
    """Parse query text in either language into a validated Pattern; a window written without a unit is in
    ``ts_unit`` (the feed's ``--ts-unit``)."""
    if not text.strip():
        raise QuerySyntaxError("empty query", text, 1, 1)
    language = language or detect_language(text)
    if language == "sase":
        from yfpp.language.sase_parser import parse_sase

        return parse_sase(text, ts_unit)
    from xpath_ext.parser import parse_xpath

    return parse_xpath(text, ts_unit)


@dataclass(frozen=True)
class QuerySource:
    """One query as written: its name, text and language, and where (``origin`` file, ``first_line`` of it)."""

    name: str
    text: str
    language: str | None = None
    origin: str | None = None
    first_line: int = 1

    @property
    def where(self) -> str:
        return f"{self.origin}, line {self.first_line}" if self.origin else f"-q {self.text[:40]!r}"

    @contextmanager
    def blame(self) -> Iterator[None]:
        """Errors raised inside are this query's: they name it, and a position is a line of its file."""
        context = f"query {self.name!r}" + (f" in {self.origin}" if self.origin else "")
        try:
            yield
        except QueryError as err:
            raise err.relocated(context, self.first_line) from None
        except YfppError as err:
            raise YfppError(f"{context}: {err}") from None

    def parse(self, ts_unit: str = "s") -> Pattern:
        with self.blame():
            return parse_query(self.text, self.language, ts_unit)


def read_query_file(text: str, default_name: str, origin: str | None = None, language: str | None = None) -> list[QuerySource]:
    """The queries of a query file's text (see the module docstring for the format)."""
    blocks: list[tuple[str, int, list[str]]] = []  # (name, line of '@query', lines)
    named: dict[str, int] = {}  # each name's line of '@query' (a walk over the blocks made 100,000 queries minutes)
    loose: list[str] = []
    first_loose = 0
    where = f"{origin}, " if origin else ""
    for lineno, line in enumerate(text.split("\n"), 1):
        stripped = line.strip()
        if stripped.startswith("@query"):
            m = _QUERY_LINE.match(stripped)
            if not m:
                raise YfppError(f"{where}line {lineno}: expected '@query NAME', got {stripped[:80]!r}")
            name = m.group(1)
            if name in named:
                raise YfppError(f"{where}line {lineno}: query name {name!r} is used twice (first at line {named[name]})")
            named[name] = lineno
            blocks.append((name, lineno, []))
        elif blocks:
            blocks[-1][2].append("" if stripped.startswith("#") else line)
        elif stripped and not stripped.startswith("#"):
            first_loose = first_loose or lineno
            loose.append(line)
        else:
            loose.append("")
    if blocks and first_loose:
        raise YfppError(f"{where}line {first_loose}: query text before the first '@query NAME' line")
    if not blocks:
        return [_source(default_name, loose, 1, origin, language)]
    return [_source(name, lines, at + 1, origin, language) for name, at, lines in blocks]


def _source(name: str, lines: list[str], first_line: int, origin: str | None, language: str | None) -> QuerySource:
    """A query from its lines (``lines[0]`` is line ``first_line``), leading blank lines dropped."""
    skip = next((i for i, line in enumerate(lines) if line.strip()), 0)
    return QuerySource(name, "\n".join(lines[skip:]).rstrip(), language, origin, first_line + skip)


def parse_written_query(text: str, language: str | None = None, ts_unit: str = "s",
                        shapes: QueryShapes | None = None) -> Pattern:
    """One query as a query file holds it (``#`` comment lines, no ``@query`` line), parsed; an error's
    line is a line of ``text``. What ``yfpp serve`` takes, as ``yfpp subscribe -q FILE`` reads a file.
    ``shapes``: queries of a shape met before are parsed from it (the same pattern)."""
    sources = read_query_file(text, "", language=language)
    if len(sources) > 1 or sources[0].name:  # (a loose query is named "", which no '@query' line can give)
        raise YfppError("one query, without '@query NAME' lines: 'yfpp subscribe -q FILE' subscribes each "
                        "query of such a file")
    q = sources[0]
    try:
        if shapes is not None and language is None:
            return shapes.parse(q.text, ts_unit)
        return parse_query(q.text, q.language, ts_unit)
    except QueryError as err:
        raise err.relocated("", q.first_line) from None


def split_query_file(text: str, default_name: str) -> list[tuple[str, str]]:
    """``[(name, query text), …]`` of a query file's text."""
    return [(q.name, q.text) for q in read_query_file(text, default_name)]


def load_queries(args: Iterable[str]) -> list[QuerySource]:
    """The queries of ``-q`` arguments (query files or inline text); names must be unique."""
    out: list[QuerySource] = []
    inline = 0
    for arg in args:
        if _is_query_file(arg):
            out += _load_file(Path(arg))
        else:
            inline += 1
            out.append(QuerySource("q" if inline == 1 else f"q{inline}", arg))
    seen: dict[str, QuerySource] = {}
    for q in out:
        if q.name in seen:
            raise YfppError(
                f"query name {q.name!r} is used twice ({seen[q.name].where}; {q.where}): "
                "give one a name of its own with an '@query NAME' line"
            )
        seen[q.name] = q
    return out


def load_patterns(args: Iterable[str], ts_unit: str = "s") -> list[tuple[QuerySource, Pattern]]:
    """Each query of the ``-q`` arguments with its parsed pattern (a window without a unit in ``ts_unit``);
    errors name the query and its file line."""
    return [(q, q.parse(ts_unit)) for q in load_queries(args)]


def _is_query_file(arg: str) -> bool:
    """An existing path, or (to report it missing) a name with a query-file extension that is no query."""
    if "\n" in arg or not arg.strip():
        return False
    try:
        if Path(arg).exists():
            return True
    except (OSError, ValueError):  # a name too long for the file system, a NUL byte: inline text
        return False
    return Path(arg).suffix in _SUFFIX_LANGUAGE and "(" not in arg and not re.match(r"\s*PATTERN\b", arg, re.I)


def _load_file(path: Path) -> list[QuerySource]:
    try:
        text = path.read_text(encoding="utf-8-sig")  # (-sig: a byte-order mark some editors write is dropped)
    except FileNotFoundError:
        raise YfppError(f"query file not found: {path}") from None
    except UnicodeDecodeError as e:
        raise YfppError(f"query file {path} is not UTF-8 text (byte {e.start})") from None
    except OSError as e:
        raise YfppError(f"cannot read query file {path}: {e.strerror or e}") from None
    return read_query_file(text, path.stem, str(path), _SUFFIX_LANGUAGE.get(path.suffix))


# --- query shapes: parse once per shape, constants substituted ------------------------------------------------

# A constant that a subscriber varies: a quoted string without quote or backslash inside, or a number (at most 15
# digits each side of the point) right after a comparison operator and not part of a longer token (80%, 5.x).
# (the match begins with its first character as a class, the quote or the operator, then each alternative checks
# with a one-character look-behind which it was: a pattern that begins with a class is scanned for that class's
# characters at C speed, where a look-ahead first tries the pattern at every position — a third of the split)
# each kind of constant as a whole token (``token_kinds``' letters): a quoted string, an integer, a decimal
KIND_TOKENS = {"s": r"""'[^'\\\n]*'|"[^"\\\n]*\"""", "n": r"\d{1,15}", "d": r"\d{1,15}\.\d{1,15}"}
_CONSTANT = re.compile(r"""['"=<>](?:(?<=')[^'\\\n]*'|(?<=")[^"\\\n]*"|(?<=[=<>])\s*(\d{1,15}(?:\.\d{1,15})?)(?![\w.%]))""")
RECENT_SHAPES = 8  #: how many of the last shapes found a text is compared with before it is scanned
_SENTINEL = "\ue000{}\ue001"  # a string constant's stand-in (private-use characters)
_NUMBER_SENTINEL = 987_654_321_000  # + i: an integer constant's stand-in (12 digits, exact as a double)


class QueryShapes:
    """Parse queries that differ only by constants once: :meth:`parse` lifts the constants out of the text, parses
    the *shape* (the text with stand-ins) the first time it is met, and substitutes each query's constants into
    the shape's pattern (its ``Literal`` s and XPath predicate texts).  A shape whose stand-ins the parser does
    not keep each exactly once, as written (folded, in a comment, in a name), is parsed query by query; so is
    one that fails to parse, for its own positioned error."""

    def __init__(self, max_shapes: int = 4096) -> None:
        self.max_shapes = max_shapes
        self._shapes: dict[tuple, Shape | None] = {}
        self._lock = threading.Lock()
        self._likes: dict[tuple, re.Pattern] = {}  # per key of _shapes: like_pattern of its text and kinds
        # the last shapes found, the latest first: (ts_unit, the text before its first constant, like_pattern of the
        # text around its constants and their kinds, the shape); a text of one is split by one match (split_like), not
        # scanned (a batch of one template's subscriptions, a checkpoint's rows, subscribers of a few templates
        # registering in turn)
        self._recent: tuple[tuple[str, str, re.Pattern, Shape | None], ...] = ()

    def parse(self, text: str, ts_unit: str = "s") -> Pattern:
        """:func:`parse_query` of ``text``, the same pattern, from the shape's when it was met before."""
        shape, constants = self.shape_of(text, ts_unit)
        if shape is None:
            return parse_query(text, None, ts_unit)
        return shape.instance(text, constants)

    def shape_of(self, text: str, ts_unit: str = "s",
                 split: tuple[Sequence[str], list[str]] | None = None) -> tuple[Shape | None, list[str]]:
        """The parsed shape of ``text`` and its constants as written; ``(None, …)`` when ``text`` is parsed on its
        own (no constants, or a shape :meth:`parse` cannot use).  ``split``: :func:`split_constants` of ``text``,
        when the caller has it (a checkpoint keeps its queries so)."""
        if len(text) > MAX_QUERY_CHARS:
            check_text(text)  # (its error: the shape's text is shorter; its nesting is the text's, checked by parsing)
        recent = self._recent
        if split is None:
            for unit, first, like, shape in recent:  # (the latest first; a text of another shape seldom begins alike)
                if unit == ts_unit and text.startswith(first):
                    found = split_like(text, like)
                    if found is not None:
                        return shape, found
        around, constants = split_constants(text) if split is None else split
        if not constants:
            return None, constants
        # (each constant's kind: its quote, or d a decimal, n an integer)
        kinds = [tok[0] if tok[0] in "'\"" else "d" if "." in tok else "n" for tok in constants]
        key = (ts_unit, *kinds, *around)
        entry = self._shapes.get(key)
        if entry is None:
            pieces = [around[0]]
            for kind, after in zip(kinds, around[1:]):
                pieces.append("\x00" + ("s" + kind if kind in "'\"" else kind))
                pieces.append(after)
            entry = Shape.make(pieces, ts_unit), like_pattern(around, kinds)
            with self._lock:  # (the service parses on several threads)
                if len(self._shapes) >= self.max_shapes:
                    self._shapes.pop(next(iter(self._shapes)))
                self._shapes[key] = entry
        shape, like = entry
        self._recent = ((ts_unit, around[0], like, shape), *recent[:RECENT_SHAPES - 1])  # type: ignore[assignment]
        return shape, constants  # type: ignore[return-value]


def split_constants(text: str) -> tuple[list[str], list[str]]:
    """The constants a subscriber varies in ``text`` (as written) and the text around them: ``text`` is
    ``around[0] + constants[0] + around[1] + … + around[-1]``; queries of one shape have the same ``around``."""
    around, constants, last = [], [], 0
    for m in _CONSTANT.finditer(text):
        start, end = m.span(m.lastindex or 0)  # (a number: its group, after its operator; a quoted string: the match)
        around.append(text[last:start])
        constants.append(text[start:end])
        last = end
    around.append(text[last:])
    return around, constants


def like_pattern(around: Sequence[str], kinds: Sequence[str]) -> re.Pattern:
    """What :func:`split_like` matches a text with: ``around`` (the text around a text's constants, as
    :func:`split_constants` split that one) with, between its pieces, a whole constant of each of ``kinds`` (``'`` or
    ``"`` a quoted string, ``n`` an integer, ``d`` a decimal), each a group."""
    parts = [re.escape(around[0])]
    for kind, after in zip(kinds, around[1:]):
        parts.append(f"({_LIKE_TOKENS[kind]})")
        parts.append(re.escape(after))
    return re.compile("".join(parts))


def split_like(text: str, like: re.Pattern) -> list[str] | None:
    """The constants of ``text`` when :func:`split_constants` splits it as it split the text ``like`` was made of
    (:func:`like_pattern`: the same text around constants of the same kinds), else None; found by one match, not by
    scanning ``text``.  (The scan finds the same: the text around holds no constant, and what stands between two
    of its pieces is a whole constant of the kind the scan found there, followed by the same piece that ended that
    one; a quoted constant holding the other quote is left to the scan: it may close a quote the text around leaves
    open.)"""
    m = like.fullmatch(text)
    return None if m is None else list(m.groups())


def token_kinds(constants: Sequence[str]) -> str | None:
    """Each constant's kind (``s`` a quoted string, ``n`` an integer, ``d`` a decimal), or None when one is not a
    whole constant as :func:`split_constants` finds them: texts of one text around them whose constants have the
    same kinds are split alike (a checkpoint keeps its queries split, and checks one text per shape)."""
    kinds = []
    for c in constants:
        if _TOKEN.fullmatch(c) is None:
            return None
        kinds.append("s" if c[0] in "'\"" else "d" if "." in c else "n")
    return "".join(kinds)


_TOKEN = re.compile("|".join(KIND_TOKENS.values()))
#: a whole constant of each kind as split_like matches it: a quoted string holding neither the other quote, a backslash
#: nor a line break; a number as _CONSTANT's group finds it (all its digits: no word character, dot or % after it)
_LIKE_TOKENS = {"'": r"'[^'\"\\\n]*'", '"': r'"[^\'"\\\n]*"', "n": r"\d{1,15}(?![\w.%])",
                "d": r"\d{1,15}\.\d{1,15}(?![\w.%])"}


class Shape:
    """A parsed shape: its pattern with stand-ins, and how to put a query's constants in their place."""

    __slots__ = ("pattern", "sentinels", "kinds", "lines", "hot", "keys")

    def __init__(self, pattern: Pattern, sentinels: list[str], kinds: list[type], lines: list[tuple[int, int]]):
        self.pattern = pattern
        self.hot = hot_objects(pattern, {(s[1:-1] if s[0] in "'\"" else s) for s in sentinels}, sentinels, set())
        self.sentinels = sentinels  # each constant's stand-in as written in the shape's text
        self.kinds = kinds  # the type the parser made of each stand-in (str, int, float, Decimal…)
        self.lines = lines  # (line, column) of each stand-in in the shape's text
        # each stand-in's literal value as (type, value), and whether it is a quoted string (else a number of its kind)
        self.keys = [((str, s[1:-1]), True) if s[0] in "'\"" else ((kind, kind(s)), False)
                     for s, kind in zip(sentinels, kinds)]

    @classmethod
    def make(cls, pieces: list[str], ts_unit: str) -> "Shape | None":
        sentinels, text = [], []
        for i, piece in enumerate(pieces):
            if i % 2 == 0:
                text.append(piece)
                continue
            kind = piece[1]
            sentinels.append(piece[2] + _SENTINEL.format(i // 2) + piece[2] if kind == "s"
                             else f"{_NUMBER_SENTINEL + i // 2}" + (".5" if kind == "d" else ""))
            text.append(sentinels[-1])
        source = "".join(text)
        try:
            pattern = parse_query(source, None, ts_unit)
        except YfppError:
            return None
        values = {(s[1:-1] if s[0] in "'\"" else s): i for i, s in enumerate(sentinels)}
        found: list[int] = [0] * len(sentinels)
        kinds: list[type] = [str] * len(sentinels)
        for obj in _walk(pattern):
            if isinstance(obj, Literal):
                v = obj.value
                i = values.get(v if isinstance(v, str) else str(v))
                if i is not None and (isinstance(v, str) == (sentinels[i][0] in "'\"")):
                    found[i] += 1
                    kinds[i] = type(v)
            elif isinstance(obj, XPathTest):
                for i, s in enumerate(sentinels):
                    found[i] += obj.source.count(s)
            elif isinstance(obj, str) and obj is not pattern.source:
                for i, s in enumerate(sentinels):
                    if s.strip("'\"") in obj:
                        return None  # (a stand-in in a name, a namespace…: not a constant)
        if found != [1] * len(sentinels):
            return None
        lines, offset = [], 0
        for i, piece in enumerate(text):
            if i % 2:
                line = source.count("\n", 0, offset) + 1
                lines.append((line, offset - source.rfind("\n", 0, offset)))
            offset += len(piece)
        return cls(pattern, sentinels, kinds, lines)

    def literals(self, constants: list[str]) -> dict[tuple[type, Any], Any]:
        """Each stand-in's literal value, as ``(type, value)``, mapped to the value of its constant in ``constants``
        (as written)."""
        return {key: c[1:-1] if quoted else key[0](c) for (key, quoted), c in zip(self.keys, constants)}

    def instance(self, text: str, constants: list[str]) -> Pattern:
        """The shape's pattern with ``constants`` (as written) in place of its stand-ins, and ``text`` its source."""
        literals = self.literals(constants)
        texts = list(zip(self.sentinels, constants))
        shifts: dict[int, list[tuple[int, int]]] = {}
        for (line, column), (s, c) in zip(self.lines, texts):
            shifts.setdefault(line, []).append((column, len(c) - len(s)))
        positions = tuple((var, line, column + sum(d for at, d in shifts.get(line, ()) if at < column))
                          for var, line, column in self.pattern.positions)
        pattern = substitute(self.pattern, literals, texts, self.hot)
        object.__setattr__(pattern, "source", text)
        object.__setattr__(pattern, "positions", positions)
        return pattern


def _walk(obj: object) -> Iterator[object]:
    """Every dataclass, tuple item and string inside a pattern (a ``Literal`` or ``XPathTest`` as a whole)."""
    stack = [obj]
    while stack:
        o = stack.pop()
        yield o
        if isinstance(o, tuple):
            stack.extend(o)
        elif is_dataclass(o) and not isinstance(o, (Literal, XPathTest)):
            stack.extend(getattr(o, f.name) for f in fields(o))


def hot_objects(obj: Any, values: set[str], sentinels: list[str], hot: set[int]) -> set[int]:
    """The ids of the objects of ``obj`` (a shape's pattern, which keeps them) that hold a stand-in: what
    :func:`substitute` rebuilds; the rest is shared between the shape's queries."""
    if isinstance(obj, Literal):
        if str(obj.value) in values:
            hot.add(id(obj))
    elif isinstance(obj, XPathTest):
        if any(s in obj.source for s in sentinels):
            hot.add(id(obj))
    elif isinstance(obj, tuple) or (is_dataclass(obj) and not isinstance(obj, type)):
        items = obj if isinstance(obj, tuple) else [getattr(obj, f.name) for f in fields(obj)]
        for item in items:
            hot_objects(item, values, sentinels, hot)
        if any(id(item) in hot for item in items):
            hot.add(id(obj))
    return hot


def put_constants(text: str, texts: list[tuple[str, str]] | tuple) -> str:
    """``text`` with each stand-in (as written) replaced by its constant (``texts``: ``(stand-in, constant)``), in one
    pass: a constant put in may read as another stand-in (``987654321001``), which stays as it is."""
    hits = []
    for stand_in, constant in texts:
        at = text.find(stand_in)
        while at >= 0:
            hits.append((at, len(stand_in), constant))
            at = text.find(stand_in, at + len(stand_in))
    if not hits:
        return text
    hits.sort()
    out, start = [], 0
    for at, n, constant in hits:
        out += (text[start:at], constant)
        start = at + n
    out.append(text[start:])
    return "".join(out)


def substitute(obj: Any, literals: dict, texts: list[tuple[str, str]], hot: set[int]) -> Any:
    """``obj`` rebuilt with the literals and XPath texts replaced where :func:`hot_objects` found stand-ins."""
    if id(obj) not in hot:
        return obj
    if isinstance(obj, Literal):
        return Literal(literals[(type(obj.value), obj.value)])
    if isinstance(obj, XPathTest):
        return rebuilt(obj, source=put_constants(obj.source, texts))
    if isinstance(obj, tuple):
        return tuple([substitute(o, literals, texts, hot) for o in obj])
    return rebuilt(obj, **{name: substitute(getattr(obj, name), literals, texts, hot) for name in type(obj).__slots__
                           if id(getattr(obj, name)) in hot})
