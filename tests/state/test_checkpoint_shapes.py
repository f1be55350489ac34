"""Checkpoints keep query texts grouped by shape (version 3): one shape per template, the constants per query;
what is restored is the engine that was saved, its queries' ids, names, policies and feedback included."""

from __future__ import annotations

import json
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from yfpp.engine import Engine
from yfpp.errors import YfppError
from yfpp.language.query_text import like_pattern, parse_query, split_constants, split_like
from yfpp.state.checkpoint import encode_pattern

TEMPLATES = [
    "PATTERN SEQ(shelf a, ~register b, exit c) WHERE skip_till_next_match(a, b, c) "
    "{{ [tag_id] AND a.zone = 'Z{j}' AND c.door = 'D{j}' }} WITHIN 10 seconds",
    "[tag_id]&&//shelf[@zone='Z{j}' and @weight > {w}]//exit&&(10 s)",
    "PATTERN SEQ(reading r) WHERE r.device = 'U{j}' AND r.celsius > {w}",
]


def feed(n: int) -> list[dict]:
    out = []
    for i in range(n):
        j, tag = i % 7, i % 5
        kind = ("shelf", "register", "exit", "reading")[i % 4]
        out.append({"type": kind, "ts": float(i), "tag_id": tag, "zone": f"Z{j}", "door": f"D{j}", "weight": 10 * j,
                    "device": f"U{j}", "celsius": 5 * j})
    return out


def engine() -> tuple[Engine, list[dict]]:
    eng = Engine(reports=None)
    texts = [t.format(j=j, w=5 + j) for j in range(7) for t in TEMPLATES]
    assert all(isinstance(q, int) for q in eng.register_many([(t, f"s{i}") for i, t in enumerate(texts)]))
    eng.register(parse_query("PATTERN SEQ(shelf a, exit c) WHERE [tag_id] WITHIN 4"), name="pattern")
    eng.register("PATTERN SEQ(shelf a, exit c) WHERE [tag_id] AND a.zone = 'Z1' WITHIN 9", policy="non_overlapping")
    eng.register("PATTERN SEQ(reading r) WHERE r.device = 'U2' RETURN hot(d = r.device)", feedback=True)
    eng.unregister(3)
    events = feed(60)
    for e in events[:30]:
        eng.process(dict(e))
    return eng, events[30:]


def test_a_checkpoint_keeps_each_shape_once_and_restores_the_same_engine():
    eng, later = engine()
    data = json.loads(json.dumps(eng.snapshot()))
    assert data["version"] == 3
    assert len(data["shapes"]) == len(TEMPLATES) + 2  # (the policy and feedback queries: shapes of their own)
    assert sum(q[2] is None for q in data["queries"]) == 1  # the Pattern, kept as its IR
    assert [q[0] for q in data["queries"]] == sorted(eng.sources)
    back = Engine.restore(data, reports=None)
    assert json.loads(json.dumps(back.snapshot())) == data
    assert {qid: src[1:] for qid, src in back.sources.items()} == {qid: src[1:] for qid, src in eng.sources.items()}
    assert {qid: src[0] for qid, src in back.sources.items()} == {qid: src[0] for qid, src in eng.sources.items()}
    for e in later:
        assert back.process(dict(e)) == eng.process(dict(e))
    assert back.flush() == eng.flush()


def test_a_version_2_checkpoint_with_each_querys_pattern_is_still_read():
    eng, later = engine()
    data = json.loads(json.dumps(eng.snapshot()))
    shapes = data.pop("shapes")
    rows = []
    for qid, name, shape, what, since in data["queries"]:
        text = None if shape is None else "".join(x for p in zip(shapes[shape][0], what) for x in p) + shapes[shape][0][-1]
        rows.append({"id": qid, "name": name, "text": text, "since_tick": since,
                     "pattern": what if shape is None else encode_pattern(eng.sources[qid][0])})
    data.update(version=2, queries=rows)
    back = Engine.restore(data, reports=None)
    for e in later:
        assert back.process(dict(e)) == eng.process(dict(e))


