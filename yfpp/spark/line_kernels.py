"""The compiled kernels of :mod:`yfpp.spark.line_scan` (numba; imported only where numba is installed).

Each is compiled on its first call in a process, or loaded from numba's cache (``cache=True``: next to this
file, or under ``NUMBA_CACHE_DIR``, or the user's cache folder when this file's folder cannot be written). The
line scan imports this file from a copy in the machine's cache (:mod:`yfpp.spark.machine_cache`), so its
compiled kernels serve every application on the machine — of a shipped zip too. The file imports nothing of
yfpp (the copy is imported alone).
"""

from __future__ import annotations

import importlib
import importlib.abc
import sys
from typing import Any, Sequence

import numpy as np


class _Refused(importlib.abc.MetaPathFinder):
    """An import finder that finds none of ``packages``' modules: each import of them raises ``ImportError``."""

    def __init__(self, packages: Sequence[str]):
        self.packages = packages

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> None:
        if fullname.partition(".")[0] in self.packages:
            raise ModuleNotFoundError(f"{fullname} is not loaded with numba here", name=fullname)
        return None


# numba imports scipy as it loads (a version check) and scipy.linalg at its first compile or cache load (a check
# that np.linalg has a BLAS, in numba.np.arraymath): about 0.3 CPU s of the 0.9 that loading a kernel costs
# (benchmarks/RESULTS.md, "Workers"), for functions the kernels never call. Both are made here, as this module
# loads, with scipy refused: numba takes it as not installed, so compiled code of this process has no np.linalg
# (none of yfpp's uses it); scipy itself imports as usual afterwards.
_refused = _Refused(("scipy",))
sys.meta_path.insert(0, _refused)
try:
    from numba import njit
    importlib.import_module("numba.np.arraymath")  # (its BLAS check, run as it is imported)
finally:
    sys.meta_path.remove(_refused)

_SPACE, _TAB, _QUOTE, _COMMA, _COLON, _OPEN, _CLOSE = 32, 9, 34, 44, 58, 123, 125
_BACKSLASH, _MINUS, _ZERO, _NINE, _POINT, _BRACKET = 92, 45, 48, 57, 46, 91
_EXACT = 1 << 53  # the largest scaled ts a float holds exactly (and so divides as Python's int / int rounds)


def _crc_table() -> np.ndarray:
    """CRC-32's (zlib's) byte table."""
    table = np.empty(256, np.uint32)
    for i in range(256):
        c = i
        for _ in range(8):
            c = (0xEDB88320 ^ (c >> 1)) if c & 1 else c >> 1
        table[i] = c
    return table


_CRC = _crc_table()


@njit(cache=True)
def scan(b: Any, ends: Any, type_key: Any, ts_key: Any, key: Any, mul: int, div: int) -> tuple:
    """Over ``b``'s lines (ending at ``ends``: the offset after each ``\\n``): whether each is plain (1), its ts and
    its key's hash (see :mod:`yfpp.spark.line_scan`; 0 for a line that is not plain)."""
    lines = len(ends)
    plain = np.zeros(lines, np.uint8)
    ts = np.zeros(lines, np.float64)
    hashes = np.zeros(lines, np.int64)
    table = _CRC
    start = 0
    for li in range(lines):
        end = ends[li] - 1
        plain[li] = _line(b, start, end, type_key, ts_key, key, mul, div, table, ts, hashes, li)
        start = end + 1
    return plain, ts, hashes


@njit(cache=True)
def _same(b: Any, start: int, end: int, name: Any) -> bool:
    if end - start != len(name):
        return False
    for k in range(len(name)):
        if b[start + k] != name[k]:
            return False
    return True


@njit(cache=True)
def _odd(c: int) -> bool:
    """Is byte ``c`` one a plain line's strings lack: a backslash, a control character, no ASCII, or a
    brace or bracket (the reader's bulk path counts those to find flat objects)?"""
    return c == _BACKSLASH or c < _SPACE or c > 126 or c == _OPEN or c == _CLOSE or c == _BRACKET


@njit(cache=True)
def _blanks(b: Any, i: int, end: int) -> int:
    while i < end and (b[i] == _SPACE or b[i] == _TAB):
        i += 1
    return i


