"""Workers that read an XML file themselves (yfpp/workers/xml_reading.py).

The scan is checked against the one reader (every line of a scanned block that it makes an event of has the
scanned ts and routing text), and whole runs against one engine reading the same bytes: the same matches, the
same dead letters (malformed lines, late events, each once with its seq and line) and the same count of
events, on generated patterns over files whose heads and lines take many shapes (an XML declaration, a
namespaced root, attributes in any order, keys written as floats, comments, entities, child elements,
elements across lines, events on one line, duplicate attributes, tabs and look-alike attributes in values,
broken lines, times going back), read in blocks of a few lines.
"""

from __future__ import annotations

import json
import queue
import random
import re
from collections import Counter
from io import BytesIO

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.cli import test_workers_reading as reading_test
from tests.cli.test_workers import Lines
from tests.cli.test_workers_reading import small_blocks  # noqa: F401 (a fixture)
from tests.generators import events_within_reach, patterns, streams
from yfpp.input.dead_letters import DeadLetters
from yfpp.input.readers import read_event_batches, reading_options
from yfpp.input.xml_reader import xml_batches
from yfpp.language.query_text import parse_query
from yfpp.workers.pool import Sequencer, Workers
from yfpp.workers.xml_reading import Scanner, XmlShare, reads_xml_itself

HEADS = ['<stream>\n', '<?xml version="1.0" encoding="UTF-8"?>\n<stream xmlns="urn:s">\n',
         '<?xml version="1.0"?>\n<!DOCTYPE stream>\n  <feed xmlns:p="urn:p" id="1">\n']


def text_of(value) -> str | None:
    """An attribute's text (None: no attribute)."""
    return None if value is None else json.dumps(value) if isinstance(value, list) else str(value)


def line_of(tag: str, attrs: dict, style: int) -> str:
    """One event written in one of several shapes (all but the last few are what a sensor writes)."""
    pairs = [(k, t) for k, v in attrs.items() if (t := text_of(v)) is not None]
    if style == 1:  # attributes in reverse order, tabs between them
        return "\t<%s\t%s/>" % (tag, "\t".join(f'{k}="{t}"' for k, t in reversed(pairs)))
    if style == 2:  # the key as a float
        pairs = [(k, f"{t}.0" if k == "k" and t.isdigit() else t) for k, t in pairs]
    plain = "  <%s %s/>" % (tag, " ".join(f'{k}="{t}"' for k, t in pairs))
    if style == 3:
        return plain + "<!-- a comment -->"
    if style == 4:  # an entity in a value
        return plain.replace("/>", ' s="a&amp;b"/>')
    if style == 5:  # a reading as a child element
        return plain.replace("/>", "><r>1</r></%s>" % tag)
    if style == 6:  # an element across two lines
        return plain.replace(" ", "\n    ", 3).replace("\n    ", " ", 2)
    if style == 7:  # a duplicate attribute: malformed, though of the plain shape
        return plain.replace("/>", ' x="9"/>') if "x=" in plain else plain
    if style == 8:  # an integer the plain reader does not take
        return plain.replace("/>", ' big="123456789012345678901234"/>')
    if style == 9:
        return "  <broken ts="
    if style == 10:
        return ""
    if style == 11:  # no ts: a dead letter
        return "  <%s %s/>" % (tag, " ".join(f'{k}="{t}"' for k, t in pairs if k != "ts"))
    if style == 12:  # a tab in the key's value (a space to XML)
        return plain.replace('k="', 'k="\t')
    if style == 13:  # a value holding what looks like an attribute (another before the key, or none)
        return plain.replace("<%s " % tag, '<%s n=" k=" ' % tag)
    if style == 14:  # three events on one line (longer than a block of the tests)
        return plain * 3
    return plain


