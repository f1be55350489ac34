"""Where ``yfpp run`` writes its matches, and when it flushes them.

A live feed (input from a pipe, socket or terminal — anything but a regular
file) or a terminal on the output gets each match line flushed as soon as it is
written, so a consumer sees a match as it happens. A file-to-file or
file-to-pipe run is buffered and flushed when :data:`FLUSH_LINES` lines are
pending or :data:`FLUSH_SECONDS` have passed since the last flush (checked at
each match), and at the end.

A match line is exactly ``json.dumps(match)`` (ASCII, ``", "`` and ``": "``
separators) and a newline; :func:`match_line` gets it from orjson's compact
bytes when that is certain to give the same text.
"""

from __future__ import annotations

import json
import os
import re
import stat
import sys
import time
from datetime import datetime, timezone
from typing import Any, BinaryIO

import orjson

from yfpp.errors import YfppError

FLUSH_LINES = 1000
FLUSH_SECONDS = 0.5

# a float orjson writes unlike Python's repr: with an exponent (1e16 → "1e16", repr "1e+16"), or
# below 10⁻⁴ in fixed notation (orjson "0.00001", repr "1e-05")
_ODD_FLOAT = re.compile(rb"[0-9][eE]|0\.0000")


def is_live_input(source: str) -> bool:
    """Whether ``source`` (a path or ``-``) is anything but a regular file."""
    try:
        mode = os.fstat(sys.stdin.fileno()).st_mode if source == "-" else os.stat(source).st_mode
    except (OSError, ValueError):
        return True
    return not stat.S_ISREG(mode)


def check_writable(path: str, what: str) -> None:
    """Raise a :class:`YfppError` a person understands when ``path``'s directory does not exist."""
    directory = os.path.dirname(path) or "."
    if not os.path.isdir(directory):
        raise YfppError(f"cannot write {what} {path}: directory {directory} does not exist")


def open_for_writing(path: str, what: str, binary: bool = False) -> Any:
    """``open(path, "w")`` (``"wb"`` if ``binary``) with an error a person understands (``what``:
    "output", "dead-letter file")."""
    check_writable(path, what)
    try:
        return open(path, "wb") if binary else open(path, "w", encoding="utf-8")
    except OSError as e:
        raise YfppError(f"cannot write {what} {path}: {e.strerror or e}") from e


def match_line(match: dict[str, Any]) -> bytes:
    """``json.dumps(match) + "\\n"`` as bytes: orjson's compact text with the separators widened when
    every string in it is printable ASCII without ``"``, ``\\``, ``,`` or ``:`` (so a comma or colon
    in it is a separator), and no number in it is one orjson writes unlike ``repr`` nor a ``null``
    that ``json`` would write as ``NaN``/``Infinity``; else the standard library's."""
    try:
        compact = orjson.dumps(match)
    except TypeError:  # orjson.JSONEncodeError: an integer beyond 64 bits, a key that is not a string…
        compact = b"\\"
    if compact.isascii() and b"\\" not in compact and b"\x7f" not in compact:
        parts = compact.split(b'"')
        strings, rest = b"".join(parts[1::2]), b"".join(parts[::2])
        if b"," not in strings and b":" not in strings and b"null" not in rest and _ODD_FLOAT.search(rest) is None:
            return compact.replace(b",", b", ").replace(b":", b": ") + b"\n"
    return (json.dumps(match) + "\n").encode()


def iso_time(ts: float) -> str:
    """Seconds since the epoch as ISO-8601 UTC, ``2026-11-22T10:00:00Z`` (fraction only when there is one)."""
    text = datetime.fromtimestamp(ts, timezone.utc).isoformat()
    return text.removesuffix("+00:00").removesuffix(".000000") + "Z"


class MatchWriter:
    """Writes matches as JSON lines to ``out`` (``None``: stdout), flushing per the module's rule."""

    def __init__(self, out: str | None, *, live_input: bool, iso_times: bool = False):
        self._owned = out is not None
        if out is None:
            sys.stdout.flush()  # anything printed before goes first
        self.stream: BinaryIO = open_for_writing(out, "output", binary=True) if out is not None else sys.stdout.buffer
        self.line_flush = live_input or self.stream.isatty()
        self.iso_times = iso_times
        self.count = 0
        self._pending = 0
        self._last_flush = time.monotonic()

    def write(self, match: dict[str, Any]) -> None:
        if self.iso_times:
            match = {**match, "start": iso_time(match["start"]), "end": iso_time(match["end"])}
        self.stream.write(match_line(match))
        self.count += 1
        if self.line_flush:
            self.stream.flush()
            return
        self._pending += 1
        if self._pending >= FLUSH_LINES or time.monotonic() - self._last_flush >= FLUSH_SECONDS:
            self.flush()

    def flush(self) -> None:
        self.stream.flush()
        self._pending = 0
        self._last_flush = time.monotonic()

    def close(self) -> None:
        """Flush, and close the file if this writer opened it."""
        try:
            self.flush()
        finally:
            if self._owned:
                self.stream.close()
