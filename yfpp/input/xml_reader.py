"""XML feeds: a byte-level splitter cuts the input into event elements, a hardened lxml parser reads each.

Which elements are events: every top-level element is looked at in turn. A
self-closing one, or one whose children are all plain leaves (``<v>1</v>``,
``<v/>``: no attributes, no element children), is one event. Any other is a
*root* (``<stream ts="0">`` included: attributes do not matter): its children
are the events; one with an end tag, no ts attribute and only blank space
inside is an empty root (no event). When a root closes the next top-level element is looked at
the same way — so a document, a rootless concatenation of events (a socket
feed) and concatenated documents (XML declarations between them included) all
read. A root not closed at the end of the input is reported.

Resynchronisation: the splitter knows only what it needs to find where an
element ends (tag syntax, quotes, comments, CDATA, processing instructions)
and counts lines (line ends CR LF and CR are made LF as they are read, as XML
does). Each event element is parsed on its own, so a syntax error
(bad UTF-8, a control character, an undefined entity, a bad name…) costs that
record: one dead letter at its true line. A malformed tag costs the text up to
the next ``<`` (attribute values cannot contain ``<``). An element that is not
closed is reported when an end tag of the root (or the end of the input)
shows it, or when it passes ``max_record_bytes`` with a child of its own name
(most likely the next event) — the reader then reads again from just after its
start tag — or when an element carrying the ts attribute appears inside it:
that is taken as the next event (so an event may not contain elements with a ts
attribute).
Non-blank text and stray end tags between events are dead letters too.

Speed: before the splitter reads a block, the block's lines up to the last
one that starts an event (at the indentation event start tags were last seen
at; in a feed on one line, up to the last start tag named as the first) are
parsed by lxml in one go; when that parses and is plainly a run of events
(:meth:`Splitter._not_plain` finds nothing the splitter would treat
differently) the splitter is not needed. A block where a tag runs across a line
end is left to the splitter: lxml gives an element the line its start tag ends
on, a record's line is the one it starts on. So the per-event cost of a clean feed
is lxml's, and the splitter only reads blocks that hold something wrong. The
plainest feeds — every line one self-closing element or one element of leaf
children, no namespace but the root's, no entity or character reference
(:meth:`Splitter._plain_lines`) — build no tree at all (:mod:`yfpp.input.xml_lines`): in
UTF-8 with a ts of digits (a decimal fraction allowed) or ISO-8601, attributes in
any order, a block is read as one JSON document without an XML parser; leaf
children by regular expressions; otherwise (no namespace) a parser target makes
each event from the tag and attribute texts lxml reads. The event keeps those texts
(``Event.texts``, read from its line when first asked for) and builds its element
from them, or parses its line, only when something asks for it (XPath predicates,
checkpoints): the same element, line included.

Caps (:class:`~yfpp.input.record_fields.ReaderOptions`): an event element longer than
``max_record_bytes`` is one dead letter (its first bytes as ``raw``) and is
skipped to its end without being held in memory — a start tag over the cap
included (:meth:`Splitter._skip_tag` follows its quotes); at top level such a
start tag is reported and its element read as a root; an event nested deeper than
``max_depth`` is one dead letter. Memory holds one read block plus at most
one capped element.

DOCTYPE: a bare ``<!DOCTYPE name>`` is ignored (it declares nothing). One with
an internal subset or an external identifier (SYSTEM / PUBLIC) is refused: one
dead letter ``DTD not allowed`` and nothing after it is read; nothing is
expanded, loaded or fetched. No entity but the five predefined ones and
character references exists (an undefined one is malformed). Encodings: the
XML declaration's (ASCII-compatible encodings only; UTF-8 by default), from
where it stands to the end of its document (the end tag of the next root, or
of an empty root); the next document is UTF-8 unless it declares otherwise.
Each record keeps the encoding it was read in (:class:`Chunk`), so a
declaration never applies to records before it in the same read block.
"""

from __future__ import annotations

import re
import zlib
from typing import IO, Any, Callable, Iterator, NamedTuple

from lxml import etree

from yfpp.input.dead_letters import DeadLetters
from yfpp.errors import InputError
from yfpp.input.events import Event
from yfpp.input.record_fields import ISO_8601, RAW_PREVIEW, READ_BLOCK, ReaderOptions, pop_ts, pop_type, preview, typed_value
from yfpp.input.xml_element import line_element
from yfpp.input.xml_parsing import BATCH_END, hardened_parser, parse_alone
from yfpp.input.xml_lines import PLAIN_SCOPE, ChildReadings, JsonLines, LineEvents, Lines, TypedValues, number_ts