@st.composite
def feeds(draw, max_events: int = 40) -> str:
    """An XML document of a generated stream, each line in a drawn shape (mostly plain), some swapped out of order,
    after a first plain line."""
    events = draw(streams(max_events=max_events))
    styles = draw(st.lists(st.sampled_from([0] * 8 + [1, 1, 2, *range(3, 15)]), min_size=len(events),
                           max_size=len(events)))
    head = draw(st.sampled_from(HEADS))
    root = "feed" if "<feed" in head else "stream"
    lines = [line_of(ev.type, {"ts": ev.ts, **ev.attrs}, style) for ev, style in zip(events, styles)]
    for i in draw(st.lists(st.integers(0, max(len(lines) - 2, 0)), max_size=3)):
        if len(lines) > 1:
            lines[i], lines[i + 1] = lines[i + 1], lines[i]
    first = '  <A ts="0" k="0" x="0"/>\n'  # (a plain line near the head: a file the workers read themselves)
    return head + first + "".join(line + "\n" for line in lines) + f"</{root}>\n"


@settings(max_examples=200, deadline=None)
@given(feeds(max_events=30))
def test_the_scan_agrees_with_the_reader(text):
    """Where a block is scanned, each line the one reader makes an event of has the scanned ts and key text."""
    body = text.encode()
    start = body.find(b"\n", body.find(b"<stream") if b"<stream" in body else body.find(b"<feed")) + 1
    lines = body[start:body.rfind(b"</")]
    if not lines:
        return
    opts = reading_options()
    scan = Scanner(opts, ["k", "x"], 1 << 30)(lines)
    if scan.ts is None:
        return
    head = body[:start]
    events = [ev for batch in xml_batches(BytesIO(head + lines + body[len(head) + len(lines):]), True, opts,
                                          DeadLetters()) for ev in batch]
    ks, xs = scan.owners
    for ev in events:
        assert scan.ts[ev.seq] == ev.ts
        assert ks[ev.seq] == hash(ev.attrs["k"]) % (1 << 30)
        assert xs[ev.seq] == hash(ev.attrs["x"]) % (1 << 30)


def letters(items: Counter) -> Counter:
    """Dead letters, the prefix lxml makes up for a namespace in a letter's raw text written ``nsN``: it numbers
    them within the block the element was parsed in (``ns0``, ``ns1``…), so the number depends on where the reader's
    blocks are cut — in one reader too, reading the same file in blocks of another size."""
    return Counter({(seq, at, why, raw if raw is None else re.sub(r"\bns[0-9]+(?=[:=])", "nsN", raw)): count
                    for (seq, at, why, raw), count in items.items()})


def one_engine(queries: list, path: str) -> tuple[Counter, Counter, int]:
    """One engine's matches, dead letters and count of events over the XML file ``path``."""
    matches, dead, count = reading_test.one_engine(queries, path, "xml")
    return matches, letters(dead), count


def with_workers(queries: list, path: str, n: int) -> tuple[Counter, Counter, int]:
    """The same from ``n`` workers reading the file themselves."""
    matches, dead, count = reading_test.with_workers(queries, path, n, None)
    return matches, letters(dead), count


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                                                 HealthCheck.function_scoped_fixture])
@given(st.lists(patterns(), min_size=1, max_size=3), st.data(), st.sampled_from([2, 3]))
def test_workers_reading_the_xml_file_are_one_engine(small_blocks, tmp_path, pats, data, n):
    """Keyed, sliced and whole groups at once over every head and line shape: one engine's matches, dead letters
    and count."""
    text = data.draw(feeds(max_events=events_within_reach(pats, 40)))
    path = tmp_path / "feed.xml"
    path.write_text(text)
    queries = [(f"q{i}", p) for i, p in enumerate(pats)]
    assert with_workers(queries, str(path), n) == one_engine(queries, str(path))


