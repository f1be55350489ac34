"""The XML reader's splitter: which elements are events, one bad record costs one record, caps, DOCTYPE."""

from __future__ import annotations

import io
import json
import random
import tracemalloc

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from lxml import etree

from yfpp.input import xml_lines
from yfpp.input import xml_reader
from yfpp.input.dead_letters import DeadLetters
from yfpp.engine import Engine
from yfpp.errors import InputError
from yfpp.input.readers import read_xml
from yfpp.input.record_fields import ReaderOptions, typed_value


class Trickle(io.RawIOBase):
    """A binary stream whose ``read1`` returns a few bytes at a time (a socket feed): 1 to ``most``."""

    def __init__(self, data: bytes, seed: int, most: int = 40):
        self.data, self.pos, self.rng, self.most = data, 0, random.Random(seed), most

    def readable(self) -> bool:
        return True

    def read1(self, n: int = -1) -> bytes:
        k = self.rng.randint(1, self.most)
        out = self.data[self.pos:self.pos + k]
        self.pos += len(out)
        return out

    read = read1


def read(data: str | bytes, source=None, **opts) -> tuple[list[tuple], list[dict]]:
    """(events as (seq, type, ts, attrs), dead letters) of ``data``."""
    data = data.encode() if isinstance(data, str) else data
    out = io.StringIO()
    events = read_xml(source or io.BytesIO(data), dead_letters=DeadLetters(out), **opts)
    got = [(e.seq, e.type, e.ts, e.attrs) for e in events]
    return got, [json.loads(x) for x in out.getvalue().splitlines()]


LINES = ['<?xml version="1.0"?>', '<stream ts="0">', '  <e ts="1" a="x"/>', '  <e ts="2" a="y"/>',
         '  <e ts="3"><v>7</v></e>', '  <e ts="4" a="z"/>', "</stream>"]
GOOD = [(0, "e", 1.0, {"a": "x"}), (1, "e", 2.0, {"a": "y"}), (2, "e", 3.0, {"v": 7}), (3, "e", 4.0, {"a": "z"})]


@pytest.mark.parametrize("n", [xml_reader.MANY_ATTRIBUTES - 1, xml_reader.MANY_ATTRIBUTES, 3000])
def test_many_attributes_read_the_same_either_way(n):
    """From MANY_ATTRIBUTES on, attributes are read by a parser target (lxml's own lookup is quadratic):
    the same names (namespaces dropped), texts (entities resolved) and order."""
    attrs = " ".join(f'a{i}="v&amp;{i}&lt;"' for i in range(n))
    el = etree.fromstring(f'<e xmlns:p="urn:p" p:x="1" ts="5" {attrs}/>'.encode())
    assert list(xml_reader._attributes(el)) == list(el.attrib.items())
    wrapped = f'<s xmlns:p="urn:p">\n<e p:x="1" ts="5" {attrs}><kid>3</kid></e>\n<e ts="6"/>\n</s>\n'
    events, dead = read(wrapped)
    assert dead == [] and [e[2] for e in events] == [5.0, 6.0]
    assert events[0][3] == {"x": 1, **{f"a{i}": f"v&{i}<" for i in range(n)}, "kid": 3}


def test_a_namespaced_ts_beside_the_plain_one_is_a_dead_letter_not_an_override():
    events, dead = read('<s xmlns:b="urn:b">\n<e ts="1" b:ts="5"/>\n<e ts="2" b:zone="x" zone="y"/>\n</s>\n')
    assert events == [(1, "e", 2.0, {"zone": "y"})]
    assert [(d["position"], d["reason"]) for d in dead] == [("line 2", "duplicate attribute: 'ts' (namespace prefixes are dropped)")]


def test_root_attributes_do_not_make_it_an_event():
    children = "".join(f'<e ts="{i}"/>' for i in range(1000))
    events, dead = read(f'<stream ts="0" source="x">{children}</stream>')
    assert [e[2] for e in events] == list(map(float, range(1000))) and dead == []


@pytest.mark.parametrize("bad,reason", [
    ('  <e ts="2" a="y">', "malformed XML"),           # unclosed tag
    ('  <e ts="2" a=y/>', "malformed XML"),            # unquoted attribute
    ('  <e ts="2" a="\xff"/>', "malformed XML"),       # bad UTF-8
    ('  <e ts="2" a="\x01"/>', "malformed XML"),       # control character
    ('  <e ts="2" a="&nbsp;"/>', "malformed XML"),     # undefined entity
    ('  <e ts="2" a="y"', "malformed XML"),            # unfinished tag
    ('  <e ts="2 a="y"/>', "malformed XML"),           # unbalanced quote
    ('  e ts="2" a="y"/>', "malformed XML"),           # lost '<'
    ('  <e ts="2"><v>1</w></e>', "malformed XML"),     # mismatched end tag
    ("  <heartbeat/>", "missing ts"),                  # a record without ts
])
@pytest.mark.parametrize("trickle", [False, True])
def test_one_bad_record_costs_one_record_at_its_true_line(bad, reason, trickle):
    lines = list(LINES)
    lines[3] = bad
    data = "\n".join(lines).encode("latin-1")
    events, dead = read(data, Trickle(data, 7) if trickle else None)
    assert events == [GOOD[0], *GOOD[2:]]
    [letter] = dead
    assert (letter["seq"], letter["position"]) == (1, "line 4") and letter["reason"].startswith(reason)


