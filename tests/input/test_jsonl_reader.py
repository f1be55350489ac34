"""The JSON-lines reader: no record ends the run; caps, odd numbers, duplicate keys, line ends; overflow in predicates."""

from __future__ import annotations

import gzip
import io
import json
import tracemalloc

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from yfpp.input.dead_letters import DeadLetters
from yfpp.engine import Engine
from yfpp.output.writer import match_line
from yfpp.errors import InputError
from yfpp.input.events import Event
from yfpp.language.query_text import parse_query
from yfpp.input.readers import read_events, read_jsonl
from tests.input.test_xml_reader import Trickle
from yfpp.input import jsonl_reader
from yfpp.reference.oracle import reference_matches


def read(data: bytes, **opts) -> tuple[list[tuple], list[dict]]:
    out = io.StringIO()
    events = [(e.seq, e.type, e.ts, e.attrs) for e in read_jsonl(io.BytesIO(data), dead_letters=DeadLetters(out), **opts)]
    return events, [json.loads(x) for x in out.getvalue().splitlines()]


def reasons(dead: list[dict]) -> list[tuple[int, str, str]]:
    return [(d["seq"], d["position"], d["reason"].split(":")[0]) for d in dead]


GOOD = b'{"type": "a", "ts": 1}\n'
AFTER = b'{"type": "a", "ts": 9}\n'


