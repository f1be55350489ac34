"""Checkpoints that write the registered queries once (docs/operations.md, "Periodic checkpoints").

A *base* file beside the checkpoint holds the queries as a version-3 checkpoint keeps them (``shapes``,
``queries``) and a map of the caller's data by name (``keyed``: the service's source of each subscription); a
checkpoint taken against it names it (``base``: its file and token) and holds only what changed since: the
shapes and rows of the queries registered since (``shapes`` numbered after the base's, ``queries``), the ids of
the base's queries gone (``removed``), ``[id, since_tick]`` of the base's queries whose tick rose (``since``),
and the ``keyed`` entries changed and removed. Runs, buffers and counters are whole in every checkpoint.

A base file is written once (atomically, under a name of its own) and never changed; a checkpoint takes a new
one when there is none yet or the changes since reach a quarter of it. It is removed only once a checkpoint
against a newer one is in place and no checkpoint being written refers to it: a kill -9 at any moment leaves
the checkpoint in place and its base.
"""

from __future__ import annotations

import re
import secrets
import threading
from collections import Counter
from pathlib import Path
from typing import Any, Iterable

from yfpp.errors import YfppError
from yfpp.state.checkpoint import (EncodedPatterns, NodeRefs, json_pieces, query_rows, read_checkpoint,
                                  taken_queries, write_pieces)

BASE_FORMAT = "yfpp-checkpoint-base"
COMPACT = 4  #: a new base once the changes since the last reach 1/COMPACT of its queries …
MIN_CHANGES = 1000  #: … and at least this many
_TOKEN = re.compile(r"[0-9a-f]{12}")  #: a base's token (and so its file name's end)


def base_name(checkpoint: Path, token: str) -> str:
    """The file name of the base ``token`` of the checkpoint at ``checkpoint``."""
    return f"{checkpoint.name}.base-{token}"


class _Base:
    """A base as written: its token, and what it holds (each query's entry in ``Engine.sources``, to compare by
    identity; each query's since_tick; the shed counters then; its shapes by index; the keyed map)."""

    def __init__(self, token: str, kept: dict[int, object], shed: dict) -> None:
        self.token, self.kept, self.shed = token, kept, shed
        self.since: dict[int, Any] = {}
        self.shapes: dict[tuple, int] = {}
        self.keyed: dict[str, Any] = {}


