"""What a shape plan reads of a conjunct made for a query's constants, without making its expression.

A conjunct that holds constants and is no plain comparison (an ``or``, an XPath test of several comparisons…) is made
for each query from its shape's (``yfpp.nfa.shape_plans._Remade``): its check rebound to the constants
(``yfpp.nfa.rebind``), and its expression key (``compiler.expr_key``), index keys (``shared_nfa.conjunct_keys``) and
atom key (``shared_nfa.atom_key``) read from the expression with the constants put in.  :class:`KeysTemplate` reads
those three once from the shape's expression, stand-ins in it, and gives a query's by putting its constants where
the stand-ins stand: in the key's text, each stand-in as ``repr`` writes it (inside a literal or an XPath text alike);
in the index keys, each item that is a stand-in.  A shape plan uses it only after :meth:`KeysTemplate.make` found that
to give what reading the expression gives, on probe constants, and only for constants like the probes (:func:`takes`).
"""

from __future__ import annotations

from typing import Any

from yfpp.nfa.compiler import expr_key
from yfpp.nfa.shared_nfa import atom_key, conjunct_keys

StandIn = tuple[type, Any]  # a stand-in as the literal key of its shape: (type, value)


class KeysTemplate:
    """A conjunct's keys with stand-ins for its constants, and where each constant goes."""

    __slots__ = ("key", "found", "atom", "pieces", "items")

    def __init__(self, expr: Any, me: str, stand_ins: list[tuple[StandIn, Any]]) -> None:
        """``expr``: the shape's conjunct; ``me``: its component (``#i``); ``stand_ins``: each of its constants'
        stand-in and, for an XPath number (a text stand-in), the integer its index keys hold, else None."""
        self.key = expr_key(expr)
        self.found = conjunct_keys(expr, me)
        self.atom = atom_key(expr, me)
        # what an index key item holding a stand-in is: the item -> (its literal key, whether an integer is put in)
        self.items = {s[1]: (s, False) for s, _ in stand_ins}
        self.items.update({number: (s, True) for s, number in stand_ins if number is not None})
        # the key's text cut at each stand-in, as repr writes it (a text's without quotes, an integer's digits):
        # ((the text before, the stand-in's literal key), …), the text after; None when one is not there once
        self.pieces: tuple | None = None
        marks = [(s, repr(s[1])[1:-1] if s[0] is str else repr(s[1])) for s, _ in stand_ins]
        if all(self.key.count(mark) == 1 for _, mark in marks):
            cuts, start = [], 0
            for i, mark, s in sorted((self.key.index(mark), mark, s) for s, mark in marks):
                if i < start:
                    return
                cuts.append((self.key[start:i], s))
                start = i + len(mark)
            self.pieces = (tuple(cuts), self.key[start:])

    @classmethod
    def make(cls, expr: Any, me: str, stand_ins: list[tuple[StandIn, Any]],
             probes: list[tuple[dict, Any]]) -> "KeysTemplate | None":
        """The template of ``expr``'s keys when each stand-in is written once in its key and putting the probes'
        constants in gives what reading the probes' expressions gives (``probes``: ``(literals, expression)``); else
        None."""
        template = cls(expr, me, stand_ins)
        if template.pieces is None:
            return None
        for literals, made in probes:
            if (template.key_of(literals), template.found_of(literals), template.atom_of(literals)) != \
                    (expr_key(made), conjunct_keys(made, me), atom_key(made, me)):
                return None
        return template

    def key_of(self, literals: dict[StandIn, Any]) -> str:
        """The expression key of the conjunct whose constants are ``literals``."""
        cuts, last = self.pieces  # type: ignore[misc]
        out = []
        for before, stand_in in cuts:
            value = literals[stand_in]
            out += (before, repr(value)[1:-1] if type(value) is str else repr(value))
        out.append(last)
        return "".join(out)

    def found_of(self, literals: dict[StandIn, Any]) -> list[tuple]:
        """Its index keys."""
        return [self._put(k, literals) for k in self.found]

    def atom_of(self, literals: dict[StandIn, Any]) -> tuple | None:
        """Its atom key."""
        return None if self.atom is None else self._put(self.atom, literals)

    def _put(self, key: tuple, literals: dict[StandIn, Any]) -> tuple:
        out = []
        for item in key:
            if type(item) is tuple:
                item = self._put(item, literals)
            elif type(item) in (str, int):
                found = self.items.get(item)
                if found is not None:
                    item = int(literals[found[0]]) if found[1] else literals[found[0]]
            out.append(item)
        return tuple(out)


def takes(constants: tuple[str, ...]) -> bool:
    """May a template make the keys of a conjunct whose constants, plain (no quote: ``repr`` writes their characters
    alike whatever quotes surround them), are ``constants`` (as written)?  When they are like the probes: texts not
    empty (an XPath ``starts-with`` of ``''`` has no index key), integers of at most 15 digits (an XPath index key
    reads no longer), distinct values (an ``or`` of equal constants has one index key where the shape's has two;
    ``'a'`` and ``"a"`` are one value, ``7`` and ``07`` too)."""
    for c in constants:
        if (len(c) < 3) if c[0] in "'\"" else (len(c) > 15):
            return False
    return len(constants) < 2 or len({(c[1:-1],) if c[0] in "'\"" else int(c) for c in constants}) == len(constants)
