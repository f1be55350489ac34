"""Checkpoints against a base (yfpp.state.query_base): the queries written once, then what changed since."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from unittest.mock import patch

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.generators import patterns, streams
from yfpp.engine import Engine
from yfpp.errors import YfppError
from yfpp.input.dead_letters import DeadLetters
from yfpp.input.events import Event
from yfpp.state import checkpoint, query_base
from yfpp.state.checkpoint import EncodedPatterns, json_pieces, snapshot, write_pieces
from yfpp.state.query_base import QueryBase, base_name

TEXT = "PATTERN SEQ(A x, B y) WHERE skip_till_any_match(x, y) {{ x.x = {k} AND y.k = x.k }} WITHIN 5"
STEPS = st.lists(st.tuples(st.sampled_from(["text", "pattern", "drop", "events", "checkpoint", "given up"]),
                           st.integers(0, 11)), max_size=16)


def write(eng: Engine, base: QueryBase, path: Path, patterns: EncodedPatterns, keyed: dict, keep: bool) -> None:
    """A checkpoint of ``eng`` against ``base`` in ``path`` (its new base first, if it takes one), as the service
    writes it; given up instead of put in place unless ``keep``."""
    taken = checkpoint.take(eng, patterns, base)
    changed, removed = taken.against.keyed(keyed)
    data = taken.data()
    data["keyed"] = [changed, removed]
    taken.against.write_base(path, patterns)
    staged = path.with_name(path.name + ".staged")
    write_pieces(json_pieces(data, patterns), staged)
    if keep:
        staged.replace(path)
        base.committed(taken.against)
    else:
        staged.unlink()
        base.discarded(taken.against)


def read(path: Path) -> tuple[str, dict]:
    """The engine ``path`` restores, as its whole snapshot's JSON, and the keyed map."""
    data, keyed, _ = query_base.read(path)
    changed, removed = data.pop("keyed")
    keyed = {**{k: v for k, v in keyed.items() if k not in removed}, **changed}
    return json.dumps(Engine.restore(data, dead_letters=DeadLetters()).snapshot(), sort_keys=True), keyed


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(streams(max_events=12), STEPS, st.sampled_from([2, 100_000]), st.data())
def test_checkpoints_against_a_base_restore_what_a_whole_snapshot_holds(events, steps, max_runs, data):
    """Queries registered (as text and as patterns) and unregistered, events between (runs shed over
    ``max_runs``: a query's since_tick rises), checkpoints put in place or given up: each checkpoint in place
    restores the engine its whole snapshot held at its take, and the keyed map of then; after each, the
    checkpoint's file and its base are all there is."""
    eng = Engine(max_delay=2, dead_letters=DeadLetters(), max_runs_per_query=max_runs)
    keyed: dict[str, list] = {}
    fed = 0
    with tempfile.TemporaryDirectory() as tmp, patch.object(query_base, "MIN_CHANGES", 2):
        path = Path(tmp) / "engine-checkpoint.json"
        base, encoded = QueryBase(path), EncodedPatterns()
        want = None
        for i, (step, k) in enumerate(steps):
            if step == "text":
                eng.register(TEXT.format(k=k % 4), name=f"t{i}")
                keyed[f"t{i}"] = [k]
            elif step == "pattern":
                eng.register(data.draw(patterns()), name=f"p{i}")
            elif step == "drop" and eng.queries:
                qid = sorted(eng.queries)[k % len(eng.queries)]
                keyed.pop(eng.queries[qid].name, None)
                eng.unregister(qid)
            elif step == "events":
                for ev in events[fed:fed + k]:
                    eng.process(Event(ev.type, ev.ts, dict(ev.attrs), ev.seq))
                fed = min(fed + k, len(events))
            elif step in ("checkpoint", "given up"):
                whole = json.dumps(snapshot(eng), sort_keys=True)
                write(eng, base, path, encoded, dict(keyed), step == "checkpoint")
                if step == "checkpoint":
                    want = (whole, dict(keyed))
                if want is not None:
                    assert read(path) == want
                    token = json.loads(path.read_text())["base"]["token"]
                    assert sorted(p.name for p in Path(tmp).iterdir()) == [path.name, base_name(path, token)]


def test_a_checkpoint_whose_base_is_missing_or_another_is_refused(tmp_path):
    """A checkpoint against a base reads only with that base beside it; Engine.restore refuses it unmerged."""
    path = tmp_path / "engine-checkpoint.json"
    eng = Engine()
    eng.register(TEXT.format(k=1), name="q")
    base, patterns = QueryBase(path), EncodedPatterns()
    write(eng, base, path, patterns, {}, True)
    data = json.loads(path.read_text())
    with pytest.raises(YfppError, match="base file"):
        Engine.restore(data)
    other = tmp_path / base_name(path, "0" * 12)
    base_file = path.with_name(base_name(path, data["base"]["token"]))
    base_file.rename(other)
    with pytest.raises(YfppError, match="corrupt checkpoint: its base: cannot read"):
        query_base.read(path)
    path.write_text(json.dumps({**data, "base": {"token": "0" * 12}}))
    with pytest.raises(YfppError, match="is not the base"):
        query_base.read(path)
    path.write_text(json.dumps({**data, "base": {"token": "../x"}}))
    with pytest.raises(YfppError, match="not a base's token"):
        query_base.read(path)


