"""Workers that read a JSON-lines file themselves (yfpp/workers/reading.py, yfpp/input/jsonl_scan.py).

The scan is checked against the reader (every line the reader makes an event of has the scanned ts and
routing text), and whole runs against one engine reading the same bytes: the same matches, the same dead
letters (malformed lines, late events, each once with its seq and line) and the same count of events, on
generated patterns over files whose lines take many shapes (keys in any order, nested objects, escapes,
floats and booleans as keys, blank and broken lines, times going back), read in blocks of a few lines.
"""

from __future__ import annotations

import collections
import json
import math
import os
import queue
import random
import subprocess
import sys
import time
from collections import Counter

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import yfpp.workers.compiled
import yfpp.workers.reading
from yfpp.workers import prebuilt
from tests.cli.test_workers import Lines
from tests.generators import events_within_reach, patterns, streams
from yfpp.cli import main
from yfpp.engine import Engine
from yfpp.input.dead_letters import DeadLetters
from yfpp.errors import YfppError
from yfpp.input.jsonl_reader import LineBlocks, parse_block
from yfpp.input.jsonl_scan import key_values, scan_block
from yfpp.input.readers import read_event_batches, reading_options
from yfpp.workers.pool import Sequencer, Workers
from yfpp.spark import line_scan
from yfpp.spark.line_scan import LineSpec
from yfpp.spark.plan import value_hash
from yfpp.workers.reading import (Relay, Scan, Share, chunk_blocks, compiled_scan, compiled_spec, even_length, scan,
                                  workers_of)


class Letters(DeadLetters):
    """Dead letters kept as a multiset of (seq, position, reason, raw)."""

    def __init__(self) -> None:
        super().__init__()
        self.items: Counter = Counter()

    def report(self, seq: int, position: str, reason: str, raw: str | None = None) -> None:
        super().report(seq, position, reason, raw)
        self.items[(seq, position, reason, raw)] += 1


def line_of(rec: dict, style: int) -> str:
    """One record written in one of several shapes (all but the last few are what a sensor writes)."""
    if style == 0:
        return json.dumps(rec)
    if style == 1:  # keys in reverse order, no spaces
        return json.dumps(dict(reversed(list(rec.items()))), separators=(",", ":"))
    if style == 2:  # the key as a float or a boolean (equal in Python to the integer)
        k = rec.get("k")
        return json.dumps({**rec, "k": float(k) if type(k) is int and k else bool(k) if type(k) is int else k})
    if style == 3:  # a nested object holding the key's name
        return json.dumps({**rec, "n": {"k": 7, "ts": 1}})
    if style == 4:  # an escaped string
        return json.dumps({**rec, "s": 'a"b\\'})
    if style == 5:
        return json.dumps({**rec, "note": "k"})  # the key's name as a value
    if style == 6:
        return "{broken"
    if style == 7:
        return ""  # a blank line
    if style == 8:  # the plain shape, but no type: a dead letter the scan cannot tell
        return json.dumps({k: v for k, v in rec.items() if k != "type"})
    return json.dumps({**rec, "type": ""})  # likewise, an empty type




@st.composite
def feeds(draw, max_events: int = 40) -> str:
    """JSON lines of a generated stream, each line in a drawn shape (mostly plain), some swapped out of order."""
    events = draw(streams(max_events=max_events))
    styles = draw(st.lists(st.sampled_from([0, 0, 0, 0, 0, 1, 1, 2, 3, 4, 5, 6, 7, 8, 9]), min_size=len(events),
                           max_size=len(events)))
    lines = []
    for ev, style in zip(events, styles):
        rec = {"type": ev.type, "ts": ev.ts, **{k: v for k, v in ev.attrs.items()}}
        lines.append(line_of(rec, style))
    for i in draw(st.lists(st.integers(0, max(len(lines) - 2, 0)), max_size=3)):
        if len(lines) > 1:
            lines[i], lines[i + 1] = lines[i + 1], lines[i]
    return "".join(line + "\n" for line in lines)


@settings(max_examples=200, deadline=None)
@given(feeds(max_events=30))
def test_the_scan_agrees_with_the_reader(text):
    """Where a block is scanned, each line the reader takes has the scanned ts and key values."""
    body = text.encode()
    if not body:
        return
    opts = reading_options()
    scan = scan_block(body, opts, ["k", "x"])
    if scan is None:
        return
    ts, (ks, xs) = scan
    for j, line in enumerate(body.splitlines()):
        events, _, _ = parse_block(line, j, 0, opts, DeadLetters())
        for ev in events:
            assert ts[j] == ev.ts
            for scanned, parsed in ((ks[j], ev.attrs["k"]), (xs[j], ev.attrs["x"])):
                assert scanned == parsed and type(scanned) is type(parsed) and hash(scanned) == hash(parsed)


