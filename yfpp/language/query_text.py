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
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

from yfpp.errors import QueryError, QuerySyntaxError, YfppError
from yfpp.language.pattern import Pattern

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
    loose: list[str] = []
    first_loose = 0
    where = f"{origin}, " if origin else ""
    for lineno, line in enumerate(text.split("\n"), 1):
        stripped = line.strip()
        if stripped.startswith("@query"):
            m = _QUERY_LINE.match(stripped)
            if not m:
                raise YfppError(f"{where}line {lineno}: expected '@query NAME', got {stripped[:80]!r}")
            for name, at, _ in blocks:
                if name == m.group(1):
                    raise YfppError(f"{where}line {lineno}: query name {name!r} is used twice (first at line {at})")
            blocks.append((m.group(1), lineno, []))
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


def parse_written_query(text: str, language: str | None = None, ts_unit: str = "s") -> Pattern:
    """One query as a query file holds it (``#`` comment lines, no ``@query`` line), parsed; an error's
    line is a line of ``text``. What ``yfpp serve`` takes, as ``yfpp subscribe -q FILE`` reads a file."""
    sources = read_query_file(text, "", language=language)
    if len(sources) > 1 or sources[0].name:  # (a loose query is named "", which no '@query' line can give)
        raise YfppError("one query, without '@query NAME' lines: 'yfpp subscribe -q FILE' subscribes each "
                        "query of such a file")
    q = sources[0]
    try:
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
