"""Hot keys on ``yfpp spark`` (scan or shuffle plan): the matching tasks' CPU seconds with ``--hot-keys off`` and ``auto``.

The feed: shelf, register and exit reads, one a second, of 200 tags, tag ``H`` in half of them (JSON lines,
written once under the temp directory). The queries: three keyed by ``tag_id`` (window 60 s). Each run is
``python -m yfpp spark --master local[2] --partitions P --stats`` in a subprocess; the figures are the
``--stats`` lines (each task's Python CPU seconds, the spread, the hot keys) and the matches, compared
between the two runs and with ``yfpp run``.

``--stream M``: the same feed (and a heartbeat after it) as a directory stream of M files, one per
micro-batch (``yfpp spark --stream --max-files 1 --stats``, ``spark.sql.shuffle.partitions`` P): per
mode, the matching query's stages that ran more than a tenth of a second — their tasks' run seconds
and the longest task against the mean (``max/mean run``) — and the matches against ``yfpp run``.
``--live``: the M parts sent by a TCP server on loopback instead, a few seconds apart
(``yfpp spark --stream -i tcp://…``).

    python benchmarks/spark_hot_keys.py                              # 200k events, 4 tasks
    python benchmarks/spark_hot_keys.py --events 50000 --partitions 2
    python benchmarks/spark_hot_keys.py --plan shuffle               # hot keys of the whole input, by Spark
    python benchmarks/spark_hot_keys.py --events 20000 --stream 4
    python benchmarks/spark_hot_keys.py --events 20000 --stream 4 --live
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
QUERIES = ["PATTERN SEQ(shelf a, ~register b, exit c) WHERE [tag_id] WITHIN 60",
           "PATTERN SEQ(shelf a, ~exit b) WHERE [tag_id] WITHIN 30",
           "PATTERN SEQ(shelf a, shelf+ b[], exit c) WHERE [tag_id] WITHIN 20"]


def feed(events: int, seed: int) -> Path:
    path = Path(tempfile.gettempdir()) / "yfpp_spark_bench" / f"hot_n{events}_s{seed}.jsonl"
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        rnd = random.Random(seed)
        with path.open("w") as f:
            for ts in range(events):
                tag = "H" if rnd.random() < 0.5 else f"T{rnd.randrange(200)}"
                f.write(json.dumps({"type": rnd.choice(["shelf", "shelf", "register", "exit"]), "ts": ts,
                                    "tag_id": tag}) + "\n")
    return path


def matches(folder: Path) -> Counter:
    return Counter(ln for f in sorted((folder / "matches.jsonl").glob("part-*")) for ln in f.read_text().splitlines())


def run_matches(path: Path, qs: list[str], env: dict) -> Counter:
    """``yfpp run``'s match lines over ``path``."""
    run = subprocess.run([sys.executable, "-m", "yfpp", "run", *qs, "-i", str(path)], env=env, capture_output=True,
                         text=True, check=True)
    return Counter(run.stdout.splitlines())


def serve(parts: list[str], pause: float) -> tuple[socket.socket, threading.Thread]:
    """A loopback TCP server sending ``parts`` to its first connection, ``pause`` seconds apart."""
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(600)

    def run() -> None:
        try:
            conn, _ = server.accept()
        except OSError:  # closed, or no connection in time
            return
        with conn:
            for part in parts:
                conn.sendall(part.encode())
                time.sleep(pause)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return server, thread


