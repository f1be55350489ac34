"""Hot keys (``yfpp.spark.hot_keys``): a key with half the events cut into time slices by the scan plan.

Without Spark: the read and matching tasks of a scan job run one after the other give together exactly one
engine's matches — on generated keyed patterns over skewed streams, and on a skewed RFID-like feed, where
the hot key's work is spread over the tasks (rows per task, not time: no timing assertions).
"""

from __future__ import annotations

import io
import json
import random
import re
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("pyspark", reason="pyspark is not installed (pip install '.[spark]')")

from tests.generators import patterns, streams  # noqa: E402
from yfpp.engine import Engine  # noqa: E402
from yfpp.input.dead_letters import DeadLetters  # noqa: E402
from yfpp.input.readers import read_events  # noqa: E402
from yfpp.spark.hot_keys import find_hot, sliceable  # noqa: E402
from yfpp.spark.plan import effective_queries, group_queries  # noqa: E402
from tests.spark.test_spark_scan import one_engine as engine_and_dead_letters  # noqa: E402
from tests.spark.test_spark_scan import scanned as scan_job  # noqa: E402

SHOP = {"shop": "PATTERN SEQ(shelf a, ~register b, exit c) WHERE [tag_id] WITHIN 60",
        "quiet": "PATTERN SEQ(shelf a, ~exit b) WHERE [tag_id] WITHIN 30",
        "pairs": "PATTERN SEQ(shelf a, shelf+ b[], exit c) WHERE [tag_id] WITHIN 20"}


def one_engine(named: list, path: Path) -> Counter:
    eng = Engine(dead_letters=DeadLetters(io.StringIO()))
    for name, q in named:
        eng.register(q, name=name)
    return Counter(json.dumps(m) for m in eng.process_all(read_events(path, dead_letters=DeadLetters(io.StringIO()))))


def scanned(named: list, path: Path, n: int, prefix: int, hot_keys: bool = True,
            pieces: int = 1) -> tuple[Counter, list[dict]]:
    """The matches and stats rows of a scan job's tasks run one after the other (``tests/spark/test_spark_scan.py``)."""
    got, _, stats = scan_job([(name, q) for name, q in named], [path], n, prefix, pieces, hot_keys)
    return got, stats


def test_the_hot_keys_are_those_with_half_a_task_s_share():
    keys = ["h"] * 50 + ["a"] * 13 + ["b"] * 12 + list(range(25))
    assert find_hot(keys, 2) == ["h"]  # 13 < 100 / 2 / 2 = 25
    assert find_hot(keys, 4) == ["h", "a"]  # bar 12.5
    assert find_hot(["x"] * 3 + ["y"], 1) == ["x"]  # (one task: never asked — nothing to spread)
    (keyed,) = group_queries(effective_queries(list(SHOP.items())))
    assert sliceable(keyed)
    for q in ("PATTERN SEQ(shelf a, exit c) WHERE [tag_id] WITHIN 5 OUTPUT non_overlapping",
              "PATTERN SEQ(shelf a, exit c) WHERE [tag_id]",
              "PATTERN SEQ(shelf a, exit c) WHERE [tag_id] WITHIN 5 RETURN x(tag_id = a.tag_id) FEEDBACK"):
        (grp,) = group_queries(effective_queries([q]))
        assert not sliceable(grp), q


def skewed_feed(path: Path, events: int, seed: int) -> Path:
    """Shelf, register and exit reads of 40 tags, tag H in half of them, a second apart."""
    rnd = random.Random(seed)
    with path.open("w") as f:
        for ts in range(events):
            tag = "H" if rnd.random() < 0.5 else f"T{rnd.randrange(40)}"
            kind = rnd.choice(["shelf", "shelf", "register", "exit"])
            f.write(json.dumps({"type": kind, "ts": ts, "tag_id": tag}) + "\n")
    return path


