"""The subscription registry: SQLite tables, so a restarted service keeps its subscriptions (and the results
their push sinks still held at a stop), its keys and the MQTT feeds added over the API."""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import threading
from contextlib import contextmanager
from typing import Any, Iterator, NoReturn

from yfpp.errors import YfppError

log = logging.getLogger("yfpp.service")

_TABLES = {
    "subscriptions": """CREATE TABLE subscriptions (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT UNIQUE NOT NULL,
    spec TEXT NOT NULL  -- the subscription request as JSON (name, query, sink, options)
)""",
    "queued": """CREATE TABLE queued (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    sub TEXT NOT NULL,    -- the subscription's id
    result TEXT NOT NULL  -- one result as JSON, queued for its push sink at the last stop
)""",
    "counts": """CREATE TABLE counts (
    sub TEXT PRIMARY KEY,  -- a subscription's id ('': the totals)
    counts TEXT NOT NULL   -- its counters as JSON, kept with the queued results (written in one transaction)
)""",
    "keys": """CREATE TABLE keys (
    id TEXT PRIMARY KEY,     -- the key's public id (yfpp_<id>_<secret>)
    name TEXT NOT NULL,
    role TEXT NOT NULL,      -- subscriber or feed
    digest TEXT NOT NULL,    -- SHA-256 of the secret (the secret itself is never stored)
    created REAL NOT NULL
)""",
    "owners": """CREATE TABLE owners (
    sub TEXT PRIMARY KEY,  -- a subscription's id (one with no row here is the admin's)
    key TEXT NOT NULL      -- the id of the key that made it
)""",
    "mqtt_feeds": """CREATE TABLE mqtt_feeds (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT UNIQUE NOT NULL,
    spec TEXT NOT NULL  -- the POST /feeds/mqtt request as JSON (broker URL, topics; no secret)
)""",
}
_COMPACT = json.JSONEncoder(separators=(",", ":")).encode  #: compact JSON (json.dumps with separators made an encoder at each call)
_WHEN_USED = ("counts", "keys", "owners", "mqtt_feeds")  #: tables made at their first row (a registry of a service without keys stays as it was)
#: each table's columns as ``PRAGMA table_info`` gives them: (name, declared type, not null, primary key)
_COLUMNS = {"subscriptions": [("seq", "INTEGER", 0, 1), ("id", "TEXT", 1, 0), ("spec", "TEXT", 1, 0)],
            "queued": [("seq", "INTEGER", 0, 1), ("sub", "TEXT", 1, 0), ("result", "TEXT", 1, 0)],
            "counts": [("sub", "TEXT", 0, 1), ("counts", "TEXT", 1, 0)],
            "keys": [("id", "TEXT", 0, 1), ("name", "TEXT", 1, 0), ("role", "TEXT", 1, 0), ("digest", "TEXT", 1, 0),
                     ("created", "REAL", 1, 0)],
            "owners": [("sub", "TEXT", 0, 1), ("key", "TEXT", 1, 0)],
            "mqtt_feeds": [("seq", "INTEGER", 0, 1), ("id", "TEXT", 1, 0), ("spec", "TEXT", 1, 0)]}


class RegistryError(YfppError):
    """The registry could not be read or written (a full disk, a damaged file)."""