def test_trickled_input_reads_the_same(tmp_path):
    data = "\n".join(LINES).encode()
    for seed in range(20):
        assert read(data, Trickle(data, seed)) == (GOOD, [])


def test_elements_after_the_root_and_concatenated_documents_are_read():
    doc = '<?xml version="1.0"?>\n<s><e ts="1"/></s>\n<?xml version="1.0"?>\n<s><e ts="2"/></s>\n<e ts="3"/>'
    events, dead = read(doc)
    assert [(e[0], e[2]) for e in events] == [(0, 1.0), (1, 2.0), (2, 3.0)] and dead == []


def test_rootless_feed_and_a_first_element_with_only_leaf_children_is_an_event():
    events, dead = read('<exit><tag_id>7</tag_id><ts>2</ts></exit>\n<shelf ts="3"/>')
    assert events == [(0, "exit", 2.0, {"tag_id": 7}), (1, "shelf", 3.0, {})] and dead == []


def test_a_wrapper_inside_the_root_is_reported_and_its_events_are_read():
    events, dead = read('<s><e ts="1"/><batch><e ts="2"/></batch><e ts="3"/><heartbeat><n>1</n></heartbeat></s>')
    assert [e[2] for e in events] == [1.0, 2.0, 3.0]
    assert [(d["seq"], d["reason"].split(":")[0], d["raw"]) for d in dead] == [
        (1, "malformed XML", "<batch>"), (3, "malformed XML", "</batch>"), (5, "missing ts", "<heartbeat><n>1</n></heartbeat>")]


def test_text_stray_end_tags_and_an_unclosed_root_are_reported():
    events, dead = read('<s>\n<e ts="1"/>\nnoise\n</x>\n<e ts="2"/>')
    assert [e[2] for e in events] == [1.0, 2.0]
    assert [(d["position"], d["raw"]) for d in dead] == [("line 3", "noise"), ("line 4", "</x>"), ("line 1", None)]
    assert "not closed at the end of the input" in dead[-1]["reason"]


@pytest.mark.parametrize("trickle", [False, True])
def test_an_empty_root_is_no_events_and_no_dead_letter_but_an_empty_event_is_read(trickle):
    data = ('<?xml version="1.0"?>\n<stream>\n</stream>\n<stream ts="0" a="1">  </stream>\n<e ts="5"></e>\n'
            '<heartbeat></heartbeat>\n<heartbeat/>\n<s>\n  <e></e>\n  <e ts="6"/>\n</s>\n').encode()
    events, dead = read(data, Trickle(data, 1) if trickle else None)
    assert events == [(0, "stream", 0.0, {"a": 1}), (1, "e", 5.0, {}), (4, "e", 6.0, {})]
    assert [(d["seq"], d["position"], d["reason"].split(":")[0]) for d in dead] == [
        (2, "line 7", "missing ts"), (3, "line 9", "missing ts")]


@pytest.mark.parametrize("ends", ["\r", "\r\n", "\n"])
@pytest.mark.parametrize("trickle", [False, True])
def test_lines_are_counted_at_cr_lf_and_crlf_alike(ends, trickle):
    lines = ["<stream>", '<e ts="1"/>', "<bad ts=2/>", '<e ts="3"><v>a</v></e>', "<!-- x", "-->",
             '<e ts="4" a="y', 'z"/>', "oops", "</stream>"]
    data = ends.join(lines).encode()
    events, dead = read(data, Trickle(data, 11) if trickle else None)
    assert [e[2] for e in events] == [1.0, 3.0, 4.0] and events[2][3] == {"a": "y z"}
    assert [d["position"] for d in dead] == ["line 3", "line 9"]


def test_a_json_lines_file_read_as_xml_is_reported_not_silent():
    events, dead = read('{"type": "a", "ts": 1}\n{"type": "a", "ts": 2}\n')
    assert events == [] and len(dead) == 1 and dead[0]["reason"] == "malformed XML: text outside an event"


def test_size_cap_is_a_dead_letter_and_the_stream_goes_on():
    big_attr = '<e ts="1" v="' + "x" * 5000 + '"/>'
    big_children = '<e ts="2">' + "<v>x</v>" * 1000 + "</e>"
    events, dead = read(f'<s>\n{big_attr}\n{big_children}\n<e ts="3"/>\n</s>', max_record_bytes=1000)
    assert [(e[0], e[2]) for e in events] == [(2, 3.0)]
    assert [(d["seq"], d["position"], d["reason"].split(":")[0]) for d in dead] == [(0, "line 2", "too large"), (1, "line 3", "too large")]
    assert all(len(d["raw"]) <= 1025 and d["raw"].endswith("…") for d in dead)


def test_a_huge_value_is_not_held_in_memory():
    data = b'<s><e ts="1"/><e ts="2" v="' + b"x" * 30_000_000 + b'"/><e ts="3"/></s>'
    tracemalloc.start()
    try:
        events, dead = read(data)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert [e[2] for e in events] == [1.0, 3.0] and [d["reason"].split(":")[0] for d in dead] == ["too large"]
    assert peak < 40_000_000  # the input itself is 30 MB; nothing near a second copy


