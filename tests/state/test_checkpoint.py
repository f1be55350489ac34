"""Snapshot and restore (issue 8 item 9): a restored engine goes on exactly as the original would."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from unittest.mock import patch

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.generators import patterns, set_patterns, streams
from yfpp.state import checkpoint
from yfpp.state.checkpoint import (Cancelled, EncodedPatterns, encode_pattern, read_checkpoint, snapshot, write_checkpoint,
                                   write_pieces)
from yfpp.cli import main
from yfpp.input.dead_letters import DeadLetters
from yfpp.engine import Engine
from yfpp.errors import YfppError
from yfpp.input.events import Event

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "yfpp" / "data" / "sample_rfid.xml"
SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))


def engine(pats, max_delay: float, strategy: str = "direct") -> Engine:
    eng = Engine(max_delay=max_delay, dead_letters=DeadLetters(), strategy=strategy)
    for i, p in enumerate(pats):
        eng.register(p, name=f"q{i}")
    return eng


def feed(eng: Engine, events: list[Event]) -> list[str]:
    out = []
    for e in events:
        out += eng.process(Event(e.type, e.ts, dict(e.attrs), e.seq))
    return [json.dumps(m, sort_keys=True) for m in out]


def finish(eng: Engine) -> list[str]:
    return [json.dumps(m, sort_keys=True) for m in eng.flush()]


def reloaded(eng: Engine) -> Engine:
    """Through JSON text, as a checkpoint file holds it."""
    return Engine.restore(json.loads(json.dumps(eng.snapshot(), allow_nan=False)), dead_letters=DeadLetters())


@SETTINGS
@given(st.lists(patterns(), min_size=1, max_size=2), streams(max_events=12), st.sampled_from([0, 2]), st.data())
def test_restore_at_a_checkpoint_continues_exactly(pats, events, max_delay, data):
    whole = engine(pats, max_delay)
    want = feed(whole, events) + finish(whole)
    cut = data.draw(st.integers(0, len(events)))
    first = engine(pats, max_delay)
    before = feed(first, events[:cut])
    restored = reloaded(first)
    after = feed(restored, events[cut:]) + finish(restored)
    assert Counter(before + after) == Counter(want)
    assert restored.stats.events == whole.stats.events and restored.stats.matches == whole.stats.matches


@SETTINGS
@given(st.lists(patterns(), min_size=1, max_size=2), streams(max_events=12), st.integers(1, 4), st.data())
def test_a_kill_between_checkpoints_loses_nothing_and_repeats_only_after_the_last(pats, events, every, data):
    whole = engine(pats, 0)
    want = feed(whole, events) + finish(whole)
    kill = data.draw(st.integers(0, len(events)))
    eng = engine(pats, 0)
    written: list[str] = []
    snap, at_snap, consumed = None, 0, 0
    for i, e in enumerate(events[:kill]):
        written += feed(eng, [e])
        if (i + 1) % every == 0:
            snap, at_snap, consumed = json.loads(json.dumps(eng.snapshot(), allow_nan=False)), len(written), i + 1
    # killed: everything written so far stays written; resume from the last checkpoint (or the start)
    resumed = Engine.restore(snap, dead_letters=DeadLetters()) if snap else engine(pats, 0)
    again = feed(resumed, events[consumed:]) + finish(resumed)
    assert Counter(written[:at_snap] + again) == Counter(want)  # nothing missing, nothing invented
    repeats = Counter(written) + Counter(again) - Counter(want)
    assert not repeats - Counter(written[at_snap:])  # repeated: only matches after the last checkpoint
    ids = {json.loads(m)["id"] for m in written}
    assert {json.loads(m)["id"] for m in repeats.elements()} <= ids  # and a receiver can tell them by id


def test_snapshot_holds_the_whole_state_and_checks_its_version(tmp_path):
    eng = Engine(max_delay=5, dead_letters=DeadLetters(), max_runs_per_query=1000)
    eng.register("PATTERN SEQ(shelf a, ~register b) WHERE [tag_id] WITHIN 10", name="lost")
    eng.register("PATTERN SEQ(shelf a, ~register b, exit c) WHERE [tag_id] WITHIN 10", name="theft")
    for r in [{"type": "shelf", "ts": 0, "tag_id": 1}, {"type": "register", "ts": 1, "tag_id": 2}, {"type": "shelf", "ts": 6, "tag_id": 2}]:
        eng.process(r)
    path = tmp_path / "ck.json"
    write_checkpoint(eng, path)
    assert [p.name for p in tmp_path.iterdir()] == ["ck.json"]  # the temp file was renamed
    data = read_checkpoint(path)
    assert data["format"] == "yfpp-checkpoint" and data["version"] == 3
    assert [q[1] for q in data["queries"]] == ["lost", "theft"] and data["options"]["max_runs_per_query"] == 1000
    assert len(data["held"]) == 1 and len(data["pending"]) == 1 and data["stream"]["next_seq"] == 3
    back = Engine.restore(data, dead_letters=DeadLetters())
    assert back.held == 1 and back.runtime.max_runs == 1000 and back.max_delay == 5
    assert [m["query"] for m in back.flush()] == ["lost", "lost"]
    with pytest.raises(YfppError, match="version"):
        Engine.restore({**data, "version": 99})
    with pytest.raises(YfppError, match="not a yfpp checkpoint"):
        Engine.restore({"runs": []})
    with pytest.raises(YfppError, match="corrupt"):
        Engine.restore({**data, "runs": [{"state": [[7, 0], "in"]}]})
    for next_seq in ("abc", None, -3):  # yfpp run --restore compares seqs with it: caught here, not there
        with pytest.raises(YfppError, match="corrupt checkpoint: stream.next_seq: expected an integer >= 0"):
            Engine.restore({**data, "stream": {**data["stream"], "next_seq": next_seq}})
    deep = [[]]
    for _ in range(5000):
        deep = [deep]
    with pytest.raises(YfppError, match="corrupt checkpoint: RecursionError"):
        Engine.restore({**data, "queries": [[*data["queries"][0][:2], None, {"$ir": "Pattern", "components": deep},
                                             data["queries"][0][4]]]})
    path.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(YfppError, match="not a checkpoint: nested too deeply"):
        read_checkpoint(path)


def test_xml_events_keep_their_element_for_xpath_predicates():
    from yfpp.input.readers import read_events

    query = "[tag_id]&&//shelf[@zone='Z1']//exit&&(12 hours)"
    events = list(read_events(str(SAMPLE), dead_letters=DeadLetters()))
    whole = Engine(dead_letters=DeadLetters())
    whole.register(query, name="q")
    want = feed(whole, events) + finish(whole)
    first = Engine(dead_letters=DeadLetters())
    first.register(query, name="q")
    before = feed(first, events[:150])
    restored = reloaded(first)
    assert want and Counter(before + feed(restored, events[150:]) + finish(restored)) == Counter(want)


def killed_after(events: int, read_event_batches):
    """``read_event_batches`` of a process that dies (Ctrl-C) after handing on ``events`` events."""

    def read(*a, **k):
        n = 0
        for batch in read_event_batches(*a, **k):
            yield batch[:events - n]
            n += len(batch)
            if n >= events:
                raise KeyboardInterrupt  # the process dies here

    return read


def test_cli_checkpoint_and_restore_after_a_kill(tmp_path, monkeypatch):
    import yfpp.input.readers

    query = str(ROOT / "queries/shoplifting.sase")
    full = tmp_path / "full.jsonl"
    assert main(["run", "-q", query, "-i", str(SAMPLE), "-o", str(full)]) == 0
    real = yfpp.input.readers.read_event_batches
    first, ck = tmp_path / "first.jsonl", tmp_path / "ck.json"
    monkeypatch.setattr(yfpp.input.readers, "read_event_batches", killed_after(250, real))
    assert main(["run", "-q", query, "-i", str(SAMPLE), "-o", str(first), "--checkpoint", str(ck), "--checkpoint-every", "100"]) == 130
    monkeypatch.setattr(yfpp.input.readers, "read_event_batches", real)
    assert read_checkpoint(ck)["stream"]["next_seq"] == 200
    rest = tmp_path / "rest.jsonl"
    assert main(["run", "--restore", str(ck), "-i", str(SAMPLE), "-o", str(rest)]) == 0
    want, got = full.read_text().splitlines(), first.read_text().splitlines() + rest.read_text().splitlines()
    assert set(got) == set(want) and len(want) > 5
    assert main(["run", "--restore", str(ck), "-q", query, "-i", str(SAMPLE)]) == 2  # the queries come from the checkpoint


def test_restore_reads_the_input_as_the_checkpoints_run_did(tmp_path, capsys):
    """A checkpoint keeps the reader options: --restore without --ts-unit ms must not read ms as seconds."""
    feed = tmp_path / "feed.jsonl"
    feed.write_text("".join(json.dumps({"type": t, "ts": i * 1000 + d, "tag_id": i}) + "\n"
                            for i in range(40) for t, d in (("shelf", 0), ("exit", 200))))
    query = "PATTERN SEQ(shelf a, exit c) WHERE [tag_id] WITHIN 250"  # 250 ms
    full, ck = tmp_path / "full.jsonl", tmp_path / "ck.json"
    assert main(["run", "-q", query, "-i", str(feed), "--ts-unit", "ms", "-o", str(full),
                 "--checkpoint", str(ck), "--checkpoint-every", "30"]) == 0
    assert read_checkpoint(ck)["reader"]["ts_unit"] == "ms"
    rest = tmp_path / "rest.jsonl"
    assert main(["run", "--restore", str(ck), "-i", str(feed), "-o", str(rest)]) == 0
    assert len(full.read_text().splitlines()) == 40 and rest.read_text().splitlines() == full.read_text().splitlines()[-10:]  # after the checkpoint at 60 events
    capsys.readouterr()
    assert main(["run", "--restore", str(ck), "-i", str(feed), "--ts-unit", "s"]) == 2
    assert "read its input with --ts-unit ms" in capsys.readouterr().err
    assert main(["run", "--restore", str(ck), "-i", str(feed), "--ts-unit", "ms", "-o", str(rest)]) == 0  # the same: fine
    assert main(["run", "--restore", str(ck), "-i", str(feed), "--format", "xml"]) == 2


def test_restore_of_an_input_read_in_the_wrong_format_is_an_error(tmp_path, capsys):
    """Without reader options in the checkpoint (one from Engine.snapshot), a wrong --format gives no events: the
    consumed part's dead letters are not repeated, but they still make it an error, as without --restore."""
    feed = tmp_path / "feed.jsonl"
    feed.write_text("".join(json.dumps({"type": "shelf", "ts": i}) + "\n" for i in range(10)))
    engine = Engine()
    engine.register("PATTERN SEQ(shelf a, exit c)")
    for i in range(5):
        engine.process({"type": "shelf", "ts": i})
    ck = tmp_path / "ck.json"
    write_checkpoint(engine, ck)
    assert main(["run", "--restore", str(ck), "-i", str(feed), "--format", "xml"]) == 2
    assert "no events in" in capsys.readouterr().err


