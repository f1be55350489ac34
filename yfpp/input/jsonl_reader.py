"""JSON lines: one object per line, parsed with orjson (the standard library where orjson cannot be exact).

Lines end with ``\\n``, ``\\r\\n`` or a lone ``\\r``; blank lines are not records.
A line longer than ``max_record_bytes`` is one dead letter (``too large``, its
first bytes as ``raw``); the rest of it is dropped as it is read, never held.
The ``type`` field (or ``type_field``) must be a non-empty string, the ts
field a finite number (or a numeric string); the rest are attributes: nested
objects are flattened with dotted names (``{"a": {"b": 1}}`` → ``a.b``),
``null`` values are left out (missing attribute), a list value or nesting
deeper than ``max_depth`` makes the line a dead letter. ``NaN``/``Infinity`` are
not JSON; a number that overflows a float (``1e999``) or an integer of more
than 4,300 digits makes the line a dead letter; integers of any other size are
kept exactly (lines with 19 or more digits in a row, ``\\u`` escapes or many
brackets are parsed by the standard library, which is exact and checks depth
safely). The type or ts field given twice is a dead letter (``duplicate key``);
for any other key the last value wins, as in every JSON parser.

Speed: the complete lines of a read block are parsed by one orjson call when
each is one flat object (``{`` to ``}``, no other brace or bracket, no ``\\u``
escape) naming the type and ts keys once and every record is a plain event
(:func:`_bulk`); otherwise — nesting, lists, blank lines, a bad line, odd keys —
the block is read line by line as described above, with the same result.
"""

from __future__ import annotations

import json
import math
import zlib
from typing import IO, Any, Iterable, Iterator

import orjson

from yfpp.input.dead_letters import DeadLetters
from yfpp.errors import InputError
from yfpp.input.events import Event
from yfpp.input.record_fields import ISO_8601, RAW_PREVIEW, READ_BLOCK, ReaderOptions, pop_ts, pop_type, preview, scaled_ts

_INEXACT = "inexact"  # _flatten's answer for a float that may be a rounded integer
_BIG = float(1 << 63)
_BLANK = object()  # a blank line: not a record
# orjson 3.8 overflows the C stack on very deep input (100,000 levels): lines with more brackets than
# this go to the standard library, which raises RecursionError instead
_ORJSON_DEPTH = 500


def jsonl_batches(f: IO[Any], owned: bool, opts: ReaderOptions, dl: DeadLetters) -> Iterator[list[Event]]:
    """The events of a JSON-lines source (see the module docstring), a list per read block (of the lines it
    completes) that has any; dead letters go to ``dl`` as a block is read."""
    blocks = LineBlocks(f, opts.max_record_bytes, dl)
    try:
        for body in blocks:
            events, blocks.seq, blocks.lineno = parse_block(body, blocks.seq, blocks.lineno, opts, dl)
            if events:
                yield events
    finally:
        if owned:
            f.close()


class LineBlocks:
    """The complete lines of a JSON-lines source, a read block at a time (iterating yields each block's bytes,
    a BOM dropped): a line over ``cap`` bytes is one dead letter (``too large``), dropped as it is read. Whoever
    takes a block advances :attr:`seq` (records) and :attr:`lineno` (lines) past it (:func:`parse_block`)."""

    def __init__(self, f: IO[Any], cap: int, dl: DeadLetters, size: int = READ_BLOCK):
        self.f, self.cap, self.dl, self.size = f, cap, dl, size
        self.seq = self.lineno = 0

    def __iter__(self) -> Iterator[bytes]:
        read = getattr(self.f, "read1", self.f.read)
        cap = self.cap
        carry = b""
        dropping = False  # inside a line over the cap: drop bytes up to its end
        first = True
        while True:
            try:
                data = read(self.size)
            except (OSError, EOFError, zlib.error) as e:
                raise InputError(f"cannot read input after line {self.lineno}: {e}") from e
            if isinstance(data, str):
                data = data.encode("utf-8")
            eof = not data
            if first and data:
                first = False
                data = data.removeprefix(b"\xef\xbb\xbf")
            if dropping:
                end = _line_end(data)
                if end < 0 and not eof:
                    continue
                dropping, data = False, data[end:] if end >= 0 else b""
            block = carry + data
            if not block and not eof:
                continue
            cut = len(block) if eof else _last_line_end(block)
            body, carry = block[:cut], block[cut:]
            large = _large(carry, cap) if len(carry) > cap else None
            if large is not None:
                carry, dropping = b"", True
            if body:
                yield body
            if large is not None:  # (after the lines before it: numbered where it stands)
                self.lineno += 1
                self.dl.report(self.seq, f"line {self.lineno}", f"too large: a line over {cap:,} bytes", large)
                self.seq += 1
            if eof:
                return


