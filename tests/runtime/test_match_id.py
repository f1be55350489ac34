"""Match ids: the per-query fast path (orjson) gives exactly the ids of the definition (json.dumps)."""

from __future__ import annotations

import hashlib
import json
import struct

from hypothesis import given, settings
from hypothesis import strategies as st

from yfpp.runtime.match_id import match_id, match_id_of


def defined(query, bindings, start, end) -> str:
    """The contract: 16 hex digits of BLAKE2b over ``json.dumps([query, bindings], separators=(",", ":"), default=str)``
    followed by ``start`` and ``end`` as little-endian doubles."""
    text = json.dumps([query, bindings], separators=(",", ":"), default=str)
    return hashlib.blake2b(text.encode() + struct.pack("<dd", start, end), digest_size=8).hexdigest()


names = st.one_of(st.text(max_size=12), st.sampled_from(["shoplifting", "q1", 'a"b', "a\\b", "é", "\x7f", "tab\t"]),
                  st.integers(-5, 10**20))
seqs = st.one_of(st.integers(0, 2**70), st.integers(0, 10**6), st.text(max_size=6))
times = st.floats(allow_nan=False, allow_infinity=False)


@settings(max_examples=400, deadline=None)
@given(names, st.lists(st.one_of(st.text(min_size=1, max_size=4), st.sampled_from(["a", "b", "c"])), min_size=1,
                       max_size=3, unique=True), st.data())
def test_the_fast_path_gives_the_defined_id(query, var_names, data):
    bindings = {v: data.draw(st.lists(seqs, max_size=4)) for v in var_names}
    ints = all(type(s) is int for lst in bindings.values() for s in lst)
    start, end = data.draw(times), data.draw(times)
    want = defined(query, bindings, start, end)
    assert match_id(query, bindings, start, end) == want
    assert match_id_of(query, tuple(var_names))(bindings, ints, start, end) == want


def test_a_known_id_is_stable():
    assert match_id("out", {"a": [0], "c": [1]}, 10.0, 42.0) == "4e798bb5ee266444"
    assert match_id_of("out", ("a", "c"))({"a": [0], "c": [1]}, True, 10.0, 42.0) == "4e798bb5ee266444"


def test_matches_of_the_same_seqs_at_other_times_have_other_ids():
    """A restored service numbers events again from its checkpoint: events fed after a crash may get the seqs of
    events matched before it, and their matches must not share an id (a receiver would drop one as a repeat)."""
    ids = {match_id("theft", {"a": [1], "c": [2]}, start, end) for start, end in [(10.0, 11.0), (20.0, 21.0), (10.0, 12.0)]}
    assert len(ids) == 3
