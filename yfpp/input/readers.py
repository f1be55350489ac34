"""Streaming event readers for XML and JSON lines (docs/semantics.md §1): sources, formats, the public functions.

Common to both readers:

* ``seq`` is the 0-based index of the record in the input, malformed records
  included, so it doubles as the record's position and the ``seq`` numbers of
  the good events may have gaps. (Blank JSON lines are not records.)
* ``ts`` is a float in seconds: the ``ts_field`` value (int, float or a numeric
  string) times the unit — ``s``, ``ms``, ``us``, ``ns`` are divided by 1,
  10³, 10⁶, 10⁹; ``min`` and ``h`` multiplied by 60 and 3600. The unit ``iso``
  reads ISO-8601 text instead (``2026-11-22T10:00:05Z``; no offset means UTC)
  as seconds since the epoch. A record whose ts is missing, non-numeric (not
  ISO-8601) or not finite is reported.
* The event type is the JSON field ``type`` / the XML element's local name;
  with ``type_field`` it is that JSON field / that XML attribute (or leaf
  child) instead, removed from the attributes like the ts field.
* Malformed records go to ``dead_letters`` (a :class:`DeadLetters`; by default
  one writing to stderr) with their position (``line N``) and the stream goes
  on. Caps: ``max_record_bytes`` (default 1 MiB) on one record,
  ``max_depth`` (default 64) on its nesting; a record over a cap is a dead letter.
  Only an unreadable input raises (:class:`InputError`): a file that cannot be
  opened, or a corrupt or truncated gzip stream — raised when reading reaches
  the damage, after every record before it was yielded, with the last line read.
  Input is read in blocks (16 KiB, or what a live feed has sent): the dead letters
  of a block's records are reported when it is read, before its events are handed on.
* Sources: a path, ``-`` (stdin) or a binary file object; gzip input is
  recognised by its magic bytes (any ``.gz`` file). Input is read with
  ``read1`` where available, so a live feed is read as its bytes arrive.

XML: :mod:`yfpp.input.xml_reader` (which elements are events, resynchronisation after
errors, DOCTYPE policy). An event's attributes are the element's attributes
(local names) and its leaf children without attributes (name → stripped text),
attributes winning over children and the first child over repeats; values are
typed int, then float, else str (``"true"`` stays a str). The element is kept
on the Event, detached from the rest of the input.

JSON lines: :mod:`yfpp.input.jsonl_reader` (line ends, flattening, numbers, duplicate keys).

In both formats the ts field is removed from the attributes; an attribute named
``type`` or ``seq`` is kept (and shadows that pseudo-attribute in ``Event.get``).
"""

from __future__ import annotations

import gzip
import os
import sys
from collections import deque
from typing import IO, Any, Callable, Iterator

from yfpp.input.dead_letters import DeadLetters
from yfpp.errors import InputError
from yfpp.input.events import Event
from yfpp.input.record_fields import MAX_DEPTH, MAX_RECORD_BYTES, TS_UNITS, ReaderOptions, typed_value, unit_factors

__all__ = ["FORMAT_BY_EXT", "TS_UNITS", "MAX_DEPTH", "MAX_RECORD_BYTES", "format_of", "read_event_batches",
           "read_events", "read_jsonl", "read_xml", "typed_value"]

Source = str | os.PathLike[str] | IO[Any]

FORMAT_BY_EXT = {".xml": "xml", ".jsonl": "jsonl", ".json": "jsonl", ".ndjson": "jsonl"}


def _sink(dead_letters: DeadLetters | None) -> DeadLetters:
    return dead_letters if dead_letters is not None else DeadLetters(sys.stderr)


def _open(source: Source) -> tuple[IO[Any], bool]:
    """(binary stream, whether to close it); gunzips gzip input; InputError if it cannot be opened."""
    try:
        if isinstance(source, (str, os.PathLike)) and source != "-":
            f: IO[Any] = open(source, "rb")
            if f.peek(2)[:2] != b"\x1f\x8b":
                return f, True
            f.close()
            return gzip.open(source, "rb"), True
        f = sys.stdin.buffer if source == "-" else source  # type: ignore[assignment]
        if not callable(getattr(f, "read", None)):
            raise InputError(f"read_events takes a path, '-' or a binary file object, not {type(source).__name__}"
                             + (" (wrap bytes in io.BytesIO)" if isinstance(source, (bytes, bytearray)) else ""))
        peek: Callable[[int], bytes] | None = getattr(f, "peek", None)
        if peek is not None and peek(2)[:2] == b"\x1f\x8b":
            return gzip.GzipFile(fileobj=f), True  # closing it leaves ``f`` open
        return f, False
    except OSError as e:
        raise InputError(f"cannot read {source!r}: {e.strerror or e}") from e


def format_of(source: Source) -> str | None:
    """``xml`` / ``jsonl`` from a path's (or file object's name's) extension, ignoring ``.gz``."""
    name = os.fspath(source) if isinstance(source, (str, os.PathLike)) else getattr(source, "name", "")
    name = str(name).lower().removesuffix(".gz")
    return FORMAT_BY_EXT.get(os.path.splitext(name)[1])


