"""Fuzzing query text: random mutations of valid queries in both languages raise only
documented errors (a QueryError with line, column and caret), never hang.

Seeds are the queries in queries/ and generated ones; mutations insert, delete and
replace characters and tokens.  Each example runs under a watchdog, so a hang fails
the test instead of stalling the suite.
"""

from __future__ import annotations

import re
import signal
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from yfpp.engine import Engine
from yfpp.errors import QueryError, YfppError
from yfpp.language.query_text import read_query_file

QUERIES = Path(__file__).resolve().parents[2] / "queries"
FILE_QUERIES = [
    q.text for ext in ("sase", "xpe") for path in sorted(QUERIES.glob(f"*.{ext}")) for q in read_query_file(path.read_text(), path.stem)
]

TOKEN = re.compile(r"\s+|[A-Za-z_][\w.\-]*|\d+(?:\.\d+)?|'[^']*'|\"[^\"]*\"|//|&&|<=|>=|!=|<>|.", re.S)
WORDS = [
    "PATTERN", "SEQ", "WHERE", "WITHIN", "RETURN", "OUTPUT", "AND", "OR", "NOT", "ANY", "all", "non_overlapping",
    "skip_till_next_match", "skip_till_any_match", "strict_contiguity", "partition_contiguity", "avg", "count",
    "len", "i", "i-1", "..", "hours", "ms", "true", "1e999", "9" * 400, "80%", "'s'", '"t"', "[", "]", "(", ")",
    "{", "}", ",", "~", "+", "-", "*", "/", "//", "!", "@x", "=", "<", "&&", "not(", "/*", "*/", "\n", "\t", "\x00",
    "é", "\u2028",
]  # fmt: skip
CHARS = "()[]{}<>~+-*/%!@&|=.,;:'\"#\\ \n\t\r\x00\x7fé€_aZ09"
EVENTS = [
    {"type": "A", "ts": 0, "x": 1, "k": 1},
    {"type": "B", "ts": 1, "x": "s", "k": 1},
    {"type": "C", "ts": 2, "x": 2.5, "k": 1},
    {"type": "A", "ts": 3, "k": 2},
]


@st.composite
def generated_sase(draw) -> str:
    n = draw(st.integers(1, 4))
    types = st.sampled_from(["A", "B", "C", "ANY"])
    comps = []
    for i in range(n):
        kind = draw(st.sampled_from(["single", "kleene", "negated"])) if i else "single"
        t = draw(types)
        comps.append({"single": f"{t} v{i}", "kleene": f"{t}+ v{i}[]", "negated": f"~{t} v{i}"}[kind])
    preds = draw(st.lists(st.sampled_from([
        "[k]", "v0.x > 1", "v1.x = v0.x", "v0.x + 1 < 3 * 2", "NOT v0.x = 'a'", "v1[i].x > v1[i-1].x",
        "avg(v1[..i-1].x) < v1[i].x", "v1.len >= 2", "v0.x % 2 = 0 OR v0.x > 50%",
    ]), max_size=3))  # fmt: skip
    strategy = draw(st.sampled_from(["", "skip_till_any_match(v0) ", "strict_contiguity(v0) "]))
    text = "PATTERN SEQ(" + ", ".join(comps) + ")"
    if preds or strategy:
        text += f" WHERE {strategy}{{ {' AND '.join(preds)} }}"
    text += draw(st.sampled_from(["", " WITHIN 10", " WITHIN 2 hours", " WITHIN 5 OUTPUT non_overlapping"]))
    return text + draw(st.sampled_from(["", " RETURN alert(at = v0.ts)"]))


@st.composite
def generated_xpath(draw) -> str:
    steps = []
    for i in range(draw(st.integers(1, 4))):
        name = draw(st.sampled_from(["a", "b", "*", "shelf-sensor"]))
        bang = "!" if i and draw(st.booleans()) else ""
        pred = draw(st.sampled_from(["", "[@x > 1]", "[@x = 'k' and not(@y)]", "[2]", "[@x + 1 = 3]"]))
        plus = "+" if not bang and draw(st.booleans()) else ""
        steps.append(draw(st.sampled_from(["/", "//"])) + bang + name + pred + plus)
    key = draw(st.sampled_from(["", "[k]", "<k, j>&&"]))
    return key + "".join(steps) + draw(st.sampled_from(["", "(5)", "&&(2 hours)", "(1.5 min)"]))


@st.composite
def mutated(draw) -> str:
    text = draw(st.one_of(st.sampled_from(FILE_QUERIES), generated_sase(), generated_xpath()))
    for _ in range(draw(st.integers(1, 4))):
        tokens = TOKEN.findall(text) or [""]
        op = draw(st.sampled_from(["char+", "char-", "char=", "tok+", "tok-", "tok=", "tok2"]))
        if op.startswith("char"):
            i = draw(st.integers(0, len(text)))
            c = draw(st.sampled_from(CHARS))
            text = {"char+": text[:i] + c + text[i:], "char-": text[:i] + text[i + 1 :], "char=": text[:i] + c + text[i + 1 :]}[op]
            continue
        i = draw(st.integers(0, len(tokens) - 1))
        w = draw(st.sampled_from(WORDS + tokens))
        if op == "tok+":
            tokens.insert(i, w)
        elif op == "tok-":
            del tokens[i]
        elif op == "tok=":
            tokens[i] = w
        else:  # a token repeated: nesting, long chains
            tokens[i] = tokens[i] * draw(st.sampled_from([2, 3, 150]))
        text = "".join(tokens)
    return text


@contextmanager
def watchdog(seconds: int, text: str) -> Iterator[None]:
    """Fail (instead of hanging) when the block runs longer than ``seconds`` of wall time."""

    def hang(signum, frame):
        raise AssertionError(f"no answer within {seconds} s for query {text!r}")

    old = signal.signal(signal.SIGALRM, hang)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def check_query(text: str) -> None:
    """Register ``text`` and run a few events: success, or a positioned QueryError."""
    with watchdog(20, text):
        try:
            engine = Engine()
            engine.register(text, name="q")
        except QueryError as err:
            assert err.line is not None and err.column is not None, (text, str(err))
            assert "^" in str(err), (text, str(err))
            return
        for ev in EVENTS:
            engine.process(dict(ev))
        engine.flush()


def test_seed_queries_are_valid():
    for text in FILE_QUERIES:
        Engine().register(text)


@settings(max_examples=600, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(mutated())
def test_mutated_queries_raise_only_positioned_query_errors(text):
    check_query(text)


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(st.one_of(generated_sase(), generated_xpath()))
def test_generated_queries_raise_only_positioned_query_errors(text):
    check_query(text)


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(mutated(), st.integers(0, 3))
def test_errors_in_query_files_point_at_the_file_line(text, pad):
    """The line an error names in a query file is the file's line that it shows."""
    file_text = "# header\n" * pad + "@query one\nPATTERN SEQ(a x)\n\n@query two\n" + text + "\n"
    try:
        sources = read_query_file(file_text, "f", origin="f.sase")
    except YfppError:
        return  # the mutation wrote a bad '@query' line: a file-level error
    lines = file_text.split("\n")
    for q in sources:
        try:
            with watchdog(20, q.text):
                q.parse()
        except QueryError as err:
            assert err.line is not None and str(err).startswith(f"query {q.name!r} in f.sase, line {err.line}, ")
            if not lines[err.line - 1].lstrip().startswith("#"):  # comment lines are blanked in the query
                assert err.source_line.rstrip() == lines[err.line - 1].rstrip(), (file_text, str(err))