def parse_block(body: bytes, seq: int, lineno: int, opts: ReaderOptions,
                dl: DeadLetters) -> tuple[list[Event], int, int]:
    """The events of ``body``'s lines (its records numbered from ``seq``, its lines counted from ``lineno``;
    dead letters to ``dl``), and the ``seq`` and ``lineno`` after it."""
    keys = _quoted_keys(opts)
    events: list[Event] = []
    parsed = plain_records(body, opts)
    if parsed is not None and _plain_events(parsed, range(seq, seq + len(parsed)), opts, events):
        return events, seq + len(events), lineno + len(parsed)
    events.clear()
    for line in body.splitlines():
        lineno += 1
        event = _json_event(line, seq, opts, keys)
        if type(event) is Event:
            events.append(event)
        elif event is not None:
            dl.report(seq, f"line {lineno}", event,
                      _large(line, opts.max_record_bytes) if len(line) > opts.max_record_bytes else preview(line))
        else:
            continue  # blank
        seq += 1
    return events, seq, lineno


def plain_records(body: bytes, opts: ReaderOptions) -> list[Any] | None:
    """The records of ``body``'s lines parsed by one orjson call when every line has the plain shape (:func:`_bulk`:
    one flat object naming the type and ts keys once), else None. A subset of such lines may be parsed without
    the checks (:func:`records_of_plain_lines`)."""
    if opts.unit is ISO_8601 or (opts.type_field or "type") == opts.ts_field or len(body) > opts.max_record_bytes:
        return None
    return _bulk(body, _quoted_keys(opts))


def records_of_plain_lines(lines: Iterable[bytes]) -> list[Any]:
    """The records of lines taken from a block :func:`plain_records` parsed (so each is one flat object), by one
    orjson call without its checks."""
    return orjson.loads(b"[" + b",".join(lines) + b"]")


def plain_events(records: Iterable[Any], seqs: Iterable[int], opts: ReaderOptions) -> list[Event] | None:
    """The events of records of the plain shape (:func:`plain_records`), numbered by ``seqs`` (one number a record);
    None (``records`` spoilt) unless each is a plain event (else :func:`parse_block` reads their lines one by one)."""
    events: list[Event] = []
    return events if _plain_events(records, seqs, opts, events) else None


def _large(line: bytes, cap: int) -> str:
    """The raw text of a line over ``cap`` bytes: its first ``cap`` bytes (or fewer, :data:`RAW_PREVIEW`), whatever
    of it was read when it was found too large (so where reads cut the file does not change it)."""
    return preview(line[:cap + 1], min(cap, RAW_PREVIEW))


def _quoted_keys(opts: ReaderOptions) -> tuple[bytes, bytes]:
    """The quoted ts and type field names."""
    return b'"%s"' % opts.ts_field.encode(), b'"%s"' % (opts.type_field or "type").encode()


def _last_line_end(block: bytes) -> int:
    """Where the block's complete lines end: just after its last line end, a final ``\\r`` left out (it may
    be the first half of a ``\\r\\n``); 0 if it has none."""
    limit = len(block) - 1 if block[-1:] == b"\r" else len(block)
    return max(block.rfind(b"\n", 0, limit), block.rfind(b"\r", 0, limit)) + 1


