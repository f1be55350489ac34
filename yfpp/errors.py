"""Errors users see: each says where and what was expected."""

from __future__ import annotations


class YfppError(Exception):
    """Base class of every error the engine raises on purpose."""


class PatternError(YfppError):
    """A pattern that is well-formed text but not a valid pattern (SPEC §2)."""


class QuerySyntaxError(YfppError):
    """Query text that does not parse: line, column, caret, what was expected."""

    def __init__(self, message: str, text: str, line: int, column: int, expected: list[str] | None = None):
        self.line = line
        self.column = column
        self.expected = sorted(set(expected or []))
        src_line = text.splitlines()[line - 1] if 0 < line <= len(text.splitlines()) else ""
        caret = " " * (column - 1) + "^"
        exp = f"\nexpected one of: {', '.join(self.expected)}" if self.expected else ""
        super().__init__(f"line {line}, column {column}: {message}\n  {src_line}\n  {caret}{exp}")


class InputError(YfppError):
    """An input stream that cannot be read at all (not a single bad record)."""
