"""Each feed shape sensors write, read by yfpp and by the bare parser, side by side: the ratio to the parse floor.

Usage: ``python benchmarks/reader_shapes.py [--events N] [--rounds R] [--shapes NAME …] [--write DIR]``. For each shape it
writes a feed of N events (default 200,000) to a temporary folder and, alternating, R rounds (default 3) of:

* yfpp — ``read_event_batches`` over the file, every event made (the reader's whole cost, no engine);
* parse floor — for XML lxml's ``iterparse`` of the same bytes, each element cleared (a bare parse: no Python
  work per element beyond lxml's loop); for JSON lines ``orjson.loads`` of each line.

It prints the best (least CPU, ``time.process_time``) of each and their ratio. The shapes: integer ts first;
``seq`` before ``ts``; decimal seconds; ISO-8601 ts (``ts_unit="iso"``); a default namespace declared on the
root; readings as child elements; JSON lines. Targets: each XML shape ≤ 2.5× lxml, JSON lines ≤ 4×.
"""

from __future__ import annotations

import argparse
import gc
import sys
import tempfile
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Callable

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parent.parent)]

import orjson  # noqa: E402
from lxml import etree  # noqa: E402

from bench_common import commit  # noqa: E402
from yfpp.input.dead_letters import DeadLetters  # noqa: E402
from yfpp.input.readers import read_event_batches  # noqa: E402

_START = datetime(2026, 11, 22, 10, 0, tzinfo=timezone.utc)


def _row(i: int) -> tuple[str, int, int, str, int]:
    """The i-th event's type, ts in ms, tag id, zone and reading (deterministic, RFID-like)."""
    return ("shelf" if i % 3 else "exit"), 1000 * i + (i * 7919) % 1000, (i * 31) % 5000, f"Z{i % 7}", (i * 13) % 400


def _iso(ms: int) -> str:
    return (_START + timedelta(milliseconds=ms)).isoformat(timespec="milliseconds").replace("+00:00", "Z")


#: shape name → (format, ts_unit, root start tag or None, the text of event i)
SHAPES: dict[str, tuple[str, str, str | None, Callable[[int], str]]] = {
    "ts first": ("xml", "s", "<stream>", lambda i: '<{0} ts="{1}" tag_id="{2}" zone="{3}"/>'.format(*_row(i)[:4])),
    "seq before ts": ("xml", "s", "<stream>",
                      lambda i: '<{0} seq="{5}" ts="{1}" tag_id="{2}" zone="{3}"/>'.format(*_row(i)[:4], 0, i)),
    "decimal ts": ("xml", "s", "<stream>",
                   lambda i: '<{0} ts="{1:.3f}" tag_id="{2}" zone="{3}"/>'.format(_row(i)[0], _row(i)[1] / 1000, *_row(i)[2:4])),
    "ISO-8601 ts": ("xml", "iso", "<stream>",
                    lambda i: '<{0} ts="{1}" tag_id="{2}" zone="{3}"/>'.format(_row(i)[0], _iso(_row(i)[1]), *_row(i)[2:4])),
    "namespace": ("xml", "s", '<stream xmlns="urn:example:sensors">',
                  lambda i: '<{0} ts="{1}" tag_id="{2}" zone="{3}"/>'.format(*_row(i)[:4])),
    "child readings": ("xml", "s", "<stream>",
                       lambda i: "<reading><ts>{0:.3f}</ts><sensor>T{1}</sensor><celsius>{2:.1f}</celsius></reading>"
                       .format(_row(i)[1] / 1000, _row(i)[2] % 50, _row(i)[4] / 10)),
    "JSON lines": ("jsonl", "s", None,
                   lambda i: '{{"type":"{0}","ts":{1},"tag_id":{2},"zone":"{3}"}}'.format(*_row(i)[:4])),
}


def write_feed(shape: str, events: int, folder: Path) -> Path:
    fmt, _, root, line = SHAPES[shape]
    path = folder / (shape.replace(" ", "_") + "." + fmt)
    with open(path, "w", encoding="utf-8") as f:
        if root is not None:
            f.write('<?xml version="1.0" encoding="UTF-8"?>\n' + root + "\n")
        for i in range(events):
            f.write(("  " if root else "") + line(i) + "\n")
        if root is not None:
            f.write("</stream>\n")
    return path


def yfpp_read(path: Path, fmt: str, unit: str) -> tuple[int, int]:
    """(events, dead letters) of one read."""
    dead = DeadLetters()
    return sum(map(len, read_event_batches(str(path), fmt, ts_unit=unit, dead_letters=dead))), dead.count


def floor_read(path: Path, fmt: str) -> tuple[int, int]:
    """The bare parse: (records, 0)."""
    n = 0
    if fmt == "jsonl":
        with open(path, "rb") as f:
            for line in f:
                orjson.loads(line)
                n += 1
        return n, 0
    for _, el in etree.iterparse(str(path), events=("end",)):
        el.clear()
        while el.getprevious() is not None:
            del el.getparent()[0]
        n += 1
    return n, 0


def cpu(fn: Callable[[], tuple[int, int]]) -> tuple[float, tuple[int, int]]:
    gc.collect()
    t0 = time.process_time()
    result = fn()
    return time.process_time() - t0, result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--events", type=int, default=200_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--shapes", nargs="+", choices=list(SHAPES), default=list(SHAPES), metavar="SHAPE")
    ap.add_argument("--write", metavar="DIR", help="only write the feeds into DIR (for timing whole processes)")
    args = ap.parse_args()
    if args.write:
        for shape in args.shapes:
            print(write_feed(shape, args.events, Path(args.write)))
        return
    print(f"commit {commit()}, {args.events:,} events, best of {args.rounds} rounds (CPU s)")
    print("| shape | yfpp CPU s | µs/event | parse floor CPU s | yfpp / floor | events | dead letters |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as tmp:
        for shape in args.shapes:
            fmt, unit, _, _ = SHAPES[shape]
            path = write_feed(shape, args.events, Path(tmp))
            ours, floor = [], []
            for _ in range(args.rounds):
                ours.append(cpu(lambda: yfpp_read(path, fmt, unit)))
                floor.append(cpu(lambda: floor_read(path, fmt)))
            (t, (n, dead)), (f, _) = min(ours), min(floor)
            print(f"| {shape} | {t:.3f} | {t / max(n, 1) * 1e6:.2f} | {f:.3f} | **{t / f:.2f}** | {n:,} | {dead} |",
                  flush=True)
            path.unlink()


if __name__ == "__main__":
    main()