@pytest.mark.parametrize("n", [2, 3, 4])
def test_a_skewed_feed_gives_yfpp_run_s_matches_with_the_hot_key_spread(tmp_path, n):
    path = skewed_feed(tmp_path / "feed.jsonl", 6000, seed=n)
    named = list(SHOP.items())
    want = one_engine(named, path)
    assert sum(want.values()) > 1000
    before, plain = scanned(named, path, n, 250, hot_keys=False)
    after, split = scanned(named, path, n, 250)
    assert before == want and after == want
    assert all(s["hot"] == [] for s in plain) and all(s["hot"] == ["'H'"] for s in split)
    rows_before, rows_after = [s["rows"] for s in plain], [s["rows"] for s in split]
    spread_before, spread_after = max(rows_before) / min(rows_before), max(rows_after) / min(rows_after)
    assert spread_before > 1.4  # the task with H does over half the work
    # H's slices go round robin; what is left uneven is the 40 other keys' hashing
    assert spread_after < min(1.35, spread_before), (rows_before, rows_after)


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(pats=st.lists(patterns(), min_size=1, max_size=3), events=streams(max_events=40),
       hot=st.lists(st.booleans(), min_size=40, max_size=40), n=st.integers(2, 4),
       prefix=st.sampled_from([1, 2, 4, 8, 100]), pieces=st.sampled_from([1, 3]),
       late=st.one_of(st.none(), st.integers(0, 39)))
def test_hot_key_slices_together_equal_one_engine(tmp_path_factory, pats, events, hot, n, prefix, pieces, late):
    """Keyed generated patterns (windowed: the group is sliceable unless a policy forbids it) over streams
    where key 7 takes about half the events, read in one or several byte ranges, with a late event of
    the hot key (back before the key's first event) somewhere."""
    named = [(f"q{i}", replace(p, partition_by=("k",), window=p.window if p.window is not None else 3))
             for i, p in enumerate(pats)]
    lines = [json.dumps({"type": e.type, "ts": e.ts, **e.attrs, **({"k": 7} if h else {})})
             for e, h in zip(events, hot)]
    if late is not None and late < len(lines) and events[late].ts > events[0].ts:
        lines.insert(late + 1, json.dumps({"type": events[0].type, "ts": events[0].ts, "k": 7}))
    path = tmp_path_factory.mktemp("hot") / "feed.jsonl"
    path.write_text("".join(ln + "\n" for ln in lines))
    got, dead, _ = scan_job(named, [path], n, prefix, pieces)
    want, letters = engine_and_dead_letters(named, path)
    assert got == want
    assert dead == sorted(letters, key=lambda d: d["seq"])


@pytest.mark.parametrize("plan", ["scan", "shuffle"])
def test_stats_show_the_hot_key_and_the_task_spread(spark, tmp_path, capsys, monkeypatch, plan):
    """``yfpp spark --stats`` on a skewed feed (the two-worker cluster of tests/conftest.py), by either
    plan: the hot key named, the tasks' seconds, the matches of ``yfpp run`` — with and without
    ``--hot-keys off``; the shuffle plan (hot keys of the whole input) spreads the rows per task."""
    from yfpp.cli import main

    monkeypatch.chdir(tmp_path)
    path = skewed_feed(tmp_path / "feed.jsonl", 30_000, seed=9)  # (the prefix: 10,000 events)
    qs = [a for q in SHOP.values() for a in ("-q", q)]
    assert main(["run", *qs, "-i", str(path)]) == 0
    want = Counter(capsys.readouterr().out.splitlines())
    spread = {}
    for mode, hot in (("auto", "'H'"), ("off", "none")):
        assert main(["spark", *qs, "-i", str(path), "-o", mode, "--plan", plan, "--partitions", "2", "--stats",
                     "--hot-keys", mode]) == 0
        err = capsys.readouterr().err
        assert f"hot keys          {hot}\n" in err and "task seconds      min " in err, err
        got = Counter(ln for f in (tmp_path / mode / "matches.jsonl").glob("part-*") for ln in f.read_text().splitlines())
        assert got == want
        rows = [int(m.group(1).replace(",", "")) for m in re.finditer(r"task \d+ +([\d,]+) rows", err)]
        spread[mode] = max(rows) / min(rows)
    if plan == "shuffle":
        assert spread["off"] > 1.4 and spread["auto"] < min(1.25, spread["off"]), spread
