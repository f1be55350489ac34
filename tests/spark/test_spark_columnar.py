"""The scan plan's columnar read side (``yfpp.spark.columnar``): Arrow-parsed ranges give the reader's events exactly.

Without Spark: over random JSON-lines feeds (int and float columns, integral floats, strings, bools, nulls,
missing keys, keys in other orders, duplicate keys, nested values, malformed lines, ts out of order, a
numeric-string ts), a range the columnar side takes gives the reader's events — type, ts, attributes
with their order and Python types — and the scan job's matches, dead letters and numbering with the
columnar side equal those without it and one engine's (``yfpp run``'s).
"""

from __future__ import annotations

import json
import zlib

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

pytest.importorskip("pyspark", reason="pyspark is not installed (pip install '.[spark]')")

from tests.spark.test_spark_scan import one_engine, scanned
from yfpp.input.dead_letters import DeadLetters
from yfpp.input.readers import read_events
from yfpp.spark import columnar
from yfpp.spark.plan import effective_queries, group_queries
from yfpp.spark.scan import ScanJob, value_hash

QUERIES = [("pair", "PATTERN SEQ(A a, B b) WHERE [k] AND a.x < b.x WITHIN 4"),
           ("neg", "PATTERN SEQ(A a, ~C c, B b) WHERE [k] WITHIN 3")]
READING = {"format": None, "ts_field": "ts", "ts_unit": "s"}

values = st.one_of(
    st.integers(-2**40, 2**40), st.integers(-2**70, 2**70),
    st.floats(allow_nan=False, allow_infinity=False, width=64), st.sampled_from([1.0, -0.0, 2.5, 1e300, 3e-7]),
    st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=4), st.sampled_from(["é", "a{", "b}", "q\"", "t\t"]),
    st.booleans(), st.none(), st.sampled_from([{"n": 1}, [1, 2]]))


#: A clean feed's columns: each of one type the columnar side takes (a float never integral).
CLEAN = {"x": st.integers(-2**40, 2**40),
         "y": st.floats(-1e6, 1e6).map(lambda v: v + 0.5 if v == int(v) else v), "z": st.text("abc :,", max_size=3)}


@st.composite
def feed_lines(draw) -> list[str]:
    """JSON lines: half the feeds clean (every line plain, each column of one type, the first line with every
    attribute, so that the columnar side takes them), the others with any value and odd lines."""
    clean = draw(st.booleans())
    cols = {**CLEAN, "k": draw(st.sampled_from([st.integers(-3, 3), st.sampled_from(["p", "q", "r"]), st.booleans()]))}
    lines, ts = [], 0
    for i in range(draw(st.integers(1, 40))):
        ts += draw(st.sampled_from([0, 0.5, 1, 1, 2]))
        kind = "plain" if clean else draw(st.sampled_from(
            ["plain"] * 12 + ["late", "bad", "blank", "dup", "shuffled", "text ts", "spaced"]))
        pairs: list[tuple[str, str]] = [("type", json.dumps(draw(st.sampled_from("ABC")))),
                                        ("ts", json.dumps(ts - 3 if kind == "late" else ts))]
        if draw(st.integers(0, 4)) or (clean and i == 0):
            pairs.append(("k", json.dumps(draw(cols["k"] if clean else st.one_of(st.integers(-3, 3), st.just("p"))))))
        names = ["x", "y", "z"] if clean and i == 0 else draw(st.lists(st.sampled_from("xyz"), unique=True, max_size=3).map(sorted))
        for name in names:
            pairs.append((name, json.dumps(draw(cols[name] if clean else values))))
        if kind == "dup":
            pairs.append(pairs[-1][:1] + (json.dumps(draw(values)),))
        if kind == "shuffled":
            pairs = draw(st.permutations(pairs))
        if kind == "text ts":
            pairs[1] = ("ts", json.dumps(str(ts)))
        sep = " : " if kind == "spaced" else ": "
        line = "{" + ", ".join(f"{json.dumps(k)}{sep}{v}" for k, v in pairs) + "}"
        lines += {"bad": [line[:-3]], "blank": ["", line]}.get(kind, [line])
    return lines


