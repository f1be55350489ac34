"""Keyed workers over plain JSON lines: each worker scans every block itself with the compiled line scan.

Where every group of ``yfpp run --workers N`` is keyed by one attribute and the file's lines are plain
(:mod:`yfpp.spark.line_scan`: flat objects the reader's bulk path reads as events, the key a string or an
integer), finding each line's ts and its key's hash costs a compiled pass over the bytes, a fraction of a
parse: each worker then scans every block itself, just before it matches it (:class:`~yfpp.workers.reading.Relay`
``alone``: no scans sent between the workers), and parses only the lines whose key hashes to it. The hash is
:func:`~yfpp.spark.plan.value_hash` (CRC-32 of a string, Python's hash of a number), the one the kernel computes,
and the whole run routes by it: a block the scan does not take whole (a line that is not plain, ts going back, a
``\\r``) is scanned by the worker the slow way (:func:`~yfpp.workers.reading.scan`, with the same hash), and a
block parsed whole by every worker routes its events by it too (:meth:`~yfpp.workers.reading.Share._parsed`).

The kernel is the one :mod:`yfpp.workers.prebuilt` compiled ahead of time, where it is built (imported without numba:
the workers start about 0.6 s sooner), else numba's JIT kernel (:mod:`yfpp.workers.compiled_kernels`). numba is
optional (the ``spark`` extra): without it, or where the head of the file has a line that is not plain, the workers
relay their scans as :mod:`yfpp.workers.reading` describes.
"""

from __future__ import annotations

import functools
import importlib.util
from array import array
from typing import Callable

import numpy as np

from yfpp.input.record_fields import ReaderOptions
from yfpp.spark.line_scan import LineSpec
from yfpp.workers import prebuilt

HEAD_LINES = 64  #: the file's first lines that must be plain for the workers to scan every block themselves (0: none)


Kernel = Callable[..., tuple[int, int]]  #: the kernel's entry: owned_lines' arguments, its count and array length
_loaded: list[tuple[Kernel, Kernel]] = []  #: the kernel once loaded: its entries for owners of 1 byte and of 4


def plain_head_spec(head: bytes, opts: ReaderOptions, key: str, build: bool = True) -> LineSpec | None:
    """The scan's spec for key attribute ``key`` where the kernel loads (:func:`load_kernel`; ``build``: also where
    the prebuilt one is not built yet) and the complete lines of ``head`` (a file's first
    bytes), up to :data:`HEAD_LINES` of them, are plain (a file of other lines: the workers relay the slow scans
    rather than each make them); else None. Loads the kernel here, in the process that forks the workers, so that
    each has it."""
    spec = LineSpec.of(opts, key) if load_kernel(build) else None
    if spec is None:
        return None
    lines = head.split(b"\n")[:-1][:HEAD_LINES]  # (complete lines only)
    first = b"".join(line + b"\n" for line in lines)
    taken = owned(first or b'{"-": 0}\n', spec, 2, opts.max_record_bytes, 0)  # (the kernel loaded, whatever the head)
    return spec if not first or taken is not None else None


def owned(body: bytes, spec: LineSpec, n: int, cap: int, me: int) -> tuple[np.ndarray, bytes | array, bytes] | None:
    """Each line's ts and worker of ``n`` (compact, as :func:`~yfpp.workers.reading.owner_array` makes them), and the
    lines of worker ``me`` as one JSON array (the text of a list of their records), where the kernel takes every line
    of the block ``body`` — each plain, at most ``cap`` bytes, its ts not below the line's before — else None."""
    lines = body.count(b"\n")
    if not lines or body[-1] != 10 or b"\r" in body or not load_kernel():  # (a \r ends a line of the reader's too)
        return None
    ts, owners = np.empty(lines, np.float64), np.empty(lines, np.uint8 if n <= 256 else np.uint32)
    own = np.empty(len(body) + 2, np.uint8)
    kernel = _loaded[0][n > 256]
    taken, size = kernel(np.frombuffer(body, np.uint8), *_names(spec), spec.mul, spec.div, n, cap, owners, ts, me, own)
    if taken != lines:
        return None
    return ts, owners.tobytes() if n <= 256 else array("I", owners.tobytes()), own[:size].tobytes()


def load_kernel(build: bool = True) -> bool:
    """Whether the kernel is loaded (once a process): the prebuilt module (:mod:`yfpp.workers.prebuilt`), else, where
    ``build``, that module built here the first time or, where it cannot be built, numba's JIT kernel; False without
    numba (or where neither loads)."""
    if not _loaded:
        module = prebuilt.build() if build else prebuilt.load()
        if module is not None:
            _loaded.append((module.owned_u8, module.owned_u32))
        elif build and importlib.util.find_spec("numba") is not None:
            try:
                from yfpp.workers.compiled_kernels import owned_lines
            except ImportError:
                return False
            _loaded.append((owned_lines, owned_lines))
    return bool(_loaded)


@functools.cache
def _names(spec: LineSpec) -> tuple[np.ndarray, ...]:
    """The type, ts and key field names of ``spec`` as the kernel takes them."""
    return tuple(np.frombuffer(name, np.uint8) for name in (spec.type_field, spec.ts_field, spec.key))