def _bulk(body: bytes, keys: tuple[bytes, bytes]) -> list[Any] | None:
    """The records of ``body``'s lines parsed by one orjson call; None unless that is exactly what parsing
    the lines one by one would give, with no duplicate key (:func:`_plain_events` then looks at the values).

    Taken when every line is one flat object, ``{`` to ``}`` with no other brace, bracket or blank line
    (so no line can run into the next or hold two values, and orjson's recursion stays at depth 2), with
    no ``\\u`` escape (a key spelt with escapes) and each line naming the type and ts keys once.
    """
    if b"\r" in body:
        if body.count(b"\r") != body.count(b"\r\n"):
            return None
        body = body.replace(b"\r\n", b"\n")
    text = body[:-1] if body[-1:] == b"\n" else body
    lines = text.count(b"\n") + 1
    if (text[:1] != b"{" or text[-1:] != b"}" or text.count(b"}\n{") != lines - 1 or text.count(b"{") != lines
            or text.count(b"}") != lines or b"[" in text or b"\\u" in text
            or text.count(keys[0]) != lines or text.count(keys[1]) != lines):
        return None
    try:
        records = orjson.loads(b"[" + text.replace(b"\n", b",") + b"]")
    except orjson.JSONDecodeError:
        return None
    return records if len(records) == lines else None


def _plain_events(records: Iterable[Any], seqs: Iterable[int], opts: ReaderOptions, out: list[Event]) -> bool:
    """The events of :func:`_bulk`'s records appended to ``out``, numbered by ``seqs``; False (``records``
    spoilt, ``out`` partly filled) unless every one is what :func:`_plain_event` takes (with no list or
    object among the values, only a null or a float of 2⁶³ or more makes a record not plain: looking at
    each value costs less than scanning the text for what could make one).

    As every line holds its type and ts key once (:func:`_bulk` counted them), none holds either twice.
    """
    type_field, ts_field = opts.type_field or "type", opts.ts_field
    m, d = opts.unit
    append, big, new = out.append, _BIG, object.__new__
    try:
        for record, seq in zip(records, seqs):
            if type(record) is not dict:
                return False
            type_ = record.pop(type_field, None)
            raw_ts = record.pop(ts_field, None)
            if type(type_) is not str or not type_ or (type(raw_ts) is not int and type(raw_ts) is not float):
                return False
            for value in record.values():
                if value is None or (type(value) is float and not -big < value < big):
                    return False
            ts = raw_ts * m / d
            if ts - ts != 0.0:  # not finite
                return False
            # Event(type_, ts, record, seq) without the call to __init__ (as the XML reader's plain lines)
            event = new(Event)
            event.type = type_
            event.ts = ts
            event.attrs = record
            event.seq = seq
            event.pos = -1
            event._texts = event._el = None
            append(event)
    except OverflowError:
        return False
    return True


def _line_end(data: bytes) -> int:
    """The index just after the first line end in ``data``, or -1."""
    ends = [i for i in (data.find(b"\n"), data.find(b"\r")) if i >= 0]
    return min(ends) + 1 if ends else -1


def _json_event(line: bytes, seq: int, opts: ReaderOptions, keys: tuple[bytes, bytes]) -> Event | str | None:
    """The event of one line, the reason it is a dead letter, or None for a blank line.

    ``keys`` are the quoted ts and type field names: a line naming either twice is parsed exactly.
    """
    if len(line) > opts.max_record_bytes:
        return f"too large: a line over {opts.max_record_bytes:,} bytes"
    if (line.count(b"{") + line.count(b"[") > min(opts.max_depth, _ORJSON_DEPTH) or b"\\u" in line
            or line.count(keys[0]) > 1 or line.count(keys[1]) > 1):
        record = _exact(line, opts)
    else:
        try:
            record = orjson.loads(line)
        except orjson.JSONDecodeError:
            record = _exact(line, opts)  # the reason, or an integer a 64-bit parser refuses
    event = _event_of(record, seq, opts, exact=False)
    return _event_of(_exact(line, opts), seq, opts, exact=True) if event is _INEXACT else event


