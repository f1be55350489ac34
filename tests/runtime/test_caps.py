"""Bounded memory (issue 8 item 8): per-query caps on runs and buffered events, growth reports."""

from __future__ import annotations

import dataclasses

import io
import json
import time
from collections import Counter

import pytest

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from tests.generators import CONTIGUITIES, TYPES, patterns, set_patterns, streams
from yfpp.cli import main
from yfpp.input.dead_letters import DeadLetters
from yfpp.engine import Engine
from yfpp.input.events import Event
from yfpp.errors import PatternError
from yfpp.language.pattern import Component, Kind, Pattern, variables
from yfpp.reference.oracle import reference_matches

RUNAWAY = "PATTERN SEQ(a x, b+ y[], c z) WHERE skip_till_any_match(x, y, z) WITHIN 1 hour"


def runaway_feed(n_b: int = 1000) -> list[dict]:
    return [{"type": "a", "ts": 0}] + [{"type": "b", "ts": 1 + i} for i in range(n_b)] + [{"type": "c", "ts": n_b + 1}]


def matches_of(p: Pattern, events: list[Event], name: str = "q", **opts) -> tuple[Counter, Engine]:
    """The matches of ``p`` alone on ``events`` (as JSON texts, counted) and the engine after them."""
    eng = Engine(dead_letters=DeadLetters(), reports=None, **opts)
    eng.register(p, name=name)
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


def test_a_shared_run_counts_for_each_query_and_each_shed_names_its_query():
    sink = io.StringIO()
    eng = Engine(max_runs_per_query=500, reports=sink, dead_letters=DeadLetters())
    eng.register(RUNAWAY, name="to_c")
    eng.register(RUNAWAY.replace("c z", "d z"), name="to_d")
    eng.register("PATTERN SEQ(c x, d y)", name="other")
    for r in runaway_feed(30):
        eng.process(r)
    assert eng.stats.shed_runs["to_c"] == eng.stats.shed_runs["to_d"] > 0 and eng.stats.shed_runs["other"] == 0
    lines = sink.getvalue().splitlines()
    assert [line.split(":")[1].strip() for line in lines] == ["warning", "warning"]
    assert "query 'to_c': over max_runs_per_query=500" in lines[0] and "query 'to_d': over max_runs_per_query=500" in lines[1]


SHELF = "PATTERN SEQ(shelf a, exit b) WHERE [tag] WITHIN 1 hour"
BUSY = "PATTERN SEQ(shelf a, counter+ c[], exit b) WHERE skip_till_any_match(a, c, b) { [tag] } WITHIN 1 hour"


def shelf_feed(tags: int = 6, counters: int = 12) -> list[dict]:
    """Per tag: a shelf, counters (every one doubles the busy query's runs), an exit."""
    feed = [{"type": "shelf", "ts": t, "tag": t} for t in range(tags)]
    feed += [{"type": "counter", "ts": tags + i, "tag": t} for i in range(counters) for t in range(tags)]
    return feed + [{"type": "exit", "ts": 100 + t, "tag": t} for t in range(tags)]


def outputs(queries: dict[str, str], feed: list[dict], **caps) -> tuple[dict[str, Counter], Engine]:
    """Each query's matches (JSON texts, counted) of ``queries`` registered together, and the engine."""
    eng = Engine(dead_letters=DeadLetters(), reports=None, **caps)
    for name, q in queries.items():
        eng.register(q, name=name)
    out: dict[str, Counter] = {name: Counter() for name in queries}
    for m in [m for r in feed for m in eng.process(r)] + eng.flush():
        out[m["query"]][json.dumps(m, sort_keys=True)] += 1
    return out, eng


def test_a_query_keeps_its_matches_beside_a_sharer_over_the_cap():
    """The shelf query shares its first node with a busy one: the busy one is shed, the shelf query loses nothing."""
    alone, _ = outputs({"shelf": SHELF}, shelf_feed(), max_runs_per_query=200)
    both, eng = outputs({"shelf": SHELF, "busy": BUSY}, shelf_feed(), max_runs_per_query=200)
    assert len(eng.runtime.branch_queries) == 1  # one branch: the shelf node is shared
    assert both["shelf"] == alone["shelf"] and len(alone["shelf"]) == 6
    assert eng.stats.shed_runs["busy"] > 0 and "shelf" not in eng.stats.shed_runs
    busy_alone, _ = outputs({"busy": BUSY}, shelf_feed(), max_runs_per_query=200)
    assert both["busy"] == busy_alone["busy"]  # and the busy one loses what it loses alone
    assert eng.reports == [line for line in eng.reports if "'busy'" in line] and len(eng.reports) == 1


HOARDER = "PATTERN SEQ(shelf a, counter+ c[], exit b) WHERE [tag] WITHIN 1 hour"


