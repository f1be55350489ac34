"""`yfpp spark` inputs through Spark's file system layer, on the two-worker cluster of tests/conftest.py.

The driver runs in a folder of its own (``monkeypatch.chdir``); the executors
run in their work folders, so relative paths only work if the driver resolves
them. Expected matches and dead letters come from the local engine over the
same records in path order.
"""

from __future__ import annotations

import gzip
import io
import json
from collections import Counter
from pathlib import Path

import pytest

pytest.importorskip("pyspark", reason="pyspark is not installed (pip install '.[spark]')")

from yfpp.cli import main  # noqa: E402
from yfpp.input.dead_letters import DeadLetters  # noqa: E402
from yfpp.engine import Engine  # noqa: E402
from yfpp.input.generate import generate_rfid, write_events  # noqa: E402
from yfpp.input.readers import read_events  # noqa: E402
from yfpp.spark import read_events_df  # noqa: E402
from yfpp.spark.cli import load  # noqa: E402

QUERY_TEXT = """@query shop
PATTERN SEQ(shelf a, ~register b, exit c) WHERE [tag_id] WITHIN 1 hour
@query unkeyed
//register//exit&&(60)
"""


@pytest.fixture(scope="module")
def queries(tmp_path_factory) -> str:
    """A query file: a keyed query and an unkeyed (time-sliced) one."""
    f = tmp_path_factory.mktemp("queries") / "two.queries"
    f.write_text(QUERY_TEXT)
    return str(f)


def test_the_driver_reads_a_window_without_a_unit_in_the_ts_unit(queries):
    """``yfpp spark --ts-unit ms``: the unkeyed query's ``(60)`` is 60 ms, the keyed one's ``1 hour`` an hour."""
    assert dict((name, p.window) for name, p in load([queries], ts_unit="ms")) == {"shop": 3600, "unkeyed": 0.06}


def expected(queries: str, files: list[Path]) -> tuple[Counter, list[dict]]:
    """``yfpp run``'s matches and dead letters over ``files`` read one after the other (seq running on)."""
    buf = io.StringIO()
    eng = Engine(dead_letters=DeadLetters(buf))
    for name, pattern in load([queries]):
        eng.register(pattern, name=name)
    out: Counter = Counter()
    base = 0
    for f in files:
        n = 0
        for ev in read_events(f, dead_letters=DeadLetters()):
            n = ev.seq + 1
            ev.seq += base
            out.update(json.dumps(m) for m in eng.process(ev))
        base += max(n, sum(1 for ln in f.read_text().splitlines() if ln.strip()) if f.suffix == ".jsonl" else n)
    out.update(json.dumps(m) for m in eng.flush())
    return out, [json.loads(x) for x in buf.getvalue().splitlines()]


def run_cli(capsys, queries: str, *args: str) -> tuple[int, str]:
    code = main(["spark", "-q", queries, *args])
    return code, capsys.readouterr().err


def output(spark, out: Path) -> Counter:
    return Counter(r[0] for r in spark.read.text(str(out / "matches.jsonl")).collect())


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> Path:
    """``feeds/`` with Hive-style day folders (JSON lines, gzip XML), a nested folder, ``_SUCCESS`` and a hidden file;
    path order (the order Spark reads them in) is time order."""
    root = tmp_path_factory.mktemp("tree")
    records = list(generate_rfid(1500, tags=6, gap=10, seed=5))
    feeds = root / "feeds"
    (feeds / "day=1").mkdir(parents=True)
    (feeds / "day=2" / "sub").mkdir(parents=True)
    write_events(records[:500], feeds / "day=1" / "part-0.jsonl")
    xml = io.BytesIO()
    write_events(records[500:1000], root / "tmp.xml")
    xml.write((root / "tmp.xml").read_bytes())
    (feeds / "day=2" / "part-1.xml.gz").write_bytes(gzip.compress(xml.getvalue()))
    write_events(records[1000:], feeds / "day=2" / "sub" / "part-2.jsonl")
    (feeds / "_SUCCESS").write_text("")
    (feeds / ".part-0.jsonl.crc").write_text("garbage")
    return root


