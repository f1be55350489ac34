"""The match-windows paper's running example: relation Chemo (Figure 1), query Q1, Examples 3–13.

Events are numbered as in the paper: ``e1`` has seq 0.  Types are the paper's
attribute L (C Ciclofosfamide, P Prednisone, B blood count, D another drug).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from yfpp.engine import Engine
from yfpp.sets.match_window import MatchWindowMatcher, SummaryStatistics
from yfpp.sets.plan import compile_sets, event_bits, key_of
from yfpp.sets.search import earliest_maximal, search
from yfpp.input.events import Event
from yfpp.language.query_text import load_queries, parse_query
from yfpp.input.readers import read_events
from yfpp.reference.oracle import reference_matches

ROOT = Path(__file__).resolve().parents[1]
_Q1_TEXT = load_queries([str(ROOT / "queries" / "chemo_q1.sase")])[0].text
Q1 = parse_query(_Q1_TEXT, "sase")
CHEMO = list(read_events(str(ROOT / "yfpp" / "data" / "chemo.jsonl"), "jsonl"))
for _e in CHEMO:
    _e.pos = _e.seq  # stream positions, as an Engine gives them (search and earliest_maximal order by them)

# Example 4's "complete list of matches", as extracted from the paper.
PAPER_EXAMPLE_4 = [
    {"c": [1], "p": [3], "b": [11]},
    {"c": [7], "p": [5], "b": [12]},
    {"c": [7], "p": [8], "b": [12]},
    {"c": [1], "p": [3, 9], "b": [11]},
    {"c": [7], "p": [5], "b": [13]},
    {"c": [7], "p": [8], "b": [13]},
    {"c": [7], "p": [5, 8], "b": [12]},
    {"c": [7], "p": [5, 8], "b": [13]},
]
# What Definition 2 also admits and the list leaves out: e9 (P, patient 1, 116.5, 12 Jul) alone
# with e1 and e11, and e10 (P, patient 2, 88, 15 Jul) alone with e7 and e12 or e13 — every
# condition holds (one P binds no "prev" pair; e1..e11 and e7..e13 span 14 and 9 days).
DEFINITION_2_EXTRA = [
    {"c": [1], "p": [9], "b": [11]},
    {"c": [7], "p": [10], "b": [12]},
    {"c": [7], "p": [10], "b": [13]},
]
# Example 5's earliest and maximal matches (the extracted text lists all three, the third apart).
PAPER_EXAMPLE_5 = [
    {"c": [1], "p": [3, 9], "b": [11]},
    {"c": [7], "p": [5, 8], "b": [12]},
    {"c": [7], "p": [8], "b": [12]},
]


def paper(bindings: dict[str, list[int]]) -> dict[str, list[int]]:
    """Seq numbers → the paper's event numbers."""
    return {v: [s + 1 for s in seqs] for v, seqs in bindings.items()}


def canon(matches) -> list:
    return sorted(tuple((v, tuple(s)) for v, s in m.items()) for m in matches)


def run(query, strategy: str, policy: str | None = None) -> list[dict]:
    eng = Engine(strategy=strategy, policy=policy)
    eng.register(query, name="q1")
    out = [m for ev in CHEMO for m in eng.process(ev)]
    return out + eng.flush()


def test_figure_1_relation() -> None:
    assert [(e.type, e.attrs["PID"], e.attrs["V"], e.ts / 86400) for e in CHEMO[:3]] == [
        ("C", 1, 1672.5, 3), ("B", 1, 7100, 4), ("P", 1, 111.5, 5),
    ]  # fmt: skip
    assert "".join(e.type for e in CHEMO) == "CBPBPDCPPPBBBB"
    assert [e.attrs["PID"] for e in CHEMO] == [1, 1, 1, 2, 2, 2, 2, 2, 1, 2, 1, 2, 2, 1]


def test_example_2_pattern() -> None:
    assert [[c.var + ("+" if c.kind.value == "kleene" else "") for c in b] for b in Q1.blocks] == [["c", "p+"], ["b"]]
    assert Q1.window == 15 * 86400


def test_example_3_substitution_is_a_match() -> None:
    gamma = {"c": [7], "p": [5, 8], "b": [12]}
    found = [paper(b) for b, _ in reference_matches(Q1, CHEMO)]
    assert gamma in found


@pytest.mark.parametrize("strategy", ["direct", "match-window"])
def test_example_4_all_matches_of_definition_2(strategy: str) -> None:
    got = [paper(m["bindings"]) for m in run(Q1, strategy)]
    assert canon(got) == canon(PAPER_EXAMPLE_4 + DEFINITION_2_EXTRA)
    assert canon(got) == canon(paper(b) for b, _ in reference_matches(Q1, CHEMO))


@pytest.mark.parametrize("strategy", ["direct", "match-window"])
def test_example_5_earliest_and_maximal(strategy: str) -> None:
    got = [paper(m["bindings"]) for m in run(Q1, strategy, policy="earliest_maximal")]
    assert canon(got) == canon(PAPER_EXAMPLE_5)
    em = dataclasses.replace(Q1, policy="earliest_maximal")
    assert canon(got) == canon(paper(b) for b, _ in reference_matches(em, CHEMO))


def windows(**switches: bool) -> list[tuple[list[int], tuple[bool, bool, bool]]]:
    """The match windows a MatchWindowMatcher completes over Chemo, as paper event numbers."""
    matcher = MatchWindowMatcher(compile_sets(Q1, "q1"), **switches)
    matcher.trace = []
    for ev in CHEMO:
        matcher.process(ev)
    matcher.flush()
    return [([e.seq + 1 for e in events], met) for events, met in matcher.trace]