class TakenQueries:
    """The queries as :meth:`QueryBase.take` took them: against the base in place, or as a new base."""

    def __init__(self, base: _Base, new: bool, rows: list[tuple], removed: list[int], since: list[list]) -> None:
        self.base, self.new, self._rows, self._removed, self._since = base, new, rows, removed, since
        self._keyed: dict[str, Any] = {}
        self._base_data: dict | None = None

    @property
    def token(self) -> str:
        return self.base.token

    def keyed(self, keyed: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
        """The caller's map by name as it is now (its entries compared by identity with the base's): the entries
        changed since the base and the names removed, for the checkpoint (all are the new base's)."""
        self._keyed = keyed
        old = self.base.keyed
        if self.new or keyed is old:  # (the very map of the base: none changed)
            return {}, []
        changed = {k: v for k, v in keyed.items() if old.get(k) is not v}
        same = len(keyed) - len(changed)
        return changed, ([k for k in old if k not in keyed] if same != len(old) else [])

    def data(self, patterns: EncodedPatterns | None) -> dict:
        """The checkpoint's query fields (``Taken.data``); for a new base, its data too (:meth:`write_base`)."""
        base = self.base
        ref = {"token": base.token}
        if not self.new:
            rows = query_rows(self._rows, patterns, dict(base.shapes))
            return {"base": ref, **rows, "removed": self._removed, "since": self._since}
        rows = query_rows(self._rows, patterns, base.shapes)
        base.since = {row[0]: row[4] for row in self._rows}
        base.keyed = self._keyed
        self._base_data = {"format": BASE_FORMAT, "token": base.token, **rows, "keyed": self._keyed}
        return {"base": ref, "shapes": [], "queries": [], "removed": [], "since": []}

    def write_base(self, checkpoint: Path, patterns: EncodedPatterns | None, cancelled=None) -> None:
        """Write the new base (after :meth:`data`) beside ``checkpoint``, not readable by others."""
        if self._base_data is not None:
            data, self._base_data = self._base_data, None
            write_pieces(json_pieces(data, patterns), checkpoint.with_name(base_name(checkpoint, self.token)), cancelled)


class QueryBase:
    """The base of a service's checkpoints at ``path``, and what its takes keep between them (the nodes' references,
    the changes since the base): :meth:`take` on the engine thread, then :meth:`committed` or :meth:`discarded`
    once its checkpoint is in place or given up."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.node_refs: dict = {}  #: kept by ``NodeRefs`` from take to take (forgotten at each new base)
        self._refs_base: _Base | None = None  # the base ``node_refs`` was kept since
        self._lock = threading.Lock()
        self._base: _Base | None = None  # the base of the checkpoint in place, as taken here
        self._in_place: str | None = None  # the token of the base of the checkpoint in place (taken here or read)
        self._pending: Counter[str] = Counter()  # tokens of the checkpoints taken and not yet in place or given up
        self._files: set[str] = set()  # tokens of the base files written and not removed
        self._diff: tuple = (None, None, [], [])  # (sources.version, base, added, removed) of the last take

    def prepare(self, engine, node_ref: NodeRefs) -> None:
        """Before a take: ``node_ref`` knows the nodes of the queries registered since the base."""
        with self._lock:
            base = self._base
        if base is not self._refs_base:  # (the nodes of queries gone since are forgotten: one walk a base)
            self.node_refs.clear()
            self._refs_base = base
        if base is not None:
            for qid in self._changes(engine.sources, base)[0]:
                if qid in engine.queries:
                    node_ref.add(qid)

    def take(self, engine) -> TakenQueries:
        """The queries now, against the base in place (or as a new base); call with the engine quiet. The base
        is kept until the checkpoint taken is in place or given up (:meth:`committed`, :meth:`discarded`)."""
        sources = engine.sources
        with self._lock:
            base = self._base
            if base is not None:
                self._pending[base.token] += 1  # (from here its file stays: a commit meanwhile removes it not)
        added, removed = self._changes(sources, base) if base is not None else ([], [])
        if base is None or len(added) + len(removed) >= max(MIN_CHANGES, len(base.kept) // COMPACT):
            new = _Base(secrets.token_hex(6), dict(sources.entries()), dict(engine.runtime.counters.shed_runs))
            taken = TakenQueries(new, True, taken_queries(engine), [], [])
            with self._lock:
                if base is not None:
                    self._pending[base.token] -= 1
                self._pending[new.token] += 1
                self._files.add(new.token)
            return taken
        return TakenQueries(base, False, taken_queries(engine, added), removed, _since(engine, base, removed))

    def _changes(self, sources, base: _Base) -> tuple[list[int], list[int]]:
        """The ids of the queries registered since ``base`` (in registration order) and of its queries gone."""
        version, seen, added, removed = self._diff
        if version != sources.version or seen is not base:
            now, kept = sources.entries(), base.kept
            added = [qid for qid, entry in now.items() if kept.get(qid) is not entry]
            same = len(now) - len(added)
            removed = [qid for qid, entry in kept.items() if now.get(qid) is not entry] if same != len(kept) else []
            self._diff = (sources.version, base, added, removed)
        return added, removed

    def found(self, token: str | None) -> None:
        """The checkpoint in place was read with the base ``token`` (None: none): that file is removed once a
        checkpoint against a newer base is in place; the base files of no checkpoint (a kill -9 while one was
        written) are removed now."""
        keep = base_name(self.path, token) if token is not None else None
        for stale in self.path.parent.glob(base_name(self.path, "*")):
            if stale.name != keep:
                stale.unlink(missing_ok=True)
        with self._lock:
            self._in_place = token
            if token is not None:
                self._files.add(token)

    def committed(self, taken: TakenQueries) -> None:
        """``taken``'s checkpoint is in place: its base is the base now; the bases no checkpoint needs are removed."""
        with self._lock:
            self._pending[taken.token] -= 1
            self._base = taken.base
            self._in_place = taken.token
            self._remove_unused()

    def discarded(self, taken: TakenQueries) -> None:
        """``taken``'s checkpoint was given up."""
        with self._lock:
            self._pending[taken.token] -= 1
            self._remove_unused()

    def _remove_unused(self) -> None:
        for token in [t for t in self._files if t != self._in_place and self._pending[t] <= 0]:
            self.path.with_name(base_name(self.path, token)).unlink(missing_ok=True)
            self._files.discard(token)
            del self._pending[token]


def _since(engine, base: _Base, removed: list[int]) -> list[list]:
    """``[id, since_tick]`` of the base's queries whose since_tick rose since (a shed raises it: none unless the
    shed counters moved)."""
    if dict(engine.runtime.counters.shed_runs) == base.shed:
        return []
    gone, was = set(removed), base.since
    return [[qid, plan.since_tick] for qid, plan in engine.queries.items()
            if qid in was and qid not in gone and plan.since_tick != was[qid]]


# --- reading ------------------------------------------------------------------------


def read(path: Path) -> tuple[dict, dict[str, Any], str | None]:
    """The checkpoint at ``path`` with its base's queries merged in (as one written whole: ``Engine.restore``
    reads it), the base's keyed map and its token ({} and None for a checkpoint of no base). A base missing, of
    another token or not a base is refused as a corrupt checkpoint."""
    data = read_checkpoint(path)
    if not isinstance(data, dict) or "base" not in data:
        return data, {}, None
    try:
        token = data.pop("base")["token"]
        if not (isinstance(token, str) and _TOKEN.fullmatch(token)):
            raise ValueError(f"not a base's token: {token!r:.60}")
        name = base_name(path, token)
        base = read_checkpoint(path.with_name(name))
        if not isinstance(base, dict) or base.get("format") != BASE_FORMAT or base.get("token") != token:
            raise ValueError(f"{name} is not the base {token}")
        return _merged(data, base), base["keyed"], token
    except YfppError as e:
        raise YfppError(f"corrupt checkpoint: its base: {e}") from e
    except (KeyError, IndexError, TypeError, ValueError, AttributeError) as e:
        raise YfppError(f"corrupt checkpoint: its base: {type(e).__name__}: {e}") from e


def _merged(data: dict, base: dict) -> dict:
    """``data``'s queries after ``base``'s: the base's rows less those removed, their since_tick raised, then the
    rows of the checkpoint (registered later: ids increase, as ``Engine.restore`` checks)."""
    removed = set(_ints(data.pop("removed"), "removed"))
    since = {qid: tick for qid, tick in data.pop("since")}
    rows = []
    for row in base["queries"]:
        qid = row[0]
        if qid in removed:
            continue
        if qid in since:
            row[4] = since[qid]
        rows.append(row)
    data["shapes"] = base["shapes"] + data["shapes"]
    data["queries"] = rows + data["queries"]
    if not isinstance(base["keyed"], dict):
        raise TypeError("keyed is not an object")
    return data


def _ints(values: Iterable[Any], where: str) -> list[int]:
    values = list(values)
    if any(type(v) is not int for v in values):
        raise TypeError(f"{where}: not query ids")
    return values
