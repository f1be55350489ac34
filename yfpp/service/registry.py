"""The subscription registry: SQLite tables, so a restarted service keeps its subscriptions (and the results
their push sinks still held at a stop)."""

from __future__ import annotations

import json
import sqlite3
import threading
from contextlib import contextmanager
from typing import Any, Iterator

from yfpp.errors import YfppError

_SCHEMA = """
CREATE TABLE IF NOT EXISTS subscriptions (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT UNIQUE NOT NULL,
    spec TEXT NOT NULL  -- the subscription request as JSON (name, query, sink, options)
);
CREATE TABLE IF NOT EXISTS queued (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    sub TEXT NOT NULL,    -- the subscription's id
    result TEXT NOT NULL  -- one result as JSON, queued for its push sink at the last stop
);
"""


class RegistryError(YfppError):
    """The registry could not be read or written (a full disk, a damaged file)."""


class Registry:
    """Subscriptions by id, in creation order; ``path=None`` keeps them in memory only."""

    def __init__(self, path: str | None):
        self._lock = threading.Lock()
        try:
            self._db = sqlite3.connect(path or ":memory:", check_same_thread=False, isolation_level=None)
            self._db.execute("PRAGMA journal_mode=WAL" if path else "PRAGMA journal_mode=MEMORY")
            self._db.executescript(_SCHEMA)
        except sqlite3.Error as e:
            raise YfppError(f"subscription registry {path}: {e} (move the file away to start with none)") from e

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        """The database, in one transaction (all or nothing); RegistryError if it fails."""
        with self._lock:
            try:
                self._db.execute("BEGIN IMMEDIATE")
                try:
                    yield self._db
                except BaseException:
                    self._db.execute("ROLLBACK")
                    raise
                self._db.execute("COMMIT")
            except sqlite3.Error as e:
                if self._db.in_transaction:
                    self._db.execute("ROLLBACK")
                raise RegistryError(f"subscription registry: {e}") from e

    def add(self, spec: dict[str, Any]) -> str:
        """Store a subscription; return its fresh id ``s1``, ``s2``, … (never reused, also across restarts)."""
        with self._transaction() as db:
            cur = db.execute("INSERT INTO subscriptions (id, spec) VALUES (hex(randomblob(8)), ?)", (json.dumps(spec),))
            sid = f"s{cur.lastrowid}"
            db.execute("UPDATE subscriptions SET id = ? WHERE seq = ?", (sid, cur.lastrowid))
        return sid

    def remove(self, sid: str) -> None:
        """Remove a subscription and the results kept for it."""
        with self._transaction() as db:
            db.execute("DELETE FROM subscriptions WHERE id = ?", (sid,))
            db.execute("DELETE FROM queued WHERE sub = ?", (sid,))

    def all(self) -> list[tuple[str, str]]:
        """Every ``(id, spec as JSON text)``, in creation order (the caller decodes and checks each)."""
        with self._transaction() as db:
            return db.execute("SELECT id, spec FROM subscriptions ORDER BY seq").fetchall()

    def keep_queued(self, queued: dict[str, list[dict]]) -> None:
        """Replace the kept results by ``queued`` (results by subscription id, oldest first)."""
        rows = [(sid, json.dumps(r, default=str)) for sid, results in queued.items() for r in results]
        with self._transaction() as db:
            db.execute("DELETE FROM queued")
            db.executemany("INSERT INTO queued (sub, result) VALUES (?, ?)", rows)

    def kept_queued(self) -> dict[str, list[dict]]:
        """The results kept at the last stop, by subscription id, oldest first (they stay until the next
        :meth:`keep_queued`, so a crash before it keeps them too)."""
        out: dict[str, list[dict]] = {}
        with self._transaction() as db:
            for sid, text in db.execute("SELECT sub, result FROM queued ORDER BY seq"):
                out.setdefault(sid, []).append(json.loads(text))
        return out

    def close(self) -> None:
        with self._lock:
            self._db.close()
