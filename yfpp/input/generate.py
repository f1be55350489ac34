"""Synthetic event streams and a streaming writer.

Generators yield plain dicts ``{"type": …, "ts": …, <attributes>…}``, are
deterministic for a given ``seed`` and hold no events: their memory is one price
per symbol (stock) or one lifecycle per tag (rfid, about 2 KB each), whatever
the number of events (``yfpp generate`` caps ``--symbols`` and ``--tags``).

* :func:`generate_stock` — the stock stream of the SIGMOD 2008 paper (§6).
  Each event's ``symbol`` is uniform in 1..symbols; that symbol's price then
  moves up with probability ``p_up``, down or stays with (1 − p_up)/2 each, by a
  step uniform in 1..5, reflected at the bounds of [1, 1000] (initial prices uniform in
  [1, 1000]); ``volume`` is uniform in [1, 1000]. ``ts`` = ``id`` = the event's
  index, so a window of W ts units holds W + 1 events, about (W + 1)/symbols of
  them of one symbol.
* :func:`generate_rfid` — an RFID retail feed. Each tag (``tag_id`` 1, 2, …)
  has 1–3 ``shelf`` readings (``zone`` 'Z1'..), then a ``register`` reading
  (``register`` 1..) unless it is stolen (probability ``theft_rate``), then an
  ``exit`` reading (``door`` 'D1'..). ``tags`` lifecycles are under way at once;
  each event comes from one of them at random, and a finished one is replaced by
  a new tag. ``ts`` is in whole seconds, non-decreasing, gaps exponential with
  mean about ``gap`` (so several events may share a ts). The stream stops after
  ``n_events``, possibly inside lifecycles.

:func:`write_events` writes records as XML (``<stream>`` root, one element per
event, values as attributes) or JSON lines. The bundled samples
``yfpp/data/sample_rfid.{xml,jsonl}`` are ``generate_rfid(SAMPLE_SIZE, seed=SAMPLE_SEED)``.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import random
from collections import deque
from typing import Any, Iterable, Iterator, Mapping, TextIO

from lxml import etree

from yfpp.input.readers import format_of
from yfpp.input.xml_element import xml_text

SAMPLE_SIZE, SAMPLE_SEED = 300, 4

Record = dict[str, Any]


def _reflect(price: int, low: int = 1, high: int = 1000) -> int:
    """Keep a random-walk price in [low, high] by reflecting at the bounds (a clamped
    walk would sit on the bound, and ``price % 500 = 0`` would hold for long stretches)."""
    if price > high:
        return 2 * high - price
    if price < low:
        return 2 * low - price
    return price


def generate_stock(n_events: int, *, symbols: int = 2, p_up: float = 0.5, seed: int = 0) -> Iterator[Record]:
    """``n_events`` stock ticks ``{"type": "stock", "ts", "id", "symbol", "price", "volume"}``."""
    rng = random.Random(seed)
    prices = [rng.randint(1, 1000) for _ in range(symbols)]
    p_down = p_up + (1 - p_up) / 2
    for i in range(n_events):
        s = rng.randrange(symbols)
        r = rng.random()
        step = rng.randint(1, 5)
        if r < p_up:
            prices[s] = _reflect(prices[s] + step)
        elif r < p_down:
            prices[s] = _reflect(prices[s] - step)
        yield {"type": "stock", "ts": i, "id": i, "symbol": s + 1, "price": prices[s], "volume": rng.randint(1, 1000)}


def generate_rfid(
    n_events: int,
    *,
    tags: int = 20,
    zones: int = 5,
    doors: int = 2,
    registers: int = 3,
    theft_rate: float = 0.1,
    gap: float = 20.0,
    seed: int = 0,
) -> Iterator[Record]:
    """``n_events`` readings of ``shelf`` / ``register`` / ``exit`` for interleaved tags."""
    rng = random.Random(seed)

    def lifecycle(tag: int) -> deque[Record]:
        reads = [{"type": "shelf", "tag_id": tag, "zone": f"Z{rng.randint(1, zones)}"} for _ in range(rng.randint(1, 3))]
        if rng.random() >= theft_rate:
            reads.append({"type": "register", "tag_id": tag, "register": rng.randint(1, registers)})
        reads.append({"type": "exit", "tag_id": tag, "door": f"D{rng.randint(1, doors)}"})
        return deque(reads)

    active = [lifecycle(tag) for tag in range(1, tags + 1)]
    next_tag, ts = tags + 1, 0
    for _ in range(n_events):
        ts += int(rng.expovariate(1 / gap))
        k = rng.randrange(tags)
        read = active[k].popleft()
        yield {"type": read.pop("type"), "ts": ts, **read}
        if not active[k]:
            active[k] = lifecycle(next_tag)
            next_tag += 1


def write_events(records: Iterable[Mapping[str, Any]], out: str | os.PathLike[str] | TextIO, format: str | None = None) -> int:
    """Write ``records`` to ``out`` (a path, ``.gz`` compressed, or a text stream); the count.

    ``format`` is ``xml`` or ``jsonl``, by default from ``out``'s extension.
    """
    fmt = format or format_of(out)
    if fmt not in ("xml", "jsonl"):
        raise ValueError(f"unknown output format {fmt!r}; expected xml or jsonl")
    n = 0
    with _text_out(out) as f:
        if fmt == "xml":
            f.write('<?xml version="1.0" encoding="UTF-8"?>\n<stream>\n')
        for record in records:
            if fmt == "xml":
                attrs = {k: xml_text(v) for k, v in record.items() if k != "type"}
                f.write("  " + etree.tostring(etree.Element(record["type"], attrs), encoding="unicode") + "\n")
            else:
                f.write(json.dumps(record, ensure_ascii=False) + "\n")
            n += 1
        if fmt == "xml":
            f.write("</stream>\n")
    return n


def _text_out(out: str | os.PathLike[str] | TextIO) -> contextlib.AbstractContextManager[TextIO]:
    if not isinstance(out, (str, os.PathLike)):
        return contextlib.nullcontext(out)
    if os.fspath(out).endswith(".gz"):
        return gzip.open(out, "wt", encoding="utf-8")
    return open(out, "w", encoding="utf-8")
