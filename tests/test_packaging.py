"""Packaging: the public import, the version, ``python -m yfpp``, and a wheel that carries the examples."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import yfpp
from yfpp import Engine, __version__
from yfpp.cli import main
from yfpp.errors import YfppError
from yfpp.examples import resolve

ROOT = Path(__file__).resolve().parent.parent


def test_engine_from_the_package():
    eng = Engine()
    eng.register("PATTERN SEQ(a x, b y)", name="q")
    eng.process({"type": "a", "ts": 1})
    assert eng.process({"type": "b", "ts": 2})[0]["bindings"] == {"x": [0], "y": [1]}


def test_version_everywhere(capsys):
    assert yfpp.__version__ == __version__ and __version__.count(".") == 2
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out == f"yfpp {__version__}\n"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "yfpp", "--version"], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0 and done.stdout == f"yfpp {__version__}\n"


def test_examples_are_listed_and_reachable(capsys):
    assert main(["examples"]) == 0
    listing = capsys.readouterr().out
    assert "shoplifting.sase" in listing and "sample_rfid.xml" in listing
    assert main(["run", "-q", "example:shoplifting.sase", "-i", "example:sample_rfid.xml"]) == 0
    assert capsys.readouterr().out.count('"query": "shoplifting"') > 3
    assert resolve("example:figure1_q1_shoplifting").endswith("figure1_q1_shoplifting.sase")
    assert resolve("queries/x.sase") == "queries/x.sase"
    with pytest.raises(YfppError, match="ambiguous: example:shoplifting.sase, example:shoplifting.xpe"):
        resolve("example:shoplifting")
    assert main(["run", "-q", "example:nope", "-i", "example:sample_rfid.xml"]) == 2
    assert "no example named 'nope'; 'yfpp examples' lists them" in capsys.readouterr().err


CTRL_C_WHILE_LOADING = """
import sys
class Interrupt:  # Ctrl-C arriving while the command's modules load
    def find_spec(self, name, path=None, target=None):
        if name == "yfpp.cli":
            raise KeyboardInterrupt
sys.meta_path.insert(0, Interrupt())
from yfpp.__main__ import main
sys.exit(main())
"""


def test_ctrl_c_while_the_command_loads_is_quiet():
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", CTRL_C_WHILE_LOADING], capture_output=True, text=True, env=env, timeout=60)
    assert (done.returncode, done.stdout, done.stderr) == (130, "", "")


IMPORTS_CHECK = """
import io, sys
from yfpp.input.readers import read_events
assert [e.type for e in read_events(io.BytesIO(b'{"type": "a", "ts": 1}\\n'), "jsonl")] == ["a"]
assert not (loaded := {"yfpp.engine", "yfpp.input.xml_reader", "lxml.etree", "lark"} & set(sys.modules)), loaded
from yfpp import Engine
Engine().register("PATTERN SEQ(a x, b y) WHERE [k]")
assert not (loaded := {"yfpp.sets.plan", "yfpp.sets.strategies", "xpath_ext.parser", "lxml.etree"} & set(sys.modules)), loaded
"""


def test_start_up_imports_only_what_is_needed():
    """Reading events does not load the engine, nor a JSON-lines run lxml; event sets and XPath only when used."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", IMPORTS_CHECK], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stderr


def test_wheel_carries_code_examples_license_and_metadata(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, src / name)
    for name in ("yfpp", "xpath_ext", "queries"):
        shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", str(src), "-w", str(tmp_path / "dist")],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    (wheel,) = (tmp_path / "dist").glob("yfpp-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for p in (ROOT / "queries").iterdir():
        assert f"yfpp/queries/{p.name}" in names
    for pkg in ("yfpp", "xpath_ext"):  # every module (a new subpackage must be listed in pyproject.toml)
        for p in (ROOT / pkg).rglob("*"):
            if p.is_file() and "__pycache__" not in p.parts:
                assert p.relative_to(ROOT).as_posix() in names
    meta = zipfile.ZipFile(wheel).read(f"yfpp-{__version__}.dist-info/METADATA").decode()
    assert f"Version: {__version__}" in meta and "License: MIT" in meta and "Project-URL" in meta
    assert "Requires-Dist: elementpath<6,>=4.4" in meta or "Requires-Dist: elementpath>=4.4,<6" in meta
    assert any(n.endswith("dist-info/LICENSE") for n in names)
    # installed outside the clone, the README's first command finds its files
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(site), str(wheel)],
                   check=True, capture_output=True, timeout=300)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"PYTHONPATH": str(site)}
    done = subprocess.run([sys.executable, "-m", "yfpp", "run", "-q", "example:shoplifting.sase", "-i", "example:sample_rfid.xml"],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert done.returncode == 0 and done.stdout.count('"query": "shoplifting"') > 3, done.stderr