class Registry:
    """Subscriptions by id, in creation order, their owners, the API keys and the MQTT feeds added over the API;
    ``path=None`` keeps them in memory only. A new file is readable by its owner only (it holds key digests)."""

    def __init__(self, path: str | None):
        self._lock = threading.Lock()
        self.path = path
        try:
            if path:
                os.close(os.open(path, os.O_RDWR | os.O_CREAT, 0o600))
            self._db = sqlite3.connect(path or ":memory:", check_same_thread=False, isolation_level=None)
            self._db.text_factory = _text  # (text that is not UTF-8, in a damaged file, is not valid where it is read)
            self._db.execute("PRAGMA journal_mode=WAL" if path else "PRAGMA journal_mode=MEMORY")
            # A commit is written to the log, not synced to the disk (a sync took 0.3 ms of CPU and 5 ms of each
            # POST /subscriptions): what was committed survives the end of the process, kill -9 too. The commit of
            # what a checkpoint keeps syncs the log (:meth:`keep_queued`), and with it every commit before: a
            # power loss takes the registry back no further than the engine's checkpoint it goes with.
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._check_tables()
        except sqlite3.Error as e:
            self._refuse(str(e))
        except OSError as e:  # (creating the file)
            self._refuse(e.strerror or str(e))
        except UnicodeDecodeError:  # SQLite's error message quotes text of the file that is not UTF-8
            self._refuse("damaged file (SQLite's error quotes bytes of it that are not UTF-8)")

    def _refuse(self, why: str) -> NoReturn:
        why = " ".join(why.split())  # one line
        raise YfppError(f"subscription registry {self.path}: {why} (move the file away to start with none)")

    def _check_tables(self) -> None:
        """Create the tables of a new registry (and ``queued``, which the first versions lacked); refuse a
        registry whose tables are not the ones this version reads and writes, or whose file is damaged."""
        db = self._db
        try:
            checked = db.execute("PRAGMA quick_check").fetchall()
        except sqlite3.DatabaseError as e:  # a page the check itself cannot read
            self._refuse(f"damaged file ({e})")
        problems = [line for (text,) in checked for line in str(text).splitlines()
                    if not line.startswith("*** ")]  # ("*** in database main ***" heads a list)
        if problems != ["ok"]:  # (before anything is written to it)
            self._refuse(f"damaged file ({problems[0]}{', …' if len(problems) > 1 else ''})")
        kinds = dict(db.execute(f"SELECT name, type FROM sqlite_master WHERE name IN ({', '.join('?' * len(_TABLES))})",
                                tuple(_TABLES)).fetchall())
        if "subscriptions" not in kinds and "queued" in kinds:
            self._refuse("it has no table subscriptions")
        self._made = set(kinds)
        for table, create in _TABLES.items():
            if table not in kinds:
                if table not in _WHEN_USED:
                    db.execute(create)
                    self._made.add(table)
            elif kinds[table] != "table":
                self._refuse(f"{table} is a {kinds[table]}, not a table")
            else:
                found = [(c[1], c[2].upper(), c[3], c[5]) for c in db.execute(f"PRAGMA table_info({table})")]
                if found != _COLUMNS[table]:
                    self._refuse(f"table {table} has the columns {_described(found)}, not {_described(_COLUMNS[table])}")

    @contextmanager
    def _transaction(self, synced: bool = False) -> Iterator[sqlite3.Connection]:
        """The database, in one transaction (all or nothing); RegistryError if it fails. ``synced``: the commit
        returns once it (and every commit before) is on the disk."""
        with self._lock:
            try:
                if synced:
                    self._db.execute("PRAGMA synchronous=FULL")
                self._db.execute("BEGIN IMMEDIATE")
                try:
                    yield self._db
                except BaseException:
                    self._db.execute("ROLLBACK")
                    raise
                self._db.execute("COMMIT")
            except (sqlite3.Error, UnicodeDecodeError) as e:  # (the second: an error message quoting a damaged file)
                if self._db.in_transaction:
                    self._db.execute("ROLLBACK")
                raise RegistryError(f"subscription registry {self.path}: {e}") from e
            finally:
                if synced:
                    self._db.execute("PRAGMA synchronous=NORMAL")

    def add(self, spec: dict[str, Any], owner: str | None = None) -> str:
        """Store a subscription (of the key ``owner``; None: the admin's); return its fresh id ``s1``, ``s2``, …
        (never reused, also across restarts)."""
        return self.add_many([spec], owner)[0]

    def add_many(self, specs: list[dict[str, Any]], owner: str | None = None) -> list[str]:
        """Store subscriptions (all of ``owner``) in one transaction (all or none); their fresh ids, in order."""
        sids = []
        with self._transaction() as db:
            for spec in specs:
                cur = db.execute("INSERT INTO subscriptions (id, spec) VALUES (hex(randomblob(8)), ?)", (json.dumps(spec),))
                sids.append(f"s{cur.lastrowid}")
                db.execute("UPDATE subscriptions SET id = ? WHERE seq = ?", (sids[-1], cur.lastrowid))
            if owner is not None and sids:
                self._make(db, "owners")
                db.executemany("INSERT OR REPLACE INTO owners (sub, key) VALUES (?, ?)", [(sid, owner) for sid in sids])
        return sids

    def update(self, sid: str, spec: dict[str, Any]) -> None:
        """Replace subscription ``sid``'s request by ``spec`` (its id, owner and kept results stay)."""
        with self._transaction() as db:
            db.execute("UPDATE subscriptions SET spec = ? WHERE id = ?", (json.dumps(spec), sid))

    def remove(self, sid: str) -> None:
        """Remove a subscription and the results kept for it."""
        self.remove_many([sid])

    def remove_many(self, sids: list[str]) -> None:
        """Remove subscriptions and what is kept for them, in one transaction."""
        rows = [(sid,) for sid in sids]
        with self._transaction() as db:
            tables = [("subscriptions", "id"), ("queued", "sub")] + ([("owners", "sub")] if "owners" in self._made else [])
            for table, column in tables:
                db.executemany(f"DELETE FROM {table} WHERE {column} = ?", rows)

    def all(self) -> list[tuple[str, str, str | None]]:
        """Every ``(id, spec as JSON text, owner key id or None)``, in creation order (the caller decodes and
        checks each)."""
        with self._transaction() as db:
            if "owners" not in self._made:
                return [(sid, spec, None) for sid, spec in db.execute("SELECT id, spec FROM subscriptions ORDER BY seq")]
            return db.execute("SELECT id, spec, key FROM subscriptions LEFT JOIN owners ON owners.sub = id "
                              "ORDER BY seq").fetchall()

    def _make(self, db: sqlite3.Connection, table: str) -> None:
        """Create a table of :data:`_WHEN_USED` at its first row (in the caller's transaction)."""
        db.execute(_TABLES[table].replace("CREATE TABLE", "CREATE TABLE IF NOT EXISTS", 1))  # (also after a rollback)
        self._made.add(table)

    def add_key(self, row: tuple[str, str, str, str, float]) -> None:
        """Store a key: (id, name, role, digest, created)."""
        with self._transaction() as db:
            self._make(db, "keys")
            db.execute("INSERT INTO keys (id, name, role, digest, created) VALUES (?, ?, ?, ?, ?)", row)

    def remove_key(self, kid: str) -> None:
        """Remove (revoke) a key: synced, so that no power loss brings it back."""
        with self._transaction(synced=True) as db:
            db.execute("DELETE FROM keys WHERE id = ?", (kid,))

    def keys(self) -> list[tuple[str, str, str, str, float]]:
        """Every key's (id, name, role, digest, created)."""
        if "keys" not in self._made:
            return []
        with self._transaction() as db:
            return db.execute("SELECT id, name, role, digest, created FROM keys ORDER BY created").fetchall()

    def add_feed(self, spec: dict[str, Any]) -> str:
        """Store an MQTT feed added over the API; return its fresh id ``m1``, ``m2``, … (never reused)."""
        with self._transaction() as db:
            self._make(db, "mqtt_feeds")
            cur = db.execute("INSERT INTO mqtt_feeds (id, spec) VALUES (hex(randomblob(8)), ?)", (json.dumps(spec),))
            fid = f"m{cur.lastrowid}"
            db.execute("UPDATE mqtt_feeds SET id = ? WHERE seq = ?", (fid, cur.lastrowid))
        return fid

    def remove_feed(self, fid: str) -> None:
        with self._transaction() as db:
            if "mqtt_feeds" in self._made:
                db.execute("DELETE FROM mqtt_feeds WHERE id = ?", (fid,))

    def feeds(self) -> list[tuple[str, str]]:
        """Every stored MQTT feed's ``(id, spec as JSON text)``, in creation order."""
        if "mqtt_feeds" not in self._made:
            return []
        with self._transaction() as db:
            return db.execute("SELECT id, spec FROM mqtt_feeds ORDER BY seq").fetchall()

    def keep_queued(self, queued: dict[str, list[dict]], counts: dict[str, dict[str, int]] | None = None,
                    gone: list[str] | None = None) -> None:
        """Replace the kept results by ``queued`` (results by subscription id, oldest first) and, given
        ``counts``, the kept counters (by subscription id; ``""``: the totals) by those, in one transaction: a
        crash keeps both as they were or both as given, never the results of one write with the counts of
        another. With ``gone`` (a list), ``counts`` are those that changed: their rows are replaced, the rows of
        ``gone`` removed and the others kept; without, the table is replaced. Synced: on the disk (with every
        change before it) when it returns, before the checkpoint they go with is put in place."""
        rows = [(sid, json.dumps(r, default=str)) for sid, results in queued.items() for r in results]
        with self._transaction(synced=True) as db:
            db.execute("DELETE FROM queued")
            db.executemany("INSERT INTO queued (sub, result) VALUES (?, ?)", rows)
            if counts is not None:  # (a subscription's counts that are all 0 are not stored: 0 is where they start)
                self._make(db, "counts")
                if gone is None:
                    db.execute("DELETE FROM counts")
                else:  # (the rows of those deleted, and of those whose counts are 0 again)
                    db.executemany("DELETE FROM counts WHERE sub = ?",
                                   [(sid,) for sid in gone] + [(sid,) for sid, c in counts.items() if not any(c.values())])
                db.executemany("INSERT OR REPLACE INTO counts (sub, counts) VALUES (?, ?)",
                               [(sid, _COMPACT(c)) for sid, c in counts.items() if sid == "" or any(c.values())])

    def kept_counts(self) -> dict[str, dict[str, int]] | None:
        """The counters :meth:`keep_queued` kept with the results (an entry that is not counts is left out);
        None if it never kept any (a registry of a version that kept them in a file of their own)."""
        if "counts" not in self._made:
            return None
        with self._transaction() as db:
            rows = db.execute("SELECT sub, counts FROM counts").fetchall()
        data = {}
        for sid, text in rows:
            try:
                data[sid] = json.loads(text)
            except (TypeError, ValueError):
                continue
        return counts_only(data)

    def kept_queued(self) -> dict[str, list[dict]]:
        """The results kept at the last stop, by subscription id, oldest first (they stay until the next
        :meth:`keep_queued`, so a crash before it keeps them too); a row that holds no result is logged and
        left out."""
        out: dict[str, list[dict]] = {}
        bad: list[str] = []
        with self._transaction() as db:
            for seq, sid, text in db.execute("SELECT seq, sub, result FROM queued ORDER BY seq"):
                why, result = _result(text)
                if why is None and not isinstance(sid, str):
                    why = f"its subscription id is {type(sid).__name__}"
                if why is None:
                    out.setdefault(sid, []).append(result)
                else:
                    bad.append(f"row {seq}: {why}")
        if bad:
            log.error("kept results that are not results are left out", extra={"results": len(bad), "first": bad[0]})
        return out

    def close(self) -> None:
        with self._lock:
            self._db.close()


