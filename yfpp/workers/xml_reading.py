"""``yfpp run --workers N`` over an XML file of one event element a line: every worker reads the file and parses
only its own lines, as :mod:`yfpp.workers.reading` does for JSON lines (its :class:`~yfpp.workers.reading.Relay`
of scans, its routing of a scanned block's lines, its reorder buffer for the rest).

XML is read by one stateful reader (:class:`yfpp.input.xml_reader.Splitter`: the XML declaration, DOCTYPE, the
root and its namespaces, elements across lines…). So each worker runs that reader (:class:`OneReader`) over
every block that is not plain — the file's head first — and gives it no more than the count of records and lines
of each block it skips. A block is skipped, its lines routed by their scan and each parsed by the plain-line
reader (:class:`yfpp.input.xml_lines.JsonLines`, in the root's namespaces) in the workers that take it, only
when the reader stands between events inside a root, in UTF-8
(:meth:`~yfpp.input.xml_reader.Splitter.between_events`), and the block's scan (:class:`Scanner`) found every
line one self-closing element ``<tag name="value" … ts="number" …/>`` (no ``&``, CR or namespace) holding each
routing attribute, its times never going back. Such a line is one record of the one reader, read as it reads it
alone (a line the plain-line reader refuses is read so: :func:`read_alone`); the one reader's state after it is
the same but for the indentation it learns, which decides where it cuts its blocks, never what it reads. So
``seq`` numbers, dead letters and late events are the one reader's: a block not scanned is read by every
worker's one reader and put through the reorder buffer, whose late events and dead letters worker 0 reports.
"""

from __future__ import annotations

import os
import re
from itertools import compress
from typing import BinaryIO, Iterator, Sequence

from yfpp.workers import reading as workers_reading
from yfpp.input.dead_letters import DeadLetters
from yfpp.input.events import Event
from yfpp.input.line_attributes import NAME
from yfpp.input.record_fields import ISO_8601, ReaderOptions, typed_value
from yfpp.input.xml_lines import JsonLines, TypedValues, number_times
from yfpp.input.xml_parsing import BATCH_END
from yfpp.input.xml_reader import Splitter, record_events
from yfpp.spark.plan import Group
from yfpp.workers.reading import (Owners, Relay, Scan, Share, KeptDeadLetters, _ordered, file_format, file_head, owner_array,
                                  workers_of)

# A block of plain lines cut at its quotes: its first piece, each line's end and the next one's start (its tag and
# first attribute's name), the name of each other attribute, the end of the last line. Each piece between two values
# one of these, and no "<" but the tags': each line one self-closing element of quoted attributes.
_NAME = rb"[A-Za-z_][A-Za-z0-9._-]*+"
_FIRST = re.compile(rb"[ \t]*+<" + _NAME + rb"[ \t]++(" + _NAME + rb")=")
_BOUNDARY = re.compile(rb"[ \t]*+/>\n[ \t]*+<" + _NAME + rb"[ \t]++(" + _NAME + rb")=")
_NEXT = re.compile(rb"[ \t]++(" + _NAME + rb")=")
_LAST = re.compile(rb"[ \t]*+/>\n")
_TS = rb"[0-9]{1,15}(?:\.[0-9]{1,15})?"  # a ts JsonLines reads
_NUMBERS = re.compile(_TS + rb'(?:"' + _TS + rb")*+")
_INTEGERS = re.compile(rb'(?:[1-9][0-9]{0,17}|0)(?:"(?:[1-9][0-9]{0,17}|0))*+')  # integers as int() reads them
# Lines with their attributes in other orders: each line one such element, a value printable ASCII without a quote,
# "&", "<", "=", ">" or backslash (so each " name=" in a line starts an attribute: the scan finds the line's attribute)
_TEXT = rb'[ !#-%\'-;?-\[\]-~]*+'
_PLAIN = re.compile(rb"(?:[ \t]*+<" + _NAME + rb"(?:[ \t]++" + _NAME + rb'="' + _TEXT + rb'")++[ \t]*+/>\n)++')
_ENCODING = re.compile(rb"""\sencoding\s*=\s*["']([A-Za-z0-9._-]+)["']""")
_LIKELY = re.compile(rb"\n[ \t]*+<" + _NAME + rb"[ \t][^<>&\n]*/>\n")  # a line perhaps plain