def test_a_scan_sends_each_lines_ts_and_worker_as_arrays():
    """A scan as a worker's peers receive it (pickled): the ts and each key's workers (its value's hash modulo n)."""
    import pickle

    body = b"".join(json.dumps({"type": "a", "ts": i / 2, "k": f"s{i % 5}"}).encode() + b"\n" for i in range(40))
    sent = pickle.loads(pickle.dumps(scan(body, reading_options(), ["k"], 3)))
    keys = [f"s{i % 5}" for i in range(40)]
    assert list(sent.ts) == [i / 2 for i in range(40)] and sent.last == (19.5, 39) and sent.flat
    assert list(sent.owners[0]) == [hash(k) % 3 for k in keys] == list(workers_of(keys, 3))


def test_a_plain_block_is_parsed_once_by_its_scanner():
    """A block of the plain shape: the scan parses it (the scanner keeps the records, its peers get none) and finds
    what the regular expressions find; a line naming the key as a value only leaves it to them. A key of any other
    JSON scalar (null, a float, a boolean) is routed by its hash as well, equal values to one worker."""
    import pickle

    opts = reading_options()
    body = b"".join(json.dumps({"type": "ab"[i % 2], "ts": i, "k": i % 4, "s": f"v{i % 3}"}).encode() + b"\n"
                    for i in range(30))
    got = scan(body, opts, ["k", "s"], 3)
    assert got.plain and got.records is not None and len(got.records) == 30
    sent = pickle.loads(pickle.dumps(Relay.sent(got)))
    assert sent.records is None and sent.plain
    found = scan_block(body, opts, ["k", "s"])
    assert found is not None and list(got.ts) == found[0] and got.last == (29.0, 29)
    assert [list(o) for o in got.owners] == [list(workers_of(vs, 3)) for vs in found[1]]
    assert not scan(body + b'{"type": "a", "ts": 30, "x": "k", "s": "v"}\n', opts, ["k", "s"], 3).plain
    odd = b'{"type": "a", "ts": 30, "k": null, "s": "v"}\n{"type": "a", "ts": 31, "k": 1.0, "s": true}\n'
    got = scan(body + odd, opts, ["k", "s"], 3)
    assert got.plain and [list(o[-2:]) for o in got.owners] == [[hash(None) % 3, 1 % 3], [hash("v") % 3, 1 % 3]]


@st.composite
def plain_feeds(draw, max_events: int = 40, plain: int = 16) -> str:
    """JSON lines mostly of the plain shape (``plain`` in ``plain + 16`` lines), keyed by ``k`` (an integer, some
    negative, -1 among them, whose hash is -2, and one of 18 digits) and ``s`` (a string), among them plain lines
    that are no plain event (no or an empty type, a number as type, a null value, a null key, a boolean or a
    numeric string as ts), keys written as floats or booleans or missing, nested and broken lines, blank lines and
    times going back (late events)."""
    lines, ts = [], 0
    for _ in range(draw(st.integers(0, max_events))):
        ts += draw(st.sampled_from([0, 0, 1, 2]))
        rec = {"type": draw(st.sampled_from("abc")), "ts": ts, "k": draw(st.sampled_from([-2, -1, 0, 1, 2, 3, 10**17 + 1])),
               "s": draw(st.sampled_from(["p", "q", "r"])), "x": draw(st.integers(0, 3))}
        style = draw(st.sampled_from([0] * plain + list(range(1, 17))))
        odd = [rec, {**rec, "ts": max(ts - 3, 0)}, {**rec, "x": None}, {**rec, "type": ""},
               {k: v for k, v in rec.items() if k != "type"}, {**rec, "type": 5}, {**rec, "n": {"m": 1}},
               {**rec, "ts": ts + 0.5}, {**rec, "k": None}, {**rec, "k": float(rec["k"])},
               {**rec, "k": rec["k"] % 2 == 1, "s": None}, {**rec, "ts": ts % 2 == 1}, {**rec, "ts": str(ts)},
               {k: v for k, v in rec.items() if k != "k"}, {k: v for k, v in rec.items() if k != "s"}][style] \
            if style < 15 else None
        lines.append(json.dumps(odd) if odd is not None else draw(st.sampled_from(["{broken", ""])))
    return "".join(line + "\n" for line in lines)


