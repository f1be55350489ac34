"""The attributes of a plain XML line, read from its bytes (:mod:`yfpp.input.xml_lines` reads such lines
without a parser; ``Event.texts`` reads their texts back only when asked)."""

from __future__ import annotations

import re

# an XML name, ASCII only, without a colon (no namespace) and far shorter than libxml2's limit (50,000)
NAME = rb"[A-Za-z_][A-Za-z0-9._-]{0,999}+(?![A-Za-z0-9._-])"
# one quoted attribute of a line (its value holds no quote)
_ATTRIBUTE = re.compile(rb"[ \t]++(" + NAME + rb")[ \t]*+=[ \t]*+\"([^\"]*+)\"")


def line_texts(raw: bytes) -> dict[str, str]:
    """The attribute texts of a line :class:`yfpp.input.xml_lines.JsonLines` read (what lxml gives for its element)."""
    return {name.decode("ascii"): value.decode("utf-8") for name, value in _ATTRIBUTE.findall(raw)}
