"""yfpp: event patterns (SASE+ and extended XPath) over XML / JSON-lines streams, many queries at once.

>>> from yfpp import Engine
>>> eng = Engine()
>>> eng.register("PATTERN SEQ(shelf a, exit c) WHERE [tag_id]", name="out")
0
"""

from typing import Any

from yfpp._version import __version__

__all__ = ["Engine", "Event", "YfppError", "__version__"]

# imported on first use: a program that only reads events (yfpp.input.readers) does not load the engine
_LAZY = {"Engine": "yfpp.engine", "Event": "yfpp.input.events", "YfppError": "yfpp.errors"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'yfpp' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])
