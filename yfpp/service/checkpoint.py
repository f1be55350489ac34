"""Engine-state checkpoints: the one place the service saves and restores the Engine.

They use ``Engine.snapshot()`` (a JSON-safe dict) and ``Engine.restore(snapshot,
**opts)`` when the engine has them; with an engine that lacks them, checkpoints
are skipped (``save`` returns False) and a restart re-registers the
subscriptions from the registry with empty engine state.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from yfpp.engine import Engine


def supported() -> bool:
    return hasattr(Engine, "snapshot") and hasattr(Engine, "restore")


def save(engine: Engine, path: Path) -> bool:
    """Write the engine's snapshot to ``path`` atomically (temp file, fsync, rename); False if unsupported."""
    if not supported():
        return False
    data = engine.snapshot()  # type: ignore[attr-defined]
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f, separators=(",", ":"))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return True


def load(path: Path, **opts: Any) -> Engine | None:
    """The engine restored from ``path``, or None when there is no checkpoint (or no support)."""
    if not supported() or not path.is_file():
        return None
    with open(path, encoding="utf-8") as f:
        return Engine.restore(json.load(f), **opts)  # type: ignore[attr-defined]
