"""The XML element of an event that did not come from XML (used lazily by ``Event.element``).

``element_for(Event("shelf", 10.0, {"tag_id": 7, "zone": "Z1"}))`` is
``<shelf ts="10.0" tag_id="7" zone="Z1"/>``, so XPath predicates such as
``[@zone='Z1']`` work on JSON input too. Values are written as ``str(value)``,
except booleans as ``true``/``false`` (XML Schema); characters XML cannot hold
become U+FFFD. ``ts`` is the event's ts in seconds unless an attribute is named
``ts``. A name that is not an XML name (``1x``, ``²x``, ``a b``, ``a:b``…) becomes a child
``<attr name="1x">value</attr>``; a type that is not an XML name gives the tag
``event`` (a step's name test cannot match it anyway).
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from yfpp.input.events import Event

_NAME = re.compile(r"[^\W\d][\w.\-]*\Z")
_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")


@lru_cache(maxsize=4096)
def plain_xml_name(name: str) -> bool:
    """Is ``name`` an XML name without a colon, as lxml checks it (so it can name the element or an attribute)?"""
    if not _NAME.match(name):
        return False
    from lxml import etree

    try:
        etree.Element("e").set(name, "")
    except ValueError:  # letter-like characters a regex's \w takes and XML does not (``²``, ``ⅰ``…)
        return False
    return True


def xml_text(value: Any) -> str:
    """An attribute value as XML text (a list — a derived event's Kleene attribute — space-separated)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return " ".join(xml_text(v) for v in value)
    return _NOT_XML.sub("\ufffd", str(value))


def element_for(event: Event) -> Any:
    """A standalone lxml element ``<type attr="value" …/>`` for ``event``."""
    from lxml import etree  # imported when first needed: a JSON-lines run without XPath never loads lxml

    el = etree.Element(event.type if plain_xml_name(event.type) else "event")
    if "ts" not in event.attrs:
        el.set("ts", xml_text(event.ts))
    for name, value in event.attrs.items():
        if plain_xml_name(name):
            el.set(name, xml_text(value))
        else:
            etree.SubElement(el, "attr", name=xml_text(name)).text = xml_text(value)
    return el


def line_element(tag: str, texts: dict[str, str], line: int) -> Any:
    """The detached element ``<tag texts…/>`` at ``line``: what the XML reader parsed for an event it kept
    only the attribute texts of (``Event.texts``)."""
    from lxml import etree

    el = etree.Element(tag, texts)
    el.sourceline = min(line, 65535)  # libxml2 keeps an unsigned short
    return el


def parsed_line_element(line: int, raw: bytes, scope: bytes) -> Any:
    """The detached element of one line of an XML feed (UTF-8) parsed inside ``scope``, the start tag of a
    wrapper that declares its root's namespaces, at ``line``: what the XML reader parses for a record alone."""
    from yfpp.input.xml_parsing import parse_alone

    return parse_alone(raw, line, scope)


def attribute_text(event: Event, name: str) -> str | None:
    """What ``event.element.get(name)`` gives (XPath's ``@name``), without building the element."""
    texts = event.texts
    if texts is not None:
        return texts.get(name)
    el = event._element
    if el is not None:
        return el.get(name)
    if name in event.attrs:
        return xml_text(event.attrs[name]) if plain_xml_name(name) else None
    return xml_text(event.ts) if name == "ts" else None


class AttributeView:
    """Stands in for the element of an event that has none, for code that only reads ``.get``."""

    __slots__ = ("event",)

    def __init__(self, event: Event):
        self.event = event

    def get(self, name: str) -> str | None:
        return attribute_text(self.event, name)