def test_a_query_keeps_its_matches_beside_a_sharer_over_the_buffer_cap():
    """The shelf query shares its first node with one that buffers every counter event: that one goes over
    max_buffer_per_query and is shed, counted against it alone; the shelf query's matches are those it has
    alone, and the reference evaluator's."""
    feed = shelf_feed(tags=6, counters=40)
    alone, _ = outputs({"shelf": SHELF}, feed, max_buffer_per_query=64)
    both, eng = outputs({"shelf": SHELF, "hoarder": HOARDER}, feed, max_buffer_per_query=64)
    assert len(eng.runtime.branch_queries) == 1  # one branch: the shelf node is shared
    assert both["shelf"] == alone["shelf"] and len(alone["shelf"]) == 6
    assert eng.stats.shed_runs["hoarder"] > 0 and "shelf" not in eng.stats.shed_runs
    free, _ = outputs({"hoarder": HOARDER}, feed)
    assert sum(both["hoarder"].values()) < sum(free["hoarder"].values())  # (its shed cost it matches)
    assert eng.reports == [line for line in eng.reports if "'hoarder'" in line] and len(eng.reports) == 1
    assert "max_buffer_per_query=64" in eng.reports[0]


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


@st.composite
def sharers(draw, p: Pattern) -> Pattern:
    """A query that begins as ``p`` does, so shares its first nodes: a prefix of ``p`` up to one of its positive
    components (the predicates on the components kept), maybe one more component, its own window."""
    ends = [i for i, c in enumerate(p.components) if c.positive]
    comps = list(p.components[:draw(st.sampled_from(ends)) + 1])
    if draw(st.booleans()):
        comps.append(Component("w", draw(st.sampled_from(TYPES)), draw(st.sampled_from([Kind.SINGLE, Kind.KLEENE])),
                               draw(st.sampled_from(CONTIGUITIES))))
    kept = {c.var for c in comps}
    where = tuple(e for e in p.where if variables(e) <= kept)
    window = draw(st.one_of(st.none(), st.integers(0, 6)))
    try:
        return Pattern(tuple(comps), where, p.partition_by, window, "all").validate()
    except PatternError:
        assume(False)
        raise


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.data(), patterns(), streams(max_events=14), st.integers(1, 4))
def test_a_query_s_matches_under_the_runs_cap_do_not_depend_on_its_sharers(data, pattern, events, cap):
    others = data.draw(st.lists(sharers(pattern), min_size=1, max_size=3))
    alone, eng_alone = matches_of(pattern, events, max_runs_per_query=cap)
    eng = Engine(dead_letters=DeadLetters(), reports=None, max_runs_per_query=cap)
    eng.register(pattern, name="q")
    for i, other in enumerate(others):
        eng.register(other, name=f"s{i}")
    out = [m for e in events for m in eng.process(Event(e.type, e.ts, dict(e.attrs), e.seq))] + eng.flush()
    together = Counter(json.dumps(m, sort_keys=True) for m in out if m["query"] == "q")
    assert together == alone
    assert eng.stats.shed_runs.get("q", 0) == eng_alone.stats.shed_runs.get("q", 0)
    for i, other in enumerate(others):  # and each sharer's, beside q and the others, is its own alone
        own, _ = matches_of(other, events, name=f"s{i}", max_runs_per_query=cap)
        mine = Counter(json.dumps(m, sort_keys=True) for m in out if m["query"] == f"s{i}")
        assert mine == own


@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.data(), patterns(), streams(max_events=14), st.integers(1, 4), st.integers(1, 6))
def test_under_both_caps_a_query_s_matches_do_not_depend_on_its_sharers(data, pattern, events, max_runs, max_buffer):
    """Under the buffer cap as under the runs cap a query counts only its own buffered events (those of its
    components from its oldest counted run's start on), so beside sharers it is shed exactly as alone and its
    matches are the same; when nothing of it is shed they are the reference evaluator's."""
    caps = {"max_runs_per_query": max_runs, "max_buffer_per_query": max_buffer}
    others = data.draw(st.lists(sharers(pattern), min_size=1, max_size=3))
    alone, eng_alone = matches_of(pattern, events, **caps)
    eng = Engine(dead_letters=DeadLetters(), reports=None, **caps)
    eng.register(pattern, name="q")
    for i, other in enumerate(others):
        eng.register(other, name=f"s{i}")
    out = [m for e in events for m in eng.process(Event(e.type, e.ts, dict(e.attrs), e.seq))] + eng.flush()
    together = Counter(json.dumps(m, sort_keys=True) for m in out if m["query"] == "q")
    assert together == alone
    assert eng.stats.shed_runs.get("q", 0) == eng_alone.stats.shed_runs.get("q", 0)
    if not eng_alone.stats.shed_runs.get("q") and pattern.policy == "all" and pattern.components[-1].positive:
        want = Counter(_canon(b) for b, _ in reference_matches(pattern, events))
        assert Counter(_canon(json.loads(m)["bindings"]) for m in together.elements()) == want


def _canon(bindings: dict[str, list[int]]) -> tuple:
    return tuple(sorted((k, tuple(v)) for k, v in bindings.items()))


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