class CountedReads(io.BytesIO):
    """A file whose ``read1`` calls are counted."""

    reads = 0

    def read1(self, n: int = -1) -> bytes:
        self.reads += 1
        return super().read1(n)


@pytest.mark.parametrize("record", [b'<e ts="2" v="' + b"x" * 900_000 + b'"/>', b"<e" + b" " * 900_000 + b'ts="2"/>',
                                    b'<e ts="2">' + b"<c>x</c>" * 110_000 + b"</e>"])
def test_a_record_longer_than_a_block_is_read_in_growing_reads(record):
    """A record spanning many 16 KiB blocks is read in reads that grow with what is kept of it (what is scanned
    again at each read adds up to about twice the record, not its square over the block): at most a dozen
    reads for 900 KB, where reads of 16 KiB each take 56."""
    data = b'<s><e ts="1"/>' + record + b'<e ts="3"/></s>'
    source = CountedReads(data)
    events, dead = read(data, source)
    assert [e[2] for e in events] == [1.0, 2.0, 3.0] and dead == []
    assert source.reads <= 12


def _pretty(n: int, unclosed: int) -> str:
    """A rooted feed of ``n`` events carrying ts as a child element, record ``unclosed`` without its end tag."""
    records = (f"  <shelf>\n    <ts>{i}</ts>\n    <tag_id>{i % 50}</tag_id>\n" + ("" if i == unclosed else "  </shelf>\n")
               for i in range(n))
    return '<?xml version="1.0"?>\n<stream>\n' + "".join(records) + "</stream>\n"


@pytest.mark.parametrize("trickle", [False, True])
def test_an_unclosed_event_past_the_size_cap_costs_that_record_not_the_rest(trickle):
    """Record 5 is not closed: past the cap (its next sibling, of its own name, read as its child) the reader
    reads again from its start tag on, as it does at the root's end tag under the cap: the same result."""
    data = _pretty(300, unclosed=5).encode()
    under = read(data)
    over = read(data, Trickle(data, 3) if trickle else None, max_record_bytes=1000)
    assert over == under
    events, dead = over
    assert [e[2] for e in events] == [float(i) for i in range(300) if i != 5]
    assert [(d["seq"], d["position"], d["reason"].split(":")[0], d["raw"]) for d in dead] == [
        (5, "line 23", "malformed XML", "<shelf>"), (6, "line 24", "missing ts", "<ts>5</ts>"),
        (7, "line 25", "missing ts", "<tag_id>5</tag_id>")]


@pytest.mark.parametrize("trickle", [False, True])
def test_a_start_tag_over_the_size_cap_costs_its_record_and_invents_nothing(trickle):
    """Whether the tag is whole in a read block or still arriving, its element is one dead letter and its
    content is skipped (quotes followed: '>' and '/>' inside a value do not end the tag)."""
    big = "x/>" * 700 + ">"
    data = (f'<s>\n<e ts="1"/>\n<order ts="2" note="{big}"><item><ts>6</ts></item></order>\n'
            f"<shelf ts='3' v='{big}'><zone>Z</zone></shelf>\n<e ts=\"4\" v='{big}'/>\n"
            f'<e ts="5"><c v="{big}">1</c><c/></e>\n<e ts="7"/>\n</s>\n').encode()
    events, dead = read(data, Trickle(data, 5) if trickle else None, max_record_bytes=1000)
    assert [(e[0], e[1], e[2]) for e in events] == [(0, "e", 1.0), (5, "e", 7.0)]
    assert [(d["seq"], d["position"], d["reason"].split(":")[0]) for d in dead] == [
        (1, "line 3", "too large"), (2, "line 4", "too large"), (3, "line 5", "too large"), (4, "line 6", "too large")]
    assert [d["raw"][:9] for d in dead] == ['<order ts', "<shelf ts", '<e ts="4"', '<e ts="5"']


@pytest.mark.parametrize("trickle", [False, True])
def test_a_root_start_tag_over_the_size_cap_is_reported_and_its_children_read(trickle):
    data = f'<stream v="{"x" * 3000}">\n<e ts="1"/>\n<e ts="2"><v>3</v></e>\n</stream>\n<e ts="4"/>\n'.encode()
    events, dead = read(data, Trickle(data, 2) if trickle else None, max_record_bytes=1000)
    assert [(e[0], e[2]) for e in events] == [(1, 1.0), (2, 2.0), (3, 4.0)]
    assert [(d["seq"], d["reason"].split(":")[0]) for d in dead] == [(0, "too large")]
    assert "read as a root" in dead[0]["reason"]


def test_depth_cap_is_a_dead_letter():
    deep = '<e ts="1">' + "<a>" * 100 + "</a>" * 100 + "</e>"
    events, dead = read(f'<s>{deep}<e ts="2"/></s>', max_depth=50)
    assert [e[2] for e in events] == [2.0] and dead[0]["reason"].startswith("too deep")