def test_restore_keeps_the_checkpoints_feedback_guards_and_full_events(tmp_path):
    feed = tmp_path / "feed.jsonl"
    feed.write_text('{"type":"x","ts":0,"n":0}\n{"type":"y","ts":1}\n{"type":"x","ts":2,"n":0}\n')
    query, ck = "//x => x(n = e1.n + 1) feedback", tmp_path / "ck.json"
    whole, rest = tmp_path / "whole.jsonl", tmp_path / "rest.jsonl"
    opts = ["--max-feedback-depth", "2", "--events", "--dead-letters", str(tmp_path / "dead.jsonl")]
    assert main(["run", "-q", query, "-i", str(feed), "-o", str(whole), *opts]) == 0
    assert main(["run", "-q", query, "-i", str(feed), "-o", str(tmp_path / "first.jsonl"), *opts,
                 "--checkpoint", str(ck), "--checkpoint-every", "2"]) == 0
    assert main(["run", "--restore", str(ck), "-i", str(feed), "-o", str(rest), "--dead-letters", str(tmp_path / "d2")]) == 0
    after = [line for line in whole.read_text().splitlines() if json.loads(line)["start"] == 2.0]
    assert rest.read_text().splitlines() == after and len(after) == 3 and all('"events"' in line for line in after)


