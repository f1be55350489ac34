"""A service's periodic checkpoint: written whole, against written against a base (the queries once, then what
changed; ``yfpp.state.query_base``).

An engine with ``--subs`` subscriptions of the service benchmark's query (one shape, a constant each) and, with
``--runs R``, one more query holding R partial matches; the service's own take and write
(``yfpp.service.checkpoint.take``, ``Staged.write``, ``Staged.commit``), each kind in turn ``--rounds`` times in
this process. Printed per kind: the CPU seconds of the take (what the service's engine thread gives), of the
write (its checkpoint thread), and the bytes written. "against a base" is a periodic checkpoint with nothing
registered since the base (the first checkpoint after a start writes the base: its cost is printed apart).

    python benchmarks/checkpoint_base_benchmark.py --subs 100000
    python benchmarks/checkpoint_base_benchmark.py --subs 100000 --runs 240000
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from yfpp.engine import Engine
from yfpp.input.events import Event
from yfpp.service import checkpoint
from yfpp.state.checkpoint import EncodedPatterns
from yfpp.state.query_base import QueryBase

QUERY = ("PATTERN SEQ(shelf a, exit c) WHERE skip_till_any_match(a, c) "
         "{{ [tag_id] AND a.zone = 'Z{k}' AND c.door = 'D{k}' }} WITHIN 1 hour")
RUNS = "PATTERN SEQ(a x, b y) WHERE skip_till_any_match(x, y) { [id] } WITHIN 1000 hours"


def engine(subs: int, runs: int) -> tuple[Engine, dict]:
    """The engine, and the service field's sources by name (one object each, as the service keeps them)."""
    eng = Engine()
    eng.register_many([(QUERY.format(k=k), f"q{k}") for k in range(subs)])
    eng.register(RUNS, name="runs")
    for i in range(runs):
        eng.process(Event("a", float(i), {"id": i}))
    return eng, {f"q{k}": [None, None, None] for k in range(subs)}


def checkpointed(eng: Engine, path: Path, sources: dict, patterns: EncodedPatterns,
                 base: QueryBase | None) -> tuple[float, float, int]:
    """One checkpoint: the take's CPU seconds, the write's (and commit's), the bytes of the checkpoint file."""
    c0 = time.thread_time()
    staged = checkpoint.take(eng, path, lambda: {"window_unit": None, "workers": 1, "queries": sources}, patterns,
                             base)
    c1 = time.thread_time()
    staged.write()
    staged.commit()
    c2 = time.thread_time()
    return c1 - c0, c2 - c1, path.stat().st_size


def commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=Path(__file__).parent).stdout.strip() or "?"
    except OSError:
        return "?"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--subs", type=int, default=100_000)
    ap.add_argument("--runs", type=int, default=0)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    eng, sources = engine(args.subs, args.runs)
    patterns = EncodedPatterns()
    figures: dict[str, list[tuple[float, float, int]]] = {"whole": [], "against a base": []}
    with tempfile.TemporaryDirectory() as whole_dir, tempfile.TemporaryDirectory() as base_dir:
        whole_path, base_path = Path(whole_dir) / "engine-checkpoint.json", Path(base_dir) / "engine-checkpoint.json"
        base = QueryBase(base_path)
        first = checkpointed(eng, base_path, sources, patterns, base)  # (the base written)
        base_bytes = sum(p.stat().st_size for p in base_path.parent.iterdir()) - first[2]
        for _ in range(args.rounds):
            figures["whole"].append(checkpointed(eng, whole_path, sources, patterns, None))
            figures["against a base"].append(checkpointed(eng, base_path, sources, patterns, base))
    print(f"commit {commit()}  {args.subs:,} subscriptions, {eng.stats.live_runs:,} runs, {args.rounds} rounds "
          f"(median; min-max)")
    print(f"{'first, base written':<22} take {first[0]:.3f} s CPU, write {first[1]:.3f} s CPU, "
          f"checkpoint {first[2] / 1e6:.2f} MB + base {base_bytes / 1e6:.2f} MB")
    for kind, rows in figures.items():
        take, write = [r[0] for r in rows], [r[1] for r in rows]
        print(f"{kind:<22} take {statistics.median(take):.3f} s CPU ({min(take):.3f}-{max(take):.3f}), "
              f"write {statistics.median(write):.3f} s CPU ({min(write):.3f}-{max(write):.3f}), "
              f"checkpoint {rows[-1][2] / 1e6:.2f} MB")


if __name__ == "__main__":
    main()
