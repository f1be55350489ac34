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
import stat
import sys
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, BinaryIO, Iterable

import orjson

from yfpp.errors import YfppError

FLUSH_LINES = 1000
FLUSH_SECONDS = 0.5

# orjson's text byte for byte with the digits 1-9 read as 0 (a float orjson writes unlike Python's repr has an
# exponent — 1e16, repr 1e+16 — or is below 10⁻⁴ in fixed notation — 0.00001, repr 1e-05), and \x00 (which
# orjson never writes: it escapes control characters) for what it writes unlike json.dumps: non-ASCII, DEL
# and backslashes (its escapes)
_CHECK = bytes.maketrans(b"123456789\\\x7f" + bytes(range(0x80, 0x100)), b"000000000" + b"\x00" * 130)
_NOT_QUOTE_OR_SEPARATOR = bytes(c for c in range(256) if c not in b'",:')


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
    that is certain to give the same text — every character printable ASCII but a backslash (no
    escape in it), no string holding ``,`` or ``:`` (so each comma and colon is a separator), no
    number orjson writes unlike ``repr`` nor a ``null`` that ``json`` would write as
    ``NaN``/``Infinity``; else the standard library's. The checks are a few whole-text byte
    operations, not a walk of the match."""
    try:
        text = orjson.dumps(match, option=orjson.OPT_APPEND_NEWLINE)
    except TypeError:  # orjson.JSONEncodeError: an integer beyond 64 bits, a key that is not a string…
        return (json.dumps(match) + "\n").encode()
    # (read as str: a str ``in`` parses no arguments, where a bytes ``find`` does and a bytes ``in`` first tries
    # its operand as an integer, making and dropping an error)
    check = text.translate(_CHECK).decode("ascii")
    if "\x00" in check:
        return (json.dumps(match) + "\n").encode()
    # the match id, 16 hex digits, is left out of the number checks (its digits read as 0s often hold a
    # "0e"); what is left out must be string content: a closing quote right after it and none in it
    head, key, tail = check.partition('"id":"')
    if key and tail[16:17] == '"' and '"' not in tail[:16]:
        check = head + key + tail[16:]
    if ((_plain_numbers(check) or _plain_numbers("".join(check.split('"')[::2])))
            and '"' not in text.translate(None, _NOT_QUOTE_OR_SEPARATOR).decode("ascii").replace('""', "")):
        # (the last test: with every byte but quotes, commas and colons deleted, a string is "" unless it
        # holds a comma or colon — consecutive strings always have a separator between them)
        return text.replace(b",", b", ").replace(b":", b": ")
    return (json.dumps(match) + "\n").encode()


def _plain_numbers(check: str) -> bool:
    """No exponent, no ``0.0000…`` and no ``null`` in ``check`` (digits read as 0s; strings left in, this
    may refuse a text whose strings look like that: the caller then looks outside the strings). Neither
    orjson nor ``repr`` writes an exponent ``E``."""
    return "0e" not in check and "0.0000" not in check and "null" not in check


def iso_time(ts: float) -> str:
    """Seconds since the epoch as ISO-8601 UTC, ``2026-11-22T10:00:00Z`` (fraction only when there is one)."""
    text = datetime.fromtimestamp(ts, timezone.utc).isoformat()
    return text.removesuffix("+00:00").removesuffix(".000000") + "Z"


def encode_match(match: dict[str, Any], iso_times: bool = False) -> bytes:
    """A match's line as :class:`MatchWriter` writes it (``iso_times``: ``start`` and ``end`` as ISO-8601 UTC)."""
    if iso_times:
        match = {**match, "start": iso_time(match["start"]), "end": iso_time(match["end"])}
    return match_line(match)


@dataclass(frozen=True)
class LineEncoder:
    """How another process (a worker) encodes its matches for a writer's ``write_encoded``, so the writer only writes
    bytes: the lines joined, or (``keyed``, for :class:`yfpp.output.ordered.OrderedMatches`) each line with its
    order key ``(end, query, start, id, line)``."""

    iso_times: bool = False
    keyed: bool = False

    def encode(self, matches: list[dict[str, Any]]) -> Any:
        iso = self.iso_times
        if self.keyed:
            return [(m["end"], str(m["query"]), m["start"], m["id"], encode_match(m, iso)) for m in matches]
        return b"".join([encode_match(m, iso) for m in matches])


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

    @property
    def encoder(self) -> LineEncoder:
        """How a worker encodes matches for :meth:`write_encoded`."""
        return LineEncoder(self.iso_times)

    def write(self, match: dict[str, Any]) -> None:
        self.write_encoded(encode_match(match, self.iso_times), 1)

    def write_encoded(self, lines: bytes, count: int) -> None:
        """``count`` match lines encoded already (:class:`LineEncoder`), written at once."""
        self.stream.write(lines)
        self.count += count
        if self.line_flush:
            self.stream.flush()
            return
        self._pending += count
        if self._pending >= FLUSH_LINES or time.monotonic() - self._last_flush >= FLUSH_SECONDS:
            self.flush()

    def extend(self, matches: Iterable[dict[str, Any]]) -> None:
        """:meth:`write` each match: :meth:`Engine.process_batch` and :meth:`Engine.flush` write into this as
        matches are made, so no more than one event's matches of an ordinary query, or one search's of an
        event-set query, are held."""
        write = self.write
        for match in matches:
            write(match)

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