def test_columnar_routing_is_the_readers_key_hash():
    for v in [0, 1, -1, -2, 7, 2**61 - 1, 2**61, -(2**61), 2**63 - 1, -(2**63) + 1, 123456789012345, True, False]:
        table = columnar._table(json.dumps({"type": "A", "ts": 1, "k": v}).encode() + b"\n", "ts")
        for n in (2, 3, 16, 128):
            assert columnar.route(table, "k", n).tolist() == [value_hash(v) % n], (v, n)
    assert columnar.route(columnar._table(b'{"type": "A", "ts": 1, "k": -9223372036854775808}\n', "ts"), "k", 2) is None
    table = columnar._table(b'{"type": "A", "ts": 1, "k": "tag-7"}\n{"type": "A", "ts": 2}\n', "ts")
    assert columnar.route(table, "k", 5).tolist() == [zlib.crc32(b"tag-7") % 5, 5]  # no key: no task


def test_a_plain_feed_takes_the_columnar_side_and_other_shapes_do_not(tmp_path):
    plain = b'{"type": "A", "ts": 1, "k": "r", "x": 1.5}\n{"type": "B", "ts": 2, "k": "p", "y": true}\n'
    assert columnar.plain_tables(plain, "ts") is not None
    for spoilt in (plain.replace(b"1.5", b"1.0"),  # an integral float: 1 or 1.0 in the line? the reader's path
                   plain.replace(b'"ts": 2', b'"ts": 0'),  # out of order
                   plain.replace(b'"k": "r", "x"', b'"x": 1.5, "k": "r", "x"'),  # a duplicate key
                   plain.replace(b'"k": "p", "y": true', b'"y": true, "k": "p"'),  # keys in another order than the columns'
                   plain.replace(b'"p"', b'"\\u0070"'), plain.replace(b'"p"', b'"\xc3\xa9"'),
                   plain.replace(b"true", b"null"), plain + b"\n", plain[:-1]):
        assert columnar.plain_tables(spoilt, "ts") is None, spoilt
    groups = group_queries(effective_queries(QUERIES))
    path = tmp_path / "feed.jsonl"
    path.write_bytes(plain)
    assert ScanJob.plan(groups, [f"file://{path}"], True, 2, READING).columnar


@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
@given(lines=feed_lines(), n=st.integers(2, 3), pieces=st.sampled_from([1, 2, 5]))
def test_the_columnar_side_gives_the_readers_events_and_yfpp_run_s_matches(tmp_path_factory, monkeypatch, lines,
                                                                          n, pieces):
    path = tmp_path_factory.mktemp("columnar") / "feed.jsonl"
    path.write_text("".join(ln + "\n" for ln in lines))
    data = path.read_bytes()
    tables = columnar.plain_tables(data, "ts")
    event("columnar" if tables is not None else "the reader's path")
    if tables is not None:  # the events it ships are the reader's, attributes in their order, of the same types
        got = [(t, ts, a) for table in tables for t, ts, a in zip(table.column("type").to_pylist(),
                                                                  table.column("ts").to_pylist(), columnar.attrs_of(table))]
        want = [(e.type, e.ts, e.attrs) for e in read_events(str(path), dead_letters=DeadLetters())]
        assert [(t, ts, type(ts), list(a.items()), [type(v) for v in a.values()]) for t, ts, a in got] == \
               [(t, ts, type(ts), list(a.items()), [type(v) for v in a.values()]) for t, ts, a in want]
    want, letters = one_engine(QUERIES, path)
    got, dead, stats = scanned(QUERIES, [path], n, 100, pieces)
    with monkeypatch.context() as m:
        m.setattr(ScanJob, "columnar", property(lambda self: False))
        before, dead_before, stats_before = scanned(QUERIES, [path], n, 100, pieces)
    assert got == want == before
    assert dead == sorted(letters, key=lambda d: d["seq"]) == dead_before
    assert [s["records"] for s in stats] == [s["records"] for s in stats_before] == [len([ln for ln in lines if ln])] * n