def _event_of(record: Any, seq: int, opts: ReaderOptions, exact: bool) -> Event | str | None:
    """The event of a parsed line, the reason it is a dead letter, None for a blank line; :data:`_INEXACT`
    when not ``exact`` and a float may be an integer orjson rounded."""
    if type(record) is not dict:
        return None if record is _BLANK else str(record) if type(record) is _Reason else "not an object"
    fast = _plain_event(record, seq, opts)
    if fast is not None:
        return fast
    type_, error = pop_type(record, opts.type_field or "type", "field")
    if error:
        return error
    ts = pop_ts(record, opts.ts_field, opts.unit, "field")
    if type(ts) is str:
        return ts
    attrs: dict[str, Any] = {}
    error = _flatten(record, "", attrs, opts.max_depth, exact)
    return error or Event(type_, ts, attrs, seq)


def _plain_event(record: dict[str, Any], seq: int, opts: ReaderOptions) -> Event | None:
    """The common case without copying: a string type, a numeric ts and flat attribute values that need no
    check (no object, list, null or float of 2⁶³ or more) — the record itself becomes the attributes.
    None (``record`` untouched) for anything else: :func:`_event_of` decides it the long way."""
    type_field = opts.type_field or "type"
    if opts.unit is ISO_8601 or type_field == opts.ts_field:
        return None
    type_ = record.get(type_field)
    raw_ts = record.get(opts.ts_field)
    if type(type_) is not str or not type_ or (type(raw_ts) is not int and type(raw_ts) is not float):
        return None
    for value in record.values():
        t = type(value)
        if t is dict or t is list or value is None or (t is float and not -_BIG < value < _BIG):
            return None
    ts = scaled_ts(raw_ts, opts.unit)
    if ts is None:
        return None
    del record[type_field], record[opts.ts_field]
    return Event(type_, ts, record, seq)


class _Duplicate(ValueError):
    pass


class _Reason(str):
    """Why :func:`_exact` could not give a record (unlike a JSON string, which is a parsed line)."""


def _exact(line: bytes, opts: ReaderOptions) -> Any:
    """The standard library's parse of ``line`` (exact integers, safe depth, duplicate type/ts keys found),
    the reason it is a dead letter, or :data:`_BLANK`."""
    unique = (opts.ts_field, opts.type_field or "type")

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        out = dict(items)
        if len(out) < len(items):
            seen: set[str] = set()
            for key, _ in items:
                if key in seen and key in unique:
                    raise _Duplicate(f"duplicate key: {key!r}")
                seen.add(key)
        return out

    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as e:
        return _Reason(f"bad encoding: {e}")
    if not text.strip():
        return _BLANK
    try:
        return json.loads(text, parse_constant=_no_constant, object_pairs_hook=pairs)
    except _Duplicate as e:
        return _Reason(e)
    except RecursionError:
        return _Reason("too deep: nesting beyond what the parser allows")
    except ValueError as e:
        return _Reason(f"bad JSON: {e}")


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _flatten(obj: dict[str, Any], prefix: str, out: dict[str, Any], depth: int, exact: bool) -> str | None:
    """Copy the scalars of ``obj`` into ``out`` with dotted names; the reason for a list, too deep, or an
    overflow; :data:`_INEXACT` for a float of 2⁶³ or more (orjson may have rounded an integer)."""
    if depth <= 0:
        return "too deep: objects nested beyond the depth cap"
    for key, value in obj.items():
        name = prefix + key
        if type(value) is dict:
            error = _flatten(value, name + ".", out, depth - 1, exact)
            if error:
                return error
        elif type(value) is list:
            return f"list value: attribute {name!r}"
        elif value is not None:
            if type(value) is float and not -_BIG < value < _BIG:
                if not math.isfinite(value):
                    return f"number out of range: attribute {name!r}"
                if not exact:
                    return _INEXACT
            out[name] = value
    return None
