"""The scan plan's line scan (``yfpp.spark.line_scan``): plain JSON lines shipped unparsed, read where matched.

A line the compiled scan takes as plain is one the reader's bulk path reads as an event, with the scan's
ts and matching task (hypothesis, over lines built near the edges: escapes, braces and names in strings,
non-ASCII, nulls, floats, exponents, long numbers, duplicate and missing fields, blanks, broken JSON). A job
of one keyed group over a feed of such lines, late events, blank lines, ``\\r``, a byte-order mark, in small
chunks, several byte ranges and small blocks on the matching side, gives exactly one engine's matches and
dead letters (seq numbers, positions) — the tasks run one after the other as in tests/spark/test_spark_scan.py.
"""

from __future__ import annotations

import json
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("pyspark", reason="pyspark is not installed (pip install '.[spark]')")
pytest.importorskip("numba", reason="numba is not installed (pip install '.[spark]')")

from tests.spark.test_spark_scan import one_engine, scanned  # noqa: E402
from yfpp.input.events import Event  # noqa: E402
from yfpp.input.jsonl_reader import plain_events, plain_records  # noqa: E402
from yfpp.input.readers import reading_options  # noqa: E402
from yfpp.spark import line_scan, scan  # noqa: E402
from yfpp.spark.line_scan import LineReader, LineSpec, scan_range  # noqa: E402
from yfpp.spark.plan import effective_queries, group_queries  # noqa: E402
from yfpp.spark.scan import LINES, ScanJob, key_tasks, read_task  # noqa: E402

OPTS = reading_options()
SPEC = LineSpec.of(OPTS, "k")
QUERY = [("q", "PATTERN SEQ(A a, B b) WHERE skip_till_any_match(a, b) { [k] } WITHIN 10")]

_PLAIN_VALUES = ["0", "-1", "7", "-0", "123456789012345678", "2.5", "-0.0", '"a"', '""', '"x y"', '"]"', '"k"',
                 "true", "false"]
_ODD_VALUES = ["1234567890123456789", "1e2", "1E400", "3.", "007", "-", '"{"', '"["', '"ts"', '"type"', r'"a\"b"',
               r'"\u00e9"', '"é"', '"a\tb"', "null", "[1]", '{"a": 1}', "tru", "nul"]
_PLAIN_KEYS = [str(i) for i in range(-3, 6)] + ['"u"', '"v"', '"u v"']
_ODD_KEYS = ['"é"', r'"u\n"', "2.0", "true", "null", "99999999999999999999", '"{"']
_ODD_TS = ["1.5", "1e1", '"3"', "12345678901234567", "null"]


@st.composite
def lines(draw: st.DrawFn, types: tuple[str, ...] = ("A", "B")) -> str:
    """A JSON line, plain (about half of them) or near it: fields type, ts, k and others, any of them odd,
    missing or given twice, blanks and tabs between the tokens; or a blank or broken line."""
    odd = draw(st.booleans())
    def pick(plain: list[str], others: list[str]) -> str:
        return draw(st.sampled_from(plain + (others if odd else [])))
    fields = []
    for name, plain, others in (("type", [f'"{t}"' for t in types], ['""', "1", '"ts"']),
                                ("ts", [str(i) for i in range(-5, 41)], _ODD_TS), ("k", _PLAIN_KEYS, _ODD_KEYS)):
        for _ in range(draw(st.sampled_from([1, 1, 1, 0, 2])) if odd else 1):
            fields.append((name, pick(plain, others)))
    fields += [(pick(["x", "y", "a.b"], ["ts ", "é", "{"]), pick(_PLAIN_VALUES, _ODD_VALUES))
               for _ in range(draw(st.integers(0, 2)))]
    fields = draw(st.permutations(fields))
    gap = draw(st.sampled_from(["", " ", "\t"]))
    line = "{" + gap + ("," + gap).join(f'"{n}"{gap}:{gap}{v}' for n, v in fields) + gap + "}"
    return draw(st.sampled_from([line] * 8 + (["", "  ", '{"type": "A", "ts": ', "[1]", " " + line] if odd else [])))


