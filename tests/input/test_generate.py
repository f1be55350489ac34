"""Stream generators, the writer and the bundled samples."""

from __future__ import annotations

import io
import itertools
from importlib import resources

import pytest

from yfpp.input.generate import SAMPLE_SEED, SAMPLE_SIZE, generate_rfid, generate_stock, write_events
from yfpp.input.readers import read_events, read_jsonl, read_xml


def rfid_tags(records):
    tags: dict[int, list[str]] = {}
    for r in records:
        tags.setdefault(r["tag_id"], []).append(r["type"])
    return tags


def test_stock_deterministic_and_in_range():
    a = list(generate_stock(5000, symbols=3, seed=1))
    assert a == list(generate_stock(5000, symbols=3, seed=1)) != list(generate_stock(5000, symbols=3, seed=2))
    assert [(r["ts"], r["id"]) for r in a] == [(i, i) for i in range(5000)]
    assert {r["symbol"] for r in a} == {1, 2, 3} and {r["type"] for r in a} == {"stock"}
    assert all(1 <= r["price"] <= 1000 and 1 <= r["volume"] <= 1000 for r in a)


@pytest.mark.parametrize("p_up", [0.2, 0.5, 0.8])
def test_stock_price_follows_p_up(p_up):
    last: dict[int, int] = {}
    moves = {"up": 0, "down": 0, "same": 0}
    for r in generate_stock(40_000, symbols=2, p_up=p_up, seed=3):
        prev = last.get(r["symbol"])
        if prev is not None and 6 <= prev <= 995:  # no reflection possible
            moves["up" if r["price"] > prev else "down" if r["price"] < prev else "same"] += 1
        last[r["symbol"]] = r["price"]
    total = sum(moves.values())
    assert total > 1500
    assert moves["up"] / total == pytest.approx(p_up, abs=0.03)
    assert moves["down"] / total == pytest.approx((1 - p_up) / 2, abs=0.03)


def test_stock_prices_reflect_at_bounds():
    prices = [r["price"] for r in generate_stock(20_000, symbols=1, p_up=0.9, seed=0)]
    assert max(prices) == 1000 and 980 < prices[-1] < 1000
    stuck = sum(1 for a, b in itertools.pairwise(prices) if a == b == 1000)
    assert stuck < 0.1 * len(prices)  # a clamped walk would sit on the bound


def test_rfid_lifecycles():
    records = list(generate_rfid(20_000, seed=5))
    assert len(records) == 20_000 and records == list(generate_rfid(20_000, seed=5))
    assert all(a["ts"] <= b["ts"] for a, b in itertools.pairwise(records))
    assert any(a["ts"] == b["ts"] for a, b in itertools.pairwise(records))
    for r in records:
        assert set(r) == {"type", "ts", "tag_id", {"shelf": "zone", "register": "register", "exit": "door"}[r["type"]]}
    complete = 0
    for types in rfid_tags(records).values():
        n_shelf = types.count("shelf")
        assert 1 <= n_shelf <= 3 and types[:n_shelf] == ["shelf"] * n_shelf
        assert types[n_shelf:] in ([], ["register"], ["exit"], ["register", "exit"])
        complete += types[-1] == "exit"
    assert complete > 4000


@pytest.mark.parametrize("theft_rate", [0.0, 0.1, 0.3])
def test_rfid_theft_fraction(theft_rate):
    done = [t for t in rfid_tags(generate_rfid(40_000, theft_rate=theft_rate, seed=1)).values() if t[-1] == "exit"]
    stolen = sum("register" not in t for t in done) / len(done)
    assert stolen == pytest.approx(theft_rate, abs=0.02)


def test_rfid_interleaves_tags():
    records = list(generate_rfid(200, tags=20, seed=0))
    assert len({r["tag_id"] for r in records[:40]}) >= 15


@pytest.mark.parametrize("fmt,reader", [("xml", read_xml), ("jsonl", read_jsonl)])
def test_writer_round_trip(tmp_path, fmt, reader):
    records = list(generate_rfid(500, seed=2)) + [{"type": "odd", "ts": 1.5e3, "s": "a<b & \"c\" 'd'", "t": "true", "n": -2}]
    path = tmp_path / f"out.{fmt}"
    assert write_events(iter(records), path) == len(records)
    events = list(reader(path))
    assert [(e.type, e.ts, e.seq) for e in events] == [(r["type"], float(r["ts"]), i) for i, r in enumerate(records)]
    assert [e.attrs for e in events] == [{k: v for k, v in r.items() if k not in ("type", "ts")} for r in records]


def test_writer_to_stream_and_gz(tmp_path):
    buf = io.StringIO()
    write_events([{"type": "a", "ts": 1, "ok": True}], buf, "xml")
    assert buf.getvalue() == '<?xml version="1.0" encoding="UTF-8"?>\n<stream>\n  <a ts="1" ok="true"/>\n</stream>\n'
    write_events(generate_stock(10), tmp_path / "s.jsonl.gz")
    assert [e.attrs["id"] for e in read_events(tmp_path / "s.jsonl.gz")] == list(range(10))
    with pytest.raises(ValueError, match="format"):
        write_events([], buf)


@pytest.mark.parametrize("name", ["sample_rfid.xml", "sample_rfid.jsonl"])
def test_bundled_samples(name):
    with resources.as_file(resources.files("yfpp") / "data" / name) as path:
        events = list(read_events(path))
    expected = list(generate_rfid(SAMPLE_SIZE, seed=SAMPLE_SEED))
    assert [(e.type, e.ts, e.attrs) for e in events] == [
        (r["type"], float(r["ts"]), {k: v for k, v in r.items() if k not in ("type", "ts")}) for r in expected]
    thefts = [t for t in rfid_tags(expected).values() if t[-1] == "exit" and "register" not in t]
    assert 3 <= len(thefts) <= 8
    assert events[-1].ts - events[0].ts <= 12 * 3600