# Every repetition possessive (``++``, ``*+``): what follows each can never be what it repeats, so the matches
# are the same, and a long token cut short by the end of the buffer fails in one pass instead of backtracking
# through it at every read (a 1 MB tag name cost 1.3 CPU-s).
_NAME = rb"[^\s<>/!?=\"'&]++"
_ATTRIBUTES = rb"(?:\s++[^\s<>/=\"']++\s*+=\s*+(?:\"[^\"<]*+\"|'[^'<]*+'))*+"
_START = re.compile(rb"<(" + _NAME + rb")(" + _ATTRIBUTES + rb")\s*+(/?)>")
_SPACE_EMPTY = re.compile(rb"[ \t\r\n]*+(<" + _NAME + _ATTRIBUTES + rb"\s*+/>)")
_END = re.compile(rb"</(" + _NAME + rb")\s*+>")
_TAG_NAME = re.compile(rb"<(" + _NAME + rb")")
# a tag (or comment, CDATA section, processing instruction) that goes on past a line end, in or out of its
# quoted values: an element's ``sourceline`` from lxml is the line its start tag ends on, a record's line is
# where it starts (the splitter counts those)
_MARKUP_ACROSS_LINES = re.compile(rb"""<[^<>"'\n]*+(?:(?:"[^"\n]*+"|'[^'\n]*+')[^<>"'\n]*+)*+[\n"']""")
_AFTER_NAME = (b" ", b"\t", b"\n", b"/", b">")  # what may follow a tag's name (line ends are LF by then)
# the text of a start tag up to what ends it or starts or ends a quoted value ('<' ends it too: a malformed tag)
_TAG_TEXT = {b"": re.compile(rb"[^\"'<>]*"), b'"': re.compile(rb'[^"<]*'), b"'": re.compile(rb"[^'<]*")}
_XMLNS = re.compile(rb"""\s(xmlns(?::[^\s=]+)?\s*=\s*(?:"[^"\n]*"|'[^'\n]*'))""")
_ENCODING = re.compile(rb"""\sencoding\s*=\s*["']([A-Za-z0-9._-]+)["']""")
# the name and the space after it possessive: a name cut short by the end of the buffer does not match
_DOCTYPE = re.compile(rb"<!DOCTYPE\s+(?>" + _NAME + rb")\s*+(.)", re.S)
_BLANK = re.compile(rb"[ \t\r\n]*\Z")
_SPACE = re.compile(rb"[ \t\r\n]*")
_INDENT = re.compile(rb"[ \t]*")
_LEAD = re.compile(rb"(?:[ \t\r\n]*\n)?([ \t]*)<")
_LINE_COL = re.compile(r", line \d+, column \d+$")
_UTF8 = ("utf-8", "utf8")  # a declared encoding that is UTF-8


class Chunk(NamedTuple):
    """One event element's bytes, the line it starts on, the start tag its namespaces come from, and the
    encoding its bytes are in (its document's: None for UTF-8)."""

    data: bytes
    line: int
    scope: bytes
    encoding: str | None


class Region(NamedTuple):
    """Event elements parsed in one go (detached), the line their text starts on, and whether they are
    flat: each a childless element without namespaces (see :func:`_flat_events`)."""

    elements: list[Any]
    line: int
    flat: bool


class Bad(NamedTuple):
    """A dead letter found by the splitter."""

    line: int
    reason: str
    raw: str | None


