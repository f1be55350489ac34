"""The line scan's kernels imported from a copy in the machine's cache (:mod:`yfpp.spark.machine_cache`): one copy
per source, written whole even when processes write it at once, imported in place where it cannot be written, and
numba's cache beside it serving the next process. No Spark."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from yfpp.spark import line_kernels
from yfpp.spark.machine_cache import cache_folder, import_stable, stable_copy

#: A module with one kernel that numba caches: tiny, so that compiling it costs little.
KERNEL = """from numba import njit


@njit(cache=True)
def twice(x):
    return 2 * x
"""


@pytest.fixture
def package(tmp_path, monkeypatch) -> Path:
    """A package ``kernelpkg`` on the path whose module ``kern`` holds :data:`KERNEL`."""
    pkg = tmp_path / "src" / "kernelpkg"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "kern.py").write_text(KERNEL)
    monkeypatch.syspath_prepend(str(pkg.parent))
    return pkg


def test_the_cache_folder_follows_xdg_cache_home(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert cache_folder("kernels") == os.path.join(tmp_path, "yfpp", "kernels")
    monkeypatch.setenv("XDG_CACHE_HOME", "")
    assert cache_folder() == os.path.join(os.path.expanduser("~/.cache"), "yfpp")


def test_a_copy_is_written_once_per_source(tmp_path):
    path = stable_copy("yfpp.spark", "line_kernels.py", str(tmp_path))
    source = Path(line_kernels.__file__).read_bytes()
    assert Path(path).read_bytes() == source and Path(path).parent.parent == tmp_path
    written = os.stat(path)
    assert stable_copy("yfpp.spark", "line_kernels.py", str(tmp_path)) == path
    assert os.stat(path).st_ino == written.st_ino and os.stat(path).st_mtime_ns == written.st_mtime_ns
    Path(path).write_bytes(source[:100])  # a copy that is not the source's (by hand): written again
    assert stable_copy("yfpp.spark", "line_kernels.py", str(tmp_path)) == path and Path(path).read_bytes() == source
    assert sorted(os.listdir(Path(path).parent)) == ["line_kernels.py"]  # no part left


def test_writers_at_once_leave_one_whole_copy(tmp_path):
    """Python workers of executors on one machine may copy the same source at the same moment."""
    start, paths = threading.Barrier(8), []

    def copy() -> None:
        start.wait()
        paths.append(stable_copy("yfpp.spark", "line_kernels.py", str(tmp_path)))

    threads = [threading.Thread(target=copy) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(paths) == 8 and len(set(paths)) == 1
    assert Path(paths[0]).read_bytes() == Path(line_kernels.__file__).read_bytes()
    assert os.listdir(Path(paths[0]).parent) == ["line_kernels.py"]


def test_a_folder_that_cannot_be_written_imports_the_module_in_place(tmp_path, package):
    blocked = tmp_path / "a file, not a folder"
    blocked.write_text("")
    assert import_stable("kernelpkg.kern", str(blocked)) is sys.modules["kernelpkg.kern"]


def test_a_second_process_loads_the_kernel_compiled_by_the_first(tmp_path, package):
    """The copy's path stays the same from process to process, so numba's cache beside it does: the first
    process compiles the kernel and saves it, the next loads it (numba's own counts say which)."""
    root = tmp_path / "cache"
    code = ("import sys\nfrom yfpp.spark.machine_cache import import_stable\n"
            f"kern = import_stable('kernelpkg.kern', {str(root)!r})\n"
            "assert kern.twice(21) == 42\n"
            "print(kern.__name__, kern.__file__, sum(kern.twice.stats.cache_hits.values()),"
            " sum(kern.twice.stats.cache_misses.values()))")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(package.parent), os.getcwd()])}
    runs = [subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
            for _ in range(2)]
    assert [r.returncode for r in runs] == [0, 0], runs[-1].stderr
    (name, path, *first), (name2, path2, *second) = (r.stdout.split() for r in runs)
    folder = Path(path).parent
    assert name == name2 == f"kern_{folder.name}" and path == path2 and folder.parent == root
    assert first == ["0", "1"] and second == ["1", "0"]  # compiled and saved, then loaded
    assert any(p.suffix == ".nbc" for p in (folder / "__pycache__").iterdir())
