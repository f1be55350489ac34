"""A compiled check made again for other constants without compiling it.

A query shape's conjunct is compiled once with stand-ins for its constants (``yfpp.nfa.shape_plans``); the check of
a query of the shape is that check's objects copied where they hold a stand-in, the query's constant put in its
place (a stand-in inside a text, as an XPath test keeps its source, replaced as written), and shared where they hold
none.  Only slotted objects, tuples and plain values are looked into; anything else (a function, a frozenset, …) is
shared as it is.  That gives what compiling gives only where the compiled objects keep each constant as it is, so a
shape plan rebinds a conjunct only after :func:`same` found both equal for probe constants.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from yfpp.language.query_text import put_constants

_PLAIN = (str, int, float, bool, type(None))
_UNSET: Any = object()  # (a slot never set)


@lru_cache(maxsize=None)
def _slots(cls: type) -> tuple[str, ...] | None:
    """The slots of ``cls``'s instances (every class of its line), or None when they are not all in slots."""
    if cls in _PLAIN or cls is tuple:
        return None
    names: list[str] = []
    for base in cls.__mro__[:-1]:  # (object's last)
        own = base.__dict__.get("__slots__")
        if own is None:
            return None
        own = (own,) if isinstance(own, str) else tuple(own)
        if "__dict__" in own:
            return None
        names += [n for n in own if n != "__weakref__"]
    return tuple(names)


class Rebinding:
    """How to make ``check`` again with other constants: the paths from it to the values that hold a stand-in, found
    once; a query's check is the objects along them copied, the rest shared without being looked at."""

    __slots__ = ("check", "recipe")

    def __init__(self, check: Any, stand_ins: set[tuple[type, Any]], written: list[str]) -> None:
        """``stand_ins``: each stand-in as ``(type, value)``; ``written``: each as the query text writes it."""
        self.check = check
        self.recipe = _recipe(check, stand_ins, written)

    def made(self, literals: dict[tuple[type, Any], Any], texts: list[tuple[str, str]]) -> Any:
        """The check with ``literals[(type, stand-in)]`` in place of each stand-in it holds, and each text holding a
        stand-in as written (``texts``: ``(stand-in, constant)`` as written) holding the constant instead."""
        return self.check if self.recipe is None else _made(self.check, self.recipe, literals, texts)


_LEAF: Any = object()  # the recipe of a text or an integer that holds a stand-in


def _recipe(obj: Any, stand_ins: set[tuple[type, Any]], written: list[str]) -> Any:
    """None where ``obj`` holds no stand-in; else ``_LEAF`` for a text or an integer, or ``(names, [(slot or index,
    its recipe), …])`` for a tuple (names None) or a slotted object (names: its other slots, shared as they are)."""
    t = type(obj)
    if t is str:
        return _LEAF if (str, obj) in stand_ins or any(w in obj for w in written) else None
    if t is int:
        return _LEAF if (int, obj) in stand_ins else None
    if t is tuple:
        names, items = None, list(enumerate(obj))
    else:
        names = _slots(t)
        if names is None:
            return None
        items = [(n, getattr(obj, n)) for n in names if hasattr(obj, n)]
    parts = [(at, r) for at, r in ((at, _recipe(x, stand_ins, written)) for at, x in items) if r is not None]
    if not parts:
        return None
    if names is not None:  # (a slotted object: the slots it shares, then those it makes)
        names = tuple(n for n in names if n not in {at for at, _ in parts})
    return names, parts


def _made(obj: Any, recipe: Any, literals: dict[tuple[type, Any], Any], texts: list[tuple[str, str]]) -> Any:
    """``obj`` (holding stand-ins where ``recipe`` says) made with the constants ``literals`` (as written: ``texts``)."""
    if recipe is _LEAF:
        new = literals.get((type(obj), obj), _UNSET)
        if new is not _UNSET:
            return new
        return put_constants(obj, texts)
    names, parts = recipe
    if names is None:
        items = list(obj)
        for i, r in parts:
            items[i] = _made(obj[i], r, literals, texts)
        return tuple(items)
    made = _new(type(obj))
    for name in names:
        value = getattr(obj, name, _UNSET)
        if value is not _UNSET:
            _set(made, name, value)
    for name, r in parts:
        _set(made, name, _made(getattr(obj, name), r, literals, texts))
    return made


_new, _set = object.__new__, object.__setattr__


def same(a: Any, b: Any) -> bool:
    """Are ``a`` and ``b`` the same check: equal plain values, tuples and slotted objects of one class holding the same,
    and anything else the very same object?"""
    t = type(a)
    if t is not type(b):
        return False
    if t in _PLAIN:
        return a == b or a != a and b != b  # (a NaN is the same as a NaN)
    if t is tuple:
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    names = _slots(t)
    if names is None:
        return a is b
    return all(same(getattr(a, n, _UNSET), getattr(b, n, _UNSET)) for n in names)