PLAIN_QUERIES = ("PATTERN SEQ(a x, b y) WHERE [k] WITHIN 5",
                 "PATTERN SEQ(a x, ~(c z), b y) WHERE [s] AND y.x >= x.x WITHIN 4",
                 "PATTERN SEQ(b x, c+ y[]) WHERE [k] AND x.x = y[i].x WITHIN 6", "PATTERN SEQ(c x, a y) WITHIN 3")


@pytest.fixture
def plain_blocks(monkeypatch):
    monkeypatch.setattr(yfpp.workers.reading, "BLOCK", 331)  # about five lines a block: each worker owns some of them
    monkeypatch.setattr(yfpp.workers.reading, "CHUNK", 2)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                                                 HealthCheck.function_scoped_fixture])
@given(st.sets(st.sampled_from(PLAIN_QUERIES), min_size=1), plain_feeds(), st.sampled_from([2, 3]))
def test_workers_over_plain_blocks_are_one_engine(plain_blocks, tmp_path, texts, text, n):
    """Blocks of the plain shape (events made of the scanner's records, or the peers' lines parsed without the
    checks) mixed with others, several keys, dead letters and late events: one engine's matches, dead letters
    and count."""
    from yfpp.language.query_text import parse_query

    path = tmp_path / "feed.jsonl"
    path.write_text(text)
    queries = [(f"q{i}", parse_query(q, "sase", "s")) for i, q in enumerate(sorted(texts))]
    assert with_workers(queries, str(path), n) == one_engine(queries, str(path))


@pytest.fixture(params=["compiled line scan", "scans relayed"])
def keyed_reading(request, monkeypatch):
    """Keyed workers each scanning every block with the compiled line scan (whatever the file's first lines), or
    relaying the scans (as without numba); blocks of a few lines (inherited by the forked workers)."""
    if request.param == "compiled line scan" and not line_scan.available():
        pytest.skip("numba is not installed")
    monkeypatch.setattr(yfpp.workers.reading, "COMPILED", request.param == "compiled line scan")
    monkeypatch.setattr(yfpp.workers.compiled, "HEAD_LINES", 0)
    monkeypatch.setattr(yfpp.workers.reading, "COMPILED_MIN_BYTES", 0)
    monkeypatch.setattr(yfpp.workers.reading, "PREBUILT_MIN_BYTES", 0)
    monkeypatch.setattr(yfpp.workers.reading, "BLOCK", 331)
    monkeypatch.setattr(yfpp.workers.reading, "KEYED_CHUNK", 1)
    return request.param


KEYED_QUERIES = {"k": (PLAIN_QUERIES[0], PLAIN_QUERIES[2]),
                 "s": (PLAIN_QUERIES[1], "PATTERN SEQ(a x, b+ y[]) WHERE [s] AND x.x < y[i].x WITHIN 3")}


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                                                 HealthCheck.function_scoped_fixture])
@given(st.sampled_from("ks"), st.data(), plain_feeds(max_events=60, plain=100), st.sampled_from([2, 3]))
def test_keyed_workers_are_one_engine_with_the_compiled_scan_and_without(keyed_reading, tmp_path, key, data, text, n):
    """Every group keyed by one attribute (an integer or a string), the lines mostly plain (blocks the compiled scan
    takes whole, routed by value_hash) with others among them (blocks scanned the slow way or parsed whole by every
    worker, routed by the same hash): late events, malformed lines, a key missing or null or a float on some lines
    — one engine's matches, dead letters and count."""
    from yfpp.language.query_text import parse_query

    path = tmp_path / "feed.jsonl"
    path.write_text(text)
    texts = data.draw(st.sets(st.sampled_from(KEYED_QUERIES[key]), min_size=1))
    queries = [(f"q{i}", parse_query(q, "sase", "s")) for i, q in enumerate(sorted(texts))]
    assert with_workers(queries, str(path), n, reading=keyed_reading) == one_engine(queries, str(path))


@pytest.fixture(params=["prebuilt", "jit"])
def kernel(request, monkeypatch):
    """The compiled scan's kernel in this process: the prebuilt module (built in the machine's cache the first time),
    or numba's JIT kernel."""
    if not line_scan.available():
        pytest.skip("numba is not installed")
    if request.param == "prebuilt":
        module = prebuilt.build()
        if module is None:
            pytest.skip(f"the prebuilt kernel cannot be built here: {prebuilt_failure()}")
        monkeypatch.setattr(yfpp.workers.compiled, "_loaded", [(module.owned_u8, module.owned_u32)])
    else:
        from yfpp.workers.compiled_kernels import owned_lines

        monkeypatch.setattr(yfpp.workers.compiled, "_loaded", [(owned_lines, owned_lines)])
    return request.param


