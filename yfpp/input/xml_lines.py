"""The plainest XML feeds — every line one event element — read a block of lines at a time.

:meth:`yfpp.input.xml_reader.Splitter._plain_lines` finds a block of whole lines without entity or character
references and asks the readers below in turn; each gives exactly the events lxml would, or nothing (then the
next one, or the splitter, reads the block):

* :class:`JsonLines` reads the block without an XML parser when every line is a self-closing element
  ``<tag name="value" … ts="…" …/>`` with ASCII names, its attributes in any order, the ts digits (perhaps with
  a decimal fraction) or, with ``ts_unit="iso"``, ISO-8601 text (``2026-11-22T10:00:05.311Z``; one offset in
  a block): the block is cut at its quotes and rewritten, a piece at a time through tables of the pieces
  already seen, into one JSON document of the typed attributes (``[{"tag_id":14,"zone":"Z4"},…]``), which
  one ``orjson.loads`` call reads. The tags and ts come from one regular-expression split (each line's tag,
  the attributes before its ts, its ts). Every piece between two values must be one of a few forms (an
  element's end, the next one's start, an attribute's name: no namespace, comment or text); what XML does
  not allow and JSON would (``<``, U+FFFE or U+FFFF in a value, a duplicate attribute) is checked for; what
  JSON does not allow and XML would (a backslash, a tab in a value) sends the block to the next reader. An
  event keeps its line's bytes, and the attribute texts (:attr:`yfpp.input.events.Event.texts`) are read from them
  when something asks.
* :class:`ChildReadings` reads a block of lines that are each one event of plain leaf children
  (``<reading><sensor>T1</sensor><ts>12.5</ts></reading>``) by regular expressions, each child's text typed
  as the long way types it.
* :class:`LineEvents` is an lxml parser target, for a block of lines that are each one self-closing element
  without namespace: lxml parses the block, and the target makes each event from the tag and attribute texts
  lxml gives it.

Under a root that declares namespaces (``<stream xmlns="urn:…">``) the first two read the lines alike (no
line may declare or use one itself), and an event's element, should anything ask for it, is its line parsed
alone in the root's namespaces (:func:`yfpp.input.xml_parsing.parse_alone`), as the splitter would parse it.
"""

from __future__ import annotations

import math
import re
from itertools import compress, count, repeat
from operator import add, is_, truediv
from datetime import datetime, timezone
from typing import Any, Callable, NamedTuple, Sequence

import orjson

from yfpp.input.events import Event
from yfpp.input.line_attributes import NAME
from yfpp.input.record_fields import ISO_8601, ReaderOptions, scaled_ts, seconds, typed_value

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


_INTEGERS = re.compile(rb'(?:[1-9][0-9]{0,17}|0)(?:"(?:[1-9][0-9]{0,17}|0))*+')  # what _Tokens writes as it is


class _Tokens(_Table):
    """The JSON of an attribute value's typed value (:func:`typed_value`): a number, or its text quoted."""

    def __missing__(self, raw: bytes) -> bytes:
        if raw.isdigit() and len(raw) < 19 and (raw[0] != 48 or len(raw) == 1):  # (ASCII digits, no leading 0)
            token = raw  # the common case: an integer, written as JSON writes it
        else:
            token = self._token(raw)
        return self.keep(raw, token)

    def tokens(self, values: list[bytes]) -> list[bytes]:
        """The JSON of each value. A value not in the table that is an integer as JSON writes it (an id, a
        sequence number: mostly new ones) is its own JSON, and is neither looked up the long way nor kept."""
        tokens = list(map(self.get, values, values))  # (a value not in the table: itself)
        new = b'"'.join(compress(values, map(is_, tokens, values)))  # (no value holds a quote)
        if new and _INTEGERS.fullmatch(new) is None:
            tokens = list(map(self.__getitem__, values))
        return tokens

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


# the ts values JsonLines reads: digits, perhaps with a decimal fraction (15 digits each at most: float() of the
# text is typed_value's number, finite at any unit), or ISO-8601 (see _IsoMinutes): the minute, the seconds, a
# fraction of up to 6 digits, the offset (Z, ±hh:mm, none: UTC)
_NUMBER_TS = rb"([0-9]{1,15}(?:\.[0-9]{1,15})?)"
_ISO_TS = (rb"([0-9]{4}-[0-9]{2}-[0-9]{2}T(?:[01][0-9]|2[0-3]):[0-5][0-9]):([0-5][0-9])(?:\.([0-9]{1,6}))?"
           rb"(Z|[+-][0-9]{2}:[0-9]{2})?")
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
PLAIN_SCOPE = b"<yfpp-batch>"  #: the wrapper of events outside a root that declares namespaces


