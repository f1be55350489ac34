"""The compiled kernel of :mod:`yfpp.workers.compiled` (numba; imported only where numba is installed).

It reads each line with :mod:`yfpp.spark.line_kernels`' test of a plain line, in one call a block (the
per-call costs of a scan that several numpy passes make, a tenth of a µs a line at 16 KiB blocks, left out).
Compiled on its first call in a process, or loaded from numba's cache (``cache=True``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from yfpp.spark.line_kernels import _CRC, _line, njit  # (numba as line_kernels loads it: without scipy)

_NEWLINE, _COMMA, _OPEN_LIST, _CLOSE_LIST = 10, 44, 91, 93


@njit(cache=True)
def owned_lines(b: Any, type_key: Any, ts_key: Any, key: Any, mul: int, div: int, n: int, cap: int,
                owners: Any, ts: Any, me: int, own: Any) -> tuple:
    """The lines of ``b`` (complete lines, the last ``\\n``-terminated): each one's ts and worker of ``n`` (its key's
    hash modulo ``n``) into ``ts`` and ``owners`` (as long as the lines), and the lines of worker ``me`` into ``own``
    (at least ``len(b) + 2`` bytes) as one JSON array, ``[`` the lines joined by ``,`` ``]``; the count of lines and
    the array's length. (-1, 0) at the first line that is not plain, over ``cap`` bytes, or whose ts is below the
    line's before."""
    hashes = np.zeros(1, np.int64)
    one = np.zeros(1, np.float64)
    start = 0
    li = 0
    at = 1
    own[0] = _OPEN_LIST
    for i in range(len(b)):
        if b[i] != _NEWLINE:
            continue
        if i - start > cap or not _line(b, start, i, type_key, ts_key, key, mul, div, _CRC, one, hashes, 0):
            return -1, 0
        if li and one[0] < ts[li - 1]:
            return -1, 0
        ts[li] = one[0]
        w = hashes[0] % n
        owners[li] = w
        if w == me:
            own[at:at + i - start] = b[start:i]
            at += i - start
            own[at] = _COMMA
            at += 1
        li += 1
        start = i + 1
    if at > 1:
        at -= 1  # (the comma after the last line)
    own[at] = _CLOSE_LIST
    return li, at + 1