def _attribute(name: bytes, value: bytes) -> re.Pattern[bytes]:
    """Attribute ``name`` of a line of ``_PLAIN``, its value matching ``value``, and the rest of the line."""
    return re.compile(rb"[ \t]" + re.escape(name) + rb'="(' + value + rb')"[^\n]*+')


def reads_xml_itself(path: str, fmt: str | None, opts: ReaderOptions, groups: list[Group],
                     head: bytes | None = None) -> bool:
    """Whether the workers can read ``path`` themselves: a regular, uncompressed XML file with numeric times,
    events typed by their tag, in UTF-8, a line in its first 4 KiB that may be plain, and every keyed group keyed
    by one attribute (not the ts, ``type`` or ``seq``). ``head``: the file's
    :func:`~yfpp.workers.reading.file_head` where the caller has it (None: read here)."""
    head = head if head is not None else file_head(path)
    if head is None or opts.unit is ISO_8601 or opts.type_field is not None or not _name(opts.ts_field):
        return False
    fmt = file_format(path, fmt, head)
    declared = _ENCODING.search(head[:head.find(b"?>")]) if head.lstrip(b"\xef\xbb\xbf")[:5] == b"<?xml" else None
    if declared is not None and declared[1].lower() not in (b"utf-8", b"utf8"):
        return False
    return fmt == "xml" and _LIKELY.search(head) is not None and all(
        len(g.key) == 1 and _name(g.key[0]) and g.key[0] not in (opts.ts_field, "type", "seq") for g in groups if g.key)


def _name(name: str) -> bool:
    """Whether ``name`` is an attribute name the plain lines' readers take."""
    return re.fullmatch(NAME, name.encode()) is not None


class _Owners(dict):
    """Per attribute text, the worker of ``n`` its typed value hashes to (as routing a parsed
    event does); 4,096 texts kept at most, then forgotten at once."""

    def __init__(self, n: int):
        super().__init__()
        self.n = n

    def __missing__(self, text: bytes) -> int:
        if len(self) >= 4096:
            self.clear()
        owner = self[text] = hash(typed_value(text.decode("utf-8", "surrogateescape"))) % self.n
        return owner


