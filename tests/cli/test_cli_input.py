"""``yfpp run`` exit codes for input problems: no events, --strict, a broken gzip stream, Ctrl-C; --type-field."""

from __future__ import annotations

import gzip
import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.process_helpers import default_sigint
from yfpp.cli import main

ROOT = Path(__file__).resolve().parents[2]
PAIR = "PATTERN SEQ(a x, b y) WHERE [k]"


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_json_lines_read_as_xml_is_an_error(tmp_path, capsys):
    feed = tmp_path / "feed.xml"
    feed.write_text('{"type": "a", "ts": 1, "k": 1}\n{"type": "b", "ts": 2, "k": 1}\n')
    code, out, err = run(capsys, "run", "-q", PAIR, "-i", str(feed), "--dead-letters", str(tmp_path / "dead"))
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("yfpp: error: no events in ") and "malformed XML: 1" in err


def test_an_empty_input_is_not_an_error(tmp_path, capsys):
    feed = tmp_path / "feed.jsonl"
    feed.write_text("\n")
    assert run(capsys, "run", "-q", PAIR, "-i", str(feed))[0] == 0


def test_a_well_formed_empty_document_is_not_an_error(tmp_path, capsys):
    feed = tmp_path / "feed.xml"
    feed.write_text('<?xml version="1.0"?>\n<!-- nothing today -->\n<stream source="dock 4">\n</stream>\n')
    code, out, err = run(capsys, "run", "-q", PAIR, "-i", str(feed), "--stats")
    assert (code, out) == (0, "") and "dead letters      0" in err


def test_strict_makes_a_dead_letter_exit_1(tmp_path, capsys):
    feed = tmp_path / "feed.jsonl"
    feed.write_text('{"type": "a", "ts": 1, "k": 1}\nnot json\n{"type": "b", "ts": 2, "k": 1}\n')
    dead = str(tmp_path / "dead")
    code, out, err = run(capsys, "run", "-q", PAIR, "-i", str(feed), "--dead-letters", dead)
    assert code == 0 and len(out.splitlines()) == 1
    code, out, err = run(capsys, "run", "-q", PAIR, "-i", str(feed), "--dead-letters", dead, "--strict")
    assert code == 1 and len(out.splitlines()) == 1 and err == "yfpp: error: 1 dead letter(s) (--strict)\n"
    feed.write_text('{"type": "a", "ts": 1, "k": 1}\n')
    assert run(capsys, "run", "-q", PAIR, "-i", str(feed), "--strict")[0] == 0


def test_type_field_and_caps_options(tmp_path, capsys):
    feed = tmp_path / "feed.jsonl"
    feed.write_text('{"kind": "a", "ts": 1, "k": 1}\n{"kind": "b", "ts": 2, "k": 1, "pad": "' + "x" * 200 + '"}\n'
                    '{"kind": "b", "ts": 3, "k": 1}\n')
    dead = tmp_path / "dead"
    code, out, _ = run(capsys, "run", "-q", PAIR, "-i", str(feed), "--type-field", "kind", "--max-record-bytes", "100",
                       "--dead-letters", str(dead))
    assert code == 0 and [json.loads(x)["bindings"] for x in out.splitlines()] == [{"x": [0], "y": [2]}]
    assert json.loads(dead.read_text())["reason"].startswith("too large")


def test_truncated_gzip_writes_the_matches_before_it_then_fails(tmp_path, capsys):
    feed = tmp_path / "feed.jsonl.gz"
    lines = [json.dumps({"type": "ab"[i % 2], "ts": i, "k": i // 2, "pad": str(i * 7919) * 4}) for i in range(40000)]
    feed.write_bytes(gzip.compress("\n".join(lines).encode())[:-20000])
    code, out, err = run(capsys, "run", "-q", PAIR, "-i", str(feed), "--max-delay", "5")
    matches = [json.loads(x)["bindings"] for x in out.splitlines()]
    assert code == 2 and err.startswith("yfpp: error: cannot read input after line ") and err.count("\n") == 1
    assert len(matches) > 1000 and matches == [{"x": [2 * i], "y": [2 * i + 1]} for i in range(len(matches))]


def test_ctrl_c_exits_130_with_the_stats_and_no_traceback():
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "yfpp.cli", "run", "-q", PAIR, "-i", "-", "--format", "jsonl", "--stats"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=ROOT,
                            preexec_fn=default_sigint)
    try:
        proc.stdin.write(b'{"type": "a", "ts": 1, "k": 1}\nnot json\n')
        proc.stdin.flush()
        # the dead letter on stderr shows the process is inside the input loop, waiting for more
        ready, _, _ = select.select([proc.stderr], [], [], 60)
        assert ready, "yfpp run did not start reading"
        time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    text = err.decode()
    assert proc.returncode == 130 and "Traceback" not in text
    assert "events            1" in text and "yfpp: interrupted" in text
