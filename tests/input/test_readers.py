"""Streaming readers, dead letters and the XML element of JSON events (docs/semantics.md §1)."""

from __future__ import annotations

import gzip
import io
import json
import tracemalloc

import pytest

from yfpp.input.dead_letters import DeadLetters
from yfpp.engine import Engine
from yfpp.errors import InputError
from yfpp.input.events import Event
from yfpp.input.generate import generate_stock, write_events
from yfpp.input.readers import read_events, read_jsonl, read_xml, typed_value
from yfpp.input.xml_element import element_for


def xml(text: str, **opts) -> list[Event]:
    return list(read_xml(io.BytesIO(text.encode()), **opts))


def jsonl(text: str, **opts) -> list[Event]:
    return list(read_jsonl(io.BytesIO(text.encode()), **opts))


def reports(dl_out: io.StringIO) -> list[dict]:
    return [json.loads(line) for line in dl_out.getvalue().splitlines()]


@pytest.fixture
def dl():
    out = io.StringIO()
    d = DeadLetters(out)
    d.out = out
    return d


# ------------------------------------------------------------------ values


@pytest.mark.parametrize(
    "text,value",
    [("12", 12), ("-3", -3), ("1.5", 1.5), ("1e3", 1000.0), (".5", 0.5), ("Z3", "Z3"), ("true", "true"),
     ("nan", "nan"), ("inf", "inf"), ("1_000", "1_000"), ("", ""), (" 7", " 7")],
)
def test_typed_value(text, value):
    assert typed_value(text) == value and type(typed_value(text)) is type(value)


def test_xml_attributes_and_leaf_children():
    [e] = xml('<stream><shelf ts="10" tag_id="7" zone="Z1"><qty> 3 </qty><price>1.25</price>'
              '<ok>true</ok><loc x="1"/><n>x</n><n>y</n></shelf></stream>')
    assert (e.type, e.ts, e.seq) == ("shelf", 10.0, 0)
    assert e.attrs == {"tag_id": 7, "zone": "Z1", "qty": 3, "price": 1.25, "ok": "true", "n": "x"}
    assert e.element.tag == "shelf" and e.element.find("loc").get("x") == "1"


def test_xml_attribute_wins_over_child_and_namespaces_are_dropped():
    [e] = xml('<s xmlns:p="urn:p"><p:e ts="1" p:a="1"><a>2</a></p:e></s>')
    assert e.type == "e" and e.attrs == {"a": 1}


def test_xml_ts_as_child_element():
    [e] = xml("<stream><e><ts>5</ts><v>1</v></e></stream>")
    assert (e.ts, e.attrs) == (5.0, {"v": 1})


def test_rootless_concatenation():
    events = xml('<?xml version="1.0"?>\n<shelf ts="1" tag_id="7"/>\n<exit ts="2"><tag_id>7</tag_id></exit><shelf ts="3"/>')
    assert [(e.type, e.ts, e.seq) for e in events] == [("shelf", 1.0, 0), ("exit", 2.0, 1), ("shelf", 3.0, 2)]
    assert events[1].attrs == {"tag_id": 7}


def test_single_rootless_event_with_children_is_an_event():
    [e] = xml("<exit><tag_id>7</tag_id><ts>2</ts></exit>")
    assert (e.type, e.ts, e.attrs) == ("exit", 2.0, {"tag_id": 7})


def test_document_with_declaration_and_bom():
    data = b'\xef\xbb\xbf<?xml version="1.0" encoding="UTF-8"?>\n<stream>\n  <e ts="1" s="\xc3\xa9"/>\n</stream>\n'
    [e] = list(read_xml(io.BytesIO(data)))
    assert e.attrs == {"s": "é"} and e.element.sourceline == 3


def test_latin1_declaration_is_honoured():
    data = '<?xml version="1.0" encoding="ISO-8859-1"?><s><e ts="1" s="é"/></s>'.encode("latin-1")
    assert next(read_xml(io.BytesIO(data))).attrs == {"s": "é"}


@pytest.mark.parametrize("unit,expected", [("s", 90.0), ("ms", 0.09), ("us", 9e-5), ("ns", 9e-8), ("min", 5400.0), ("h", 324000.0)])
def test_ts_units(unit, expected):
    assert xml('<s><e time="90"/></s>', ts_field="time", ts_unit=unit)[0].ts == pytest.approx(expected)
    assert jsonl('{"type": "e", "time": 90}', ts_field="time", ts_unit=unit)[0].ts == pytest.approx(expected)


def test_ns_epoch_keeps_microseconds():
    [e] = jsonl('{"type": "e", "ts": 1700000000123456789}', ts_unit="ns")
    assert e.ts == pytest.approx(1700000000.123457, abs=1e-6)


