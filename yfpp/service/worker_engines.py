"""Worker engines (docs/service.md, "Worker engines"): ``yfpp serve --workers N`` spreads the subscriptions'
queries over N engines, each fed every event.

Share 0 is the service's own engine (the engine thread runs it); shares 1 … N-1
are engines in child processes, forked once the stored subscriptions are
registered (:meth:`WorkerEngines.launch`). A new query goes to the share that
holds the fewest (the main engine takes :data:`MAIN_SHARE` as many as a child); its id is given here, so that ids are unique over all
shares. Every batch of events the engine thread takes, packed once
(:func:`~yfpp.service.isolation.pack`), and each ``advance_time``, goes to
every child in the same order, as do registrations and removals: so each child
numbers the events as the main engine does and stands where it stands in the
stream when a query comes or goes, and each query's matches are exactly those
it has in one engine. A child holds only its share's queries: all it finds
goes back to the service (:class:`~yfpp.service.isolation.Returns`), each
subscription's results in its engine's order.

The children reuse the isolation engines' machinery
(:class:`~yfpp.service.isolation.Isolated`: a sender and a reader thread per
child); unlike an isolation engine, a worker that falls :data:`BACKLOG` events
behind makes the engine thread wait (as a full inbox makes the feeds wait),
and a worker that ends is the service's failure (as its engine thread's).
A registration waits, outside ``engine_lock``, for its child to say whether it
took the query (once it has the events sent before).

Feedback queries are refused (their derived events would reach only their
own share); event-set queries run as pattern queries do. Checkpoints: each
child writes its engine's state at the main checkpoint's stream position
(:func:`state_path`); a start restores each share from its file, or starts the
share afresh (its queries registered again) when the file does not fit.
"""

from __future__ import annotations

import dataclasses
import gc
import logging
import os
import pickle
import time
from collections import ChainMap, deque
from concurrent.futures import Future
from itertools import count
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, Sequence

from yfpp.engine import Engine
from yfpp.errors import YfppError
from yfpp.input.dead_letters import DeadLetters
from yfpp.input.events import Event
from yfpp.language.pattern import Pattern
from yfpp.nfa.shape_plans import QuerySources
from yfpp.service import checkpoint
from yfpp.service.accounting import Reported, Usage
from yfpp.service.isolation import (RESULT_CHUNK, STOP_WAIT, USAGE_EVERY, Deliver, Failed, Isolated, fork_child, pack,
                                    unpack)

log = logging.getLogger("yfpp.service")

BACKLOG = 20_000  #: events queued for a worker before the engine thread waits for it
#: the main engine's part of the queries against a child's: its process also reads the feeds and routes every
#: result (benchmarks/RESULTS.md, "yfpp serve --workers")
MAIN_SHARE = 0.5
REPLY_WAIT = 0.1  #: seconds between looks at whether a worker that owes a reply still runs

Item = tuple[Pattern, str, "str | None"]  #: a query to register: (pattern, name, policy)


def state_path(directory: Path, share: int) -> Path:
    """Where the checkpoint of worker engine ``share`` goes."""
    return directory / f"worker-{share}.json"


class Worker(Isolated):
    """Share ``share``'s engine in a child process: what the service holds of it."""

    backlog = BACKLOG
    kind = "worker engine"

    def __init__(self, share: int, pid: int, to_child: Connection, from_child: Connection, deliver: Deliver,
                 failed: Failed):
        self.share = share
        self.by_name = Reported(f"worker {share}", pid)  #: the child's last usage sample, by query name
        self.over: list[str] = []  #: queries the child found over max_cpu_share, not yet taken (:meth:`WorkerEngines.over`)
        self.live_runs = 0
        self.events_in = 0  #: events the child has taken (the main engine's ``events_in`` once it caught up)
        self._replies: deque[Future] = deque()  # registrations sent, in order, waiting for the child's answer
        super().__init__(-1, f"worker {share}", (), pid, to_child, from_child, deliver, failed)

    def feed(self, arrived: float | None, packed: list[tuple]) -> bool:
        """(engine thread) Queue a batch for the child, waiting while it is :data:`BACKLOG` events behind; False
        if it has stopped."""
        while not super().feed(arrived, packed):
            with self._wake:
                if self._stopping:
                    return False
                self._wake.wait(REPLY_WAIT)
        return True

    def register(self, items: list[tuple[int, Pattern, str, str | None]]) -> Future:
        """(holding ``engine_lock``) Have the child register ``(qid, pattern, name, policy)`` each: the answer,
        per item None or why it was refused, once the child has it."""
        done: Future = Future()
        self._replies.append(done)  # (before the message: the answer cannot come first)
        self.tell("register", items)
        return done

    def unregister(self, qid: int) -> None:
        self.tell("unregister", qid)

    def answer(self, done: Future, n: int) -> list[str | None]:
        """Wait for the answer of a registration of ``n`` queries (while the child runs: one that ended took
        none)."""
        while True:
            try:
                return done.result(REPLY_WAIT)
            except TimeoutError:
                if not self._reader.is_alive() and not done.done():
                    return [f"its {self.kind} (pid {self.pid}) ended"] * n

    def took(self, msg: tuple) -> None:
        if msg[0] == "registered":
            self._replies.popleft().set_result(msg[1])
        elif msg[0] == "taken":
            self.events_in = msg[1]
        elif msg[0] == "sample":
            self.by_name.take(msg[1], msg[4])
            self.over += msg[2]
            self.live_runs = msg[3]

    def info(self) -> dict[str, Any]:
        return {"share": self.share, "pid": self.pid, "events_in": self.events_in, "queued_events": self._queued,
                "queries": len(self.by_name), "live_runs": self.live_runs}