def prebuilt_failure() -> str:
    """Why the prebuilt kernel failed to build on this machine (``failed.txt``)."""
    name = prebuilt.module_name()
    path = os.path.join(prebuilt.folder(name), prebuilt.FAILED) if name else ""
    return open(path).read().strip() if path and os.path.exists(path) else "numba is not installed"


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(plain_feeds(max_events=30, plain=100), st.sampled_from([2, 3, 300]))
def test_the_compiled_scan_agrees_with_the_slow_scan(kernel, text, n):
    """Where the compiled scan takes a block whole: the slow scan's ts, last event and each line's worker by
    value_hash, and the scanning worker's lines as one JSON array; where it does not, the slow scan itself — with the
    prebuilt kernel and with numba's JIT kernel."""
    body, opts, me = text.encode(), reading_options(), n // 2
    if not body:
        return
    got = compiled_scan(body, LineSpec.of(opts, "k"), opts, ["k"], n, me)
    slow = scan(body, opts, ["k"], n, value_hash)
    if type(got.ts) is np.ndarray:  # (taken whole: every line a plain event, in ts order)
        assert slow.ts is not None and list(got.ts) == list(slow.ts) and got.last == slow.last
        assert list(got.owners[0]) == list(slow.owners[0]) and got.lines == slow.lines == len(body.splitlines())
        assert got.own is not None and json.loads(got.own) == [
            json.loads(line) for line, w in zip(body.splitlines(), got.owners[0]) if w == me]
    else:
        assert got == slow


def test_the_compiled_scan_takes_lines_up_to_the_readers_cap(kernel):
    """A block with a line of ``max_record_bytes`` is taken whole; one byte more, the line is the reader's dead letter
    (``too large``), and the block is left to the slow scan."""
    import dataclasses

    line = json.dumps({"type": "a", "ts": 1, "k": 2, "pad": "x" * 40}).encode()
    body = b'{"type": "b", "ts": 0, "k": 1}\n' + line + b"\n"
    for cap, whole in ((len(line), True), (len(line) - 1, False)):
        opts = dataclasses.replace(reading_options(), max_record_bytes=cap)
        got = compiled_scan(body, LineSpec.of(opts, "k"), opts, ["k"], 2, 0)
        assert (type(got.ts) is np.ndarray) == whole and (got.ts is not None and list(got.ts) == [0.0, 1.0])


def test_the_compiled_scan_is_chosen_where_the_head_is_plain_and_numba_is_there(monkeypatch, tmp_path):
    """Every group keyed by one attribute over a large file of plain lines: the compiled line scan, its kernel loaded
    before the workers start (none of them loads it); a file between the two sizes only where the prebuilt kernel is
    built; a line that is not plain among the first, two key attributes, a smaller file, numba missing or the switch
    off: the scans relayed."""
    if not line_scan.available():
        pytest.skip("numba is not installed")
    path = tmp_path / "feed.jsonl"
    plain_file(path, 100)
    opts, head, large = reading_options(), path.read_bytes()[:4096], yfpp.workers.reading.COMPILED_MIN_BYTES
    monkeypatch.setattr(yfpp.workers.compiled, "_loaded", [])
    assert compiled_spec(opts, keyed_groups(), head, large) is not None and yfpp.workers.compiled._loaded
    middle, small = large - 1, yfpp.workers.reading.PREBUILT_MIN_BYTES
    monkeypatch.setattr(yfpp.workers.compiled, "_loaded", [])
    built = prebuilt.load() is not None
    assert (compiled_spec(opts, keyed_groups(), head, middle) is not None) == built  # (only the prebuilt kernel)
    assert compiled_spec(opts, keyed_groups(), head, small - 1) is None
    monkeypatch.setattr(yfpp.workers.compiled, "_loaded", [])
    monkeypatch.setattr(prebuilt, "load", lambda: None)
    assert compiled_spec(opts, keyed_groups(), head, middle) is None and not yfpp.workers.compiled._loaded
    monkeypatch.undo()
    assert compiled_spec(opts, keyed_groups(), b'{"type": "a", "ts": 0, "k": 1.5}\n' + head, large) is None
    two = keyed_groups() + keyed_groups("PATTERN SEQ(a x, b y) WHERE [x] WITHIN 3")
    assert compiled_spec(opts, two, head, large) is None
    assert compiled_spec(opts, keyed_groups("PATTERN SEQ(a x, b y) WITHIN 3"), head, large) is None
    monkeypatch.setattr(yfpp.workers.compiled, "_loaded", [])  # (numba missing: no module, no JIT kernel)
    monkeypatch.setattr(prebuilt, "module_name", lambda: None)
    monkeypatch.setattr(yfpp.workers.compiled.importlib.util, "find_spec", lambda name: None)
    assert compiled_spec(opts, keyed_groups(), head, large) is None
    monkeypatch.undo()
    monkeypatch.setattr(yfpp.workers.reading, "COMPILED", False)
    assert compiled_spec(opts, keyed_groups(), head, large) is None


