"""Extended XPath (YFilter++) → pattern IR."""

from __future__ import annotations

from pathlib import Path

import pytest

from xpath_ext.parser import parse_xpath
from yfpp.errors import PatternError, QuerySyntaxError
from yfpp.language.pattern import Component, Contiguity, Kind, Pattern, XPathTest
from yfpp.language.query_text import split_query_file

ANY = Contiguity.SKIP_TILL_ANY
STRICT = Contiguity.STRICT
PARTITION = Contiguity.PARTITION
QUERIES = Path(__file__).resolve().parents[2] / "queries"


def single(var: str, event_type: str | None, contiguity: Contiguity) -> Component:
    return Component(var, event_type, Kind.SINGLE, contiguity)


def test_shoplifting() -> None:
    p = parse_xpath("[tag_id]&&//shelf//!register//exit&&(12 hours)")
    assert p == Pattern(
        (single("e1", "shelf", ANY), Component("n1", "register", Kind.NEGATED, ANY), single("e2", "exit", ANY)),
        partition_by=("tag_id",),
        window=12 * 3600.0,
    )
    assert p.source == "[tag_id]&&//shelf//!register//exit&&(12 hours)"


def test_slash_is_partition_with_an_equivalence_list_and_window_glued() -> None:
    expected = Pattern((single("e1", "a", PARTITION), single("e2", "b", PARTITION)), partition_by=("id",), window=50.0)
    assert parse_xpath("[id]/a/b(50)") == expected
    assert parse_xpath("[id] && /a/b && (50)") == expected
    assert parse_xpath("<id> /a /b (50)") == expected


def test_slash_is_strict_without_an_equivalence_list() -> None:
    assert parse_xpath("/a//b/c") == Pattern((single("e1", "a", STRICT), single("e2", "b", ANY), single("e3", "c", STRICT)))


def test_negation_takes_the_next_steps_axis() -> None:
    p = parse_xpath("//a//!b/c")
    assert p.components == (single("e1", "a", ANY), Component("n1", "b", Kind.NEGATED, ANY), single("e2", "c", STRICT))


def test_kleene_any_type_and_predicates() -> None:
    p = parse_xpath("<a, b>//x[@v > 1]/y+[@w = 'k'][@z]//*")
    assert p.components == (
        single("e1", "x", ANY),
        Component("e2", "y", Kind.KLEENE, PARTITION, inner_contiguity=PARTITION),
        single("e3", None, ANY),
    )
    assert p.where == (XPathTest("e1", "@v > 1"), XPathTest("e2", "@w = 'k'"), XPathTest("e2", "@z"))
    assert p.partition_by == ("a", "b")
    assert parse_xpath("//b[@x>1]+").components == parse_xpath("//b+[@x>1]").components


def test_negated_step_predicates_and_names() -> None:
    p = parse_xpath("//a//!b[@x='1']//c//!d//e")
    assert [c.var for c in p.components] == ["e1", "n1", "e2", "n2", "e3"]
    assert p.where == (XPathTest("n1", "@x='1'"),)


def test_consecutive_negations_are_consecutive_components() -> None:
    p = parse_xpath("//a//!b//!c[@x]//d")
    assert p.components == (
        single("e1", "a", ANY),
        Component("n1", "b", Kind.NEGATED, ANY),
        Component("n2", "c", Kind.NEGATED, ANY),
        single("e2", "d", ANY),
    )
    assert p.where == (XPathTest("n2", "@x"),)


def test_predicate_text_is_kept_raw() -> None:
    p = parse_xpath("//a[@x = ']' and b[c['[']]]")
    assert p.where == (XPathTest("e1", "@x = ']' and b[c['[']]"),)


@pytest.mark.parametrize(
    ("window", "seconds"),
    [("(100)", 100.0), ("(1 hour)", 3600.0), ("(250 ms)", 0.25), ("(2 d)", 172800.0), ("(1.5 min)", 90.0), ("(3 SEC)", 3.0)],
)
def test_windows(window: str, seconds: float) -> None:
    assert parse_xpath(f"//a//b{window}").window == seconds


def test_trailing_axis_adds_nothing() -> None:
    assert parse_xpath("//shelf-sensor//") == parse_xpath("//shelf-sensor")


# --- the paper's queries ---------------------------------------------------