def test_an_idle_engine_is_not_walked_again_and_its_checkpoint_holds_no_query(tmp_path):
    """With nothing registered or removed since its base, a checkpoint takes no query row and walks no query's
    nodes; a query registered since is the one row it holds."""
    path = tmp_path / "engine-checkpoint.json"
    eng = Engine()
    for k in range(50):
        eng.register(TEXT.format(k=k), name=f"q{k}")
    eng.process(Event("A", 1.0, {"x": 3, "k": 0}, 0))
    base, patterns = QueryBase(path), EncodedPatterns()
    write(eng, base, path, patterns, {}, True)
    walked = []
    real = checkpoint.NodeRefs.get

    def get(self, node):
        walked.append(self._walked)
        return real(self, node)

    with patch.object(checkpoint.NodeRefs, "get", get):
        write(eng, base, path, patterns, {}, True)
        data = json.loads(path.read_text())
        assert data["queries"] == [] and data["shapes"] == [] and len(data["runs"]) == 1
        assert walked and not any(walked)
        eng.register(TEXT.format(k=99), name="new")
        write(eng, base, path, patterns, {}, True)
        data = json.loads(path.read_text())
        assert [row[1] for row in data["queries"]] == ["new"] and data["shapes"] == []


def test_a_shed_after_the_base_is_in_the_checkpoint_against_it(tmp_path):
    """Runs shed over max_runs_per_query raise the query's since_tick after its base was written: the checkpoint
    against that base holds the new tick, and restores it."""
    path = tmp_path / "engine-checkpoint.json"
    eng = Engine(max_runs_per_query=2)
    for k in range(3):
        eng.register(TEXT.format(k=k), name=f"q{k}")
    base, encoded = QueryBase(path), EncodedPatterns()
    write(eng, base, path, encoded, {}, True)
    for i in range(8):
        eng.process(Event("A", float(i), {"x": 1, "k": 0}, i))
    assert eng.queries[1].since_tick > 0 == eng.queries[0].since_tick
    write(eng, base, path, encoded, {}, True)
    assert json.loads(path.read_text())["since"] == [[1, eng.queries[1].since_tick]]
    assert read(path) == (json.dumps(snapshot(eng), sort_keys=True), {})


def test_a_checkpoint_given_up_after_a_restart_leaves_the_base_of_the_one_in_place(tmp_path):
    """After a restart the base read with the checkpoint in place stays while that checkpoint is in place: a
    first checkpoint taking a new base and given up (a full disk) removes its own base only, and a base file of
    no checkpoint (a kill -9 while the first one was written) goes at the start."""
    path = tmp_path / "engine-checkpoint.json"
    eng = Engine()
    eng.register(TEXT.format(k=1), name="q1")
    write(eng, QueryBase(path), path, EncodedPatterns(), {}, True)
    want = read(path)
    restarted, patterns = QueryBase(path), EncodedPatterns()
    restarted.found(query_base.read(path)[2])
    with patch.object(query_base, "MIN_CHANGES", 1):
        eng.register(TEXT.format(k=2), name="q2")  # (enough changes for a new base)
        write(eng, restarted, path, patterns, {}, False)
    assert read(path) == want and len(list(tmp_path.glob(base_name(path, "*")))) == 1
    empty = tmp_path / "empty"
    empty.mkdir()
    stray = empty / base_name(path, "0" * 12)
    stray.write_text("{}")
    QueryBase(empty / path.name).found(None)
    assert not stray.exists()


def test_the_nodes_of_queries_gone_are_forgotten_at_a_new_base(tmp_path):
    """What the takes keep of the nodes (``node_refs``) does not grow with queries registered and removed."""
    path = tmp_path / "engine-checkpoint.json"
    eng = Engine()
    eng.register(TEXT.format(k=0), name="kept")
    eng.process(Event("A", 1.0, {"x": 0, "k": 0}, 0))
    base, patterns = QueryBase(path), EncodedPatterns()
    sizes = []
    with patch.object(query_base, "MIN_CHANGES", 2):
        for r in range(6):
            qids = [eng.register(TEXT.format(k=100 * r + i), name=f"n{r}.{i}") for i in range(20)]
            write(eng, base, path, patterns, {}, True)
            for qid in qids:
                eng.unregister(qid)
            write(eng, base, path, patterns, {}, True)
            sizes.append(len(base.node_refs))
    assert max(sizes) <= 2 * 21 * 2 and read(path) == (json.dumps(snapshot(eng), sort_keys=True), {})
