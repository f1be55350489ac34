"""The event type of the hot path (docs/semantics.md §1)."""

from __future__ import annotations

from typing import Any, Mapping

from yfpp.input.line_attributes import line_texts

#: Sentinel returned by :meth:`Event.get` for an attribute the event lacks.
MISSING: Any = type("Missing", (), {"__repr__": lambda self: "MISSING", "__bool__": lambda self: False})()

PSEUDO_ATTRS = ("ts", "type", "seq")


class Event:
    """One event: ``type``, ``ts``, ``attrs``, ``seq`` and, for XML input, its element.

    ``seq`` is the 0-based arrival position and the event's identity in every
    output; it is ``-1`` until the engine (or a reader) assigns it.  A derived
    event (``yfpp.runtime.feedback``) has a string ``seq``.  ``pos`` is the event's
    stream position, set by the runtime: "before", "between" and pruning go by
    ``pos``, never by ``seq``.  ``element`` is the XML element, or, with
    ``texts`` (the element's attribute texts), the line it starts on: the
    element ``<type texts…/>`` is then built only when something asks for it
    (or parsed from the line's bytes, for an element in a namespace or with
    children: ``(line, bytes, wrapper)``).
    """

    __slots__ = ("type", "ts", "attrs", "seq", "pos", "_texts", "_el")

    def __init__(self, type: str, ts: float, attrs: dict[str, Any] | None = None, seq: int = -1, element: Any = None,
                 texts: dict[str, str] | None = None):
        self.type = type
        self.ts = ts
        self.attrs = attrs if attrs is not None else {}
        self.seq = seq
        self.pos = -1
        # the attribute texts (see texts), or the bytes of the line they are read from when first asked for
        self._texts: dict[str, str] | bytes | None = texts
        self._el = element

    @property
    def texts(self) -> dict[str, str] | None:
        """The attribute texts of an XML event whose element is built only when asked for (the plainest XML
        feeds, :mod:`yfpp.input.xml_lines`): what ``element.get(name)`` gives, without the element; else None."""
        texts = self._texts
        if type(texts) is bytes:
            texts = self._texts = line_texts(texts)
        return texts

    @property
    def _element(self) -> Any:
        """The XML element the event was read from (built from :attr:`texts` on first use), or None."""
        el = self._el
        if type(el) is int:
            from yfpp.input.xml_element import line_element

            el = self._el = line_element(self.type, self.texts, el)  # type: ignore[arg-type]
        elif type(el) is tuple:  # (line, the line's bytes, the wrapper that declares its namespaces)
            from yfpp.input.xml_element import parsed_line_element

            el = self._el = parsed_line_element(*el)
        return el

    @_element.setter
    def _element(self, el: Any) -> None:
        self._el = el

    def get(self, name: str) -> Any:
        """Attribute ``name``; then the pseudo-attributes ts/type/seq; else MISSING."""
        v = self.attrs.get(name, MISSING)
        if v is MISSING and name in PSEUDO_ATTRS:
            return getattr(self, name)
        return v

    @property
    def element(self):
        """The XML element (built on demand for events that came from JSON)."""
        el = self._element
        if el is None:
            from yfpp.input.xml_element import element_for

            el = self._el = element_for(self)
        return el

    @classmethod
    def from_dict(cls, record: Mapping[str, Any], ts_field: str = "ts", seq: int = -1) -> "Event":
        """``{"type": …, "ts": …, <attributes>…}`` → Event (no validation)."""
        attrs = {k: v for k, v in record.items() if k != "type" and k != ts_field}
        return cls(record["type"], record[ts_field], attrs, seq)

    def to_dict(self) -> dict[str, Any]:
        return {"type": self.type, "ts": self.ts, **self.attrs, "seq": self.seq}

    def describe(self) -> dict[str, Any]:
        """The event as a match lists it with full events (``Engine(full_events=True)``): its attributes
        copied, so that a caller changing a match changes no event a run still holds."""
        return {"seq": self.seq, "type": self.type, "ts": self.ts, "attrs": dict(self.attrs)}

    def __repr__(self) -> str:
        return f"Event({self.type!r}, ts={self.ts!r}, seq={self.seq}, {self.attrs!r})"