def stream(path: Path, files: int, partitions: int, qs: list[str], env: dict, live: bool = False) -> None:
    """The feed as a directory stream of ``files`` micro-batches (``live``: a TCP feed in as many parts), with
    ``--hot-keys off`` and ``auto``."""
    lines = path.read_text().splitlines()
    lines.append(json.dumps({"type": "heartbeat", "ts": len(lines) + 10**6, "tag_id": "beat"}))  # (keyed: see the test)
    with tempfile.TemporaryDirectory() as tmp:
        whole = Path(tmp) / "all.jsonl"
        whole.write_text("".join(ln + "\n" for ln in lines))
        want = run_matches(whole, qs, env)
        inbox = Path(tmp) / "inbox"
        inbox.mkdir()
        size = -(-len(lines) // files)
        parts = ["".join(ln + "\n" for ln in lines[n * size:(n + 1) * size]) for n in range(files)]
        for n, text in enumerate(parts):
            part = inbox / f"part-{n:03d}.jsonl"
            part.write_text(text)
            os.utime(part, (1e9 + n, 1e9 + n))
        print(f"{len(lines):,} events, tag H in half; {sum(want.values()):,} matches (yfpp run); local[2], "
              f"{'a TCP feed in' if live else 'stream of'} {files} {'parts' if live else 'files'}, "
              f"{partitions} shuffle partitions")
        for mode in ("off", "auto"):
            out = Path(tmp) / mode
            server = None
            if live:
                server, sender = serve(parts, 4.0)
                source = ["-i", f"tcp://127.0.0.1:{server.getsockname()[1]}", "--idle-stop", "8"]
            else:
                source = ["-i", str(inbox), "--max-files", "1", "--idle-stop", "2"]
            try:
                done = subprocess.run([sys.executable, "-m", "yfpp", "spark", "--stream", *qs, *source, "-o", str(out),
                                       "--master", "local[2]", "--stats",
                                       "--conf", f"spark.sql.shuffle.partitions={partitions}", "--hot-keys", mode],
                                      env=env, capture_output=True, text=True, check=False)
            finally:
                if server is not None:
                    server.close()
                    sender.join(10)
            if done.returncode:
                sys.exit(f"--hot-keys {mode}: {done.stderr.strip()[-2000:]}")
            section = done.stderr[done.stderr.index(" match:"):]
            stages = [ln.split() for ln in section.splitlines() if re.match(r"\s+\d+\s+\d+\s", ln)]
            busy = [(int(r[1]), float(r[6]), float(r[8])) for r in stages if float(r[6]) > 0.1]
            got = Counter(ln for f in sorted((out / "matches.jsonl").rglob("part-*")) if f.suffix != ".crc"
                          for ln in f.read_text().splitlines())
            print(f"--hot-keys {mode:<4}  stages (tasks, run s, max/mean run): "
                  f"{'; '.join(f'{t}, {r:.2f}, {m:.2f}' for t, r, m in busy)}  | "
                  f"matches {'= yfpp run' if got == want else 'DIFFER'}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--events", type=int, default=200_000)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--stream", type=int, metavar="M", help="a directory stream of M files instead of a batch job")
    ap.add_argument("--live", action="store_true", help="with --stream: the parts sent over TCP (-i tcp://…)")
    ap.add_argument("--plan", choices=["scan", "shuffle"], default="scan", help="the batch job's plan")
    args = ap.parse_args()
    path = feed(args.events, args.seed)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    qs = [a for q in QUERIES for a in ("-q", q)]
    if args.stream:
        stream(path, args.stream, args.partitions, qs, env, args.live)
        return
    want = run_matches(path, qs, env)
    print(f"{args.events:,} events, tag H in half; {sum(want.values()):,} matches (yfpp run); "
          f"local[2], --plan {args.plan}, {args.partitions} tasks")
    with tempfile.TemporaryDirectory() as tmp:
        for mode in ("off", "auto"):
            out = Path(tmp) / mode
            done = subprocess.run([sys.executable, "-m", "yfpp", "spark", *qs, "-i", str(path), "-o", str(out),
                                   "--master", "local[2]", "--plan", args.plan, "--partitions", str(args.partitions),
                                   "--stats", "--hot-keys", mode], env=env, capture_output=True, text=True, check=False)
            if done.returncode:
                sys.exit(f"--hot-keys {mode}: {done.stderr.strip()}")
            tasks = re.findall(r"^  task (\d+) +([\d,]+) rows +([\d,]+) engines +([\d.]+) s$", done.stderr, re.MULTILINE)
            spread = re.search(r"^task seconds .*$", done.stderr, re.MULTILINE)
            hot = re.search(r"^hot keys .*$", done.stderr, re.MULTILINE)
            same = matches(out) == want
            print(f"--hot-keys {mode:<4}  task CPU s: {', '.join(t[3] for t in tasks)}  rows: "
                  f"{', '.join(t[1] for t in tasks)}  | {spread[0] if spread else '?'} | {hot[0] if hot else '?'} | "
                  f"matches {'= yfpp run' if same else 'DIFFER'}")


if __name__ == "__main__":
    main()
