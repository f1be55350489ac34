"""Query text that is hostile or wrong: positioned errors, caps, query-file errors, hints."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.language.test_query_fuzz import watchdog
from yfpp.cli import main
from yfpp.engine import Engine
from yfpp.input.events import Event
from yfpp.errors import PatternError, QueryError, QuerySyntaxError, YfppError
from yfpp.language.query_limits import MAX_COMPONENTS, MAX_NESTING, MAX_QUERY_CHARS
from yfpp.language.query_text import detect_language, load_queries, parse_written_query

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = str(ROOT / "yfpp" / "data" / "sample_rfid.xml")


def register_error(text: str) -> QueryError:
    with watchdog(20, text), pytest.raises(QueryError) as info:
        Engine().register(text)
    err = info.value
    assert err.line is not None and err.column is not None and "^" in str(err), str(err)
    return err


# --- language detection and hostile text ------------------------------------------


def test_language_detection_is_linear_in_comments():
    with watchdog(20, "comments"):
        assert detect_language("/**/ " * 40 + "x") == "xpath"
        assert detect_language("/**/ " * 100_000 + "PATTERN SEQ(a x)") == "sase"
        assert detect_language("/* a comment */ PATERN SEQ(a x)") == "sase"  # for the hint
        assert detect_language("/* " * 100_000) == "xpath"
        assert detect_language("/*//*/a") == "xpath"  # XPath: any type, any type, then a
        assert detect_language("x") == "sase"  # a word: SASE+ (and an error there)
    register_error("/**/ " * 40 + "x")


@pytest.mark.parametrize(
    "text",
    [
        "PATTERN SEQ(a x, b y) WHERE " + "NOT " * 1000 + "x.v = 1",
        "PATTERN SEQ(a x, b y) WHERE " + "(" * 1000 + "x.v = 1" + ")" * 1000,
        "PATTERN SEQ(a x, b y) WHERE x.v = " + "-" * 1000 + "1",
        "PATTERN SEQ(a x, b y) WHERE x.v = " + "1 + " * 1000 + "1",
        "PATTERN SEQ(a x, b y) WHERE x.v = " + "(" * 1000,
        "//a[" + "(" * 1000 + "@v = 1" + ")" * 1000 + "]//b",
        "//a[" + "not(" * 1000 + "@v = 1" + ")" * 1000 + "]//b",
        "//a[@v = " + "1 + " * 1000 + "1]//b",
        "//a[@v = " + "-" * 1000 + "1]//b",
        "//a[" + " and ".join(["@v = 1"] * 1000) + "]//b",
        "//a" + "[" * 1000,
    ],
    ids=["sase-not", "sase-parens", "sase-minus", "sase-chain", "sase-open", "xpath-parens", "xpath-not",
         "xpath-chain", "xpath-minus", "xpath-and", "xpath-brackets"],
)  # fmt: skip
def test_deep_nesting_is_a_positioned_syntax_error(text):
    err = register_error(text)
    assert isinstance(err, QuerySyntaxError)


def test_nesting_up_to_the_cap_is_fine():
    depth = MAX_NESTING - 10
    Engine().register("PATTERN SEQ(a x, b y) WHERE " + "(" * depth + "x.v = 1" + ")" * depth)
    Engine().register("//a[" + "(" * depth + "@v = 1" + ")" * depth + "]//b")
    assert "nested too deeply" in str(register_error("PATTERN SEQ(a x) WHERE " + "NOT " * (MAX_NESTING + 1) + "x.v = 1"))


@pytest.mark.parametrize(
    ("text", "column"),
    [
        ("PATTERN SEQ(a x, b y) WHERE x.v = 1" + "0" * 5000, 35),
        ("PATTERN SEQ(a x, b y) WHERE x.v = 1e999", 35),
        ("PATTERN SEQ(a x, b y) WHERE x.v > 1" + "0" * 400 + "%", 35),
        ("PATTERN SEQ(a x, b y) WITHIN 1" + "0" * 400, 30),
        ("PATTERN SEQ(a x, b y) WITHIN 1" + "0" * 306 + " days", 30),
        ("//a//b(1" + "0" * 5000 + ")", 8),
        ("//a//b(1" + "0" * 306 + " days)", 8),
    ],
)
def test_huge_numbers_are_positioned_syntax_errors(text, column):
    err = register_error(text)
    assert isinstance(err, QuerySyntaxError) and (err.line, err.column) == (1, column)
    assert "too large" in err.message


def test_huge_number_in_xpath_predicate_is_a_positioned_error():
    register_error("//a[@v = 1" + "0" * 5000 + "]//b")


@pytest.mark.parametrize(
    ("text", "where", "words"),
    [
        ("PATTERN SEQ(~A a, B b)", (1, 16), "leading negation"),
        ("PATTERN SEQ(A a,\n  B b, ~C c)", (2, 11), "needs a window"),
        ("PATTERN SEQ(A a, B a)", (1, 20), "declared twice"),
        ("PATTERN SEQ(A a, ~B b) WITHIN 5 OUTPUT non_overlapping", (1, 21), "non_overlapping"),
        ("PATTERN SEQ(A a, ~B b, C c) WHERE b.x = 1 RETURN r(v = b.x)", (1, 21), "negated variable"),
        ("PATTERN SEQ(A a, ~B b, ~C c, D d) WHERE b.x = c.x", (1, 27), "one negated variable"),
        ("PATTERN SEQ(A a, B b) WHERE x.v = 1", (1, 29), "unknown variable"),
        ("//!a//b", (1, 1), "leading negation"),
        ("//a\n//b//!c", (2, 4), "needs a window"),
        ("PATTERN SEQ(A+ a[], B b) WHERE a[i].x > a[i-1].x + a.len", (1, 16), "mixes"),
        ("PATTERN SEQ({C c, ~P p}, B b) WITHIN 5", (1, 22), "cannot be inside an event set"),
        ("PATTERN SEQ({A a,\n {B b}}, C c) WITHIN 5", (2, 5), "event sets do not nest"),
        ("PATTERN SEQ(A a, B b) WHERE 1", (1, 29), "a number, not a condition"),
        ("PATTERN SEQ(A a, B b) WHERE a.x = 1 AND NOT\n 'yes'", (2, 2), "a string, not a condition"),
        ("PATTERN SEQ(A a, B b) WHERE a.x = 1 OR (a.x + 1)", (1, 41), "arithmetic, not a condition"),
        ("PATTERN SEQ(A+ a[], B b) WHERE strict_contiguity(a, b) { a.len }", (1, 58), "a length, not a condition"),
        ("PATTERN SEQ(A+ a[], B b) WHERE sum(a[..].x)", (1, 32), "an aggregate, not a condition"),
    ],
)
def test_every_pattern_error_has_line_column_and_caret(text, where, words):
    err = register_error(text)
    assert isinstance(err, PatternError)
    assert (err.line, err.column) == where and words in err.message, str(err)


def test_boolean_attributes_and_literals_are_conditions():
    eng = Engine(reports=None)
    eng.register("PATTERN SEQ(a x, b y) WHERE x.flag", name="flag")
    eng.register("PATTERN SEQ(a x, b y) WHERE NOT (x.flag) AND true", name="not_flag")
    got = eng.process_all([Event("a", 1, {"flag": True}), Event("b", 2), Event("a", 3, {"flag": 1}), Event("b", 4)])
    assert sorted((m["query"], m["bindings"]["x"][0]) for m in got) == [("flag", 0), ("not_flag", 2)]


def test_consecutive_negations_are_accepted():
    Engine().register("PATTERN SEQ(A a, ~B b, ~C c, D d)")
    Engine().register("PATTERN SEQ(A a, ~B b, ~C c) WITHIN 5")
    Engine().register("//a//!b//!c//d")


def test_text_size_cap():
    err = register_error("//a//b" + " " * MAX_QUERY_CHARS)
    assert f"the limit is {MAX_QUERY_CHARS:,}" in err.message


def test_component_cap():
    err = register_error("PATTERN SEQ(" + ", ".join(f"A a{i}" for i in range(MAX_COMPONENTS + 1)) + ")")
    assert f"at most {MAX_COMPONENTS:,} components" in err.message
    assert err.var == f"a{MAX_COMPONENTS}"


# --- the command line: query files, names, hints ----------------------------------------


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_inline_query_longer_than_a_file_name(capsys):
    text = "PATTERN SEQ(shelf a, exit c) WHERE [tag_id] " + "AND a.ts >= 0 " * 20 + "WITHIN 12 hours"
    assert len(text) > 256
    code, out, err = run(capsys, "run", "-q", text, "-i", SAMPLE)
    assert code == 0, err
    assert {json.loads(line)["query"] for line in out.splitlines()} == {"q"}


def test_broken_block_reports_file_and_absolute_line(tmp_path, capsys):
    path = tmp_path / "rules.sase"
    path.write_text(
        "# two rules\n\n@query good\nPATTERN SEQ(shelf a, exit c)\n\n@query bad\n# the broken one\n"
        "PATTERN SEQ(shelf a,\n    exit c)\n  WHER [tag_id]\n"
    )
    code, out, err = run(capsys, "run", "-q", str(path), "-i", SAMPLE)
    assert code == 2 and out == ""
    first = err.splitlines()[0]
    assert first == f"yfpp: error: query 'bad' in {path}, line 10, column 3: unexpected 'WHER' (did you mean WHERE?)"
    assert err.splitlines()[1:3] == ["    WHER [tag_id]", "    ^"]


def test_pattern_error_in_a_bare_file_has_its_absolute_line(tmp_path, capsys):
    path = tmp_path / "lost.sase"
    path.write_text("# a comment\n\n  PATTERN SEQ(shelf a,\n    ~register b)\n")
    code, _, err = run(capsys, "run", "-q", str(path), "-i", SAMPLE)
    assert code == 2
    assert err.startswith(f"yfpp: error: query 'lost' in {path}, line 4, column 15: trailing negation ~b needs a window")


def test_a_written_query_has_comments_and_positions_in_its_text():
    """What yfpp serve takes: a query as its file holds it (no '@query' line), errors placed in that text."""
    text = "# unsold\n\n  PATTERN SEQ(shelf a,\n    ~register b)\n"
    with pytest.raises(PatternError) as e:
        parse_written_query(text)
    assert str(e.value).startswith("line 4, column 15: trailing negation ~b needs a window")
    assert str(e.value).endswith("\n      ~register b)\n                ^")
    assert parse_written_query(text.replace("b)", "b) WITHIN 5")).window == 5
    assert parse_written_query("# paths\n//a//b\n", "xpath") == parse_written_query("//a//b")
    for text in ("@query a\n//a\n", "# x\n@query a\n//a\n@query b\n//b\n"):
        with pytest.raises(YfppError, match="without '@query NAME' lines"):
            parse_written_query(text)


def test_xpath_file_error_has_its_absolute_line(tmp_path, capsys):
    path = tmp_path / "paths.xpe"
    path.write_text("@query one\n//a//b\n\n@query two\n# comment\n//a\n  //b[@x = ]\n")
    code, _, err = run(capsys, "run", "-q", str(path), "-i", SAMPLE)
    assert code == 2 and err.startswith(f"yfpp: error: query 'two' in {path}, line 7, column ")


def test_duplicate_names_in_one_file(tmp_path, capsys):
    path = tmp_path / "dup.sase"
    path.write_text("@query a\nPATTERN SEQ(shelf a, exit c)\n\n@query a\nPATTERN SEQ(shelf a, exit c)\n")
    code, _, err = run(capsys, "run", "-q", str(path), "-i", SAMPLE)
    assert code == 2
    assert err == f"yfpp: error: {path}, line 4: query name 'a' is used twice (first at line 1)\n"


def test_duplicate_names_across_query_arguments(tmp_path, capsys):
    one, two = tmp_path / "one", tmp_path / "two"
    for d in (one, two):
        d.mkdir()
        (d / "theft.sase").write_text("PATTERN SEQ(shelf a, exit c)\n")
    code, _, err = run(capsys, "run", "-q", str(one / "theft.sase"), "-q", str(two / "theft.sase"), "-i", SAMPLE)
    assert code == 2
    assert err.startswith("yfpp: error: query name 'theft' is used twice (") and "@query NAME" in err
    assert str(one / "theft.sase") in err and str(two / "theft.sase") in err


def test_inline_queries_get_distinct_names():
    names = [q.name for q in load_queries(["//a//b", "PATTERN SEQ(a x)", "//c"])]
    assert names == ["q", "q2", "q3"]


def test_the_bundled_query_files_run_together(capsys):
    code, _, err = run(capsys, "explain", "-q", *sorted(str(p) for p in (ROOT / "queries").glob("*.*")))
    assert code == 0, err


@pytest.mark.parametrize(
    ("query", "hint", "column"),
    [
        ("PATERN SEQ(shelf a, exit c)", "unexpected 'PATERN' (did you mean PATTERN?)", 1),
        ("pattren SEQ(shelf a, exit c)", "unexpected 'pattren' (did you mean PATTERN?)", 1),
        ("PATTERN SEQ(shelf a, exit c) WHER [tag_id]", "unexpected 'WHER' (did you mean WHERE?)", 30),
        ("PATTERN SEQ(shelf a, exit c) WHERE [tag_id] WITHN 1 hour", "unexpected 'WITHN' (did you mean WITHIN?)", 45),
        ("PATTERN SEQ(shelf a, exit c) WHERE a.x = 1 AMD c.x = 2", "unexpected 'AMD' (did you mean AND?)", 44),
        ("PATTERN SEQQ(shelf a, exit c)", "(did you mean SEQ?)", 13),
        ("PATTERN SEQ(shelf a, exit c) WHERE skip_till_nxt_match(a, c)", "(did you mean skip_till_next_match?)", 57),
    ],
)
def test_misspelt_keywords_get_a_sase_hint(capsys, query, hint, column):
    code, _, err = run(capsys, "run", "-q", query, "-i", SAMPLE)
    assert code == 2
    assert err.startswith(f"yfpp: error: query 'q', line 1, column {column}: ") and hint in err.splitlines()[0], err
    assert "'//'" not in err  # not an XPath error


def test_query_errors_through_the_console_script_have_no_traceback(tmp_path):
    path = tmp_path / "bad.sase"
    path.write_text("@query x\nPATTERN SEQ(a x, b y) WHERE " + "NOT " * 1000 + "x.v = 1\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for query in (str(path), "PATERN SEQ(a x)", "//a[" + "(" * 1000 + "]"):
        proc = subprocess.run(
            [sys.executable, "-m", "yfpp.cli", "run", "-q", query, "-i", SAMPLE],
            capture_output=True, text=True, env=env, timeout=120,
        )  # fmt: skip
        assert proc.returncode == 2 and proc.stderr.startswith("yfpp: error: "), proc.stderr
        assert "Traceback" not in proc.stderr


def test_empty_queries_and_unreadable_query_files(tmp_path, capsys):
    (tmp_path / "blank.sase").write_text("# nothing but a comment\n\n")
    (tmp_path / "latin1.sase").write_bytes(b"PATTERN SEQ(caf\xe9 a)")
    for query, message in [
        ("", "query 'q', line 1, column 1: empty query"),
        (str(tmp_path / "blank.sase"), f"query 'blank' in {tmp_path / 'blank.sase'}, line 1, column 1: empty query"),
        (str(tmp_path / "latin1.sase"), f"query file {tmp_path / 'latin1.sase'} is not UTF-8 text (byte 15)"),
        (str(tmp_path), f"cannot read query file {tmp_path}: Is a directory"),
        (str(tmp_path / "missing.xpe"), f"query file not found: {tmp_path / 'missing.xpe'}"),
    ]:
        code, _, err = run(capsys, "run", "-q", query, "-i", SAMPLE)
        assert code == 2 and err.splitlines()[0] == f"yfpp: error: {message}", err
