"""The hardened lxml parser of XML feeds (no DTD, no entities, no network) and one record parsed alone in its
root's namespaces: what the XML reader parses with, and what an event read without a tree parses its line
with when something asks for its element."""

from __future__ import annotations

import threading
from typing import Any

from lxml import etree

BATCH_END = b"</yfpp-batch>"  #: the end tag of the wrapper records are parsed inside


def hardened_parser(encoding: str | None, target: Any = None) -> Any:
    """An lxml parser that resolves no entity, loads no DTD, reaches no network and keeps no comment."""
    return etree.XMLParser(
        encoding=encoding, resolve_entities=False, no_network=True, load_dtd=False, huge_tree=False,
        collect_ids=False, remove_comments=True, remove_pis=True, target=target,
    )


_PARSERS = threading.local()  # parse_alone's UTF-8 parser, one per thread (an lxml parser is not shared)


def parse_alone(data: bytes, line: int, scope: bytes, parser: Any = None) -> Any:
    """The detached element of one record's bytes parsed alone inside ``scope`` (the wrapper that declares its
    root's namespaces) by ``parser`` (a hardened UTF-8 one if None), its line ``line``; XMLSyntaxError if
    it does not parse."""
    if parser is None:
        parser = getattr(_PARSERS, "utf8", None)
        if parser is None:
            parser = _PARSERS.utf8 = hardened_parser(None)
    root = etree.fromstring(scope + data + BATCH_END, parser)
    el = root[0]
    root.remove(el)
    el.sourceline = min(line, 65535)  # libxml2 keeps an unsigned short
    return el
