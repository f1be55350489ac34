"""Before/after on the hot path: ``yfpp run`` of a baseline commit against the working tree, alternating.

Usage::

    python benchmarks/hotpath_benchmark.py [--baseline 61cedf2] [--events 1000000] [--rounds 3]

The baseline commit is extracted with ``git archive`` into a temporary directory; each measurement is a
whole process, ``python -m yfpp run -q queries/shoplifting.sase -i FEED`` with ``PYTHONPATH`` pointing at
one tree and its output to /dev/null, timed as child CPU seconds (``resource.getrusage(RUSAGE_CHILDREN)``
before and after, user + system).  The two trees alternate within each round (the order flips every
round) so both see the same machine load; the figure kept is each one's best round.  Every child runs as
an installed yfpp does, with its bytecode cached: each tree is byte-compiled before the first measurement
(``compileall``, as ``pip install`` does) and ``PYTHONDONTWRITEBYTECODE`` is not passed on.

Feeds: ``generate_rfid(EVENTS, seed=1)`` as JSON lines and as XML, written once to ``benchmarks/data/``
(git-ignored).  Printed beside them:

* parse only — the CPU of a process that parses the same file and nothing else: lxml ``iterparse``
  (each element cleared) for XML, ``orjson.loads`` per line for JSON lines; the yfpp / parse ratio;
* parse and read — for XML, the same ``iterparse`` that also reads each element's tag and attributes into
  a dict (what ``orjson.loads`` gives for a JSON line, the data of each record in Python); the yfpp / parse
  and read ratio.  Issue 12 gives "today about 7–8" for the XML ratio of its commit, 61cedf2: this baseline
  gives about 9 for it, the bare parse about 15;
* reader only — the CPU of a process that reads the file with each tree's ``read_event_batches`` and
  does nothing with the events (the whole process: start-up and imports included, like parse only);
* engine only — µs per event of ``Engine.process`` over pre-built events (read before timing) for a
  query that never matches (shoplifting with a zone no event has), and for shoplifting itself;
* the outputs of both trees compared byte for byte (``--no-check`` skips it);
* with ``--instructions``, for XML: instructions per event (callgrind) of the whole ``yfpp run`` of each tree,
  of parse only and of parse and read — each process on a 150,000-event feed minus the same on a 50,000-event
  one, divided by the 100,000 events between: start-up cancels out, and the figures do not move with the
  machine's load (CPU seconds on a shared machine do).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import resource
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parent.parent)]

from bench_common import ROOT, callgrind_instructions, commit  # noqa: E402

DATA = ROOT / "benchmarks" / "data"
QUERY = "queries/shoplifting.sase"
NEVER = ("PATTERN SEQ(shelf a, ~register b, exit c) WHERE skip_till_next_match(a, b, c) "
         "{ [tag_id] AND a.zone = 'nowhere' } WITHIN 12 hours")
PARSE_ONLY = {
    "xml": "from lxml import etree\n"
           "for _, el in etree.iterparse(PATH, events=('end',)):\n"
           "    el.clear()\n"
           "    while el.getprevious() is not None:\n"
           "        del el.getparent()[0]\n",
    "jsonl": "import orjson\n"
             "with open(PATH, 'rb') as f:\n"
             "    for line in f:\n"
             "        orjson.loads(line)\n",
}
PARSE_AND_READ_XML = ("from lxml import etree\n"
                      "for _, el in etree.iterparse(PATH, events=('end',)):\n"
                      "    el.tag, dict(el.attrib)\n"
                      "    el.clear()\n"
                      "    while el.getprevious() is not None:\n"
                      "        del el.getparent()[0]\n")
READERS = ("import os, yfpp\n"  # (by the tree's own folders: an installed yfpp may answer an import the tree lacks)
           "if os.path.isdir(os.path.join(os.path.dirname(yfpp.__file__), 'input')):\n"
           "    from yfpp.input import readers\n"
           "else:  # a tree before the layered layout\n"
           "    from yfpp import readers\n")
READER_ONLY = ("import gc, sys\n" + READERS +
               "read_event_batches = getattr(readers, 'read_event_batches', readers.read_events)"
               "  # a tree before the batch API: its event generator\n"
               "gc.freeze()\n"
               "gc.set_threshold(100_000, 50, 100)  # as yfpp run\n"
               "for batch in read_event_batches(sys.argv[1]):\n"
               "    pass\n")
ENGINE_ONLY = READERS + """
import itertools, sys, time
from yfpp.engine import Engine
read_events = readers.read_events
path, n, query = sys.argv[1], int(sys.argv[2]), sys.argv[3]
if query.endswith('.sase'):
    query = ''.join(line for line in open(query) if not line.startswith('#'))
