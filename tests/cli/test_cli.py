"""The command line: run on the bundled sample, generate, help, errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from yfpp.cli import main

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "yfpp" / "data" / "sample_rfid.xml"


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_run_sample_prints_shoplifting_matches_in_both_languages(capsys):
    code, out, err = run(capsys, "run", "-q", str(ROOT / "queries/shoplifting.sase"), str(ROOT / "queries/shoplifting.xpe"), "-i", str(SAMPLE), "--stats")
    assert code == 0
    matches = [json.loads(line) for line in out.splitlines()]
    sase = {(m["bindings"]["a"][0], m["bindings"]["c"][0]) for m in matches if m["query"] == "shoplifting" and "a" in m["bindings"]}
    xpath = {(m["bindings"]["e1"][0], m["bindings"]["e2"][0]) for m in matches if "e1" in m["bindings"]}
    assert sase and sase == xpath
    assert all(m["emit"]["type"] == "theft" for m in matches if "a" in m["bindings"])
    assert "events/s" in err and "peak runs" in err


def test_run_writes_output_file_and_jsonl_input(tmp_path, capsys):
    out_file = tmp_path / "m.jsonl"
    code, out, _ = run(capsys, "run", "-q", "[tag_id]//shelf//exit(12 h)", "-i", str(SAMPLE.with_suffix(".jsonl")), "-o", str(out_file))
    assert code == 0 and out == ""
    assert len(out_file.read_text().splitlines()) > 10


def test_bad_query_exits_2_with_position(capsys):
    code, _, err = run(capsys, "run", "-q", "PATTERN SEQ(shelf a exit c)", "-i", str(SAMPLE))
    assert code == 2 and "line 1, column" in err and "^" in err


def test_malformed_records_are_reported_and_the_stream_goes_on(tmp_path, capsys):
    feed = tmp_path / "f.jsonl"
    feed.write_text('{"type": "a", "ts": 1}\nnot json\n{"type": "b", "ts": 2}\n')
    dead = tmp_path / "dead.jsonl"
    code, out, _ = run(capsys, "run", "-q", "PATTERN SEQ(a x, b y)", "-i", str(feed), "--dead-letters", str(dead))
    assert code == 0
    assert json.loads(out)["bindings"] == {"x": [0], "y": [2]}
    (letter,) = [json.loads(x) for x in dead.read_text().splitlines()]
    assert letter["seq"] == 1 and letter["position"] == "line 2"


def test_generate_then_run(tmp_path, capsys):
    feed = tmp_path / "ticks.xml"
    assert main(["generate", "stock", "--events", "500", "-o", str(feed)]) == 0
    code, out, _ = run(capsys, "run", "-q", "PATTERN SEQ(stock a, stock b) WHERE strict_contiguity(a, b) { a.price < b.price }", "-i", str(feed))
    assert code == 0 and len(out.splitlines()) > 50


@pytest.mark.parametrize("command", [[], ["run"], ["generate"]])
def test_help_has_examples(command, capsys):
    with pytest.raises(SystemExit):
        main(command + ["--help"])
    out = capsys.readouterr().out
    assert "usage" in out and (not command or "examples" in out)


def test_a_window_without_a_unit_counts_in_the_ts_unit(tmp_path, capsys):
    feed = tmp_path / "ms.jsonl"
    feed.write_text('{"type": "shelf", "ts": 1000, "tag_id": 1}\n{"type": "exit", "ts": 1200, "tag_id": 1}\n')
    for window, matches in (("250", 1), ("150", 0), ("1 s", 1), ("150 ms", 0)):
        code, out, _ = run(capsys, "run", "-q", f"PATTERN SEQ(shelf a, exit c) WHERE [tag_id] WITHIN {window}",
                           f"[tag_id]//shelf//exit({window})", "-i", str(feed), "--ts-unit", "ms")
        assert code == 0 and len(out.splitlines()) == 2 * matches, window


def test_nested_json_attributes_in_both_languages(tmp_path, capsys):
    feed = tmp_path / "nested.jsonl"
    feed.write_text('{"type": "a", "ts": 1, "o": {"p": 1}}\n{"type": "b", "ts": 2, "o": {"p": 1}, "q": {"r": 5}}\n'
                    '{"type": "b", "ts": 3, "o": {"p": 2}, "q": {"r": 5}}\n')
    code, out, _ = run(capsys, "run", "-q", "PATTERN SEQ(a x, b y) WHERE [o.p] AND y.q.r > x.o.p",
                       "[o.p]//a//b[@q.r > 1]", "-i", str(feed))
    assert code == 0 and [json.loads(line)["bindings"] for line in out.splitlines()] == [{"x": [0], "y": [1]}, {"e1": [0], "e2": [1]}]
