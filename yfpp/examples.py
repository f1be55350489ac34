"""The example queries and sample feeds that ship with yfpp, reachable as ``example:NAME``.

In a clone they are the repository's ``queries/`` and ``yfpp/data/``; an installed
package carries the queries as ``yfpp/queries`` (pyproject.toml maps the directory).
``NAME`` is a file name (``shoplifting.sase``, ``sample_rfid.xml``) or, when only
one file has it, its stem (``figure1_q1_shoplifting``).
"""

from __future__ import annotations

from pathlib import Path

from yfpp.errors import YfppError

PREFIX = "example:"
_PACKAGE = Path(__file__).resolve().parent


def example_dirs() -> list[Path]:
    """The directories holding example queries, then sample feeds."""
    installed = _PACKAGE / "queries"
    return [installed if installed.is_dir() else _PACKAGE.parent / "queries", _PACKAGE / "data"]


def example_files() -> list[Path]:
    return [p for d in example_dirs() if d.is_dir() for p in sorted(d.iterdir()) if p.is_file() and not p.name.startswith((".", "_"))]


def resolve(arg: str) -> str:
    """``example:NAME`` → the path of that example file; any other argument unchanged."""
    if not arg.startswith(PREFIX):
        return arg
    name = arg[len(PREFIX):]
    files = example_files()
    found = [p for p in files if p.name == name] or [p for p in files if p.stem == name]
    if len(found) == 1:
        return str(found[0])
    if found:
        raise YfppError(f"{arg!r} is ambiguous: {', '.join(PREFIX + p.name for p in found)}")
    raise YfppError(f"no example named {name!r}; 'yfpp examples' lists them")


def describe(path: Path, width: int = 72) -> str:
    """A query file's leading comment, up to its first full stop or ``width`` characters."""
    words: list[str] = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.startswith("#"):
            break
        words.extend(line.lstrip("#").split())
    text = " ".join(words).split(". ")[0].removesuffix(".")
    return text if len(text) <= width else text[: width - 1].rstrip() + "…"


def listing() -> str:
    """What ``yfpp examples`` prints."""
    queries, feeds = example_dirs()
    files = example_files()
    width = max((len(p.name) for p in files), default=0)
    lines = ["example queries (-q example:NAME):"]
    lines += [f"  {p.name:<{width}}  {describe(p, 60)}" for p in files if p.parent == queries]
    lines += ["sample feeds (-i example:NAME):"]
    lines += [f"  {p.name}" for p in files if p.parent == feeds]
    return "\n".join(lines)