class Scanner:
    """The :class:`~yfpp.workers.reading.Scan` of a block of complete lines for ``n`` workers, routed by ``keys``:
    scanned when every line is ``<tag name="value" …/>``, one of them the ts, a number, with each key, and no ``&``,
    ``\\r`` or namespace. Lines of as many attributes, the ts and keys at the same places (the tags, blanks and other
    names may differ), are the quickest: cut at its quotes, such a block is a run of lines of as many pieces each;
    other blocks are found by regular expressions, their values printable ASCII without a quote, ``&``, ``<``,
    ``=``, ``>`` or backslash."""

    def __init__(self, opts: ReaderOptions, keys: Sequence[str], n: int):
        self.unit, self.ts_field, self.n = opts.unit, opts.ts_field.encode(), n
        self.keys = [k.encode() for k in keys]
        self.max_record_bytes = opts.max_record_bytes
        self.owners = _Owners(n)
        self.last = JsonLines(opts)
        self.ts = _attribute(self.ts_field, _TS)
        self.attributes = [_attribute(k, _TEXT) for k in self.keys]

    def __call__(self, body: bytes) -> Scan:
        not_scanned = Scan(len(body), None, [], None)
        lines = body.count(b"\n")
        if not lines or b"&" in body or b"\r" in body or b"xmlns" in body:
            return not_scanned
        cap = self.max_record_bytes  # (a line over it: the reader's dead letter, "too large")
        if len(body) > cap and max(map(len, body.split(b"\n"))) > cap:
            return not_scanned
        pieces = body.split(b'"')
        step = (len(pieces) - 1) // lines
        names = self._names(pieces, step) if step >= 2 and step % 2 == 0 and step * lines + 1 == len(pieces) \
            and body.count(b"<") == lines else None
        if names is not None and names.count(self.ts_field) == 1 and all(names.count(k) == 1 for k in self.keys):
            raw = pieces[2 * names.index(self.ts_field) + 1::step]
            values = [pieces[2 * names.index(k) + 1::step] for k in self.keys]
        elif _PLAIN.fullmatch(body) is not None:
            raw, values = self.ts.findall(body), [a.findall(body) for a in self.attributes]
            if len(raw) != lines or any(len(v) != lines for v in values):
                return not_scanned
        else:
            return not_scanned
        # (a tab in a value is a space to XML: the routing text is not the value's)
        if _NUMBERS.fullmatch(b'"'.join(raw)) is None or any(b"\t" in b"".join(v) for v in values):
            return not_scanned
        ts = number_times(raw, self.unit)
        if not _ordered(ts):
            return not_scanned
        owners = list(map(self._owners, values))
        # the last line an event (a line of this shape may be none: a duplicate attribute): else not scanned
        if self.last.read(body[body.rfind(b"\n", 0, len(body) - 1) + 1:], 0, 0) is None:
            return not_scanned
        return Scan(len(body), ts, owners, (ts[-1], lines - 1), True, lines=lines)

    @staticmethod
    def _names(pieces: list[bytes], step: int) -> list[bytes | None] | None:
        """The name of each attribute place of a block cut at its quotes into ``step`` pieces a line (None for a
        place whose name changes from line to line), or None when its lines are not each a self-closing element of
        ``step // 2`` attributes."""
        first, last = _FIRST.fullmatch(pieces[0]), _LAST.fullmatch(pieces[-1])
        if first is None or last is None:
            return None
        starts = {first[1]}
        for piece in set(pieces[step:-1:step]):
            m = _BOUNDARY.fullmatch(piece)
            if m is None:
                return None
            starts.add(m[1])
        names = [first[1] if len(starts) == 1 else None]
        for j in range(2, step, 2):
            found = {m[1] if (m := _NEXT.fullmatch(piece)) is not None else None for piece in set(pieces[j::step])}
            if None in found:
                return None
            names.append(found.pop() if len(found) == 1 else None)
        return names

    def _owners(self, values: list[bytes]) -> Owners:
        """The worker each key text routes to."""
        if _INTEGERS.fullmatch(b'"'.join(values)) is not None:
            return workers_of(map(int, values), self.n)
        return owner_array(map(self.owners.__getitem__, values), self.n)


class OneReader:
    """The one reader (:class:`~yfpp.input.xml_reader.Splitter`) of a worker: given each block it reads
    (:meth:`read`) and the size of each it skips (:meth:`skip`)."""

    def __init__(self, opts: ReaderOptions):
        self._data = b""
        self.splitter = Splitter(self._give, opts)
        self.typed = TypedValues()

    def _give(self, size: int) -> bytes:
        data, self._data = self._data, b""
        return data

    @property
    def seq(self) -> int:
        """The next record's seq."""
        return self.splitter.count

    @property
    def line(self) -> int:
        """The line the next record starts on (when :meth:`plain`)."""
        return self.splitter.line

    def plain(self) -> JsonLines | None:
        """The reader of the plain lines that would come next, when the one reader would read them so."""
        sp = self.splitter
        readers = sp.scoped_readers() if sp.between_events() else None
        return readers[0] if readers is not None and readers[0].enabled else None

    def read(self, body: bytes, dl: DeadLetters) -> list[Event]:
        """The events of the records ``body`` completes (``b""``: the end of the input); dead letters to ``dl``."""
        sp = self.splitter
        seq = sp.count
        self._data = body
        return record_events(sp.read_records(), seq, sp, self.typed, dl)

    def skip(self, lines: int) -> None:
        """Past a block of ``lines`` plain lines (each one record), read elsewhere."""
        self.splitter.count += lines
        self.splitter.line += lines


def last_xml_ts(fd: int, size: int, opts: ReaderOptions) -> float | None:
    """The ts of the last line ``<tag … ts="number" …/>`` of the XML file open as ``fd`` (``size`` bytes) among its
    last :data:`~yfpp.workers.reading.BLOCK` bytes (None: none, or ISO-8601 times), read without moving the file's
    position: where the slices are planned to (a plan only: a line that is no event moves the slices, never the
    matches)."""
    if opts.unit is ISO_8601:
        return None
    tail = os.pread(fd, workers_reading.BLOCK, max(0, size - workers_reading.BLOCK))
    ts = _attribute(opts.ts_field.encode(), _TS)
    for line in reversed(tail.split(b"\n")[size > workers_reading.BLOCK:]):
        line = line.strip()
        if line[:1] == b"<" and line[-2:] == b"/>" and (m := ts.search(line)) is not None:
            return number_times([m[1]], opts.unit)[0]
    return None


