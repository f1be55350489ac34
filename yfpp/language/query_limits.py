"""Caps on query text (README "Query files"), so that no query hangs or crashes a parser.

Parsing is linear in the text (LALR, no backtracking); these caps keep every
recursive pass that follows — the tree transformer, predicate compilation,
per-event evaluation, elementpath — far from Python's recursion limit, and
keep numbers finite.  Exceeding one is a :class:`QuerySyntaxError` (a
:class:`PatternError` for the component count) at the offending position.
"""

from __future__ import annotations

import math
import re
from typing import Callable, Iterable, TypeVar

from yfpp.errors import QuerySyntaxError

#: Characters in one query's text.
MAX_QUERY_CHARS = 1_000_000
#: Nesting of parentheses / brackets / braces, and depth of an expression
#: (each operator, ``NOT`` and unary minus is a level).
MAX_NESTING = 100
#: Components (steps) of one pattern.
MAX_COMPONENTS = 10_000

T = TypeVar("T")

# Quoted strings (skipped: brackets inside them do not nest) and brackets.
_BRACKETS = re.compile(r"""'[^'\\]*(?:\\.[^'\\]*)*'?|"[^"\\]*(?:\\.[^"\\]*)*"?|[(\[{]|[)\]}]""", re.S)


def line_column(text: str, offset: int) -> tuple[int, int]:
    """1-based line and column of ``offset`` in ``text``."""
    line = text.count("\n", 0, offset) + 1
    return line, offset - (text.rfind("\n", 0, offset) + 1) + 1


def check_text(text: str) -> None:
    """Refuse text over :data:`MAX_QUERY_CHARS` or brackets nested over :data:`MAX_NESTING` (one linear scan)."""
    if len(text) > MAX_QUERY_CHARS:
        raise QuerySyntaxError(
            f"query text is {len(text):,} characters; the limit is {MAX_QUERY_CHARS:,}",
            text, *line_column(text, MAX_QUERY_CHARS),
        )
    depth = 0
    for m in _BRACKETS.finditer(text):
        c = m.group()
        if c in "([{":
            depth += 1
            if depth > MAX_NESTING:
                raise too_deep(text, *line_column(text, m.start()))
        elif c in ")]}":
            depth = max(depth - 1, 0)


def too_deep(text: str, line: int, column: int) -> QuerySyntaxError:
    return QuerySyntaxError(f"nested too deeply: the limit is {MAX_NESTING} levels", text, line, column)


def deepest(root: T, children: Callable[[T], Iterable[T]], limit: int = MAX_NESTING) -> T | None:
    """The first node found deeper than ``limit`` in a tree (walked without recursion), or None."""
    stack = [(root, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > limit:
            return node
        stack.extend((child, depth + 1) for child in children(node))
    return None


def finite_number(token: str, text: str, line: int, column: int) -> int | float:
    """A numeric literal's value (int when written without point or exponent); refuse it when it is not a finite float."""
    value = float(token)
    if not math.isfinite(value):
        raise QuerySyntaxError(f"number {_short(token)} is too large (the limit is about 1.8e308)", text, line, column)
    return int(token) if token.isdigit() else value


def finite_window(seconds: float, text: str, line: int, column: int) -> float:
    """A window length, refused when it overflows to infinity."""
    if not math.isfinite(seconds):
        raise QuerySyntaxError("window is too large (the limit is about 1.8e308 seconds)", text, line, column)
    return seconds


def _short(token: str) -> str:
    return token if len(token) <= 20 else f"{token[:10]}…({len(token)} characters)"