def test_a_snapshot_is_strict_json_and_survives_any_json_library():
    """±inf (the watermark after advance_time, a deadline that overflows, an attribute given from Python) is
    written as {"$float": "-inf"}: strict parsers read it, and orjson does not turn it into null."""
    import orjson

    eng = Engine(max_delay=2)
    eng.register("PATTERN SEQ(a x, ~b y) WITHIN 1e308", name="quiet")
    eng.register("PATTERN SEQ(a x, c z) WHERE x.v < z.v", name="pair")
    eng.process({"type": "a", "ts": 1e308, "v": float("-inf")})
    eng.advance_time(1e308)
    restored = Engine.restore(orjson.loads(json.dumps(eng.snapshot(), allow_nan=False)))
    later = [Event("c", 1.5e308, {"v": 0.0})]
    got, want = feed(restored, later) + finish(restored), feed(eng, later) + finish(eng)
    assert got == want and sorted(json.loads(m)["query"] for m in want) == ["pair", "quiet"]


def test_restore_neither_repeats_a_dead_letter_the_reader_had_reported_ahead_nor_warns_of_consumed_types(tmp_path, capsys):
    """The reader reads a block ahead of the engine: a bad record just past the checkpoint's cut was reported
    (and counted in the checkpoint) before it; the restored run must not report it again."""
    feed = tmp_path / "feed.jsonl"
    feed.write_text('{"type":"a","ts":1}\n{"type":"b","ts":2}\nnot json\n{"type":"b","ts":3}\n')
    ck, stats = tmp_path / "ck.json", tmp_path / "stats.json"
    query = "PATTERN SEQ(a x, b y) RETURN r(n = 1) FEEDBACK"
    assert main(["run", "-q", query, "-i", str(feed), "--checkpoint", str(ck), "--checkpoint-every", "2",
                 "--dead-letters", str(tmp_path / "d1.jsonl"), "-o", str(tmp_path / "o1")]) == 0
    dead = tmp_path / "d2.jsonl"
    capsys.readouterr()
    assert main(["run", "--restore", str(ck), "-i", str(feed), "--dead-letters", str(dead), "--stats-json", str(stats),
                 "-o", str(tmp_path / "o2")]) == 0
    figures = json.loads(stats.read_text())
    assert dead.read_text() == "" and figures["dead_letters"] == 1 and figures["derived_events"] == 1  # (the match a, b@2: before the cut)
    assert "never seen" not in capsys.readouterr().err  # 'a' came before the cut


