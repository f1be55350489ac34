"""Engine-state checkpoints: the one place the service saves and restores its Engine.

The format and the atomic write are the engine's (``yfpp.state.checkpoint``,
documented in docs/operations.md); this module only decides what "no
checkpoint yet" means for a starting service.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from yfpp.state.checkpoint import read_checkpoint, write_checkpoint
from yfpp.engine import Engine


def save(engine: Engine, path: Path) -> None:
    """Write the engine's snapshot to ``path`` atomically (temp file, fsync, rename)."""
    write_checkpoint(engine, path)


def load(path: Path, **opts: Any) -> Engine | None:
    """The engine restored from ``path``, or None when there is no checkpoint yet."""
    if not path.is_file():
        return None
    return Engine.restore(read_checkpoint(path), **opts)
