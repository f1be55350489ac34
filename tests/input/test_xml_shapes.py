"""The XML feed shapes sensors write, read without building a tree (:mod:`yfpp.input.xml_lines`): attributes in any
order, decimal and ISO-8601 ts, a namespace declared on the root, readings as leaf children. Each must give
exactly what lxml's reading of the same bytes gives (the readers switched off, then the splitter alone): the
same events, typed attributes, elements, lines and dead letters; anything not plainly of its shape is left to
lxml."""

from __future__ import annotations

import io
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.input.test_xml_reader import Trickle
from yfpp.input.dead_letters import DeadLetters
from yfpp.input import xml_lines
from yfpp.input import xml_reader
from yfpp.engine import Engine
from yfpp.input.readers import read_xml
from yfpp.input.record_fields import ReaderOptions, unit_factors

NUMBER_TS = ["1", "56", "007", "12.311", "0.5", "123456789012345", "123456789012345.123456789012345", "1234567890123456",
             "12.3456789012345678", " 5 ", "5.", ".5", "1e3", "-1", "x", "", "1.5.5", "\u0662"]
ISO_TS = ["2026-11-22T10:00:05Z", "2026-11-22T10:00:05.311Z", "2026-11-22T10:00:05.3", "2026-11-22T10:00:05.1234567Z",
          "2026-11-22T23:59:59.999999+05:30", "2026-11-22T00:00:00-01:00", "2026-02-30T10:00:05Z",
          "2026-11-22T24:00:00Z", "2026-11-22T10:00:60Z", "2026-11-22 10:00:05Z", " 2026-11-22T10:00:05Z",
          "20261122T100005Z", "2026-11-22", "0001-01-01T00:00:00+01:00", "9999-12-31T23:59:59-01:00",
          "2026-11-22T10:00:05+0100", "2026-11-22T10:00:05z", "2026-11-22T10:00:05+14:00", "2026-11-22T10:00:05+24:00"]
VALUES = ["x", "007", "14", "0", "-0", "2.5", "1e999", "", " 7 ", "Z 4", "é", "\u00a0", "\U0001f600", "x>y", "a'b", "true",
          "null", "123456789012345678", "1234567890123456789", "{}[],:", "18446744073709551616", "tab\there", "\ufffe",
          "\x7f", "x\\y", "<", "&amp;", "&#65;", "2026-11-22T10:00:05Z"]
NAMES = ["a", "seq", "zone", "tag_id", "ts", "b", "p:a", "xmlns:q", "xml:lang", "1a"]
HEADS = ["", "<stream>\n"] * 3 + ['<?xml version="1.0" encoding="UTF-8"?>\n<stream xmlns="urn:example:sensors">\n',
         '<stream xmlns:p="urn:p">\n', '<s xmlns="urn:x" xmlns:p="urn:p">\n', '<s xmlns:p="">\n', '<s xmlns="relative">\n',
         '<?xml version="1.0" encoding="ISO-8859-1"?>\n<s xmlns="urn:x">\n']
UNITS = ["s", "ms", "h", "iso"]


def _pick(data: st.DataObject, plain: bool, usual: list[str], rest: list[str]) -> str:
    """One of ``usual`` in a plain example (one the readers should take, if only its text is tricky), else any."""
    return data.draw(st.sampled_from(usual if plain else usual + rest))


def _ts(unit: str, data: st.DataObject, plain: bool, offset: str) -> str:
    """A ts text: of the unit's kind in a plain example (ISO-8601 at one offset), else any."""
    if unit == "iso":
        minute, second = data.draw(st.integers(0, 24 * 60 - 1)), data.draw(st.integers(0, 59))
        fraction = data.draw(st.sampled_from(["", ".3", ".311", ".123456", ".000"]))
        text = f"2026-11-{data.draw(st.integers(1, 30)):02d}T{minute // 60:02d}:{minute % 60:02d}:{second:02d}{fraction}{offset}"
        usual = [text]
    else:
        usual = NUMBER_TS[:7] + [f"{data.draw(st.integers(0, 10 ** 15 - 1))}.{data.draw(st.integers(0, 999))}"]
    return _pick(data, plain, usual, ISO_TS + NUMBER_TS)


