"""yfpp: event patterns (SASE+ and extended XPath) over XML / JSON-lines streams, many queries at once.

>>> from yfpp import Engine
>>> eng = Engine()
>>> eng.register("PATTERN SEQ(shelf a, exit c) WHERE [tag_id]", name="out")
0
"""

from yfpp._version import __version__
from yfpp.engine import Engine
from yfpp.errors import YfppError
from yfpp.events import Event

__all__ = ["Engine", "Event", "YfppError", "__version__"]