def test_bare_doctype_is_ignored_and_one_naming_a_dtd_is_refused():
    assert read('<!DOCTYPE stream>\n<stream><e ts="1"/></stream>')[0] == [(0, "e", 1.0, {})]
    events, dead = read('<!DOCTYPE stream SYSTEM "http://127.0.0.1:9/x.dtd">\n<stream><e ts="1"/></stream>')
    assert events == [] and [d["reason"].split(":")[0] for d in dead] == ["DTD not allowed"]


class Pieces(io.RawIOBase):
    """A binary stream whose ``read1`` returns the given pieces one at a time (a socket feed)."""

    def __init__(self, pieces: list[bytes]):
        self.pieces = list(pieces)

    def readable(self) -> bool:
        return True

    def read1(self, n: int = -1) -> bytes:
        return self.pieces.pop(0) if self.pieces else b""

    read = read1


@pytest.mark.parametrize("head", [b"", b"\xef\xbb\xbf", b"<!DOCTYPE stream >\n", b"\xef\xbb\xbf<!DOCTYPE stream>\n"])
def test_a_first_read_shorter_than_the_checks_reads_as_the_whole(head):
    """A byte order mark or a bare DOCTYPE cut by the first reads (at every byte) is told as the whole."""
    data = head + b'<stream>\n<e ts="1"/>\n<e ts="2"/>\n</stream>\n'
    whole = read(data)
    assert whole == ([(0, "e", 1.0, {}), (1, "e", 2.0, {})], [])
    for cut in range(1, len(head) + 10):
        for second in (cut + 1, cut + 3):
            assert read(data, Pieces([data[:cut], data[cut:second], data[second:]])) == whole, (cut, second)


def test_utf16_is_refused_even_when_its_mark_comes_a_byte_at_a_time():
    data = '<stream><e ts="1"/></stream>'.encode("utf-16")
    with pytest.raises(InputError, match="UTF-16"):
        read(data, Pieces([data[:1], data[1:2], data[2:]]))


def _doc(events: int, ts: int, encoding: str, declared: str | None) -> bytes:
    """A document of ``events`` events (the first self-closing, the rest with a child: the splitter's and
    the fast path's records alike) whose ``z`` is ``café``, from ts ``ts``, in ``encoding``."""
    head = "" if declared is None else f'<?xml version="1.0"{declared}?>\n'
    body = "".join(f'  <a ts="{ts + i}" z="café"/>\n' if i == 0 else f'  <a ts="{ts + i}" z="café"><k>{i}</k></a>\n'
                   for i in range(events))
    return f"{head}<stream>\n{body}</stream>\n".encode(encoding)


LATIN1 = ' encoding="ISO-8859-1"'


@pytest.mark.parametrize("trickle", [False, True])
@pytest.mark.parametrize("events", [2, 3000], ids=["small", "over-a-block"])
@pytest.mark.parametrize("first,second", [
    (("utf-8", ' encoding="UTF-8"'), ("latin-1", LATIN1)),
    (("latin-1", LATIN1), ("utf-8", "")),    # <?xml version="1.0"?>: UTF-8
    (("latin-1", LATIN1), ("utf-8", None)),  # no declaration: UTF-8, not the previous document's encoding
], ids=["utf8-then-latin1", "latin1-then-declared-utf8", "latin1-then-undeclared-utf8"])
def test_each_concatenated_document_is_read_in_its_own_encoding(first, second, events, trickle):
    """A declaration holds from where it stands to its document's end: not for records before it (in the
    same read block), not for the next document."""
    data = _doc(events, 0, *first) + _doc(events, events, *second)
    got, dead = read(data, Trickle(data, 13) if trickle else None)
    assert dead == [] and [e[2] for e in got] == [float(i) for i in range(2 * events)]
    assert {e[3]["z"] for e in got} == {"café"}


@pytest.mark.parametrize("trickle", [False, True])
def test_a_declaration_holds_for_a_rootless_feed_and_an_empty_root_ends_its_document(trickle):
    rootless = '<?xml version="1.0" encoding="ISO-8859-1"?>\n<a ts="1" z="é"/>\n<a ts="2" z="é"><k>1</k></a>\n'
    empty = '<?xml version="1.0" encoding="ISO-8859-1"?>\n<stream>\n</stream>\n'
    data = (rootless + empty).encode("latin-1") + '<a ts="3" z="é"/>\n'.encode()
    got, dead = read(data, Trickle(data, 5) if trickle else None)
    assert dead == [] and [(e[2], e[3]["z"]) for e in got] == [(1.0, "é"), (2.0, "é"), (3.0, "é")]


def test_type_field_names_the_attribute_that_holds_the_type():
    events, dead = read('<s><event kind="shelf" ts="1" tag="7"/><event ts="2"/><event ts="3"><kind>exit</kind></event></s>',
                        type_field="kind")
    assert events == [(0, "shelf", 1.0, {"tag": 7}), (2, "exit", 3.0, {})]
    assert dead[0]["reason"].startswith("missing type")


def test_numbers_that_do_not_fit_stay_text():
    events, _ = read(f'<s><e ts="1" big="{"9" * 5000}" inf="1e999" n="{"9" * 309}"/></s>')
    assert events[0][3] == {"big": "9" * 5000, "inf": "1e999", "n": int("9" * 309)}


