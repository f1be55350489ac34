"""Errors users see: each says where and what was expected."""

from __future__ import annotations

from typing import TypeVar

_Q = TypeVar("_Q", bound="QueryError")

#: The shown source line is cut to this many characters around the caret.
SHOWN_LINE_CHARS = 100


class YfppError(Exception):
    """Base class of every error the engine raises on purpose."""


class QueryError(YfppError):
    """An error in a query: ``[context, ]line L, column C: message``, the source line and a caret.

    ``line``/``column`` are 1-based (``None`` when the error is not tied to
    query text, e.g. a hand-built Pattern); ``var`` names the pattern variable
    the error is about, so a parser can place it (``Pattern.locate``).
    ``relocated`` re-bases the position onto a query file.
    """

    def __init__(
        self,
        message: str,
        text: str | None = None,
        line: int | None = None,
        column: int | None = None,
        expected: list[str] | None = None,
        *,
        var: str | None = None,
    ):
        self.message = message
        self.line = line
        self.column = column
        self.expected = sorted(set(expected or []))
        self.var = var
        self.context = ""
        lines = text.split("\n") if text is not None else []
        self.source_line = lines[line - 1] if line is not None and 0 < line <= len(lines) else ""
        super().__init__(self._render())

    def _render(self) -> str:
        if self.line is None:
            return f"{self.context}: {self.message}" if self.context else self.message
        head = f"{self.context}, " if self.context else ""
        shown, caret = _shown(self.source_line, self.column or 1)
        exp = f"\nexpected one of: {', '.join(self.expected)}" if self.expected else ""
        return f"{head}line {self.line}, column {self.column}: {self.message}\n  {shown}\n  {caret}{exp}"

    def at(self: _Q, text: str, line: int, column: int) -> _Q:
        """This error placed at ``line``/``column`` of ``text``."""
        lines = text.split("\n")
        return self._replace(line=line, column=column, source_line=lines[line - 1] if 0 < line <= len(lines) else "")

    def relocated(self: _Q, context: str, first_line: int = 1) -> _Q:
        """This error seen from a query file: ``context`` (e.g. ``query 'q' in f.sase``) before
        the position, and lines counted from the file's line ``first_line`` (the query's line 1)."""
        line = None if self.line is None else self.line + first_line - 1
        return self._replace(context=context, line=line)

    def _replace(self: _Q, **changes: object) -> _Q:
        new = self.__class__.__new__(self.__class__)
        new.__dict__.update(self.__dict__, **changes)
        Exception.__init__(new, new._render())
        return new


def _shown(line: str, column: int) -> tuple[str, str]:
    """The source line (tabs as spaces, cut around the column when long) and its caret line."""
    line = line.replace("\t", " ").replace("\r", " ")
    start = 0
    if len(line) > SHOWN_LINE_CHARS:
        start = max(0, min(column - 1 - SHOWN_LINE_CHARS // 2, len(line) - SHOWN_LINE_CHARS))
        cut = line[start : start + SHOWN_LINE_CHARS]
        line = ("…" if start else "") + cut + ("…" if start + SHOWN_LINE_CHARS < len(line) else "")
        start -= 1 if start else 0
    return line, " " * (column - 1 - start) + "^"


class PatternError(QueryError):
    """A pattern that is well-formed text but not a valid pattern (docs/semantics.md §2–5)."""


class QuerySyntaxError(QueryError):
    """Query text that does not parse: line, column, caret, what was expected."""


class InputError(YfppError):
    """An input stream that cannot be read at all (not a single bad record)."""
