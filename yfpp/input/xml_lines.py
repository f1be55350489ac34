"""The plainest XML feed — every line one self-closing event element — read a block of lines at a time.

:meth:`yfpp.input.xml_reader.Splitter._plain_lines` finds a block of whole lines without entity or character
references and asks two readers in turn; both give exactly the events lxml would, or nothing (then the next
one, or the splitter, reads the block):

* :class:`JsonLines` reads the block without an XML parser when every line is
  ``<tag ts="digits" name="value" …/>`` with ASCII names: the block is cut at its quotes and rewritten, a
  piece at a time through tables of the pieces already seen, into one JSON document of the typed
  attributes (``[{"tag_id":14,"zone":"Z4"},…]``), which one ``orjson.loads`` call reads. The tags and ts
  come from the same regular-expression split. Every piece between two values must be one of a few forms
  (an element's end, the next one's start, an attribute's name: no namespace, comment or text); what XML
  does not allow and JSON would (``<``, U+FFFE or U+FFFF in a value, a duplicate attribute) is checked for;
  what JSON does not allow and XML would (a backslash, a tab in a value) sends the block to the next reader. An event keeps its line's bytes, and the attribute texts
  (:attr:`yfpp.input.events.Event.texts`) are read from them when something asks.
* :class:`LineEvents` is an lxml parser target, for a block of lines that are each one self-closing element
  without namespace: lxml parses the block, and the target makes each event from the tag and attribute texts
  lxml gives it.
"""

from __future__ import annotations

import math
import re
from typing import Any, Callable, NamedTuple

import orjson

from yfpp.input.events import Event
from yfpp.input.line_attributes import NAME
from yfpp.input.record_fields import ISO_8601, ReaderOptions, scaled_ts, typed_value

_CACHE_SIZE = 4096  # entries of each table below; a full table is emptied at once
_CACHED_BYTES = 256  # longer keys are not kept (the tables hold at most about 4096 × 256 bytes each)


class _Table(dict):
    """A dict its ``__missing__`` fills through :meth:`keep`: at most 4,096 keys of at most 256 bytes each, then
    emptied at once."""

    def keep(self, key: Any, value: Any) -> Any:
        """``value``, kept under ``key`` unless the key is long."""
        if len(key) <= _CACHED_BYTES:
            if len(self) >= _CACHE_SIZE:
                self.clear()
            self[key] = value
        return value


class Lines(NamedTuple):
    """Self-closing event elements one per line, read in one go: the event of each (keeping its attribute
    texts), or ``(tag, attribute texts, seq, line)`` for one whose ts the long way must read (and perhaps
    report); ``clean`` when there is none of those."""

    items: list[Any]
    clean: bool


class TypedValues(_Table):
    """``typed_value`` of attribute texts, remembered (up to 4,096 of at most 256 characters, then forgotten all
    at once)."""

    def __missing__(self, text: str) -> int | float | str:
        # (typed_value's common case inline: most misses are the first sight of a new id, a call less each)
        return self.keep(text, int(text) if text.isdigit() and text.isascii() and len(text) < 4300 else typed_value(text))


def number_ts(raw_ts: str, unit: tuple[int, int]) -> float | None:
    """The ts in seconds of an attribute text that is a number (:func:`typed_value`), else None: what the
    fast paths take; anything else (blanks around it, not a number, not finite) goes the long way."""
    number = typed_value(raw_ts)
    return None if type(number) is str else scaled_ts(number, unit)


# --------------------------------------------------------------------------- without an XML parser

_MAX_BYTES = 1 << 20  # a larger block is left to lxml (libxml2 limits an attribute value to 10,000,000 bytes)
# what lies between two quoted values once each line's head (``<tag ts="digits"``) is cut down to ``<``:
# the end of an element, elements with no other attribute, the start of the next, an attribute's name
_BETWEEN = re.compile(rb"(?P<close>[ \t]*+/>\n)?(?P<empty>(?:[ \t]*+<[ \t]*+/>\n)*+)(?P<open>[ \t]*+<)?"
                      rb"(?:[ \t]++(?P<name>" + NAME + rb")[ \t]*+=[ \t]*+)?")