def _feed(head: str, lines: list[str], indents: list[str], crlf: bool) -> tuple[bytes, int]:
    """The feed's bytes, and where its head (declaration, root start tag) and first line end."""
    end = "\r\n" if crlf else "\n"
    root = re.search(r"<([a-z]+)[^>]*>\n$", head)  # (a declaration alone opens no root)
    tail = f"</{root[1]}>{end}" if root else ""
    encoding = "iso-8859-1" if "ISO" in head else "utf-8"
    body = "".join(indent + line + end for indent, line in zip(indents, lines))
    head = head.replace("\n", end)
    first = indents[0] + lines[0] + end
    return ((head + body + tail).encode(encoding, errors="xmlcharrefreplace"),
            len((head + first).encode(encoding, errors="xmlcharrefreplace")))


class HeadFirst(io.RawIOBase):
    """A binary stream whose first read is the feed's head and first line, the second all the rest: the root is
    known (its first child read) before the rest of the lines come, a block of their own as in a long feed."""

    def __init__(self, data: bytes, head: int):
        self.pieces = [data[:head], data[head:]]

    def readable(self) -> bool:
        return True

    def read1(self, n: int = -1) -> bytes:
        return self.pieces.pop(0) if self.pieces else b""

    read = read1


def _tree(el) -> tuple:
    """An element as its names, texts and children, without the prefixes lxml makes up when it writes a detached
    element of a root's default namespace (``ns0``, ``ns1``…: numbered by how many were detached from one parse,
    so they differ between one block parsed in one go and each record parsed alone); its tail left out, as
    ``tostring(with_tail=False)`` leaves it."""
    return el.tag, el.items(), el.text, [(_tree(child), child.tail) for child in el]


def _read_all(feed: tuple[bytes, int], trickle: int | None, **opts) -> tuple[list, str]:
    """Every field of every event, its element and line, and the dead letters (their made-up prefixes as ``ns``),
    the feed read whole (``trickle`` None), its head first (-1: :class:`HeadFirst`) or a few bytes at a time."""
    data, head = feed
    out = io.StringIO()
    source = io.BytesIO(data) if trickle is None else HeadFirst(data, head) if trickle < 0 else Trickle(data, trickle)
    got = [(e.seq, e.type, e.ts, type(e.ts), list(e.attrs.items()), [type(v) for v in e.attrs.values()],
            e.element.sourceline, e.element.getparent(), _tree(e.element))
           for e in read_xml(source, dead_letters=DeadLetters(out), **opts)]
    return got, re.sub(r"\bns[0-9]+\b", "ns", out.getvalue())


def _same_as_lxml(monkeypatch, feed: tuple[bytes, int], trickle: int | None, unit: str) -> tuple[list, str]:
    """The reading of ``feed`` with the readers of plain lines, checked against lxml's; it."""
    fast = _read_all(feed, trickle, ts_unit=unit)
    with monkeypatch.context() as m:
        m.setattr(xml_lines.JsonLines, "read", lambda self, region, seq, line: None)
        m.setattr(xml_lines.ChildReadings, "read", lambda self, region, seq, line: None)
        assert _read_all(feed, trickle, ts_unit=unit) == fast
        m.setattr(xml_reader.Splitter, "_whole_lines", lambda self: None)  # every record cut by the splitter
        assert _read_all(feed, trickle, ts_unit=unit) == fast
    return fast


@settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(data=st.data(), unit=st.sampled_from(UNITS), head=st.sampled_from(HEADS), crlf=st.booleans(),
       trickle=st.sampled_from([None, -1, -1]) | st.integers(0, 50), n=st.integers(1, 10),
       indents=st.lists(st.sampled_from(["", "  ", "\t"]), min_size=10, max_size=10))
