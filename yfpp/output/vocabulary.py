"""Which event types and attribute names a stream had, and the names queries use that it lacked.

``yfpp run`` warns after a run when a query names a type or an attribute no
event had (``type 'Shelf' never seen; did you mean 'shelf'?``): a query that
matches nothing because of a misspelt or wrongly-cased name is otherwise silent.
The bookkeeping is one dict lookup and one set test per event, and stops once
every name the queries use has occurred (then no warning can come).
"""

from __future__ import annotations

import difflib
import re
from typing import Iterable

from yfpp.input.events import PSEUDO_ATTRS, Event
from yfpp.language.pattern import Aggregate, Pattern, Ref, XPathTest, walk

_XPATH_ATTR = re.compile(r"@([A-Za-z_][\w.-]*)")


class Vocabulary:
    """Attribute names seen per event type, noted until every name ``patterns`` use has been seen."""

    def __init__(self, patterns: Iterable[Pattern]) -> None:
        self.attrs: dict[str, set[str]] = {}
        patterns = list(patterns)
        emitted: dict[str, set[str]] = {}
        for pattern in patterns:
            _add_emitted(emitted, pattern)
        # (type, None) for a type, (type or None for any, attribute): the names not yet seen nor emitted
        self._open = [name for pattern in patterns for name in _wanted(pattern) if not _has(emitted, *name)]
        self.complete = False  # every name the queries use was seen: nothing more to note

    def note(self, events: Iterable[Event]) -> None:
        """Note each event's type and attribute names (nothing once :attr:`complete`)."""
        if self.complete:
            return
        seen = self.attrs
        for ev in events:
            names = seen.get(ev.type)
            if names is None:
                seen[ev.type] = set(ev.attrs)
            elif not names.issuperset(ev.attrs):
                names.update(ev.attrs)
        self._open = [name for name in self._open if not _has(seen, *name)]
        self.complete = not self._open

    def add_emitted(self, pattern: Pattern) -> None:
        """Count the event a query's RETURN builds as seen: fed back, other queries may match it."""
        _add_emitted(self.attrs, pattern)

    def unknown_names(self, query: str, pattern: Pattern) -> list[str]:
        """Warnings for the types and attributes ``pattern`` names that never occurred."""
        if not self.attrs:
            return []
        warnings: list[str] = []
        all_attrs = set().union(*self.attrs.values())
        for t, a in _wanted(pattern):
            if a is None:
                if t not in self.attrs:
                    warnings.append(f"query {query!r}: type {t!r} never seen{_hint(t, self.attrs)}")
                continue
            if t is not None and t not in self.attrs:
                continue  # the type warning says it
            names = all_attrs if t is None else self.attrs[t]
            if a not in names:
                on = "any event" if t is None else f"{t!r} events"
                warnings.append(f"query {query!r}: attribute {a!r} never seen on {on}{_hint(a, names)}")
        return warnings


def _add_emitted(attrs: dict[str, set[str]], pattern: Pattern) -> None:
    if pattern.emit is not None:
        attrs.setdefault(pattern.emit.event_type, set()).update(name for name, _ in pattern.emit.attrs)


def _has(attrs: dict[str, set[str]], type_: str | None, attr: str | None) -> bool:
    """Whether ``attrs`` holds type ``type_`` (``attr`` None), or ``attr`` on it (on any type if ``type_`` is None)."""
    if attr is None:
        return type_ in attrs
    if type_ is None:
        return any(attr in names for names in attrs.values())
    return attr in attrs.get(type_, ())


def _wanted(pattern: Pattern) -> list[tuple[str | None, str | None]]:
    """The names ``pattern`` uses: ``(type, None)`` for each event type, then ``(type, attribute)`` (type
    None for a variable of any type) for each attribute it reads, in order of appearance."""
    types = {c.var: c.event_type for c in pattern.components}
    wanted: dict[tuple[str | None, str | None], None] = {(t, None): None for t in types.values() if t is not None}
    for t in types.values():
        for a in pattern.partition_by:
            wanted[(t, a)] = None
    exprs = list(pattern.where) + ([e for _, e in pattern.emit.attrs] if pattern.emit else [])
    for expr in exprs:
        for node in walk(expr):
            if isinstance(node, (Ref, Aggregate)) and node.attr not in PSEUDO_ATTRS:
                wanted[(types.get(node.var), node.attr)] = None
            elif isinstance(node, XPathTest):
                for a in _XPATH_ATTR.findall(node.source):
                    if a not in PSEUDO_ATTRS:  # (@ts reads the record's own field)
                        wanted[(types.get(node.var), a)] = None
    return list(wanted)


def _hint(name: str, known: Iterable[str]) -> str:
    known = list(known)
    by_case = [k for k in known if k.lower() == name.lower()]
    close = by_case or difflib.get_close_matches(name, known, n=1)
    return f"; did you mean {close[0]!r}?" if close else ""
