"""What one registration costs, counted in instructions (deterministic where CPU times on a shared host are not).

Makes the texts of 50 + N subscriptions of a kind of ``million_subscriptions.py``, registers the first 50 through
``Engine.register_many``, then the N others (``batch``: ``register_many``; ``one``: ``Engine.register`` one at a
time; ``none``: not at all).  Run it under ``valgrind --tool=callgrind`` with N and ``batch`` or ``one``, then with
the same N and ``none``: the difference of the two totals over N is the instructions of one registration, freeing
what it made at exit included (the texts are made in both runs)::

    PYTHONHASHSEED=0 valgrind --tool=callgrind python benchmarks/register_instructions.py a-xpath 5000 batch
    PYTHONHASHSEED=0 valgrind --tool=callgrind python benchmarks/register_instructions.py a-xpath 5000 none
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from million_subscriptions import KINDS, distinct, query

from yfpp.engine import Engine


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("kind", choices=KINDS)
    ap.add_argument("n", type=int, help="subscriptions registered after the first 50")
    ap.add_argument("mode", choices=("batch", "one", "none"))
    args = ap.parse_args()
    total = 50 + args.n
    m = distinct(args.kind, total)
    texts = [query(args.kind, k, m) for k in range(total)]
    eng = Engine(reports=None)
    eng.register_many([(t, None) for t in texts[:50]])
    if args.mode == "batch":
        eng.register_many([(t, None) for t in texts[50:]])
    elif args.mode == "one":
        for t in texts[50:]:
            eng.register(t)


if __name__ == "__main__":
    main()
