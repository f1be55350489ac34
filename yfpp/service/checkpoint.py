"""Engine-state checkpoints: the one place the service saves and restores its Engine.

The format and the atomic write are the engine's (``yfpp.state.checkpoint``,
documented in docs/operations.md); the service adds a ``service`` field (what
each query of the state was registered from, so that a start need not parse it
again).  Periodic checkpoints write the queries and that field once, in a base file,
and then what changed since (``yfpp.state.query_base``).  A checkpoint stalls the engine thread only to take the state (:func:`take`:
copies of what the engine changes, references to what it never changes); a
thread of its own makes it plain data and writes it to a staged file, a piece
at a time, and moves it into place once it has stored what the sinks still held
at that point (:class:`Staged`).
"""

from __future__ import annotations

import gc
import json
import os
from pathlib import Path
from typing import Any, Callable

from yfpp.engine import Engine
from yfpp.errors import YfppError
from yfpp.service.registry import counts_only
from yfpp.state import query_base
from yfpp.state.checkpoint import (Cancelled, EncodedPatterns, Taken, json_pieces, stored_patterns, stored_splits,
                                  write_checkpoint, write_pieces)
from yfpp.state.checkpoint import take as take_state
from yfpp.state.query_base import QueryBase, TakenQueries

SERVICE = "service"  #: the checkpoint field of the service's own data


def save(engine: Engine, path: Path, service: dict[str, Any] | None = None,
         patterns: EncodedPatterns | None = None) -> None:
    """Write the engine's snapshot (and ``service``; ``patterns``: its queries' encoded already) to ``path``
    atomically (temp file, fsync, rename)."""
    write_checkpoint(engine, path, {SERVICE: service} if service is not None else None, patterns)


def load(path: Path, patterns: EncodedPatterns | None = None, base: QueryBase | None = None,
         **opts: Any) -> tuple[Engine | None, dict[str, Any]]:
    """The engine restored from ``path`` (and its base) and the checkpoint's service data, or (None, {}) when there
    is no checkpoint yet; ``patterns`` keeps the restored queries' patterns as the checkpoint holds them encoded;
    ``base`` is told of the base file read (and the base files of no checkpoint are removed)."""
    if not path.is_file():
        if base is not None:
            base.found(None)  # (a base file of no checkpoint: a kill -9 during the first one)
        return None, {}
    data, service, token = read(path)
    if base is not None:
        base.found(token)
    gc.disable()  # (restoring makes a great many objects that live on: collecting meanwhile doubles the time)
    try:
        engine = Engine.restore(data, **opts)
        if patterns is not None:  # (the data is checked now; restoring left it as it was)
            encoded, splits = stored_patterns(data), stored_splits(data)
            for qid, (first, text, _) in engine.sources.kept():  # (no query's pattern made again: kept)
                if qid in encoded:
                    patterns.keep(qid, engine.sources[qid][0], encoded[qid])
                elif qid in splits and text is not None:  # (a query kept as text: kept split, as the data has it)
                    patterns.keep_text(qid, text, splits[qid])
    finally:
        gc.enable()
    gc.freeze()  # (the restored queries live as long as the service: no collection need walk them, as the next did)
    return engine, service if isinstance(service, dict) else {}


def read(path: Path) -> tuple[dict, Any, str | None]:
    """The checkpoint at ``path`` as one written whole (its base's queries merged in: ``Engine.restore`` reads it),
    its service field apart (the subscriptions' sources of the base, changed since) and its base's token."""
    data, keyed, token = query_base.read(path)
    service = data.pop(SERVICE, None) if isinstance(data, dict) else None
    if token is not None and isinstance(service, dict):
        removed = set(service.pop("removed", []))
        queries = {k: v for k, v in keyed.items() if k not in removed}
        queries.update(service.get("queries") or {})
        service["queries"] = queries
    return data, service, token