class Sources(ChainMap):
    """The shares' :class:`~yfpp.nfa.shape_plans.QuerySources` as one (``Engine.sources``' reads: a query's
    ``(pattern, text, name)``, its :meth:`text` without making its pattern)."""

    def text(self, qid: int) -> str | None:
        """Query ``qid``'s text (None: it was registered as a Pattern), without making its pattern."""
        for sources in self.maps:
            if qid in sources:
                return sources.text(qid)
        raise KeyError(qid)


class WorkerEngines:
    """The service's queries spread over ``n`` engines: ``main`` (share 0) and ``n - 1`` others, in this process
    until :meth:`launch`, in child processes after."""

    def __init__(self, n: int, main: Engine, kept: dict[int, Engine], engine_opts: dict[str, Any], max_share: float | None,
                 deliver: Deliver, failed: Failed):
        """``kept``: the shares' engines restored from their checkpoints (by share); the others start afresh, where
        ``main`` stands in the stream."""
        self.n, self.main = n, main
        self._max_share = max_share
        self._deliver, self._failed = deliver, failed
        self._local: list[Engine] = [main]  #: the shares' engines, until :meth:`launch`
        for share in range(1, n):
            engine = kept.get(share)
            if engine is None:
                engine = Engine(**engine_opts)
                engine.resume_stream(main.stream_state())
            self._local.append(engine)
        self.share_of: dict[int, int] = {qid: share for share, e in enumerate(self._local) for qid in e.sources}
        self._counts = [len(e.sources) for e in self._local]
        self._elsewhere = QuerySources()  # the other shares' queries, as kept (a plan's pattern is made when asked)
        for e in self._local[1:]:
            for qid, kept in e.sources.kept():
                self._elsewhere[qid] = kept
        self._ids = count(max(self.share_of, default=-1) + 1)
        self.workers: list[Worker] = []

    # --- the queries, over all shares ---------------------------------------------------

    @property
    def sources(self) -> Sources:
        """Every share's queries' sources, by query id (as ``Engine.sources``)."""
        return Sources(self.main.sources, self._elsewhere)

    @property
    def queries(self) -> ChainMap:
        """(before :meth:`launch`) Every share's pattern queries, by id."""
        return ChainMap(*(e.queries for e in self._local))

    @property
    def set_queries(self) -> ChainMap:
        """(before :meth:`launch`) Every share's event-set queries, by id."""
        return ChainMap(*(e.set_queries for e in self._local))

    def register_many(self, items: Sequence[Item], lock: Any) -> list[int | YfppError]:
        """Each ``(pattern, name, policy)`` registered on the share with the fewest queries (the main engine's
        counted :data:`MAIN_SHARE` as many), sent in one hold of
        ``lock``; per item, its id or the refusal (a feedback query's, or its engine's)."""
        out: list[int | YfppError] = []
        asked: dict[int, list[tuple[int, int, Pattern, str, str | None]]] = {}
        with lock:
            for pattern, name, policy in items:
                if pattern.feedback:
                    out.append(YfppError("a feedback query needs the service's engines to see its derived events: "
                                         "it runs only with --workers 1"))
                    continue
                share = min(range(self.n), key=lambda k: self._counts[k] / (MAIN_SHARE if k == 0 else 1.0))
                qid = next(self._ids)
                out.append(qid)
                if policy is not None and policy != pattern.policy:  # (as the engine keeps it: Engine.sources)
                    pattern = dataclasses.replace(pattern, policy=policy)
                self._took(qid, share, (pattern, None, name))
                if share == 0 or not self.workers:
                    try:
                        self._local[share].register(pattern, name, policy=policy, query_id=qid)
                    except YfppError as e:
                        self._forget(qid)
                        out[-1] = e
                else:
                    asked.setdefault(share, []).append((len(out) - 1, qid, pattern, name, policy))
            pending = []
            for share, rows in asked.items():
                pending.append((share, rows, self.workers[share - 1].register([row[1:] for row in rows])))
        for share, rows, done in pending:  # (outside the lock: the child answers once it has the events before)
            for (i, qid, *_), why in zip(rows, self.workers[share - 1].answer(done, len(rows))):
                if why is not None:
                    with lock:
                        self._forget(qid)
                    out[i] = YfppError(why)
        return out

    def unregister(self, qid: int) -> None:
        """(holding ``engine_lock``) Remove query ``qid`` from its share."""
        share = self.share_of.get(qid)
        if share is None:
            raise YfppError(f"no query with id {qid}")
        if share == 0 or not self.workers:
            self._local[share].unregister(qid)
        else:
            self.workers[share - 1].unregister(qid)
        self._forget(qid)

    def replace(self, qid: int, pattern: Pattern, name: str, policy: str | None, lock: Any) -> tuple[int, YfppError | None]:
        """Query ``qid`` removed, ``pattern`` registered as ``name``: (its id, None); if it is refused, the old
        query registered again (afresh): (its id, the refusal)."""
        with lock:
            old, _, old_name = self.sources[qid]
            self.unregister(qid)
        (new,) = self.register_many([(pattern, name, policy)], lock)
        if isinstance(new, YfppError):
            (back,) = self.register_many([(old, old_name, None)], lock)
            if isinstance(back, YfppError):
                raise back
            return back, new
        return new, None

    def _took(self, qid: int, share: int, source: tuple) -> None:
        self.share_of[qid] = share
        self._counts[share] += 1
        if share:
            self._elsewhere[qid] = source

    def _forget(self, qid: int) -> None:
        share = self.share_of.pop(qid)
        self._counts[share] -= 1
        self._elsewhere.pop(qid, None)

    # --- the children -------------------------------------------------------------------

    def launch(self) -> None:
        """Start shares 1 … n-1 in child processes (with the queries registered so far); OSError if one cannot
        be made (those started are stopped)."""
        try:
            for share in range(1, self.n):
                self.workers.append(self._start(share))
        except OSError:
            self.close()
            raise
        del self._local[1:]  # (the children have them)
        gc.unfreeze()  # (frozen with the rest at the start, their engines hold cycles: collected here, once)
        gc.collect()
        gc.freeze()
        log.info("worker engines started", extra={"workers": self.n, "pids": [w.pid for w in self.workers],
                                                  "queries": self._counts})

    def _start(self, share: int) -> Worker:
        engine = self._local[share]
        pid, to_child, from_child = fork_child(lambda inbox, out: _serve_share(engine, self._max_share, inbox, out))
        return Worker(share, pid, to_child, from_child, self._deliver, self._failed)

    def feed(self, arrived: float | None, events: Sequence[Event]) -> None:
        """(engine thread, after the main engine took ``events``) The batch to every child."""
        if self.workers:
            packed = [pack(ev) for ev in events]
            for worker in self.workers:
                worker.feed(arrived, packed)

    def advance(self, ts: float) -> None:
        for worker in self.workers:
            worker.tell("advance", ts)

    def checkpoint(self, directory: Path) -> list[tuple[Isolated, Path]]:
        """(holding ``engine_lock``) Each child to write its state: the children and their checkpoints' paths."""
        out: list[tuple[Isolated, Path]] = []
        for worker in self.workers:
            path = state_path(directory, worker.share)
            worker.checkpoint(path)
            out.append((worker, path))
        return out

    def over(self) -> list[str]:
        """(engine thread) The queries the children found over ``max_cpu_share`` since the last call."""
        names: list[str] = []
        for worker in self.workers:
            names += worker.over
            worker.over = []
        return names

    def reports(self) -> list[Reported]:
        """The children's last usage samples (:attr:`yfpp.service.accounting.Usage.shares`)."""
        return [w.by_name for w in self.workers]

    @property
    def live_runs(self) -> int:
        """The children's partial matches (as of their last samples)."""
        return sum(w.live_runs for w in self.workers)

    def info(self) -> list[dict[str, Any]]:
        return [w.info() for w in self.workers]

    def close(self) -> None:
        """Stop every child, each after what it was sent."""
        for worker in self.workers:
            worker.stop()
        for worker in self.workers:
            worker.join(STOP_WAIT + 1)
        self.workers = []