class Splitter:
    """Cuts XML bytes into :class:`Chunk`\\ s and :class:`Bad`\\ s, in input order (see the module docstring)."""

    def __init__(self, read: Callable[[int], bytes | str], opts: ReaderOptions):
        self._read = read
        self.cap = opts.max_record_bytes
        self.max_depth = opts.max_depth
        self.ts_field = opts.ts_field
        self.lines_ok = opts.type_field is None and opts.unit is not ISO_8601  # what Lines records assume
        # Is a parsed run of lines not plainly events? Text between them, an element with a ts attribute
        # inside one, nesting over the cap, or (at top level) an element with element children that have
        # attributes or children of their own (a root).
        plain_test = "text()[normalize-space()] | */descendant::*[@*[name()=$ts]] | *" + "/*" * opts.max_depth
        self._not_plain_in_root = etree.XPath(f"boolean({plain_test})")
        # (or an element holding nothing, without a ts attribute: perhaps an empty root, which the splitter tells)
        self._not_plain_at_top = etree.XPath(
            f"boolean({plain_test} | */*[* or @*] | *[not(*) and not(normalize-space()) and not(@*[name()=$ts])])")
        self._text_in = etree.XPath("boolean(text()[normalize-space()])")
        self._ts_attr = re.compile(rb"\s" + re.escape(opts.ts_field.encode()) + rb"\s*=")
        self.buf = b""
        self.pos = 0
        self.line = 1
        self.eof = False
        self.stopped = False
        self.first = True
        self.cr = b""  # a CR that ended the last read (see _line_ends)
        self.encoding: str | None = None  # the current document's (None: UTF-8), see _declaration
        self.wrapper: bytes | None = None  # name of the open root
        self.wrapper_line = 0
        self.wrapper_open = b"<yfpp-batch>"
        self.skip_text = False  # dropping the rest of an oversized run of text or markup up to the next '<'
        self.out: list[Chunk | Region | Lines | Bad] = []
        self._parsers: dict[str | None, Any] = {}
        self.count = 0  # records handed out (the seq of the next one)
        self.opts = opts
        # JsonLines and ChildReadings for each wrapper (by its start tag: the namespaces it declares)
        self._readers: dict[bytes, tuple[JsonLines, ChildReadings] | None] = {}
        self._line_events = LineEvents(opts)
        self._line_parsers: dict[str | None, Any] = {}
        self.indent: bytes | None = None  # the indentation of event start tags, as last seen
        # the element being read (self.stack non-empty)
        self.stack: list[bytes] = []
        self.extra = 0  # depth beyond max_depth (names not kept)
        self.start = self.start_line = self.tag_end = self.tag_end_line = 0
        self.start_attrs = b""
        self.undecided = False  # a top-level element: event or root?
        self.broken: str | None = None
        self.skipping: str | None = None  # the raw preview of an element over the cap (content dropped)
        self.twin = False  # the event being read has a child of its own name (a sign it was not closed)
        # in a start tag over the cap (skipped as it is read): b"" outside its quotes, else the open quote
        self.tag_quote: bytes | None = None
        self.tag_slash = False  # that tag's last byte read so far was '/'

    # -- input -----------------------------------------------------------------------------

    def _refill(self) -> None:
        keep = self.start if self.stack and self.skipping is None else self.pos
        # a record longer than a block: ask for as much again as is kept of it, so that what is scanned again
        # at each read adds up to about twice the record, not its square over the block
        data = self._read(max(READ_BLOCK, len(self.buf) - keep))
        if isinstance(data, str):
            data = data.encode("utf-8")
        if not data:
            self.eof = True
        if self.cr or b"\r" in data:
            data = self._line_ends(data)
        self.buf = self.buf[keep:] + data
        self.pos -= keep
        self.start -= keep
        self.tag_end -= keep

    def _line_ends(self, data: bytes) -> bytes:
        """``data`` with its line ends (CR LF, lone CR) made LF, as an XML parser makes them before reading
        (so lines are counted as XML counts them); a CR at its end waits for the next read, which may
        start with its LF."""
        data = self.cr + data
        self.cr = b""
        if data[-1:] == b"\r" and not self.eof:
            data, self.cr = data[:-1], b"\r"
        return data.replace(b"\r\n", b"\n").replace(b"\r", b"\n")

    def _byte_order_mark(self) -> None:
        """Refuse UTF-16 and drop a UTF-8 byte order mark: decided on the input's first three bytes."""
        self.first = False
        if self.buf[:2] in (b"\xff\xfe", b"\xfe\xff"):
            raise InputError("UTF-16 XML is not supported (ASCII-compatible encodings only)")
        if self.buf[:3] == b"\xef\xbb\xbf":
            self.buf = self.buf[3:]

    def parser(self, encoding: str | None) -> Any:
        """The hardened lxml parser for ``encoding`` (None: UTF-8)."""
        parser = self._parsers.get(encoding)
        if parser is None:
            parser = self._parsers[encoding] = hardened_parser(encoding)
        return parser

    def records(self) -> Iterator[list[Chunk | Region | Lines | Bad]]:
        """Lists of records, one list per block read (so a live feed is read as it arrives)."""
        while not self.stopped:
            out = self.read_records()
            if out:
                yield out
            if self.eof:
                return

    def read_records(self) -> list[Chunk | Region | Lines | Bad]:
        """Reads a block of the input: the records it completes (all of them, the end reported, once it is at its
        end; none when the reader has stopped); :attr:`count` moved past them."""
        if self.stopped:
            return []
        self._refill()
        if self.first:
            if len(self.buf) < 3 and not self.eof:
                return []  # a byte order mark may be cut short
            self._byte_order_mark()
        if not self.stack and not self.skip_text:
            self._whole_lines()
        while not self.stopped and self._step():
            pass
        if self.eof and not self.stopped:
            self._finish()
        elif self.stack and self.skipping is None and len(self.buf) - self.start < READ_BLOCK:
            # leave a small unfinished element to the next block, where the fast path may take it
            self.stack, self.pos, self.line = [], self.start, self.start_line
        out, self.out = self.out, []
        self.count += _records(out)
        return out

    def between_events(self) -> bool:
        """Whether all read so far is read, inside a root (not at its end), in UTF-8: where the next line of plain
        events would be read by its root's :meth:`scoped_readers` (if they are not None)."""
        return (self.wrapper is not None and not self.stack and not self.skip_text and self.tag_quote is None
                and self.pos == len(self.buf) and not self.cr and not self.first and not self.eof and not self.stopped
                and (self.encoding is None or self.encoding.lower() in _UTF8))

    def _step(self) -> bool:
        """Read one thing; False when more input is needed."""
        if self.tag_quote is not None:
            return self._skip_tag()
        return self._step_in() if self.stack else self._step_out()

    def _whole_lines(self) -> None:
        """The fast path: parse every complete line in the buffer at once when that is plainly a run of events.

        Taken only when lxml accepts the lines as a sequence of elements with blank
        text between them, none over a cap, and each is what the splitter would call an
        event (see ``_not_plain``); otherwise the splitter reads them.
        """
        cut = len(self.buf) if self.eof else self._last_event_line() or self._last_event_tag()
        if cut - self.pos <= 0 or cut - self.pos > self.cap:
            return
        region = self.buf[self.pos:cut]
        lines = self._plain_lines(region)
        if lines is not None:
            self.out.append(lines)
            self.line += len(lines.items)  # one line each
            self.pos = cut
            return
        if _MARKUP_ACROSS_LINES.search(region) is not None:  # lxml would give the line the tag ends on
            return
        parser = self.parser(self.encoding)
        try:
            root = etree.fromstring(b"".join((self.wrapper_open, region, BATCH_END)), parser)
        except etree.XMLSyntaxError:
            return
        if len(parser.error_log):  # an error lxml logs without raising it (an undeclared prefix): the splitter's
            return
        flat = b"</" not in region  # every element self-closing: no children, no text in an event
        if not len(root) or self._not_plain(root, ts=self.ts_field, flat=flat):
            return
        elements = list(root)
        del root[:]  # detached
        # no namespace (declared here or on the root, or the predeclared xml: prefix): no name in {uri} form
        flat = flat and self.wrapper_open == b"<yfpp-batch>" and b"xmlns" not in region and b"xml:" not in region
        self.out.append(Region(elements, self.line, flat))
        self._advance(cut)

    def _plain_lines(self, region: bytes) -> Lines | None:
        """The events of ``region`` when it is the plainest feed: every line one self-closing element (or one
        element of leaf children) and a ``\\n``, all but the first at one indentation (no ``>`` elsewhere: no
        text, comment or other markup between them), no namespace but its root's, no entity or character
        reference; None otherwise or when lxml does not accept it.

        No element tree is built (:mod:`yfpp.input.xml_lines`): a UTF-8 block of ``<tag … ts="number" …/>`` lines
        (or ISO-8601 ts) is read as one JSON document, one of leaf children by regular expressions, any other
        without namespaces by an lxml parser target that makes each event from the element's tag and attribute
        texts; an element, should anything ask for it, is built from the texts (``Event.texts``) or parsed
        from its line.
        """
        if region[-2:] != b">\n" or b"&" in region:  # lxml's target gets "&#38;" for "&amp;"
            return None
        if self.encoding is None or self.encoding.lower() in _UTF8:  # (the readers check the rest themselves)
            readers = self.scoped_readers()
            if readers is not None:
                events = readers[region[-3:] != b"/>\n"].read(region, self.count, self.line)
                if events is not None:
                    return Lines(events, True)
        if not self.lines_ok or region[-3:] != b"/>\n" or self.wrapper_open != PLAIN_SCOPE:
            return None
        n = region.count(b"\n")
        if region.count(b">") != n or b"xmlns" in region or b"xml:" in region:
            return None
        first = _INDENT.match(region).end()  # type: ignore[union-attr]
        indent = _INDENT.match(region, region.find(b"\n") + 1).group()  # type: ignore[union-attr]
        # every line but the last ends "/>" and the next starts at the indentation, the last ends "/>": each of the
        # n line ends is a "/>\n" (one count for the two, a pass over the region less)
        if region[first:first + 1] != b"<" or region.count(b"/>\n" + indent + b"<") != n - 1:
            return None
        parser = self._line_parsers.get(self.encoding)
        if parser is None:
            parser = self._line_parsers[self.encoding] = hardened_parser(self.encoding, self._line_events)
        self._line_events.reset(self.count, self.line, region.isascii())
        try:
            lines = etree.fromstring(b"".join((b"<yfpp-batch>", region, BATCH_END)), parser)
        except etree.XMLSyntaxError:
            return None
        # an error lxml logs without raising it to a target (an undeclared prefix) makes the tree parse fail
        return lines if len(lines.items) == n and not len(parser.error_log) else None

    def scoped_readers(self) -> tuple[JsonLines, ChildReadings] | None:
        """The readers of plain lines inside the current wrapper (its namespaces), or None when the wrapper does
        not parse (then every record is a dead letter, which the splitter reports)."""
        scope = self.wrapper_open
        readers = self._readers.get(scope)
        if readers is None and scope not in self._readers:
            try:
                etree.fromstring(scope + BATCH_END, self.parser(None))
                readers = (JsonLines(self.opts, scope), ChildReadings(self.opts, scope))
            except etree.XMLSyntaxError:
                pass
            if len(self._readers) >= 64:  # (roots declare few namespaces: a feed of many keeps none)
                self._readers.clear()
            self._readers[scope] = readers
        return readers

    def _not_plain(self, root: Any, ts: str, flat: bool = False) -> bool:
        if flat:  # only text between the events could make it not plain
            return self._text_in(root)
        return (self._not_plain_at_top if self.wrapper is None else self._not_plain_in_root)(root, ts=ts)

    def _learn_indent(self, space: int, tag: int) -> None:
        """Remember the indentation of an event start tag at ``tag`` (blank space from ``space``), if it starts a line."""
        nl = self.buf.rfind(b"\n", space, tag)
        if nl >= 0:
            self.indent = self.buf[nl + 1:tag]

    def _last_event_line(self) -> int:
        """Where the last line that starts a start tag at the indentation of the first tag begins (a
        likely event boundary: the region before it holds whole events); 0 if there is none."""
        buf, pos = self.buf, self.pos
        m = _LEAD.match(buf, pos)
        if m is None:
            return 0
        needle = b"\n" + (m[1] if self.indent is None else self.indent) + b"<"
        cut = buf.rfind(needle, pos)
        while cut >= 0 and buf[cut + len(needle):cut + len(needle) + 1] in (b"/", b"!", b"?", b""):
            cut = buf.rfind(needle, pos, cut)
        return cut + 1 if cut >= 0 else 0

    def _last_event_tag(self) -> int:
        """For a feed with no such line (its events on one line): where the last start tag named as the first
        one begins (a likely event boundary; if it is not, the region does not parse and the splitter reads
        it); 0 if there is none."""
        buf, pos = self.buf, self.pos
        m = _TAG_NAME.match(buf, _SPACE.match(buf, pos).end())
        if m is None:
            return 0
        needle = m[0]
        cut = buf.rfind(needle, m.end())
        while cut >= 0 and buf[cut + len(needle):cut + len(needle) + 1] not in _AFTER_NAME:
            cut = buf.rfind(needle, m.end(), cut)
        return max(cut, 0)

    def _advance(self, to: int) -> None:
        self.line += self.buf.count(b"\n", self.pos, to)
        self.pos = to

    def _bad(self, line: int, reason: str, raw: bytes | None) -> None:
        self.out.append(Bad(line, reason, None if raw is None else preview(raw.rstrip())))

    # -- between events --------------------------------------------------------------------

    def _step_out(self) -> bool:
        """Read one thing between events; False when more input is needed."""
        buf, pos, line, out = self.buf, self.pos, self.line, self.out
        scope, encoding = self.wrapper_open, self.encoding
        if not self.skip_text:  # the hot path: blank space and a self-closing element, repeated
            match, count, last = _SPACE_EMPTY.match, buf.count, None
            while (m := match(buf, pos)) is not None and m.end() - m.start(1) <= self.cap:
                start, end = m.start(1), m.end()
                line += count(b"\n", pos, start)
                out.append(Chunk(buf[start:end], line, scope, encoding))
                line += count(b"\n", start, end)
                pos, last = end, m
            if last is not None:
                self._learn_indent(last.start(), last.start(1))
            self.pos, self.line = pos, line
        i = buf.find(b"<", pos)
        end = i if i >= 0 else len(buf)
        if end > pos:
            if self.skip_text:
                if i >= 0:
                    self.skip_text = False
            elif not _BLANK.match(buf, pos, end):
                if i < 0 and not self.eof and end - pos <= self.cap:
                    return False  # the text may go on
                self._advance(_SPACE.match(buf, pos).end())
                self._bad(self.line, "malformed XML: text outside an event", buf[self.pos:end])
                self.skip_text = i < 0
            self._advance(end)
        if i < 0:
            return False
        kind = buf[i + 1:i + 2]
        if kind == b"/":
            m = _END.match(buf, i)
            if m is None:
                return self._bad_markup(i)
            if m[1] == self.wrapper:
                self.wrapper, self.wrapper_open = None, b"<yfpp-batch>"
                self.encoding = None  # the document ended: the next one is UTF-8 unless it declares otherwise
            else:
                self._bad(self.line, f"malformed XML: stray end tag </{m[1].decode('utf-8', 'replace')}>", m[0])
            self._advance(m.end())
            return True
        if kind == b"!" or kind == b"?":
            return self._skip_special(i, kind)
        if not kind:
            return self._bad_markup(i)
        m = _START.match(buf, i)
        if m is None or m.end() - i > self.cap:
            return self._big_tag(i, m) or self._bad_markup(i)
        self._learn_indent(pos, i)
        if m[3]:
            self.out.append(Chunk(buf[i:m.end()], self.line, self.wrapper_open, self.encoding))
            self._advance(m.end())
            return True
        self.start, self.start_line, self.start_attrs = i, self.line, m[2]
        self._advance(m.end())
        self.tag_end, self.tag_end_line = self.pos, self.line
        self._open(m[1])
        return True

    def _open(self, name: bytes) -> None:
        """Start reading a top-level element or an event of the root, named ``name``."""
        self.stack = [name]
        self.extra = 0
        self.undecided = self.wrapper is None
        self.twin = False
        self.broken = self.skipping = None

    def _skip_special(self, i: int, kind: bytes) -> bool:
        """A comment, CDATA section, processing instruction or DOCTYPE between events."""
        buf = self.buf
        if kind == b"?":
            j = buf.find(b"?>", i + 2)
            if j < 0:
                return self._need(i)
            if buf.startswith(b"<?xml", i) and buf[i + 5:i + 6] in b" \t\r\n":
                self._declaration(buf[i:j + 2])
            self._advance(j + 2)
            return True
        if buf.startswith(b"<!--", i):
            j = buf.find(b"-->", i + 4)
            if j < 0:
                return self._need(i)
            self._advance(j + 3)
            return True
        if buf.startswith(b"<!DOCTYPE", i) and self.wrapper is None:
            m = _DOCTYPE.match(buf, i)
            if m is None and not self.eof and len(buf) - i < 4096:
                return False
            if m is not None and m[1] == b">":
                self._advance(m.end())
                return True
            self._bad(self.line, "DTD not allowed: a DOCTYPE with an internal subset or an external DTD "
                                 "(nothing is expanded or fetched; the rest of the input is not read)", None)
            self.stopped = True
            return False
        if len(buf) - i < 9 and not self.eof:
            return False
        return self._bad_markup(i)

    def _declaration(self, decl: bytes) -> None:
        """An XML declaration: its encoding holds from here to the end of the document (the next root's end
        tag); none declared is UTF-8."""
        m = _ENCODING.search(decl)
        encoding = m[1].decode("ascii") if m else None
        try:
            etree.XMLParser(encoding=encoding)
        except LookupError:
            self._bad(self.line, f"malformed XML: unknown encoding {encoding!r} (reading as UTF-8)", decl)
            encoding = None
        self.encoding = encoding

    def _need(self, i: int) -> bool:
        """An unfinished token at ``i``: wait for more input unless it is over the cap or the input ended."""
        if not self.eof and len(self.buf) - i <= self.cap:
            return False
        return self._bad_markup(i)

    def _bad_markup(self, i: int) -> bool:
        """Malformed (or unfinished) markup at ``i``: it runs to the next ``<``."""
        buf = self.buf
        j = buf.find(b"<", i + 1)
        if j < 0:
            if not self.eof and len(buf) - i <= self.cap:
                return False
            j = len(buf)
            self.skip_text = not self.eof and not self.stack
        raw = buf[i:j]
        reason = f"too large: markup over {self.cap:,} bytes" if self.skip_text else "malformed XML: bad markup"
        if self.stack:
            self.broken = self.broken or f"{reason} at line {self.line}"
        else:
            self._bad(self.line, reason, raw)
        self._advance(j)
        return True

    # -- inside an element -----------------------------------------------------------------

    def _step_in(self) -> bool:
        """Read one thing inside the element being read; False when more input is needed."""
        buf, pos = self.buf, self.pos
        i = buf.find(b"<", pos)
        self._advance(i if i >= 0 else len(buf))
        if self.pos - self.start > self.cap and self.skipping is None and not self._over_cap():
            return True
        if i < 0:
            return False
        kind = buf[i + 1:i + 2]
        if kind == b"/":
            m = _END.match(buf, i)
            if m is None:
                return self._bad_markup(i)
            return self._end_tag(i, m)
        if kind == b"!" or kind == b"?":
            close = b"?>" if kind == b"?" else b"]]>" if buf.startswith(b"<![CDATA[", i) else b"-->" if buf.startswith(b"<!--", i) else None
            if close is None:
                if len(buf) - i < 9 and not self.eof:
                    return False
                return self._bad_markup(i)
            j = buf.find(close, i + 2)
            if j < 0:
                return self._need(i)
            self._advance(j + len(close))
            return True
        m = _START.match(buf, i)
        if m is None or m.end() - i > self.cap:
            return self._big_tag(i, m) or self._bad_markup(i)
        if self.undecided and (len(self.stack) + self.extra > 1 or m[2].strip()):
            self._become_root()
            return True
        if self._ts_attr.search(m[2]) is not None:  # an event inside an event: the open one was not closed
            self._unclosed(i, resume_here=True)
            return True
        if not m[3]:
            self._push(m[1])
        self._advance(m.end())
        return True

    def _push(self, name: bytes) -> None:
        """A child element of the element being read starts."""
        depth = len(self.stack) + self.extra
        if depth == 1 and name == self.stack[0]:
            self.twin = True
        if len(self.stack) < self.max_depth:
            self.stack.append(name)
        else:
            self.extra += 1
        if depth + 1 > self.max_depth:
            self.broken = self.broken or f"too deep: more than {self.max_depth} levels of elements"

    def _big_tag(self, i: int, m: re.Match[bytes] | None) -> bool:
        """A start tag at ``i`` over the cap (``m``: its match, when it is whole in the buffer): its element
        is read on from there with the tag skipped as it is read (:meth:`_skip_tag`). False when there is
        none: not a start tag, or one that may still end within the cap."""
        buf = self.buf
        if m is None:
            if len(buf) - i <= self.cap or buf.find(b"<", i + 1) >= 0:
                return False
            m = _TAG_NAME.match(buf, i)
            if m is None:
                return False
        if not self.stack:
            self.start, self.start_line, self.start_attrs = i, self.line, b""
            self._open(m[1])
            self.skipping = preview(buf[i:i + RAW_PREVIEW + 1])
        else:
            if self.skipping is None and not self._over_cap():
                return True  # re-read from elsewhere
            self._push(m[1])
        self.tag_quote, self.tag_slash = b"", False
        self._advance(m.end(1))
        return True

    def _skip_tag(self) -> bool:
        """Read on through a start tag over the cap, keeping nothing; False when more input is needed."""
        buf, pos, quote, slash = self.buf, self.pos, self.tag_quote, self.tag_slash
        while True:
            end = _TAG_TEXT[quote].match(buf, pos).end()  # type: ignore[index, union-attr]
            if not quote and end > pos:
                slash = buf[end - 1] == 47  # '/'
            if end == len(buf):
                self.tag_quote, self.tag_slash = quote, slash
                self._advance(end)
                return False
            char = buf[end]
            if char == 34 or char == 39:  # a quote opens or closes
                quote, slash, pos = (b"" if quote else buf[end:end + 1]), False, end + 1
                continue
            self.tag_quote = None
            self._advance(end + 1 if char == 62 else end)  # '>', or a '<' that ends a malformed tag
            self._tag_end(char == 62 and slash)
            return True

    def _tag_end(self, self_closing: bool) -> None:
        """The end of a start tag over the cap."""
        if self_closing:
            if self.extra:
                self.extra -= 1
            else:
                self.stack.pop()
            if not self.stack:
                self._complete()
        elif self.undecided:  # a top-level element over the cap before any child: a root
            self.out.append(Bad(self.start_line, f"too large: a start tag over {self.cap:,} bytes (read as a root: "
                                                 "its attributes are not read, its children are events)", self.skipping))
            self.tag_end, self.tag_end_line = self.pos, self.line
            self._become_root()

    def _end_tag(self, i: int, m: re.Match[bytes]) -> bool:
        name, stack = m[1], self.stack
        if self.extra:
            self.extra -= 1
        elif name == stack[-1]:
            stack.pop()
        elif name == self.wrapper and name not in stack:
            self._unclosed(i)
            return True
        else:
            self.broken = self.broken or (
                f"malformed XML: end tag </{name.decode('utf-8', 'replace')}> at line {self.line} "
                f"does not match <{stack[-1].decode('utf-8', 'replace')}>")
            del stack[stack.index(name) if name in stack else -1:]
        self._advance(m.end())
        if not stack:
            if self.undecided and _BLANK.match(self.buf, self.tag_end, i) and not self._ts_attr.search(self.start_attrs):
                # an empty root (a document without events): nothing to read, and the document ended
                self.encoding = None
                return True
            self._complete()
        return True

    def _complete(self) -> None:
        if self.skipping is not None:
            self.out.append(Bad(self.start_line, f"too large: an element over {self.cap:,} bytes", self.skipping))
        elif self.broken:
            self._bad(self.start_line, self.broken, self.buf[self.start:self.pos])
        else:
            self.out.append(Chunk(self.buf[self.start:self.pos], self.start_line, self.wrapper_open, self.encoding))

    def _over_cap(self) -> bool:
        """The element outgrew the cap: a root if still undecided, else skipped to its end; False if it was re-read."""
        if self.undecided:
            self._become_root()
            return False
        if self.twin:  # a child of its own name: more likely the next event, this one not closed
            self._unclosed(self.pos)
            return False
        self.skipping = preview(self.buf[self.start:self.start + RAW_PREVIEW + 1])
        return True

    def _become_root(self) -> None:
        """The top-level element being read is a root: its children are events; re-read them."""
        self.wrapper, self.wrapper_line = self.stack[0], self.start_line
        self.wrapper_open = b"<yfpp-batch" + b"".join(b" " + ns for ns in _XMLNS.findall(self.start_attrs)) + b">"
        self.stack = []
        self.pos, self.line = self.tag_end, self.tag_end_line

    def _unclosed(self, i: int, resume_here: bool = False) -> None:
        """The element being read is not closed: report it and go on at ``i`` (``resume_here``: the next
        event starts there) or re-read what followed its start tag."""
        name = self.stack[0].decode("utf-8", "replace")
        reason = f"malformed XML: <{name}> at line {self.start_line} is not closed"
        self.stack = []
        self.tag_quote = None
        if self.skipping is not None:
            self.out.append(Bad(self.start_line, reason, self.skipping))
            return  # its content was not kept: go on from here
        if resume_here:
            self._bad(self.start_line, reason, self.buf[self.start:i])
            return
        self._bad(self.start_line, reason, self.buf[self.start:self.tag_end])
        self.pos, self.line = self.tag_end, self.tag_end_line

    def _finish(self) -> None:
        """End of input: close what is open (re-reading the content of an unclosed event)."""
        while self.stack and not self.stopped:
            self._unclosed(len(self.buf))
            while not self.stopped and self._step():
                pass
        if self.wrapper is not None:
            name = self.wrapper.decode("utf-8", "replace")
            self._bad(self.wrapper_line, f"malformed XML: <{name}> at line {self.wrapper_line} is not closed at the end of the input", None)
            self.wrapper = None