def test_attribute_lines_in_any_order_read_as_lxml_reads_them(monkeypatch, data, unit, head, crlf, trickle, n, indents):
    """Lines of attributes in any order, the ts a number, a decimal or ISO-8601 text, under every root: in half
    the examples lines the readers should take (tricky values, spacing, order), in the rest anything."""
    plain, offset = data.draw(st.booleans()), data.draw(st.sampled_from(["Z", "", "+05:30", "-01:00"]))
    lines = []
    for _ in range(n):
        tag = _pick(data, plain, ["e", "shelf", "e1.x-y"], ["p:e", "é"])
        names = data.draw(st.lists(st.sampled_from(NAMES[:4] if plain else NAMES), max_size=4, unique=plain))
        if "ts" not in names and (plain or data.draw(st.integers(0, 9))):  # (mostly one ts, anywhere)
            names.insert(data.draw(st.integers(0, len(names))), "ts")
        attrs = []
        for name in names:
            value = _ts(unit, data, plain, offset) if name == "ts" else _pick(data, plain, VALUES[:20], VALUES[20:])
            space = _pick(data, plain, [" ", " ", "  ", "\t"], ["\n"])
            equals = _pick(data, plain, ["=", "=", " = "], [])
            quote = '"' if plain or data.draw(st.integers(0, 9)) else "'"
            if quote in value:
                quote = "'"
            attrs.append(f"{space}{name}{equals}{quote}{value}{quote}")
        close = _pick(data, plain, ["/>", "/>", " />"], [f"></{tag}>"])
        lines.append(f"<{tag}{''.join(attrs)}{close}")
    _same_as_lxml(monkeypatch, _feed(head, lines, indents, crlf), trickle, unit)


# (the last six: what a plain example leaves out)
CHILD_VALUES = VALUES[:20] + ["  7 ", "\u2003 8\u00a0", "a b", "tab\there", "\x7f", "x\\y", "\ufffe", "<", "&amp;", "&#65;",
                              "x]]>y", "\x01"]


@settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(data=st.data(), unit=st.sampled_from(UNITS), head=st.sampled_from(HEADS), crlf=st.booleans(),
       trickle=st.sampled_from([None, -1, -1]) | st.integers(0, 50), n=st.integers(1, 10),
       indents=st.lists(st.sampled_from(["", "  ", "\t"]), min_size=10, max_size=10))
def test_child_readings_read_as_lxml_reads_them(monkeypatch, data, unit, head, crlf, trickle, n, indents):
    """Readings as leaf children (``<reading><sensor>T1</sensor><celsius>31.5</celsius></reading>``): tricky
    texts, names given twice, the ts a child or an attribute or missing, and what is not a plain leaf."""
    plain, offset = data.draw(st.booleans()), data.draw(st.sampled_from(["Z", "", "+05:30", "-01:00"]))
    lines = []
    for _ in range(n):
        tag = _pick(data, plain, ["reading", "r"], ["p:r"])
        names = data.draw(st.lists(st.sampled_from(["sensor", "celsius", "a", "sensor", "ts"] + ([] if plain else ["p:a"])),
                                   max_size=4))
        if "ts" not in names and (plain or data.draw(st.integers(0, 9))):
            names.insert(data.draw(st.integers(0, len(names))), "ts")
        children = []
        for name in names:
            value = _ts(unit, data, plain, offset) if name == "ts" else _pick(data, plain, CHILD_VALUES[:-6], CHILD_VALUES[-6:])
            form = _pick(data, plain, ["leaf"], ["empty", "attr", "nested", "mismatch", "comment", "cdata", "space"])
            children.append({"leaf": f"<{name}>{value}</{name}>", "empty": f"<{name}/>",
                             "attr": f'<{name} u="1">{value}</{name}>', "nested": f"<{name}><v>{value}</v></{name}>",
                             "mismatch": f"<{name}>{value}</x>", "comment": f"<{name}>{value}<!-- c --></{name}>",
                             "cdata": f"<{name}><![CDATA[{value}]]></{name}>", "space": f" <{name}>{value}</{name}> "}[form])
        start = _pick(data, plain, [f"<{tag}>"], [f'<{tag} id="1">', f'<{tag} ts="3">', f"<{tag} >"])
        lines.append(f"{start}{''.join(children)}</{tag}>")
    _same_as_lxml(monkeypatch, _feed(head, lines, indents, crlf), trickle, unit)