@njit(cache=True)
def _line(b: Any, s: int, e: int, type_key: Any, ts_key: Any, key: Any, mul: int, div: int, table: Any,
          ts: Any, hashes: Any, li: int) -> int:
    """1 if bytes ``s`` to ``e`` are a plain line (its ts and key hash written at ``li``), else 0."""
    if e - s < 2 or b[s] != _OPEN or b[e - 1] != _CLOSE:
        return 0
    e -= 1  # the closing brace
    i = _blanks(b, s + 1, e)
    seen_type = seen_ts = seen_key = 0
    while True:
        if i >= e or b[i] != _QUOTE:  # a field name
            return 0
        k0 = i = i + 1
        while i < e and b[i] != _QUOTE:
            if _odd(b[i]):
                return 0
            i += 1
        if i >= e:
            return 0
        k1 = i
        i = _blanks(b, i + 1, e)
        if i >= e or b[i] != _COLON:
            return 0
        i = _blanks(b, i + 1, e)
        if i >= e:
            return 0
        which = 0
        if _same(b, k0, k1, type_key):
            which = 1
            seen_type += 1
        elif _same(b, k0, k1, ts_key):
            which = 2
            seen_ts += 1
        elif _same(b, k0, k1, key):
            which = 3
            seen_key += 1
        c = b[i]
        if c == _QUOTE:  # a string
            v0 = i = i + 1
            h = np.uint32(0xFFFFFFFF)
            while i < e and b[i] != _QUOTE:
                c = b[i]
                if _odd(c):
                    return 0
                if which == 3:
                    h = table[(h ^ c) & 0xFF] ^ (h >> 8)
                i += 1
            if i >= e or which == 2 or (which == 1 and i == v0):
                return 0
            if _same(b, v0, i, type_key) or _same(b, v0, i, ts_key):  # the reader's bulk path counts the names
                return 0
            if which == 3:
                hashes[li] = np.int64(h ^ np.uint32(0xFFFFFFFF))
            i += 1
        elif c == _MINUS or _ZERO <= c <= _NINE:  # a number
            if which == 1:
                return 0
            negative = c == _MINUS
            if negative:
                i += 1
            d0 = i
            v = np.int64(0)
            if i < e and b[i] == _ZERO:
                i += 1
            else:
                while i < e and _ZERO <= b[i] <= _NINE:
                    v = v * 10 + np.int64(b[i] - _ZERO)
                    i += 1
            digits = i - d0
            if digits == 0 or digits > 18:
                return 0
            fraction = i < e and b[i] == _POINT
            if fraction:
                i += 1
                f0 = i
                while i < e and _ZERO <= b[i] <= _NINE:
                    i += 1
                if i == f0:
                    return 0
            if i < e and (b[i] == 101 or b[i] == 69):  # e, E: an exponent
                return 0
            if negative:
                v = -v
            if which == 2:
                if fraction or digits > 15 or abs(v * mul) > _EXACT:
                    return 0
                ts[li] = np.float64(v * mul) / div
            elif which == 3:
                if fraction:
                    return 0
                hashes[li] = -2 if v == -1 else v  # Python's hash of an int below 2**61 - 1
        elif c == 116 and which == 0 and i + 4 <= e and b[i + 1] == 114 and b[i + 2] == 117 and b[i + 3] == 101:
            i += 4  # true
        elif (c == 102 and which == 0 and i + 5 <= e and b[i + 1] == 97 and b[i + 2] == 108 and b[i + 3] == 115
              and b[i + 4] == 101):
            i += 5  # false
        else:
            return 0
        i = _blanks(b, i, e)
        if i == e:
            break
        if b[i] != _COMMA:
            return 0
        i = _blanks(b, i + 1, e)
    return 1 if seen_type == 1 and seen_ts == 1 and seen_key == 1 else 0


@njit(cache=True)
def group(b: Any, first: int, ends: Any, tasks: Any, ts: Any, seq: int, n: int, head: int) -> tuple:
    """The lines ending at ``ends`` (the first beginning at ``first``) grouped by their ``tasks``, in order, a blob
    a task one after the other: its ``head`` bytes (the line count, int32, and the first line's ts of ``ts``,
    float64), the lines' record indexes (``seq`` on, int32 each) and their bytes — and each task's blob bounds
    (``n + 1``; a task without lines: none)."""
    lines = len(ends)
    count = np.zeros(n, np.int64)
    size = np.zeros(n, np.int64)
    start = first
    for li in range(lines):
        count[tasks[li]] += 1
        size[tasks[li]] += ends[li] - start
        start = ends[li]
    blob_at = np.zeros(n + 1, np.int64)
    for t in range(n):
        blob_at[t + 1] = blob_at[t] + (head + 4 * count[t] + size[t] if count[t] else 0)
    out = np.empty(blob_at[n], np.uint8)
    at_pos = blob_at[:n] + head
    at_byte = at_pos + 4 * count
    word = np.empty(1, np.int32)
    low = np.empty(1, np.float64)
    start = first
    for li in range(lines):
        t = tasks[li]
        if at_pos[t] == blob_at[t] + head:  # the task's first line: its blob's head
            word[0] = count[t]
            out[blob_at[t]:blob_at[t] + 4] = word.view(np.uint8)
            low[0] = ts[li]
            out[blob_at[t] + 4:blob_at[t] + head] = low.view(np.uint8)
        word[0] = seq + li
        out[at_pos[t]:at_pos[t] + 4] = word.view(np.uint8)
        at_pos[t] += 4
        size = ends[li] - start
        o = at_byte[t]
        out[o:o + size] = b[start:ends[li]]
        at_byte[t] = o + size
        start = ends[li]
    return out, blob_at
