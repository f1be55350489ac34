"""The dead-letter output: records the engine could not use (docs/semantics.md §1).

Readers report malformed records here, the engine reports late events. A report is
counted (``count``, and ``by_reason`` keyed by the reason's category: the text
before its first ``:``, so ``"bad JSON: Expecting value"`` counts as ``"bad JSON"``)
and, when an output is given, written at once as one JSON line
``{"seq": …, "position": …, "reason": …, "raw": …}`` and flushed.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from typing import TextIO

#: one encoder for every report (``json.dumps`` with an option builds a new one per call)
_encode = json.JSONEncoder(ensure_ascii=False).encode


class DeadLetters:
    """Counts reported records and writes them to ``out`` (a path or a text stream), if given.

    A path is opened here (truncated, or appended to with ``append``) and closed by :meth:`close`; a
    stream passed in is flushed but never closed.
    """

    def __init__(self, out: str | os.PathLike[str] | TextIO | None = None, append: bool = False):
        self.count = 0
        self.by_reason: Counter[str] = Counter()
        self.last_seq = -1  #: the largest int seq reported (what a checkpoint's run had reported, for --restore)
        self._owned = isinstance(out, (str, os.PathLike))
        # backslashreplace: a lone surrogate in a record's text is written as its JSON escape (\ud800)
        self._out: TextIO | None = (open(out, "a" if append else "w", encoding="utf-8", errors="backslashreplace")  # type: ignore[arg-type]
                                    if self._owned else out)

    def report(self, seq: int, position: str, reason: str, raw: str | None = None) -> None:
        """Record one dead letter: its ``seq``, where it was (``"line 12"``), why, and its text."""
        self.count += 1
        self.by_reason[reason.split(":", 1)[0]] += 1
        if type(seq) is int and seq > self.last_seq:
            self.last_seq = seq
        if self._out is not None:
            record = {"seq": seq, "position": position, "reason": reason, "raw": raw}
            self._out.write(_encode(record) + "\n")
            self._out.flush()

    def close(self) -> None:
        if self._owned and self._out is not None:
            self._out.close()
        self._out = None

    def __enter__(self) -> "DeadLetters":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
