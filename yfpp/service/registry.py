"""The subscription registry: one SQLite table, so a restarted service keeps its subscriptions."""

from __future__ import annotations

import json
import sqlite3
import threading
from typing import Any

from yfpp.errors import YfppError

_SCHEMA = """
CREATE TABLE IF NOT EXISTS subscriptions (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT UNIQUE NOT NULL,
    spec TEXT NOT NULL  -- the subscription request as JSON (name, query, sink, options)
)
"""


class Registry:
    """Subscriptions by id, in creation order; ``path=None`` keeps them in memory only."""

    def __init__(self, path: str | None):
        self._lock = threading.Lock()
        try:
            self._db = sqlite3.connect(path or ":memory:", check_same_thread=False, isolation_level=None)
            self._db.execute("PRAGMA journal_mode=WAL" if path else "PRAGMA journal_mode=MEMORY")
            self._db.execute(_SCHEMA)
        except sqlite3.Error as e:
            raise YfppError(f"subscription registry {path}: {e} (move the file away to start with none)") from e

    def add(self, spec: dict[str, Any]) -> str:
        """Store a subscription; return its fresh id ``s1``, ``s2``, … (never reused, also across restarts)."""
        with self._lock:
            cur = self._db.execute("INSERT INTO subscriptions (id, spec) VALUES (hex(randomblob(8)), ?)", (json.dumps(spec),))
            sid = f"s{cur.lastrowid}"
            self._db.execute("UPDATE subscriptions SET id = ? WHERE seq = ?", (sid, cur.lastrowid))
        return sid

    def remove(self, sid: str) -> None:
        with self._lock:
            self._db.execute("DELETE FROM subscriptions WHERE id = ?", (sid,))

    def all(self) -> list[tuple[str, str]]:
        """Every ``(id, spec as JSON text)``, in creation order (the caller decodes and checks each)."""
        with self._lock:
            return self._db.execute("SELECT id, spec FROM subscriptions ORDER BY seq").fetchall()

    def close(self) -> None:
        with self._lock:
            self._db.close()