def counts_only(data: Any) -> dict[str, dict[str, int]]:
    """The entries of ``data`` (kept counters by subscription id) that are counts: the others are left out."""
    if not isinstance(data, dict):
        return {}
    return {sid: c for sid, c in data.items()
            if isinstance(sid, str) and isinstance(c, dict) and all(type(v) is int and v >= 0 for v in c.values())}


def _result(text: Any) -> tuple[str | None, Any]:
    """(None, the result) of a kept result's JSON text, or (why it is none, None): a result is an object with
    the ``query`` and ``id`` strings and ``bindings`` (variables to lists of seqs) every sink relies on."""
    if not isinstance(text, (str, bytes)):
        return f"{type(text).__name__}, not JSON text", None
    try:
        r = json.loads(text)
    except ValueError as e:  # (UnicodeDecodeError too)
        return f"not JSON ({e})", None
    if not isinstance(r, dict):
        return f"a JSON {type(r).__name__}, not an object", None
    if not (isinstance(r.get("query"), str) and isinstance(r.get("id"), str) and r["id"]):
        return "no query or id string", None
    bindings = r.get("bindings")
    if not (isinstance(bindings, dict) and all(isinstance(v, list) and all(type(s) is int for s in v)
                                               for v in bindings.values())):
        return "bindings are not variables with lists of seqs", None
    if not all(_unicode(v) for v in r.values() if isinstance(v, str)):  # (a sink writes these as they are: XML)
        return "a field holds text that is not Unicode (a lone surrogate)", None
    return None, r


def _unicode(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def _text(data: bytes) -> str:
    """A TEXT value as a str; bytes that are not UTF-8 kept as lone surrogates (as the file system's names are)."""
    return data.decode("utf-8", "surrogateescape")


def _described(columns: list[tuple]) -> str:
    return "(" + ", ".join(f"{name} {kind}".strip() for name, kind, *_ in columns) + ")"