# ------------------------------------------------------------------ flat events the short way = the long way

VALUES = ["1", "-3", "007", "+5", "2.5", ".5", "5.", "1e3", "1e999", "9" * 30, "", " 7 ", "a b", "Z4", "é", "true",
          "nan", "inf", "1_0", "a\tb", "x>y", "x/>"]
NAMES = ["a", "b", "type", "seq"]
SPOILERS = ["&amp;", "x\ny"]


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(events=st.lists(st.tuples(st.sampled_from(["shelf", "exit", "shelf", "exit", "p:e"]),
                                 st.sampled_from(VALUES[:4] + VALUES + [None]),
                                 st.dictionaries(st.sampled_from(NAMES), st.sampled_from(VALUES), max_size=3),
                                 st.sampled_from(["", "", "", "", ' xml:lang="en"', f' a="{SPOILERS[0]}"', f' b="{SPOILERS[1]}"'])),
                       min_size=1, max_size=8),
       root=st.sampled_from(["<stream>", '<stream xmlns:p="urn:p">', ""]), trickle=st.one_of(st.none(), st.integers(0, 50)),
       end=st.sampled_from(["\n", "\n", "", " "]))  # "": a feed on one line
def test_flat_events_read_alike_the_short_and_the_long_way(monkeypatch, events, root, trickle, end):
    lines = "".join(f'  <{tag}' + ("" if ts is None else f' ts="{ts}"') + "".join(f' {k}="{v}"' for k, v in attrs.items() if spoiler[1:2] != k) + spoiler
                    + "/>" + end for tag, ts, attrs, spoiler in events)
    data = (root + "\n" + lines + ("</stream>\n" if root else "")).encode()

    def read() -> tuple[list, str]:
        out = io.StringIO()
        source = Trickle(data, trickle) if trickle is not None else io.BytesIO(data)
        got = [(e.seq, e.type, e.ts, type(e.ts), sorted((k, v, type(v)) for k, v in e.attrs.items()),
                e.element.sourceline, e.element.getparent(), etree.tostring(e.element, with_tail=False))
               for e in read_xml(source, dead_letters=DeadLetters(out))]
        return got, out.getvalue()

    short = read()
    with monkeypatch.context() as m:
        m.setattr(xml_reader.Splitter, "_whole_lines", lambda self: None)  # every record cut by the splitter
        assert read() == short
    with monkeypatch.context() as m:
        m.setattr(xml_reader, "_flat_events",
                  lambda elements, seq, base, opts, typed, dl, out: xml_reader._long_events(elements, seq, base, opts, dl, out))
        m.setattr(xml_reader.Splitter, "_plain_lines", lambda self, region: None)
        assert read() == short


def test_plain_lines_build_no_tree_and_their_elements_are_the_parsed_ones():
    lines = ['  <shelf ts="5" tag_id="007" zone="Z 4"/>', '  <exit tag_id="2" ts="6.5" door="a/b"/>', '  <e ts=" 7 "/>']
    data = ("\n".join(lines) + "\n").encode()  # a rootless feed: a document's end tag is read the long way
    out = io.StringIO()
    events = list(read_xml(io.BytesIO(data), dead_letters=DeadLetters(out)))
    assert [e.texts is not None for e in events] == [True, True, False]  # " 7 ": the long way
    assert all(hasattr(e, slot) for e in events for slot in type(e).__slots__)  # made without __init__: every slot set
    assert [(e.seq, e.type, e.ts, e.attrs) for e in events] == [
        (0, "shelf", 5.0, {"tag_id": 7, "zone": "Z 4"}), (1, "exit", 6.5, {"tag_id": 2, "door": "a/b"}), (2, "e", 7.0, {})]
    eng = Engine()
    eng.register("//shelf[@tag_id = '007']", name="x")  # the text, not the typed value
    eng.register("//exit[@door = 'a/b' and @tag_id > 1]", name="y")
    assert [m["query"] for ev in events for m in eng.process(ev)] == ["x", "y"]
    assert [type(e._el) for e in events[:2]] == [int, int]  # XPath read the texts: no element built
    assert [etree.tostring(e.element).decode() for e in events] == [line.strip() for line in lines]
    assert [e.element.sourceline for e in events] == [1, 2, 3] and out.getvalue() == ""


PLAIN_LINE_POOL = ['<e ts="1" a="x"/>', '<e ts="2" a="007" b="2.5"/>', "<e ts='3' a='q\"q'/>", '<e ts="4"/>', "<e/>",
                   '<e a="1"/>', '<e ts="x"/>', '<e ts=" 5 "/>', '<e ts="1e999"/>', '<e ts="6" a="&lt;"/>',
                   '<e ts="7" a="1" a="2"/>', '<e ts="8" a="x>y"/>', '<e ts="9"></e>', '<e ts="10"><v>1</v></e>',
                   "<!-- c -->", "<?pi x?>", "text", '<e ts="11" a="b', '<1e ts="12"/>', '<e ts="13"/> <e ts="14"/>',
                   '<p:e ts="15"/>', '<p:e ts="x"/>', '<e ts="16" p:a="1"/>', '<e ts="17" a="tab\there"/>', '<yfpp-batch ts="18"/>',
                   '<e ts="19" a="\xe9"/>', "", "</x>", '<e ts="20" ts="21"/>', '<e ts="22"\t a="1" />',
                   '<e ts="\u0662\u0663"/>',  # (digits, not ASCII ones: not a number)
                   '<e ts="23" a="x\ny"/>', '<e\nts="24"/>', '<e ts="25"><!-- a\nb --></e>']  # a record over two lines


