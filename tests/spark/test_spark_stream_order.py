"""A directory stream's order across files and micro-batches is ``yfpp run``'s over the files' concatenation.

Files arrive over several micro-batches; the executors read, parse and count
them, the driver only adds offsets (docs/spark.md, *Stream order*): seq
numbers, late events and dead letters must be those of ``yfpp run`` over the
files concatenated in the order they arrived, and ``--stats`` shows the
reading stage running as executor tasks.
"""

from __future__ import annotations

import json
import os
import random
import re
from collections import Counter
from pathlib import Path

import pytest

pytest.importorskip("pyspark", reason="pyspark is not installed (pip install '.[spark]')")

from tests.spark.test_spark_cli import bounded, output  # noqa: E402
from yfpp.cli import main  # noqa: E402
from yfpp.input.generate import generate_rfid  # noqa: E402

QUERIES = ["PATTERN SEQ(shelf a, ~register b, exit c) WHERE [tag_id] WITHIN 1 hour",  # keyed
           "//register//exit&&(60)"]  # unkeyed


def feed_files(inbox: Path, seed: int, files: int) -> list[str]:
    """Lines of a feed with late events (some ts moved back) and malformed lines, cut into ``files``
    files at random points, each modified after the one before (the order a stream takes them in)."""
    rng = random.Random(seed)
    records = list(generate_rfid(500, tags=6, gap=15, seed=seed))
    for i in rng.sample(range(1, len(records)), 12):
        records[i]["ts"] -= rng.choice([1, 40, 400])  # late unless it stays above every ts before it
    lines = [json.dumps(r) for r in records]
    for i in rng.sample(range(len(lines)), 3):
        lines[i] = lines[i][:-5]  # a malformed record
    lines.append(json.dumps({"type": "heartbeat", "ts": records[-1]["ts"] + 10**6}))
    cuts = sorted(rng.sample(range(1, len(lines)), files - 1))
    inbox.mkdir()
    for n, (a, b) in enumerate(zip([0, *cuts], [*cuts, len(lines)])):
        path = inbox / f"part-{n:02d}.jsonl"  # (a micro-batch of several files takes them in path order)
        path.write_text("".join(ln + "\n" for ln in lines[a:b]))
        os.utime(path, (1e9 + n, 1e9 + n))
    return lines


def dead_letters(path: Path) -> Counter:
    """Dead letters as ``(seq, reason, raw)`` (positions name a file and line in one, a line of the whole in the other)."""
    found = (json.loads(ln) for f in (sorted(path.rglob("part-*")) if path.is_dir() else [path])
             if f.suffix != ".crc" for ln in f.read_text().splitlines())
    return Counter((d["seq"], d["reason"], d["raw"]) for d in found)


@pytest.mark.parametrize("seed, max_files", [(1, 1), (2, 2)])
def test_files_over_micro_batches_are_yfpp_run_over_their_concatenation(spark, tmp_path, capsys, seed, max_files):
    lines = feed_files(tmp_path / "inbox", seed, files=5)
    whole = tmp_path / "all.jsonl"
    whole.write_text("".join(ln + "\n" for ln in lines))
    queries = [a for q in QUERIES for a in ("-q", q)]
    assert main(["run", *queries, "-i", str(whole), "--dead-letters", str(tmp_path / "dead.jsonl")]) == 0
    expected = Counter(capsys.readouterr().out.splitlines())
    late = sum(1 for seq, reason, _ in dead_letters(tmp_path / "dead.jsonl") if "late" in reason)
    assert expected and late >= 3  # the feed has late events and matches

    out = tmp_path / "out"
    assert bounded(spark, ["spark", "--stream", "--stats", *queries, "-i", str(tmp_path / "inbox"), "-o", str(out),
                           "--max-files", str(max_files), "--idle-stop", "2"], 600) == 0
    err = capsys.readouterr().err
    assert output(out / "matches.jsonl") == expected
    assert dead_letters(out / "dead_letters.jsonl") == dead_letters(tmp_path / "dead.jsonl")
    assert f"batch {-(-5 // max_files) - 1}:" in err  # the files came in several micro-batches

    # --stats: the stages that read input (the files, then the parsed rows kept in memory) ran as tasks on the
    # executors, which read every byte
    ingest = err[err.index(" ingest:"):err.index(" match:")]
    rows = [ln.split() for ln in ingest.splitlines() if re.match(r"\s+\d+\s+\d+\s", ln)]
    reading = [r for r in rows if int(r[3].replace(",", "")) > 0]
    assert sum(int(r[3].replace(",", "")) for r in reading) >= sum(f.stat().st_size for f in (tmp_path / "inbox").iterdir())
    assert all("driver" not in r[2].split(",") for r in reading), ingest
    assert "CPU s over the stream: driver" in err


def test_a_checkpoint_without_its_state_key_record_is_refused_by_name(spark, tmp_path: Path) -> None:
    """A stream checkpoint made before state keys were bucketed (a ``match`` folder, no ``buckets.json``)
    cannot resume: its keys' state lies under other state keys, so it is refused with one line."""
    from yfpp.errors import InputError
    from yfpp.spark.stream import state_buckets

    (tmp_path / "match").mkdir()
    with pytest.raises(InputError, match="fresh checkpoint"):
        state_buckets(spark, str(tmp_path))
    fresh = tmp_path / "fresh"
    assert state_buckets(spark, str(fresh)) == state_buckets(spark, str(fresh)) >= 2