@pytest.mark.parametrize("plan", ["scan", "shuffle"])
def test_relative_nested_input_from_the_drivers_folder(spark, queries, tree, monkeypatch, capsys, plan):
    monkeypatch.chdir(tree)
    files = [tree / "feeds/day=1/part-0.jsonl", tree / "feeds/day=2/part-1.xml.gz", tree / "feeds/day=2/sub/part-2.jsonl"]
    want, _ = expected(queries, files)
    code, err = run_cli(capsys, queries, "-i", "feeds", "-o", f"out-{plan}", "--stats", "--plan", plan)
    assert code == 0, err
    assert output(spark, tree / f"out-{plan}") == want and sum(want.values()) > 50
    # shuffle: spark.sql.shuffle.partitions; scan: one task per core
    tasks = 4 if plan == "shuffle" else spark.sparkContext.defaultParallelism
    assert sum(ln.startswith("  task ") for ln in err.splitlines()) == tasks
    assert f"plan              {plan} ({tasks} matching tasks)" in err
    code, err = run_cli(capsys, queries, "-i", "feeds/day=*/sub", "-o", f"glob-{plan}", "--plan", plan)  # a glob
    assert code == 0, err
    assert output(spark, tree / f"glob-{plan}") == expected(queries, files[2:])[0]
    # a file:// URI (as_uri() would escape "=")
    code, err = run_cli(capsys, queries, "-i", f"file://{tree}/feeds/day=1", "-o", f"uri-{plan}", "--plan", plan)
    assert code == 0, err
    assert output(spark, tree / f"uri-{plan}") == expected(queries, files[:1])[0]


@pytest.mark.parametrize("plan", ["scan", "shuffle"])
def test_paths_with_spaces_percent_and_glob_characters(spark, queries, tmp_path, monkeypatch, capsys, plan):
    """Spark lists such paths percent-encoded (``a%20b``); both plans read them back (the shuffle plan used to
    fail with PATH_NOT_FOUND) in the order of the names on disk: 'a b' before 'a!' (encoded, 'a%20b' came after
    'a!', whose events were then late and lost). Small and split JSON-lines files, an XML file."""
    records = list(generate_rfid(800, tags=5, gap=10, seed=9))
    feeds = tmp_path / "my feeds 100%" / "day [1]"
    feeds.mkdir(parents=True)
    files = [feeds / "a b.jsonl", feeds / "a!.jsonl", feeds / "c%20d.xml", feeds / "e{f}.jsonl"]
    for f, part in zip(files, (records[:200], records[200:400], records[400:600], records[600:])):
        write_events(part, f)
    monkeypatch.chdir(tmp_path)
    code, err = run_cli(capsys, queries, "-i", "my feeds 100%", "-o", f"out {plan}", "--plan", plan,
                        "--conf", "spark.sql.files.maxPartitionBytes=8k")  # the first file split by line
    assert code == 0, err
    want = expected(queries, files)[0]
    assert output(spark, tmp_path / f"out {plan}") == want and sum(want.values()) > 10


def test_output_modes(spark, queries, tree, monkeypatch, capsys):
    monkeypatch.chdir(tree)
    args = ("-i", "feeds/day=1", "-o", "modes")
    assert run_cli(capsys, queries, *args)[0] == 0
    once = output(spark, tree / "modes")
    code, err = run_cli(capsys, queries, *args)
    assert code == 2 and err.startswith("yfpp: error: ") and err.count("\n") == 1 and "--mode" in err
    assert run_cli(capsys, queries, *args, "--mode", "append")[0] == 0
    assert output(spark, tree / "modes") == once + once
    assert run_cli(capsys, queries, *args, "--mode", "overwrite", "--partition-by", "query", "--conf", "spark.sql.files.maxPartitionBytes=1m")[0] == 0
    assert output(spark, tree / "modes") == once
    parquet = spark.read.parquet(str(tree / "modes" / "matches.parquet"))
    assert {r.query for r in parquet.select("query").distinct().collect()} == {"shop", "unkeyed"}
    assert any(p.name.startswith("query=") for p in (tree / "modes" / "matches.parquet").iterdir())


