"""Bounded memory (issue 8 item 8): per-query caps on runs and buffered events, growth reports."""

from __future__ import annotations

import dataclasses

import io
import json
import time
from collections import Counter

import pytest

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.generators import patterns, set_patterns, streams
from yfpp.cli import main
from yfpp.input.dead_letters import DeadLetters
from yfpp.engine import Engine
from yfpp.input.events import Event
from yfpp.language.pattern import Pattern

RUNAWAY = "PATTERN SEQ(a x, b+ y[], c z) WHERE skip_till_any_match(x, y, z) WITHIN 1 hour"


def runaway_feed(n_b: int = 1000) -> list[dict]:
    return [{"type": "a", "ts": 0}] + [{"type": "b", "ts": 1 + i} for i in range(n_b)] + [{"type": "c", "ts": n_b + 1}]


def matches_of(p: Pattern, events: list[Event], **opts) -> tuple[Counter, Engine]:
    """The matches of ``p`` alone on ``events`` (as JSON texts, counted) and the engine after them."""
    eng = Engine(dead_letters=DeadLetters(), reports=None, **opts)
    eng.register(p, name="q")
    out = [m for e in events for m in eng.process(Event(e.type, e.ts, dict(e.attrs), e.seq))] + eng.flush()
    return Counter(json.dumps(m, sort_keys=True) for m in out), eng


def test_runaway_kleene_is_capped_and_reported():
    sink = io.StringIO()
    eng = Engine(max_runs_per_query=2000, reports=sink, dead_letters=DeadLetters())
    eng.register(RUNAWAY, name="runaway")
    peak = 0
    for r in runaway_feed():
        eng.process(r)
        peak = max(peak, eng.stats.live_runs)
    eng.flush()
    assert peak <= 2 * 2000 + 2  # one event can at most double the runs before the cap check
    assert eng.stats.shed_runs["runaway"] > 2000
    assert eng.runtime.buffer.size < 100
    assert "query 'runaway': over max_runs_per_query=2,000" in sink.getvalue()
    assert eng.reports and "runaway" in eng.reports[0]


def test_buffer_cap_sheds_a_long_kleene():
    sink = io.StringIO()
    eng = Engine(max_buffer_per_query=300, reports=sink, dead_letters=DeadLetters())
    eng.register("PATTERN SEQ(a x, b+ y[], c z)", name="long")
    sizes = []
    for i in range(2000):
        eng.process({"type": "a" if i % 500 == 0 else "b", "ts": i})
        sizes.append(eng.runtime.buffer.size)
    assert max(sizes) <= 300 + 64 * 3  # checked every 64 events while over the cap
    assert eng.stats.shed_runs["long"] > 0 and "over max_buffer_per_query=300" in sink.getvalue()
    assert 300 < eng.stats.peak_buffer <= 300 + 64 * 3  # the size that passed the cap, not what the shed left


def test_a_shared_run_is_counted_once_and_shed_for_every_query_of_its_branch():
    sink = io.StringIO()
    eng = Engine(max_runs_per_query=500, reports=sink, dead_letters=DeadLetters())
    eng.register(RUNAWAY, name="to_c")
    eng.register(RUNAWAY.replace("c z", "d z"), name="to_d")
    eng.register("PATTERN SEQ(c x, d y)", name="other")
    for r in runaway_feed(30):
        eng.process(r)
    assert eng.stats.shed_runs["to_c"] == eng.stats.shed_runs["to_d"] > 0 and eng.stats.shed_runs["other"] == 0
    assert "query 'to_c', 'to_d': over max_runs_per_query=500" in sink.getvalue()


def test_a_query_without_a_window_says_its_state_is_growing():
    sink = io.StringIO()
    eng = Engine(reports=sink, dead_letters=DeadLetters())
    eng.register("PATTERN SEQ(a x, b y) WHERE skip_till_any_match(x, y)", name="forever")
    eng.register("PATTERN SEQ(a x, b y) WHERE skip_till_any_match(x, y) WITHIN 10", name="windowed")
    for i in range(20_000):  # (each a is one run; its event is held in the run, not in the buffer)
        eng.process({"type": "a", "ts": i})
    text = sink.getvalue()
    assert "query 'forever' has no window (WITHIN) and its state is growing" in text and "windowed" not in text


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(patterns(), streams(max_events=12), st.integers(1, 4), st.integers(1, 6))
def test_shedding_never_invents_a_match(pattern, events, max_runs, max_buffer):
    def run(p: Pattern, **caps):
        return matches_of(p, events, **caps)

    free, _ = run(pattern)
    capped, eng = run(pattern, max_runs_per_query=max_runs, max_buffer_per_query=max_buffer)
    if not eng.stats.shed_runs:
        assert capped == free
    elif pattern.policy == "non_overlapping":
        # With a run shed, the policy chooses among the runs left: a match that overlapped the lost
        # one may be reported in its place (docs/operations.md) — but it is a match of the pattern.
        every, _ = run(dataclasses.replace(pattern, policy="all"))
        assert not capped - every
    else:
        assert not capped - free


def test_cli_caps_and_stats(tmp_path, capsys):
    feed = tmp_path / "feed.jsonl"
    feed.write_text("".join(json.dumps(r) + "\n" for r in runaway_feed(200)))
    assert main(["run", "-q", RUNAWAY, "-i", str(feed), "--max-runs-per-query", "1000", "--stats"]) == 0
    err = capsys.readouterr().err
    assert "yfpp: warning: query 'q': over max_runs_per_query=1,000" in err
    assert "runs shed" in err and "runs shed)" in err


# --- event-set queries (docs/event_sets.md): the same caps, the same reports --------------------