def test_checkpoint_every_needs_a_checkpoint(capsys):
    assert main(["run", "-q", "//a//b", "-i", str(SAMPLE), "--checkpoint-every", "5"]) == 2
    assert "--checkpoint-every needs --checkpoint FILE" in capsys.readouterr().err


@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(st.one_of(set_patterns(max_vars=3), patterns(max_positives=2)), min_size=1, max_size=3),
       streams(max_events=10), st.sampled_from([0, 2]), st.sampled_from(["direct", "match-window"]), st.data())
def test_restore_with_set_queries_continues_exactly(pats, events, max_delay, strategy, data):
    whole = engine(pats, max_delay, strategy)
    want = feed(whole, events) + finish(whole)
    cut = data.draw(st.integers(0, len(events)))
    first = engine(pats, max_delay, strategy)
    before = feed(first, events[:cut])
    restored = reloaded(first)
    assert restored.strategy == strategy and len(restored.set_queries) == len(first.set_queries)
    after = feed(restored, events[cut:]) + finish(restored)
    assert Counter(before + after) == Counter(want)
    assert restored.stats.matches == whole.stats.matches


def test_derived_events_keep_their_provenance_across_a_restore():
    """A fed-back alert held in a run across the cut still shows its "from" in full-event output."""
    from yfpp.language.query_text import load_queries
    from yfpp.input.readers import read_events

    queries = load_queries([str(ROOT / "queries" / "break_in.xpe")])
    events = list(read_events(str(ROOT / "yfpp" / "data" / "break_in.xml"), dead_letters=DeadLetters()))

    def fresh() -> Engine:
        eng = Engine(full_events=True, dead_letters=DeadLetters())
        for q in queries:
            eng.register(q.text, name=q.name)
        return eng

    whole = fresh()
    want = feed(whole, events) + finish(whole)
    assert any('"from"' in m for m in want if '"break_in"' in m)
    for cut in range(1, len(events)):
        first = fresh()
        before = feed(first, events[:cut])
        restored = Engine.restore(json.loads(json.dumps(first.snapshot())), full_events=True,
                                  dead_letters=DeadLetters())
        assert before + feed(restored, events[cut:]) + finish(restored) == want, cut


