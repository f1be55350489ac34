"""Registration time of very long queries (issue 8 item 6): parsing and compiling are linear.

Prints CPU seconds for ``Engine().register`` of queries with n = 2,500, 5,000
and 10,000 components in four shapes, and checks that n = 10,001 is refused
by the documented cap (yfpp.language.query_limits.MAX_COMPONENTS).

    python benchmarks/long_query_benchmark.py [--sizes 2500 5000 10000]
"""

from __future__ import annotations

import argparse
import sys
import time

from bench_common import commit
from yfpp.engine import Engine
from yfpp.errors import PatternError
from yfpp.language.query_limits import MAX_COMPONENTS


def plain_sase(n: int) -> str:
    return "PATTERN SEQ(" + ", ".join(f"A a{i}" for i in range(n)) + ")"


def plain_xpath(n: int) -> str:
    return "//A" * n


def rich_sase(n: int) -> str:
    """Every third component a negation; a predicate between consecutive positives; key and window."""
    comps = [f"~B n{i}" if i % 3 == 1 else f"A a{i}" for i in range(n)]
    pos = [c.split()[1] for c in comps if not c.startswith("~")]
    preds = " AND ".join(f"{b}.x > {a}.x" for a, b in zip(pos, pos[1:]))
    return "PATTERN SEQ(" + ", ".join(comps) + ") WHERE [k] AND " + preds + " WITHIN 100"


def rich_xpath(n: int) -> str:
    """Every third step a negation, an XPath predicate on every other step; key and window."""
    return "[k]" + "".join("//!B" if i % 3 == 1 else f"//A[@x > {i}]" for i in range(n)) + "(100)"


SHAPES = {"SASE+ plain": plain_sase, "XPath plain": plain_xpath, "SASE+ rich": rich_sase, "XPath rich": rich_xpath}


def register_seconds(text: str) -> float:
    engine = Engine()
    t0 = time.process_time()
    engine.register(text)
    return time.process_time() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[2500, 5000, 10000])
    args = ap.parse_args()
    print(f"yfpp commit: {commit()} (working tree may differ); python {sys.version.split()[0]}")
    print(f"{'shape':<12} {'components':>10} {'chars':>9} {'register (CPU s)':>17}")
    for label, make in SHAPES.items():
        for n in args.sizes:
            text = make(n)
            print(f"{label:<12} {n:>10,} {len(text):>9,} {register_seconds(text):>17.2f}")
    try:
        register_seconds(plain_sase(MAX_COMPONENTS + 1))
    except PatternError as err:
        print(f"{MAX_COMPONENTS + 1:,} components: refused ({err.message})")
        return 0
    print(f"{MAX_COMPONENTS + 1:,} components: NOT refused")
    return 1


if __name__ == "__main__":
    sys.exit(main())