ROWS = range(1, 2001)
SHAPES = {  # a feed of each shape (two thousand lines, under a root): its unit, and the reader that must take it
    "seq before ts": ("s", "<stream>", [f'<shelf seq="{i}" ts="{i}" tag_id="{i % 7}" zone="Z{i % 3}"/>' for i in ROWS]),
    "decimal ts": ("ms", "<stream>", [f'<shelf zone="Z{i % 3}" ts="{i}.{i % 1000:03d}"/>' for i in ROWS]),
    "ISO-8601 ts": ("iso", "<stream>", [f'<shelf ts="2026-11-22T10:{i // 60 % 60:02d}:{i % 60:02d}.{i:03d}Z" zone="Z{i % 3}"/>'
                                        for i in ROWS]),
    "namespace": ("s", '<stream xmlns="urn:example:sensors" xmlns:p="urn:p">', [f'<shelf ts="{i}" tag_id="{i % 7}"/>'
                                                                               for i in ROWS]),
    "child readings": ("s", "<stream>",
                       [f"<reading><sensor>T{i % 5}</sensor><ts>{i}.5</ts><celsius> {i / 10} </celsius></reading>"
                        for i in ROWS]),
}


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_each_shape_is_read_without_a_tree(monkeypatch, shape):
    """The readers take every block of each shape but the first (the root's start tag is the splitter's), and their
    events are lxml's; XPath predicates on them match as on lxml's elements."""
    unit, root, lines = SHAPES[shape]
    feed = _feed(root + "\n", lines, ["  "] * len(lines), False)
    taken = []
    reader = xml_lines.ChildReadings if shape == "child readings" else xml_lines.JsonLines
    original = reader.read

    def counted(self, region, seq, line):
        events = original(self, region, seq, line)
        taken.append(events is not None and len(events))
        return events

    monkeypatch.setattr(reader, "read", counted)
    fast = _same_as_lxml(monkeypatch, feed, None, unit)
    assert taken and all(taken) and sum(taken) >= len(lines) // 2 and len(fast[0]) == len(lines) and not fast[1]
    query = "//reading[sensor = 'T1' and celsius > 10]" if shape == "child readings" else "//shelf[@zone = 'Z1' or @tag_id = 3]"

    def matches(events) -> list:
        engine = Engine()
        engine.register(query, name="q")
        return [(m["bindings"], m["start"]) for ev in events for m in engine.process(ev)]

    found = matches(read_xml(io.BytesIO(feed[0]), ts_unit=unit))
    with monkeypatch.context() as m:
        m.setattr(xml_reader.Splitter, "_whole_lines", lambda self: None)
        assert matches(read_xml(io.BytesIO(feed[0]), ts_unit=unit)) == found and found


def test_iso_minutes_are_what_iso_seconds_reads():
    """The table of ISO-8601 minutes gives the microseconds ``iso_seconds`` reads, at each offset."""
    from yfpp.input.record_fields import iso_seconds

    for offset in [b"", b"Z", b"+05:30", b"-01:00"]:
        table = xml_lines._IsoMinutes(offset)
        for minute in [b"2026-11-22T10:00", b"1970-01-01T00:00", b"0001-01-01T00:00", b"9999-12-31T23:59"]:
            text = (minute + b":07.25" + offset).decode()
            assert (table[minute] + 7_250_000) / 1_000_000 == iso_seconds(text)
    with pytest.raises(xml_lines._NotPlain):
        xml_lines._IsoMinutes(b"Z")[b"2026-02-30T10:00"]
    assert xml_lines.JsonLines(ReaderOptions(unit=unit_factors("iso"))).enabled


def test_child_readings_over_the_depth_cap_are_left_to_the_splitter(monkeypatch):
    """With ``max_depth=1`` a reading's children are too deep: dead letters, as the splitter reports them."""
    _, root, lines = SHAPES["child readings"]
    feed = _feed(root + "\n", lines[:40], ["  "] * 40, False)
    events, dead = _read_all(feed, -1, max_depth=1)
    assert not events and dead.count("too deep") == 40
    with monkeypatch.context() as m:
        m.setattr(xml_reader.Splitter, "_whole_lines", lambda self: None)
        assert _read_all(feed, -1, max_depth=1) == (events, dead)