def load_kept(directory: Path, n: int, written: int, main: Engine, engine_opts: dict[str, Any]) -> dict[int, Engine]:
    """The shares' engines of the checkpoint in ``directory`` that go with ``main`` (at its stream position), by
    share; ``written``: the workers the checkpoint was written by. More than ``n`` is refused (their queries'
    state would be lost); files that do not fit are removed (their queries start afresh)."""
    if written > n:
        raise YfppError(f"the checkpoint in {directory} was written by --workers {written}: start with --workers "
                        f"{written} (or more), or remove its worker-*.json files to start the queries they hold "
                        f"afresh")
    kept: dict[int, Engine] = {}
    for path in sorted(directory.glob("worker-*.json")):
        share = path.stem.removeprefix("worker-")
        try:
            engine = checkpoint.load(path, **engine_opts)[0] if share.isdigit() and 0 < int(share) < written else None
            if engine is not None and engine.next_seq == main.next_seq:
                kept[int(share)] = engine
                continue
            if engine is not None:
                log.warning("a worker engine's checkpoint is not at the restored stream position: its queries "
                            "start afresh", extra={"path": str(path), "events_in": engine.next_seq})
        except (YfppError, OSError, ValueError) as e:
            log.error("a worker engine's checkpoint does not load: its queries start afresh",
                      extra={"path": str(path), "error": str(e)})
        path.unlink(missing_ok=True)
    return kept


