"""``yfpp run --workers N`` (yfpp/workers/pool.py): N engine processes find one engine's matches.

The workers are checked against one :class:`Engine` over the same stream — on generated
patterns and streams (hypothesis, bounded: each example starts two processes), on the Spark
plan's workloads, and through the command line (the same lines with ``--ordered``, dead letters
and ``--stats`` summed over the workers, the options refused).
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, currently_in_test_context, given, settings
from hypothesis import strategies as st

from tests.generators import patterns, set_patterns, streams, within_reach
from tests.spark.test_spark_plan import KEYED, STOCK, stream_of
from yfpp.cli import main
from yfpp.engine import Engine
from yfpp.errors import YfppError
from yfpp.input.dead_letters import DeadLetters
from yfpp.input.events import Event
from yfpp.input.generate import generate_rfid, generate_stock, write_events
from yfpp.output.writer import LineEncoder
from yfpp.spark.plan import effective_queries
from yfpp.state.checkpoint import read_checkpoint
from yfpp.workers.pool import Sequencer, Workers, worker_count


class Lines(list):
    """The matches the workers send, as an output would write them (each line read back), and a flush for checkpoints."""

    encoder = LineEncoder()

    def write_encoded(self, lines: bytes, count: int) -> None:
        self.extend(json.loads(line) for line in lines.splitlines())
        assert len(lines.splitlines()) == count

    def flush(self) -> None:
        pass


def one_engine(queries: list, events: list[Event], max_delay: float = 0.0, dead: DeadLetters | None = None) -> Counter:
    eng = Engine(dead_letters=dead or DeadLetters(), max_delay=max_delay)
    for name, p in queries:
        eng.register(p, name=name)
    found = Counter(json.dumps(m, sort_keys=True) for m in eng.process_all(events))
    # Over max_runs_per_query a query's search is given up and its matches lost (reported, counted): which ones
    # depends on the events an engine holds, so a time slice of the workers loses others. Compared within the caps
    # (a generated case over them is not used; a fixed workload must stay within them).
    shed = any(eng.runtime.counters.shed_runs.values())
    if currently_in_test_context():
        assume(not shed)
    assert not shed, "the workload exceeds max_runs_per_query"
    return found


def with_workers(queries: list, events: list[Event], n: int = 2, slice_events: int = 5, batch: int = 7,
                 live: bool = True, max_delay: float = 0.0, dead: DeadLetters | None = None) -> Counter:
    """The workers' matches, ``batch`` events routed at a time (``live``: each batch sent at once, closing the
    slices behind it as it goes; else gathered)."""
    out = Lines()
    workers = Workers(queries, n, out, dead or DeadLetters(), slice_events=slice_events, live=live, max_delay=max_delay)
    try:
        for i in range(0, len(events), batch):
            workers.process_batch(events[i:i + batch])
        workers.flush()
    finally:
        workers.close()
    return Counter(json.dumps(m, sort_keys=True) for m in out)


def copies(events: list[Event]) -> list[Event]:
    return [Event(e.type, e.ts, dict(e.attrs), e.seq) for e in events]


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.lists(st.one_of(patterns(), patterns(), set_patterns()), min_size=1, max_size=3), streams(max_events=40))
def test_workers_find_one_engines_matches(pats, events):
    """Keyed, sliced (tiny slices) and whole groups at once, strict and partition contiguity, trailing
    negations, non_overlapping, event sets: the same multiset of match lines as one engine."""
    events = within_reach(pats, events)
    queries = [(f"q{i}", p) for i, p in enumerate(pats)]
    assert with_workers(queries, copies(events)) == one_engine(queries, copies(events))


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.lists(patterns(), min_size=1, max_size=2), streams(max_events=30), st.data())
def test_workers_reorder_and_report_late_events_as_one_engine(pats, events, data):
    """Out of order arrivals: the reorder buffer (--max-delay) and late events are one engine's, before the routing."""
    events = within_reach(pats, events)
    swaps = data.draw(st.lists(st.integers(0, max(len(events) - 2, 0)), max_size=6))
    for i in swaps:
        if len(events) > 1:
            events[i], events[i + 1] = events[i + 1], events[i]
    events = [Event(e.type, e.ts, e.attrs, seq) for seq, e in enumerate(events)]  # numbered in arrival order
    max_delay = data.draw(st.sampled_from([0, 1, 3]))
    queries = [(f"q{i}", p) for i, p in enumerate(pats)]
    dead_one, dead_workers = DeadLetters(), DeadLetters()
    expected = one_engine(queries, copies(events), max_delay, dead_one)
    assert with_workers(queries, copies(events), max_delay=max_delay, dead=dead_workers) == expected
    assert dead_workers.by_reason == dead_one.by_reason


