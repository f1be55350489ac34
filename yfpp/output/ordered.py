"""``yfpp run --ordered``: the matches written in one order, whatever the number of workers."""

from __future__ import annotations

from typing import Any, Iterable, Sequence


class OrderedMatches:
    """A match writer's stand-in that holds every match and, at :meth:`close`, writes them to ``out`` ordered by
    end, then query (``names``: registration order), then start, then match id — a total order of the match
    set, so one engine and N workers write the same lines. It holds all matches until the end of the input."""

    def __init__(self, out: Any, names: Sequence[str]):
        self.out = out
        self.rank = {name: i for i, name in enumerate(names)}
        self.held: list[dict] = []

    def extend(self, matches: Iterable[dict]) -> None:
        self.held.extend(matches)

    def flush(self) -> None:
        """Nothing is written before the end."""

    def close(self) -> None:
        last = len(self.rank)
        self.held.sort(key=lambda m: (m["end"], self.rank.get(str(m["query"]), last), m["start"], m["id"]))
        try:
            self.out.extend(self.held)
        finally:
            self.held = []
            self.out.close()
