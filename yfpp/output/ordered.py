"""``yfpp run --ordered``: the matches written in one order, whatever the number of workers."""

from __future__ import annotations

from typing import Any, Iterable, Sequence

from yfpp.output.writer import LineEncoder

WRITE_LINES = 10_000  #: lines joined into one write at the end (not all of them: that would double the memory)


class OrderedMatches:
    """A match writer's stand-in that holds every match, encoded with its order key, and, at :meth:`close`, writes
    them to ``out`` (a :class:`~yfpp.output.writer.MatchWriter`) ordered by end, then query (``names``:
    registration order), then start, then match id — a total order of the match set, so one engine and N workers
    write the same lines. It holds all matches until the end of the input."""

    def __init__(self, out: Any, names: Sequence[str]):
        self.out = out
        self.rank = {name: i for i, name in enumerate(names)}
        self.encoder = LineEncoder(out.iso_times, keyed=True)
        self.held: list[tuple] = []

    def extend(self, matches: Iterable[dict]) -> None:
        self.held.extend(self.encoder.encode(list(matches)))

    def write_encoded(self, rows: list[tuple], count: int) -> None:
        """Rows ``(end, query, start, id, line)`` a worker encoded (:class:`~yfpp.output.writer.LineEncoder`)."""
        self.held.extend(rows)

    def flush(self) -> None:
        """Nothing is written before the end."""

    def close(self) -> None:
        last = len(self.rank)
        rank = self.rank
        self.held.sort(key=lambda r: (r[0], rank.get(r[1], last), r[2], r[3]))
        try:
            held = self.held
            for i in range(0, len(held), WRITE_LINES):
                part = held[i:i + WRITE_LINES]
                self.out.write_encoded(b"".join([r[4] for r in part]), len(part))
        finally:
            self.held = []
            self.out.close()
