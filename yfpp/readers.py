"""Streaming event readers for XML and JSON lines (SPEC §1).

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
* Malformed records go to ``dead_letters`` (a :class:`DeadLetters`; by default
  one writing to stderr) with their position (``line N``) and the stream goes
  on. Only an unreadable input raises (:class:`InputError`).
* Sources: a path, ``-`` (stdin) or a binary file object; gzip input is
  recognised by its magic bytes (any ``.gz`` file).

XML (:func:`read_xml`): the input is parsed inside a synthetic root
``<yfpp-stream>`` (its XML declaration kept in front), so a document with a root
and a rootless concatenation of elements (a socket feed) both parse. The first
top-level element is a single event if it has a ``ts_field`` attribute, no child
elements, or a first child that is a leaf with no attributes (an attribute of
that event); otherwise it is a root and its children are the events. A DOCTYPE
is rejected (reported, nothing read): internal entities would be expanded in
attribute values even with ``resolve_entities=False``. The parser also loads no
DTD, uses no network and refuses huge trees. ASCII-compatible encodings only.
An event's type is its element's local name; its attributes are the element's
attributes (local names) and its leaf children without attributes (name →
stripped text), attributes winning over children and the first child over
repeats; values are typed int, then float, else str (``"true"`` stays a str).
The element is kept on the Event; the reader detaches it from the document when
the next event is read (the classic iterparse pattern), so memory stays flat.
A syntax error is reported with its line and ends that source (libxml2 cannot
resynchronise); the events before it are yielded. A feed that repeats the XML
declaration before each element is therefore malformed. Input is read with
``read1`` where available, so a live feed is parsed as its bytes arrive.

JSON lines (:func:`read_jsonl`): one object per line with a ``type`` string and
the ts field; the rest are attributes. Nested objects are flattened with dotted
names (``{"a": {"b": 1}}`` → ``a.b``), ``null`` values are left out (missing
attribute), a list value makes the record malformed. NaN/Infinity are not JSON.

In both formats the ts field is removed from the attributes; an attribute named
``type`` or ``seq`` is kept (and shadows that pseudo-attribute in ``Event.get``).
"""

from __future__ import annotations

import gzip
import json
import math
import os
import re
import sys
from datetime import datetime, timezone
from typing import IO, Any, Callable, Iterator

from lxml import etree

from yfpp.dead_letters import DeadLetters
from yfpp.errors import InputError
from yfpp.events import Event

Source = str | os.PathLike[str] | IO[Any]

#: unit → (multiplier, divisor) to seconds
TS_UNITS: dict[str, tuple[int, int]] = {
    "s": (1, 1), "ms": (1, 1000), "us": (1, 10**6), "ns": (1, 10**9), "min": (60, 1), "h": (3600, 1),
}
#: the ``ts_unit`` value (and its marker) for ISO-8601 timestamps
ISO_UNIT_NAME, ISO_8601 = "iso", (0, 0)
FORMAT_BY_EXT = {".xml": "xml", ".jsonl": "jsonl", ".json": "jsonl", ".ndjson": "jsonl"}

_INT = re.compile(r"[+-]?[0-9]+\Z")
_FLOAT = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?\Z")
_XML_DECL = re.compile(rb"(\xef\xbb\xbf)?<\?xml[^>]*\?>")
_ROOT, _END = b"<yfpp-stream>", b"</yfpp-stream>"


def typed_value(text: str) -> int | float | str:
    """``"12"`` → 12, ``"1.5"`` / ``"1e3"`` → float, anything else unchanged."""
    if _INT.match(text):
        return int(text)
    if _FLOAT.match(text):
        return float(text)
    return text


def _seconds(value: Any, unit: tuple[int, int]) -> float | None:
    """The timestamp in seconds, or None when ``value`` is not a finite number."""
    if unit is ISO_8601:
        return _iso_seconds(value)
    if isinstance(value, str):
        value = typed_value(value.strip())
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        ts = value * unit[0] / unit[1]
    except OverflowError:
        return None
    return ts if math.isfinite(ts) else None


def _iso_seconds(value: Any) -> float | None:
    """ISO-8601 text as seconds since the epoch (UTC when it has no offset), else None."""
    if not isinstance(value, str):
        return None
    try:
        t = datetime.fromisoformat(value.strip())
    except ValueError:
        return None
    return (t if t.tzinfo else t.replace(tzinfo=timezone.utc)).timestamp()