# --------------------------------------------------------------------------- parsing chunks


class _FirstAttributes:
    """A parser target that keeps the attributes of the first element it sees."""

    def __init__(self) -> None:
        self.attrs: dict[str, str] | None = None

    def start(self, tag: str, attrs: dict[str, str]) -> None:
        if self.attrs is None:
            self.attrs = attrs

    def close(self) -> None:
        pass


MANY_ATTRIBUTES = 256  #: from here on an element's attributes are read through a parser target


def _attributes(elem: Any) -> Any:
    """``elem``'s attributes as (name, text) pairs. lxml looks up each value by name, a quadratic cost (a
    1 MiB element of 100,000 attributes: a minute), so a large set is read from the element's serialised
    text by a parser target instead, in linear time (the same names, in the same order)."""
    attrib = elem.attrib
    if len(attrib) < MANY_ATTRIBUTES:
        return attrib.items()
    target = _FirstAttributes()
    # lxml's own text of one element holds no DTD; resolve_entities turns &#38; back into & (libxml2 leaves
    # the references of attribute values to a target otherwise)
    etree.fromstring(etree.tostring(elem, with_tail=False), etree.XMLParser(target=target, resolve_entities=True,
                                                                            no_network=True, load_dtd=False))
    return target.attrs.items()  # type: ignore[union-attr]