@st.composite
def plain_feeds(draw: st.DrawFn) -> list[str]:
    """Mostly plain lines in ts order (so that chunks of several plain lines go unparsed), a few others among them."""
    ts = sorted(draw(st.lists(st.integers(0, 40), min_size=5, max_size=30)))
    feed = [json.dumps({"type": draw(st.sampled_from("AB")), "ts": t, "k": draw(st.sampled_from([0, -1, "u"])),
                        "x": draw(st.sampled_from([1, 2.5, "s", True]))}) for t in ts]
    for _ in range(draw(st.integers(0, 3))):
        feed.insert(draw(st.integers(0, len(feed))), draw(lines()))
    return feed


@settings(max_examples=1000, deadline=None)
@given(line=lines(), n=st.integers(1, 7))
def test_a_plain_line_is_the_reader_s_event_with_the_scan_s_ts_and_task(line, n):
    data = line.encode("utf-8", "surrogatepass") + b"\n"
    got = scan_range(data, SPEC, n)
    if got is None:
        assert data.startswith(b"\xef\xbb\xbf") or b"\r" in data
        return
    if not got.plain[0]:
        return
    records = plain_records(data, OPTS)
    assert records is not None
    events = plain_events(records, [0], OPTS)
    assert events is not None and type(events[0]) is Event
    assert events[0].ts == got.ts[0] and key_tasks(events, ("k",), n) == [got.tasks[0]]


def test_the_feed_s_lines_are_plain_and_shipped_unparsed(tmp_path):
    """Plain lines in ts order travel as LINES blobs only: no event is parsed on the read side."""
    path = tmp_path / "feed.jsonl"
    path.write_text("".join(json.dumps({"type": "AB"[i % 2], "ts": i, "k": i % 3, "s": "z"}) + "\n" for i in range(50)))
    job = ScanJob.plan(group_queries(effective_queries(QUERY)), [f"file://{path}"], True, 3,
                       {"format": None, "ts_field": "ts", "ts_unit": "s", "type_field": None}, hot_keys=False)
    kinds = {row[3] for rows in read_task(job, range(len(job.ranges))) for row in rows}
    assert job.lines == SPEC and LINES in kinds and scan.EVENTS not in kinds


def test_a_range_the_scan_leaves_to_the_reader():
    assert scan_range(b'\xef\xbb\xbf{"type": "A", "ts": 1, "k": 1}\n', SPEC, 2) is None
    assert scan_range(b'{"type": "A", "ts": 1, "k": 1}\r\n', SPEC, 2) is None
    with mock.patch.object(line_scan, "MAX_LINE_BYTES", 20):
        assert scan_range(b'{"type": "A", "ts": 1, "k": 1}\n', SPEC, 2) is None
    assert LineSpec.of(OPTS, "ts") is None and LineSpec.of(reading_options(ts_unit="iso"), "k") is None
    assert LineSpec.of(OPTS, 'a"b') is None and LineSpec.of(reading_options(ts_field="type"), "k") is None


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(feed=st.one_of(plain_feeds(), st.lists(st.one_of(lines(), lines(), st.sampled_from(['{"type": "A", "ts": 2, "k": 1}\r'])),
                                              max_size=30)),
       n=st.integers(1, 3), pieces=st.sampled_from([1, 3, 7]), chunk=st.sampled_from([1, 2, 5, 30]),
       block=st.sampled_from([1, 60, 1 << 14]), run=st.sampled_from([1, 100, 1 << 16]),
       bom=st.booleans(), last_newline=st.booleans())
