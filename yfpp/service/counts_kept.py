"""Which subscriptions' counts and held results a checkpoint looks at: those that changed since the last one kept.

Each checkpoint stores, with the results the push sinks hold, every subscription's counters in the registry
(``Registry.keep_queued``). Walking all subscriptions for that cost a checkpoint of an idle service with 100,000
subscriptions most of its CPU; a checkpoint now looks only at the subscriptions whose counters moved since the
last one kept (each ``Counters.add`` puts its subscription's id in :attr:`CountsKept.moved`), those whose push
sink held results then (those results, or the counts written with them, may have changed without a count
moving: a TCP connection's buffer emptied) and the isolated ones a checkpoint names; the registry replaces those
rows and removes the rows of the subscriptions deleted since. What the registry holds after is what a walk over
every subscription would have written. The first checkpoint after a start, and the one after a checkpoint that
did not store them, walk every subscription and replace the whole table.

All on the loop but :meth:`CountsKept.not_kept` (any thread, once the loop has taken them).
"""

from __future__ import annotations

from typing import Iterable

from yfpp.service.subscriptions import Subscription


class CountsKept:
    """The subscriptions whose counts (or held results) changed since the registry last stored them."""

    def __init__(self) -> None:
        self.moved: set[str] = set()  #: ids of subscriptions whose counters moved (``Counters.add``)
        self._held: set[str] = set()  #: ids of subscriptions whose push sink held results at the last take
        self._gone: set[str] = set()  #: ids of subscriptions deleted since the last take
        self._whole = True  #: the next take walks every subscription (the registry's table replaced)

    def follow(self, sub: Subscription) -> None:
        """A subscription attached: its counters' changes are marked from now on."""
        for counters in (sub.counters, sub.pull):
            counters.moved, counters.key = self.moved, sub.id

    def removed(self, sid: str) -> None:
        """The subscription ``sid`` deleted: its row goes."""
        self._gone.add(sid)

    def take(self, subs: dict[str, Subscription], also: Iterable[str] = ()) -> tuple[list[str], list[str] | None]:
        """The ids of the subscriptions to look at now (of ``subs``, ``also`` among them) and those whose rows go,
        None for the whole table replaced (every id of ``subs`` given then). From here they count as kept:
        :meth:`held` for each that holds results, :meth:`not_kept` if they were not stored."""
        if self._whole:
            self._whole = False
            self.moved.clear()
            self._held.clear()
            self._gone.clear()
            return list(subs), None
        changed = self.moved | self._held | self._gone  # (a deleted id given again: its row written anew)
        changed.update(also)
        gone = sorted(self._gone - subs.keys())
        self.moved.clear()
        self._held.clear()
        self._gone.clear()
        return [sid for sid in changed if sid in subs], gone

    def held(self, sid: str) -> None:
        """The subscription ``sid`` held results at this take (or counted results delivered that it held): looked
        at again at the next."""
        self._held.add(sid)

    def not_kept(self) -> None:
        """What the last take gave was not stored: the next take walks every subscription."""
        self._whole = True