def _read_in_small_splits(spark, path):
    """``read_events_df`` of ``path`` with 16 KiB splits, and the number of splits Spark made."""
    spark.conf.set("spark.sql.files.maxPartitionBytes", "16k")
    try:
        return read_events_df(spark, path), spark.read.text(str(path)).rdd.getNumPartitions()
    finally:
        spark.conf.unset("spark.sql.files.maxPartitionBytes")


def test_jsonl_files_split_by_line_keep_seq_and_positions(spark, tmp_path):
    recs = [json.dumps(r) for r in generate_rfid(3000, tags=6, seed=3)]
    recs[1700:1700] = ["", "not json", '{"type": "exit", "ts": 2, "tag_id": 1}']  # blank, malformed, late
    feed = tmp_path / "feed.jsonl"
    feed.write_text("\n".join(recs) + "\n")
    events, n_parts = _read_in_small_splits(spark, feed)
    assert n_parts > 5
    buf = io.StringIO()
    dead = DeadLetters(buf)
    eng = Engine(dead_letters=dead)
    kept = []
    for ev in read_events(feed, dead_letters=dead):
        eng.process(ev)
        kept.append((ev.seq, ev.type, ev.ts))
    letters = [json.loads(x) for x in buf.getvalue().splitlines()]
    got = [r.asDict() for r in events.where("reason is not null").select("seq", "position", "reason", "raw").orderBy("seq").collect()]
    assert got == letters and [x["position"] for x in letters] == ["line 1702", "seq 1701"]
    assert sorted((r.seq, r.type, r.ts) for r in events.where("reason is null").collect()) == [k for k in kept if k[0] != 1701]
    events.unpersist()


def test_split_ids_number_a_multi_file_multi_split_input(spark, tmp_path):
    """Records carry their split's id, not its path: several files, each split in many, with a malformed
    line, a blank line and a late event, get ``yfpp run``'s seq numbers over the files one after the other."""
    recs = [json.dumps(r) for r in generate_rfid(4500, tags=6, seed=4)]
    parts = [recs[:1500], recs[1500:3000], recs[3000:]]
    parts[1][700:700] = ["", "not json", '{"type": "exit", "ts": 2, "tag_id": 1}']
    feeds = tmp_path / "feeds"
    feeds.mkdir()
    files = [feeds / f"part-{i}.jsonl" for i in range(3)]
    for f, part in zip(files, parts):
        f.write_text("\n".join(part) + "\n")
    events, n_parts = _read_in_small_splits(spark, feeds)
    assert n_parts > 10
    want, base = [], 0
    for f in files:
        n = 0
        for ev in read_events(f, dead_letters=DeadLetters()):
            want.append((ev.seq + base, ev.type, ev.ts))
            n = ev.seq + 1
        base += n
    got = events.where("reason is null").select("seq", "type", "ts").orderBy("seq").collect()
    assert [tuple(r) for r in got] == [w for w in want if w[0] != 2201]  # 1500 + 701: the late event
    dead = [r.asDict() for r in events.where("reason is not null").select("seq", "position").orderBy("seq").collect()]
    assert dead == [{"seq": 2200, "position": "part-1.jsonl line 702"}, {"seq": 2201, "position": "seq 2201"}]
    events.unpersist()