def read_alone(body: bytes, scope: bytes, line: int, opts: ReaderOptions, dl: DeadLetters) -> list[Event]:
    """The events of ``body``'s lines as the one reader reads them inside a root of the namespaces of ``scope``
    (:attr:`~yfpp.input.xml_reader.Splitter.wrapper_open`), the first on line ``line``, numbered from 0; dead
    letters to ``dl``."""
    one = OneReader(opts)
    one.splitter.line = line - 1
    events = one.read(b"".join((scope, b"\n", body, BATCH_END, b"\n")), dl)
    return events + one.read(b"", dl)


def line_blocks(f: BinaryIO, size: int) -> Iterator[bytes]:
    """The bytes of ``f`` a block of about ``size`` at a time, each cut after its last line end (one without a line
    end whole: a long line in pieces, which the one reader reads; memory holds two blocks at most)."""
    carry = b""
    while data := f.read(size):
        block = carry + data
        cut = block.rfind(b"\n") + 1 or len(block)
        carry = block[cut:]
        yield block[:cut]
    if carry:
        yield carry


class XmlShare(Share):
    """Worker ``index`` of ``n``'s share of the XML file ``path`` (see :class:`~yfpp.workers.reading.Share`)."""

    _one: OneReader  # the one reader, of every block not scanned
    _reader: JsonLines | None = None  # the reader of the block's plain lines (None: the one reader reads it)
    _scope: bytes = b""  # the start tag of the root they are in (its namespaces)

    def _relay(self, f: BinaryIO) -> Relay:
        self._one = OneReader(self.opts)
        return Relay(line_blocks(f, workers_reading.BLOCK), Scanner(self.opts, self.keys, self.n), self.me, self.n,
                     self.inboxes, every_ts=any(g.sliced for g in self.groups))

    def _last_ts(self, f: BinaryIO) -> float | None:
        return last_xml_ts(f.fileno(), os.fstat(f.fileno()).st_size, self.opts) if self._open else None

    def _plain_next(self) -> bool:
        """(the one reader's reader of plain lines, and the root they are in, taken for the next block)"""
        one = self._one
        self._reader, self._scope = one.plain(), one.splitter.wrapper_open
        return self._reader is not None

    def _position(self) -> tuple[int, int]:
        return self._one.seq, self._one.line

    def _skip(self, lines: int) -> None:
        self._one.skip(lines)

    def _read(self, body: bytes) -> list[Event] | None:
        return self._one.read(body, self.dead if self.me == 0 else self.quiet)

    def _parse(self, body: bytes, union: Sequence[int] | None, seq: int, lineno: int,
               reporter: Sequence[int] | None, sc: Scan) -> tuple[list[Event], bool]:
        """The events of the block's lines ``union`` flags (None: every line; the block's first line is record
        ``seq``, on line ``lineno``), each with every key attribute the scan found; the dead letters and events of
        the lines this worker reports counted (``sc``, the block's scan: not read here)."""
        if union is None:
            region, numbers = body, None
        else:
            region = b"\n".join(compress(body.split(b"\n"), union)) + b"\n"
            numbers = list(compress(range(seq, seq + len(union)), union))
        assert self._reader is not None  # (a block is scanned only where the plain lines have a reader)
        events = self._reader.read(region, seq, lineno, numbers)
        me = self.me
        if events is None:  # (a line the plain reader refuses: the block read the long way, this worker's kept)
            caught = KeptDeadLetters()
            events = read_alone(body, self._scope, lineno, self.opts, caught)
            mine = None if union is None else set(compress(range(len(union)), union))
            events = [ev for ev in events if mine is None or ev.seq in mine]
            for ev in events:
                ev.seq += seq
            for j, position, reason, raw in caught.items:
                if (mine is None or j in mine) and (reporter[j] if reporter is not None else 0) == me:
                    self.dead.report(seq + j, position, reason, raw)
        self._count(events, seq, reporter)
        return events, True