@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(lines=st.lists(st.sampled_from(PLAIN_LINE_POOL), min_size=1, max_size=12),
       indents=st.lists(st.sampled_from(["", "  ", "\t", " "]), min_size=12, max_size=12),
       root=st.sampled_from(["", "<stream>\n"]), crlf=st.booleans(), trickle=st.one_of(st.none(), st.integers(0, 50)))
def test_plain_lines_read_alike_the_long_way_whatever_the_lines_hold(monkeypatch, lines, indents, root, crlf, trickle):
    end = "\r\n" if crlf else "\n"
    data = (root + "".join(indent + line + end for indent, line in zip(indents, lines))
            + ("</stream>" + end if root else "")).encode()

    def read() -> tuple[list, str]:
        out = io.StringIO()
        source = Trickle(data, trickle) if trickle is not None else io.BytesIO(data)
        got = [(e.seq, e.type, e.ts, type(e.ts), sorted((k, v, type(v)) for k, v in e.attrs.items()),
                e.element.sourceline, etree.tostring(e.element, with_tail=False))
               for e in read_xml(source, dead_letters=DeadLetters(out))]
        return got, out.getvalue()

    short = read()
    with monkeypatch.context() as m:
        m.setattr(xml_reader.Splitter, "_plain_lines", lambda self, region: None)
        assert read() == short
        m.setattr(xml_reader.Splitter, "_whole_lines", lambda self: None)  # every record cut by the splitter
        assert read() == short


# The splitter's token patterns as first written, every repetition backtracking: the possessive forms in
# yfpp.input.xml_reader must match exactly as these do (they only fail faster on a long token cut short).
_BACKTRACKING_NAME = rb"[^\s<>/!?=\"'&]+"
_BACKTRACKING_ATTRIBUTES = rb"(?:\s+[^\s<>/=\"']+\s*=\s*(?:\"[^\"<]*\"|'[^'<]*'))*"
_BACKTRACKING = {
    "_START": rb"<(" + _BACKTRACKING_NAME + rb")(" + _BACKTRACKING_ATTRIBUTES + rb")\s*(/?)>",
    "_SPACE_EMPTY": rb"[ \t\r\n]*(<" + _BACKTRACKING_NAME + _BACKTRACKING_ATTRIBUTES + rb"\s*/>)",
    "_END": rb"</(" + _BACKTRACKING_NAME + rb")\s*>",
}


_TAG_PARTS = st.tuples(
    st.sampled_from([b"<", b"</", b" <", b"\n\t<", b"<!", b"<?"]),
    st.sampled_from([b"a", b"b1", b"x:y", b"", b"a&", b"a=", b"\xc3\xa9"]),
    st.lists(st.sampled_from([b' x="1"', b" y='<'", b' z = "v w"', b"\n\tk='\"'", b' x="1', b" x=1", b" =", b" x",
                              b" /", b' x="a>b"', b"  ", b'k="2"']), max_size=4).map(b"".join),
    st.sampled_from([b">", b"/>", b" />", b"\n/>", b"/ >", b"", b"/", b">>"]),
).map(b"".join)


@settings(max_examples=1500, deadline=None)
@given(st.lists(_TAG_PARTS | st.sampled_from([b"<", b">", b"/", b"=", b'"', b"'", b" ", b"a", b"&"]), max_size=4),
       st.sampled_from(sorted(_BACKTRACKING)))
def test_possessive_token_patterns_match_as_the_backtracking_ones(parts, name):
    import re

    text = b"".join(parts)
    ours, theirs = getattr(xml_reader, name), re.compile(_BACKTRACKING[name])
    for pos in range(len(text) + 1):
        m, r = ours.match(text, pos), theirs.match(text, pos)
        assert (m and (m.span(), m.groups())) == (r and (r.span(), r.groups())), (text, pos)