def test_json_lines_files_spark_would_not_split_are_read_whole(spark, tmp_path):
    """A plain JSON-lines file no larger than Spark's split size is read as one binaryFile row, not a
    text row per line; a larger one is still split by line."""
    from yfpp.spark.read import small_files

    (tmp_path / "a.jsonl").write_text('{"type": "a", "ts": 1}\n' * 400)  # 9.2 kB
    (tmp_path / "b.jsonl").write_text('{"type": "a", "ts": 1}\n' * 4000)  # 92 kB
    files = [f"file:{tmp_path}/a.jsonl", f"file:{tmp_path}/b.jsonl"]
    assert small_files(spark, files) == files  # below spark.sql.files.openCostInBytes (4 MB)
    spark.conf.set("spark.sql.files.maxPartitionBytes", "16k")
    try:
        assert small_files(spark, files) == files[:1]
    finally:
        spark.conf.unset("spark.sql.files.maxPartitionBytes")


@pytest.mark.parametrize("plan", ["scan", "shuffle"])
def test_an_input_without_dead_letters_writes_an_empty_dead_letter_output(spark, queries, tmp_path, monkeypatch, capsys,
                                                                          plan):
    """The summaries show no malformed record and no late event: no pass over the input for the dead
    letters, but the output folder is there as Spark writes it (empty, ``_SUCCESS``), and --mode holds."""
    monkeypatch.chdir(tmp_path)
    write_events(generate_rfid(300, tags=4, seed=2), tmp_path / "feed.jsonl")
    code, err = run_cli(capsys, queries, "-i", "feed.jsonl", "-o", "out", "--plan", plan)
    assert code == 0 and "dead letters      0\n" in err, err
    assert (tmp_path / "out" / "dead_letters.jsonl" / "_SUCCESS").is_file()
    assert spark.read.text(str(tmp_path / "out" / "dead_letters.jsonl")).count() == 0
    (tmp_path / "bad.jsonl").write_text((tmp_path / "feed.jsonl").read_text() + "not json\n")
    code, err = run_cli(capsys, queries, "-i", "bad.jsonl", "-o", "out", "--mode", "append", "--plan", plan)
    assert code == 0 and "dead letters      1\n" in err, err
    assert [json.loads(r.value)["position"] for r in spark.read.text(str(tmp_path / "out" / "dead_letters.jsonl")).collect()] == ["line 301"]


@pytest.mark.parametrize("case, plan", [(c, "auto") for c in ("missing", "empty", "only_success", "only_empty_subdirs")]
                         + [(c, p) for c in ("truncated_gzip", "neither_format") for p in ("scan", "shuffle")])