def _parse_chunks(chunks: list[Chunk], parser: Callable[[str | None], Any]) -> list[Any]:
    """The element of each chunk (detached), or the :class:`Bad` for a chunk that does not parse.

    Consecutive chunks of one scope and encoding are parsed in one go, by ``parser(encoding)``, inside a
    copy of their root's namespace declarations; only when that fails is each parsed alone.
    """
    out: list[Any] = []
    start = 0
    for i in range(1, len(chunks) + 1):
        first = chunks[start]
        if i == len(chunks) or chunks[i].scope is not first.scope or chunks[i].encoding != first.encoding:
            out += _parse_run(chunks[start:i], first.scope, parser(first.encoding))
            start = i
    return out


def _parse_run(chunks: list[Chunk], wrapper_open: bytes, parser: Any) -> list[Any]:
    try:
        root = etree.fromstring(b"".join([wrapper_open, *[c.data for c in chunks], BATCH_END]), parser)
        elements = list(root)
        if len(elements) == len(chunks) and not len(parser.error_log):  # (a logged error: each alone says whose)
            for el, chunk in zip(elements, chunks):
                root.remove(el)
                el.sourceline = min(chunk.line, 65535)  # libxml2 keeps an unsigned short
            return elements
    except etree.XMLSyntaxError:
        pass
    out: list[Any] = []
    for chunk in chunks:
        try:
            out.append(parse_alone(chunk.data, chunk.line, wrapper_open, parser))
        except etree.XMLSyntaxError as e:
            line = chunk.line + (e.lineno or 1) - 1
            out.append(Bad(line, "malformed XML: " + _LINE_COL.sub("", e.msg or "syntax error"), preview(chunk.data)))
    return out