def test_keyed_jobs_over_scanned_lines_equal_one_engine(tmp_path_factory, feed, n, pieces, chunk, block, run, bom,
                                                        last_newline):
    text = ("\ufeff" if bom else "") + "\n".join(feed) + ("\n" if last_newline else "")
    path = tmp_path_factory.mktemp("lines") / "feed.jsonl"
    path.write_bytes(text.encode("utf-8", "surrogatepass"))
    want, letters = one_engine(QUERY, path)
    with mock.patch.object(scan, "chunk_events", lambda n: chunk), mock.patch.object(line_scan, "MAX_LINE_BYTES", 80), \
            mock.patch.object(line_scan, "READ_BLOCK", block), \
            mock.patch.object(scan, "RUN_BYTES_PER_TASK", run):  # plain chunks grouped up to this a task
        got, dead, _ = scanned(QUERY, [path], n, 100, pieces, hot_keys=False)
    assert got == want
    assert dead == sorted(letters, key=lambda d: d["seq"])


@pytest.mark.parametrize(("n", "pieces", "chunk", "block", "run"), [(1, 1, 30, 1, 1), (3, 3, 7, 60, 1 << 16),
                                                                   (2, 7, 100, 1 << 14, 1), (3, 1, 1000, 100, 1),
                                                                   (2, 1, 10, 60, 700), (3, 2, 5, 1 << 14, 1 << 16)])