def _serve_share(engine: Engine, max_share: float | None, inbox: Connection, out: Connection) -> None:
    """The child: ``engine`` fed what the service sends; all it finds sent back."""
    engine.dead_letters = engine.feedback.dead_letters = DeadLetters(os.devnull)  # the service reports them
    usage = Usage()
    results: list[dict] = []
    next_usage = time.monotonic() + USAGE_EVERY
    queries_changed = True  # (since the last sample: the event-set queries' names are sent again)
    while True:
        msg = inbox.recv() if inbox.poll(USAGE_EVERY) else ("idle",)  # (a usage sample each second, also idle)
        kind = msg[0]
        if kind == "stop":
            return
        if kind == "events":
            for t in msg[2]:
                try:
                    engine.process_batch((unpack(t),), results)
                except Exception:  # (the service's engine fails on it too, and reports it)
                    pass
        elif kind == "advance":
            try:
                engine.advance_time(msg[1], results)
            except Exception:
                pass
        elif kind == "register":
            out.send(("registered", [_register(engine, *item) for item in msg[1]]))
            queries_changed = True
            gc.freeze()  # (as the service after a batch: what they made lives on, no collection need walk it)
        elif kind == "unregister":
            if msg[1] in engine.sources:
                engine.unregister(msg[1])
                queries_changed = True
            gc.unfreeze()  # (as the service after a removal: what it held may now be garbage in cycles)
        elif kind == "checkpoint":
            try:
                checkpoint.save(engine, Path(msg[1]), {"worker": True})
                out.send(("checkpointed", None))
            except Exception as e:  # (a full disk, state the format cannot hold: the service says so)
                out.send(("checkpointed", f"{type(e).__name__}: {e}"[:500]))
        for i in range(0, len(results), RESULT_CHUNK):
            chunk = results[i:i + RESULT_CHUNK]
            out.send(("results", msg[1] if kind == "events" else None, None, len(chunk),
                      pickle.dumps(chunk, pickle.HIGHEST_PROTOCOL)))
        results.clear()
        if kind == "events":
            out.send(("taken", engine.next_seq))
        if time.monotonic() >= next_usage:
            next_usage = time.monotonic() + USAGE_EVERY
            over = usage.sample(engine, max_share)
            sets = [str(m.plan.name) for m in engine.set_queries.values()] if queries_changed else None
            queries_changed = False
            out.send(("sample", usage.report(), over, engine.stats.live_runs, sets))


def _register(engine: Engine, qid: int, pattern: Pattern, name: str, policy: str | None) -> str | None:
    try:
        engine.register(pattern, name, policy=policy, query_id=qid)
    except YfppError as e:
        return str(e)
    return None