# what a value may not hold: a "<" (XML), a backslash (a JSON escape), U+FFFE or U+FFFF (JSON takes them, XML does not)
_NOT_IN_VALUES = (b"<", b"\\", b"\xef\xbf\xbe", b"\xef\xbf\xbf")
_INT64 = range(-(1 << 63), 1 << 64)  # the integers orjson reads


class _NotPlain(Exception):
    """The block is not what :class:`JsonLines` reads."""


class _Between(_Table):
    """The JSON for a piece of a block between two quoted values (see ``_BETWEEN``), or :class:`_NotPlain`:
    ``}`` ends an element, ``,{`` starts one, ``"name":`` names the next value. Every piece starts with the
    ``,`` it needs, so the JSON of a block is its pieces and values joined (the first piece's comma cut)."""

    def __init__(self, ts_field: bytes):
        super().__init__()
        self.ts_field = ts_field

    def __missing__(self, piece: bytes) -> bytes:
        m = _BETWEEN.fullmatch(piece)
        # (a second ts: a duplicate attribute; xmlns: a namespace, so no longer the plain tag)
        if m is None or m["name"] == self.ts_field or (m["name"] or b"").startswith(b"xmlns"):
            raise _NotPlain
        json = [b"}" if m["close"] else b"", b",{}" * m["empty"].count(b"\n"), b",{" if m["open"] else b""]
        if m["name"]:
            json.append(b'%s"%s":' % (b"" if m["open"] else b",", m["name"]))
        return self.keep(piece, b"".join(json))  # (a long piece, a run of elements with no other attribute, is not kept)


class _Tokens(_Table):
    """The JSON of an attribute value's typed value (:func:`typed_value`): a number, or its text quoted."""

    def __missing__(self, raw: bytes) -> bytes:
        if raw.isdigit() and len(raw) < 19 and (raw[0] != 48 or len(raw) == 1):  # (ASCII digits, no leading 0)
            token = raw  # the common case: an integer, written as JSON writes it
        else:
            token = self._token(raw)
        return self.keep(raw, token)

    @staticmethod
    def _token(raw: bytes) -> bytes:
        if any(map(raw.__contains__, _NOT_IN_VALUES)):  # (checked here, where a value is first seen)
            raise _NotPlain
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise _NotPlain from None
        value = typed_value(text)
        if type(value) is int:
            if value not in _INT64:
                raise _NotPlain
            token = b"%d" % value
        elif type(value) is float:
            token = repr(value).encode("ascii")
            back = orjson.loads(token)
            if back != value or math.copysign(1.0, back) != math.copysign(1.0, value):
                raise _NotPlain
        else:
            token = b'"%s"' % raw  # (orjson checks it is JSON text: no control character, no backslash)
        return token


class _Tags(_Table):
    """Tag names as text, one ``str`` for each."""

    def __missing__(self, raw: bytes) -> str:
        return self.keep(raw, raw.decode("ascii"))


class JsonLines:
    """Reads a block of plain lines (see the module docstring) into its events, or says it cannot."""

    def __init__(self, opts: ReaderOptions):
        ts_field = opts.ts_field.encode("utf-8")
        self.enabled = (re.fullmatch(NAME, ts_field) is not None and opts.type_field is None
                        and opts.unit is not ISO_8601)
        # each line's head: its tag and its ts, the first attribute, of 15 digits at most (finite at any unit)
        self._head = re.compile(rb"<(" + NAME + rb")[ \t]++" + re.escape(ts_field) + rb"[ \t]*+=[ \t]*+\"([0-9]{1,15})\"")
        self._between = _Between(ts_field)
        self._tokens = _Tokens()
        self._tags = _Tags()
        self._unit = opts.unit

    def read(self, region: bytes, seq: int, line: int) -> list[Event] | None:
        """The events of ``region``'s lines (UTF-8, each line ending ``\\n``, no ``&``), numbered from ``seq``
        and ``line``; None if they are not each one element as the module docstring says."""
        if not self.enabled or len(region) > _MAX_BYTES:
            return None
        lines = region.split(b"\n")  # (the last is the b"" after the last line end)
        n = len(lines) - 1
        pieces = self._head.split(region)  # before the first head, then tag, ts, what follows, for each line
        if len(pieces) != 3 * n + 1:
            return None
        parts = b"<".join(pieces[0::3]).split(b'"')  # between values, value, between, …, between
        if not len(parts) & 1:
            return None
        try:
            parts[0::2] = map(self._between.__getitem__, parts[0::2])
            parts[1::2] = map(self._tokens.__getitem__, parts[1::2])
            if parts[0][:1] != b",":  # (the block starts with an element)
                return None
            parts[0] = b"[" + parts[0][1:]
            parts[-1] += b"]"
            records = orjson.loads(b"".join(parts))
        except (_NotPlain, ValueError):
            return None
        if len(records) != n or sum(map(len, records)) != len(parts) >> 1:  # a name given twice
            return None
        m, d = self._unit
        times = map(float, pieces[2::3]) if m == d == 1 else [int(raw) * m / d for raw in pieces[2::3]]
        events: list[Event] = []
        append = events.append
        new = object.__new__
        to_line = line - seq
        for tag, ts, attrs, raw in zip(map(self._tags.__getitem__, pieces[1::3]), times, records, lines):
            # Event(tag, ts, attrs, seq, line, texts=raw) without the call to __init__
            event = new(Event)
            event.type = tag
            event.ts = ts
            event.attrs = attrs
            event.seq = seq
            event.pos = -1
            event._texts = raw
            event._el = seq + to_line
            append(event)
            seq += 1
        return events