events = list(itertools.islice(read_events(path), n))
eng = Engine()
eng.register(query, name='q')
t0 = time.process_time()
matches = sum(len(eng.process(ev)) for ev in events) + len(eng.flush())
print(time.process_time() - t0, len(events), matches)
"""


def feed(events: int, fmt: str) -> Path:
    """The benchmark feed, generated once."""
    path = DATA / f"shoplifting_{events}.{fmt}"
    if not path.exists():
        from yfpp.input.generate import generate_rfid, write_events

        DATA.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp.{fmt}")
        write_events(generate_rfid(events, seed=1), tmp, fmt)
        tmp.rename(path)
    return path


def extract(rev: str, into: str) -> str:
    """The tree of ``rev`` (package and queries) under ``into``."""
    archive = subprocess.run(["git", "archive", "--format=tar", rev, "yfpp", "xpath_ext", "queries"],
                             cwd=ROOT, check=True, capture_output=True).stdout
    tar_path = Path(into) / "tree.tar"
    tar_path.write_bytes(archive)
    with tarfile.open(tar_path) as tar:
        tar.extractall(into, filter="data")
    tar_path.unlink()
    return into


def bytecode_env() -> dict[str, str]:
    """This process's environment without ``PYTHONDONTWRITEBYTECODE``: children use (and write) cached bytecode."""
    return {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def child_cpu(cmd: list[str], tree: str, stdout=subprocess.DEVNULL) -> tuple[float, str]:
    """CPU seconds (user + system) of the child process running ``cmd`` against ``tree``; its stdout if piped."""
    env = {**bytecode_env(), "PYTHONPATH": tree}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run(cmd, cwd=tree, env=env, stdout=stdout, stderr=subprocess.PIPE, text=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed in {tree}:\n{proc.stderr}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return cpu, proc.stdout if stdout is subprocess.PIPE else ""


def run_cmd(path: Path) -> list[str]:
    return [sys.executable, "-m", "yfpp", "run", "-q", QUERY, "-i", str(path)]


def output_digest(path: Path, tree: str) -> tuple[str, int]:
    """SHA-256 and line count of ``yfpp run``'s output in ``tree``."""
    with tempfile.TemporaryFile() as out:
        child_cpu(run_cmd(path), tree, stdout=out)
        out.seek(0)
        h, n = hashlib.sha256(), 0
        for line in out:
            h.update(line)
            n += 1
    return h.hexdigest()[:16], n


def engine_only(path: Path, tree: str, events: int, query: str) -> float:
    """µs per event of ``Engine.process`` in ``tree`` over ``events`` pre-read events."""
    _, out = child_cpu([sys.executable, "-c", ENGINE_ONLY, str(path), str(events), query], tree, stdout=subprocess.PIPE)
    cpu, n, _ = out.split()
    return float(cpu) / int(n) * 1e6


def instructions_per_event(args_for, tree: str, pythonpath: str) -> float:
    """Instructions per event of ``python ARGS`` (``args_for(feed)``): on the 150,000-event XML feed minus on the
    50,000-event one, over the 100,000 events between."""
    small, large = (callgrind_instructions(args_for(feed(n, "xml")), tree, pythonpath) for n in (50_000, 150_000))
    return (large - small) / 100_000


def instruction_table(trees: dict[str, str]) -> None:
    """Instructions per event of each tree's ``yfpp run`` and of the two XML parse baselines, and their ratios."""
    parse = {name: instructions_per_event(lambda path, code=code: ["-c", f"PATH = {str(path)!r}\n" + code],
                                          str(ROOT), str(ROOT))
             for name, code in (("parse only", PARSE_ONLY["xml"]), ("parse and read", PARSE_AND_READ_XML))}
    runs = {label: instructions_per_event(lambda path: run_cmd(path)[1:], tree, tree) for label, tree in trees.items()}
    print()
    print("XML, instructions per event (callgrind, 150,000-event feed minus 50,000-event feed):")
    table(["process", "instructions / event", "/ parse only", "/ parse and read"],
          [[name, f"{n:,.0f}", f"{n / parse['parse only']:.2f}", f"{n / parse['parse and read']:.2f}"]
           for name, n in [*parse.items(), *((f"yfpp run, {label}", n) for label, n in runs.items())]])


def table(header: list[str], rows: list[list[str]]) -> None:
    """Print a Markdown table after a blank line."""
    print()
    for cells in [header, ["---"] * len(header), *rows]:
        print("| " + " | ".join(cells) + " |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--baseline", default="61cedf2", help="git revision to compare with (default 61cedf2)")
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--formats", nargs="+", default=["jsonl", "xml"], choices=["jsonl", "xml"])
    ap.add_argument("--engine-events", type=int, default=200_000, help="events of the engine-only loop")
    ap.add_argument("--no-check", action="store_true", help="skip comparing the two trees' outputs")
    ap.add_argument("--instructions", action="store_true", help="also count instructions per XML event (valgrind)")
    args = ap.parse_args()
    feeds = {fmt: feed(args.events, fmt) for fmt in args.formats}
    with tempfile.TemporaryDirectory(prefix="yfpp-baseline-") as tmp:
        trees = {args.baseline: extract(args.baseline, tmp), f"now ({commit()}+wt)": str(ROOT)}
        labels = list(trees)
        for tree in trees.values():  # bytecode cached, as installed
            subprocess.run([sys.executable, "-m", "compileall", "-q", "yfpp", "xpath_ext"], cwd=tree, check=True,
                           env=bytecode_env())
        print(f"baseline {args.baseline}, working tree at {commit()}; {args.events:,} events; "
              f"{args.rounds} rounds, best round kept; CPU seconds of the whole process")
        if not args.no_check:
            for fmt, path in feeds.items():
                digests = {label: output_digest(path, tree) for label, tree in trees.items()}
                same = len(set(digests.values())) == 1
                print(f"output {fmt}: " + ", ".join(f"{label} {d} ({n:,} lines)" for label, (d, n) in digests.items())
                      + (" — identical" if same else " — DIFFERENT"))
        best: dict[tuple[str, str], float] = {}
        reader: dict[tuple[str, str], float] = {}
        parse: dict[str, float] = {}
        parse_read: dict[str, float] = {}
        for rnd in range(args.rounds):
            order = labels if rnd % 2 == 0 else labels[::-1]
            for fmt, path in feeds.items():
                for label in order:
                    cpu, _ = child_cpu(run_cmd(path), trees[label])
                    best[label, fmt] = min(cpu, best.get((label, fmt), cpu))
                    read_cpu, _ = child_cpu([sys.executable, "-c", READER_ONLY, str(path)], trees[label])
                    reader[label, fmt] = min(read_cpu, reader.get((label, fmt), read_cpu))
                    print(f"  round {rnd + 1} {fmt:<5} {label:<22} {cpu:7.2f} s   reader only {read_cpu:6.2f} s", flush=True)
                cpu, _ = child_cpu([sys.executable, "-c", f"PATH = {str(path)!r}\n" + PARSE_ONLY[fmt]], str(ROOT))
                parse[fmt] = min(cpu, parse.get(fmt, cpu))
                if fmt == "xml":
                    cpu, _ = child_cpu([sys.executable, "-c", f"PATH = {str(path)!r}\n" + PARSE_AND_READ_XML], str(ROOT))
                parse_read[fmt] = min(cpu, parse_read.get(fmt, cpu))  # (JSON lines: orjson.loads reads the data)
        a, b = labels
        table(["feed", f"{a} CPU s", "ev/CPU-s", f"{b} CPU s", "ev/CPU-s", "speed-up", "parse only CPU s",
               f"{a} / parse", f"{b} / parse", "parse and read CPU s", f"{a} / parse and read",
               f"{b} / parse and read"],
              [[fmt, f"{old:.2f}", f"{args.events / old:,.0f}", f"{new:.2f}", f"{args.events / new:,.0f}",
                f"{old / new:.2f}×", f"{parse[fmt]:.2f}", f"{old / parse[fmt]:.2f}", f"{new / parse[fmt]:.2f}",
                f"{parse_read[fmt]:.2f}", f"{old / parse_read[fmt]:.2f}", f"{new / parse_read[fmt]:.2f}"]
               for fmt in feeds for old, new in [(best[a, fmt], best[b, fmt])]])
        table(["feed", f"{a} reader only CPU s", f"{b} reader only CPU s", "parse only CPU s",
               f"{a} reader / parse", f"{b} reader / parse"],
              [[fmt, f"{old:.2f}", f"{new:.2f}", f"{parse[fmt]:.2f}", f"{old / parse[fmt]:.2f}", f"{new / parse[fmt]:.2f}"]
               for fmt in feeds for old, new in [(reader[a, fmt], reader[b, fmt])]])
        path = feeds.get("jsonl") or next(iter(feeds.values()))
        print()
        print(f"engine only, µs/event over {args.engine_events:,} pre-read events (best of {args.rounds}):")
        for what, query in (("never matches", NEVER), ("shoplifting", QUERY)):
            figures: dict[str, float] = {}
            for rnd in range(args.rounds):
                for label in (labels if rnd % 2 == 0 else labels[::-1]):
                    us = engine_only(path, trees[label], args.engine_events, query)
                    figures[label] = min(us, figures.get(label, us))
            print(f"  {what:<14} " + "  ".join(f"{label}: {us:.2f}" for label, us in figures.items()))
        if args.instructions:
            instruction_table(trees)


if __name__ == "__main__":
    main()