def read_events(
    path_or_file: Source,
    format: str | None = None,
    *,
    ts_field: str = "ts",
    ts_unit: str = "s",
    type_field: str | None = None,
    max_record_bytes: int = MAX_RECORD_BYTES,
    max_depth: int = MAX_DEPTH,
    dead_letters: DeadLetters | None = None,
) -> Iterator[Event]:
    """Events from ``path_or_file`` (``-`` is stdin) in ``format`` ``xml`` or ``jsonl``.

    Without ``format`` it comes from the extension (``.xml``, ``.jsonl``, ``.json``,
    ``.ndjson``, each optionally ``.gz``), else from the first non-blank byte
    (``<`` or ``{``) when the stream can be peeked.
    """
    held = _Held(_sink(dead_letters))
    return held.in_order(read_event_batches(
        path_or_file, format, ts_field=ts_field, ts_unit=ts_unit, type_field=type_field,
        max_record_bytes=max_record_bytes, max_depth=max_depth, dead_letters=held))  # type: ignore[arg-type]


def read_event_batches(
    path_or_file: Source,
    format: str | None = None,
    *,
    ts_field: str = "ts",
    ts_unit: str = "s",
    type_field: str | None = None,
    max_record_bytes: int = MAX_RECORD_BYTES,
    max_depth: int = MAX_DEPTH,
    dead_letters: DeadLetters | None = None,
) -> Iterator[list[Event]]:
    """:func:`read_events` a read block at a time: a list of the events of each block read (of the records
    it completes), for a caller that handles events in bulk (``yfpp run``). The dead letters of a block's
    records are reported as the block is read, before its events are handed on."""
    opts = reading_options(ts_field, ts_unit, type_field, max_record_bytes, max_depth)
    fmt = (format or format_of(path_or_file) or "").lower()
    if fmt and fmt not in _FORMATS:
        raise InputError(f"unknown input format {fmt!r}; expected xml or jsonl")
    f, owned = _open(path_or_file)
    if not fmt:
        peek = getattr(f, "peek", None)
        head = peek(4096).lstrip(b"\xef\xbb\xbf \t\r\n") if peek is not None else b""
        fmt = {b"<": "xml", b"{": "jsonl"}.get(head[:1], "")
        if not fmt:
            if owned:
                f.close()
            name = getattr(path_or_file, "name", path_or_file)  # a file object: its file name
            raise InputError(f"cannot tell the format of {name!r}; give format='xml' or 'jsonl'")
    clash = field_clash(ts_field, opts.type_field, fmt)
    if clash:
        if owned:
            f.close()
        raise InputError(clash)
    return _batches(fmt)(f, owned, opts, _sink(dead_letters))


def reading_options(ts_field: str = "ts", ts_unit: str = "s", type_field: str | None = None,
                    max_record_bytes: int = MAX_RECORD_BYTES, max_depth: int = MAX_DEPTH) -> ReaderOptions:
    """The readers' options of :func:`read_event_batches`' arguments (ValueError for a bad one)."""
    for what, v in (("max_record_bytes", max_record_bytes), ("max_depth", max_depth)):
        if type(v) is not int or v < 1:
            raise ValueError(f"{what} must be an integer >= 1, not {v!r:.80}")
    return ReaderOptions(ts_field, unit_factors(ts_unit), type_field or None, max_record_bytes, max_depth)


def field_clash(ts_field: str, type_field: str | None, fmt: str | None) -> str | None:
    """Why the timestamp and the event type would be one field (JSON lines: the type is field ``type``
    without ``type_field``), else None; ``fmt`` None: not known yet."""
    if ts_field == (type_field or ("type" if fmt == "jsonl" else None)):
        return f"the timestamp and the event type cannot both be field {ts_field!r}"
    return None


class _Held:
    """A dead-letter sink that holds a block's reports until :meth:`in_order` reaches their records."""

    def __init__(self, out: DeadLetters):
        self.out = out
        self.reports: deque[tuple[int, str, str, str | None]] = deque()

    def report(self, seq: int, position: str, reason: str, raw: str | None = None) -> None:
        self.reports.append((seq, position, reason, raw))

    def in_order(self, batches: Iterator[list[Event]]) -> Iterator[Event]:
        """The events one by one, each dead letter reported just before the first event after its record
        (as by a reader that reports as it goes); the rest at the end of the input or before an error."""
        reports, report = self.reports, self.out.report
        try:
            for batch in batches:
                if not reports:
                    yield from batch
                    continue
                for ev in batch:
                    while reports and reports[0][0] < ev.seq:
                        report(*reports.popleft())
                    yield ev
        except Exception:
            self._flush()
            raise
        self._flush()

    def _flush(self) -> None:
        for args in self.reports:
            self.out.report(*args)
        self.reports.clear()


def read_xml(source: Source, **options: Any) -> Iterator[Event]:
    """Events from an XML document or a rootless element feed; options as :func:`read_events`."""
    return read_events(source, "xml", **options)


def read_jsonl(source: Source, **options: Any) -> Iterator[Event]:
    """Events from JSON lines; options as :func:`read_events`."""
    return read_events(source, "jsonl", **options)


_FORMATS = ("xml", "jsonl")


def _batches(fmt: str) -> Callable[[IO[Any], bool, ReaderOptions, DeadLetters], Iterator[list[Event]]]:
    """The reader of a format, imported when first asked for (a run reads one format)."""
    if fmt == "xml":
        from yfpp.input.xml_reader import xml_batches

        return xml_batches
    from yfpp.input.jsonl_reader import jsonl_batches

    return jsonl_batches