class _IsoMinutes(_Table):
    """Microseconds since the epoch at the start of an ISO-8601 minute (``b"2026-11-22T10:00"``) at one offset:
    what :func:`yfpp.input.record_fields.iso_seconds` reads for it, exactly (``timestamp()`` of an aware datetime is
    its microseconds since the epoch over 10⁶); :class:`_NotPlain` for a minute it refuses."""

    def __init__(self, offset: bytes):
        super().__init__()
        self.offset = offset.decode("ascii")

    def __missing__(self, minute: bytes) -> int:
        try:
            t = datetime.fromisoformat(minute.decode("ascii") + ":00" + self.offset)
            delta = (t if t.tzinfo else t.replace(tzinfo=timezone.utc)) - _EPOCH
        except (ValueError, OverflowError):
            raise _NotPlain from None
        return self.keep(minute, (delta.days * 86400 + delta.seconds) * 1_000_000 + delta.microseconds)


class JsonLines:
    """Reads a block of plain lines (see the module docstring) into its events, or says it cannot."""

    def __init__(self, opts: ReaderOptions, scope: bytes = PLAIN_SCOPE):
        ts_field = opts.ts_field.encode("utf-8")
        m, d = opts.unit
        self.iso = opts.unit is ISO_8601
        # (float(text) * m / d is typed_value's number scaled, exactly, when m or d is 1: every unit there is)
        self.enabled = (re.fullmatch(NAME, ts_field) is not None and opts.type_field is None
                        and (self.iso or m == 1 or d == 1))
        # each line's head: its tag, the attributes before its ts, and its ts (the first one)
        self._head = re.compile(rb"<(" + NAME + rb")((?:[ \t]++" + NAME + rb"[ \t]*+=[ \t]*+\"[^\"\n]*+\")*?)[ \t]++"
                                + re.escape(ts_field) + rb"[ \t]*+=[ \t]*+\"" + (_ISO_TS if self.iso else _NUMBER_TS) + rb"\"")
        self._step = self._head.groups + 1  # pieces of the split per line
        self._between = _Between(ts_field)
        self._tokens = _Tokens()
        self._tags = _Tags()
        self._minutes: dict[bytes, _IsoMinutes] = {}
        self._unit = opts.unit
        # an element is built from its texts, or in a root's namespaces parsed from its line (see Event._element)
        self._scope = None if scope == PLAIN_SCOPE else scope

    def read(self, region: bytes, seq: int, line: int, numbers: Sequence[int] | None = None) -> list[Event] | None:
        """The events of ``region``'s lines (UTF-8, each line ending ``\\n``, no ``&``), numbered from ``seq``
        and ``line`` (or, ``numbers``, each line's seq, its line that much more than ``seq`` is of ``line``:
        lines picked from a block); None if they are not each one element as the module docstring says."""
        if not self.enabled or len(region) > _MAX_BYTES:
            return None
        lines = region.split(b"\n")  # (the last is the b"" after the last line end)
        n = len(lines) - 1
        step = self._step
        pieces = self._head.split(region)  # before the first head, then the head's groups and what follows, each line
        if len(pieces) != step * n + 1:
            return None
        tags = pieces[1::step]
        ts_pieces = [pieces[i::step] for i in range(3, step)]
        pieces[1::step] = [b"<"] * n  # what is left of each head: its "<" and the attributes before the ts
        for i in range(3, step):
            pieces[i::step] = [b""] * n
        parts = b"".join(pieces).split(b'"')  # between values, value, between, …, between
        if not len(parts) & 1:
            return None
        try:
            parts[0::2] = map(self._between.__getitem__, parts[0::2])
            parts[1::2] = self._tokens.tokens(parts[1::2])
            if parts[0][:1] != b",":  # (the block starts with an element)
                return None
            parts[0] = b"[" + parts[0][1:]
            parts[-1] += b"]"
            records = orjson.loads(b"".join(parts))
            times = self._iso_times(*ts_pieces) if self.iso else number_times(ts_pieces[0], self._unit)
        except (_NotPlain, ValueError):
            return None
        if len(records) != n or sum(map(len, records)) != len(parts) >> 1:  # a name given twice
            return None
        events: list[Event] = []
        append = events.append
        new = object.__new__
        to_line = line - seq
        scope = self._scope
        for tag, ts, attrs, raw, seq in zip(map(self._tags.__getitem__, tags), times, records, lines,
                                            count(seq) if numbers is None else numbers):
            # Event(tag, ts, attrs, seq, line, texts=raw) without the call to __init__
            event = new(Event)
            event.type = tag
            event.ts = ts
            event.attrs = attrs
            event.seq = seq
            event.pos = -1
            event._texts = raw
            event._el = seq + to_line if scope is None else (seq + to_line, raw, scope)
            append(event)
        return events

    def _iso_times(self, minutes: list[bytes], seconds: list[bytes], fractions: list[bytes | None],
                   offsets: list[bytes | None]) -> list[float]:
        """The ts in seconds of ISO-8601 texts cut in pieces by ``_ISO_TS`` (one offset in a block)."""
        offset = offsets[0]
        if offsets.count(offset) != len(offsets):
            raise _NotPlain
        table = self._minutes.get(offset or b"")
        if table is None:
            if len(self._minutes) >= 64:  # (offsets change rarely: a feed of many is read, its tables not kept)
                self._minutes.clear()
            table = self._minutes[offset or b""] = _IsoMinutes(offset or b"")
        if None in fractions:
            fractions = [f or b"" for f in fractions]
        # microseconds into the minute: the seconds and the fraction's six digits read as one integer
        micro = map(int, map(add, seconds, map(bytes.ljust, fractions, repeat(6), repeat(b"0"))))
        return list(map(truediv, map(add, map(table.__getitem__, minutes), micro), repeat(1_000_000)))