def test_the_kernels_load_numba_without_scipy_which_imports_afterwards():
    """Loading a kernel (numba, and its first load from the cache or compile) imports no scipy; scipy, where it is
    installed, imports as usual afterwards."""
    if not line_scan.available():
        pytest.skip("numba is not installed")
    code = ("import sys, importlib.util; from yfpp.input.readers import reading_options; "
            "from yfpp.spark.line_scan import LineSpec, scan_range; "
            "assert scan_range(b'{\"type\": \"a\", \"ts\": 1, \"k\": 2}\\n', LineSpec.of(reading_options(), 'k'), 2); "
            "assert not [m for m in sys.modules if m.split('.')[0] == 'scipy'], 'scipy loaded with numba'; "
            "importlib.util.find_spec('scipy') is None or __import__('scipy.linalg')")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    subprocess.run([sys.executable, "-c", code], check=True, env=env, timeout=120)


def test_equal_key_values_go_to_one_worker():
    assert len({*workers_of([1, 1.0, True], 7)}) == 1 and len({*workers_of([0, 0.0, False], 7)}) == 1


@given(st.one_of(st.lists(st.integers()), st.lists(st.text()), st.lists(st.one_of(st.integers(), st.text()))))
def test_key_values_read_json_integers_and_strings(values):
    """As the scan finds them: JSON integers and strings without a quote, backslash or control character."""
    values = [v for v in values if type(v) is int or all(c >= " " and c not in '"\\' for c in v)]
    texts = [json.dumps(v, ensure_ascii=False).encode() for v in values]
    assert key_values(texts) == values


def one_engine(queries: list, path: str, fmt: str = "jsonl") -> tuple[Counter, Counter, int]:
    dead = Letters()
    eng = Engine(dead_letters=dead)
    for name, p in queries:
        eng.register(p, name=name)
    out: list[dict] = []
    count = 0
    for batch in read_event_batches(path, fmt, dead_letters=dead):
        count += len(batch)
        eng.process_batch(batch, out)
    eng.flush(out)
    return Counter(json.dumps(m, sort_keys=True) for m in out), dead.items, count


def with_workers(queries: list, path: str, n: int, fmt: str = "jsonl",
                 reading: str | None = None) -> tuple[Counter, Counter, int]:
    """The workers' matches, dead letters and count of events (``reading``: how they must read the file)."""
    dead = Letters()
    out = Lines()
    workers = Workers(queries, n, out, dead, slice_events=3, source=(path, fmt, reading_options()))
    try:
        assert workers.source is not None and workers.reading == (reading or workers.reading)
        workers.flush()
    finally:
        workers.close()
    return Counter(json.dumps(m, sort_keys=True) for m in out), dead.items, workers.events


@pytest.fixture
def small_blocks(monkeypatch):
    monkeypatch.setattr(yfpp.workers.reading, "BLOCK", 97)  # a few lines a block (inherited by the forked workers)
    monkeypatch.setattr(yfpp.workers.reading, "CHUNK", 2)  # two blocks a chunk: each worker scans some for the others
    monkeypatch.setattr(yfpp.workers.reading, "KEYED_CHUNK", 1)  # (where every group is keyed: one block a chunk)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                                                 HealthCheck.function_scoped_fixture])
@given(st.lists(patterns(), min_size=1, max_size=3), st.data(), st.sampled_from([2, 3]))
def test_workers_reading_the_file_are_one_engine(small_blocks, tmp_path, pats, data, n):
    """Keyed, sliced and whole groups at once over every line shape (an event read by two engines of a worker is
    two objects: the runtime numbers each engine's events in them): one engine's matches, dead letters and count."""
    text = data.draw(feeds(max_events=events_within_reach(pats, 40)))
    path = tmp_path / "feed.jsonl"
    path.write_text(text)
    queries = [(f"q{i}", p) for i, p in enumerate(pats)]
    assert with_workers(queries, str(path), n) == one_engine(queries, str(path))