def load_counts(path: Path) -> dict[str, dict[str, int]]:
    """The counters an earlier version kept in a file of their own (now the registry keeps them with the
    queued results); none if there is no such file; an entry that is not counts is left out."""
    try:
        data = json.loads(path.read_bytes())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:
        raise YfppError(f"counters {path}: {e} (move the file away to start the counts from 0)") from e
    return counts_only(data)


def staged(path: Path) -> Path:
    """Where a checkpoint is written before it is moved to ``path``."""
    return path.with_name(path.name + ".staged")


class Staged:
    """A checkpoint taken (the engine's state, :func:`take`) and not yet written: :meth:`write` (on a thread of
    its own: the engine thread goes on meanwhile), then :meth:`commit` (or :meth:`discard`); :meth:`cancel` from
    another thread."""

    def __init__(self, taken: Taken | None, path: Path, patterns: EncodedPatterns | None = None,
                 service: dict[str, Any] | None = None, base: QueryBase | None = None):
        self._taken, self._service, self.path, self._patterns = taken, service, path, patterns
        self._base = base
        self._against: TakenQueries | None = taken.against if taken is not None else None
        self.cancelled = False
        self._written = taken is None

    def cancel(self) -> bool:
        """Stop writing it (a later checkpoint supersedes this one): :meth:`write` then raises. False if it is
        written already."""
        if self._written:
            return False
        self.cancelled = True
        return True

    def write(self) -> None:
        """Make the state plain data and write it to the staged file (a piece at a time: the engine thread runs
        between the pieces); YfppError if it was cancelled meanwhile. Nothing to do for one written already."""
        taken, service, self._taken, self._service = self._taken, self._service, None, None  # (held no longer)
        if taken is None:
            return
        staged(self.path).unlink(missing_ok=True)
        collecting = gc.isenabled()
        gc.disable()  # (the pieces are garbage once written: no collection walks the state meanwhile)
        try:
            data = taken.data()
            data[SERVICE] = service
            if self._against is not None:  # (a new base: in place before the checkpoint that needs it)
                self._against.write_base(self.path, self._patterns, lambda: self.cancelled)
            write_pieces(json_pieces(data, self._patterns), staged(self.path), lambda: self.cancelled)
            self._written = True
        except Cancelled:
            raise YfppError("cancelled: a later checkpoint supersedes it") from None
        finally:
            if collecting:
                gc.enable()

    def commit(self) -> None:
        os.chmod(staged(self.path), 0o600)  # (the state holds events: their owner's alone)
        os.replace(staged(self.path), self.path)
        self._settle(True)

    def discard(self) -> None:
        staged(self.path).unlink(missing_ok=True)
        self._settle(False)

    def _settle(self, committed: bool) -> None:
        """Tell the base (once) that this checkpoint is in place or given up."""
        against, self._against = self._against, None
        if self._base is not None and against is not None:
            (self._base.committed if committed else self._base.discarded)(against)


def take(engine: Engine, path: Path, service_of: Callable[[], dict[str, Any]],
         patterns: EncodedPatterns | None = None, base: QueryBase | None = None) -> Staged:
    """The engine's state as it is now (and ``service_of()``), sharing nothing the engine changes, to be written
    to ``path`` (:meth:`Staged.write`) while the engine goes on.

    Call it with the engine quiet (``engine_lock`` held): this is all the time a checkpoint takes from the engine
    thread. No process is forked: a child's copy-on-write doubled the memory of every page the service wrote while
    it lived, and the CPU each event cost meanwhile.

    With ``base``, the queries and the service's ``queries`` field are written as what changed since its base
    (a new base now and then: ``yfpp.state.query_base``)."""
    collecting = gc.isenabled()
    gc.disable()  # (a great many objects made at once: no collection meanwhile)
    try:
        service = service_of()
        taken = take_state(engine, patterns, base)  # (last: from here the base is held for it, Staged)
        if taken.against is not None:
            changed, removed = taken.against.keyed(service["queries"])
            service = {**service, "queries": changed, "removed": removed}
    finally:
        if collecting:
            gc.enable()
    return Staged(taken, path, patterns, service, base)