def _pop_ts(fields: dict[str, Any], ts_field: str, unit: tuple[int, int], what: str) -> float | str:
    """Remove the timestamp from ``fields``: seconds, or the reason the record is malformed."""
    if ts_field not in fields:
        return f"missing ts: no {what} {ts_field!r}"
    raw_ts = fields.pop(ts_field)
    ts = _seconds(raw_ts, unit)
    if ts is None:
        return f"{'non-ISO-8601' if unit is ISO_8601 else 'non-numeric'} ts: {raw_ts!r}"
    return ts


def _unit(ts_unit: str) -> tuple[int, int]:
    if ts_unit == ISO_UNIT_NAME:
        return ISO_8601
    if ts_unit not in TS_UNITS:
        raise ValueError(f"unknown ts_unit {ts_unit!r}; expected one of {', '.join(TS_UNITS)}")
    return TS_UNITS[ts_unit]


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
    dead_letters: DeadLetters | None = None,
) -> Iterator[Event]:
    """Events from ``path_or_file`` (``-`` is stdin) in ``format`` ``xml`` or ``jsonl``.

    Without ``format`` it comes from the extension (``.xml``, ``.jsonl``, ``.json``,
    ``.ndjson``, each optionally ``.gz``), else from the first non-blank byte
    (``<`` or ``{``) when the stream can be peeked.
    """
    unit = _unit(ts_unit)
    fmt = (format or format_of(path_or_file) or "").lower()
    if fmt and fmt not in _READERS:
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
    return _READERS[fmt](f, owned, ts_field, unit, _sink(dead_letters))


def read_xml(
    source: Source, *, ts_field: str = "ts", ts_unit: str = "s", dead_letters: DeadLetters | None = None
) -> Iterator[Event]:
    """Events from an XML document or a rootless element feed (see the module docstring)."""
    return read_events(source, "xml", ts_field=ts_field, ts_unit=ts_unit, dead_letters=dead_letters)


def read_jsonl(
    source: Source, *, ts_field: str = "ts", ts_unit: str = "s", dead_letters: DeadLetters | None = None
) -> Iterator[Event]:
    """Events from JSON lines (see the module docstring); malformed lines are reported."""
    return read_events(source, "jsonl", ts_field=ts_field, ts_unit=ts_unit, dead_letters=dead_letters)


# --------------------------------------------------------------------------- JSON lines


def _jsonl_events(f: IO[Any], owned: bool, ts_field: str, unit: tuple[int, int], dl: DeadLetters) -> Iterator[Event]:
    seq = 0
    try:
        for lineno, line in enumerate(f, 1):
            if isinstance(line, bytes):
                try:
                    line = line.decode("utf-8-sig" if lineno == 1 else "utf-8")
                except UnicodeDecodeError as e:
                    dl.report(seq, f"line {lineno}", f"bad encoding: {e}", line.decode("utf-8", "replace").rstrip("\n"))
                    seq += 1
                    continue
            if not line.strip():
                continue
            event = _json_event(line, seq, ts_field, unit)
            if isinstance(event, str):
                dl.report(seq, f"line {lineno}", event, line.rstrip("\r\n"))
            else:
                yield event
            seq += 1
    except (OSError, EOFError) as e:
        raise InputError(f"cannot read input: {e}") from e
    finally:
        if owned:
            f.close()


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _json_event(line: str, seq: int, ts_field: str, unit: tuple[int, int]) -> Event | str:
    """The event of one line, or the reason it is malformed."""
    try:
        record = json.loads(line, parse_constant=_no_constant)
    except ValueError as e:
        return f"bad JSON: {e}"
    if not isinstance(record, dict):
        return "not an object"
    type_ = record.pop("type", None)
    if not isinstance(type_, str) or not type_:
        return "missing type" if type_ is None else f"bad type: {type_!r}"
    ts = _pop_ts(record, ts_field, unit, "field")
    if isinstance(ts, str):
        return ts
    attrs: dict[str, Any] = {}
    error = _flatten(record, "", attrs)
    return error or Event(type_, ts, attrs, seq)


def _flatten(obj: dict[str, Any], prefix: str, out: dict[str, Any]) -> str | None:
    """Copy the scalars of ``obj`` into ``out`` with dotted names; the error for a list."""
    for key, value in obj.items():
        name = prefix + key
        if isinstance(value, dict):
            error = _flatten(value, name + ".", out)
            if error:
                return error
        elif isinstance(value, list):
            return f"list value: attribute {name!r}"
        elif value is not None:
            out[name] = value
    return None