def xml_batches(f: IO[Any], owned: bool, opts: ReaderOptions, dl: DeadLetters) -> Iterator[list[Event]]:
    """The events of an XML source (see the module docstring), a list per read block (of the records it
    completes) that has any; dead letters go to ``dl`` as a block is read."""
    splitter = Splitter(getattr(f, "read1", f.read), opts)
    typed = TypedValues()
    seq = 0
    try:
        for records in splitter.records():
            events = record_events(records, seq, splitter, typed, dl)
            seq = splitter.count
            if events:
                yield events
    except (OSError, EOFError, zlib.error) as e:
        raise InputError(f"cannot read input after line {splitter.line}: {e}") from e
    finally:
        if owned:
            f.close()


def _records(records: list[Chunk | Region | Lines | Bad]) -> int:
    """The records (seq numbers) a list of the splitter's holds."""
    return sum(len(r.elements) if type(r) is Region else len(r.items) if type(r) is Lines else 1 for r in records)


def record_events(records: list[Chunk | Region | Lines | Bad], seq: int, splitter: Splitter, typed: TypedValues,
                  dl: DeadLetters) -> list[Event]:
    """The events of a list of ``splitter``'s records, numbered from ``seq``; dead letters to ``dl``."""
    opts = splitter.opts
    flat_ok = opts.type_field is None and opts.unit is not ISO_8601
    chunks = [r for r in records if type(r) is Chunk]
    parsed = iter(_parse_chunks(chunks, splitter.parser) if chunks else ())
    events: list[Event] = []
    for record in records:
        kind = type(record)
        if kind is Region:
            if flat_ok and record.flat:
                seq = _flat_events(record.elements, seq, record.line - 1, opts, typed, dl, events)
            else:
                seq = _long_events(record.elements, seq, record.line - 1, opts, dl, events)
            continue
        if kind is Lines:
            if record.clean:
                events += record.items
            else:
                _line_events(record.items, opts, dl, events)
            seq += len(record.items)
            continue
        if kind is Chunk:
            el = next(parsed)
            if type(el) is not Bad:
                event = _event_or_report(el, seq, record.line, opts, dl)
                if event is not None:
                    events.append(event)
                seq += 1
                continue
            record = el
        dl.report(seq, f"line {record.line}", record.reason, record.raw)
        seq += 1
    return events