@pytest.mark.parametrize("strategy", ["direct", "match-window"])
def test_cli_checkpoint_and_restore_with_a_set_query(tmp_path, monkeypatch, strategy):
    import yfpp.input.readers

    query, chemo = str(ROOT / "queries/chemo_q1.sase"), str(ROOT / "yfpp/data/chemo.jsonl")
    full = tmp_path / "full.jsonl"
    assert main(["run", "-q", query, "-i", chemo, "-o", str(full), "--strategy", strategy]) == 0
    real = yfpp.input.readers.read_event_batches
    first, ck = tmp_path / "first.jsonl", tmp_path / "ck.json"
    monkeypatch.setattr(yfpp.input.readers, "read_event_batches", killed_after(11, real))
    assert main(["run", "-q", query, "-i", chemo, "-o", str(first), "--checkpoint", str(ck), "--checkpoint-every", "10",
                 "--strategy", strategy]) == 130
    monkeypatch.setattr(yfpp.input.readers, "read_event_batches", real)
    data = read_checkpoint(ck)
    assert data["stream"]["next_seq"] == 10 and data["options"]["strategy"] == strategy and data["set_queries"]
    rest = tmp_path / "rest.jsonl"
    for flags in (["--strategy", strategy], ["--policy", "all", "--max-delay", "0"]):  # the checkpoint's are kept
        assert main(["run", "--restore", str(ck), "-i", chemo, "-o", str(rest), *flags]) == 2
    assert main(["run", "--restore", str(ck), "-i", chemo, "-o", str(rest)]) == 0
    want, got = full.read_text().splitlines(), first.read_text().splitlines() + rest.read_text().splitlines()
    assert set(got) == set(want) and len(want) == 11


def test_an_event_attribute_that_is_an_object_survives_a_checkpoint():
    """An object given as an attribute from Python was read back as a "$float" number and refused: such a
    checkpoint could not be restored. Objects that look like the encoding itself come back as they were."""
    eng = Engine(dead_letters=DeadLetters(), full_events=True)
    eng.register("PATTERN SEQ(a x, b y) WITHIN 10", name="q")
    for i, o in enumerate([{"p": 1}, {"$float": "inf"}, {"$dict": 3}]):
        eng.process({"type": "a", "ts": i, "o": o, "inf": float("inf")})
    back = Engine.restore(json.loads(json.dumps(eng.snapshot(), allow_nan=False)), dead_letters=DeadLetters())
    got, want = back.process({"type": "b", "ts": 5}), eng.process({"type": "b", "ts": 5})
    assert got == want and [m["events"]["x"][0]["attrs"]["o"] for m in got] == [{"p": 1}, {"$float": "inf"}, {"$dict": 3}]


@settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(patterns(), min_size=1, max_size=3), st.data())
def test_patterns_encoded_once_give_the_same_checkpoint(pats, data):
    """A checkpoint with its patterns kept encoded (EncodedPatterns) is the one without; an entry made from
    another pattern object than the query's (one replaced since) is not used."""
    eng = engine(pats, 0)
    kept = EncodedPatterns()
    for qid, (pattern, _, _) in eng.sources.items():
        kept.keep(qid, pattern)
    stale = data.draw(st.sampled_from(sorted(eng.sources)))
    kept.keep(stale, data.draw(patterns()))
    eng.register(data.draw(patterns()), name="new")  # (none kept)
    assert eng.snapshot() == snapshot(eng, kept)
    restored = Engine.restore(json.loads(json.dumps(snapshot(eng, kept))))
    assert restored.snapshot() == eng.snapshot()


@settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(patterns(), min_size=1, max_size=3), streams(max_events=8), st.data())
def test_a_checkpoint_written_with_the_kept_texts_of_patterns_holds_the_snapshot(tmp_path_factory, pats, stream, data):
    """write_checkpoint with EncodedPatterns writes the kept JSON text of each pattern as it is: the file reads
    back as the snapshot (and the extra fields) whether an entry has its text (encoded there), has none (kept
    as a checkpoint held it), is stale (another pattern object) or is missing; the same for a query registered
    as text and its text kept split around its constants; and whatever the pieces its lists are written in."""
    eng = engine(pats, 0)
    for ev in stream:
        eng.process(ev)
    kept = EncodedPatterns()
    for qid, (pattern, _, _) in eng.sources.items():
        if data.draw(st.booleans()):
            kept.keep(qid, pattern)
        else:
            kept.keep(qid, pattern, json.loads(json.dumps(encode_pattern(pattern))))
    stale = data.draw(st.sampled_from(sorted(eng.sources)))
    kept.keep(stale, data.draw(patterns()))
    by_text = eng.register("PATTERN SEQ(a x) WHERE x.v = 7 AND x.w = 'z'", name="by_text")  # (a row of a shape)
    how = data.draw(st.sampled_from(["kept", "as the data has it", "stale", "missing"]))
    text = eng.sources[by_text][1]
    if how == "kept":
        kept.keep_text(by_text, text)
    elif how == "as the data has it":
        kept.keep_text(by_text, text, (["PATTERN SEQ(a x) WHERE x.v = ", " AND x.w = ", ""], ["7", "'z'"]))
    elif how == "stale":  # (another text than the query's now: not used)
        kept.keep_text(by_text, "PATTERN SEQ(a x) WHERE x.v = 8")
    eng.register(data.draw(patterns()), name="new")  # (none kept)
    path = tmp_path_factory.mktemp("cp") / "cp.json"
    with patch.object(checkpoint, "_PIECE", data.draw(st.integers(1, 3))):  # (every list written in pieces)
        write_checkpoint(eng, path, {"service": {"queries": {"q": ["x", None, None]}}}, kept)
    assert read_checkpoint(path) == json.loads(json.dumps({**eng.snapshot(), "service": {"queries": {"q": ["x", None, None]}}}))
    back = {k: v for k, v in read_checkpoint(path).items() if k != "service"}
    assert Engine.restore(back).snapshot() == eng.snapshot()


@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(st.one_of(patterns(), set_patterns(max_vars=3)), min_size=1, max_size=3), streams(max_events=12),
       st.sampled_from([0, 2]), st.booleans(), st.data())
def test_what_the_engine_does_after_a_take_does_not_change_what_it_holds(pats, events, max_delay, merge_runs, data):
    """checkpoint.take copies what the engine changes and shares the rest; its data, made after the engine went
    on (more events, a query unregistered and one registered, a flush), is the snapshot of the moment of the
    take."""
    eng = Engine(max_delay=max_delay, dead_letters=DeadLetters(), merge_runs=merge_runs)
    for i, p in enumerate(pats):
        eng.register(p, name=f"q{i}")
    cut = data.draw(st.integers(0, len(events)))
    feed(eng, events[:cut])
    want = json.dumps(snapshot(eng, EncodedPatterns()), allow_nan=False, sort_keys=True)
    taken = checkpoint.take(eng, EncodedPatterns())
    feed(eng, events[cut:])
    eng.unregister(data.draw(st.sampled_from(sorted(eng.queries) + sorted(eng.set_queries))))
    eng.register(data.draw(patterns()), name="new")
    feed(eng, events)
    eng.flush()
    assert json.dumps(taken.data(), allow_nan=False, sort_keys=True) == want


def test_a_cancelled_write_leaves_no_file(tmp_path):
    """write_pieces asks ``cancelled`` between pieces: once it says so, Cancelled, and neither the file nor a
    temp file is left."""
    path = tmp_path / "cp.json"
    said = iter([False, False, True])
    with pytest.raises(Cancelled):
        write_pieces(["[", "1", ",2", "]"], path, lambda: next(said))
    assert list(tmp_path.iterdir()) == []
    write_pieces(["[", "1", ",2", "]"], path, lambda: False)
    assert json.loads(path.read_text()) == [1, 2]