# --------------------------------------------------------------------------- XML


class _Wrapped:
    """A binary reader giving ``source`` inside ``<yfpp-stream>…</yfpp-stream>``.

    An XML declaration (and BOM) at the start stays in front of the synthetic
    root. ``doctype_line`` is the line of a DOCTYPE seen in the head, else 0.
    """

    def __init__(self, f: IO[Any]):
        self._read: Callable[[int], bytes | str] = getattr(f, "read1", f.read)
        self._parts: list[bytes] | None = None
        self._done = False
        self.doctype_line = 0

    def _chunk(self, n: int) -> bytes:
        data = self._read(n)
        return data.encode("utf-8") if isinstance(data, str) else data

    def _head(self) -> list[bytes]:
        head = self._chunk(65536)
        while len(head) < 8 or (head.lstrip(b"\xef\xbb\xbf").startswith(b"<?xml") and b"?>" not in head):
            more = self._chunk(65536)
            if not more:
                break
            head += more
        m = _XML_DECL.match(head)
        decl = head[: m.end()] if m else b""
        doctype = head.find(b"<!DOCTYPE", len(decl))
        if doctype >= 0:
            self.doctype_line = head[:doctype].count(b"\n") + 1
        return [part for part in (decl + _ROOT, head[len(decl):]) if part]

    def read(self, n: int = 65536) -> bytes:
        if self._parts is None:
            self._parts = self._head()
        if self._parts:
            return self._parts.pop(0)
        if self._done:
            return b""
        data = self._chunk(n if n > 0 else 65536)
        if not data:
            self._done = True
            return _END
        return data


def _xml_events(f: IO[Any], owned: bool, ts_field: str, unit: tuple[int, int], dl: DeadLetters) -> Iterator[Event]:
    src = _Wrapped(f)
    seq = 0
    try:
        for elem in _event_elements(src, ts_field):
            event = _xml_event(elem, seq, ts_field, unit)
            if isinstance(event, str):
                dl.report(seq, f"line {elem.sourceline}", event, etree.tostring(elem, encoding="unicode", with_tail=False))
            else:
                yield event
            seq += 1
    except etree.XMLSyntaxError as e:
        if src.doctype_line:
            dl.report(seq, f"line {src.doctype_line}", "DTD not allowed: DOCTYPE in input")
        else:
            dl.report(seq, f"line {e.lineno}", "malformed XML: " + re.sub(r", line \d+, column \d+$", "", e.msg))
    except (OSError, EOFError) as e:
        raise InputError(f"cannot read input: {e}") from e
    finally:
        if owned:
            f.close()


def _event_elements(src: _Wrapped, ts_field: str) -> Iterator[Any]:
    """The event elements, each yielded at its end; earlier siblings are removed from the tree."""
    parser = etree.iterparse(
        src, events=("start", "end"), resolve_entities=False, no_network=True, load_dtd=False,
        huge_tree=False, collect_ids=False, remove_comments=True, remove_pis=True,
    )
    depth = -1  # the synthetic root is at depth 0
    event_depth = 0  # 1: top-level elements are events, 2: their children are; 0: not known yet
    for action, elem in parser:
        if action == "start":
            depth += 1
            if depth == 1 and not event_depth and ts_field in elem.attrib:
                event_depth = 1
            continue
        if not event_depth:
            if depth == 2:
                event_depth = 2 if len(elem) or elem.attrib else 1
            elif depth == 1:
                event_depth = 1
        if 0 < depth <= event_depth:
            parent = elem.getparent()
            while elem.getprevious() is not None:
                del parent[0]
            if depth == event_depth:
                yield elem
        depth -= 1


def _xml_event(elem: Any, seq: int, ts_field: str, unit: tuple[int, int]) -> Event | str:
    """The event of one element, or the reason it is malformed."""
    attrs: dict[str, Any] = {name.rpartition("}")[2]: typed_value(v) for name, v in elem.attrib.items()}
    for child in elem:
        if not len(child) and not child.attrib:
            attrs.setdefault(child.tag.rpartition("}")[2], typed_value((child.text or "").strip()))
    ts = _pop_ts(attrs, ts_field, unit, "attribute or child")
    if isinstance(ts, str):
        return ts
    return Event(elem.tag.rpartition("}")[2], ts, attrs, seq, elem)


_READERS: dict[str, Callable[[IO[Any], bool, str, tuple[int, int], DeadLetters], Iterator[Event]]] = {
    "xml": _xml_events,
    "jsonl": _jsonl_events,
}