# Lines aimed at JsonLines (yfpp.input.xml_lines), the reader of blocks of <tag ts="digits" …/> lines that needs no
# XML parser: what it must read exactly as lxml does, and what it must leave to lxml or the splitter.
JSON_LINE_POOL = [
    '<e ts="1" a="x"/>', '<shelf ts="56" tag_id="14" zone="Z4"/>', '<e ts="2"/>', '<e ts="3" />', '<e  ts="3"/>',
    '<e ts = "4"\ta="1"  b = "2" />', '<e ts="0005" a="007" b="-0" c="+5" d="1e3" e=".5" f="5." g="-0.0" h="0"/>',
    '<e ts="123456789012345" a="18446744073709551615" b="18446744073709551616" c="-9223372036854775809"/>',
    '<e ts="1234567890123456"/>', '<e ts="31" a="12345678901234567890123"/>',
    '<e ts="6" a="1e999" b="nan" c="inf" d="1_0" e="" f=" 7 " g="true" h="null" i="1e-7" j="2.5E+300"/>',
    '<e ts="7" a="back\\\\slash" b="x>y" c="é" d="\u00a0" e="\U0001f600"/>', '<e ts="32" a="\ufffe"/>',
    '<e ts="33" a="\uffff"/>', '<e ts="8" a="tab\there"/>', '<e ts="9" a="1" a="2"/>', '<e ts="10" ts="11"/>',
    '<e a="1" ts="12"/>', '<e ts="13" xmlns="urn:x"/>', '<e ts="14" xmlnsx="1"/>', '<e ts="15" p:a="1"/>',
    '<p:e ts="16"/>', '<é ts="17"/>', '<e ts="18" é="1"/>', '<e.x-y_z ts="19" _a.b-c="1"/>', '<e ts="20" a="1"b="2"/>',
    "<e ts=\"21\" a='1'/>", '<e ts="22" a="x=" b="=y"/>', '<e ts="23" a=" b=" c="/>"/>', '<e ts="\u0662"/>',
    '<e ts="24" a="\x7f"/>', '<e ts="25" a="x&amp;y"/>', "<e ts=\"26\" a=\"a'b\"/>", '<e ts="27" a="{}[]," b=":"/>',
    '<e ts="28"></e>', "<!-- c -->", "", '<e ts="29"/><e ts="30"/>', '<e ts="34" a="<"/>', '<e ts="35" a="\x01"/>',
    '<1e ts="36"/>', '<e ts="37" 1a="1"/>', '<e ts="38" a="1"/', '<e ts="39" a="1">', '<e ts="40" a/>',
    '<e ts="41" ="1"/>', '<e ts="42" a="x\\u0041"/>', '<e ts="43" a="1"/> ', "text", '<e ts="44" a="x" /><!-- c -->',
    # names near and over libxml2's limit of 50,000 characters
    "<" + "t" * 1000 + ' ts="45"/>', "<" + "t" * 50001 + ' ts="46"/>', '<e ts="47" ' + "a" * 50001 + '="1"/>',
    '<xml ts="48"/>', '<xmlns ts="49"/>', '<e ts="50" xml="1" xmlnsx="2"/>', '<e ts="51" xmlns:p="urn:p" p:a="1"/>',
]


