"""The event type of the hot path (SPEC §1)."""

from __future__ import annotations

from typing import Any, Mapping

#: Sentinel returned by :meth:`Event.get` for an attribute the event lacks.
MISSING: Any = type("Missing", (), {"__repr__": lambda self: "MISSING", "__bool__": lambda self: False})()

PSEUDO_ATTRS = ("ts", "type", "seq")


class Event:
    """One event: ``type``, ``ts``, ``attrs``, ``seq`` and, for XML input, its element.

    ``seq`` is the 0-based arrival position and the event's identity in every
    output; it is ``-1`` until the engine (or a reader) assigns it.  A derived
    event (``yfpp.feedback``) has a string ``seq``.  ``pos`` is the event's
    stream position, set by the runtime: "before", "between" and pruning go by
    ``pos``, never by ``seq``.
    """

    __slots__ = ("type", "ts", "attrs", "seq", "pos", "_element")

    #: The attribute texts of an XML event whose element is built only when asked for
    #: (:class:`yfpp.xml_reader.XmlLineEvent`): what ``element.get(name)`` gives, without the element.
    texts: dict[str, str] | None = None

    def __init__(self, type: str, ts: float, attrs: dict[str, Any] | None = None, seq: int = -1, element: Any = None):
        self.type = type
        self.ts = ts
        self.attrs = attrs if attrs is not None else {}
        self.seq = seq
        self.pos = -1
        self._element = element

    def get(self, name: str) -> Any:
        """Attribute ``name``; then the pseudo-attributes ts/type/seq; else MISSING."""
        v = self.attrs.get(name, MISSING)
        if v is MISSING and name in PSEUDO_ATTRS:
            return getattr(self, name)
        return v

    @property
    def element(self):
        """The XML element (built on demand for events that came from JSON)."""
        if self._element is None:
            from yfpp.xml_element import element_for

            self._element = element_for(self)
        return self._element

    @classmethod
    def from_dict(cls, record: Mapping[str, Any], ts_field: str = "ts", seq: int = -1) -> "Event":
        """``{"type": …, "ts": …, <attributes>…}`` → Event (no validation)."""
        attrs = {k: v for k, v in record.items() if k != "type" and k != ts_field}
        return cls(record["type"], record[ts_field], attrs, seq)

    def to_dict(self) -> dict[str, Any]:
        return {"type": self.type, "ts": self.ts, **self.attrs, "seq": self.seq}

    def describe(self) -> dict[str, Any]:
        """The event as a match lists it with full events (``Engine(full_events=True)``)."""
        return {"seq": self.seq, "type": self.type, "ts": self.ts, "attrs": self.attrs}

    def __repr__(self) -> str:
        return f"Event({self.type!r}, ts={self.ts!r}, seq={self.seq}, {self.attrs!r})"