@pytest.mark.parametrize("edit, message", [
    (lambda d: d["queries"][1].__setitem__(2, 99), "a query's shape must be one of shapes"),
    (lambda d: d["queries"][0].__setitem__(3, ["'Z1'"]), r"queries\[0\]: shape 0 takes 2 constants"),
    (lambda d: d["queries"][1].__setitem__(3, [1, 2, 3]), "its constants strings"),
    (lambda d: d.pop("shapes"), "version 3 keeps queries as rows beside their shapes"),
    (lambda d: d["shapes"][0].__setitem__(1, 7), r"shapes\[0\]\[1\]: expected a non-empty string"),
])
def test_a_damaged_shape_or_row_is_a_corrupt_checkpoint(edit, message):
    eng, _ = engine()
    data = json.loads(json.dumps(eng.snapshot()))
    edit(data)
    with pytest.raises(YfppError, match=f"corrupt checkpoint: .*{message}"):
        Engine.restore(data, reports=None)


def test_split_constants_gives_the_text_back():
    for t in TEMPLATES:
        text = t.format(j=12, w=3.5)
        around, constants = split_constants(text)
        assert "".join(x for p in zip(around, constants) for x in p) + around[-1] == text
        assert constants[:1] == ["'Z12'"] or constants[:1] == ["'U12'"]


# the constant scan written plainly (a look-ahead, then the alternatives whole): what split_constants finds
_PLAIN_CONSTANT = re.compile(r"""(?=['"=<>])(?:('[^'\\\n]*'|"[^"\\\n]*")|[=<>]\s*(\d{1,15}(?:\.\d{1,15})?)(?![\w.%]))""")


_PIECES = st.sampled_from(["'", '"', "=", "<", ">", " ", "\n", "\\", ".", "%", "_", "a", "x1", "0", "12",
                           "1234567890123456", "٣", "\u00a0", " = ", "'Z1'", ">= 3.5", "<7"])


@settings(max_examples=500, deadline=None)
@given(st.lists(_PIECES, max_size=16))
def test_split_constants_finds_what_the_plain_scan_finds(pieces):
    text = "".join(pieces)
    want = [(m.start(1), m.group(1)) if m.group(1) is not None else (m.start(2), m.group(2))
            for m in _PLAIN_CONSTANT.finditer(text)]
    around, constants = split_constants(text)
    assert constants == [tok for _, tok in want]
    assert [len(a) for a in around[:-1]] == [at - (want[i - 1][0] + len(want[i - 1][1]) if i else 0)
                                             for i, (at, _) in enumerate(want)]
    assert "".join(x for p in zip(around, constants) for x in p) + around[-1] == text


@settings(max_examples=500, deadline=None)
@given(st.lists(_PIECES, max_size=16), st.lists(st.tuples(st.sampled_from(["", "'", '"']), st.lists(_PIECES, max_size=4)),
                                                max_size=8))
def test_a_text_split_like_another_is_split_as_the_scan_splits_it(pieces, fills):
    """``split_like`` (how ``QueryShapes.shape_of`` splits a text of the shape it found last) finds a text's
    constants only where ``split_constants`` finds the same text around them, and the same constants."""
    text = "".join(pieces)
    around, constants = split_constants(text)
    kinds = [tok[0] if tok[0] in "'\"" else "d" if "." in tok else "n" for tok in constants]
    both = [tok for tok in constants if "'" in tok and '"' in tok]  # (left to the scan)
    assert split_like(text, like_pattern(around, kinds)) == (None if both else constants)
    # the same text around other constants: each a quoted string or the pieces as they come
    others = [quote + "".join(inner) + quote for quote, inner in fills[:len(constants)]] + constants[len(fills):]
    other = around[0] + "".join(c + after for c, after in zip(others, around[1:]))
    found = split_like(other, like_pattern(around, kinds))
    if found is not None:
        assert split_constants(other) == (around, found)
    elif split_constants(other)[0] == around:  # (the scan splits it alike: kinds differ, or a constant holds both quotes)
        tokens = split_constants(other)[1]
        assert [tok[0] if tok[0] in "'\"" else "d" if "." in tok else "n" for tok in tokens] != kinds or \
            any("'" in tok and '"' in tok for tok in tokens)


