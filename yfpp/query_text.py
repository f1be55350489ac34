"""Query text and query files: which language, which name.

Query file format (documented in the README):

* lines starting with ``#`` are comments;
* a line ``@query NAME`` starts a named query, which runs to the next
  ``@query`` line; text before the first ``@query`` line must be empty;
* a file with no ``@query`` line holds one bare query named after the file.

Language: extension ``.sase`` is SASE+, ``.xpe`` extended XPath; otherwise
the text decides — SASE+ starts with ``PATTERN`` (any case), anything else is
extended XPath.
"""

from __future__ import annotations

import re
from pathlib import Path

from yfpp.errors import YfppError
from yfpp.pattern import Pattern

_SASE_START = re.compile(r"\s*(/\*.*?\*/\s*)*PATTERN\b", re.IGNORECASE | re.DOTALL)
_QUERY_LINE = re.compile(r"@query\s+([A-Za-z_][\w.\-]*)\s*$")


def detect_language(text: str) -> str:
    """``"sase"`` or ``"xpath"``."""
    return "sase" if _SASE_START.match(text) else "xpath"


def parse_query(text: str, language: str | None = None) -> Pattern:
    """Parse query text in either language into a validated Pattern."""
    language = language or detect_language(text)
    if language == "sase":
        from yfpp.sase_parser import parse_sase

        return parse_sase(text)
    from xpath_ext.parser import parse_xpath

    return parse_xpath(text)


def split_query_file(text: str, default_name: str) -> list[tuple[str, str]]:
    """``[(name, query text), …]`` of a query file's text."""
    named: list[tuple[str, list[str]]] = []
    loose: list[str] = []
    for lineno, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if stripped.startswith("@query"):
            m = _QUERY_LINE.match(stripped)
            if not m:
                raise YfppError(f"line {lineno}: expected '@query NAME', got {stripped!r}")
            named.append((m.group(1), []))
        elif stripped.startswith("#"):
            continue
        elif named:
            named[-1][1].append(line)
        elif stripped:
            loose.append(line)
    if named and loose:
        raise YfppError("query file: text before the first '@query NAME' line")
    if not named:
        return [(default_name, "\n".join(loose).strip())]
    return [(name, "\n".join(lines).strip()) for name, lines in named]


def load_queries(arg: str) -> list[tuple[str, str, str | None]]:
    """``[(name, text, language), …]`` from a query file path or inline query text."""
    path = Path(arg)
    if path.suffix in (".sase", ".xpe", ".q", ".query") or (len(arg) < 4096 and "\n" not in arg and path.is_file()):
        if not path.is_file():
            raise YfppError(f"query file not found: {arg}")
        language = {".sase": "sase", ".xpe": "xpath"}.get(path.suffix)
        return [(n, t, language) for n, t in split_query_file(path.read_text(encoding="utf-8"), path.stem)]
    return [("q", arg, None)]
