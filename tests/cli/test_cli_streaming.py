"""``yfpp run`` writes each match as it happens when reading a pipe (without PYTHONUNBUFFERED)."""

from __future__ import annotations

import json
import os
import selectors
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DEADLINE = 20.0  # seconds for the whole conversation; a match normally comes in milliseconds


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    env["PYTHONPATH"] = str(ROOT)
    return env


def _read_line(proc: subprocess.Popen, until: float) -> str:
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    try:
        if not sel.select(timeout=max(until - time.monotonic(), 0.01)):
            raise AssertionError("no match line before the next event was due")
        return proc.stdout.readline()
    finally:
        sel.close()


@pytest.mark.parametrize("fmt", ["jsonl", "xml"])
def test_slow_producer_sees_each_match_before_the_next_event(fmt):
    proc = subprocess.Popen(
        [sys.executable, "-m", "yfpp", "run", "-q", "PATTERN SEQ(a x, b y) WHERE [k]", "-i", "-", "--format", fmt],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=_env(), cwd=ROOT, text=True,
        bufsize=1,
    )
    until = time.monotonic() + DEADLINE
    try:
        for k in range(3):
            for etype, ts in (("a", 2 * k), ("b", 2 * k + 1)):
                line = f'{{"type": "{etype}", "ts": {ts}, "k": {k}}}' if fmt == "jsonl" else f'<{etype} ts="{ts}" k="{k}"/>'
                proc.stdin.write(line + "\n")
                proc.stdin.flush()
            match = json.loads(_read_line(proc, until))
            assert match["bindings"] == {"x": [2 * k], "y": [2 * k + 1]}
        proc.stdin.close()
        assert proc.wait(timeout=max(until - time.monotonic(), 1)) == 0
    finally:
        proc.kill()
        proc.wait()


def test_live_input_is_anything_but_a_regular_file(tmp_path):
    from yfpp.output.writer import is_live_input

    feed = tmp_path / "feed.jsonl"
    feed.write_text("")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    assert not is_live_input(str(feed))
    assert is_live_input(str(fifo)) and is_live_input(str(tmp_path))


def test_file_output_is_buffered_and_flushed_by_count_and_time(tmp_path, monkeypatch):
    from yfpp.output import writer as output

    clock = [100.0]
    monkeypatch.setattr(output.time, "monotonic", lambda: clock[0])
    path = tmp_path / "m.jsonl"
    writer = output.MatchWriter(str(path), live_input=False)
    match = {"query": "q", "bindings": {"x": [0]}, "start": 1.0, "end": 1.0}
    writer.write(match)
    assert path.read_text() == ""  # buffered
    clock[0] += output.FLUSH_SECONDS
    writer.write(match)
    assert len(path.read_text().splitlines()) == 2  # T passed
    for _ in range(output.FLUSH_LINES - 1):
        writer.write(match)
    assert len(path.read_text().splitlines()) < 2 + output.FLUSH_LINES  # the stream's own buffer may spill
    writer.write(match)
    assert len(path.read_text().splitlines()) == 2 + output.FLUSH_LINES  # N pending
    writer.close()
    live = output.MatchWriter(str(tmp_path / "live.jsonl"), live_input=True)
    live.write(match)
    assert (tmp_path / "live.jsonl").read_text().count("\n") == 1
    live.close()
