"""Checks and getters of compiled predicates (``yfpp.nfa.predicates``) as small slotted objects, not closures.

A subscription holds its compiled conjuncts for as long as it is registered.  A closure is a function, a tuple
of cells and a cell per variable it reads, each an object Python's cyclic collector tracks and walks at every
full collection; one of these objects is one tracked object, and smaller.  Each is called as the closure it
replaces was (``check(ev, vec)``, ``get(ev, vec)``); ``AllOf`` and ``AnyOf`` loop where the closures ran
``all``/``any`` over a generator, which costs more than the object's call.
"""

from __future__ import annotations

from typing import Any, Callable

from yfpp.input.events import MISSING

Getter = Callable[[Any, tuple], Any]
Check = Callable[[Any, tuple], bool]


class AllOf:
    """``p1 AND p2 AND …``: true when every part holds, the parts tried in order."""

    __slots__ = ("parts",)

    def __init__(self, parts: tuple[Check, ...]) -> None:
        self.parts = parts

    def __call__(self, ev: Any, vec: tuple) -> bool:
        for part in self.parts:
            if not part(ev, vec):
                return False
        return True


class AnyOf(AllOf):
    """``p1 OR p2 OR …``: true when some part holds, the parts tried in order."""

    __slots__ = ()

    def __call__(self, ev: Any, vec: tuple) -> bool:
        for part in self.parts:
            if part(ev, vec):
                return True
        return False


class NotOf:
    """``NOT p``."""

    __slots__ = ("inner",)

    def __init__(self, inner: Check) -> None:
        self.inner = inner

    def __call__(self, ev: Any, vec: tuple) -> bool:
        return not self.inner(ev, vec)


class CompareWith:
    """``value op constant`` for a value some getter reads (the event's own attribute is ``_AttrCompare``)."""

    __slots__ = ("cmp", "get", "lit")

    def __init__(self, cmp: Callable[[Any, Any], bool], get: Getter, lit: Any) -> None:
        self.cmp = cmp
        self.get = get
        self.lit = lit

    def __call__(self, ev: Any, vec: tuple) -> bool:
        return self.cmp(self.get(ev, vec), self.lit)


class FirstAttrCompare:
    """``v[1].attr op constant`` while ``v`` takes its iterations, in one call: ``CompareWith`` over
    ``AttrOfPicked`` over ``FirstOrEvent`` fused (the three calls cost a Kleene query's every event)."""

    __slots__ = ("cmp", "slot", "attr", "lit")

    def __init__(self, cmp: Callable[[Any, Any], bool], slot: int, attr: str, lit: Any) -> None:
        self.cmp = cmp
        self.slot = slot
        self.attr = attr
        self.lit = lit

    def __call__(self, ev: Any, vec: tuple) -> bool:
        bound = vec[self.slot]
        return self.cmp((bound.first if bound is not None else ev).get(self.attr), self.lit)


def compare_with(cmp: Callable[[Any, Any], bool], get: Getter, lit: Any) -> Check:
    """``value op constant`` for the value ``get`` reads: one ``FirstAttrCompare`` where ``get`` reads
    ``v[1].attr`` in ``v``'s iterations, else a ``CompareWith``."""
    if type(get) is AttrOfPicked and type(get.pick) is FirstOrEvent:
        return FirstAttrCompare(cmp, get.pick.slot, get.attr, lit)
    return CompareWith(cmp, get, lit)


class AttrOfPicked:
    """Attribute ``attr`` of the event ``pick`` gives (``MISSING`` when it gives none)."""

    __slots__ = ("pick", "attr")

    def __init__(self, pick: Callable[[Any, tuple], Any], attr: str) -> None:
        self.pick = pick
        self.attr = attr

    def __call__(self, ev: Any, vec: tuple) -> Any:
        x = self.pick(ev, vec)
        return MISSING if x is None else x.get(self.attr)


class EndOfRunAttr:
    """Attribute ``attr`` of ``v[1]`` (``last`` false) or ``v[v.len]`` of a Kleene variable ``v`` bound before this
    place, in one call (``AttrOfPicked`` over a picking function would be two)."""

    __slots__ = ("slot", "attr", "last")

    def __init__(self, slot: int, attr: str, last: bool) -> None:
        self.slot = slot
        self.attr = attr
        self.last = last

    def __call__(self, ev: Any, vec: tuple) -> Any:
        run = vec[self.slot]
        x = run.last if self.last else run.first
        return MISSING if x is None else x.get(self.attr)


class FirstOrEvent:
    """``v[1]`` while ``v`` takes its iterations: the first event its run bound, or the event being tested when it
    has bound none."""

    __slots__ = ("slot",)

    def __init__(self, slot: int) -> None:
        self.slot = slot

    def __call__(self, ev: Any, vec: tuple) -> Any:
        bound = vec[self.slot]
        return bound.first if bound is not None else ev