def number_times(raw: list[bytes], unit: tuple[int, int]) -> list[float]:
    """The ts of number texts (``[0-9]+(.[0-9]+)?``) in seconds of ``unit`` (as :func:`typed_value` reads them,
    scaled exactly: every unit's ``m`` or ``d`` is 1)."""
    m, d = unit
    return list(map(float, raw)) if m == d == 1 else [float(r) * m / d for r in raw]


# a line that is one event of leaf children: its tag, then its children (a name, its text: no markup, no entity)
_S_NAME = r"[A-Za-z_][A-Za-z0-9._-]{0,999}+(?![A-Za-z0-9._-])"
_READING = re.compile(r"^[ \t]*+<(" + _S_NAME + r")>((?:<" + _S_NAME + r">[^<&\n]*+</" + _S_NAME + r">)++)</\1>\n", re.M)
_CHILD = re.compile(r"<(" + _S_NAME + r")>([^<]*+)</\1>")
_NUMBER_TEXT = re.compile(_NUMBER_TS.decode("ascii"))  # (a str pattern)
# what XML does not allow in text: a control character (deleted from a copy: the copy is shorter), U+FFFE, U+FFFF, "]]>"
_CONTROLS = bytes([*range(9), 11, 12, *range(14, 32)])
_NOT_IN_TEXT = (b"\xef\xbf\xbe", b"\xef\xbf\xbf", b"]]>")


class ChildReadings:
    """Reads a block of lines that are each one event of plain leaf children, ``<reading><sensor>T1</sensor>
    <celsius>31.5</celsius></reading>`` (the ts a child too, no attribute, no entity, one line each), into its
    events as the long way reads them (``xml_reader._xml_event``: each child's text stripped and typed, the first
    of a name kept), or says it cannot. No tree is built: an event's element is parsed from its line when
    something asks for it."""

    def __init__(self, opts: ReaderOptions, scope: bytes = PLAIN_SCOPE):
        self.enabled = opts.type_field is None and opts.max_depth >= 2
        self._ts_field, self._unit = opts.ts_field, opts.unit
        self._typed = TypedValues()
        self._scope = scope

    def read(self, region: bytes, seq: int, line: int) -> list[Event] | None:
        """The events of ``region``'s lines (each ending ``\\n``, no ``&``), numbered from ``seq`` and ``line``;
        None unless each line is one such event with a usable ts."""
        if not self.enabled or len(region) > _MAX_BYTES:
            return None
        try:
            text = region.decode("utf-8")
        except UnicodeDecodeError:
            return None
        lines = region.split(b"\n")
        rows = _READING.findall(text)
        if (len(rows) != len(lines) - 1 or len(region.translate(None, _CONTROLS)) != len(region)
                or any(map(region.__contains__, _NOT_IN_TEXT))):
            return None
        events: list[Event] = []
        append, new, typed, ts_field, scope = events.append, object.__new__, self._typed, self._ts_field, self._scope
        m, d = unit = self._unit
        number = _NUMBER_TEXT.fullmatch if unit is not ISO_8601 else lambda text: None
        for (tag, children), raw in zip(rows, lines):
            pairs = _CHILD.findall(children)
            texts = dict(pairs)
            if len(texts) != len(pairs) or len(pairs) != children.count("</"):
                # a name given twice (the long way keeps the first) or an end tag that does not match
                if len(pairs) != children.count("</"):
                    return None
                texts = {}
                for name, value in pairs:
                    texts.setdefault(name, value)
            raw_ts = texts.pop(ts_field, None)
            if raw_ts is None:
                return None  # (the long way reports it)
            # the ts as the long way reads it (typed, then in seconds): digits (and a fraction) directly
            ts = float(raw_ts) * m / d if number(raw_ts) else seconds(typed_value(raw_ts.strip()), unit)
            if ts is None:
                return None
            attrs = dict(zip(texts, map(typed.__getitem__, map(str.strip, texts.values()))))
            # Event(tag, ts, attrs, seq, (line, raw, scope)) without the call to __init__
            event = new(Event)
            event.type = tag
            event.ts = ts
            event.attrs = attrs
            event.seq = seq
            event.pos = -1
            event._texts = None
            event._el = (line, raw, scope)
            append(event)
            seq += 1
            line += 1
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