def test_a_restore_reuses_the_kept_split_and_trusts_only_whole_constants(monkeypatch):
    """A row's constants are put into its shape without splitting its text again, when they are whole constants
    of the kinds of its shape's first text (checked by splitting that one); a forged row is split as text."""
    import yfpp.language.query_text as query_text

    eng, later = engine()
    data = json.loads(json.dumps(eng.snapshot()))
    splits = []
    real = query_text.split_constants
    monkeypatch.setattr(query_text, "split_constants", lambda text: splits.append(text) or real(text))
    back = Engine.restore(data, reports=None)
    assert splits == []  # (the engine split none of the texts: the checkpoint's own check splits one per shape)
    forged = json.loads(json.dumps(data))
    row = next(q for q in forged["queries"][1:] if q[2] == forged["queries"][2][2] and q[3][0] != "'U0'")
    row[3][0] = row[3][0] + " OR r.device = 'U0'"  # (one constant in the row, two in its text)
    text = "".join(x for p in zip(forged["shapes"][row[2]][0], row[3]) for x in p) + forged["shapes"][row[2]][0][-1]
    again = Engine.restore(forged, reports=None)
    assert text in splits and again.sources.text(row[0]) == text
    alone = Engine(reports=None)
    alone.register(text, query_id=row[0], name=row[1])
    ours = [(m["start"], m["end"]) for e in later for m in again.process(dict(e)) if m["query"] == row[1]]
    assert ours and ours == [(m["start"], m["end"]) for e in later for m in alone.process(dict(e))]
    for e in later:
        assert back.process(dict(e)) == eng.process(dict(e))


_ROW_VALUES = st.one_of(st.none(), st.booleans(), st.integers(-3, 3), st.sampled_from([1 << 63, (1 << 63) - 1]),
                        st.sampled_from(["", "s1", "'Z1'"]), st.floats(allow_nan=False), st.just([]), st.just({}))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(st.lists(st.one_of(_ROW_VALUES, st.lists(_ROW_VALUES, max_size=3)), min_size=2, max_size=6),
                          _ROW_VALUES), max_size=4))
def test_the_one_loop_checks_refuse_what_their_specs_refuse(rows):
    """Version 3's query rows and the branches pass their one-loop checks exactly when they pass their specs,
    with the specs' errors."""
    from yfpp.state.schema import NODE, _Bad, _branches, _query_rows, list_of, optional, row
    from yfpp.state.schema import ANY, INT, STR

    def outcome(check):
        try:
            check(rows, {})
        except _Bad as e:
            return e.want, e.found, e.path
        return None

    assert outcome(_query_rows) == outcome(list_of(row(INT, optional(STR), optional(INT), ANY, optional(INT))))
    assert outcome(_branches) == outcome(list_of(row(NODE, INT, INT)))


@pytest.mark.parametrize("edit, message", [
    (lambda d: d["queries"][2].__setitem__(1, d["queries"][1][1]), "a query named 's1' is already registered"),
    (lambda d: d["queries"][1].__setitem__(1, ""), r"queries\[1\]\[1\]: expected a non-empty string"),
    (lambda d: d["queries"][0][3].__setitem__(0, "'Z" + "x" * 1_000_000 + "'"), "query text is .*characters"),
])
def test_a_row_of_a_compiled_shape_is_checked_as_a_registration(edit, message):
    """Rows registered from their shape's plan are refused as register refuses them: a name taken, an empty
    name, a text over the length limit."""
    eng, _ = engine()
    data = json.loads(json.dumps(eng.snapshot()))
    edit(data)
    with pytest.raises(YfppError, match=message):
        Engine.restore(data, reports=None)
