"""The query parsers made from saved LALR tables are the parsers lark analyses from the grammars."""

from __future__ import annotations

import json
from pathlib import Path

import lark
import pytest
from lark import Lark
from lark.exceptions import UnexpectedInput

from yfpp.language import lark_tables
from yfpp.language.remake_tables import grammars
from yfpp.language.query_text import load_patterns

ROOT = Path(__file__).resolve().parents[2]
GRAMMARS = grammars()
BAD = ["PATTERN SEQ(a x, b y", "PATTERN SEQ(a x) WHERE x.v >", "//a[@x='1'", "//a//!b", "PATTERN SEQ(a x) WITHIN 3 parsecs",
       "PATTERN @", "//a[", "//a && (5 lightyears)"]


@pytest.mark.parametrize("grammar, options", GRAMMARS, ids=[g.name for g, _ in GRAMMARS])
def test_saved_tables_are_current(grammar, options):
    """Remake them with ``python -m yfpp.language.remake_tables`` after changing a grammar (or upgrading lark: tables of
    another lark version are not used, the parser is analysed at start-up as without them)."""
    saved = json.loads(lark_tables.tables_path(grammar).read_bytes())
    assert saved["key"] == lark_tables.tables_key(grammar.read_text(encoding="utf-8"), options)


@pytest.mark.parametrize("grammar, options", GRAMMARS, ids=[g.name for g, _ in GRAMMARS])
def test_loaded_parser_parses_as_the_analysed_one(grammar, options):
    loaded = lark_tables.lalr_parser(grammar, **options)
    analysed = Lark(grammar.read_text(encoding="utf-8"), parser="lalr", **options)
    assert type(loaded.parser.parser.parser).__name__ == type(analysed.parser.parser.parser).__name__
    sase = grammar.name.startswith("sase")
    texts = [source.text for path in sorted((ROOT / "queries").iterdir()) if path.suffix == (".sase" if sase else ".xpe")
             for source, _ in load_patterns([str(path)])]
    assert texts
    for text in texts + BAD:
        got = []
        for parser in (loaded, analysed):
            try:
                tree = parser.parse(text, **({"start": "start"} if sase else {}))
                got.append((tree, [(t.line, t.column, t.end_pos) for t in tree.scan_values(lambda v: True)
                                   if hasattr(t, "line")]))
            except UnexpectedInput as e:
                got.append((type(e).__name__, e.line, e.column, getattr(e, "expected", None)))  # str(e): in set order
        assert got[0] == got[1], text


def test_stale_tables_are_not_used(tmp_path):
    grammar, options = GRAMMARS[0]
    copy = tmp_path / grammar.name
    copy.write_text(grammar.read_text(encoding="utf-8") + "\n// changed\n", encoding="utf-8")
    lark_tables.tables_path(copy).write_bytes(lark_tables.tables_path(grammar).read_bytes())
    assert lark_tables.lalr_parser(copy, **options).source_path != "<deserialized>"  # analysed afresh
    saved = json.loads(lark_tables.tables_path(grammar).read_bytes())
    current = saved["lark"] == lark.__version__  # tables of another lark version are not used either
    assert (lark_tables.lalr_parser(grammar, **options).source_path == "<deserialized>") == current
