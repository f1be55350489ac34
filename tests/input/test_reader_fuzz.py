"""Fuzz: random byte corruption of valid XML and JSON-lines feeds never raises out of the reader and never
changes the events — or the matches — of the records it did not touch. Bounded: a few seconds per format."""

from __future__ import annotations

import io

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.input.test_xml_reader import Trickle
from yfpp.input.dead_letters import DeadLetters
from yfpp.engine import Engine
from yfpp.input.events import Event
from yfpp.input.generate import generate_rfid, write_events
from yfpp.input.readers import read_events

SETTINGS = settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
# skip-till-any pairs and a reorder buffer over the whole feed: a match depends only on its own two events
QUERY = "PATTERN SEQ(shelf a, exit c) WHERE skip_till_any_match(a, c) { [tag_id] } WITHIN 1 hour"
SPECIAL = b'<>"\'/&=;!?[]{}:,\\\n\r\t \x00\x01\x7f\xff\xc3'


def feed(kind: str, seed: int) -> tuple[bytes, list[tuple[int, int]]]:
    """A valid feed of 30 records and the byte span of each (its lines, newline included).

    ``xml``: ``write_events``' document; ``rootless``: its elements alone; ``pretty``: a document whose
    events hold their attributes as indented leaf children, one per line; ``jsonl``.
    """
    records = list(generate_rfid(30, tags=4, seed=seed))
    if kind == "pretty":
        lines = [b'<?xml version="1.0"?>\n<stream>\n']
        for r in records:
            body = "".join(f"\n  <{k}>{v}</{k}>" for k, v in r.items() if k not in ("type", "ts"))
            lines.append(f'<{r["type"]} ts="{r["ts"]}">{body}\n</{r["type"]}>\n'.encode())
        lines.append(b"</stream>\n")
        first = 1
    else:
        out = io.StringIO()
        write_events(records, out, "jsonl" if kind == "jsonl" else "xml")
        lines = out.getvalue().encode().splitlines(keepends=True)
        if kind == "rootless":
            lines = [line.lstrip() for line in lines[2:-1]]
        first = 2 if kind == "xml" else 0
    starts = [sum(map(len, lines[:i])) for i in range(len(lines) + 1)]
    return b"".join(lines), [(starts[i], starts[i + 1]) for i in range(first, first + 30)]


def key(ev: Event) -> tuple:
    return ev.type, ev.ts, tuple(sorted(ev.attrs.items()))


def events_and_matches(data: bytes, kind: str, trickle: int | None) -> tuple[list[tuple], set[tuple]]:
    source = Trickle(data, trickle) if trickle is not None else io.BytesIO(data)
    events = list(read_events(source, "jsonl" if kind == "jsonl" else "xml", dead_letters=DeadLetters()))
    engine = Engine(max_delay=1e9, dead_letters=DeadLetters())
    engine.register(QUERY, name="q")
    by_seq = {ev.seq: key(ev) for ev in events}
    matches = [m for ev in events for m in engine.process(Event(ev.type, ev.ts, dict(ev.attrs), ev.seq))] + engine.flush()
    return [key(ev) for ev in events], {tuple(by_seq[s] for v in sorted(m["bindings"]) for s in m["bindings"][v]) for m in matches}


def check(kind: str, seed: int, edits: list[tuple[float, int]], trickle: int | None) -> None:
    data, spans = feed(kind, seed)
    clean_events, clean_matches = events_and_matches(data, kind, None)
    assert len(clean_events) == 30
    bad = bytearray(data)
    touched: set[int] = set()
    for where, byte in edits:
        at = int(where * (len(bad) - 1))
        bad[at] = byte
        touched |= {i for i, (a, b) in enumerate(spans) if a <= at < b or at == a - 1}
    if kind in ("xml", "pretty") and any(int(w * (len(bad) - 1)) < spans[0][0] - len(b"<stream>\n") for w, _ in edits):
        touched = set(range(30))  # the XML declaration (its encoding) concerns every record
    events, matches = events_and_matches(bytes(bad), kind, trickle)
    kept = [clean_events[i] for i in range(30) if i not in touched]
    it = iter(events)
    assert all(k in it for k in kept), "an untouched record's event is missing or changed"
    assert len(events) - len(kept) <= len(touched), "more events than records"
    untouched = set(kept)
    assert {m for m in clean_matches if set(m) <= untouched} <= matches


EDITS = st.lists(st.tuples(st.floats(0, 1), st.one_of(st.sampled_from(list(SPECIAL)), st.integers(0, 255))),
                 min_size=1, max_size=3)


@pytest.mark.parametrize("feed", ["xml", "rootless", "jsonl", "pretty"],
                         ids=["xml-document", "rootless-xml-feed", "json-lines", "xml-with-multi-line-events"])
@SETTINGS
@given(seed=st.integers(0, 50), edits=EDITS, trickle=st.one_of(st.none(), st.integers(0, 1000)))
def test_corrupted_feed(feed, seed, edits, trickle):
    check(feed, seed, edits, trickle)
