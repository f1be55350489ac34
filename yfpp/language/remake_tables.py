"""``python -m yfpp.language.remake_tables``: write the saved LALR tables of both query languages
(:mod:`yfpp.language.lark_tables`), after a change of a grammar or of lark. Above both parsers, so that the
tables module stays below them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from xpath_ext import parser as xpath
from yfpp.language import sase_parser as sase
from yfpp.language.lark_tables import tables_path, tables_text


def grammars() -> list[tuple[Path, dict[str, Any]]]:
    """The grammars the package parses queries with, and their parsers' options (the package installed as files)."""
    return [(Path(str(sase.GRAMMAR)), sase.LARK_OPTIONS), (Path(str(xpath.GRAMMAR)), xpath.LARK_OPTIONS)]


def main() -> None:
    """Write the tables of every grammar the package parses with."""
    for grammar, options in grammars():
        tables_path(grammar).write_text(tables_text(grammar, **options), encoding="utf-8")
        print(f"wrote {tables_path(grammar)}")


if __name__ == "__main__":
    main()