def _event_or_report(el: Any, seq: int, line: int, opts: ReaderOptions, dl: DeadLetters) -> Event | None:
    event = _xml_event(el, seq, opts)
    if type(event) is Event:
        return event
    dl.report(seq, f"line {line}", event, etree.tostring(el, encoding="unicode", with_tail=False))
    return None


def _long_events(elements: list[Any], seq: int, base: int, opts: ReaderOptions, dl: DeadLetters,
                 out: list[Event]) -> int:
    """The events of a region's elements (their lines counted from ``base``) appended to ``out``, numbered
    from ``seq``, malformed ones reported to ``dl``; the next seq."""
    for el in elements:
        line = base + el.sourceline
        el.sourceline = min(line, 65535)  # libxml2 keeps an unsigned short
        event = _event_or_report(el, seq, line, opts, dl)
        if event is not None:
            out.append(event)
        seq += 1
    return seq


def _flat_events(elements: list[Any], seq: int, base: int, opts: ReaderOptions, typed: TypedValues,
                 dl: DeadLetters, out: list[Event]) -> int:
    """:func:`_long_events` for childless elements without namespaces (no ``type_field``, a numeric unit):
    the same events, built in one loop; an element whose ts is missing or not a usable number goes the
    long way (which reports it)."""
    ts_field, (m, d) = opts.ts_field, opts.unit
    append = out.append
    for el in elements:
        line = base + el.sourceline
        el.sourceline = line if line < 65535 else 65535  # libxml2 keeps an unsigned short
        attrs = dict(el.items())
        raw_ts = attrs.pop(ts_field, None)
        if raw_ts is None:
            ts = None
        elif raw_ts.isdigit() and len(raw_ts) < 16 and raw_ts.isascii():
            ts = int(raw_ts) * m / d  # below 10¹⁶ × 3600: finite (the common case, without a call)
        else:
            ts = number_ts(raw_ts, opts.unit)
        if ts is None:
            event = _event_or_report(el, seq, line, opts, dl)
            if event is not None:
                append(event)
            seq += 1
            continue
        for name, text in attrs.items():  # values replaced in place: the dict's size does not change
            attrs[name] = typed[text]
        append(Event(el.tag, ts, attrs, seq, el))
        seq += 1
    return seq


