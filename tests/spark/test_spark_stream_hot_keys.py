"""Hot keys in a directory stream (``yfpp.spark.stream_hot``): a key with half the events cut into time slices.

The slices a staged event is marked with are those :class:`yfpp.spark.plan.Slicing`
says read it (Spark's arithmetic against Python's), and a stream of a skewed
feed over several micro-batches gives ``yfpp run``'s matches with the hot key
cut (``hot.json``) and without (``--hot-keys off``).
"""

from __future__ import annotations

import json
import os
import random
from collections import Counter

import pytest

pytest.importorskip("pyspark", reason="pyspark is not installed (pip install '.[spark]')")

from tests.spark.test_spark import split_feed  # noqa: E402
from tests.spark.test_spark_cli import bounded, output  # noqa: E402
from tests.spark.test_spark_hot_keys import SHOP, skewed_feed  # noqa: E402
from yfpp.cli import main  # noqa: E402
from yfpp.spark.batch import key_hash  # noqa: E402
from yfpp.spark.plan import Slicing, effective_queries, group_queries  # noqa: E402
from yfpp.spark.stream_hot import HotKeys, owner  # noqa: E402


def test_marked_slices_are_those_the_slicing_reads(spark):
    groups = group_queries(effective_queries({"q": "PATTERN SEQ(shelf a, exit c) WHERE [tag_id] WITHIN 7"}),
                           streaming=True)
    rng = random.Random(3)
    t0, length, window = 1000.25, 30.0, 7.0
    sl = Slicing(t0, length, window)
    # slice edges, extended ends and just around them, and random points
    edges = [t0 + k * length + d for k in range(6) for d in (0.0, window, -1e-9, 1e-9, window + 1e-9)]
    times = [t for t in edges + [t0 + rng.uniform(0, 180) for _ in range(300)] if t >= t0]
    rows = [(i, "shelf", t, json.dumps({"tag_id": "H" if i % 2 else "x"}), None, None, None, None)
            for i, t in enumerate(times)]
    df = spark.createDataFrame(rows, "seq long, type string, ts double, attrs string, xml string, reason string, "
                                     "position string, raw string")
    hot = HotKeys(groups, buckets=4)
    key = df.where("seq = 1").select(key_hash(("tag_id",))).first()[0]
    hot.decided = {0: [[key, t0, length]]}
    got = {r["seq"]: r["hot"] for r in hot.mark(df).collect()}
    for i, t in enumerate(times):
        if i % 2 == 0:
            assert got[i] is None  # not the hot key
            continue
        marks = got[i]
        assert [m["s"] for m in marks] == list(sl.reads(t)), t
        assert [m["b"] for m in marks] == [4 + s for s in sl.reads(t)]  # buckets + i + H·s, one hot key
        for m in marks:
            assert owner((m["s"], m["t0"], m["len"], m["w"])) == (sl, m["s"])


def test_a_skewed_stream_gives_yfpp_run_s_matches_with_its_hot_key_sliced(spark, tmp_path, capsys):
    path = skewed_feed(tmp_path / "feed.jsonl", 3000, seed=4)
    lines = path.read_text().splitlines()
    # lets the last windows close
    lines.append(json.dumps({"type": "heartbeat", "ts": 10**6, "tag_id": "beat"}))
    path.write_text("".join(ln + "\n" for ln in lines))
    qs = [a for q in SHOP.values() for a in ("-q", q)]
    assert main(["run", *qs, "-i", str(path)]) == 0
    want = Counter(capsys.readouterr().out.splitlines())
    assert sum(want.values()) > 500
    for n, part in enumerate(split_feed([json.loads(ln) for ln in lines], tmp_path / "inbox", 3)):
        os.utime(part, (1e9 + n, 1e9 + n))  # the stream takes them in this order
    for mode in ("auto", "off"):
        out, ck = tmp_path / f"out-{mode}", tmp_path / f"ck-{mode}"
        assert bounded(spark, ["spark", "--stream", "--stats", *qs, "-i", str(tmp_path / "inbox"), "-o", str(out),
                               "--checkpoint", str(ck), "--max-files", "1", "--idle-stop", "2",
                               "--hot-keys", mode], 600) == 0
        err = capsys.readouterr().err
        assert output(out / "matches.jsonl") == want, mode
        assert "max/mean run" in err
        if mode == "auto":  # H, about half of the first file's events, is hot; the 40 others are not
            (keys,) = json.loads((ck / "hot.json").read_text())["groups"].values()
            assert len(keys) == 1
        else:
            assert not (ck / "hot.json").exists()


def test_a_restart_with_hot_keys_off_keeps_the_slices_its_checkpoint_decided(spark, tmp_path, capsys):
    """The hot key's history is in its slices' state: a restart on the same checkpoint keeps routing it there."""
    path = skewed_feed(tmp_path / "feed.jsonl", 2000, seed=5)
    lines = path.read_text().splitlines() + [json.dumps({"type": "heartbeat", "ts": 10**6, "tag_id": "beat"})]
    path.write_text("".join(ln + "\n" for ln in lines))
    qs = [a for q in SHOP.values() for a in ("-q", q)]
    assert main(["run", *qs, "-i", str(path)]) == 0
    want = Counter(capsys.readouterr().out.splitlines())
    parts = split_feed([json.loads(ln) for ln in lines], tmp_path / "parts", 2)
    inbox, out, ck = tmp_path / "inbox", tmp_path / "out", tmp_path / "ck"
    inbox.mkdir()
    for n, mode in enumerate(("auto", "off")):
        parts[n].rename(inbox / parts[n].name)
        os.utime(inbox / parts[n].name, (1e9 + n, 1e9 + n))
        assert bounded(spark, ["spark", "--stream", *qs, "-i", str(inbox), "-o", str(out), "--checkpoint", str(ck),
                               "--idle-stop", "2", "--hot-keys", mode], 600) == 0
        assert (ck / "hot.json").exists()
    assert output(out / "matches.jsonl") == want


def test_a_heartbeat_without_a_key_lets_the_last_trailing_negation_matches_out(spark, tmp_path, capsys):
    """Every query keyed, the last event without the key attribute: no keyed group takes it, but its time
    still moves the watermark (as every event moves ``yfpp run``'s stream time), so the matches whose
    negation's window it closes come out as in ``yfpp run``."""
    path = skewed_feed(tmp_path / "feed.jsonl", 300, seed=7)
    lines = path.read_text().splitlines() + [json.dumps({"type": "heartbeat", "ts": 10**6})]
    path.write_text("".join(ln + "\n" for ln in lines))
    qs = ["-q", SHOP["quiet"]]
    assert main(["run", *qs, "-i", str(path)]) == 0
    want = Counter(capsys.readouterr().out.splitlines())
    late = [m for m in want if json.loads(m)["start"] > 270]  # (closed only by the heartbeat)
    assert late
    for n, part in enumerate(split_feed([json.loads(ln) for ln in lines], tmp_path / "inbox", 2)):
        os.utime(part, (1e9 + n, 1e9 + n))
    out = tmp_path / "out"
    assert bounded(spark, ["spark", "--stream", *qs, "-i", str(tmp_path / "inbox"), "-o", str(out),
                           "--checkpoint", str(tmp_path / "ck"), "--max-files", "1", "--idle-stop", "2",
                           "--hot-keys", "off"], 600) == 0
    assert output(out / "matches.jsonl") == want