SET_RUNAWAY = "PATTERN SEQ({a x, b+ y[]}, c z) WITHIN 1 hour"


@pytest.mark.parametrize("strategy", ["direct", "match-window"])
def test_runaway_set_query_is_capped_and_reported(strategy):
    sink = io.StringIO()
    eng = Engine(max_runs_per_query=2000, max_buffer_per_query=300, reports=sink, dead_letters=DeadLetters(),
                 strategy=strategy)
    eng.register(SET_RUNAWAY, name="sets")
    (matcher,) = eng.set_queries.values()
    peak = 0
    started = time.process_time()
    for r in runaway_feed(1000):  # 2^1000 matches; the search gives up after 2000 partial ones
        eng.process(r)
        peak = max(peak, matcher.size)
    assert eng.flush() == []
    assert time.process_time() - started < 30  # bounded work (a loose guard, not a timing claim)
    assert peak <= 300
    assert eng.stats.shed_runs["sets"] > 700
    lines = sink.getvalue().splitlines()
    assert len(lines) == 1 and lines[0].startswith("yfpp: warning: query 'sets': over max_buffer_per_query=300")


@pytest.mark.parametrize("strategy", ["direct", "match-window"])
def test_a_set_search_over_max_runs_is_given_up_and_reported(strategy):
    sink = io.StringIO()
    eng = Engine(max_runs_per_query=2000, reports=sink, dead_letters=DeadLetters(), strategy=strategy)
    eng.register(SET_RUNAWAY, name="sets")
    assert [m for r in runaway_feed(40) for m in eng.process(r)] + eng.flush() == []
    assert eng.stats.shed_runs["sets"] == 2000
    assert sink.getvalue().startswith("yfpp: warning: query 'sets': over max_runs_per_query=2,000; gave up the search")


def test_a_set_query_s_shed_runs_are_in_the_stats(tmp_path, capsys):
    feed = tmp_path / "runaway.jsonl"
    feed.write_text("".join(json.dumps(r) + "\n" for r in runaway_feed(40)))
    figures = tmp_path / "stats.json"
    assert main(["run", "-q", SET_RUNAWAY, "-i", str(feed), "--max-runs-per-query", "2000", "--stats",
                 "--stats-json", str(figures)]) == 0
    assert json.loads(figures.read_text())["runs_shed"] == {"q": 2000}
    assert "runs shed         2,000" in capsys.readouterr().err


@pytest.mark.parametrize("strategy", ["direct", "match-window"])
def test_events_older_than_tau_do_not_count_against_the_buffer_cap(strategy):
    """90 live events under a cap of 100: the 11 expired ones of other partitions are forgotten, not the live."""
    feed = [{"type": "A", "ts": i * 0.01, "k": 100 + i} for i in range(11)]
    feed += [{"type": "A", "ts": 10 + i * 0.01, "k": 0} for i in range(90)] + [{"type": "B", "ts": 11, "k": 0}]
    eng = Engine(max_buffer_per_query=100, reports=None, dead_letters=DeadLetters(), strategy=strategy)
    eng.register("PATTERN SEQ({A a}, {B b}) WHERE [k] WITHIN 5", name="q")
    assert len([m for r in feed for m in eng.process(r)] + eng.flush()) == 90 and not eng.stats.shed_runs


def test_matches_waiting_for_a_trailing_negation_are_capped():
    eng = Engine(max_runs_per_query=40, reports=None, dead_letters=DeadLetters())
    eng.register("PATTERN SEQ({A a, B b}, ~N n) WITHIN 100", name="q")
    (matcher,) = eng.set_queries.values()
    out = []
    for i in range(30):
        out += eng.process({"type": "AB"[i % 2], "ts": i * 0.1})
        assert len(matcher.deadlines) <= 40
    out += eng.flush()
    assert eng.stats.shed_runs["q"] > 0 and 0 < len(out) < 15 * 15


def test_earliest_maximal_holds_at_most_max_runs_matches():
    # (match-window releases a window's matches as it completes it: it holds none in between)
    eng = Engine(max_runs_per_query=50, reports=None, dead_letters=DeadLetters())
    eng.register("PATTERN {a x, b y} WITHIN 1000 OUTPUT earliest_maximal", name="em")
    (matcher,) = eng.set_queries.values()
    for i in range(200):
        eng.process({"type": "ab"[i % 2], "ts": i})
        assert matcher.held.size <= 50
    assert eng.stats.shed_runs["em"] > 0


@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
@given(set_patterns(), streams(max_events=10), st.integers(1, 6), st.integers(1, 6), st.sampled_from(["direct", "match-window"]))
def test_set_caps_never_invent_a_match(pattern, events, max_runs, max_buffer, strategy):
    def run(p: Pattern, **caps):
        return matches_of(p, events, strategy=strategy, **caps)

    free, _ = run(pattern)
    capped, eng = run(pattern, max_runs_per_query=max_runs, max_buffer_per_query=max_buffer)
    if not eng.stats.shed_runs:
        assert capped == free
    else:  # under a policy, a match the lost ones hid may come out in their place — a match of the pattern
        every, _ = run(dataclasses.replace(pattern, policy="all"))
        assert not capped - every


def test_a_set_search_deeper_than_the_recursion_limit_is_fine():
    # 1,500 b's in one window: the search binds them all on one path (it runs on an explicit stack)
    eng = Engine(max_runs_per_query=10**6, reports=None, dead_letters=DeadLetters())
    eng.register(SET_RUNAWAY, name="sets")
    assert [m for r in runaway_feed(1500) for m in eng.process(r)] == []
    assert eng.stats.shed_runs["sets"] == 10**6