@pytest.mark.parametrize("workload", ["rfid", "stock"])
def test_workers_on_the_spark_plans_workloads(workload):
    queries, records = (KEYED, generate_rfid(2000, seed=1)) if workload == "rfid" else (
        {k: v for k, v in STOCK.items() if k != "unbounded"}, generate_stock(1500, seed=2))
    records = list(records)
    named = list(effective_queries(queries))
    expected = one_engine(named, stream_of(records))
    assert sum(expected.values()) > 100
    assert with_workers(named, stream_of(records), n=3, slice_events=100, batch=500, live=False) == expected


FEEDBACK = "PATTERN SEQ(shelf a, ~register b, exit c) WHERE [tag_id] WITHIN 1 hour RETURN theft(tag_id = a.tag_id) FEEDBACK"


def test_feedback_within_the_partition_is_supported():
    """A feedback query whose result event keeps the key, seen only by queries of its partitioning."""
    queries = list(effective_queries({"theft": FEEDBACK, "shelved": "PATTERN SEQ(shelf s, theft t) WHERE [tag_id] WITHIN 1 hour",
                                      "pair": "PATTERN SEQ(register a, exit b) WITHIN 100"}))
    events = stream_of(generate_rfid(1500, seed=5, theft_rate=0.3))
    expected = one_engine(queries, copies(events))
    assert any('"query": "shelved"' in line for line in expected)
    assert with_workers(queries, events, slice_events=100, batch=200) == expected


def test_feedback_across_partitionings_is_refused():
    queries = list(effective_queries({"theft": FEEDBACK, "by_zone": "PATTERN SEQ(theft a, theft b) WITHIN 60"}))
    with pytest.raises(YfppError, match="with --workers .*or run with --workers 1"):
        Workers(queries, 2, [], DeadLetters())


def test_worker_count():
    assert worker_count("3") == 3 and worker_count("auto") >= 1
    for bad in ("0", "many"):
        with pytest.raises(YfppError, match="--workers"):
            worker_count(bad)


# --- the command line ---------------------------------------------------------------------------


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def feed(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("feed") / "feed.jsonl"
    write_events(generate_rfid(3000, seed=4), str(path), "jsonl")
    return str(path)


QUERIES = ["PATTERN SEQ(shelf a, ~register b, exit c) WHERE [tag_id] WITHIN 1 hour",
           "PATTERN SEQ(register a, exit b) WITHIN 100",
           "PATTERN SEQ(shelf a, exit c) WHERE strict_contiguity(a, c) {[tag_id]} WITHIN 10 min"]


def test_cli_ordered_lines_are_the_same_for_one_and_two_workers(capsys, feed):
    lines = {}
    for n in ("1", "2"):
        code, lines[n], err = run(capsys, "run", "-q", *QUERIES, "-i", feed, "--workers", n, "--ordered")
        assert code == 0, err
    assert lines["1"] == lines["2"] and lines["1"].count("\n") > 100
    code, unordered, _ = run(capsys, "run", "-q", *QUERIES, "-i", feed, "--workers", "2")
    assert sorted(unordered.splitlines()) == sorted(lines["1"].splitlines())


def test_cli_stats_and_dead_letters_are_summed_over_the_workers(capsys, tmp_path, feed):
    records = [json.loads(line) for line in Path(feed).read_text().splitlines()][:400]
    records.insert(50, {"type": "shelf", "ts": 0, "tag_id": "late"})  # behind the stream time: a late event
    lines = [json.dumps(r) for r in records]
    lines.insert(10, "{not json")
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(lines) + "\n")
    figures, letters = {}, {}
    for n in ("1", "2"):
        stats = tmp_path / f"stats{n}.json"
        dead = tmp_path / f"dead{n}.jsonl"
        code, _, err = run(capsys, "run", "-q", *QUERIES, "-i", str(path), "--workers", n,
                             "--stats-json", str(stats), "--dead-letters", str(dead))
        assert code == 0, err
        figures[n] = json.loads(stats.read_text())
        letters[n] = dead.read_text()
    assert letters["1"] == letters["2"]
    assert [json.loads(line)["reason"][:10] for line in letters["1"].splitlines()] == ["bad JSON: ", "late event"]
    one, two = figures["1"], figures["2"]
    assert two["workers"] == 2
    for key in ("events", "dead_letters", "dead_letters_by_reason", "matches"):
        assert two[key] == one[key], key


def test_cli_checkpoint_and_restore_with_workers(capsys, tmp_path, feed):
    """A run with two workers checkpoints (a manifest and one file per worker); restored, it needs as many workers
    and skips what the checkpoint consumed; a one-engine checkpoint is not resumed by workers."""
    ck = tmp_path / "ck.json"
    code, full, err = run(capsys, "run", "-q", *QUERIES, "-i", feed, "--workers", "2", "--checkpoint", str(ck),
                          "--checkpoint-every", "700")  # the last at event 2,800 of 3,000
    assert code == 0, err
    manifest = json.loads(ck.read_text())
    assert manifest["workers"]["n"] == 2 and sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["ck.json", *manifest["workers"]["files"]])
    code, _, err = run(capsys, "run", "--restore", str(ck), "-i", feed, "--workers", "1")
    assert code == 2 and "the checkpoint was written by 2 workers: restore it with --workers 2" in err
    code, rest, err = run(capsys, "run", "--restore", str(ck), "-i", feed)
    assert code == 0, err
    assert set(rest.splitlines()) <= set(full.splitlines()) and 0 < len(rest.splitlines()) < len(full.splitlines())
    one = tmp_path / "one.json"
    assert run(capsys, "run", "-q", QUERIES[0], "-i", feed, "--checkpoint", str(one), "--checkpoint-every", "1000")[0] == 0
    code, _, err = run(capsys, "run", "--restore", str(one), "-i", feed, "--workers", "2")
    assert code == 2 and "written by 1 worker: restore it with --workers 1" in err and "Traceback" not in err


