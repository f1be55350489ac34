"""The package's layers (docs/architecture.md): imports go down, never up, and never in a circle.

Every ``import`` counts, also one inside a function — only those under ``if TYPE_CHECKING:`` do not.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import networkx as nx
import pytest

ROOT = Path(__file__).resolve().parent.parent

#: Each layer may import the layers of lower rank (and modules of its own layer, without circles).
RANKS = {
    "yfpp.errors": 0, "yfpp._version": 0,
    "yfpp.input": 1,
    "yfpp.language": 2, "xpath_ext": 2,
    "yfpp.nfa": 3,
    "yfpp.runtime": 4,
    "yfpp.sets": 5,
    "yfpp.state": 6,
    "yfpp.engine": 7,
    "yfpp.output": 8, "yfpp.reference": 8,
    "yfpp.examples": 9, "yfpp.cli": 9, "yfpp.service": 9, "yfpp.spark": 9, "yfpp.__main__": 9, "yfpp": 9,
}
LAYERS = ["yfpp.input", "yfpp.language", "xpath_ext", "yfpp.nfa", "yfpp.runtime", "yfpp.sets", "yfpp.state",
          "yfpp.output", "yfpp.reference"]


def modules() -> dict[str, Path]:
    found = {}
    for path in [*ROOT.glob("yfpp/**/*.py"), *ROOT.glob("xpath_ext/*.py")]:
        parts = path.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def rank(module: str) -> int:
    while module not in RANKS:
        module = module.rpartition(".")[0]
    return RANKS[module]


def _type_checking_only(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The package's modules that ``name`` imports anywhere but under ``if TYPE_CHECKING:``."""
    is_package = path.name == "__init__.py"
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if _type_checking_only(child):
                continue
            if isinstance(child, ast.Import):
                found.update(a.name for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = name.split(".") if is_package else name.split(".")[:-1]
                if child.level:
                    base = base[:len(base) - child.level + 1]
                    target = ".".join(base + ([child.module] if child.module else []))
                else:
                    target = child.module or ""
                for a in child.names:
                    found.add(f"{target}.{a.name}" if f"{target}.{a.name}" in known else target)
            visit(child)

    visit(ast.parse(path.read_text(encoding="utf-8")))
    return {m for m in found if m in known and m != name}


def graph() -> nx.DiGraph:
    known = modules()
    g = nx.DiGraph()
    for name, path in known.items():
        g.add_node(name)
        g.add_edges_from((name, m) for m in imports(name, path, known))
    return g


def test_no_module_imports_a_higher_layer():
    upward = [f"{a} ({rank(a)}) imports {b} ({rank(b)})" for a, b in graph().edges if rank(b) > rank(a)
              and not (a == "yfpp" or b == "yfpp")]
    assert not upward, "upward imports:\n" + "\n".join(sorted(upward))


def test_no_import_circles():
    g = graph()
    g.remove_node("yfpp")  # the package's lazy attributes (``from yfpp import Engine``) are no import of a module
    cycles = list(nx.simple_cycles(g))
    assert not cycles, "import circles:\n" + "\n".join(" → ".join(c + [c[0]]) for c in sorted(cycles, key=len)[:20])


@pytest.mark.parametrize("layer", LAYERS)
def test_a_layer_imported_alone_loads_nothing_above_it(layer):
    """Each module of ``layer`` imported in a fresh interpreter pulls in no module of a higher layer."""
    mods = sorted(m for m in modules() if m == layer or m.startswith(layer + "."))
    code = ("import importlib, sys\n"
            f"for m in {mods!r}: importlib.import_module(m)\n"
            "print('\\n'.join(m for m in sys.modules if m.startswith(('yfpp', 'xpath_ext'))))")
    loaded = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    above = [m for m in loaded if m != "yfpp" and rank(m) > rank(layer)]
    assert not above, f"importing {layer} loaded {above}"
