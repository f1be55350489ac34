"""The backtrack baseline of the SIGMOD 2008 paper (§5.3), for comparison only.

The paper compares its basic algorithm, which advances every run of a
partition on each event (a breadth-first expansion of the "run tree"), with a
backtrack algorithm: one *singleton* run per partition is processed until it
fails or completes; the runs that nondeterminism creates on the way are pushed
on a stack with the position of the event that created them, and evaluation
backtracks to the most recent one, re-reading the partition's buffered events
from there (depth first).

Both orders are built here on the reference evaluator's run step
(:meth:`yfpp.reference.evaluator.Reference.step`), so they differ only in the order in
which runs are explored: the same moves, predicates and negation filter, hence
the same matches.  :class:`BreadthFirst` is the basic algorithm's order,
:class:`Backtrack` the backtrack algorithm's; both count the run steps they
take and the events they re-read, which is what the comparison in
``benchmarks/backtrack_benchmark.py`` reports.  Neither is used by the engine.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Iterator

from yfpp.input.events import Event
from yfpp.language.pattern import Contiguity, Pattern
from yfpp.reference.evaluator import Reference, RefRun

Binds = dict[str, list[Event]]


def partitions(ref: Reference, events: list[Event]) -> Iterator[list[Event]]:
    """The sub-streams runs can be evaluated on independently.

    With an equivalence list and no strict contiguity, a run only ever binds
    events of its own partition and every other event is ignorable, so each
    partition's events form a stream of their own (events without the key
    can bind nothing).  Otherwise the whole stream is one partition.
    """
    p = ref.p
    strict = any(Contiguity.STRICT in (c.contiguity, c.inner) for c in p.positives)
    if not p.partition_by or strict:
        yield events
        return
    by_key: dict[Any, list[Event]] = defaultdict(list)
    for e in events:
        k = ref.key(e)
        if k is not None:
            by_key[k].append(e)
    yield from by_key.values()


class BreadthFirst(Reference):
    """The basic algorithm's order: all runs of a partition advance together, event by event."""

    def __init__(self, pattern: Pattern):
        super().__init__(pattern)
        self.steps = 0  # run steps taken (one run reading one event)
        self.rereads = 0  # events read again after a backtrack

    def step(self, run: RefRun, e: Event, done: list) -> list[RefRun]:
        self.steps += 1
        return super().step(run, e, done)

    def completions(self, events: list[Event]) -> list[Binds]:
        done: list[Binds] = []
        for sub in partitions(self, events):
            self.explore(sub, done)
        return done

    def explore(self, events: list[Event], done: list[Binds]) -> None:
        done.extend(Reference.completions(self, events))


class Backtrack(BreadthFirst):
    """The backtrack algorithm's order: one singleton run at a time, postponed runs on a stack."""

    def __init__(self, pattern: Pattern):
        super().__init__(pattern)
        self.backtracks = 0  # postponed runs resumed

    def explore(self, events: list[Event], done: list[Binds]) -> None:
        stack: list[tuple[RefRun, int]] = []  # postponed run, index of the next event it reads
        first = self.pos[0]
        frontier = 0  # events before it have been read once: reading them again is a re-read
        for i, e in enumerate(events):
            start = RefRun(0, False, {}, [])
            if not self.begins(0, start, e):
                continue
            for run in reversed(self._after_bind(0, self._bind(start, first.var, e), done)):
                stack.append((run, i + 1))
            resumed = False  # the first run popped is the singleton; every later one is a backtrack
            while stack:
                run, j = stack.pop()
                self.backtracks += resumed
                resumed = True
                while j < len(events):
                    if j < frontier:
                        self.rereads += 1
                    else:
                        frontier = j + 1
                    nxt = self.step(run, events[j], done)
                    j += 1
                    if not nxt:
                        break
                    run = nxt[0]
                    stack.extend((alt, j) for alt in reversed(nxt[1:]))

def backtrack_matches(pattern: Pattern, events: list[Event]) -> list[tuple[dict[str, list[int]], int]]:
    """Every match of ``pattern`` over ``events``, found by backtracking (same form as the reference's)."""
    return Backtrack(pattern).matches(events)
