"""The workers' line scan compiled ahead of time (yfpp/workers/prebuilt.py): built once a machine, by two processes
at once if need be, then loaded without numba; a failed build is remembered and numba's JIT kernel serves instead.
That it scans as the JIT kernel does is checked with the compiled scan's property tests (test_workers_reading.py)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

import yfpp.workers.compiled
from yfpp.input.readers import reading_options
from yfpp.spark import line_scan
from yfpp.workers import prebuilt
from yfpp.workers.compiled import load_kernel, plain_head_spec

HEAD = b'{"type": "a", "ts": 1, "k": 2}\n{"type": "b", "ts": 2, "k": "x"}\n'
needs_numba = pytest.mark.skipif(not line_scan.available(), reason="numba is not installed")

LOAD = f"""
import sys
from yfpp.input.readers import reading_options
from yfpp.spark.plan import value_hash
from yfpp.workers import compiled, reading
opts = reading_options()
spec = compiled.plain_head_spec({HEAD!r}, opts, "k", build=False)
assert spec is not None
assert compiled.owned({HEAD!r}, spec, 2, 1000, 0)[1] == reading.scan({HEAD!r}, opts, ["k"], 2, value_hash).owners[0]
print(sorted({{m.split(".")[0] for m in sys.modules}} & {{"numba", "llvmlite", "scipy"}}))
"""


@needs_numba
@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler to build the prebuilt kernel with")
def test_two_processes_build_the_kernel_at_once_and_a_third_loads_it_without_numba(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "XDG_CACHE_HOME": str(tmp_path)}
    build = "from yfpp.workers import prebuilt; assert prebuilt.build() is not None"
    builders = [subprocess.Popen([sys.executable, "-c", build], env=env) for _ in range(2)]
    try:
        assert [p.wait(300) for p in builders] == [0, 0]
    finally:
        for p in builders:
            if p.poll() is None:
                p.kill()
    made = os.listdir(tmp_path / "yfpp" / "kernels")
    assert len(made) == 1 and made[0].startswith("prebuilt-")  # (one module, no build folder left)
    assert [f for f in os.listdir(tmp_path / "yfpp" / "kernels" / made[0])] == [
        f"{prebuilt.module_name()}{prebuilt.sysconfig.get_config_var('EXT_SUFFIX')}"]
    loaded = subprocess.run([sys.executable, "-c", LOAD], env=env, check=True, timeout=120, capture_output=True,
                            text=True)
    assert loaded.stdout.strip() == "[]"  # (neither numba nor LLVM loaded)


@needs_numba
def test_a_failed_build_is_kept_and_not_tried_again_and_the_jit_kernel_serves(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delitem(sys.modules, prebuilt.module_name(), raising=False)  # (loaded by another test: not here)
    tries = []

    def failing(name: str, work: str) -> str:
        tries.append(name)
        raise RuntimeError("no compiler here")

    monkeypatch.setattr(prebuilt, "_compile", failing)
    assert prebuilt.build() is None and prebuilt.build() is None and len(tries) == 1
    failed = os.path.join(prebuilt.folder(prebuilt.module_name()), prebuilt.FAILED)
    assert open(failed).read() == "RuntimeError: no compiler here\n"
    assert [f for f in os.listdir(os.path.dirname(failed)) if f.startswith(".build-")] == []  # (its folder gone)
    monkeypatch.setattr(yfpp.workers.compiled, "_loaded", [])
    assert not load_kernel(build=False)  # (not built: only a run that may build it takes the compiled scan)
    from yfpp.workers.compiled_kernels import owned_lines

    assert plain_head_spec(HEAD, reading_options(), "k") is not None
    assert yfpp.workers.compiled._loaded == [(owned_lines, owned_lines)] and len(tries) == 1


def test_without_numba_there_is_no_module_to_build_or_load(monkeypatch):
    monkeypatch.setattr(prebuilt.metadata, "version", lambda name: (_ for _ in ()).throw(
        prebuilt.metadata.PackageNotFoundError(name)))
    assert prebuilt.module_name() is None and prebuilt.load() is None and prebuilt.build() is None