def _read_all(data: bytes, trickle: int | None, **opts) -> tuple[list, str]:
    """Every field of every event, its element (built from its texts when it keeps them: which events do is
    the path's choice) and the dead letters. A trickled feed comes in pieces of 1 to 40 bytes, or up to 1/100th of
    it when that is more (a tag of 50,000 bytes is still cut some 200 times, each cut scanned again from its tag's
    start)."""
    out = io.StringIO()
    source = Trickle(data, trickle, max(40, len(data) // 100)) if trickle is not None else io.BytesIO(data)
    got = [(e.seq, e.type, e.ts, type(e.ts), sorted((k, v, type(v)) for k, v in e.attrs.items()),
            e.element.sourceline, etree.tostring(e.element, with_tail=False))
           for e in read_xml(source, dead_letters=DeadLetters(out), **opts)]
    return got, out.getvalue()


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(lines=st.lists(st.sampled_from(JSON_LINE_POOL[:8] + JSON_LINE_POOL), min_size=1, max_size=10),
       indents=st.lists(st.sampled_from(["", "  ", "\t", " "]), min_size=10, max_size=10),
       head=st.sampled_from(["", "<stream>\n", '<?xml version="1.0" encoding="UTF-8"?>\n<stream>\n',
                             '<?xml version="1.0" encoding="utf8"?>\n', '<?xml version="1.0" encoding="ISO-8859-1"?>\n<s>\n']),
       crlf=st.booleans(), trickle=st.one_of(st.none(), st.integers(0, 50)), unit=st.sampled_from(["s", "ms", "h"]))
def test_json_lines_read_as_lxml_reads_them(monkeypatch, lines, indents, head, crlf, trickle, unit):
    """The same events, texts, elements and dead letters with JsonLines, with lxml's parser target in its place,
    and with the splitter alone."""
    end = "\r\n" if crlf else "\n"
    body = "".join(indent + line + end for indent, line in zip(indents, lines))
    tail = ("</stream>" if "<stream>" in head else "</s>" if "<s>" in head else "") + end
    encoding = "iso-8859-1" if "ISO" in head else "utf-8"
    data = (head.replace("\n", end) + body + tail).encode(encoding, errors="xmlcharrefreplace")
    json_read = _read_all(data, trickle, ts_unit=unit)
    with monkeypatch.context() as m:
        m.setattr(xml_lines.JsonLines, "read", lambda self, region, seq, line: None)
        assert _read_all(data, trickle, ts_unit=unit) == json_read
        m.setattr(xml_reader.Splitter, "_plain_lines", lambda self, region: None)
        assert _read_all(data, trickle, ts_unit=unit) == json_read
        m.setattr(xml_reader.Splitter, "_whole_lines", lambda self: None)  # every record cut by the splitter
        assert _read_all(data, trickle, ts_unit=unit) == json_read


_VALUE_CHARS = st.sampled_from(list("0123456789+-.eE xZé\\>=/_:,{}[]'\t") + ["\u00a0", "\U0001f600", "\ufffe", "\x7f"])


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(rows=st.lists(st.tuples(st.integers(0, 10 ** 16), st.dictionaries(st.sampled_from(["a", "b", "tag_id", "z.1"]),
                                                                          st.text(_VALUE_CHARS, max_size=8), max_size=3)),
                     min_size=1, max_size=30))
def test_json_lines_type_values_as_typed_value_does(monkeypatch, rows):
    """Generated values (numbers of every shape, signs, exponents, spaces, non-ASCII, backslashes): the same
    events and dead letters as lxml's parser target gives, the JsonLines path taken unless a value makes the block
    one it cannot read (then it reads nothing)."""
    data = "".join(f'<e ts="{ts}"' + "".join(f' {k}="{v}"' for k, v in attrs.items()) + "/>\n" for ts, attrs in rows).encode()
    taken = []
    original = xml_lines.JsonLines.read

    def counted(self, region, seq, line):
        events = original(self, region, seq, line)
        taken.append(events is not None)
        return events

    with monkeypatch.context() as m:
        m.setattr(xml_lines.JsonLines, "read", counted)
        json_read = _read_all(data, None)
    with monkeypatch.context() as m:
        m.setattr(xml_lines.JsonLines, "read", lambda self, region, seq, line: None)
        assert _read_all(data, None) == json_read
    plain = all(ts < 10 ** 15 for ts, _ in rows) and all("\\" not in v and "\t" not in v and "\ufffe" not in v
                                                       for _, attrs in rows for v in attrs.values())
    # (the last line of a rootless feed is the splitter's: it cannot know the line is whole before the input ends)
    if len(rows) > 1 and plain and all(abs(v) < 2 ** 63 for _, attrs in rows for v in map(typed_value, attrs.values())
                                       if type(v) is int):
        assert taken and all(taken)


def test_json_lines_take_the_plainest_feed_and_keep_each_line_for_its_texts():
    data = b'<?xml version="1.0" encoding="UTF-8"?>\n<stream>\n' + b"".join(
        b'  <shelf ts="%d" tag_id="%d" zone="Z%d"/>\n' % (i, i * 7, i % 3) for i in range(1, 2001)) + b"</stream>\n"
    events = list(read_xml(io.BytesIO(data)))
    assert len(events) == 2000
    # (the first block, with the declaration and the root's start tag, is the splitter's)
    assert type(events[1500]._texts) is bytes  # read by JsonLines: the texts are read from the line when asked for
    assert events[1500].texts == {"ts": "1501", "tag_id": "10507", "zone": "Z1"} and type(events[1500]._texts) is dict
    assert (events[1500].type, events[1500].ts, events[1500].attrs, events[1500].element.sourceline) == (
        "shelf", 1501.0, {"tag_id": 10507, "zone": "Z1"}, 1503)


def test_the_plain_line_tables_keep_no_long_text():
    """The tables of pieces, values, tags and typed texts hold 4,096 entries at most, none over 256 bytes: a
    feed of long distinct values cannot make them hold 4,096 records' worth of bytes."""
    lines = b"".join(b'  <e%s ts="%d" a="%s%d" b%s="7"/>\n' % (b"t" * (300 * (i % 2)), i, b"x" * 300, i, b"c" * 300)
                     for i in range(50))
    reader = xml_lines.JsonLines(ReaderOptions())
    events = reader.read(lines, 0, 1)
    assert [(e.type, e.attrs["a"]) for e in events[:2]] == [("e", "x" * 300 + "0"), ("e" + "t" * 300, "x" * 300 + "1")]
    tables = [reader._between, reader._tokens, reader._tags]
    assert all(tables) and all(len(key) <= 256 for table in tables for key in table)
    typed = xml_lines.TypedValues()
    assert typed["7" * 300] == int("7" * 300) and typed["7"] == 7 and list(typed) == ["7"]


def test_an_undeclared_prefix_is_reported_alike_whichever_way_the_block_is_read(monkeypatch):
    """lxml logs an undeclared prefix without raising it: a block (or a run of chunks) parsed in one go that logged
    one is read an element at a time, which reports it (it was read as an element named p:e and reported for its ts
    instead, depending on how the input came in; found by a soak)."""
    data = b'<e ts="1"/>\n<p:e ts="x"/>\n<e ts="3" xmlns="u"/>\n<e ts="4"/>\n'  # (xmlns: not plain lines)
    whole = read(data)
    assert whole == ([(0, "e", 1.0, {}), (2, "e", 3.0, {}), (3, "e", 4.0, {})],
                     [{"seq": 1, "position": "line 2", "reason": "malformed XML: Namespace prefix p on e is not defined",
                       "raw": '<p:e ts="x"/>'}])
    assert read(data, Trickle(data, 3)) == whole  # (read this way, lines 1-3 are parsed in one go)
    monkeypatch.setattr(xml_reader.Splitter, "_whole_lines", lambda self: None)
    assert read(data) == whole
