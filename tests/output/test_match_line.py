"""A match line is exactly ``json.dumps(match)`` and a newline, whichever way :func:`match_line` builds it."""

from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from yfpp.output import writer as output
from yfpp.output.writer import match_line

TEXT = st.one_of(st.text(max_size=6), st.text(alphabet='az09 ,:"\\\x7f\x00\néE.-[', max_size=6))
NUMBER = st.one_of(st.integers(), st.integers(-(2**70), 2**70), st.floats(allow_nan=True, allow_infinity=True),
                   st.sampled_from([1e16, 1e-5, 0.0001, 9.9e-5, -0.0, 1e300, 123.0]))
SCALAR = st.one_of(TEXT, NUMBER, st.booleans(), st.none())
VALUE = st.recursive(SCALAR, lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(TEXT, inner, max_size=3)),
                     max_leaves=8)


@settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(query=TEXT, seqs=st.lists(st.integers(0, 10**6), min_size=1, max_size=3), start=NUMBER,
       attrs=st.dictionaries(TEXT, VALUE, max_size=4), extra=st.dictionaries(TEXT, VALUE, max_size=2))
def test_match_line_is_json_dumps(query, seqs, start, attrs, extra):
    match = {"query": query, "id": "0123456789abcdef", "bindings": {"a": seqs}, "start": start, "end": 2.5,
             "emit": {"type": "t", "attrs": attrs}, **extra}
    assert match_line(match) == (json.dumps(match) + "\n").encode()


@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(match_id=st.text(alphabet="0123456789abcdef", min_size=16, max_size=16), start=NUMBER,
       values=st.lists(st.one_of(NUMBER, st.text(alphabet="0123456789e.-E", max_size=5)), max_size=4))
def test_ids_and_numbers_that_look_alike(match_id, start, values):
    """A hex id or a string of digits and ``e`` is no exponent; a float written with one is."""
    match = {"query": "q", "id": match_id, "bindings": {"a": [1]}, "start": start, "end": 2.5,
             "emit": {"type": "t", "attrs": {f"v{i}": v for i, v in enumerate(values)}}}
    assert match_line(match) == (json.dumps(match) + "\n").encode()


def test_a_plain_match_takes_orjson(monkeypatch):
    match = {"query": "shoplifting", "id": "77e5136116d7499f", "bindings": {"a": [21], "c": [90]}, "start": 339.0,
             "end": 1447.5, "emit": {"type": "theft", "attrs": {"tag_id": 5, "zone": "Z1", "ok": True}}}
    want = (json.dumps(match) + "\n").encode()
    monkeypatch.setattr(output.json, "dumps", None)  # the standard library is not called
    assert match_line(match) == want


@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(first_id=st.text(alphabet='0123456789abcdef"', min_size=10, max_size=20),
       other_id=st.text(alphabet="0123456789e", min_size=0, max_size=18), numbers=st.lists(NUMBER, min_size=1, max_size=3),
       id_first=st.booleans())
def test_what_is_left_out_of_the_number_checks_is_only_an_id(first_id, other_id, numbers, id_first):
    """The first ``"id"`` string is skipped by the number checks only when it is 16 characters of string
    content: a shorter or longer one, or an ``"id"`` key in a nested object, hides no number after it."""
    inner = {"id": other_id, "x": numbers}
    match = ({"id": first_id, "query": "q", "emit": inner} if id_first
             else {"emit": inner, "query": "q", "id": first_id, "end": numbers[0]})
    assert match_line(match) == (json.dumps(match) + "\n").encode()