def _line_events(items: list[Any], opts: ReaderOptions, dl: DeadLetters, out: list[Event]) -> None:
    """The events of a :class:`Lines` record appended to ``out``, the ones left to the long way read (or
    reported) that way."""
    for item in items:
        if type(item) is tuple:
            tag, texts, seq, line = item
            item = _event_or_report(line_element(tag, texts, line), seq, line, opts, dl)
            if item is None:
                continue
        out.append(item)


def _xml_event(elem: Any, seq: int, opts: ReaderOptions) -> Event | str:
    """The event of one element, or the reason it is malformed."""
    attrs: dict[str, Any] = {}
    for name, v in _attributes(elem):
        if name[0] == "{":
            name = name.rpartition("}")[2]  # namespaces dropped: p:ts and ts are both ts
        if name in attrs and name in (opts.ts_field, opts.type_field):  # (else the last wins, as in JSON)
            return f"duplicate attribute: {name!r} (namespace prefixes are dropped)"
        attrs[name] = typed_value(v)
    if len(elem):
        for child in elem:
            if not len(child) and not child.attrib and isinstance(child.tag, str):
                attrs.setdefault(child.tag.rpartition("}")[2], typed_value((child.text or "").strip()))
    if opts.type_field is None:
        type_ = elem.tag.rpartition("}")[2]
    else:
        type_, error = pop_type(attrs, opts.type_field, "attribute or child")
        if error:
            return error
    ts = pop_ts(attrs, opts.ts_field, opts.unit, "attribute or child")
    if type(ts) is str:
        return ts
    return Event(type_, ts, attrs, seq, elem)