@pytest.mark.parametrize("line,reason", [
    (b'{"type": "a", "ts": 2, "x": ' + b'{"a": ' * 1000 + b"1" + b"}" * 1000 + b"}", "too deep"),
    (b'{"type": "a", "ts": 2, "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "too deep"),
    (b'{"type": "a", "ts": 2, "x": ' + b'{"a": ' * 70 + b"1" + b"}" * 70 + b"}", "too deep"),
    (b'{"type": "a", "ts": 2, "n": ' + b"9" * 5000 + b"}", "bad JSON"),
    (b'{"type": "a", "ts": 2, "n": 1e999}', "number out of range"),
    (b'{"type": "a", "ts": 2, "n": NaN}', "bad JSON"),
    (b'{"type": "a", "ts": 2, "ts": 3}', "duplicate key"),
    (b'{"type": "a", "ts": 2, "\\u0074s": 3}', "duplicate key"),
    (b'{"type": "a", "type": "b", "ts": 2}', "duplicate key"),
    (b'{"type": "a", "ts": ' + b"9" * 309 + b"}", "ts out of range"),
    (b'{"type": "a", "ts": 1e400}', "ts out of range"),
    (b'{"type": "a", "ts": 2, "s": "\xff"}', "bad encoding"),
    (b"null", "not an object"),
    (b" [1] ", "not an object"),
    (b'"text"', "not an object"),
])
def test_a_bad_line_is_one_dead_letter_and_the_stream_goes_on(line, reason):
    events, dead = read(GOOD + line + b"\n" + AFTER)
    assert [(e[0], e[2]) for e in events] == [(0, 1.0), (2, 9.0)]
    assert reasons(dead) == [(1, "line 2", reason)]


def test_big_integers_are_exact_and_other_duplicate_keys_keep_the_last():
    big = int("9" * 309)
    events, dead = read(b'{"type": "a", "ts": 1, "n": %d, "m": 12345678901234567890123, "k": 1, "k": 2, "f": 1e20}\n' % big)
    assert events == [(0, "a", 1.0, {"n": big, "m": 12345678901234567890123, "k": 2, "f": 1e20})] and dead == []
    assert type(events[0][3]["m"]) is int


@pytest.mark.parametrize("sep", [b"\r", b"\r\n", b"\n"])
def test_line_ends(sep):
    events, dead = read(sep.join([b'{"type": "a", "ts": 1}', b"", b'{"type": "a", "ts": 2}', b'{"type": "a", "ts": 3']))
    assert [e[2] for e in events] == [1.0, 2.0] and reasons(dead) == [(2, "line 4", "bad JSON")]


def test_a_huge_line_is_capped_and_not_held_in_memory():
    data = GOOD + b'{"type": "a", "ts": 2, "s": "' + b"x" * 30_000_000 + b'"}\n' + AFTER
    tracemalloc.start()
    try:
        events, dead = read(data, max_record_bytes=1 << 20)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert [e[2] for e in events] == [1.0, 9.0] and reasons(dead) == [(1, "line 2", "too large")]
    assert len(dead[0]["raw"]) <= 1025 and peak < 10_000_000


def test_a_capped_line_ending_at_a_read_boundary_does_not_end_the_stream():
    class Blocks(io.RawIOBase):
        def __init__(self, blocks):
            self.blocks = list(blocks)

        def readable(self):
            return True

        def read1(self, n=-1):
            return self.blocks.pop(0) if self.blocks else b""

    blocks = [b'{"type": "a", "ts": 1, "s": "' + b"x" * 300, b"x" * 300, b'"}\n', b'{"type": "a", "ts": 2}\n']
    out = io.StringIO()
    events = [e.ts for e in read_jsonl(Blocks(blocks), dead_letters=DeadLetters(out), max_record_bytes=200)]
    assert events == [2.0] and json.loads(out.getvalue())["reason"].startswith("too large")


def test_type_field():
    events, dead = read(b'{"kind": "shelf", "ts": 1, "type": "x"}\n{"ts": 2}\n', type_field="kind")
    assert events == [(0, "shelf", 1.0, {"type": "x"})] and reasons(dead) == [(1, "line 2", "missing type")]


def test_truncated_gzip_is_an_input_error_after_the_records_before_it(tmp_path):
    path = tmp_path / "feed.jsonl.gz"
    data = b"".join(b'{"type": "a", "ts": %d, "pad": "%s"}\n' % (i, str(i * 7919).encode() * 5) for i in range(20000))
    path.write_bytes(gzip.compress(data)[:-5000])
    seen = []
    with pytest.raises(InputError, match=r"after line \d+"):
        for e in read_events(path, dead_letters=DeadLetters()):
            seen.append(e.ts)
    assert seen and seen == list(map(float, range(len(seen))))


def test_corrupt_gzip_is_an_input_error(tmp_path):
    path = tmp_path / "feed.xml.gz"
    raw = bytearray(gzip.compress(b"<s>" + b'<e ts="1"/>\n' * 50000 + b"</s>"))
    raw[len(raw) // 2] ^= 0xFF
    path.write_bytes(bytes(raw))
    with pytest.raises(InputError, match="after line"):
        list(read_events(path, dead_letters=DeadLetters()))


# ------------------------------------------------------------------ a block parsed at once = its lines one by one

KEYS = [b'"type"', b'"ts"', b'"a"', b'"b"', b'"ts "', b'"t\\u0073"']
VALUES = [b'"a"', b'"b"', b'""', b"1", b"-3", b"2.5", b"0.1", b"1e20", b"-2E3", b"9223372036854775808",
          b"18446744073709551616", b"9" * 19 + b".5", b"null", b"true", b'"ts"', b'"type"', b'"a:{b"', b'"x]"',
          b'{"c": 1}', b'{"ts": 1}', b"[1]", b'"\\u0041"', b"NaN", b"1e999", b'"\\n"', b"\xff", b'"{"']
LINE = st.one_of(
    st.lists(st.tuples(st.sampled_from(KEYS), st.sampled_from(VALUES)), max_size=5).flatmap(lambda pairs: st.sampled_from([
        b"{" + b", ".join(k + b": " + v for k, v in pairs) + b"}" + end for end in (b"", b" ", b",{}", b" 5", b"}")])),
    st.sampled_from([b"", b"  ", b"\t", b"5", b'"x"', b"{}", b"[{}]", b"null", b'{"a": 1', b"\x0c"]),
)
GOOD_LINE = st.builds(lambda ts, v: b'{"type": "a", "ts": %d, "v": %s}' % (ts, v), st.integers(0, 99), st.sampled_from(VALUES[:8]))


def read_all(data: bytes, trickle: int | None, **opts) -> tuple[list[tuple], list[dict]]:
    out = io.StringIO()
    source = Trickle(data, trickle) if trickle is not None else io.BytesIO(data)
    # every slot, so an event made without __init__ is seen to be whole
    events = [(e.seq, e.type, e.ts, type(e.ts), sorted((k, v, type(v)) for k, v in e.attrs.items()), e.pos, e.texts, e._el)
              for e in read_jsonl(source, dead_letters=DeadLetters(out), **opts)]
    return events, [json.loads(x) for x in out.getvalue().splitlines()]


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(lines=st.lists(st.one_of(GOOD_LINE, GOOD_LINE, LINE), max_size=12), sep=st.sampled_from([b"\n", b"\r\n", b"\r"]),
       last=st.booleans(), trickle=st.one_of(st.none(), st.integers(0, 100)), unit=st.sampled_from(["s", "h"]))
def test_a_block_parsed_at_once_reads_as_its_lines_one_by_one(monkeypatch, lines, sep, last, trickle, unit):
    data = sep.join(lines) + (sep if last else b"")
    bulk = read_all(data, trickle, ts_unit=unit)
    with monkeypatch.context() as m:
        m.setattr(jsonl_reader, "_bulk", lambda body, keys: None)
        assert read_all(data, trickle, ts_unit=unit) == bulk


# ------------------------------------------------------------------ overflow in predicates (docs/semantics.md §4)

HUGE = int("9" * 309)


@pytest.mark.parametrize("query,want", [
    ("PATTERN SEQ(a x, b y) WHERE x.n + 0.5 > 0", []),
    ("PATTERN SEQ(a x, b y) WHERE x.n / 3 > 0", []),
    ("PATTERN SEQ(a x, b y) WHERE x.n * 1.0 > 0", []),
    ("PATTERN SEQ(a x, b y) WHERE x.f * x.f > 0", []),
    ("PATTERN SEQ(a+ x[], b y) WHERE avg(x[..].n) > 0", []),
    # one a: 1e308 > 0; both a's: the sum overflows, a missing value, so no match
    ("PATTERN SEQ(a+ x[], b y) WHERE sum(x[..].f) > 0", [{"x": [1], "y": [2]}]),
])
def test_overflow_is_a_missing_value_not_a_crash(query, want):
    events = [Event("a", 1, {"n": HUGE, "f": 1e308}, 0), Event("a", 2, {"n": HUGE, "f": 1e308}, 1), Event("b", 3, {}, 2)]
    engine = Engine()
    engine.register(query, name="q")
    got = [m for ev in events for m in engine.process(Event(ev.type, ev.ts, dict(ev.attrs), ev.seq))] + engine.flush()
    assert [m["bindings"] for m in got] == want
    assert [b for b, _ in reference_matches(parse_query(query), events)] == want


@pytest.mark.parametrize("factors,kept", [(14, True), (15, False)])  # 10**4200 (4,201 digits), 10**4500
def test_an_integer_result_python_cannot_write_is_a_missing_value(factors, kept):
    """An int result of more than 4,300 digits is missing (it could not be written as text, and the readers
    take none that long), in the engine, the reference and a RETURN field."""
    product = " * ".join(["x.n"] * factors)
    query = f"PATTERN SEQ(a x, b y) WHERE {product} > 0 RETURN r(v = {product})"
    events = [Event("a", 1, {"n": 10**300}, 0), Event("b", 2, {}, 1)]
    engine = Engine()
    engine.register(query, name="q")
    got = [m for ev in events for m in engine.process(Event(ev.type, ev.ts, dict(ev.attrs), ev.seq))]
    assert len(got) == kept == len(reference_matches(parse_query(query), events))
    engine = Engine()
    engine.register(f"PATTERN SEQ(a x, b y) RETURN r(v = {product})", name="q")
    [match] = [m for ev in events for m in engine.process(Event(ev.type, ev.ts, dict(ev.attrs), ev.seq))]
    assert match["emit"]["attrs"]["v"] == (10**(300 * factors) if kept else None)
    assert match_line(match)  # written, not a ValueError from int → str


def test_huge_integers_still_compute_exactly():
    engine = Engine()
    engine.register("PATTERN SEQ(a x, b y) WHERE x.n * 2 - x.n = x.n AND x.n + 1 > x.n", name="q")
    engine.process(Event("a", 1, {"n": HUGE}))
    assert len(engine.process(Event("b", 2, {}))) == 1
