"""Ordinary mistakes get one ``yfpp: error: …`` line; runs report stats as JSON, progress, ISO times, unseen names."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from yfpp.cli import main
from yfpp.examples import resolve
from yfpp.output.stats import Progress, percent_eta

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = str(ROOT / "yfpp" / "data" / "sample_rfid.xml")
SHOPLIFTING = str(ROOT / "queries" / "shoplifting.sase")


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_error(code: int, err: str, *parts: str) -> None:
    assert code != 0
    assert err.startswith("yfpp: error: ") and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1, err
    for part in parts:
        assert part in err


def test_bad_ts_unit(capsys):
    code, _, err = run(capsys, "run", "-q", SHOPLIFTING, "-i", SAMPLE, "--ts-unit", "seconds")
    assert_one_error(code, err, "unknown --ts-unit 'seconds'", "expected one of s, ms, us, ns, min, h")


@pytest.mark.parametrize("option", ["-o", "--dead-letters", "--stats-json", "--checkpoint"])
def test_an_output_that_is_the_input_file_is_refused_before_anything_is_written(tmp_path, capsys, option):
    feed = tmp_path / "feed.jsonl"
    feed.write_bytes((ROOT / "yfpp" / "data" / "sample_rfid.jsonl").read_bytes())
    before = feed.read_bytes()
    code, out, err = run(capsys, "run", "-q", SHOPLIFTING, "-i", str(feed), option, str(feed))
    assert_one_error(code, err, f"{feed} is the input file")
    assert code == 2 and out == "" and feed.read_bytes() == before


def test_a_checkpoint_in_a_missing_directory_is_refused_before_the_run(tmp_path, capsys):
    code, out, err = run(capsys, "run", "-q", SHOPLIFTING, "-i", SAMPLE, "--checkpoint", str(tmp_path / "no" / "ck.json"))
    assert_one_error(code, err, "cannot write checkpoint", "does not exist")
    assert code == 2 and out == ""


def test_closed_standard_streams_are_one_error(capsys, monkeypatch):
    monkeypatch.setattr("sys.stdin", None)
    code, _, err = run(capsys, "run", "-q", SHOPLIFTING, "-i", "-")
    assert_one_error(code, err, "standard input is closed")
    monkeypatch.setattr("sys.stdout", None)
    code, _, err = run(capsys, "run", "-q", SHOPLIFTING, "-i", SAMPLE)
    assert_one_error(code, err, "standard output is closed")


def test_a_write_that_fails_mid_run_is_exit_2(capsys):
    code, _, err = run(capsys, "run", "-q", SHOPLIFTING, "-i", SAMPLE, "-o", "/dev/full")
    assert_one_error(code, err, "No space left on device")
    assert code == 2


@pytest.mark.parametrize("argv, message", [
    (["stock", "--symbols", "0"], "argument --symbols: must be at least 1, got 0"),
    (["rfid", "--tags", "-3"], "argument --tags: must be at least 1, got -3"),
    (["stock", "--symbols", "10000000"], "argument --symbols: must be at most 1,000,000, got 10,000,000"),  # a price each
    (["rfid", "--tags", "100001"], "argument --tags: must be at most 100,000, got 100,001"),  # about 2 KB each
    (["rfid", "--events", "-5"], "argument --events: must be at least 0, got -5"),
    (["stock", "--p-up", "nan"], "argument --p-up: must be from 0 to 1, got nan"),
    (["rfid", "--theft-rate", "5"], "argument --theft-rate: must be from 0 to 1, got 5"),
    (["rfid", "--zones", "x"], "argument --zones: invalid integer value: 'x'"),
])
def test_generate_refuses_counts_and_rates_it_cannot_use(capsys, argv, message):
    with pytest.raises(SystemExit) as e:
        main(["generate", *argv])
    assert e.value.code == 2 and message in capsys.readouterr().err


def test_explain_checks_its_picture_path_first(tmp_path, capsys):
    code, out, err = run(capsys, "explain", "-q", SHOPLIFTING, "--png", str(tmp_path / "no" / "nfa.png"))
    assert_one_error(code, err, "cannot write picture", "does not exist")
    assert out == ""


def test_a_query_file_may_start_with_a_byte_order_mark(tmp_path, capsys):
    query = tmp_path / "bom.sase"
    query.write_bytes(b"\xef\xbb\xbf" + (ROOT / "queries" / "shoplifting.sase").read_bytes())
    code, out, _ = run(capsys, "run", "-q", str(query), "-i", SAMPLE)
    want = run(capsys, "run", "-q", SHOPLIFTING, "-i", SAMPLE)[1]
    bindings = [[json.loads(line)["bindings"] for line in text.splitlines()] for text in (out, want)]
    assert code == 0 and bindings[0] == bindings[1] != []


def test_a_set_policy_on_an_ordinary_query_says_what_it_is_for(capsys):
    code, out, err = run(capsys, "run", "-q", SHOPLIFTING, "-i", SAMPLE, "--policy", "earliest_maximal")
    assert code == 2 and out == "" and "Traceback" not in err
    assert err.startswith("yfpp: error: query 'shoplifting'")
    assert "the earliest_maximal output policy is for event-set queries only" in err


@pytest.mark.parametrize("option, what", [("-o", "output"), ("--dead-letters", "dead-letter file"), ("--stats-json", "stats file")])
def test_output_paths_in_a_missing_directory(tmp_path, capsys, option, what):
    target = tmp_path / "missing" / "x.jsonl"
    code, _, err = run(capsys, "run", "-q", SHOPLIFTING, "-i", SAMPLE, option, str(target))
    assert_one_error(code, err, f"cannot write {what} {target}", f"directory {tmp_path / 'missing'} does not exist")


def test_generate_to_an_unknown_extension(tmp_path, capsys):
    code, _, err = run(capsys, "generate", "rfid", "--events", "10", "-o", str(tmp_path / "feed.csv"))
    assert_one_error(code, err, "cannot tell the output format of", "feed.csv", "--format xml|jsonl")
    assert not (tmp_path / "feed.csv").exists()


def test_generate_into_a_missing_directory(tmp_path, capsys):
    code, _, err = run(capsys, "generate", "rfid", "--events", "10", "-o", str(tmp_path / "no" / "feed.xml"))
    assert_one_error(code, err, "does not exist")


@pytest.mark.parametrize("progress", ["never", "always"])
def test_unreadable_inputs(tmp_path, capsys, progress):
    code, _, err = run(capsys, "run", "-q", SHOPLIFTING, "-i", str(tmp_path / "nope.xml"), "--progress", progress)
    assert_one_error(code, err, "cannot read", "nope.xml", "No such file or directory")
    code, _, err = run(capsys, "run", "-q", SHOPLIFTING, "-i", str(tmp_path), "--progress", progress)
    assert_one_error(code, err, "cannot read", "Is a directory")
    (tmp_path / "notes.txt").write_text("hello\n")
    code, _, err = run(capsys, "run", "-q", SHOPLIFTING, "-i", str(tmp_path / "notes.txt"), "--progress", progress)
    assert_one_error(code, err, f"cannot tell the format of '{tmp_path / 'notes.txt'}'")


def test_the_timestamp_cannot_be_the_type_field(tmp_path, capsys):
    feed = tmp_path / "feed.jsonl"
    feed.write_text('{"type": "a", "ts": 1, "kind": "a"}\n')
    code, _, err = run(capsys, "run", "-q", SHOPLIFTING, "-i", str(feed), "--ts-field", "type")
    assert_one_error(code, err, "the timestamp and the event type cannot both be field 'type'")
    code, _, err = run(capsys, "run", "-q", SHOPLIFTING, "-i", str(feed), "--ts-field", "kind", "--type-field", "kind")
    assert_one_error(code, err, "cannot both be field 'kind'")
    (tmp_path / "feed.xml").write_text('<a type="5"/>\n<b type="6"/>\n')  # XML: the type is the element's name
    code, out, _ = run(capsys, "run", "-q", "PATTERN SEQ(a x, b y)", "-i", str(tmp_path / "feed.xml"), "--ts-field", "type")
    assert code == 0 and '"start": 5.0, "end": 6.0' in out


def test_unseen_types_and_attributes_are_warned_with_a_suggestion(capsys):
    code, out, err = run(capsys, "run", "-q", str(ROOT / "queries" / "figure1_q1_shoplifting.sase"), "-i", SAMPLE)
    assert code == 0 and out == ""
    assert "yfpp: warning: query 'figure1_q1_shoplifting': type 'Shelf' never seen; did you mean 'shelf'?" in err
    code, out, err = run(capsys, "run", "-q", "PATTERN SEQ(shelf a, exit c) WHERE [tagid] AND a.Zone = 'Z1'", "-i", SAMPLE)
    assert "attribute 'tagid' never seen on 'shelf' events; did you mean 'tag_id'?" in err
    assert "attribute 'Zone' never seen on 'shelf' events; did you mean 'zone'?" in err
    code, out, err = run(capsys, "run", "-q", "[tag_id]//shelf[@Zone='Z1']//exit", "-i", SAMPLE)
    assert "attribute 'Zone' never seen on 'shelf' events; did you mean 'zone'?" in err
    code, out, err = run(capsys, "run", "-q", SHOPLIFTING, "-i", SAMPLE)
    assert code == 0 and out and "warning" not in err
    # a type some query's RETURN builds counts as seen (the events it feeds back)
    code, out, err = run(capsys, "run", "-q", SHOPLIFTING, "-q", "PATTERN SEQ(theft t, theft u) WHERE [tag_id]", "-i", SAMPLE)
    assert code == 0 and "warning" not in err


def test_stats_json_has_the_stats_figures(tmp_path, capsys):
    path = tmp_path / "stats.json"
    code, out, err = run(capsys, "run", "-q", SHOPLIFTING, "-i", SAMPLE, "--stats", "--stats-json", str(path))
    figures = json.loads(path.read_text())
    assert code == 0
    assert figures["events"] == 300 and figures["dead_letters"] == 0
    assert figures["matches"] == {"shoplifting": len(out.splitlines())}
    assert f"peak runs         {figures['peak_runs']:,}" in err
    assert set(figures) >= {"elapsed_s", "events_per_s", "runs_started", "runs_created", "runs_touched_per_event", "peak_buffer"}


def test_progress_shows_percentage_and_eta_for_a_file(capsys):
    code, _, err = run(capsys, "run", "-q", SHOPLIFTING, "-i", SAMPLE, "--progress", "always")
    assert code == 0 and "300 events" in err and "100%  ETA 0:00" in err


def test_percent_eta():
    assert percent_eta(25, 100, 10.0) == "25%  ETA 0:30"
    assert percent_eta(0, 100, 10.0) == "0%  ETA ?"
    assert percent_eta(1, 100, 100.0) == "1%  ETA 2:45:00"


def test_progress_without_a_size_has_no_percentage():
    class Eng:
        stats = type("C", (), {"live_runs": 3, "matches": {"q": 2}})()

    buf = io.StringIO()
    Progress(buf).done(10, Eng())  # type: ignore[arg-type]
    assert "10 events" in buf.getvalue() and "%" not in buf.getvalue()


def test_iso_timestamps_in_and_out(tmp_path, capsys):
    feed = tmp_path / "f.jsonl"
    feed.write_text(
        '{"type": "shelf", "ts": "2026-11-22T10:00:00Z", "tag_id": 1}\n'
        '{"type": "exit", "ts": "2026-11-22T10:30:00.5+00:00", "tag_id": 1}\n'
        '{"type": "exit", "ts": "yesterday", "tag_id": 1}\n'
    )
    dead = tmp_path / "dead.jsonl"
    code, out, _ = run(capsys, "run", "-q", "PATTERN SEQ(shelf a, exit c) WHERE [tag_id] WITHIN 1 hour", "-i", str(feed),
                       "--ts-format", "iso", "--dead-letters", str(dead))
    (m,) = [json.loads(line) for line in out.splitlines()]
    assert code == 0 and m["start"] == "2026-11-22T10:00:00Z" and m["end"] == "2026-11-22T10:30:00.500000Z"
    assert json.loads(dead.read_text())["reason"] == "non-ISO-8601 ts: 'yesterday'"


def test_help_examples_name_files_that_exist():
    from yfpp import cli

    for text in (cli.RUN_EXAMPLES, cli.EXPLAIN_EXAMPLES):
        for word in text.split():
            if word.startswith(("queries/", "yfpp/")):
                assert (ROOT / word).is_file(), word
            if word.startswith("example:"):
                assert Path(resolve(word)).is_file(), word


def test_the_vocabulary_stops_noting_once_every_name_a_query_uses_was_seen():
    from yfpp.input.events import Event
    from yfpp.language.query_text import parse_query
    from yfpp.output.vocabulary import Vocabulary

    pattern = parse_query("PATTERN SEQ(shelf a, exit c) WHERE [tag_id] AND c.door = 'D1'")
    vocabulary = Vocabulary([pattern])
    vocabulary.note([Event("shelf", 1, {"tag_id": 1}), Event("exit", 2, {"tag_id": 1})])
    assert not vocabulary.complete and vocabulary.unknown_names("q", pattern) == [
        "query 'q': attribute 'door' never seen on 'exit' events"]
    vocabulary.note([Event("exit", 3, {"tag_id": 2, "door": "D1"})])  # the last name, late in the stream
    assert vocabulary.complete and vocabulary.unknown_names("q", pattern) == []
    vocabulary.note([Event("other", 4, {})])
    assert "other" not in vocabulary.attrs  # no longer noted: no warning can come


def test_unknown_names_are_warned_about_for_event_set_and_negated_components(capsys):
    assert main(["run", "-q", "PATTERN {Foo a, exit c} WHERE c.dor = 'D1' WITHIN 5",
                 "PATTERN SEQ(shelf a, ~Regster b, exit c) WITHIN 10", "-i", str(SAMPLE)]) == 0
    err = capsys.readouterr().err
    assert "yfpp: warning: query 'q': type 'Foo' never seen" in err
    assert "query 'q': attribute 'dor' never seen on 'exit' events; did you mean 'door'?" in err
    assert "yfpp: warning: query 'q2': type 'Regster' never seen; did you mean 'register'?" in err


def test_an_xpath_predicate_on_ts_is_no_unknown_attribute(tmp_path, capsys):
    feed = tmp_path / "ms.xml"
    feed.write_text('<stream><a ts="5000"/></stream>\n')
    assert main(["run", "-q", "//a[@ts > 100]", "-i", str(feed), "--ts-unit", "ms"]) == 0
    out, err = capsys.readouterr()
    assert len(out.splitlines()) == 1 and "never seen" not in err