def test_unknown_unit():
    with pytest.raises(ValueError, match="ts_unit"):
        read_xml(io.BytesIO(b"<s/>"), ts_unit="days")


# ------------------------------------------------------------------ malformed XML


def test_xml_bad_ts_reported_with_line_and_stream_goes_on(dl):
    events = xml('<s>\n<e ts="1"/>\n<e ts="x"/>\n<e/>\n<e ts="4"/>\n</s>', dead_letters=dl)
    assert [(e.seq, e.ts) for e in events] == [(0, 1.0), (3, 4.0)]
    assert [(r["seq"], r["position"]) for r in reports(dl.out)] == [(1, "line 3"), (2, "line 4")]
    assert dl.count == 2 and dl.by_reason == {"non-numeric ts": 1, "missing ts": 1}
    assert reports(dl.out)[0]["raw"] == '<e ts="x"/>'


def test_xml_syntax_error_costs_the_damaged_record_and_the_stream_goes_on(dl):
    events = xml('<s>\n<e ts="1"/>\n<e ts="2"/>\n<e ts="3" <oops/>\n<e ts="4"/></s>', dead_letters=dl)
    assert [(e.seq, e.ts) for e in events] == [(0, 1.0), (1, 2.0), (4, 4.0)]
    bad, oops = reports(dl.out)
    assert (bad["seq"], bad["position"], bad["raw"]) == (2, "line 4", '<e ts="3"') and bad["reason"].startswith("malformed XML")
    assert (oops["seq"], oops["position"], oops["raw"]) == (3, "line 4", "<oops/>") and oops["reason"].startswith("missing ts")


def test_truncated_xml_reported(dl):
    assert [e.ts for e in xml('<s><e ts="1"/><e ts="2"/>', dead_letters=dl)] == [1.0, 2.0]
    assert dl.by_reason == {"malformed XML": 1}


BILLION_LAUGHS = """<?xml version="1.0"?>
<!DOCTYPE lolz [
 <!ENTITY lol "lol">
 <!ENTITY lol1 "&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;">
 <!ENTITY lol2 "&lol1;&lol1;&lol1;&lol1;&lol1;&lol1;&lol1;&lol1;&lol1;&lol1;">
 <!ENTITY lol3 "&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;">
 <!ENTITY lol4 "&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;">
 <!ENTITY lol5 "&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;">
 <!ENTITY lol6 "&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;">
 <!ENTITY lol7 "&lol6;&lol6;&lol6;&lol6;&lol6;&lol6;&lol6;&lol6;&lol6;&lol6;">
 <!ENTITY lol8 "&lol7;&lol7;&lol7;&lol7;&lol7;&lol7;&lol7;&lol7;&lol7;&lol7;">
 <!ENTITY lol9 "&lol8;&lol8;&lol8;&lol8;&lol8;&lol8;&lol8;&lol8;&lol8;&lol8;">
]>
<lolz><e ts="1" a="&lol9;">&lol9;</e></lolz>"""


def test_billion_laughs_is_rejected_not_expanded(dl):
    tracemalloc.start()
    try:
        assert xml(BILLION_LAUGHS, dead_letters=dl) == []
        assert tracemalloc.get_traced_memory()[1] < 5_000_000
    finally:
        tracemalloc.stop()
    [r] = reports(dl.out)
    assert r["reason"].startswith("DTD not allowed") and r["position"] == "line 2"


