"""``yfpp spark -i`` with several paths and globs (one stream, in the order given), and ``--table NAME
--mode append`` appending on every run (the two-worker local cluster of tests/conftest.py)."""

from __future__ import annotations

import os
import shutil
from collections import Counter
from pathlib import Path

import pytest

pytest.importorskip("pyspark", reason="pyspark is not installed (pip install '.[spark]')")

from yfpp.cli import main  # noqa: E402
from yfpp.input.generate import generate_rfid, write_events  # noqa: E402
from yfpp.spark.table import managed_folder  # noqa: E402

QUERIES = ["[tag_id]&&//shelf//!register//exit&&(1 hour)", "//register//exit&&(60)",
           "PATTERN SEQ(shelf a, exit c) WHERE [tag_id] WITHIN 10 min"]


@pytest.fixture(scope="module")
def feeds(tmp_path_factory) -> Path:
    """One feed in four pieces, in time order: z/c0.jsonl, a/c1.jsonl, a/c2.xml, m/c3.jsonl (sorted by
    path, z/ would come last: its events late), and all.jsonl, their concatenation."""
    d = tmp_path_factory.mktemp("feeds")
    records = list(generate_rfid(1600, tags=8, gap=12, seed=11))
    for i, name in enumerate(["z/c0.jsonl", "a/c1.jsonl", "a/c2.xml", "m/c3.jsonl"]):
        (d / name).parent.mkdir(exist_ok=True)
        write_events(records[i * 400:(i + 1) * 400], d / name)
    write_events(records, d / "all.jsonl")
    return d


def run_lines(capsys, *args: str) -> Counter:
    capsys.readouterr()
    assert main(["run", *[a for q in QUERIES for a in ("-q", q)], *args]) == 0
    return Counter(capsys.readouterr().out.splitlines())


def spark_lines(spark, capsys, out: Path, *args: str) -> tuple[Counter, str]:
    assert main(["spark", *[a for q in QUERIES for a in ("-q", q)], "-o", str(out), *args]) == 0
    got = Counter(r[0] for r in spark.read.text(str(out / "matches.jsonl")).collect())
    return got, capsys.readouterr().err


@pytest.mark.parametrize("plan", ["scan", "shuffle"])
def test_several_inputs_are_one_stream_in_the_order_given(spark, feeds, tmp_path, capsys, plan):
    expected = run_lines(capsys, "-i", str(feeds / "all.jsonl"))
    assert expected
    # as a shell expands -i z/* a/* m/*; a/{…}: Spark's own glob (braces), listed by Hadoop's file system
    a = str(feeds / "a" / "*") if plan == "scan" else str(feeds / "a" / "{c1.jsonl,c2.xml}")
    got, err = spark_lines(spark, capsys, tmp_path / "out", "--plan", plan, "-i", str(feeds / "z" / "c0.jsonl"), a,
                           f"file://{feeds / 'm'}")
    assert got == expected
    assert "events            1,600" in err and "dead letters      0" in err
    # sorted by path instead, z/c0.jsonl would be read last: its 400 events late, dead letters
    got, err = spark_lines(spark, capsys, tmp_path / "sorted", "--plan", plan, "-i", str(feeds / "a"), str(feeds / "m"),
                           str(feeds / "z"))
    assert "dead letters      400" in err


def test_a_file_named_twice_is_refused(spark, feeds, tmp_path, capsys):
    assert main(["spark", "-q", QUERIES[0], "-o", str(tmp_path / "out"), "-i", str(feeds / "a"),
                 str(feeds / "a" / "c1.jsonl")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("yfpp: error: ") and "c1.jsonl is named twice" in err and "\n" not in err


def test_a_stream_watches_one_directory(spark, feeds, tmp_path, capsys):
    assert main(["spark", "--stream", "-q", QUERIES[0], "-o", str(tmp_path / "out"), "-i", str(feeds / "a"),
                 str(feeds / "m")]) == 2
    assert capsys.readouterr().err.strip() == "yfpp: error: --stream watches one input directory, not 2: give one -i"


@pytest.mark.parametrize("partition_by", [[], ["--partition-by", "query"]])
def test_append_to_a_table_on_every_run(spark, feeds, tmp_path, capsys, partition_by):
    name = f"yfpp_append_{os.getpid()}_{len(partition_by)}"
    args = ["-i", str(feeds / "all.jsonl"), "--table", name, "--mode", "append", *partition_by]
    try:
        first, _ = spark_lines(spark, capsys, tmp_path / "out", *args)
        n = sum(first.values())
        assert n and spark.table(name).count() == n
        # the next run's session has a new catalog (Spark's default, kept in memory) and the table's folder:
        # the table is forgotten here, its folder kept
        folder = managed_folder(spark, name).removeprefix("file:")
        shutil.move(folder, f"{folder}.kept")
        spark.sql(f"DROP TABLE {name}")
        shutil.move(f"{folder}.kept", folder)
        assert not spark.catalog.tableExists(name) and os.path.isdir(folder)
        second, _ = spark_lines(spark, capsys, tmp_path / "out", *args)
        assert spark.table(name).count() == 2 * n  # appended, not refused (LOCATION_ALREADY_EXISTS)
        assert second == Counter({line: 2 * k for line, k in first.items()})  # matches.jsonl appended too
        spark_lines(spark, capsys, tmp_path / "out", *args)  # the table known: Spark appends by itself
        assert spark.table(name).count() == 3 * n
        assert spark.table(name).where("query = 'q2'").count() == 3 * sum(k for m, k in first.items() if '"q2"' in m)
    finally:
        folder = managed_folder(spark, name).removeprefix("file:")
        spark.sql(f"DROP TABLE IF EXISTS {name}")
        shutil.rmtree(folder, ignore_errors=True)  # (an external table's files stay when it is dropped)