def test_example_6_match_windows() -> None:
    seen = dict((w[0], w) for w, _ in windows(filtering=False, partitioning=False, conditions=False))
    assert seen[1] == list(range(1, 13))  # W1: e1 … e12, twelve events within 15 days of 3 Jul
    assert seen[2] == list(range(2, 14))  # W2: e2 … e13


def test_example_7_matcher_on_w1_and_w2() -> None:
    plan = compile_sets(Q1, "q1")
    w1 = [(e, event_bits(plan, e)) for e in CHEMO[0:12]]
    w2 = [(e, event_bits(plan, e)) for e in CHEMO[1:13]]
    assert [paper(dict(zip(plan.vars, [[e.seq for e in x] for x in b]))) for b in earliest_maximal(plan, search(plan, w1, True))] == [
        {"c": [1], "p": [3, 9], "b": [11]}
    ]
    assert search(plan, w2, True) == []  # no match starts at e2


def test_example_8_filtering() -> None:
    seen = dict((w[0], w) for w, _ in windows(filtering=True, partitioning=False, conditions=False))
    assert seen[1] == [1, 2, 3, 4, 5, 7, 8, 9, 10, 11, 12]  # e6 (D) satisfies no variable's properties
    assert seen[2] == [2, 3, 4, 5, 7, 8, 9, 10, 11, 12, 13]
    assert 6 not in seen


def test_example_9_necessary_conditions() -> None:
    met = {w[0]: m for w, m in windows(filtering=True, partitioning=False, conditions=True)}
    assert met[1] == (True, True, True)  # |W'1| = 11 ≥ 3; e1 is a C; counters all above zero
    assert met[2][1] is False  # e2 (B) satisfies no variable of B1 = {c, p+}: Condition 5 fails


def test_figure_5_summary_statistics_examples_10_11() -> None:
    """Patient 1's window: ⟨e1⟩ … ⟨e1, e2, e3, e9, e11⟩, then e1 dequeued.

    Figure 5's columns (6) and (7) show the statistics' verdict (Theorem 3),
    which is stricter than Conditions 6 and 7 read alone: in ⟨e1, e2, e3⟩ e2
    satisfies b's properties (Condition 6 holds), but no p event precedes it.
    """
    plan = compile_sets(Q1, "q1")
    stats = SummaryStatistics(plan)
    window: list[tuple[Event, tuple]] = []
    rows = []
    for n in (1, 2, 3, 9, 11):
        ev = CHEMO[n - 1]
        window.append((ev, stats.add(event_bits(plan, ev))))
        rows.append(stats.counters())
    assert rows == [
        {"c": 1, "p": 0, "b": 0},
        {"c": 1, "p": 0, "b": 0},
        {"c": 1, "p": 1, "b": 0},  # Example 10: S = ⟨(c,1), (p,1), (b,0)⟩
        {"c": 1, "p": 2, "b": 0},
        {"c": 1, "p": 2, "b": 1},  # after e11 every counter is above zero: candidate
    ]
    assert stats.s == 0
    stats.remove(window.pop(0)[1])  # Example 11: e1 leaves; c drops to zero, b is reset
    assert stats.counters() == {"c": 0, "p": 2, "b": 0}


def test_figure_5_condition_columns() -> None:
    plan = compile_sets(Q1, "q1")
    seen = {w[0]: (w, m) for w, m in windows(filtering=True, partitioning=True, conditions=True)}
    assert seen[1] == ([1, 2, 3, 9, 11], (True, True, True))  # Figure 5, row ⟨e1, e2, e3, e9, e11⟩
    assert seen[2] == ([2, 3, 9, 11], (True, False, False))  # last row: (4) T, (5) F, (6)+(7) F; e14 is 18 days on
    assert plan.m == 3


def test_example_12_partitioning() -> None:
    plan = compile_sets(Q1, "q1")
    assert plan.eq_attrs == ("PID",)  # X from the closure of c.PID = p.PID, p.PID = b.PID
    w1_filtered = [e for e in CHEMO[:12] if event_bits(plan, e)]
    parts: dict = {}
    for e in w1_filtered:
        parts.setdefault(key_of(e, plan.eq_attrs), []).append(e.seq + 1)
    assert parts[(1,)] == [1, 2, 3, 9, 11]
    # The paper lists ⟨e5, e7, e8, e10, e12⟩ for patient 2; e4 (B, patient 2, 6 Jul) is in W'1 too.
    assert parts[(2,)] == [4, 5, 7, 8, 10, 12]


def test_example_13_bit_vectors() -> None:
    plan = compile_sets(Q1, "q1")
    assert [format(event_bits(plan, e), "03b") for e in CHEMO[:3]] == ["100", "001", "010"]
    assert [format(m, "03b") for m in plan.prev_mask] == ["000", "110"]  # b̄1, b̄2
    stats = SummaryStatistics(plan)
    assert format(stats.s, "03b") == "111"
    for e in CHEMO[:3]:
        stats.add(event_bits(plan, e))
    assert format(stats.s, "03b") == "001"


def test_match_window_counts() -> None:
    eng = Engine(strategy="match-window")
    eng.register(Q1, name="q1")
    for ev in CHEMO:
        eng.process(ev)
    eng.flush()
    stats = eng.set_queries[0].stats()
    assert stats == {"windows seen": 13, "candidate windows": 3, "matcher calls": 3, "events filtered": 1}