def plain_feed(path, count: int = 6000) -> None:
    """A namespaced root and ``count`` plain lines, attributes in two orders, a few late events and broken lines."""
    rng = random.Random(3)
    lines = []
    for i in range(count):
        a = {"k": rng.randrange(50), "ts": i // 3, "x": rng.randrange(4)}
        lines.append(line_of(rng.choice("abc"), a, rng.choice([0, 0, 1])))
    for i in (700, 2500, 4000):
        lines.insert(i, line_of("a", {"ts": 5, "k": 1, "x": 0}, 0))  # late
    lines.insert(1200, line_of("a", {"ts": 5, "k": 1}, 9))
    lines.insert(3000, line_of("a", {"ts": 999, "k": 1, "x": 0}, 7))  # a duplicate attribute: no event
    path.write_text('<?xml version="1.0"?>\n<stream xmlns="urn:s">\n' + "\n".join(lines) + "\n</stream>\n")


QUERIES = [("keyed", parse_query("PATTERN SEQ(a x, b y) WHERE [k] AND y.x > x.x WITHIN 20", "sase", "s")),
           ("sliced", parse_query("PATTERN SEQ(a x, c y) WHERE y.x = x.x WITHIN 4", "sase", "s"))]


def test_workers_reading_a_large_plain_xml_file(tmp_path):
    """Thousands of plain lines (nearly every block scanned), with late events and broken lines among them."""
    path = tmp_path / "feed.xml"
    plain_feed(path)
    expected = one_engine(QUERIES, str(path))
    assert expected[1].total() == 5 and sum(expected[0].values()) > 1000
    assert with_workers(QUERIES, str(path), 2) == expected


def test_a_plain_file_is_scanned_but_for_its_head_and_end(tmp_path):
    """Read by one worker alone (no relay): every block is scanned but the first (the head), the last (the root's
    end), the one holding a broken line and the three whose times go back (and the end of the input is read
    after the last)."""
    path = tmp_path / "feed.xml"
    plain_feed(path)
    from yfpp.spark.plan import group_queries
    from yfpp.workers.pool import WORKERS

    groups = group_queries(QUERIES, runner=WORKERS)
    share = XmlShare(str(path), reading_options(), groups, 0, 1, 20_000, DeadLetters(), Sequencer(), {})
    scanned = []
    share._scanned = lambda *args, f=share._scanned: scanned.append(1) or f(*args)
    blocks = sum(1 for _ in share.blocks())
    assert blocks - len(scanned) == 7 and share.events == 6000 + 3 + 1 - 1


def test_which_files_the_workers_read(tmp_path):
    """XML files with numeric times, events typed by their tag, in UTF-8, with a plain line near the head; not gzip,
    ISO-8601 times, a type attribute, another encoding or a head without a plain line."""
    path = tmp_path / "feed.xml"
    plain_feed(path, 10)
    groups = []
    assert reads_xml_itself(str(path), None, reading_options(), groups)
    assert not reads_xml_itself(str(path), None, reading_options(ts_unit="iso"), groups)
    assert not reads_xml_itself(str(path), None, reading_options(type_field="kind"), groups)
    assert not reads_xml_itself(str(path), "jsonl", reading_options(), groups)
    path.write_text("<stream>\n" + "<reading><ts>1</ts><v>2</v></reading>\n" * 100 + "</stream>\n")
    assert not reads_xml_itself(str(path), None, reading_options(), groups)  # (no plain line: the parent reads it)
    path.write_text('<?xml version="1.0" encoding="ISO-8859-1"?>\n<stream>\n<a ts="1"/>\n</stream>\n')
    assert not reads_xml_itself(str(path), None, reading_options(), groups)


def test_cli_workers_read_the_xml_file(capsys, tmp_path):
    """The same lines and figures from the command line with one worker and two."""
    path = tmp_path / "feed.xml"
    path.write_text("<stream>\n" + "".join(f'<{"ab"[i % 2]} ts="{i}" k="{i % 7}"/>\n' for i in range(3000))
                    + "</stream>\n")
    results = reading_test.cli_results(capsys, tmp_path, path, (["--workers", "1"], ["--workers", "2"]))
    assert len(set(map(str, results.values()))) == 1 and results[("--workers", "1")][1] == 3000


def test_a_line_over_max_record_bytes_is_the_same_dead_letter_with_workers(capsys, tmp_path):
    """A plain line longer than --max-record-bytes in a block the workers would scan: one dead letter ("too
    large") and the same events and matches as one engine, not an event."""
    path = tmp_path / "feed.xml"
    lines = [f'<{"ab"[i % 2]} ts="{i}" k="{i % 7}"/>\n' for i in range(3000)]
    lines[2000] = f'<a ts="2000" k="3" pad="{"x" * 600}"/>\n'
    path.write_text("<stream>\n" + "".join(lines) + "</stream>\n")
    results = reading_test.cli_results(capsys, tmp_path, path, (["--workers", "1", "--max-record-bytes", "300"],
                                                                ["--workers", "2", "--max-record-bytes", "300"]))
    assert len(set(map(str, results.values()))) == 1 and results[("--workers", "1", "--max-record-bytes", "300")][1] == 2999


def test_two_workers_scan_the_plain_blocks_and_read_the_others(small_blocks, tmp_path):
    """Stretches of plain lines and of child-element readings in turn, read by two workers in blocks of a few lines:
    some blocks are scanned (each by one worker, both routing its lines by the scan), the others read by each
    worker's one reader (whose place the scanned blocks move on); one engine's matches, dead letters and count."""
    from yfpp.workers import reading as workers_reading
    from yfpp.workers.xml_reading import line_blocks

    rng = random.Random(5)
    lines = []
    for i in range(400):
        style = 0 if i // 25 % 2 == 0 else 5  # (25 plain lines, then 25 with a child element, …)
        lines.append(line_of(rng.choice("abc"), {"k": rng.randrange(9), "ts": i, "x": rng.randrange(4)}, style))
    path = tmp_path / "feed.xml"
    path.write_text('<?xml version="1.0"?>\n<stream>\n' + "\n".join(lines) + "\n</stream>\n")
    scanner = Scanner(reading_options(), ["k"], 2)
    with open(path, "rb") as f:
        scanned = [scanner(body).ts is not None for body in line_blocks(f, workers_reading.BLOCK)]
    assert scanned.count(True) > 10 and scanned.count(False) > 10
    expected = one_engine(QUERIES, str(path))
    assert sum(expected[0].values()) > 50
    assert with_workers(QUERIES, str(path), 2) == expected



def test_workers_reading_an_xml_file_plan_slices_that_deal_evenly(tmp_path):
    """As for JSON lines, the slices of an XML file the workers read are planned to its last event line's ts (the
    root's end after it): 60 events of 2 workers at 20 events a slice are 4 slices of about 15, not 3 of 20."""
    path = tmp_path / "feed.xml"
    path.write_text("<stream>\n" + "".join(f'  <a ts="{i}"/>\n' for i in range(60)) + "  <broken\n</stream>\n")
    slicings: dict = {}
    share = XmlShare(str(path), reading_options(), sliced_groups(), 0, 2, 20, DeadLetters(), Sequencer(), slicings,
                     [queue.Queue(), queue.Queue()])
    next(share.blocks())  # (the file's one block: worker 0's chunk, its slices planned as it is read)
    assert slicings[0].length == pytest.approx(59 / 4) and slicings[0].own(59) == 3


def sliced_groups() -> list:
    from yfpp.spark.plan import group_queries
    from yfpp.workers.pool import WORKERS

    return group_queries(SLICED, runner=WORKERS)


SLICED = [("q", parse_query("PATTERN SEQ(a x, a y) WITHIN 2", "sase", "s"))]


def test_the_parent_reading_a_file_plans_slices_that_deal_evenly(tmp_path):
    """An XML file the workers do not read themselves (elements across lines) is read by the parent, which plans the
    slices to the file's last event line as the workers do: 600 events of 2 workers at 200 a slice are 4 slices of
    about 150, not 3 of 200; the matches are one engine's."""
    path = tmp_path / "feed.xml"
    path.write_text("<stream>\n" + "".join(f'  <a\n    ts="{i}"/>\n' for i in range(599)) + '  <a ts="599"/>\n</stream>\n')
    out = Lines()
    workers = Workers(SLICED, 2, out, DeadLetters(), slice_events=200, source=(str(path), None, reading_options()))
    try:
        assert workers.source is None  # (the parent reads it)
        for batch in read_event_batches(str(path), None, dead_letters=DeadLetters()):
            workers.process_batch(batch)
        workers.flush()
    finally:
        workers.close()
    assert workers.slicings[0].length == pytest.approx(599 / 4)
    assert Counter(json.dumps(m, sort_keys=True) for m in out) == reading_test.one_engine(SLICED, str(path), "xml")[0]
