"""LALR parsers from saved tables: lark's grammar analysis (50–60 ms at every start of a process that
parses a query) done once, when the grammar changes, instead of at every start.

``<grammar>.tables.json`` next to a grammar holds lark's serialised parser (``Lark.memo_serialize``: plain
data, no pickle, no code) with the key it was made for: the grammar text, the options and the lark
version. When the key differs (the grammar or lark changed) the parser is analysed from the grammar as
before — the same parser, only slower to make; ``tests/language/test_lark_tables.py`` checks the saved tables are
made from the current grammars. Remake them with::

    python -m yfpp.language.remake_tables
"""

from __future__ import annotations

import hashlib
import json
from importlib.resources.abc import Traversable
from typing import Any

import lark
from lark import Lark
from lark.grammar import Rule
from lark.lexer import TerminalDef


def lalr_parser(grammar: Traversable, **options: Any) -> Lark:
    """The LALR parser of ``grammar`` with ``options``: from its saved tables when they are current. ``grammar``
    is a file of the package (``importlib.resources.files``): a path, or a member of the zip that ``yfpp spark``
    ships to a cluster's executors."""
    text = grammar.read_text(encoding="utf-8")
    try:
        saved = json.loads(tables_path(grammar).read_bytes())
    except (OSError, ValueError):
        saved = None
    if isinstance(saved, dict) and saved.get("key") == tables_key(text, options) and saved.get("lark") == lark.__version__:
        return Lark.load(_decode(saved["parser"]))
    return Lark(text, parser="lalr", **options)


def tables_path(grammar: Traversable) -> Traversable:
    return grammar.parent / (grammar.name.rpartition(".")[0] + ".tables.json")  # type: ignore[attr-defined]


def tables_text(grammar: Traversable, **options: Any) -> str:
    """What the tables file of ``grammar`` holds for ``options``, analysed afresh."""
    text = grammar.read_text(encoding="utf-8")
    data, memo = Lark(text, parser="lalr", **options).memo_serialize([TerminalDef, Rule])
    return json.dumps({"key": tables_key(text, options), "lark": lark.__version__,
                       "parser": _encode({"data": data, "memo": memo})},
                      sort_keys=True, separators=(",", ":")) + "\n"


def tables_key(text: str, options: dict[str, Any]) -> str:
    """What saved tables are for: the grammar text and the options (the lark version is kept beside it; the
    tables themselves differ from run to run — lark numbers the parse states in set order — but every version
    is the parser)."""
    return hashlib.sha256(json.dumps([text, sorted(options.items())]).encode()).hexdigest()


def _encode(value: Any) -> Any:
    """JSON for lark's serialised data: a dict with int keys (parse states, tokens, the memo) becomes
    ``{"int keys": [[key, value]…]}``, tuples lists (lark reads either)."""
    if isinstance(value, dict):
        if value and all(type(k) is int for k in value):
            return {"int keys": [[k, _encode(v)] for k, v in sorted(value.items())]}
        if not all(type(k) is str for k in value):
            raise TypeError(f"cannot save lark tables: keys {sorted(map(repr, value))[:3]}")
        return {k: _encode(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_encode(v) for v in value]
    if value is None or type(value) in (str, int, float, bool):
        return value
    raise TypeError(f"cannot save lark tables: a {type(value).__name__}")


def _decode(value: Any) -> Any:
    if isinstance(value, dict):
        pairs = value.get("int keys")
        if pairs is not None and len(value) == 1:
            return {k: _decode(v) for k, v in pairs}
        return {k: _decode(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_decode(v) for v in value]
    return value
