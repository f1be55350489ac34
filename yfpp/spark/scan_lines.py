"""The scan plan's plain blocks of JSON lines: routed by a scan, shipped as lines, parsed once where they are matched.

A read task reads its byte range a block at a time (``yfpp run``'s blocks). A block is **plain** when
:func:`yfpp.input.jsonl_scan.scan_block` finds each line's ts and the value of each keyed group's key
attribute (:func:`scan_keys`), every line is one object with no object in it (so the event of a line has
the key attribute the scan found), the ts never go back nor below the range's events before the block, and
its last line is an event (so the largest ts of the range's events is its ts). A plain block is not parsed
by the read task: its lines go to the matching tasks their events would go to
(:func:`yfpp.spark.routing.line_destinations`), each task's lines joined into one blob with their record
indexes in the range; the matching task parses them with ``yfpp run``'s JSON-lines reader
(:func:`lines_events`). Every other block is parsed by the read task and its events shipped as columns.

Each line is a record; a line that is a dead letter is found by the matching tasks it went to and reported
by the lowest of them (:func:`yfpp.spark.routing.lowest`), as a late event is.
"""

from __future__ import annotations

import pickle
from typing import TYPE_CHECKING

import numpy as np

from yfpp.input.dead_letters import DeadLetters
from yfpp.input.events import PSEUDO_ATTRS, Event
from yfpp.input.jsonl_reader import parse_block
from yfpp.input.jsonl_scan import scan_block
from yfpp.input.record_fields import ISO_8601, READ_BLOCK, ReaderOptions
from yfpp.spark.parse import _Collect
from yfpp.spark.ranges import Offsets, renumber
from yfpp.spark.routing import line_destinations, lowest, task_indices, taker

if TYPE_CHECKING:
    from yfpp.spark.scan import ScanJob

#: The kinds of the rows between the stages that carry lines (after :data:`yfpp.spark.scan.SUMMARY`): lines for
#: their matching task, and lines no task matches, sent to task 0 only to be checked for lateness (and dead letters).
LINES, UNROUTED_LINES = 4, 5


def scan_keys(job: ScanJob, opts: ReaderOptions) -> list[str] | None:
    """The attributes a read task scans for (the keyed groups' keys), or None when no block is plain for this job:
    a group keyed by several attributes, by a pseudo-attribute, the type or ts field or a nested name
    (``a.b``), or ISO-8601 times."""
    fields = {*PSEUDO_ATTRS, opts.ts_field, opts.type_field or "type"}
    keys = {g.key for g in job.groups if g.key}
    if opts.unit is ISO_8601 or any(len(k) != 1 or k[0] in fields or "." in k[0] for k in keys):
        return None
    return sorted(k[0] for k in keys)


def plain_block(body: bytes, opts: ReaderOptions, keys: list[str],
                hi: float | None) -> tuple[list[float], list[list[bytes]]] | None:
    """The scan of a block of complete lines (each line's ts, and per key each line's value as JSON text) when it
    is plain (the module docstring; ``hi``: the largest ts of the range's events before it), else None."""
    found = scan_block(body, opts, keys)
    if found is None:
        return None
    ts = found[0]
    lines = len(ts)
    if (body[:1] != b"{" or body.count(b"\n{") != lines - 1 or body.count(b"{") != lines  # one flat object a line
            or (hi is not None and ts[0] < hi) or ts != sorted(ts)):
        return None
    last = body[body.rfind(b"\n", 0, len(body) - 1) + 1:]
    return found if parse_block(last, 0, 0, opts, DeadLetters())[0] else None


class LinesChunk:
    """Plain blocks of one byte range waiting to be shipped: their lines, ts and key values, each line's record
    index in the range, and its line number less its record index (``delta``, the same for all: each line of a plain
    block is a record, and between two plain blocks of a chunk there are at most lines over the size cap, a record
    each; a blank line makes its block one that is parsed, which ends the chunk)."""

    def __init__(self, keys: list[str]):
        self.keys = keys
        self.lines: list[bytes] = []
        self.ts: list[float] = []
        self.values: list[list[bytes]] = [[] for _ in keys]
        self.pos: list[np.ndarray] = []
        self.delta = 0

    def __len__(self) -> int:
        return len(self.ts)

    def add(self, body: bytes, seq: int, lineno: int, ts: list[float], values: list[list[bytes]]) -> None:
        """A plain block whose first line is record ``seq`` and comes after line ``lineno`` of the range."""
        lines = body.split(b"\n")
        if not lines[-1]:
            lines.pop()
        self.lines += lines
        self.ts += ts
        for col, vs in zip(self.values, values):
            col += vs
        self.pos.append(np.arange(seq, seq + len(ts), dtype=np.uint32))
        self.delta = lineno - seq

    def rows(self, job: ScanJob, r: int, chunk: int) -> list[tuple]:
        """The rows (``dest, range, chunk, kind, blob``) of the lines held; the blob: the record indexes (uint32),
        ``delta``, which lines the task reports if dead (one byte each; None: all) and the lines joined."""
        if not self.ts:
            return []
        n = job.n
        dests = line_destinations(job, self.ts, dict(zip(self.keys, self.values)))
        indices, single = task_indices(dests, n)
        reporter = None if single else [lowest(ds) for ds in dests]
        pos = np.concatenate(self.pos)
        rows = []
        for d, idx in enumerate(indices):
            if not idx:
                continue
            report = None if reporter is None or d == n else bytes([reporter[i] == d for i in idx])
            blob = pickle.dumps((pos[idx].tobytes(), self.delta, report, b"\n".join(taker(idx)(self.lines))), 5)
            rows.append((0, r, chunk, UNROUTED_LINES, blob) if d == n else (d, r, chunk, LINES, blob))
        return rows


def lines_events(blob: bytes, opts: ReaderOptions, off: Offsets, dead: list[tuple]) -> list[Event]:
    """The events of a lines blob (:meth:`LinesChunk.rows`), parsed as ``yfpp run`` parses a block and numbered
    as in the stream (``off``: the range's place in it); the dead letters the task reports go to ``dead`` as
    ``(seq, position, reason, raw)``."""
    rel, delta, report, joined = pickle.loads(blob)
    caught = _Collect()
    events: list[Event] = []
    at, seq = 0, 0
    while at < len(joined):  # in pieces of about a read block, as yfpp run reads
        cut = joined.find(b"\n", at + READ_BLOCK)
        cut = len(joined) if cut < 0 else cut
        got, seq, _ = parse_block(joined[at:cut], seq, 0, opts, caught)
        events += got
        at = cut + 1
    pos = np.frombuffer(rel, np.uint32)
    seqs = (pos.astype(np.int64) + off.seq_base).tolist()
    if len(events) == len(seqs):
        for ev, s in zip(events, seqs):
            ev.seq = s
    else:
        for ev in events:
            ev.seq = seqs[ev.seq]
    for i, _, reason, raw in caught.items:
        if report is None or report[i]:
            dead.append((seqs[i], renumber(f"line {int(pos[i]) + delta + 1}", off), reason, raw))
    return events

