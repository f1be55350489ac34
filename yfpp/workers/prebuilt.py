"""The workers' line scan compiled ahead of time: an extension module kept on the machine, loaded without numba.

Loading numba and its cached kernel (:mod:`yfpp.workers.compiled_kernels`) costs the process that forks the workers
of ``yfpp run --workers N`` about 0.6 s before they can start, and about 0.2 s more as it exits (numba's and LLVM's
teardown): time no worker runs in. numba's ``pycc`` compiles the same kernel once into an extension module kept under
``$XDG_CACHE_HOME/yfpp/kernels/prebuilt-<key>/`` (:func:`~yfpp.spark.machine_cache.cache_folder`; ``<key>``: a hash
of the kernels' sources, numba's version and this Python's ABI), which each later run imports in about a millisecond,
with numpy and without numba (:func:`load`).

:func:`build` makes the module: it needs numba, setuptools and a C compiler with Python's headers, and takes about
ten seconds, as numba's first compile of the JIT kernel does. It is built in a folder of its own and renamed into
place, so two processes may build it at once. A build that fails leaves its reason in ``failed.txt`` beside where the
module would be, and is not tried again for the same key: the workers then use numba's JIT kernel, as without it.
(``pycc`` is pending deprecation in numba: where a numba has none, the build fails so, once.)
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import pkgutil
import platform
import shutil
import sys
import sysconfig
import tempfile
import warnings
from importlib import metadata
from types import ModuleType

from yfpp.spark.machine_cache import cache_folder

#: each export's numba signature: owners of a byte (up to 256 workers) or of four
_ARGS = "u1[::1], u1[::1], u1[::1], u1[::1], i8, i8, i8, i8, {owners}[::1], f8[::1], i8, u1[::1]"
EXPORTS = {"owned_u8": f"Tuple((i8, i8))({_ARGS.format(owners='u1')})",
           "owned_u32": f"Tuple((i8, i8))({_ARGS.format(owners='u4')})"}
FAILED = "failed.txt"  #: the reason a build failed, beside where the module would be


def module_name() -> str | None:
    """The module's name, ``yfpp_owned_<key>``; None where numba is not installed (nothing to build it with, and
    no version to know a built one by)."""
    try:
        numba_version = metadata.version("numba")
    except metadata.PackageNotFoundError:
        return None
    digest = hashlib.sha256()
    for package, filename in (("yfpp.workers", "compiled_kernels.py"), ("yfpp.spark", "line_kernels.py")):
        digest.update(pkgutil.get_data(package, filename) or b"")
    abi = (sys.implementation.cache_tag, platform.machine(), sysconfig.get_config_var("EXT_SUFFIX"))
    for part in (numba_version, *abi):
        digest.update(f"\0{part}".encode())
    return f"yfpp_owned_{digest.hexdigest()[:16]}"


def folder(name: str) -> str:
    """Where the module ``name`` is kept."""
    return cache_folder("kernels", f"prebuilt-{name.rpartition('_')[2]}")


def load() -> ModuleType | None:
    """The built module, imported (once a process); None where it is not built."""
    name = module_name()
    return None if name is None else _load(name)


def _load(name: str) -> ModuleType | None:
    """Module ``name`` (:func:`module_name`), imported from :func:`folder` where it is built; else None."""
    if name in sys.modules:
        return sys.modules[name]
    path = os.path.join(folder(name), name + (sysconfig.get_config_var("EXT_SUFFIX") or ".so"))
    if not os.path.isfile(path):
        return None
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        return None
    loaded = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(loaded)
    except ImportError:  # (a file that is not this Python's: not used)
        return None
    sys.modules[name] = loaded
    return loaded


def build() -> ModuleType | None:
    """The module, built here unless it is built already or a build of it failed before (:data:`FAILED`); None where
    it cannot be built."""
    name = module_name()
    if name is None:
        return None
    built = _load(name)
    target = folder(name)
    if built is not None or os.path.exists(os.path.join(target, FAILED)):
        return built
    try:
        os.makedirs(target, exist_ok=True)
        work = tempfile.mkdtemp(dir=target, prefix=".build-")
    except OSError:
        return None
    try:
        path = _compile(name, work)
        os.replace(path, os.path.join(target, os.path.basename(path)))
    except Exception as e:  # (no compiler, no headers, no pycc: numba's JIT kernel serves)
        with open(os.path.join(target, FAILED), "w") as f:
            f.write(f"{type(e).__name__}: {e}\n")
        return None
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return _load(name)


def _compile(name: str, work: str) -> str:
    """The path of module ``name`` compiled by numba's ``pycc`` in the folder ``work``."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (pycc's pending deprecation; setuptools' notes)
        from numba.pycc import CC

        from yfpp.workers.compiled_kernels import owned_lines

        cc = CC(name)
        cc.output_dir = work
        cc.verbose = False
        for export, signature in EXPORTS.items():
            cc.export(export, signature)(owned_lines.py_func)
        cc.compile()
    made = [f for f in os.listdir(work) if f.startswith(name + ".") and f.endswith((".so", ".pyd"))]
    if len(made) != 1:
        raise RuntimeError(f"pycc made {made or 'nothing'} in {work}")
    return os.path.join(work, made[0])