def test_external_entity_is_not_read(dl, tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("TOPSECRET")
    doc = f'<!DOCTYPE s [<!ENTITY x SYSTEM "file://{secret}">]><s><e ts="1" a="&x;"/></s>'
    events = xml(doc, dead_letters=dl)
    assert events == [] and "TOPSECRET" not in dl.out.getvalue() and dl.by_reason == {"DTD not allowed": 1}


def test_undefined_entity_is_malformed(dl):
    assert xml('<s><e ts="1"/><e ts="2" a="&x;"/></s>', dead_letters=dl)[0].ts == 1.0
    assert dl.by_reason == {"malformed XML": 1}


def test_default_dead_letters_go_to_stderr(capsys):
    assert xml("<s><e/></s>") == []
    assert json.loads(capsys.readouterr().err)["reason"].startswith("missing ts")


# ------------------------------------------------------------------ JSON lines


def test_jsonl_values_and_flattening():
    [e] = jsonl('{"type": "shelf", "ts": 10, "tag_id": 7, "zone": "Z1", "ok": true, "p": 1.5, "n": null, "loc": {"x": 1, "y": {"z": "a"}}}')
    assert (e.type, e.ts, e.seq) == ("shelf", 10.0, 0)
    assert e.attrs == {"tag_id": 7, "zone": "Z1", "ok": True, "p": 1.5, "loc.x": 1, "loc.y.z": "a"}


def test_jsonl_malformed_lines_reported_and_stream_goes_on(dl):
    lines = [
        '{"type": "a", "ts": 1}',
        "",
        "{bad json",
        "[1, 2]",
        '{"ts": 3}',
        '{"type": "a"}',
        '{"type": "a", "ts": "x"}',
        '{"type": "a", "ts": true}',
        '{"type": "a", "ts": NaN}',
        '{"type": "a", "ts": 9, "l": [1]}',
        '{"type": 5, "ts": 1}',
        '{"type": "b", "ts": "11"}',
    ]
    events = jsonl("\n".join(lines) + "\n", dead_letters=dl)
    assert [(e.type, e.seq, e.ts) for e in events] == [("a", 0, 1.0), ("b", 10, 11.0)]
    got = [(r["seq"], r["position"], r["reason"].split(":")[0]) for r in reports(dl.out)]
    assert got == [
        (1, "line 3", "bad JSON"), (2, "line 4", "not an object"), (3, "line 5", "missing type"),
        (4, "line 6", "missing ts"), (5, "line 7", "non-numeric ts"), (6, "line 8", "non-numeric ts"),
        (7, "line 9", "bad JSON"), (8, "line 10", "list value"), (9, "line 11", "bad type"),
    ]
    assert reports(dl.out)[0]["raw"] == "{bad json" and dl.count == 9


def test_jsonl_bad_utf8_reported(dl):
    events = list(read_jsonl(io.BytesIO(b'{"type": "a", "ts": 1, "s": "\xff"}\n{"type": "a", "ts": 2}\n'), dead_letters=dl))
    assert [e.seq for e in events] == [1] and dl.by_reason == {"bad encoding": 1}


def test_jsonl_text_stream():
    assert [e.ts for e in read_jsonl(io.StringIO('{"type": "a", "ts": 1}\n'))] == [1.0]


# ------------------------------------------------------------------ sources


RECORDS = [{"type": "shelf", "ts": 1, "tag_id": 7}, {"type": "exit", "ts": 2, "tag_id": 7, "door": "D1"}]


@pytest.mark.parametrize("name", ["in.xml", "in.jsonl", "in.json", "in.ndjson", "in.xml.gz", "in.jsonl.gz"])
def test_read_events_by_extension_and_gzip(tmp_path, name):
    path = tmp_path / name
    write_events(RECORDS, path, "xml" if ".xml" in name else "jsonl")
    if name.endswith(".gz"):
        assert path.read_bytes()[:2] == b"\x1f\x8b"
    assert [(e.type, e.ts, e.attrs, e.seq) for e in read_events(path)] == [
        ("shelf", 1.0, {"tag_id": 7}, 0), ("exit", 2.0, {"tag_id": 7, "door": "D1"}, 1)]


def test_read_events_sniffs_gzip_and_format_without_extension(tmp_path):
    path = tmp_path / "feed"
    path.write_bytes(gzip.compress(b'\n{"type": "a", "ts": 1}\n'))
    assert [e.type for e in read_events(path)] == ["a"]
    path.write_bytes(b'  <s><a ts="1"/></s>')
    assert [e.type for e in read_events(str(path))] == ["a"]
    path.write_bytes(b"hello")
    with pytest.raises(InputError, match="format"):
        read_events(path)


def test_read_events_stdin(monkeypatch):
    class Stdin:
        buffer = io.BufferedReader(io.BytesIO(gzip.compress(b'<e ts="1"/><e ts="2"/>')))

    monkeypatch.setattr("sys.stdin", Stdin)
    assert [e.ts for e in read_events("-", "xml")] == [1.0, 2.0]


def test_unreadable_file_raises_input_error(tmp_path):
    with pytest.raises(InputError, match="cannot read"):
        read_events(tmp_path / "missing.xml")
    with pytest.raises(InputError, match="format"):
        read_events(tmp_path / "x.xml", "csv")


def test_corrupt_gzip_raises_input_error(tmp_path):
    path = tmp_path / "x.jsonl.gz"
    data = "".join(json.dumps(r) + "\n" for r in generate_stock(2000)).encode()
    path.write_bytes(gzip.compress(data)[:5000])
    with pytest.raises(InputError):
        list(read_events(path, dead_letters=DeadLetters()))


def test_memory_stays_flat(tmp_path):
    path = tmp_path / "big.xml"
    write_events(generate_stock(200_000), path)
    tracemalloc.start()
    try:
        n = 0
        last = None
        for last in read_xml(path):
            n += 1
        assert tracemalloc.get_traced_memory()[1] < 30_000_000
    finally:
        tracemalloc.stop()
    assert n == 200_000 and last.seq == 199_999


def test_every_event_element_is_detached_from_the_input():
    events = xml('<s xmlns:p="urn:p"><p:e ts="1"/><e ts="2"><p:x>1</p:x></e><e ts="3"/></s>')
    assert all(e.element.getparent() is None for e in events)
    assert events[0].element.tag == "{urn:p}e" and events[1].element[0].tag == "{urn:p}x"


# ------------------------------------------------------------------ dead letters, element_for


def test_dead_letters_file(tmp_path):
    path = tmp_path / "dead.jsonl"
    with DeadLetters(path) as d:
        d.report(3, "line 4", "late: 2 s behind", raw='{"x": 1}')
        assert json.loads(path.read_text()) == {"seq": 3, "position": "line 4", "reason": "late: 2 s behind", "raw": '{"x": 1}'}
        d.report(5, "line 6", "late: 1 s behind")
    assert d.count == 2 and d.by_reason == {"late": 2}
    assert len(path.read_text().splitlines()) == 2


def test_dead_letters_file_takes_lone_surrogates_and_appends_when_asked(tmp_path):
    path = tmp_path / "dead.jsonl"
    with DeadLetters(path) as d:
        d.report(0, "line 1", "late event: ts 5 < stream time 10", raw='{"x": "\ud800"}')
    with DeadLetters(path, append=True) as d:  # the service's restart keeps what was reported
        d.report(1, "line 2", "malformed record: bad JSON", raw="\udfff")
    assert [json.loads(x)["raw"] for x in path.read_text(encoding="utf-8").splitlines()] == ['{"x": "\ud800"}', "\udfff"]
    assert d.count == 1
    with DeadLetters(path) as d:  # yfpp run --dead-letters FILE starts the file afresh
        pass
    assert path.read_text() == ""


def test_element_for_json_event():
    [e] = jsonl('{"type": "shelf", "ts": 10, "tag_id": 7, "ok": false, "loc": {"x": 1.5}, "1x": "a", "a b": "c"}')
    el = e.element
    assert el.tag == "shelf" and el.get("ts") == "10.0" and el.get("tag_id") == "7"
    assert el.get("ok") == "false" and el.get("loc.x") == "1.5"
    assert {a.get("name"): a.text for a in el.findall("attr")} == {"1x": "a", "a b": "c"}
    assert e.element is el


def test_names_lxml_refuses_become_attr_children_and_other_predicates_still_hold():
    """``²`` is a letter to a regex's ``\\w`` but not to XML: the name goes to a child, as ``1x`` does, and
    predicates elementpath evaluates on the rest of the event are not falsified by it."""
    el = element_for(Event("²t", 1, {"²x": 1, "x²": 2, "v": 2}))
    assert el.tag == "event" and dict(el.attrib) == {"ts": "1", "v": "2"}
    assert {a.get("name"): a.text for a in el.findall("attr")} == {"²x": "1", "x²": "2"}
    eng = Engine()
    for i, q in enumerate(['//t[matches(@v, "^2$")]', '//t[name() = "t"]', "//t[@v = 2]"]):
        eng.register(q, name=f"q{i}")
    assert sorted(m["query"] for m in eng.process_all([{"type": "t", "ts": 1, "²x": 1, "v": 2}])) == ["q0", "q1", "q2"]


def test_element_for_odd_type_and_text():
    el = element_for(Event("my event", 1, {"ts": 5, "s": "a\x00b<&"}))
    assert el.tag == "event" and el.get("ts") == "5" and el.get("s") == "a\ufffdb<&"


@pytest.mark.parametrize("fmt,data", [
    ("jsonl", b'{"type": "a", "ts": 1}\nbad\n{"type": "a", "ts": 2}\n{"type": "a"}\n{"type": "a", "ts": 3}\nbad\n'),
    ("xml", b'<s>\n<a ts="1"/>\n<a ts="x"/>\n<a ts="2"/>\n<a/>\n<a ts="3"/>\n<a ts="y"/>\n</s>\n'),
])
def test_read_events_reports_each_dead_letter_where_its_record_is(fmt, data):
    """A block's records are read at once, yet a dead letter reaches the sink after the events before it and
    before the events after it (as batches go to ``yfpp run``, the events of a block follow its dead letters)."""
    log: list[tuple[str, int]] = []

    class Log(DeadLetters):
        def report(self, seq, position, reason, raw=None):
            log.append(("dead", seq))

    for ev in read_events(io.BytesIO(data), fmt, dead_letters=Log()):
        log.append(("event", ev.seq))
    assert log == [("event", 0), ("dead", 1), ("event", 2), ("dead", 3), ("event", 4), ("dead", 5)]
