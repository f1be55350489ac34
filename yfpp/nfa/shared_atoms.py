"""Atomic predicates evaluated once per event, however many nodes hold them (issue 33: events → the predicates
they satisfy → transitions).

A check that reads nothing but the event being tested (``ev.attr op constant``, SASE+ or XPath ``@a op
literal``: :func:`~yfpp.nfa.predicates.atom_key`) gives the same answer to every node and every run that tests
it on one event.  Where two checks or more of the shared NFA compute the same thing (one key), they are
replaced by one :func:`shared_atom`, which evaluates the check at its first call of an event and answers every
later call of that event from a memo.  Decided at registration: a check no other node holds stays as it is, at no
cost.  A check that reads what a run has bound (``c.tag_id = a.tag_id``, aggregates, ``r[i-1]``) depends on the
run and is evaluated per run.
"""

from __future__ import annotations

from types import FunctionType
from typing import Any, Hashable

from yfpp.nfa.predicates import Check, atom_key

_FIELDS = ("begin", "take")  # a node's checks of the event being tested


class AtomMemo:
    """When the shared atoms' answers were given: the runtime counts its events in ``epoch`` (one more before
    each, an event object given again included: it may have changed); an atom's answer of another epoch, or of
    another event, is stale."""

    __slots__ = ("epoch",)

    def __init__(self) -> None:
        self.epoch = 0


def shared_atom(check: Check, memo: AtomMemo, key: Hashable) -> Check:
    """One atomic check standing for every check of its key in the shared NFA: ``check`` evaluated at the first
    call of an event, its answer kept for the later calls with that event in the same epoch (a call with
    another event, from outside the runtime's steps, evaluates it again).  A function, not an object with
    ``__call__`` (half the cost of a call on CPython 3.11); it carries ``key``, ``holders`` (the node checks it
    stands for) and ``cell``: [the memo's epoch of the answer, the answer, ``check``, the event answered] (it
    keeps that one event alive until the next)."""
    cell: list[Any] = [-1, False, check, None]

    def atom(ev: Any, vec: tuple) -> bool:
        epoch = memo.epoch
        if cell[0] == epoch and cell[3] is ev:
            return cell[1]
        answer = cell[2](ev, vec)
        cell[0] = epoch
        cell[1] = answer
        cell[3] = ev
        return answer

    atom.key = key  # type: ignore[attr-defined]
    atom.holders = 0  # type: ignore[attr-defined]
    atom.cell = cell  # type: ignore[attr-defined]
    atom.alone = (atom,)  # type: ignore[attr-defined]  # the checks of every node holding it alone: one tuple
    return atom


def is_shared(check: Check) -> bool:
    """Is ``check`` a :func:`shared_atom`?"""
    return type(check) is FunctionType and getattr(check, "cell", None) is not None


class SharedAtoms:
    """The atomic checks of a shared NFA's nodes by key: the one node holding a key's check (``single``), or the
    key's :func:`shared_atom` once a second check holds it (``atoms``).

    What is counted: every atomic check of a node below the root level (its runs, in any branch, test it on
    the same event); of a root found through a hash index, only once another root of its type has the same
    key (only those are found together: the per-user alerts ``device = 'Uj' AND celsius > t`` of a million
    users share no evaluation, and keep their checks as they are); of any other root, every one."""

    __slots__ = ("memo", "single", "atoms", "paired")

    def __init__(self) -> None:
        self.memo = AtomMemo()
        self.single: dict[Hashable, Any] = {}  # key -> the one node holding it
        self.atoms: dict[Hashable, Check] = {}  # key -> its shared atom
        self.paired: set[Any] = set()  # the roots found through a hash index whose checks are counted

    def add(self, node: Any, mate: Any = None) -> None:
        """Count the atomic checks of new ``node``; ``mate``: for a root found through a hash index, another root
        the same lookup finds (None: there is none yet)."""
        if node.parent is None and hash_keyed(node.index_key):
            if mate is None:
                return
            if mate not in self.paired:  # (it was alone: not counted)
                self.paired.add(mate)
                self.count(mate)
            self.paired.add(node)
        self.count(node)

    def count(self, node: Any) -> None:
        """Count the atomic checks of new ``node`` (below the root level, or a root whose checks are counted: see
        :meth:`add`)."""
        single, atoms = self.single, self.atoms
        for check in (*node.begin, *node.take) if node.take else node.begin:
            key = atom_key(check)
            if key is None:  # (a shared atom too: a function, which has no atom_key)
                continue
            atom = atoms.get(key)
            if atom is not None:
                atom.holders += _replace(node, key, atom)  # type: ignore[attr-defined]
                continue
            first = single.pop(key, None)
            if first is None:
                single[key] = node
                continue
            atom = atoms[key] = shared_atom(check, self.memo, key)  # (the second check of the key)
            if first is not node:
                atom.holders += _replace(first, key, atom)  # type: ignore[attr-defined]
            atom.holders += _replace(node, key, atom)  # type: ignore[attr-defined]

    def remove(self, node: Any) -> None:
        """Forget the atomic checks of ``node``, which no query uses any more."""
        single, atoms = self.single, self.atoms
        self.paired.discard(node)
        for field in _FIELDS:
            for check in getattr(node, field):
                if is_shared(check):
                    check.holders -= 1  # type: ignore[attr-defined]
                    if not check.holders:  # type: ignore[attr-defined]
                        del atoms[check.key]  # type: ignore[attr-defined]
                    continue
                key = atom_key(check)
                if key is not None and single.get(key) is node:
                    del single[key]

    def shared(self) -> list[Check]:
        """The atoms evaluated once per event for several checks."""
        return list(self.atoms.values())


def hash_keyed(key: tuple | None) -> bool:
    """Is a node of index key ``key`` found through a hash index (an equality, SASE+ or XPath)?"""
    return key is not None and key[0] in HASHED


#: the kinds of index keys (their first item) looked up in a hash index
HASHED = frozenset(("eq", "xeq", "xnum", "ceq", "cnum"))


def _replace(node: Any, key: Hashable, atom: Check) -> int:
    """Put ``atom`` in place of ``node``'s checks of ``key``; how many it replaced."""
    n = 0
    for field in _FIELDS:
        checks = getattr(node, field)
        if len(checks) < 2:  # (the commonest: none, or one check, which is the atom's alone or not at all)
            if checks and not is_shared(checks[0]) and atom_key(checks[0]) == key:
                setattr(node, field, atom.alone)  # type: ignore[attr-defined]
                n += 1
            continue
        new = tuple(atom if not is_shared(c) and atom_key(c) == key else c for c in checks)
        if new == atom.alone:  # type: ignore[attr-defined]
            new = atom.alone  # type: ignore[attr-defined]
        replaced = sum(1 for a, b in zip(checks, new) if a is not b)
        if replaced:
            setattr(node, field, new)
            n += replaced
    return n