def test_bad_inputs_are_one_error_line(spark, queries, tmp_path, monkeypatch, capsys, case, plan):
    monkeypatch.chdir(tmp_path)
    d = tmp_path / "in"
    if case != "missing":
        d.mkdir()
    if case == "only_success":
        (d / "_SUCCESS").write_text("")
    elif case == "only_empty_subdirs":
        (d / "day=1").mkdir()
        (d / "day=2").mkdir()
    elif case == "truncated_gzip":  # listed by the driver, unreadable on the executor
        data = gzip.compress("".join(f'{{"type": "a", "ts": {i}, "x": {i * 7919 % 100003}}}\n' for i in range(5000)).encode())
        (d / "feed.jsonl.gz").write_bytes(data[: len(data) // 2])
    elif case == "neither_format":  # a stray file: the line names it
        write_events(generate_rfid(50, tags=4, seed=2), d / "feed.jsonl")
        (d / "zz.parquet").write_bytes(b"PAR1\x15\x04" * 100)
    code, err = run_cli(capsys, queries, "-i", "in", "-o", "out", "--plan", plan)
    assert code == 2 and err.startswith("yfpp: error: ") and err.count("\n") == 1, err
    assert {"missing": "no such input", "truncated_gzip": "cannot read",
            "neither_format": f"cannot tell the format of '{d / 'zz.parquet'}'"}.get(case, "no input files") in err


def test_late_event_step_runs_only_when_an_event_can_be_late():
    """The split summaries decide: an out-of-order event inside a split (``pos``), or a split
    whose smallest ts (``prev_max``) is below the largest ts of the splits before it."""
    from pyspark.sql import Row

    from yfpp.spark.read import any_late, split_offsets

    def summary(path: str, lo: float, hi: float, late: int = 0) -> Row:
        return Row(path=path, block=0, n=10, line=10, ts=hi, pos=late, prev_max=lo)

    def late(*stats: Row) -> bool:
        return any_late(list(stats), split_offsets(list(stats), False))

    assert not late(summary("a", 0, 5), summary("b", 5, 9))  # ordered (equal ts is not late)
    assert late(summary("a", 0, 5), summary("b", 4, 9))  # b's first events are below a's last
    assert late(summary("a", 0, 5, late=1), summary("b", 6, 9))  # one inside a
    assert not late(summary("a", 0, 5), Row(path="b", block=0, n=1, line=1, ts=None, pos=0, prev_max=None))  # only malformed


def test_a_missing_stream_directory_is_one_error_line(spark, queries, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    code, err = run_cli(capsys, queries, "--stream", "-i", "in", "-o", "out", "--idle-stop", "1")
    assert code == 2 and err == "yfpp: error: no such input: in\n", err
    assert not spark.streams.active


def test_the_stream_makes_dead_letters_of_a_file_of_neither_format_and_of_a_ts_it_cannot_hold(spark, tmp_path):
    """A stray file and events whose ts a stream cannot match (a millisecond epoch read as seconds; one far
    before 1938) are dead letters with their positions, and the stream goes on: yfpp run's matches."""
    from yfpp.spark.stream import finish, start_stream

    inbox = tmp_path / "in"
    inbox.mkdir()
    records = list(generate_rfid(600, tags=4, gap=10, seed=6))
    early = {"type": "shelf", "ts": -5e9, "tag_id": 1}
    ms = {"type": "shelf", "ts": 1732400000000, "tag_id": 1}
    write_events([early, *records[:300]], inbox / "a.jsonl")
    write_events([*records[300:], ms], inbox / "b.jsonl")
    (inbox / "zz.parquet").write_bytes(b"PAR1\x15\x04" * 100)
    query = {"shop": "PATTERN SEQ(shelf a, ~register b, exit c) WHERE [tag_id] WITHIN 1 hour"}
    finish(start_stream(spark, query, str(tmp_path / "out"), str(tmp_path / "ck"), path=str(inbox)))
    write_events([early, *records, ms], tmp_path / "all.jsonl")
    eng = Engine(dead_letters=DeadLetters())
    eng.register(query["shop"], name="shop")
    assert output(spark, tmp_path / "out") == Counter(json.dumps(m) for m in eng.process_all(
        read_events(tmp_path / "all.jsonl", dead_letters=DeadLetters())))
    dead = sorted((json.loads(r.value) for r in spark.read.text(str(tmp_path / "out" / "dead_letters.jsonl")).collect()),
                  key=lambda d: d["seq"])
    assert [(d["seq"], d["position"], d["reason"].split(",")[0].split(";")[0]) for d in dead] == [
        (0, "seq 0", "ts -5000000000.0 is outside the range a stream can match"),
        (601, "seq 601", "ts 1732400000000.0 is outside the range a stream can match"),
        (602, "zz.parquet", f"cannot tell the format of '{inbox / 'zz.parquet'}'")]
    assert "-1000000000 < ts < 8000000000 s" in dead[0]["reason"]
    assert json.loads(dead[1]["raw"]) == {"type": "shelf", "ts": 1732400000000.0, "tag_id": 1}


#: ISO-8601 timestamps (one with an offset: late; one a fraction), the type in field ``kind``, a bad ts
ISO_FEED = """\
{"kind": "shelf", "ts": "2026-11-22T10:00:00Z", "tag_id": 1}
{"kind": "shelf", "ts": "2026-11-22T10:00:05Z", "tag_id": 2}
{"kind": "register", "ts": "2026-11-22T10:00:20Z", "tag_id": 2}
{"kind": "exit", "ts": "2026-11-22T10:00:40+01:00", "tag_id": 1}
{"kind": "exit", "ts": "2026-11-22T10:00:50Z", "tag_id": 1}
{"kind": "exit", "ts": "2026-11-22T10:01:00Z", "tag_id": 2}
{"kind": "exit", "ts": "not a time", "tag_id": 1}
{"kind": "shelf", "ts": "2026-11-22T10:31:00.25Z", "tag_id": 3}
{"kind": "exit", "ts": "2026-11-22T10:31:30Z", "tag_id": 3}
{"kind": "exit", "ts": "2026-11-22T10:40:00Z", "tag_id": 3}
"""
ISO_QUERY = "PATTERN SEQ(shelf a, ~register b, exit c) WHERE [tag_id] WITHIN 120"  # a bare window: seconds
#: --ts-unit is ignored for ISO timestamps, as by yfpp run: the bare window stays 120 s, not 120 ms
ISO_OPTIONS = ["--ts-format", "iso", "--type-field", "kind", "--ts-unit", "ms"]


@pytest.mark.parametrize("plan", ["scan", "shuffle"])
def test_iso_timestamps_and_a_type_field_as_yfpp_run(spark, tmp_path, monkeypatch, capsys, plan):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "feed.jsonl").write_text(ISO_FEED)
    assert main(["run", "-q", ISO_QUERY, "-i", "feed.jsonl", *ISO_OPTIONS]) == 0
    expected = sorted(capsys.readouterr().out.splitlines())
    assert [json.loads(x)["start"] for x in expected] == ["2026-11-22T10:00:00Z", "2026-11-22T10:31:00.250000Z"]
    code, err = run_cli(capsys, ISO_QUERY, "-i", "feed.jsonl", "-o", "out", "--plan", plan, *ISO_OPTIONS)
    assert code == 0 and "dead letters      2\n" in err, err  # the bad ts and the late exit
    assert sorted(output(spark, tmp_path / "out").elements()) == expected


def test_the_stream_reads_iso_timestamps_and_a_type_field_as_yfpp_run(tmp_path, capsys):
    """The socket source's rows (its reader options) through the streaming state function: the lines of yfpp run."""
    import pandas as pd

    from yfpp.spark.parse import records
    from yfpp.spark.plan import group_queries
    from yfpp.spark.source import _Sequencer
    from yfpp.spark.stream import _RECORD_COLS, _state_function

    class NoState:  # a key's GroupState before its first event, no watermark yet
        exists = False
        update = remove = setTimeoutTimestamp = staticmethod(lambda *a: None)
        getCurrentWatermarkMs = staticmethod(lambda: 0)

    rows = _Sequencer(0, None).rows(records(io.BytesIO(ISO_FEED.encode()), {"format": "jsonl", "ts_unit": "iso",
                                                                               "type_field": "kind"}))
    assert sum(r[5] is not None for r in rows) == 2  # the bad ts and the late exit
    groups = group_queries(load([ISO_QUERY], ts_unit="s"), streaming=True, iso_times=True)
    # (as routed to a bucket: no slice, so s, t0, len and w null)
    pdf = pd.DataFrame([(None, None, None, None, *r) for r in rows if r[5] is None],
                       columns=["s", "t0", "len", "w", *_RECORD_COLS])
    found = [line for frame in _state_function(groups)((0, 0), iter([pdf]), NoState()) for line in frame["json"]]
    (tmp_path / "feed.jsonl").write_text(ISO_FEED)
    assert main(["run", "-q", ISO_QUERY, "-i", str(tmp_path / "feed.jsonl"), *ISO_OPTIONS]) == 0
    assert sorted(found) == sorted(capsys.readouterr().out.splitlines())