# --------------------------------------------------------------------------- through lxml


class LineEvents:
    """The parser target of :meth:`yfpp.input.xml_reader.Splitter._plain_lines`: the event of each element as lxml
    reads it, numbered from the seq and line given to :meth:`reset` (the first element, the wrapper, skipped)."""

    def __init__(self, opts: ReaderOptions):
        self.start, self.reset, self.close = _line_event_maker(opts)


def _line_event_maker(opts: ReaderOptions) -> tuple[Callable[[str, Any], None], Callable[[int, int, bool], None],
                                                      Callable[[], Lines]]:
    """``start(tag, attributes)``, ``reset(seq, line, all_ascii)`` and ``close()`` of a :class:`LineEvents` (closures: the
    per-element work reads no attributes). An element's event is what ``xml_reader._flat_events`` would make;
    one with no attributes or whose ts is missing or not a usable number is left to the long way."""
    ts_field, unit = opts.ts_field, opts.unit
    m, d = unit
    seconds = unit == (1, 1)
    new = object.__new__
    typed = TypedValues()
    items: list[Any] = []
    append = items.append
    seq = to_line = 0  # the seq of the next element, and what its line is more than its seq
    wrapper = clean = region_ascii = True

    def start(tag: str, texts: Any) -> None:
        nonlocal seq, wrapper, clean
        if type(texts) is dict:  # else an immutable empty mapping: no attributes (the wrapper has none)
            attrs = texts.copy()
            raw_ts = attrs.pop(ts_field, None)
            if raw_ts is None:
                ts = None
            elif raw_ts.isdigit() and len(raw_ts) < 16 and (region_ascii or raw_ts.isascii()):
                # below 10¹⁶ × 3600: finite; below 2⁵³ in seconds: float() is exactly int() / 1
                ts = float(raw_ts) if seconds else int(raw_ts) * m / d
            else:
                ts = number_ts(raw_ts, unit)
            if ts is not None:
                for name in attrs:  # values replaced in place: the dict's size does not change (keys, no pairs: less)
                    attrs[name] = typed[attrs[name]]
                # Event(tag, ts, attrs, seq, line, texts) without the call to __init__ (5 % of this reader's work)
                event = new(Event)
                event.type = tag
                event.ts = ts
                event.attrs = attrs
                event.seq = seq
                event.pos = -1
                event._texts = texts
                event._el = seq + to_line
                append(event)
                seq += 1
                return
        elif wrapper:
            wrapper = False
            return
        append((tag, dict(texts), seq, seq + to_line))
        clean = False
        seq += 1

    def reset(first_seq: int, first_line: int, all_ascii: bool) -> None:
        """Start a region: its first element's seq and line, and whether all its bytes are ASCII (then a
        ts of ASCII digits is told by ``isdigit`` alone)."""
        nonlocal seq, to_line, wrapper, clean, region_ascii
        items.clear()
        seq, to_line, wrapper, clean, region_ascii = first_seq, first_line - first_seq, True, True, all_ascii

    def close() -> Lines:
        lines = Lines(items[:], clean)
        items.clear()
        return lines

    return start, reset, close