def test_workers_reading_a_large_plain_file(tmp_path):
    """Thousands of plain lines (every block scanned) with a few late events and broken lines among them."""
    rng = random.Random(3)
    lines = []
    for i in range(6000):
        lines.append(json.dumps({"type": rng.choice("abc"), "ts": i // 3, "k": rng.randrange(50), "x": rng.randrange(4)}))
    for i in (700, 2500, 4000):
        lines.insert(i, json.dumps({"type": "a", "ts": 5, "k": 1, "x": 0}))  # late
    lines.insert(1200, "{broken")
    path = tmp_path / "feed.jsonl"
    path.write_text("\n".join(lines) + "\n")
    from yfpp.language.query_text import parse_query

    queries = [("keyed", parse_query("PATTERN SEQ(a x, b y) WHERE [k] AND y.x > x.x WITHIN 20", "sase", "s")),
               ("sliced", parse_query("PATTERN SEQ(a x, c y) WHERE y.x = x.x WITHIN 4", "sase", "s"))]
    expected = one_engine(queries, str(path))
    assert expected[1].total() == 4 and sum(expected[0].values()) > 1000
    assert with_workers(queries, str(path), 2) == expected


def test_cli_workers_read_the_file_when_they_can(capsys, tmp_path):
    """The same lines and figures from the command line; a gzip file or --max-delay takes the parent's reader."""
    path = tmp_path / "feed.jsonl"
    path.write_text("".join(json.dumps({"type": "ab"[i % 2], "ts": i, "k": i % 7}) + "\n" for i in range(3000)))
    results = cli_results(capsys, tmp_path, path, (["--workers", "1"], ["--workers", "2"],
                                                   ["--workers", "2", "--max-delay", "1"]))
    assert len(set(map(str, results.values()))) == 1 and results[("--workers", "1")][1] == 3000


def cli_results(capsys, tmp_path, path, argvs: tuple[list[str], ...]) -> dict[tuple[str, ...], tuple]:
    """Per extra arguments, the sorted lines, events and matches of a keyed query over ``path`` from the command
    line (and two workers' CPU seconds where ``--workers 2``)."""
    query = "PATTERN SEQ(a x, b y) WHERE [k] WITHIN 30"
    results = {}
    for argv in argvs:
        stats = tmp_path / "stats.json"
        assert main(["run", "-q", query, "-i", str(path), "--stats-json", str(stats), *argv]) == 0
        out, _ = capsys.readouterr()
        figures = json.loads(stats.read_text())
        results[tuple(argv)] = (sorted(out.splitlines()), figures["events"], figures["matches"])
        if argv[1] == "2":
            cpu = figures["worker_cpu_s"]  # each worker's CPU seconds, the busiest first
            assert len(cpu) == 2 and cpu[0] >= cpu[1] > 0
    return results


def test_a_dead_letter_with_the_latest_ts_does_not_move_the_watermark(small_blocks, tmp_path):
    """A line of the plain shape that is no event (no type) ahead in time, at each place in a block: the events
    after it with earlier times are not late, in one engine nor in the workers."""
    from yfpp.language.query_text import parse_query

    queries = [("q", parse_query("PATTERN SEQ(a x, b y) WHERE [k] WITHIN 50", "sase", "s"))]
    plain = [json.dumps({"type": "ab"[i % 2], "ts": i, "k": i % 3}) for i in range(12)]
    for at in range(1, 8):
        lines = [*plain[:at], json.dumps({"ts": 100, "k": 1}), *plain[at:]]
        path = tmp_path / f"feed{at}.jsonl"
        path.write_text("\n".join(lines) + "\n")
        expected = one_engine(queries, str(path))
        assert len(expected[1]) == 1  # the line without a type; no late event
        assert with_workers(queries, str(path), 2) == expected


def test_the_relay_gives_each_chunk_its_scans_and_waits_for_none_past_a_scanners_end(monkeypatch):
    """Chunks of two blocks dealt to two workers: each gets every chunk's scans, its own or its peer's; a chunk its
    scanner never read (the file grew after the scanner reached its end) comes empty instead of being waited for."""
    inboxes = [queue.Queue(), queue.Queue()]

    def scanner(body: bytes) -> Scan:
        return Scan(len(body), None, [], None)

    first = Relay(iter([b"a", b"bb", b"ccc"]), scanner, 0, 2, inboxes, chunk=2)  # worker 0's reader saw 3 blocks
    second = Relay(iter([b"a", b"bb", b"ccc", b"dddd", b"eeeee", b"f"]), scanner, 1, 2, inboxes, chunk=2)  # 6 blocks
    assert [sc.size for sc in first.chunk(0)] == [sc.size for sc in second.chunk(0)] == [1, 2]
    assert [sc.size for sc in first.chunk(1)] == [sc.size for sc in second.chunk(1)] == [3, 4]
    assert second.chunk(2) == []  # worker 0 scans chunk 2, but its reader ended before it
    assert inboxes[1].empty()  # (worker 0's still holds worker 1's end, which it never needed)


def keyed_groups(query: str = "PATTERN SEQ(a x, b y) WHERE [k] WITHIN 30") -> list:
    from yfpp.language.query_text import parse_query
    from yfpp.spark.plan import group_queries
    from yfpp.workers.pool import WORKERS

    return group_queries([("q", parse_query(query, "sase", "s"))], runner=WORKERS)


def test_chunks_are_short_where_every_group_is_keyed():
    """Where every group is keyed each block's events split over the workers, which go in step: short chunks keep
    what a worker holds ahead small; a time slice or a whole group keeps one worker busy while the others run ahead
    (as far as the chunks scanned ahead let them), so its plans keep long chunks."""
    keyed = keyed_groups()
    sliced = keyed_groups("PATTERN SEQ(a x, b y) WITHIN 30")
    whole = keyed_groups("PATTERN SEQ(a x, b y)")
    assert not sliced[0].key and sliced[0].sliced and not whole[0].key and not whole[0].sliced
    assert chunk_blocks(keyed) == yfpp.workers.reading.KEYED_CHUNK < yfpp.workers.reading.CHUNK
    assert chunk_blocks(sliced) == chunk_blocks(whole) == chunk_blocks(keyed + sliced) == yfpp.workers.reading.CHUNK


@given(st.floats(1e-3, 1e9), st.integers(1, 64), st.floats(1e-2, 1e6))
def test_slices_up_to_a_known_end_deal_evenly(span, n, slices):
    """Where the stream's last ts is known, its slices are as many as deal evenly to the workers, none longer than
    asked (``span / slices``), the last ts in the last slice: 3 slices of 2 workers would put two thirds of the
    matching on one."""
    most = span / slices
    length = even_length(span, n, most)
    count = math.floor(span / length) + 1  # (the slices from 0 to the span: the last holds it)
    assert length <= most * (1 + 1e-6) and count % n == 0 and count * length >= span


def test_workers_reading_a_file_plan_slices_that_deal_evenly(tmp_path):
    """The slices of a file the workers read are planned to its last line's ts: 60 events of 2 workers at 20 events a
    slice are 4 slices of about 15, not 3 of 20 (two of them on one worker)."""
    from yfpp.language.query_text import parse_query
    from yfpp.spark.plan import group_queries
    from yfpp.workers.pool import WORKERS

    path = tmp_path / "feed.jsonl"
    path.write_text("".join(json.dumps({"type": "a", "ts": i}) + "\n" for i in range(60)) + "{broken\n\n")
    groups = group_queries([("q", parse_query("PATTERN SEQ(a x, a y) WITHIN 2", "sase", "s"))], runner=WORKERS)
    slicings: dict = {}
    share = Share(str(path), reading_options(), groups, 0, 2, 20, DeadLetters(), Sequencer(), slicings,
                  [queue.Queue(), queue.Queue()])
    next(share.blocks())  # (the file's one block: worker 0's chunk, its slices planned as it is read)
    assert slicings[0].length == pytest.approx(59 / 4) and slicings[0].own(59) == 3


def plain_file(path, lines: int) -> None:
    path.write_text("".join(json.dumps({"type": "ab"[i % 2], "ts": i, "k": i % 7}) + "\n" for i in range(lines)))


def test_a_file_cut_short_under_a_worker_is_an_error(monkeypatch, tmp_path):
    """Worker 1 read the whole file (its scans and its end are in worker 0's inbox); the file is cut short before
    worker 0 reads it: worker 0 stops with an error naming the file, waiting for nothing."""
    monkeypatch.setattr(yfpp.workers.reading, "KEYED_CHUNK", 2)  # (its groups are keyed)
    path = tmp_path / "feed.jsonl"
    plain_file(path, 3000)
    opts, groups = reading_options(), keyed_groups()
    with open(path, "rb") as f:
        blocks = list(LineBlocks(f, opts.max_record_bytes, DeadLetters(), yfpp.workers.reading.BLOCK))
    chunks = (len(blocks) + 1) // 2
    assert chunks >= 3
    inboxes: list = [queue.Queue(), queue.Queue()]
    for c in range(1, chunks, 2):
        inboxes[0].put((1, c, [Relay.sent(scan(body, opts, ["k"], 2)) for body in blocks[2 * c:2 * c + 2]]))
    inboxes[0].put((1, (chunks, sum(map(len, blocks))), None))
    os.truncate(path, path.stat().st_size // 2)
    share = Share(str(path), opts, groups, 0, 2, 20_000, DeadLetters(), Sequencer(), {}, inboxes)
    with pytest.raises(YfppError, match="feed.jsonl changed while the workers read it"):
        collections.deque(share.blocks(), 0)


def test_a_file_cut_below_what_a_worker_read_is_an_error(monkeypatch, tmp_path):
    """One worker, the file cut short after it read ahead past the cut: the end of its read is an error, not the
    events of a file that never was."""
    monkeypatch.setattr(yfpp.workers.reading, "KEYED_CHUNK", 2)
    path = tmp_path / "feed.jsonl"
    plain_file(path, 3000)
    share = Share(str(path), reading_options(), keyed_groups(), 0, 1, 20_000, DeadLetters(), Sequencer(), {})
    blocks = share.blocks()
    next(blocks)  # (read ahead: a few chunks)
    os.truncate(path, 100)
    with pytest.raises(YfppError, match="changed while the workers read it"):
        collections.deque(blocks, 0)


def test_truncating_the_input_under_a_running_command_ends_it_with_an_error(tmp_path):
    """``yfpp run --workers 2`` over a file cut short while the workers read it (once their first matches are
    written): the command ends, within a bound, naming the file; it does not wait forever for a worker."""
    path, out = tmp_path / "feed.jsonl", tmp_path / "out.jsonl"
    plain_file(path, 300_000)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.Popen([sys.executable, "-m", "yfpp", "run", "-q", "PATTERN SEQ(a x, b y) WHERE [k] WITHIN 30",
                             "-i", str(path), "--workers", "2", "-o", str(out), "--progress", "never"],
                            stderr=subprocess.PIPE, text=True, env=env)
    try:
        while proc.poll() is None and not (out.exists() and out.stat().st_size):
            time.sleep(0.01)
        os.truncate(path, 1000)
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode != 0 and "feed.jsonl changed while the workers read it" in err


def test_lines_over_max_record_bytes_are_the_same_dead_letters_with_workers(capsys, tmp_path):
    """Lines longer than --max-record-bytes (the first, one inside, the last: each read by the relay ahead of its
    matching, its dead letter given where the worker stands): the same dead letters, events and matches as one
    engine."""
    path = tmp_path / "feed.jsonl"
    lines = [json.dumps({"type": "ab"[i % 2], "ts": i, "k": i % 7}) + "\n" for i in range(3000)]
    for i in (0, 1500, 2999):
        lines[i] = json.dumps({"type": "a", "ts": i, "k": 3, "pad": "x" * 600}) + "\n"
    path.write_text("".join(lines))
    argvs = [[*w, "--max-record-bytes", "300", "--dead-letters", str(tmp_path / f"dead{w[1]}.jsonl")]
             for w in (["--workers", "1"], ["--workers", "2"])]
    results = cli_results(capsys, tmp_path, path, tuple(argvs))
    assert len(set(map(str, results.values()))) == 1 and results[tuple(argvs[0])][1] == 2997
    dead = [sorted((tmp_path / f"dead{n}.jsonl").read_text().splitlines()) for n in (1, 2)]
    assert dead[0] == dead[1] and len(dead[0]) == 3


def test_close_closes_the_results_pipes_while_the_collector_is_busy(monkeypatch, tmp_path):
    """``Workers.close`` with the collector thread still writing matches past its wait (an output that blocks): the
    process holds no more file descriptors than before the workers started; the collector then ends."""
    import threading

    import yfpp.workers.pool

    monkeypatch.setattr(yfpp.workers.pool, "_POLL", 0.05)
    entered, release = threading.Event(), threading.Event()

    class Blocking(Lines):
        def write_encoded(self, lines: bytes, count: int) -> None:
            entered.set()
            release.wait(30)

    path = tmp_path / "feed.jsonl"
    plain_file(path, 3000)
    fds = lambda: len(os.listdir("/proc/self/fd"))  # noqa: E731
    before = fds()
    from yfpp.language.query_text import parse_query

    query = parse_query("PATTERN SEQ(a x, b y) WHERE [k] WITHIN 30", "sase", "s")
    workers = Workers([("q", query)], 2, Blocking(), DeadLetters(),
                      source=(str(path), "jsonl", reading_options()))
    try:
        assert entered.wait(30)
        workers.close()
        deadline = time.monotonic() + 10
        while fds() > before and time.monotonic() < deadline:  # (the queues' threads close theirs as they end)
            time.sleep(0.01)
        assert fds() == before and workers._collector.is_alive()
    finally:
        release.set()
    workers._collector.join(10)
    assert not workers._collector.is_alive()