PAPER = [
    # Table 1, rows A–G
    "//shelf-sensor//",
    "//shelf-sensor//exit-sensor",
    "//shelf-sensor/exit-sensor",
    "//shelf-sensor//exit-sensor",
    "//shelf-sensor/!counter-sensor//exit-sensor",
    "[prodID]&&//shelf-sensor/!counter-sensor//exit-sensor",
    "[prodID]&&//shelf-sensor/!counter-sensor//exit-sensor&&(1 hour)",
    # §4.2 Fig. 2, §8.1
    "/Shelf//Counter//Exit",
    "[productID]&&/shelf//counter//exit&&(100)",
    # Table 2 (3, 4, 7 as intended: see queries/sharing.xpe)
    "[id]/a/b",
    "[id]/a/c",
    "[id]/a/!b/c",
    "[id]/a//!b/c",
    "[id]/a/*/c",
    "[id]/a//c",
    "[id]/a/*/*/c",
    "[id]/a/b/c",
    # §8.3, §8.4
    "[id]/shelf/counter/exit(50)",
    "[id]/a(50)",
    "[id]/a/b/c/d/e(50)",
    # §8.5 (base query and four negations)
    "[id]&&/a//b//c//d//e//f//g&&(50)",
    "[id]&&/a//!b//!c//!d//e//!f//g&&(50)",
    # §8.6 with a concrete window for "(window)"
    "<id>&&/shelf//counter//exit&&(100)",
    "<id>&&/shelf//!counter//exit&&(100)",
    # §6.2
    "//count/shelf",
    "//count[@total>50]",
]


@pytest.mark.parametrize("query", PAPER)
def test_paper_queries_parse(query: str) -> None:
    assert parse_xpath(query).components


@pytest.mark.parametrize("garbled", ["[id]/a!/b/c", "[id]/a/!/b/c", "[id]/a*/*/c"])
def test_garbled_table2_texts_are_rejected(garbled: str) -> None:
    with pytest.raises(QuerySyntaxError):
        parse_xpath(garbled)


def query_files() -> list[tuple[str, str]]:
    return [(f"{path.name}:{name}", text) for path in sorted(QUERIES.glob("*.xpe")) for name, text in split_query_file(path.read_text(), path.stem)]


@pytest.mark.parametrize(("name", "text"), query_files())
def test_query_files_parse(name: str, text: str) -> None:
    assert parse_xpath(text).components, name


def test_shoplifting_file() -> None:
    [(name, text)] = split_query_file((QUERIES / "shoplifting.xpe").read_text(), "shoplifting")
    assert text == "[tag_id]&&//shelf//!register//exit&&(12 hours)"


def test_table2_q3_q4_negations_are_vacuous() -> None:
    """Under docs/semantics.md §9 the step after the negation is reached by `/`: adjacent."""
    for query in ("[id]/a/!b/c", "[id]/a//!b/c"):
        assert parse_xpath(query).positives == parse_xpath("[id]/a/c").positives


# --- errors ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("query", "line", "column", "expected"),
    [
        ("", 1, 1, {"'/'", "'//'", "'['", "'<'"}),
        ("[id]", 1, 5, {"'/'", "'//'", "'&&'"}),
        ("//a//b&&", 1, 9, {"'('"}),
        ("[id,]//a", 1, 5, {"a name"}),
        ("//a b", 1, 5, {"'&&'", "'('", "'+'", "'/'", "'//'", "'[' predicate ']'", "end of query"}),
        ("//a\n//b(5 weeks)", 2, 7, {"'h'", "'s'", "')'"}),
    ],
)
def test_syntax_errors(query: str, line: int, column: int, expected: set[str]) -> None:
    with pytest.raises(QuerySyntaxError) as info:
        parse_xpath(query)
    err = info.value
    assert (err.line, err.column) == (line, column)
    assert expected <= set(err.expected)


@pytest.mark.parametrize(
    ("query", "line", "column", "message"),
    [
        ("//a[@x=1", 1, 4, "unbalanced"),
        ("//a+[@x]+", 1, 9, "one '+'"),
        ("//a[@x]+[@y]", 1, 8, "after the last predicate"),
        ("//a//!b+//c", 1, 8, "negated"),
        ("//a\n//b[@x and\n (@y ?)]", 3, 6, "invalid XPath predicate"),
    ],
)
def test_located_errors(query: str, line: int, column: int, message: str) -> None:
    with pytest.raises(QuerySyntaxError) as info:
        parse_xpath(query)
    assert (info.value.line, info.value.column) == (line, column)
    assert message in str(info.value)


@pytest.mark.parametrize("query", ["//!a//b", "//a//!b"])
def test_leading_and_unwindowed_trailing_negations_are_rejected(query: str) -> None:
    with pytest.raises(PatternError):
        parse_xpath(query)


def test_trailing_negation_with_a_window() -> None:
    assert not parse_xpath("//a//!b&&(5)").components[-1].positive
