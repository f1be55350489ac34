"""CPU seconds of ``yfpp run`` over a feed holding one hostile record, for several shapes of record.

Usage::

    python benchmarks/hostile_records.py [--size 1000000] [--rounds 2] [--baseline REV]

Each feed is two good events with one record of about ``--size`` bytes between them (a long tag name, a
long attribute name, a quarter of a million attributes, a megabyte of spaces…; for JSON lines a long
string, deep nesting, a long number, a line with no end).  Each measurement is a whole process,
``python -m yfpp run -q QUERY -i FEED``, timed as child CPU seconds; what it prints (matches and dead
letters) is checked to be the same for both trees.  One bad record should cost about what reading as
many bytes of good events costs (``yfpp run`` reads about 15 MB of the RFID feed per CPU-second):
anything far above that is work repeated over the record at every read.
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parent.parent)]

from bench_common import ROOT  # noqa: E402
from hotpath_benchmark import bytecode_env, extract, table  # noqa: E402


def xml_shapes(n: int) -> dict[str, bytes]:
    return {
        "tag name": b"<" + b"a" * n + b' ts="2"/>',
        "attribute name": b"<e " + b"a" * n + b'="1" ts="2"/>',
        "attribute value": b'<e a="' + b"v" * n + b'" ts="2"/>',
        "unclosed value": b'<e a="' + b"v" * n,
        "many attributes": b"<e" + b"".join(b' a%d="1"' % i for i in range(n // 8)) + b' ts="2"/>',
        "spaces in a tag": b"<e" + b" " * n + b'ts="2"/>',
        "end tag name": b'<e ts="2"></' + b"a" * n + b">",
        "deep nesting": b'<e ts="2">' + b"<c>" * (n // 3) + b"</e>",
        "children": b'<e ts="2">' + b"<c/>" * (n // 4) + b"</e>",
        "stray end tags (n/4 dead letters)": b"</x>" * (n // 4),
        "lone < (n dead letters)": b"<" * n,
        "events on one line (n/11)": b'<e ts="2"/>' * (n // 11),
    }


def jsonl_shapes(n: int) -> dict[str, bytes]:
    return {
        "long string": b'{"type": "e", "ts": 2, "a": "' + b"v" * n + b'"}',
        "deep nesting": b'{"type": "e", "ts": 2, "a": ' + b"[" * (n // 2) + b"]" * (n // 2) + b"}",
        "long number": b'{"type": "e", "ts": 2, "a": ' + b"9" * n + b"}",
        "unclosed string": b'{"type": "e", "ts": 2, "a": "' + b"v" * n,
    }


def feed(directory: Path, fmt: str, name: str, record: bytes) -> Path:
    if fmt == "xml":
        data = b'<feed>\n<e type="x" ts="1"/>\n' + record + b'\n<e type="x" ts="3"/>\n</feed>\n'
    else:
        data = b'{"type": "e", "ts": 1}\n' + record + b'\n{"type": "e", "ts": 3}\n'
    path = directory / f"{fmt}-{len(list(directory.iterdir()))}.{fmt if fmt == 'xml' else 'jsonl'}"
    path.write_bytes(data)
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", type=int, default=1_000_000, help="bytes of the hostile record (default 1,000,000)")
    ap.add_argument("--rounds", type=int, default=2, help="rounds, best kept (default 2)")
    ap.add_argument("--baseline", help="also run the tree of this git revision, alternating")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        trees = {"now": str(ROOT)}
        if args.baseline:
            (Path(tmp) / "baseline").mkdir()
            trees = {args.baseline: extract(args.baseline, str(Path(tmp) / "baseline")), **trees}
        rows = []
        for fmt, shapes in (("xml", xml_shapes(args.size)), ("jsonl", jsonl_shapes(args.size))):
            for name, record in shapes.items():
                path = feed(Path(tmp), fmt, name, record)
                cmd = [sys.executable, "-m", "yfpp", "run", "-q", "//e" if fmt == "xml" else
                       "PATTERN SEQ(e a) WHERE skip_till_next_match(a) {}", "-i", str(path), "--stats"]
                best: dict[str, float] = {}
                said: dict[str, str] = {}
                for r in range(args.rounds):
                    for label in (trees if r % 2 == 0 else reversed(trees)):
                        cpu, out, err = run(cmd, trees[label])
                        best[label] = min(best.get(label, cpu), cpu)
                        said[label] = out + _without_timing(err)
                if len(set(said.values())) > 1:
                    raise SystemExit(f"{fmt} {name}: the trees' outputs differ")
                rows.append([fmt, name, f"{len(record):,}"] + [f"{best[label]:.2f}" for label in trees])
        table(["feed", "record", "bytes"] + [f"{label} CPU s" for label in trees], rows)


def run(cmd: list[str], tree: str) -> tuple[float, str, str]:
    """Child CPU seconds (user + system), stdout and stderr of ``cmd`` run against ``tree``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run(cmd, cwd=tree, env={**bytecode_env(), "PYTHONPATH": tree}, capture_output=True, text=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode not in (0, 1):
        raise SystemExit(f"{' '.join(cmd[:4])} failed in {tree}:\n{proc.stderr[-2000:]}")
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), proc.stdout, proc.stderr


def _without_timing(stderr: str) -> str:
    """``--stats`` lines without the ones that report time (they differ from run to run)."""
    return "\n".join(line for line in stderr.splitlines() if not line.startswith(("elapsed", "events/s")))


if __name__ == "__main__":
    main()