def test_a_checkpoint_of_the_workers_resumes_exactly_once(tmp_path):
    """Matches written before a checkpoint plus those of the run restored from it (over the events after it) are
    one engine's matches, each once — also when the run went on past the checkpoint before it stopped."""
    queries = list(effective_queries(KEYED))
    records = list(generate_rfid(2000, seed=6))
    catalog = Engine(dead_letters=DeadLetters())
    for name, p in queries:
        catalog.register(p, name=name)
    path = tmp_path / "ck.json"
    first = Lines()
    workers = Workers(queries, 2, first, DeadLetters(), slice_events=100, max_delay=30)
    try:
        events = stream_of(records)
        for i in range(0, 1200, 100):
            workers.process_batch(events[i:i + 100])
        workers.checkpoint(str(path), catalog, {})
        before = list(first)
        workers.process_batch(events[1200:1500])  # ... then the process dies
    finally:
        workers.close()
    stored = read_checkpoint(str(path))
    sequencer = Sequencer.restore(stored["workers"]["sequencer"], dead_letters=DeadLetters())
    assert 1100 < sequencer.next_seq <= 1200  # (events within max_delay of the last are held in its reorder buffer)
    second = Lines()
    workers = Workers(queries, 2, second, DeadLetters(), slice_events=100, sequencer=sequencer,
                      resume={"workers": stored["workers"], "folder": str(tmp_path)})
    try:
        rest = [ev for ev in stream_of(records) if ev.seq >= sequencer.next_seq]
        for i in range(0, len(rest), 100):
            workers.process_batch(rest[i:i + 100])
        workers.flush()
    finally:
        workers.close()
    expected = one_engine(queries, stream_of(records), max_delay=30)
    assert Counter(json.dumps(m, sort_keys=True) for m in before + second) == expected


def test_cli_feedback_refusal_is_one_line(capsys, feed):
    code, _, err = run(capsys, "run", "-q", "PATTERN SEQ(shelf a, exit c) WITHIN 60 RETURN out(tag = a.tag_id) FEEDBACK",
                         "-i", feed, "--workers", "2")
    assert code == 2 and err.startswith("yfpp: error: query 'q': with --workers a feedback query needs an equivalence list")


def test_cli_xpath_predicates_read_the_xml_element_in_the_workers(capsys, tmp_path):
    """An XML event travels with its element's text: an XPath predicate reads its attribute texts, not the
    ts the reader converted (5000 ms is 5 s)."""
    feed = tmp_path / "ms.xml"
    feed.write_text('<stream><a ts="5000" zone="z1"/><b ts="6000" zone="z1"/><a ts="7000" zone="z2"/></stream>\n')
    code, out, err = run(capsys, "run", "-q", "//a[@ts > 100]", "[zone]&&//a//b[@ts >= 6000]&&(1 min)", "-i", str(feed),
                         "--ts-unit", "ms", "--workers", "2", "--ordered")
    assert code == 0, err
    assert [json.loads(line)["query"] for line in out.splitlines()] == ["q", "q2", "q"]


def iso(ts: int) -> str:
    return f"2026-12-02T{10 + ts // 3600:02d}:{ts // 60 % 60:02d}:{ts % 60:02d}Z"


def test_cli_iso_times_are_written_by_the_workers_as_by_one_engine(capsys, tmp_path, feed):
    """The workers encode the match lines (ISO-8601 start and end with --ts-format iso): one engine's bytes."""
    records = [json.loads(line) for line in Path(feed).read_text().splitlines()][:1500]
    path = tmp_path / "iso.jsonl"
    path.write_text("".join(json.dumps({**r, "ts": iso(r["ts"])}) + "\n"
                            for r in records))
    lines = {}
    for n in ("1", "2"):
        code, lines[n], err = run(capsys, "run", "-q", *QUERIES, "-i", str(path), "--ts-format", "iso",
                                  "--workers", n, "--ordered")
        assert code == 0, err
    assert lines["1"] == lines["2"] and '"start": "2026-12-02T' in lines["1"] and lines["1"].count("\n") > 20
    code, unordered, _ = run(capsys, "run", "-q", *QUERIES, "-i", str(path), "--ts-format", "iso", "--workers", "2")
    assert sorted(unordered.splitlines()) == sorted(lines["1"].splitlines())
