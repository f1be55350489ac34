"""Match ids: the per-query fast path (orjson) gives exactly the ids of the definition (json.dumps)."""

from __future__ import annotations

import hashlib
import json

from hypothesis import given, settings
from hypothesis import strategies as st

from yfpp.match_id import match_id, match_id_of


def defined(query, bindings) -> str:
    """The contract: 16 hex digits of BLAKE2b over ``json.dumps([query, bindings], separators=(",", ":"), default=str)``."""
    text = json.dumps([query, bindings], separators=(",", ":"), default=str)
    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


names = st.one_of(st.text(max_size=12), st.sampled_from(["shoplifting", "q1", 'a"b', "a\\b", "é", "\x7f", "tab\t"]),
                  st.integers(-5, 10**20))
seqs = st.one_of(st.integers(0, 2**70), st.integers(0, 10**6), st.text(max_size=6))


@settings(max_examples=400, deadline=None)
@given(names, st.lists(st.one_of(st.text(min_size=1, max_size=4), st.sampled_from(["a", "b", "c"])), min_size=1,
                       max_size=3, unique=True), st.data())
def test_the_fast_path_gives_the_defined_id(query, var_names, data):
    bindings = {v: data.draw(st.lists(seqs, max_size=4)) for v in var_names}
    ints = all(type(s) is int for lst in bindings.values() for s in lst)
    want = defined(query, bindings)
    assert match_id(query, bindings) == want
    assert match_id_of(query, tuple(var_names))(bindings, ints) == want


def test_a_known_id_is_stable():
    assert match_id("out", {"a": [0], "c": [1]}) == "4e1110d1828aaf3b"
    assert match_id_of("out", ("a", "c"))({"a": [0], "c": [1]}, True) == "4e1110d1828aaf3b"
