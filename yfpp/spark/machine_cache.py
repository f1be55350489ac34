"""What yfpp keeps on a machine from one application to the next, under ``$XDG_CACHE_HOME/yfpp`` (``~/.cache``).

The compiled kernels of the line scan (:mod:`yfpp.spark.line_kernels`) are imported from a copy of their source
kept here (:func:`import_stable`). numba caches a kernel beside its source file, or under a folder named by
that file's path, and checks the cache against a hash of the source. An executor imports yfpp from the zip
that ``yfpp spark`` ships (:mod:`yfpp.spark.shipping`), which lies in a folder of its own for every
application — so, imported from there, every executor of every job compiled the kernels again. The copy's
path depends only on the source (``kernels/<its hash>/``): the first Python worker on a machine compiles
the kernels, the later ones, of any application, load them.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import pkgutil
import sys
import tempfile
from contextlib import suppress
from types import ModuleType


def cache_folder(*parts: str) -> str:
    """``$XDG_CACHE_HOME/yfpp/<parts>`` (``~/.cache`` when the variable is unset or empty)."""
    return os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "yfpp", *parts)


def stable_copy(package: str, filename: str, root: str | None = None) -> str:
    """The path of a copy of ``filename`` of ``package`` (read as the package's resource, so from a zip too)
    in ``<root>/<hash of its bytes>/`` (default ``cache_folder("kernels")``), written there unless an equal
    copy is there already. Written under a temporary name and renamed: Python workers of two executors of
    one machine may write it at once, and none reads a part. OSError where the folder cannot be written."""
    data = pkgutil.get_data(package, filename)
    if data is None:
        raise OSError(f"{package} has no resource {filename}")
    folder = os.path.join(root or cache_folder("kernels"), hashlib.sha256(data).hexdigest()[:16])
    target = os.path.join(folder, filename)
    with suppress(OSError), open(target, "rb") as f:
        if f.read() == data:
            return target
    os.makedirs(folder, exist_ok=True)
    fd, part = tempfile.mkstemp(dir=folder, prefix=f".{filename}.", suffix=".part")
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        os.replace(part, target)
    except BaseException:
        with suppress(OSError):
            os.unlink(part)
        raise
    return target


def import_stable(module: str, root: str | None = None) -> ModuleType:
    """Module ``module`` (a file of a package that imports no module of its own package) imported from its
    :func:`stable_copy` under ``root``, as ``<its name>_<hash>`` (numba finds a cached kernel's module by that
    name); imported in place when the copy cannot be written or does not import (numba finding no folder it
    may write its cache to)."""
    package, _, name = module.rpartition(".")
    try:
        path = stable_copy(package, f"{name}.py", root)
    except OSError:
        return importlib.import_module(module)
    alias = f"{name}_{os.path.basename(os.path.dirname(path))}"
    if alias in sys.modules:
        return sys.modules[alias]
    spec = importlib.util.spec_from_file_location(alias, path)
    assert spec is not None and spec.loader is not None
    loaded = sys.modules[alias] = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(loaded)
    except Exception:  # (numba's "cannot cache function …: no locator available", a read-only copy's folder)
        del sys.modules[alias]
        return importlib.import_module(module)
    return loaded
