"""Docs that cannot drift: every ``console`` and ``python`` block of README.md and docs/*.md runs here.

The convention (README.md, "Documentation that runs"):

* a fenced block with info string ``console`` holds lines starting with ``$ ``,
  each run from the repository root by ``bash`` (PYTHONPATH = the repository,
  ``yfpp`` = this checkout's command, stderr merged into stdout), each followed
  by its exact expected output; a line ``...`` matches any number of lines;
* the ``python`` blocks of one file run in order in one namespace, from the
  repository root;
* every other fence (``sh``, ``text``, ``toml``, …) is illustrative.

Blocks that use Spark run only when pyspark is installed.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^(?P<indent> *)(?P<fence>```+|~~~+)(?P<info>[^\n`]*)$")
SPARK = re.compile(r"\b(?:pyspark|spark)\b", re.IGNORECASE)
COMMAND_TIMEOUT = 300


@dataclass
class Block:
    path: Path
    line: int  # 1-based line of the opening fence
    info: str
    text: str

    @property
    def id(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def blocks(path: Path) -> list[Block]:
    """The fenced blocks of a Markdown file, with their info strings."""
    out: list[Block] = []
    lines = path.read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        fence, indent, start = m["fence"], len(m["indent"]), i
        body: list[str] = []
        i += 1
        while i < len(lines) and not (lines[i].strip().startswith(fence) and lines[i].strip() == fence[0] * len(lines[i].strip())):
            body.append(lines[i][indent:] if lines[i][:indent].isspace() else lines[i])
            i += 1
        out.append(Block(path, start + 1, m["info"].strip().split(" ")[0], "\n".join(body)))
        i += 1
    return out


def all_blocks(kind: str) -> list[Block]:
    return [b for p in DOCS for b in blocks(p) if b.info == kind]


def needs_spark(text: str) -> bool:
    return bool(SPARK.search(text))


def spark_missing() -> bool:
    try:
        import pyspark  # noqa: F401
    except ImportError:
        return True
    return False


# --- expected output ----------------------------------------------------------------------------


def output_matches(expected: list[str], actual: list[str]) -> bool:
    """Line-by-line equality where an expected line ``...`` stands for any number of lines."""
    memo: dict[tuple[int, int], bool] = {}

    def match(i: int, j: int) -> bool:
        if (i, j) not in memo:
            if i == len(expected):
                memo[i, j] = j == len(actual)
            elif expected[i] == "...":
                memo[i, j] = any(match(i + 1, k) for k in range(j, len(actual) + 1))
            else:
                memo[i, j] = j < len(actual) and expected[i] == actual[j] and match(i + 1, j + 1)
        return memo[i, j]

    return match(0, 0)


def commands(block: Block) -> list[tuple[str, list[str]]]:
    """``[(command, expected output lines), …]`` of a console block."""
    out: list[tuple[str, list[str]]] = []
    for line in block.text.splitlines():
        if line.startswith("$ "):
            out.append((line[2:], []))
        elif out:
            out[-1][1].append(line)
        elif line.strip():
            raise AssertionError(f"{block.id}: console output before the first '$ ' line: {line!r}")
    while out and out[-1][1] and not out[-1][1][-1].strip():
        out[-1][1].pop()
    return out


@pytest.fixture(scope="module")
def shell_env(tmp_path_factory) -> dict[str, str]:
    """PYTHONPATH = this checkout, and a ``yfpp`` on PATH that runs this checkout with this Python."""
    bin_dir = tmp_path_factory.mktemp("bin")
    yfpp = bin_dir / "yfpp"
    yfpp.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m yfpp "$@"\n')
    yfpp.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    env.update(PYTHONPATH=str(ROOT), PATH=f"{bin_dir}{os.pathsep}{env.get('PATH', '')}", COLUMNS="80")
    return env


# --- the tests ----------------------------------------------------------------------------------


@pytest.mark.parametrize("block", all_blocks("console"), ids=lambda b: b.id)
def test_console_block(block: Block, shell_env: dict[str, str]) -> None:
    if needs_spark(block.text) and spark_missing():
        pytest.skip("pyspark is not installed")
    cmds = commands(block)
    assert cmds, f"{block.id}: a console block without '$ ' lines"
    for command, expected in cmds:
        done = subprocess.run(["bash", "-c", command], cwd=ROOT, env=shell_env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, timeout=COMMAND_TIMEOUT)
        actual = done.stdout.splitlines()
        while actual and not actual[-1].strip():
            actual.pop()
        assert output_matches(expected, actual), (
            f"{block.id}: $ {command}\n--- expected\n" + "\n".join(expected) + "\n--- got\n" + "\n".join(actual)
        )


PYTHON_FILES = sorted({b.path for b in all_blocks("python")})


@pytest.mark.parametrize("path", PYTHON_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_python_blocks(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    file_blocks = [b for b in blocks(path) if b.info == "python"]
    if any(needs_spark(b.text) for b in file_blocks) and spark_missing():
        pytest.skip("pyspark is not installed")
    monkeypatch.chdir(ROOT)
    namespace: dict[str, object] = {"__name__": f"docs_{path.stem}"}
    for b in file_blocks:
        code = compile(b.text, f"{b.id}", "exec")
        exec(code, namespace)  # the project's own documentation, not user input


def test_every_doc_is_found() -> None:
    names = {p.name for p in DOCS}
    assert {"README.md", "semantics.md", "architecture.md"} <= names


def test_architecture_names_every_package_and_each_package_its_modules() -> None:
    """docs/architecture.md names every package (or top-level module); each package's docstring names its modules."""
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    for pkg in ("yfpp", "xpath_ext"):
        for path in sorted((ROOT / pkg).rglob("*.py")):
            rel = path.relative_to(ROOT)
            if path.name == "__init__.py" and rel.parent.as_posix() != "yfpp":
                continue
            covered = f"`{rel.as_posix()}`" in text or any(f"`{p.as_posix()}/`" in text for p in rel.parents)
            assert covered, f"docs/architecture.md does not mention {rel}"
            init = path.parent / "__init__.py"
            if rel.parent.as_posix() not in ("yfpp", "xpath_ext") and path != init:
                assert f"`{path.stem}`" in init.read_text(encoding="utf-8"), f"{init} does not name `{path.stem}`"


def test_output_matching_rules() -> None:
    assert output_matches(["a", "...", "d"], ["a", "b", "c", "d"])
    assert output_matches(["a", "...", "d"], ["a", "d"])
    assert output_matches(["..."], [])
    assert not output_matches(["a", "d"], ["a", "b", "d"])
    assert not output_matches(["a"], ["a", "b"])
