"""Engine-state checkpoints: the one place the service saves and restores its Engine.

The format and the atomic write are the engine's (``yfpp.state.checkpoint``,
documented in docs/operations.md); the service adds a ``service`` field (what
each query of the state was registered from, so that a start need not parse it
again).  A periodic checkpoint stalls the engine thread only for a ``fork``:
the child process writes the snapshot of the state as it was at the fork to a
staged file, which the parent moves into place once it has stored what the
sinks still held at that point (:class:`Forked`).
"""

from __future__ import annotations

import gc
import json
import os
import signal
import tempfile
import threading
from pathlib import Path
from typing import Any, Callable

from yfpp.engine import Engine
from yfpp.errors import YfppError
from yfpp.service.registry import counts_only
from yfpp.state.checkpoint import (EncodedPatterns, read_checkpoint, stored_patterns, stored_splits,
                                  write_checkpoint)

SERVICE = "service"  #: the checkpoint field of the service's own data


def save(engine: Engine, path: Path, service: dict[str, Any] | None = None,
         patterns: EncodedPatterns | None = None) -> None:
    """Write the engine's snapshot (and ``service``; ``patterns``: its queries' encoded already) to ``path``
    atomically (temp file, fsync, rename)."""
    write_checkpoint(engine, path, {SERVICE: service} if service is not None else None, patterns)


def load(path: Path, patterns: EncodedPatterns | None = None, **opts: Any) -> tuple[Engine | None, dict[str, Any]]:
    """The engine restored from ``path`` and the checkpoint's service data, or (None, {}) when there is no
    checkpoint yet; ``patterns`` keeps the restored queries' patterns as the checkpoint holds them encoded."""
    if not path.is_file():
        return None, {}
    data = read_checkpoint(path)
    service = data.pop(SERVICE, None) if isinstance(data, dict) else None
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
    """Where a forked child writes the checkpoint before the parent moves it to ``path``."""
    return path.with_name(path.name + ".staged")


class Forked:
    """A checkpoint being written by a child process (``pid``; None: written already): :meth:`wait`, then
    :meth:`commit` (or :meth:`discard`); :meth:`cancel` from another thread."""

    def __init__(self, pid: int | None, errors: int | None, path: Path):
        self.pid, self._errors, self.path = pid, errors, path
        self.cancelled = False
        self._lock = threading.Lock()  # guards _pidfd: a signal never goes to a reaped child's pid, reused
        self._pidfd: int | None = None
        if pid is not None and hasattr(os, "pidfd_open"):
            try:
                self._pidfd = os.pidfd_open(pid)
            except OSError:  # (a kernel without pidfds: such a checkpoint cannot be cancelled, only waited for)
                pass

    def cancel(self) -> bool:
        """Stop the child (a later checkpoint supersedes this one): :meth:`wait` then raises. False if it
        cannot be stopped (gone already, or no pidfd to signal it through safely)."""
        with self._lock:
            if self._pidfd is None:
                return False
            try:
                signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)
            except ProcessLookupError:
                return False
            self.cancelled = True
            return True

    def wait(self) -> None:
        """Wait for the child; YfppError saying why if it wrote no checkpoint."""
        if self.pid is None or self._errors is None:
            return
        _, status = os.waitpid(self.pid, 0)
        with self._lock:
            if self._pidfd is not None:
                os.close(self._pidfd)
                self._pidfd = None
        why = os.read(self._errors, 4096).decode("utf-8", "replace")
        os.close(self._errors)
        code = os.waitstatus_to_exitcode(status)
        if code != 0:
            raise YfppError(why or f"the checkpoint process ended with status {code}")

    def commit(self) -> None:
        os.chmod(staged(self.path), 0o600)  # (the state holds events: their owner's alone)
        os.replace(staged(self.path), self.path)

    def discard(self) -> None:
        staged(self.path).unlink(missing_ok=True)


def write_staged(engine: Engine, path: Path, service_of: Callable[[], dict[str, Any]],
                 patterns: EncodedPatterns | None = None) -> Forked:
    """Write the engine's state (and ``service_of()``) to the staged file of ``path`` here and now, on the caller's
    thread: what a stop does, with the engine stopped (a fork of a large service cost more, in the pages its child
    copied as it touched the state, than the write itself). The :class:`Forked` returned is written already."""
    staged(path).unlink(missing_ok=True)
    collecting = gc.isenabled()
    gc.disable()  # (the snapshot makes a great many objects, all garbage once written: no collection meanwhile)
    try:
        save(engine, staged(path), service_of(), patterns)
    finally:
        if collecting:
            gc.enable()
    return Forked(None, None, path)


def fork(engine: Engine, path: Path, service_of: Callable[[], dict[str, Any]],
         patterns: EncodedPatterns | None = None) -> Forked:
    """Start writing the engine's state as it is now (and ``service_of()``) to the staged file of ``path``, in
    a child process (where the system cannot fork, here and now).

    Call it with the engine quiet (``engine_lock`` held); the child touches nothing but the engine, the
    service's subscriptions and that file, and ends with ``os._exit``."""
    if not hasattr(os, "fork"):
        return write_staged(engine, path, service_of, patterns)
    staged(path).unlink(missing_ok=True)
    tempfile._get_candidate_names()  # type: ignore[attr-defined]  # (made before the fork: no lock to inherit)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child
        code = 1
        try:
            os.closerange(3, w)  # (the sockets too: a parent killed meanwhile leaves no port held by the child)
            os.closerange(w + 1, os.sysconf("SC_OPEN_MAX"))
            gc.disable()
            save(engine, staged(path), service_of(), patterns)
            code = 0
        except BaseException as e:
            os.write(w, f"{type(e).__name__}: {e}".encode("utf-8", "replace")[:4000])
        finally:
            os._exit(code)
    os.close(w)
    return Forked(pid, r, path)
