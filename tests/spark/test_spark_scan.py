"""The scan plan (``yfpp.spark.scan``): read tasks parse byte ranges, matching tasks match their share.

Without Spark: the read tasks and matching tasks of a job simulated one after
the other (``read_task``, ``match_task``, the shuffle between them a dict),
over several byte ranges of one file or of several files, give together
exactly one engine's matches and dead letters over the same stream, on
generated patterns and streams. With Spark (the two-worker cluster
of tests/conftest.py): a sliced group with several slices per task, and the
dead letters of a directory, the same under both plans and as ``yfpp run``.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("pyspark", reason="pyspark is not installed (pip install '.[spark]')")

from tests.generators import patterns, streams, within_reach  # noqa: E402
from yfpp.cli import main  # noqa: E402
from yfpp.input.dead_letters import DeadLetters  # noqa: E402
from yfpp.engine import Engine  # noqa: E402
from yfpp.errors import InputError  # noqa: E402
from yfpp.input.generate import generate_rfid, write_events  # noqa: E402
from yfpp.input.readers import read_events  # noqa: E402
from yfpp.spark.inputs import choose_plan, local_files, local_path  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
from yfpp.spark.plan import effective_queries, group_queries  # noqa: E402
from yfpp.spark.ranges import Summary, range_bytes, unpack_summaries  # noqa: E402
from yfpp.spark.scan import ScanJob, match_task, read_task, scan_match, ship_order  # noqa: E402

READING = {"format": None, "ts_field": "ts", "ts_unit": "s"}


def test_auto_scans_local_paths_and_shuffles_other_file_systems():
    assert choose_plan("auto", "/data/feeds") == "scan"
    assert choose_plan("auto", "file:///data/feeds/*.jsonl") == "scan"
    assert choose_plan("auto", "/data/feeds", "hdfs://nn:8020") == "shuffle"  # a plain path on HDFS
    assert choose_plan("auto", "hdfs://nn:8020/feeds") == "shuffle"
    assert choose_plan("auto", "s3a://bucket/feeds") == "shuffle"
    assert choose_plan("shuffle", "/data/feeds") == "shuffle"
    with pytest.raises(InputError, match="--plan shuffle"):
        choose_plan("scan", "s3a://bucket/feeds")
    assert local_path("file:///tmp/a%20b/c=1/f%2520g.jsonl") == "/tmp/a b/c=1/f%20g.jsonl"  # as Spark lists it
    assert local_path("hdfs://nn/x") is None


def test_partitions_below_one_are_one_error_line(capsys):
    assert main(["spark", "-q", "[tag_id]&&//shelf//exit&&(60)", "-i", "feeds", "-o", "out", "--partitions", "0"]) == 2
    assert capsys.readouterr().err == "yfpp: error: --partitions must be from 1 to 10,000\n"


@pytest.mark.parametrize(("flags", "message"), [
    (["--ts-unit", "fortnight"], "unknown --ts-unit 'fortnight'; expected one of s, ms"),
    (["--ts-format", "iso", "--type-field", "ts"], "the timestamp and the event type cannot both be field 'ts'"),
    (["--stream", "--max-files", "0"], "--max-files must be above 0, got 0"),
    (["--stream", "--trigger", "-1"], "--trigger must be above 0, got -1.0"),
    (["--partitions", "100001"], "--partitions must be from 1 to 10,000"),
    (["-o", "EXISTING_FILE"], "-o names a file"),
])
def test_arguments_refused_before_any_jvm_starts(tmp_path, capsys, flags, message):
    (tmp_path / "a file").write_text("x")
    flags = [str(tmp_path / "a file") if f == "EXISTING_FILE" else f for f in flags]
    args = ["spark", "-q", "[tag_id]&&//shelf//exit&&(60)", "-i", "feeds", "-o", str(tmp_path / "out"), *flags]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("yfpp: error: ") and message in err and err.count("\n") == 1, err


def test_a_refused_query_is_named_with_its_file_and_line(tmp_path, capsys):
    queries = tmp_path / "q.sase"
    queries.write_text("@query fine\nPATTERN SEQ(a x, b y)\n\n@query trailing\nPATTERN SEQ(a x, ~c z) WITHIN 5\n")
    assert main(["spark", "-q", str(queries), "-i", "example:sample_rfid.xml", "-o", str(tmp_path / "out"),
                 "--policy", "non_overlapping"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"yfpp: error: query 'trailing' in {queries}, line 5, column ") and "non_overlapping" in err, err


def test_a_jvm_that_cannot_start_is_one_error_line(tmp_path):
    env = {**os.environ, "JAVA_HOME": str(tmp_path / "no-java"), "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "yfpp", "spark", "-q", "example:shoplifting.sase", "-i",
                           "example:sample_rfid.xml", "-o", str(tmp_path / "out")], env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 2 and done.stderr.startswith("yfpp: error: cannot start Spark: ") and "JAVA_HOME" in done.stderr
    assert "Traceback" not in done.stderr


def test_local_listing_is_spark_s(tmp_path):
    """The scan plan lists local inputs itself (no JVM work), as Spark's file index does."""
    for name in ("day=1/a.jsonl", "day=1/_SUCCESS", "day=2/sub/b.xml.gz", ".hidden/c.jsonl", "_tmp/d.jsonl",
                 "_x=1/e.jsonl", "f.jsonl._COPYING_", "g.crc.jsonl"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("")
    want = [str(tmp_path / n) for n in ("_x=1/e.jsonl", "day=1/a.jsonl", "day=2/sub/b.xml.gz", "g.crc.jsonl")]
    assert local_files(str(tmp_path)) == want
    assert local_files(f"file://{tmp_path}/day=*") == want[1:3]
    assert local_files(f"{tmp_path}/day={{1,2}}") is None  # braces: Spark's glob
    with pytest.raises(InputError, match="no such input"):
        local_files(str(tmp_path / "nope*"))
    (tmp_path / "only" / ".x").mkdir(parents=True)
    (tmp_path / "only" / "_SUCCESS").write_text("")
    (tmp_path / "only" / ".x" / "y.jsonl").write_text("")
    with pytest.raises(InputError, match="no input files"):
        local_files(str(tmp_path / "only"))  # only hidden folders and names


def one_engine(named: list, path: Path) -> tuple[Counter, list[dict]]:
    """``yfpp run``'s matches and dead letters over ``path``."""
    buf = io.StringIO()
    dead = DeadLetters(buf)
    eng = Engine(dead_letters=dead)
    for name, q in named:
        eng.register(q, name=name)
    got = Counter(json.dumps(m) for m in eng.process_all(read_events(path, dead_letters=dead)))
    return got, [json.loads(x) for x in buf.getvalue().splitlines()]


def scanned(named: list, files: list[Path], n: int, slice_events: int,
            pieces: int = 1, hot_keys: bool = True, least: int = 1) -> tuple[Counter, list[dict], list[dict]]:
    """The matches, dead letters and stats rows of a job of ``n`` matching tasks over about ``pieces``
    byte ranges (each but a file's last at least ``least`` bytes: by default however small), its tasks run one
    after the other (each byte range read by a read task of its own)."""
    job = ScanJob.plan(group_queries(effective_queries(named)), [f"file://{f}" for f in files], len(files) == 1, n,
                       READING, slice_events, pieces, hot_keys, min_range_bytes=least)
    shipped: dict[int, list[tuple]] = {task: [] for task in range(n)}
    for r in range(len(job.ranges)):
        for rows in read_task(job, [r]):
            for row in rows:
                shipped[row[0]].append(row)
    got: Counter = Counter()
    dead, stats = [], []
    for task in range(n):
        for row in match_task(job, task, sorted(shipped[task][::-1], key=ship_order)):  # as Spark sorts them
            if row[0] is not None:
                got[row[5]] += 1
            elif row[6] is not None:
                dead.append(dict(zip(("seq", "position", "reason", "raw"), row[6:])))
            else:
                stats.append(json.loads(row[5]))
    return got, sorted(dead, key=lambda d: d["seq"]), stats


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(pats=st.lists(patterns(), min_size=1, max_size=3), events=streams(max_events=30),
       late=st.one_of(st.none(), st.integers(0, 29)), bad=st.one_of(st.none(), st.integers(0, 29)),
       n=st.integers(2, 3), slice_events=st.sampled_from([1, 2, 4, 100]), pieces=st.sampled_from([1, 3, 7]),
       files=st.sampled_from([1, 2]), least=st.sampled_from([1, 40, 300, 1 << 20]))
def test_scan_tasks_together_equal_one_engine(tmp_path_factory, pats, events, late, bad, n, slice_events, pieces,
                                               files, least):
    """Any byte ranges (``pieces`` of them, each but a file's last at least ``least`` bytes) give one engine's
    matches, dead letters and counts."""
    events = within_reach(pats, events)
    lines = [json.dumps({"type": e.type, "ts": e.ts, **e.attrs}) for e in events]
    if late is not None and late < len(lines) and events[late].ts > 0:  # an event back in time
        lines.insert(late + 1, json.dumps({"type": "A", "ts": events[late].ts - 1, "x": 1, "k": 0}))
    if bad is not None and bad <= len(lines):
        lines.insert(bad, '{"type": "B", "ts": ')
    folder = tmp_path_factory.mktemp("scan")
    path = folder / "feed.jsonl"
    path.write_text("".join(ln + "\n" for ln in lines))
    named = [(f"q{i}", p) for i, p in enumerate(pats)]
    want, letters = one_engine(named, path)
    parts = [path]
    if files == 2:  # the same stream in two files: positions name the file, lines count in it
        cut = len(lines) // 2
        parts = [folder / "a.jsonl", folder / "b.jsonl"]
        parts[0].write_text("".join(ln + "\n" for ln in lines[:cut]))
        parts[1].write_text("".join(ln + "\n" for ln in lines[cut:]))
        for d in letters:
            if d["position"].startswith("line "):
                line = int(d["position"].split()[1])
                d["position"] = f"a.jsonl line {line}" if line <= cut else f"b.jsonl line {line - cut}"
    got, dead, stats = scanned(named, parts, n, slice_events, pieces, least=least)
    assert got == want
    assert dead == sorted(letters, key=lambda d: d["seq"])
    assert [s["task"] for s in stats] == list(range(n)) and sum(s["dead"] for s in stats) == len(letters)
    assert stats[0]["records"] == len(lines) and stats[0]["read"]["bytes"] == sum(p.stat().st_size for p in parts)


def test_an_event_before_a_sliced_group_s_first_slice_is_a_dead_letter(tmp_path):
    """A late event that no slice reads (ts before the first), first in its byte range (so its read task
    cannot know it is late): it goes to task 0, which reports it (it was lost once)."""
    lines = [json.dumps({"type": "A", "ts": 5, "x": i}) for i in range(6)] + [json.dumps({"type": "A", "ts": 0, "x": 9})]
    lines += [json.dumps({"type": "A", "ts": 6, "x": i}) for i in range(5)]
    path = tmp_path / "feed.jsonl"
    path.write_text("".join(ln + "\n" for ln in lines))
    named = [("q", "PATTERN SEQ(A a, A b) WITHIN 2")]
    want, letters = one_engine(named, path)
    assert [d["seq"] for d in letters] == [6]
    assert range_bytes(str(path), path.stat().st_size // 2, path.stat().st_size).startswith(lines[6].encode())
    got, dead, _ = scanned(named, [path], 2, 1, 2)  # two byte ranges, the second starting at the late line
    assert got == want and dead == letters


def test_byte_ranges_hold_the_lines_that_start_in_them(tmp_path):
    path = tmp_path / "f.jsonl"
    data = b"aa\nbbbb\n\nc\nddddd"  # no line break at the end
    path.write_bytes(data)
    for step in range(1, len(data) + 1):
        pieces = [range_bytes(str(path), a, min(a + step, len(data))) for a in range(0, len(data), step)]
        assert b"".join(pieces) == data, step
        at = 0
        for p in pieces:  # each piece whole lines: it starts at 0 or after a line break
            assert not p or at == 0 or data[at - 1:at] == b"\n", (step, p)
            at += len(p)


UNKEYED = {
    "unkeyed": "//register//exit&&(60)",
    "strict_keyed": "PATTERN SEQ(shelf a, exit c) WHERE strict_contiguity(a, c) {[tag_id]} WITHIN 10 min",
    "quiet": "PATTERN SEQ(register a, ~exit b) WITHIN 100",
    "shop": "PATTERN SEQ(shelf a, ~register b, exit c) WHERE [tag_id] WITHIN 1 hour",
}


def test_a_sliced_group_with_several_slices_per_task(spark, tmp_path):
    path = tmp_path / "feed.xml"
    write_events(generate_rfid(3000, tags=8, gap=12, seed=11), path)
    named = list(UNKEYED.items())
    want, _ = one_engine(named, path)
    rows = scan_match(spark, named, [f"file://{path}"], single=True, tasks=2, slice_events=200).collect()
    assert Counter(r.json for r in rows if r.query is not None) == want and sum(want.values()) > 100
    stats = [json.loads(r.json) for r in rows if r.query is None and r.reason is None]
    assert sorted(s["task"] for s in stats) == [0, 1]
    assert all(s["engines"] > 4 for s in stats)  # the keyed group's engine and several slices each
    assert [r for r in rows if r.reason is not None] == []


@pytest.mark.parametrize("plan", ["scan", "shuffle"])
def test_dead_letters_of_a_directory_as_yfpp_run(spark, tmp_path, capsys, plan):
    feeds = tmp_path / "feeds"
    (feeds / "b").mkdir(parents=True)
    # epoch-seconds ts: the late event's reason prints them as yfpp run does (Spark's own format says 1.79533804E9)
    recs = [json.dumps({**r, "ts": r["ts"] + 1_795_338_040}) for r in generate_rfid(900, tags=6, seed=9)]
    parts = {"a.jsonl": recs[:300],
             "b/c.jsonl": recs[300:600] + ["not json", '{"type": "exit", "ts": 1795338043, "tag_id": 1}'],
             "b/d.jsonl": recs[600:] + ['{"type": "shelf"}']}
    for name, part in parts.items():
        (feeds / name).write_text("\n".join(part) + "\n")
    whole = tmp_path / "whole.jsonl"
    whole.write_text("".join((feeds / name).read_text() for name in parts))
    named = list(UNKEYED.items())
    want, letters = one_engine(named, whole)
    letters[0]["position"], letters[2]["position"] = "b/c.jsonl line 301", "b/d.jsonl line 301"  # positions in their files
    files = []
    for ext in ("sase", "xpe"):
        files.append(tmp_path / f"q.{ext}")
        files[-1].write_text("".join(f"@query {n}\n{q}\n" for n, q in named if q.startswith("P") == (ext == "sase")))
    out = tmp_path / "out"
    assert main(["spark", "-q", *map(str, files), "-i", str(feeds), "-o", str(out), "--plan", plan]) == 0
    err = capsys.readouterr().err
    assert Counter(r[0] for r in spark.read.text(str(out / "matches.jsonl")).collect()) == want
    got = sorted((json.loads(r[0]) for r in spark.read.text(str(out / "dead_letters.jsonl")).collect()), key=lambda d: d["seq"])
    assert got == letters and [d["seq"] for d in got] == [600, 601, 902]
    assert "events            900\n" in err and "dead letters      3\n" in err


def test_range_summaries_come_back_as_they_went():
    """A range's summary travels as one fixed-size record; a task reads all ranges' in one go (no ts yet: None)."""
    sent = [Summary(7, 9, 12.5, 300, 0.25), Summary(0, 2, None, 10, 0.0), Summary(2**40, 0, -1e300, 2**33, 1.5)]
    back = unpack_summaries([s.packed() for s in sent])
    assert back == sent and [type(s.max_ts) for s in back] == [float, type(None), float]


def test_packed_columns_come_back_as_they_went():
    """Blobs are orjson's JSON, or a pickle for what orjson cannot write exactly."""
    from yfpp.spark.scan import _dumps, _loads

    for attrs in ({"a": 1, "b": -0.0, "c": 2.5e300, "d": [1, {"e": None}], "f": True}, {"big": 2 ** 70},
                  {"s": "\udc80"}):
        cols = ([0], ["t"], [1.5], [attrs], None)
        back = _loads(_dumps(cols))
        assert tuple(back) == cols and [type(v) for v in back[3][0].values()] == [type(v) for v in attrs.values()]