def test_a_long_plain_feed_with_odd_late_and_broken_lines_equals_one_engine(tmp_path, n, pieces, chunk, block, run):
    """Chunks of many plain lines, read in blocks of one line to a few, around an odd line (nested), a late
    one, a broken one and a blank one: the same matches (their events' seq numbers) and dead letters."""
    feed = [json.dumps({"type": "AB"[i % 2], "ts": i // 2, "k": [0, "u", -1][i % 3], "x": i}) for i in range(300)]
    feed[50] = json.dumps({"type": "B", "ts": 25, "k": 0, "n": {"y": 1}})
    feed[120] = json.dumps({"type": "A", "ts": 3, "k": "u"})
    feed[200] = '{"type": "A", "ts": '
    feed[250] = ""
    path = tmp_path / "feed.jsonl"
    path.write_text("".join(ln + "\n" for ln in feed))
    want, letters = one_engine(QUERY, path)
    with mock.patch.object(scan, "chunk_events", lambda n: chunk), mock.patch.object(line_scan, "READ_BLOCK", block), \
            mock.patch.object(scan, "RUN_BYTES_PER_TASK", run):
        got, dead, _ = scanned(QUERY, [path], n, 100, pieces, hot_keys=False)
    assert got == want and len(want) > 100
    assert dead == letters and [d["seq"] for d in dead] == [120, 200]


def test_seq_numbers_past_two_to_the_31_events():
    """A blob's record indexes are int32 within their range; the seq numbers they give (a range's first seq
    plus each index) go on past 2**31 events, as a billion-event job's do."""
    lines = b'{"type": "A", "ts": 1, "k": 1}\n{"type": "B", "ts": 2, "k": 1}\n'
    (_, blob), = line_scan.group_lines(lines, scan_range(lines, SPEC, 1), 0, 2, 0, 1)
    for base in (2**31 - 1, 3_000_000_000):
        reader = LineReader(OPTS)
        reader.add(blob, base)
        events, = reader.blocks(final=True)
        assert [ev.seq for ev in events] == [base, base + 1]


def test_small_blobs_of_several_ranges_are_read_in_the_reader_s_blocks(tmp_path):
    """A matching task that gets many small blobs (many byte ranges, many tasks) reads their lines a READ_BLOCK at
    a time across blobs and ranges — one reader call a block, not one a blob — with each line's seq and the matches
    and dead letters of one engine."""
    feed = [json.dumps({"type": "AB"[i % 2], "ts": i // 2, "k": i % 5, "x": i}) for i in range(400)]
    path = tmp_path / "feed.jsonl"
    path.write_text("".join(ln + "\n" for ln in feed))
    want, letters = one_engine(QUERY, path)
    calls = []
    real = line_scan.plain_events
    with mock.patch.object(line_scan, "plain_events", lambda *args: calls.append(1) or real(*args)), \
            mock.patch.object(line_scan, "READ_BLOCK", 2000):
        got, dead, stats = scanned(QUERY, [path], 2, 100, 20, hot_keys=False)
    assert got == want and dead == letters == [] and len(stats) == 2
    job = ScanJob.plan(group_queries(effective_queries(QUERY)), [f"file://{path}"], True, 2,
                       {"format": None, "ts_field": "ts", "ts_unit": "s", "type_field": None}, pieces=20,
                       hot_keys=False, min_range_bytes=1)
    blobs = [row for rows in read_task(job, range(len(job.ranges))) for row in rows if row[3] == LINES]
    size = path.stat().st_size
    assert len(blobs) >= 30 and len(calls) <= size // 2000 + 2  # each task's blocks 2,000 bytes or more, but its last


def test_a_blob_s_head_holds_its_lines_count_and_smallest_ts():
    lines = b'{"type": "A", "ts": 1, "k": 1}\n{"type": "B", "ts": 2, "k": 2}\n{"type": "B", "ts": 3, "k": 3}\n'
    scanned_lines = scan_range(lines, SPEC, 2)
    blobs = dict(line_scan.group_lines(lines, scanned_lines, 0, 3, 5, 2))
    tasks = scanned_lines.tasks.tolist()
    for t, blob in blobs.items():
        mine = [i for i in range(3) if tasks[i] == t]
        assert line_scan.blob_low(blob) == mine[0] + 1
        reader = LineReader(OPTS)
        reader.add(blob, 100)
        events, = reader.blocks(final=True)
        assert [ev.seq for ev in events] == [100 + 5 + i for i in mine]
        assert [ev.ts for ev in events] == [i + 1 for i in mine]


def test_plain_chunks_in_a_row_are_grouped_together_up_to_the_bytes_given():
    """``plain_run`` goes on over the plain chunks after a plain one while they continue its ts order and fit the
    bytes given; a line that is not plain, or one back in time, ends it at its chunk's start."""
    rows = [{"type": "AB"[i % 2], "ts": i, "k": i % 3} for i in range(40)]
    rows[25] = {"type": "A", "ts": 25, "k": 1, "n": {"y": 1}}  # nested: not plain
    data = "".join(json.dumps(r) + "\n" for r in rows).encode()
    got = scan_range(data, SPEC, 3)
    size, two = int(got.ends[9]), int(got.ends[19])  # the first chunk's bytes, the first two chunks'
    assert line_scan.plain_run(got, 0, 10, 10, 10 * size) == 20  # lines 20–29 hold the nested one
    assert line_scan.plain_run(got, 0, 10, 10, two - 1) == 10 and line_scan.plain_run(got, 0, 10, 10, two) == 20
    assert line_scan.plain_run(got, 26, 30, 10, 10 * size) == 40
    rows[25], rows[15] = rows[24] | {"ts": 25}, {"type": "A", "ts": 3, "k": 1}  # plain again; line 15 back in time
    later = scan_range("".join(json.dumps(r) + "\n" for r in rows).encode(), SPEC, 3)
    assert line_scan.plain_run(later, 0, 10, 10, 10 * size) == 10 and line_scan.plain_run(later, 20, 30, 10, 10**6) == 40


def test_a_range_of_plain_lines_goes_to_each_task_in_one_blob_when_the_bytes_allow():
    path_rows = "".join(json.dumps({"type": "AB"[i % 2], "ts": i, "k": i % 3, "s": "z"}) + "\n" for i in range(300))
    for run, blobs in ((1 << 16, 3), (1, 3 * 30)):  # all 300 lines at once, or each chunk of 10 alone
        job = ScanJob.plan(group_queries(effective_queries(QUERY)), ["file:///dev/null"], True, 3,
                           {"format": None, "ts_field": "ts", "ts_unit": "s", "type_field": None}, hot_keys=False)
        data = path_rows.encode()
        with mock.patch.object(scan, "chunk_events", lambda n: 10), mock.patch.object(scan, "RUN_BYTES_PER_TASK", run):
            rows = [row for rs in scan._line_chunks(job, 0, data, scan_range(data, SPEC, 3), scan._Collect(),
                                                    scan._Seen()) for row in rs]
        assert len(rows) == blobs and {row[3] for row in rows} == {LINES}
