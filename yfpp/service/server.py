"""The service process: one Engine in one thread, feeds funnelling into it, results routed to subscriptions.

Threads: the engine thread owns the Engine (every batch of events, ``advance_time``
and checkpoint holds ``engine_lock``; live register/unregister take the same
lock, in a worker thread); each feed reads in its own thread and hands events over through the
bounded ``inbox`` (a full inbox slows the feeds, never the sinks); the asyncio
loop runs the HTTP API and every subscription's sender task.  The engine
thread hands results to the loop as the engine makes them, :data:`CHUNK` at a
time, and waits while :data:`HANDED_OVER` wait for the loop, which queues them per
subscription (see :mod:`yfpp.service.sinks`), :data:`ROUTE_TURN` a turn of the loop.  That wait can come in the middle
of an event, holding ``engine_lock``: so the loop thread never takes
``engine_lock`` once the engine thread runs (only :meth:`Service.start`, before it).
"""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import io
import itertools
import logging
import queue
import signal
import socket
import ssl
import sys
import threading
import time
import types
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, NamedTuple

import uvicorn
from pydantic import ValidationError

from yfpp.state.checkpoint import EncodedPatterns, encode_pattern
from yfpp.state.memory_cap import RARE_COLLECTIONS
from yfpp.state.query_base import QueryBase
from yfpp.engine import Engine
from yfpp.errors import YfppError
from yfpp.input.events import Event
from yfpp.language.pattern import Pattern
from yfpp.language.query_text import QueryShapes, parse_written_query
from yfpp.service import auth, checkpoint, mqtt, quotas
from yfpp.service.accounting import Usage
from yfpp.service.config import ServiceConfig
from yfpp.service.counts_kept import CountsKept
from yfpp.service.batch import spec_of as batch_spec
from yfpp.service.errors import RequestError
from yfpp.service.health import HealthListener
from yfpp.service.child_delivery import COUNTED, Delivery, delivered_here
from yfpp.service.isolation import BACKLOG, FEEDBACK_STAYS, Isolation, Packed, Returns
from yfpp.service.isolation import state_path as isolation_state
from yfpp.service.feeds import FeedClosed, FeedLimits, SharedDeadLetters, SourceDeadLetters, TcpFeed, pump, start_input
from yfpp.service.mqtt_api import ApiFeeds
from yfpp.service.registry import Registry, RegistryError
from yfpp.service.sink_policy import SinkPolicy, SinkRefused
from yfpp.service.subscriptions import SUBSCRIPTION_ID, Subscription, SubscriptionSpec, Totals
from yfpp.service.worker_engines import WorkerEngines, load_kept

log = logging.getLogger("yfpp.service")

_STOP = object()
SWITCH_INTERVAL = 0.0005  #: seconds a thread holds the GIL while another waits for it (Python's default: 0.005)
STOP_WAIT = 30.0  #: seconds a stopping service waits for the engine thread to finish its inbox
STOP_DRAIN = 3.0  #: seconds a stopping engine thread goes on with its inbox; what is left then is discarded
CHECKPOINT_WAIT = 30.0  #: seconds a checkpoint waits for the loop to say what the sinks hold
INBOX = 64  #: batches (of up to feeds.BATCH events) waiting for the engine thread before feeds block
INGEST_THREADS = 4  #: POST /events bodies read at once (more wait their turn); apart from the loop's default pool
HANDED_OVER = 65_536  #: results from the engine thread not yet routed by the loop before the engine thread waits
RETIRE_WAIT = 0.8  #: seconds a DELETE waits for the engine thread to unregister the query (it answers anyway)
CHUNK = 1024  #: results the engine thread gathers before handing them to the loop (and at the end of each batch)
ROUTE_TURN = CHUNK  #: results the loop routes in one turn at least (more wait for its next turn: :meth:`Service._route_turn`)
USAGE_SHARE = 0.01  #: the engine thread's time that sampling each query's usage may take (sampled once a second at most)


class Service:
    """Everything ``yfpp serve`` runs; :meth:`bind` then (inside the loop) :meth:`start` / :meth:`stop`."""

    def __init__(self, config: ServiceConfig):
        self.config = config
        admin_key = config.admin_key or auth.admin_key(config.admin_key_file, {})
        if admin_key is None and not auth.is_loopback(config.host):
            raise YfppError(f"binding {config.host} (beyond loopback) needs authentication: give an admin key "
                            f"(admin_key_file, or ${auth.ADMIN_KEY_ENV})")
        if admin_key is not None and len(admin_key) < auth.MIN_ADMIN_KEY:
            raise YfppError(f"the admin key must have at least {auth.MIN_ADMIN_KEY} characters")
        try:
            self.sink_policy = SinkPolicy(config.file_sink_dir, config.sink_networks)
        except ValueError as e:
            raise YfppError(str(e)) from None
        state = Path(config.state) if config.state else None
        if state is not None:
            try:
                state.mkdir(mode=0o700, parents=True, exist_ok=True)  # (the checkpoint holds events: not for others)
            except OSError as e:
                raise YfppError(f"state directory {state}: {e.strerror or e}") from e
        self.checkpoint_path = state / "engine-checkpoint.json" if state else None
        #: where an earlier version kept the counters (now the registry keeps them with the queued results)
        self.counts_path = state / "counts.json" if state else None
        self.registry = Registry(str(state / "subscriptions.sqlite") if state else None)
        self.keys = auth.Keys(self.registry, admin_key)
        self.dead_letters = SharedDeadLetters(config.dead_letters or sys.stderr, config.dead_letters_per_second,
                                              config.dead_letters_max_bytes)
        self.read_opts = config.read_opts
        engine_opts = {"max_delay": config.max_delay, "dead_letters": self.dead_letters}
        self.patterns = EncodedPatterns()  #: the queries' patterns encoded for the checkpoints (once, not at each)
        #: the queries as the checkpoints' base holds them: a periodic checkpoint writes what changed since
        self.query_base = QueryBase(self.checkpoint_path) if self.checkpoint_path else None
        self._source_of: dict[str, tuple[SubscriptionSpec, int, list[Any]]] = {}  #: the sources taken, kept by spec
        self._subs_changed = 0  #: raised by each subscription added, changed or removed
        self._sources_taken: tuple[int, dict[str, list[Any]]] = (-1, {})  #: (_subs_changed, the sources) of the last take
        restored, self._sources = (checkpoint.load(self.checkpoint_path, self.patterns, self.query_base, **engine_opts)
                                   if self.checkpoint_path else (None, {}))
        self.engine: Engine = restored or Engine(**engine_opts)
        self.restored = restored is not None
        #: the isolation engines the checkpoint kept (query name -> (engine, qid)), adopted at the start
        self._isolated_kept = self._load_isolated(engine_opts) if state is not None else {}
        counts = self.registry.kept_counts()
        if counts is None:  # (none kept in the registry yet: those of the file an earlier version wrote, if any)
            counts = checkpoint.load_counts(self.counts_path) if self.counts_path else {}
        self._stored = (self.registry.all(), self.registry.kept_queued(), counts)  # what fails stops the start
        if restored is not None and restored.sources and not self._stored[0] and not config.registry_lost:
            raise YfppError(f"the subscription registry {self.registry.path} holds no subscription, but the checkpoint "
                            f"{self.checkpoint_path} holds {len(restored.sources)} queries: start with --registry-lost "
                            f"to drop them (and their partial matches), or put the registry back")
        self.engine_lock = threading.Lock()
        self.shapes = QueryShapes()  # subscriptions that differ only by constants: parsed once
        self.inbox: queue.Queue = queue.Queue(INBOX)
        # POST /events bodies, which wait while the inbox is full, are read here: never in the loop's default
        # pool, where they would hold up what subscription requests run there
        self.ingest = ThreadPoolExecutor(INGEST_THREADS, thread_name_prefix="ingest")
        self.subs: dict[str, Subscription] = {}
        self._owned: dict[str, dict[str, Subscription]] = {}  # each owner's subscriptions (quotas: no walk over all)
        self.by_name: dict[str, Subscription] = {}
        self.events_taken = 0  #: events given to the engine by this process
        self._events_before = self.engine.next_seq  # events the restored state had taken
        self.totals = Totals()  #: counts over every subscription held since the start (the metrics' totals)
        self.counts_kept = CountsKept()  #: the subscriptions whose counts a checkpoint stores again
        self.usage = Usage()  #: each query's runs and CPU, sampled by the engine thread
        #: the isolation engines' results to the loop
        self.returns = Returns(self._returned, lambda: self.loop, self._unwanted)
        self.isolation = Isolation(self.returns.put, self._isolation_failed, config.max_isolated,
                                   config.isolation_priority)
        kept = self._load_workers(engine_opts)  # (refuses a checkpoint of more workers; removes stale files)
        #: with ``workers`` > 1, the queries spread over that many engines (yfpp.service.worker_engines)
        self.workers = (WorkerEngines(config.workers, self.engine, kept, engine_opts, config.max_cpu_share,
                                      self.returns.put, self._worker_failed) if config.workers > 1 else None)
        #: what the subscriptions' queries are registered with: the engine, or the worker engines
        self.matching: Engine | WorkerEngines = self.workers or self.engine
        self.usage.elsewhere = self.isolation.usages
        self.usage.shares = self.workers.reports if self.workers else tuple
        self.rate = 0.0
        self.started_at = time.time()
        self.loop: asyncio.AbstractEventLoop | None = None
        self.http_socket: socket.socket | None = None
        self.feeds: list[TcpFeed] = []
        self.health_listener: HealthListener | None = None  #: /health on a port of its own (health_port)
        self.mqtt_feeds: list[mqtt.MqttFeed] = []  #: those of the configuration
        self.api_feeds = ApiFeeds(self.registry, self.sink_policy, self.put, self.dead_letters, self.read_opts)
        self._engine_thread: threading.Thread | None = None
        self.stopping = threading.Event()  #: set when shutdown begins: feeds and pull streams end
        self._last_ts = self.engine.latest_ts  # largest ts fed, and the wall time it came (for advance_idle)
        self._last_wall = time.monotonic()
        self._in_hand: Event | None = None  # the event the engine thread gives the engine now (_taken)
        self._advanced = float("-inf")
        self.failed: str | None = None  #: why the engine thread died (the service then stops, exit status 1)
        self.on_failure: Callable[[], None] = lambda: None  #: called on the loop when the engine thread dies
        self.checkpoint_errors = 0
        self.last_checkpoint_error: str | None = None  #: the last checkpoint's error, while checkpoints fail
        self._claimed: set[Any] = set()  # names (or tokens) of subscriptions being registered, or being unregistered
        self._retired: deque[tuple[int, str, asyncio.Future]] = deque()  # deleted subscriptions' (qid, name, done),
        # for the engine thread to unregister
        self._results: deque[list[dict]] = deque()  # result batches from the engine thread, not yet routed
        self._arrivals: deque[float | None] = deque()  # when the event of each batch in _results arrived
        self._arrived: float | None = None  # (engine thread) when the batch of events it works on arrived
        self._handed_over = 0  # results in _results
        self._room = threading.Condition()  # guards _results, _handed_over and _route_scheduled
        self._route_scheduled = False
        self._writer: threading.Thread | None = None  # the thread finishing the last checkpoint
        self._staged: checkpoint.Staged | None = None  # the last periodic checkpoint, while being written
        self._stop_by: float | None = None  # set at a stop: the engine thread discards what its inbox holds after it

    @property
    def events_in(self) -> int:
        """Events given to the engine since its state began (as ``dead_letters.count`` counts): the restored
        state's, then this process's; also the seq the next event gets."""
        return self._events_before + self.events_taken

    # --- lifecycle ---------------------------------------------------------------------

    def bind(self) -> None:
        """Open the HTTP and feed sockets (so a busy port is an error before anything starts)."""
        cfg = self.config
        try:
            self.http_socket = socket.create_server((cfg.host, cfg.port), reuse_port=False)
        except OSError as e:
            raise YfppError(f"cannot listen on {cfg.host}:{cfg.port}: {e.strerror or e}") from e
        for fmt, port in (("xml", cfg.xml_port), ("jsonl", cfg.jsonl_port)):
            if port is not None:
                self.feeds.append(TcpFeed(cfg.host, port, fmt, self.put, self.dead_letters, self.read_opts,
                                          FeedLimits(cfg.max_feed_connections, cfg.max_feed_connections_per_key,
                                                     cfg.feed_idle_timeout), self.keys, self._tls()))
        self.mqtt_feeds = mqtt.start_feeds(cfg.mqtt, cfg.mqtt_topics, self.put, self.dead_letters, self.read_opts)
        if cfg.health_port is not None:
            self.health_listener = HealthListener(cfg.host, cfg.health_port, self.health, self._tls())

    def _tls(self) -> ssl.SSLContext | None:
        """The TLS context of the feed ports and the health port: the API's certificate and key (None without)."""
        cfg = self.config
        if cfg.tls_cert is None or cfg.tls_key is None:
            return None
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        try:
            context.load_cert_chain(cfg.tls_cert, cfg.tls_key)
        except (OSError, ssl.SSLError) as e:
            raise YfppError(f"tls_cert / tls_key: {e.strerror or e}") from None
        return context

    @property
    def port(self) -> int:
        assert self.http_socket is not None
        return self.http_socket.getsockname()[1]

    def feed_port(self, fmt: str) -> int:
        return next(f.port for f in self.feeds if f.fmt == fmt)

    async def start(self) -> None:
        """Re-register stored subscriptions, then start the engine thread, the feeds and the senders."""
        self.loop = asyncio.get_running_loop()
        # The engine thread is CPU-bound; the loop thread releases the GIL at every socket call and
        # would wait up to the default 5 ms to get it back each time (thousands of sinks: seconds).
        sys.setswitchinterval(SWITCH_INTERVAL)
        self._reload()
        if self.workers is not None:
            try:
                self.workers.launch()
            except OSError as e:
                raise YfppError(f"cannot start the worker engines: {e.strerror or e}") from e
        self.keys.on_revoke.append(self.revoked)
        self._engine_thread = threading.Thread(target=self._run_engine, name="engine", daemon=True)
        self._engine_thread.start()
        for feed in self.feeds:
            feed.start()
        if self.health_listener is not None:
            self.health_listener.start()
        for path in self.config.inputs:
            start_input(path, self.config.input_format, self.put, self.dead_letters, self.read_opts)
        await asyncio.to_thread(self.api_feeds.start_stored)
        log.info("service started", extra={
            "http": f"{self.config.host}:{self.port}", "restored_checkpoint": self.restored,
            "feeds": {f.fmt: f.port for f in self.feeds}, "subscriptions": len(self.subs)})

    async def stop(self) -> None:
        """Stop feeds, let the engine thread finish its inbox, give senders a second, then checkpoint the engine
        with what they still hold for the next start, close."""
        self.stopping.set()
        for feed in [*self.feeds, *self.mqtt_feeds, self.api_feeds]:
            await asyncio.to_thread(feed.stop)
        self.ingest.shutdown(wait=False)  # (bodies still waiting are refused: put raises FeedClosed)
        if self._engine_thread is not None:
            await asyncio.to_thread(self._stop_engine_thread)
        if self._writer is not None:
            if self._final_checkpoint_due() and self._staged is not None:
                self._staged.cancel()  # (a periodic checkpoint still being written: the final one supersedes it)
            await asyncio.to_thread(self._writer.join)
        children = (self._children_checkpoint(self.checkpoint_path.parent)  # (the engine thread has stopped)
                    if self.checkpoint_path is not None and self.failed is None else [])
        await asyncio.to_thread(self.isolation.close)  # (each child after what it was sent)
        if self.workers is not None:
            await asyncio.to_thread(self.workers.close)
        self._route()  # the engine thread's last results
        self.returns.drain(float("inf"))  # (and the isolation engines')
        await self._drain(1.0)
        held = self._held(_delivering(children))  # (before the TCP sinks close: what their connections still buffer is kept too)
        for sub in list(self.subs.values()):
            await sub.stop()
        await asyncio.to_thread(self._final_checkpoint, held, children)
        self.registry.close()
        self.dead_letters.close()
        if self.health_listener is not None:
            await asyncio.to_thread(self.health_listener.stop)
        log.info("service stopped", extra={"events_in": self.events_in})

    def _stop_engine_thread(self) -> None:
        """Let the engine thread finish its inbox and checkpoint; give up after :data:`STOP_WAIT` seconds (an
        event it is stuck on: the process then ends without the final checkpoint, and says so)."""
        thread = self._engine_thread
        assert thread is not None
        if self.failed is not None:
            log.error("the engine thread had died: stopping without the final checkpoint", extra={"error": self.failed})
            return
        end = time.monotonic() + STOP_WAIT
        self._stop_by = time.monotonic() + STOP_DRAIN
        while thread.is_alive() and time.monotonic() < end:
            try:
                self.inbox.put(_STOP, timeout=0.5)
                break
            except queue.Full:
                continue
        thread.join(max(0.0, end - time.monotonic()))
        if thread.is_alive():
            log.error("the engine thread did not finish in time: stopping without the final checkpoint",
                      extra={"seconds": STOP_WAIT, "inbox": self.inbox.qsize()})

    def _held(self, also: list[str]) -> Held:
        """On the loop: the results the push sinks hold (being sent, or queued) by subscription, the counts
        (``""``: the totals) that go with them, and the isolation engines' counts they hold (by subscription
        and pid: :meth:`Subscription.tally`), of the subscriptions changed since the last checkpoint kept them
        (``also``: those of the isolation engines checkpointed with it), and the ids of those deleted since
        (``CountsKept.take``)."""
        queued: dict[str, list[dict]] = {}
        counts = {"": self.totals.counts()}
        applied = {}
        sids, gone = self.counts_kept.take(self.subs, also)
        for sid in sids:
            sub = self.subs[sid]
            counts[sid] = sub.counts()
            if sub.elsewhere:
                applied[sid] = dict(sub.elsewhere)
            if sub.outbox is not None:
                unsent = len(sub.outbox.unsent())  # (counted delivered, kept all the same: not delivered as kept)
                counts[sid]["delivered"] -= unsent
                counts[""]["delivered"] -= unsent
                if held := sub.outbox.held():
                    queued[sid] = held
                    self.counts_kept.held(sid)
        return Held(queued, counts, applied, gone)

    def _final_checkpoint(self, held: Held, children: list[tuple[Any, Path]]) -> None:
        """At the stop: store the results the push sinks still hold, to be queued again at the next start, and
        the counters; then checkpoint the engine (past those results: it will not produce them again), unless
        its thread died or did not finish."""
        taken = None
        if self._final_checkpoint_due() and self.checkpoint_path is not None:
            try:  # (written here: nothing else runs now)
                taken = checkpoint.take(self.engine, self.checkpoint_path, self._checkpoint_sources, self.patterns,
                                        self.query_base)
                taken.write()
            except Exception as e:
                self._checkpoint_failed(e)
                taken = None
        self._keep_queued(held)  # (the children stopped: what their sinks held was handed back, so is in it)
        if taken is not None:
            try:
                _commit_isolated(children, [iso.checkpointed(CHECKPOINT_WAIT) for iso, _ in children])
                taken.commit()
            except Exception as e:
                taken.discard()
                self._checkpoint_failed(e)
            else:
                self.last_checkpoint_error = None
                log.info("checkpoint written", extra={"path": str(self.checkpoint_path), "events_in": self.events_in})

    def _final_checkpoint_due(self) -> bool:
        """Whether the stop writes the final checkpoint: state is kept, the engine thread is done and did not die."""
        thread = self._engine_thread
        return (self.checkpoint_path is not None and self.failed is None
                and (thread is None or not thread.is_alive()))

    def _keep_queued(self, held: Held) -> None:
        """Store the results the push sinks still hold at the stop, and the counters (with no state kept: say
        what is lost)."""
        queued = held.queued
        n = sum(map(len, queued.values()))
        if self.checkpoint_path is None:
            log.warning("no state is kept (--no-state): discarded at the stop", extra={
                "queued_results": n, "subscriptions": len(self.subs), "partial_matches": self.engine.stats.live_runs})
            return
        try:
            self._keep(queued, held.counts, held.gone)
        except (RegistryError, OSError) as e:
            self.counts_kept.not_kept()
            if n:
                log.error("results still queued at the stop are lost", extra={"results": n, "error": str(e)})
            else:  # (those of the last stop, if any, stay: the next start queues them again)
                log.warning("the results kept at the last stop could not be cleared", extra={"error": str(e)})
            return
        if n:
            log.warning("results still queued at the stop are kept for the next start",
                        extra={"results": n, "subscriptions": len(queued)})

    def _keep(self, queued: dict[str, list[dict]], counts: dict[str, dict[str, int]], gone: list[str] | None) -> None:
        """Store what the push sinks hold and the counters (``Held``), in one registry transaction (RegistryError,
        OSError if it cannot): kept apart, a crash between the two writes restored the results of one checkpoint
        with the counts of another, and ``matches - delivered - dropped`` no longer matched what was queued."""
        self.registry.keep_queued(queued, counts, gone)
        if self.counts_path is not None:  # (an earlier version's file: superseded by what the registry now keeps)
            self.counts_path.unlink(missing_ok=True)

    async def _drain(self, seconds: float) -> None:
        """Wait up to ``seconds`` for the push destinations to empty their queues."""
        end = time.monotonic() + seconds
        while time.monotonic() < end and any(s.outbox and s.outbox.items for s in self.subs.values()):
            await asyncio.sleep(0.02)

    # --- subscriptions -----------------------------------------------------------------

    def _reload(self) -> None:
        """Subscriptions from the registry into the engine: the restored engine's query of the same name is
        kept (with its runs) when it is the same query, else replaced; one that no longer loads is logged; the
        restored queries of no subscription are dropped; the counters and the results kept are restored.

        A restored query registered from the same text as the stored subscription's (the checkpoint says) is
        kept without parsing that text again; the others are parsed, then registered in one hold of
        ``engine_lock``."""
        engine = self.matching
        restored = {**{plan.name: qid for qid, plan in engine.queries.items()},  # pattern and event-set queries
                    **{m.plan.name: qid for qid, m in engine.set_queries.items()}}
        sources = self._sources.get("queries") if self._sources.get("window_unit") == self.config.window_unit else None
        sources = sources if isinstance(sources, dict) else {}
        for name, qid in restored.items():  # (a query text left out: the one the restored query was registered from)
            source = sources.get(name)
            if isinstance(source, list) and source and source[0] is None:
                sources[name] = [engine.sources.text(qid), *source[1:]]  # (no pattern made: a third of a restart at 100k)
        stored, kept, counts = self._stored
        gc.disable()  # (a great many objects made that live on: collecting meanwhile doubles the time)
        try:
            subs, todo = [], []
            for sid, text, owner in stored:
                try:
                    if not (isinstance(sid, str) and SUBSCRIPTION_ID.fullmatch(sid)) or sid in self.subs:
                        raise YfppError(f"its id {sid!r} is not one the registry gives (s1, s2, …) or is taken")
                    spec = SubscriptionSpec.model_validate_json(text)
                    if spec.sink is not None:
                        self._check_sink(spec.sink)
                    name = spec.name or sid
                    if name in self._isolated_kept and name not in restored:
                        kept_engine, kept_qid = self._isolated_kept.pop(name)
                        pattern = parse_written_query(spec.query, spec.language, self.config.window_unit, self.shapes)
                        if self._same_query(kept_qid, pattern, spec.policy, kept_engine):
                            try:
                                self.isolation.adopt(kept_engine, kept_qid, self._delivery(sid, spec, False))
                            except OSError as e:  # (no process to be had: it starts afresh here)
                                log.error("cannot start an isolation engine", extra={"query_name": name, "error": str(e)})
                            else:
                                subs.append((sid, spec, kept_qid, owner))
                                continue
                    if name in restored and sources.get(name) == _source(spec):
                        subs.append((sid, spec, restored.pop(name), owner))
                        continue
                    pattern = parse_written_query(spec.query, spec.language, self.config.window_unit, self.shapes)
                    qid = restored.pop(name, None)
                    if qid is not None and not self._same_query(qid, pattern, spec.policy):
                        engine.unregister(qid)  # the name was deleted and taken again after the checkpoint
                        qid = None
                    if qid is not None:
                        subs.append((sid, spec, qid, owner))
                    else:
                        todo.append((sid, spec, pattern, owner))
                except (YfppError, ValidationError) as e:
                    log.error("stored subscription no longer registers", extra={"subscription": sid, "error": str(e)})
            qids = self._register_patterns([(self._engine_query(spec, pattern), spec.name or sid, spec.policy)
                                            for sid, spec, pattern, _ in todo])
            for (sid, spec, _, owner), qid in zip(todo, qids):
                if isinstance(qid, YfppError):
                    log.error("stored subscription no longer registers", extra={"subscription": sid, "error": str(qid)})
                else:
                    subs.append((sid, spec, qid, owner))
            if isinstance(counts.get(""), dict):
                self.totals.restore_counts(counts[""])
            order = {sid: i for i, (sid, *_) in enumerate(stored)}
            for sid, spec, qid, owner in sorted(subs, key=lambda x: order[x[0]]):
                sub = Subscription(sid, spec, qid, self.config.queue_size, self.totals, owner or auth.ADMIN,
                                   self.sink_policy, self.config.queue_bytes)
                self._attach(sub)
                self._hook(sub)
                if isinstance(counts.get(sid), dict):  # the results kept are counted in them
                    sub.restore_counts(counts[sid])
                    for result in kept.get(sid, ()):
                        sub.requeue(result)
                else:  # kept by a version that kept no counters: counted as matches of this run
                    for result in kept.get(sid, ()):
                        sub.deliver(result)
            for qid in restored.values():  # in the checkpoint but deleted since (or not loaded)
                engine.unregister(qid)
            self.isolation.follow(self.engine)  # (the feedback queries unregistered here, in the children too)
        finally:
            gc.enable()
        gc.freeze()  # (the queries live as long as the service: no collection need look at them again)
        if restored:
            log.warning("checkpointed queries of no subscription are dropped", extra={"queries": sorted(map(str, restored))})
        lost = sum(len(results) for sid, results in kept.items() if sid not in self.subs)
        if lost:
            log.warning("results kept for a subscription that is not there are dropped", extra={"results": lost})
        self._stored = ([], {}, {})
        self._sources = {}
        self._isolated_kept = {}
        if self.checkpoint_path is not None:  # (those of no isolation engine now: their queries started afresh)
            adopted = {isolation_state(self.checkpoint_path.parent, qid) for qid in self.isolation.by_qid}
            for path in self.checkpoint_path.parent.glob("isolated-q*.json"):
                if path not in adopted:
                    path.unlink(missing_ok=True)

    def _same_query(self, qid: int, pattern: Pattern, policy: str | None, engine: Engine | None = None) -> bool:
        """Whether the query ``qid`` of ``engine`` (default the service's) is ``pattern`` registered with ``policy``."""
        if policy is not None and policy != pattern.policy:
            pattern = dataclasses.replace(pattern, policy=policy)
        return encode_pattern((engine or self.matching).sources[qid][0]) == encode_pattern(pattern)

    def _load_isolated(self, engine_opts: dict[str, Any]) -> dict[str, tuple[Engine, int]]:
        """The isolation engines' checkpoints that go with the restored engine's (at its stream position): by
        query name, the engine and the query's id. The others (older, or of no checkpoint) are removed."""
        kept: dict[str, tuple[Engine, int]] = {}
        assert self.checkpoint_path is not None
        for path in sorted(self.checkpoint_path.parent.glob("isolated-q*.json")):
            try:
                engine, service = checkpoint.load(path, **engine_opts)
                name = service.get("isolated")
                qid = next((q for q, (_, _, n) in engine.sources.kept() if n == name), None) if engine else None
                if engine is not None and qid is not None and self.restored and engine.next_seq == self.engine.next_seq:
                    kept[name] = (engine, qid)
                    continue
            except (YfppError, OSError, ValueError) as e:
                log.error("an isolation engine's checkpoint does not load: its query starts afresh",
                          extra={"path": str(path), "error": str(e)})
            path.unlink(missing_ok=True)
        return kept

    def _register_patterns(self, items: list[tuple[str | Pattern, str, str | None]]) -> list[int | YfppError]:
        """``(query, name, policy)`` each registered (``query``: see :meth:`_engine_query`), in one hold of
        ``engine_lock``: its query id, or the engine's refusal. Each query registered as a Pattern is encoded for
        the checkpoints then, outside the lock; one registered as text is split around its constants."""
        out: list[int | YfppError] = []
        if self.workers is not None:
            out = self.workers.register_many(items, self.engine_lock)
        else:
            with self.engine_lock:
                for policy, group in itertools.groupby(items, key=lambda item: item[2]):  # (runs of one policy)
                    out += self.engine.register_many([(query, name) for query, name, _ in group], policy=policy)
                self.isolation.registered(self.engine, [qid for qid in out if isinstance(qid, int)])
        sources = self.engine.sources  # (not unregistered meanwhile: no subscription has these queries yet)
        for qid in out:
            if isinstance(qid, int) and qid in sources:  # (the main engine's: the others write their own)
                text = sources.text(qid)
                if text is None:
                    self.patterns.keep(qid, sources[qid][0])
                else:
                    self.patterns.keep_text(qid, text)
        return out

    def _engine_query(self, spec: SubscriptionSpec, pattern: Pattern) -> str | Pattern:
        """What the engine registers for a subscription whose query parsed to ``pattern``: the query's text when
        the engine reads that text as the service did (no language named, windows without a unit in seconds),
        so that the engine parses and compiles it by shape (``Engine.register_many``), and the checkpoint keeps
        it by shape, as its constants, which a restore registers again by shape; else (and with worker engines,
        which take patterns) ``pattern``."""
        if spec.language is None and self.config.window_unit == "s" and pattern.source and self.workers is None:
            return pattern.source
        return pattern

    def _attach(self, sub: Subscription) -> None:
        sub.usage = self.usage
        self.counts_kept.follow(sub)
        sub.start()
        self.subs[sub.id] = sub
        self._subs_changed += 1
        self._owned.setdefault(sub.owner, {})[sub.id] = sub
        self.by_name[sub.name] = sub

    def owned(self, owner: str, but: Subscription | None = None) -> list[Subscription]:
        """The subscriptions of the key ``owner`` (but ``but``)."""
        return [s for s in self._owned.get(owner, {}).values() if s is not but]

    def _check_sink(self, sink: str) -> None:
        """RequestError 403 (saying why) for a sink the server's policy does not allow (blocking: resolves)."""
        try:
            self.sink_policy.check(sink)
        except SinkRefused as e:
            raise RequestError(403, f"sink: {e}") from None

    async def subscribe(self, spec: SubscriptionSpec, owner: str = auth.ADMIN) -> Subscription:
        """Validate, check against the key ``owner``'s quotas and the sink policy, register on the running
        engine, persist; RequestError for what the client must fix."""
        (item,) = await self.subscribe_many([spec], owner)
        if isinstance(item, RequestError):
            raise item
        return item

    async def subscribe_many(self, specs: list[SubscriptionSpec | RequestError],
                             owner: str = auth.ADMIN) -> list[Subscription | RequestError]:
        """Each request in turn (one that is already a RequestError stays one): checked (the key ``owner``'s
        quotas counting those of the batch before it, the sink policy), parsed, stored in one registry
        transaction, registered in one hold of ``engine_lock``; per request, the subscription or why it was
        refused, so a bad one refuses only itself."""
        cfg = self.config
        out: list[Subscription | RequestError] = list(specs)
        claims: list[Any] = []
        try:
            todo: list[int] = []
            owned: list[Any] = self.owned(owner) if owner != auth.ADMIN else []  # (the admin has no quota)
            for i, spec in enumerate(specs):
                if isinstance(spec, RequestError):
                    continue
                if len(spec.query) > cfg.max_query_chars:
                    out[i] = RequestError(413, f"query is {len(spec.query)} characters; the limit is {cfg.max_query_chars}")
                    continue
                if len(self.subs) + len(self._claimed) >= cfg.max_subscriptions:
                    out[i] = RequestError(409, f"subscription limit reached ({cfg.max_subscriptions})")
                    continue
                try:
                    quotas.check(spec, owner, owned, cfg)
                except quotas.QuotaError as e:
                    out[i] = RequestError(e.status, str(e))
                    continue
                if spec.name is not None and (spec.name in self.by_name or spec.name in self._claimed):
                    out[i] = RequestError(409, f"a subscription named {spec.name!r} exists")
                else:
                    claim = spec.name or object()
                    self._claimed.add(claim)
                    claims.append(claim)
                    owned.append(types.SimpleNamespace(queue_size=spec.queue or cfg.queue_size,
                                                       queue_bytes=spec.queue_bytes or cfg.queue_bytes))
                    todo.append(i)
            added = await asyncio.to_thread(self._add_many, [specs[i] for i in todo], owner)  # (one thread hop)
            for i, item in zip(todo, added):
                if isinstance(item, RequestError):
                    out[i] = item
                else:
                    sid, qid, cost = item
                    sub = out[i] = Subscription(sid, specs[i], qid, cfg.queue_size, self.totals, owner, self.sink_policy,
                                                cfg.queue_bytes)
                    sub.cost = cost
                    self._attach(sub)
                    if quotas.isolated(sub.cost, cfg):
                        await asyncio.to_thread(self._isolate_new, sub)
        finally:
            for claim in claims:
                self._claimed.discard(claim)
        made = [s for s in out if isinstance(s, Subscription)]
        if len(made) > 1:
            gc.freeze()  # (what they made lives as long as they do: no collection need look at it again)
        if len(made) == 1:
            log.info("subscribed", extra={"subscription": made[0].id, "query_name": made[0].name, "sink": made[0].spec.sink})
        elif made:
            log.info("subscribed", extra={"subscriptions": len(made), "first": made[0].id, "last": made[-1].id})
        return out

    async def update(self, sid: str, changes: dict[str, Any], caller: auth.Principal = auth.OPEN) -> Subscription:
        """``PUT /subscriptions/{sid}``: the fields of ``changes`` replace the subscription's, in place (its id,
        counters and pull streams stay). A changed query, language, policy or name replaces its engine query:
        the old one's partial matches are dropped, the new one matches from the next event on; results already
        made stay queued (under the name they were made with). A changed sink gets what the old one held."""
        cfg = self.config
        sub = self.get(sid, caller)
        old = sub.spec
        item = batch_spec({**old.model_dump(), **changes})
        if isinstance(item, RequestError):
            raise item
        spec = item
        if len(spec.query) > cfg.max_query_chars:
            raise RequestError(413, f"query is {len(spec.query)} characters; the limit is {cfg.max_query_chars}")
        try:
            quotas.check(spec, sub.owner, self.owned(sub.owner, but=sub), cfg)
        except quotas.QuotaError as e:
            raise RequestError(e.status, str(e)) from None
        name = spec.name or sid
        if name != sub.name and (name in self.by_name or name in self._claimed):
            raise RequestError(409, f"a subscription named {name!r} exists")
        requery = _source(spec) != _source(old) or name != sub.name
        pattern = await asyncio.to_thread(self._admitted, spec, sub.owner) if requery or spec.sink != old.sink else None
        if isinstance(pattern, RequestError):
            raise pattern
        self._claimed.add(name)
        try:
            try:
                await asyncio.to_thread(self.registry.update, sid, spec.model_dump())
            except RegistryError as e:
                raise RequestError(503, f"cannot store the change; nothing was changed: {e}") from e
            qid = sub.qid
            if requery:
                query = self._engine_query(spec, pattern)  # type: ignore[arg-type]
                qid, refused = await asyncio.to_thread(self._replace_query, sub.qid, query, name, spec.policy)
                if refused is not None:
                    sub.qid = qid
                    self._subs_changed += 1
                    await asyncio.to_thread(self.registry.update, sid, old.model_dump())
                    raise RequestError(400, f"query: {refused}", **_error_position(refused))
                sub.cost = quotas.estimate(pattern)
        finally:
            self._claimed.discard(name)
        self.by_name.pop(sub.name, None)
        await sub.change(spec, qid, cfg.queue_size, cfg.queue_bytes)
        self._subs_changed += 1
        self.by_name[sub.name] = sub
        iso = self.isolation.by_qid.get(sub.qid)
        if not requery and iso is not None and iso.delivering:  # (its sink may have changed: the child's too)
            delivery = self._delivery(sid, spec, iso.delivery.want)  # type: ignore[union-attr]
            if delivery != iso.delivery:
                iso.tell("delivery", delivery)  # (None: it hands back what it held; the service delivers from now)
                iso.delivering = delivery is not None
                iso.delivery = delivery or iso.delivery
                self._hook(sub)
        if requery and sub.cost is not None and quotas.isolated(sub.cost, cfg):
            await asyncio.to_thread(self._isolate_new, sub)
        log.info("subscription changed", extra={"subscription": sid, "query_name": sub.name, "requery": requery})
        return sub

    def _replace_query(self, qid: int, query: str | Pattern, name: str,
                       policy: str | None) -> tuple[int, YfppError | None]:
        """In one hold of ``engine_lock``: query ``qid`` unregistered, ``query`` registered as ``name``: (its
        id, None); if the engine refuses it, the old query registered again (afresh): (its id, the refusal)."""
        if self.workers is not None:
            self.patterns.forget(qid)
            return self.workers.replace(qid, query, name, policy, self.engine_lock)
        with self.engine_lock:
            isolated = self.isolation.by_qid.get(qid)
            old, _, old_name = isolated.source if isolated is not None else self.engine.sources[qid]
            self._drop_query(qid)
            try:
                qid, refused = self.engine.register(query, name=name, policy=policy), None
            except YfppError as e:
                qid, refused = self.engine.register(old, name=old_name), e
            self.isolation.registered(self.engine, [qid])
            return qid, refused

    def _add_many(self, specs: list[SubscriptionSpec], owner: str) -> list[tuple[str, int, dict] | RequestError]:
        """(Blocking) Each request parsed and admitted (:meth:`_admitted`), those admitted stored in one registry
        transaction and registered in one hold of ``engine_lock``: per request, ``(id, query id, cost)`` or the
        RequestError that refuses it (one the engine refuses is removed from the registry again)."""
        out: list[tuple[str, int, dict] | RequestError] = [self._admitted(spec, owner) for spec in specs]
        ready = [i for i, p in enumerate(out) if not isinstance(p, RequestError)]
        if not ready:
            return out
        try:
            sids = self.registry.add_many([specs[i].model_dump() for i in ready], None if owner == auth.ADMIN else owner)
        except RegistryError as e:
            refusal = RequestError(503, f"cannot store the subscription; nothing was added: {e}")
            return [refusal if i in ready else p for i, p in enumerate(out)]
        patterns = [out[i] for i in ready]
        qids = self._register_patterns([(self._engine_query(specs[i], p), specs[i].name or sid,  # type: ignore[arg-type]
                                          specs[i].policy) for i, p, sid in zip(ready, patterns, sids)])
        refused = []
        for i, pattern, sid, qid in zip(ready, patterns, sids, qids):
            if isinstance(qid, YfppError):
                refused.append(sid)
                out[i] = RequestError(400, f"query: {qid}", **_error_position(qid))
            else:
                out[i] = (sid, qid, quotas.estimate(pattern))
        if refused:
            self._forget(refused)
        return out

    def _admitted(self, spec: SubscriptionSpec, owner: str) -> Pattern | RequestError:
        """(Blocking: resolves a sink's host.) The pattern of a request the sink policy and the key's cost quota
        allow, or the RequestError that refuses it."""
        try:
            if spec.sink is not None:
                self._check_sink(spec.sink)
            pattern = _parsed(spec, self.config.window_unit, self.shapes)
            if not isinstance(pattern, RequestError):
                cost = quotas.estimate(pattern)
                try:
                    quotas.check_cost(cost, owner, self.config)
                    quotas.check_isolable(pattern, cost, self.config)
                except quotas.QuotaError as e:
                    return RequestError(e.status, str(e), cost=cost)
            return pattern
        except RequestError as e:
            return e

    def _forget(self, sids: list[str]) -> None:
        """Remove subscriptions the engine refused from the registry (else a restart logs them as ones that no
        longer register)."""
        try:
            self.registry.remove_many(sids)
        except RegistryError as e:
            log.error("refused subscriptions stay in the registry", extra={"subscriptions": sids, "error": str(e)})

    async def unsubscribe(self, sid: str, caller: auth.Principal = auth.OPEN) -> None:
        """Remove a subscription: from the registry first, so that a failure leaves it wholly in place; then
        detached at once (its results are dropped from now on), and unregistered by the engine thread between
        two events (its name stays taken until then). The answer waits for that :data:`RETIRE_WAIT` seconds at
        most: never for an engine busy on one costly event."""
        self.get(sid, caller)
        try:
            await asyncio.to_thread(self.registry.remove, sid)
        except RegistryError as e:
            raise RequestError(503, f"cannot record the removal; the subscription stays: {e}") from e
        sub = self.subs.pop(sid, None)
        if sub is None:  # a concurrent DELETE removed it meanwhile
            return
        self._subs_changed += 1
        self.counts_kept.removed(sid)
        self._owned.get(sub.owner, {}).pop(sid, None)
        self.by_name.pop(sub.name, None)
        self._claimed.add(sub.name)
        done = asyncio.get_running_loop().create_future()
        self._retired.append((sub.qid, sub.name, done))
        try:
            self.inbox.put_nowait(None)  # (wakes an idle engine thread; a busy one comes to it after its event)
        except queue.Full:
            pass
        await sub.stop()
        await asyncio.wait([done], timeout=RETIRE_WAIT)
        gc.unfreeze()  # (what a batch froze may now be garbage in cycles: the collector looks at it again)
        log.info("unsubscribed", extra={"subscription": sid, "query_name": sub.name})

    def _retire_done(self, name: str, done: asyncio.Future) -> None:
        self._claimed.discard(name)
        if not done.done():
            done.set_result(None)

    def _offload(self, name: str, why: str) -> None:
        """(engine thread, holding ``engine_lock``) The query ``name`` costs more than it may (``why``): moved to
        an isolation engine while ``max_isolated`` allows, else (or if it runs in one already: a key quota counts
        it there too) its subscription suspended."""
        sub = self.by_name.get(name)
        if sub is None or sub.suspended is not None:
            return
        if sub.qid in self.isolation.by_qid or not self._isolate(sub):
            source = self.engine.sources.get(sub.qid)
            stays = f" ({FEEDBACK_STAYS})" if source is not None and source[0].feedback else ""
            self._suspend(name, f"suspended: {why}{stays}; delete it")

    def _isolate(self, sub: Subscription) -> bool:
        """(holding ``engine_lock``) Move ``sub``'s query to an isolation engine if there is room (max_isolated)."""
        if not self.isolation.can_take(self.engine, sub.qid):
            return False
        try:
            self.isolation.move(self.engine, sub.qid, self._delivery(sub.id, sub.spec, bool(sub.listeners)))
        except OSError as e:  # (no process to be had: it stays here)
            log.error("cannot start an isolation engine", extra={"query_name": sub.name, "error": str(e)})
            return False
        self._hook(sub)
        return True

    def _delivery(self, sid: str, spec: SubscriptionSpec, want: bool) -> Delivery | None:
        """What an isolation engine needs to deliver a subscription's results itself (None: the service
        delivers them, an MQTT sink's)."""
        if not delivered_here(spec.sink):
            return None
        cfg = self.config
        return Delivery(sid, spec.sink, spec.format, self.sink_policy, spec.queue or cfg.queue_size,
                        spec.queue_bytes or cfg.queue_bytes, spec.overflow, want)

    def _hook(self, sub: Subscription) -> None:
        """Whether ``sub`` has pull-stream readers told to its query's isolation engine as they come and go,
        if that delivers its results itself (and not otherwise)."""
        iso = self.isolation.by_qid.get(sub.qid)
        if iso is None or not iso.delivering:
            sub.on_listeners = None
            return
        sub.on_listeners = lambda want: iso.tell("want", want)
        iso.tell("want", bool(sub.listeners))  # (one that came while the child was made)

    def _isolate_new(self, sub: Subscription) -> None:
        """A new subscription whose estimated cost is over ``isolate_degree``: isolated from the start (if there
        is room; else it stays in the main engine)."""
        with self.engine_lock:
            if sub.qid in self.engine.sources:  # (not deleted meanwhile)
                self._isolate(sub)

    def _load_workers(self, engine_opts: dict[str, Any]) -> dict[int, Engine]:
        """The worker engines' checkpoints that go with the restored engine's (yfpp.service.worker_engines)."""
        if self.checkpoint_path is None:
            return {}
        written = self._sources.get("workers", 1) if self.restored else 1
        if type(written) is not int or written < 1:
            raise YfppError(f"corrupt checkpoint {self.checkpoint_path}: bad 'workers' entry {written!r}")
        return load_kept(self.checkpoint_path.parent, self.config.workers, written, self.engine, engine_opts)

    def _workers_over(self) -> list[str]:
        """(engine thread) The queries the worker engines found over ``max_cpu_share``."""
        return self.workers.over() if self.workers is not None else []

    def _children_checkpoint(self, directory: Path) -> list[tuple[Any, Path]]:
        """(holding ``engine_lock``, or with the engine thread stopped) Each child engine to write its state at
        this point of the stream: the children and their checkpoints' paths."""
        workers = self.workers.checkpoint(directory) if self.workers is not None else []
        return self.isolation.checkpoint(directory) + workers

    def _worker_failed(self, name: str, why: str) -> None:
        """(a worker engine's reader) Its child ended: the service has failed (as when its engine thread dies)."""
        self.failed = f"{name}: {why}"
        log.critical("a worker engine ended: the service stops", extra={"error": self.failed})
        if self.loop is not None and not self.loop.is_closed():
            self.loop.call_soon_threadsafe(self.on_failure)

    @property
    def live_runs(self) -> int:
        """Partial matches held by the engine (and the worker engines, as of their last samples)."""
        return self.engine.stats.live_runs + (self.workers.live_runs if self.workers is not None else 0)

    def _isolation_failed(self, name: str, why: str) -> None:
        """(an isolation engine's reader) Its child ended: its subscription is suspended, saying why."""
        with self.engine_lock:
            self._suspend(name, f"suspended: {why}; delete it")

    def _suspend(self, name: str, why: str) -> None:
        """(engine thread, holding ``engine_lock``) Suspend the subscription of query ``name``: its query is
        unregistered (its runs freed); it stays, ``suspended`` saying ``why``, until deleted."""
        sub = self.by_name.get(name)
        if sub is None or sub.suspended is not None:
            return
        sub.suspended = why
        self._drop_query(sub.qid)
        log.warning("subscription suspended", extra={"subscription": sub.id, "query_name": name,
                                                      "usage": self.usage.of(name)})

    def _drop_query(self, qid: int) -> None:
        """(engine thread, holding ``engine_lock``) Unregister ``qid`` (or stop its isolation engine) unless it
        is gone already (suspended)."""
        if self.workers is not None:  # (whichever share holds it: the shares' counts place the next queries)
            if qid in self.workers.share_of:
                self.workers.unregister(qid)
                self.patterns.forget(qid)
        elif qid in self.engine.queries or qid in self.engine.set_queries:
            self.engine.unregister(qid)
            self.patterns.forget(qid)
        self.isolation.drop(qid)

    def _unregister_retired(self) -> None:
        """(engine thread, holding ``engine_lock``) Unregister the deleted subscriptions' queries; free their names."""
        while self._retired:
            qid, name, done = self._retired.popleft()
            try:
                self._drop_query(qid)
            finally:
                try:
                    self.loop.call_soon_threadsafe(self._retire_done, name, done)  # type: ignore[union-attr]
                except RuntimeError:  # the loop has closed: nothing subscribes any more
                    pass

    def get(self, sid: str, caller: auth.Principal = auth.OPEN) -> Subscription:
        """Subscription ``sid`` if ``caller`` may see it: a subscriber sees only its own (another's is a 404,
        as one that does not exist: its existence is not told)."""
        sub = self.subs.get(sid)
        if sub is None or not (caller.admin or sub.owner == caller.key_id):
            raise RequestError(404, f"no subscription {sid!r}")
        return sub

    def visible(self, caller: auth.Principal) -> list[Subscription]:
        """The subscriptions ``caller`` sees: all for the admin, else its own."""
        return [s for s in self.subs.values() if caller.admin or s.owner == caller.key_id]

    def revoked(self, kid: str) -> None:
        """A key was revoked: its feed connections end now (its requests and streams fail from now on)."""
        for feed in self.feeds:
            feed.drop(kid)

    # --- events ------------------------------------------------------------------------

    def put(self, batch: list[Event]) -> None:
        """Hand events to the engine thread (blocks while the inbox is full; FeedClosed when stopping); the
        time they arrived goes with them (for each result's latency)."""
        arrived = time.monotonic()
        while True:
            if self.stopping.is_set() or self.failed is not None:
                raise FeedClosed()
            try:
                self.inbox.put((arrived, batch), timeout=0.5)
                return
            except queue.Full:
                continue

    def post_events(self, body: bytes, fmt: str) -> dict[str, int]:
        """A ``POST /events`` body: read it like a feed; say how many events and dead letters it held (a 503
        saying how many it took if the service stopped taking them; a 400 with the first reason if every
        record was a dead letter)."""
        dl = SourceDeadLetters("POST /events", self.dead_letters)
        n, bad, stopped = pump(io.BytesIO(body), fmt, dl.source, self.put, self.dead_letters, self.read_opts, dl)
        if stopped:
            raise RequestError(503, f"the service is stopping: it took the body's first {n} events, not the "
                                    f"others; send those again", events=n, dead_letters=bad)
        if n == 0 and bad:
            raise RequestError(400, f"no event in the body: its {bad} records were dead letters, the first: {dl.first}",
                               events=0, dead_letters=bad, first=dl.first)
        return {"events": n, "dead_letters": bad}

    def _run_engine(self) -> None:
        """The engine thread. Should it ever end but by a stop, the service has failed: ``/health`` says so
        and the process stops with exit status 1."""
        try:
            self._engine_loop()
        except BaseException as e:
            self.failed = f"{type(e).__name__}: {e}"
            log.critical("the engine thread died: the service stops", exc_info=True)
            if self.loop is not None and not self.loop.is_closed():
                self.loop.call_soon_threadsafe(self.on_failure)

    def _engine_loop(self) -> None:
        tick = min(self.config.advance_idle or 0.5, 0.5)
        next_checkpoint = time.monotonic() + self.config.checkpoint_every
        rate_t, rate_n = time.monotonic(), self.events_taken
        next_sample = rate_t + 1.0
        while True:
            try:
                item = self.inbox.get(timeout=tick)
            except queue.Empty:
                item = None
            stop = item is _STOP
            try:
                self._step(item)
            except Exception:  # a fault of one batch is that batch's: the service's only engine thread goes on
                log.exception("engine thread: a batch failed", extra={"events": len(item[1]) if isinstance(item, tuple) else 0})
            now = time.monotonic()
            if not stop and self._stop_by is not None and now > self._stop_by:
                self._discard_inbox()
                stop = True
            if now - rate_t >= 1.0:
                self.rate = (self.events_taken - rate_n) / (now - rate_t)
                rate_t, rate_n = now, self.events_taken
            if now >= next_sample:  # (a sample walks every query: with 100,000 of them, less often than each second)
                with self.engine_lock:
                    for name in self.usage.sample(self.engine, self.config.max_cpu_share) + self._workers_over():
                        self._offload(name, f"its query took more than {self.config.max_cpu_share:.0%} of the "
                                            f"engine's time (max_cpu_share) beside other subscriptions")
                    for name, why in quotas.over_keys(self.subs, self.usage, self.config):
                        self._offload(name, why)
                next_sample = now + max(1.0, (time.monotonic() - now) / USAGE_SHARE)
            if stop:
                return  # (the stop checkpoints, once the sinks have had their second: _final_checkpoint)
            if now >= next_checkpoint:
                self.save_checkpoint(wait=False)  # (the engine thread goes on meanwhile)
                next_checkpoint = now + self.config.checkpoint_every

    def _discard_inbox(self) -> None:
        """At a stop that took too long: what the inbox still holds is not processed (and so not in the
        final checkpoint: ``events_in`` says where a feeder resends from)."""
        n = 0
        while True:
            try:
                item = self.inbox.get_nowait()
            except queue.Empty:
                break
            n += len(item[1]) if isinstance(item, tuple) else 0
        if n:
            log.warning("events still waiting at the stop are discarded, not processed: send them again",
                        extra={"events": n, "seconds": STOP_DRAIN, "resend_from_seq": self.events_in})

    def _step(self, item: tuple[float, list[Event]] | None) -> None:
        """One batch of events, with its arrival time (or, for None, a quiet tick) through the engine; the results
        to the loop as they are made (an event that completes many matches hands them over while it runs,
        :data:`CHUNK` at a time)."""
        out = _Results(self._hand_over)
        with self.engine_lock:
            self._unregister_retired()
            if isinstance(item, tuple):
                self._arrived, events = item
                self._process(events, out)
                if self.workers is not None:
                    self.workers.feed(self._arrived, events)
                for iso in self.isolation.feed(self._arrived, events):
                    self._suspend(iso.name, f"suspended: its isolation engine fell more than {BACKLOG:,} events "
                                            f"behind; delete it")
            elif item is None:
                self._arrived = time.monotonic()  # (what the clock releases counts from now)
                self._advance_idle(out)
        out.hand_over()

    def _process(self, events: list[Event], out: _Results) -> None:
        """A batch through the engine in one ``process_batch``; an event the engine fails on is that record's
        problem (a dead letter; its matches so far are out), and the engine goes on with the next."""
        taken = self._taken(events)
        while True:
            try:
                self.engine.process_batch(taken, out)
                break
            except Exception as e:
                ev = self._in_hand
                log.exception("engine failed on an event", extra={"event": repr(ev)[:300]})
                self.dead_letters.report(ev.seq, f"seq {ev.seq}", f"engine error: {type(e).__name__}: {e}", repr(ev)[:500])
        self._last_wall = time.monotonic()

    def _taken(self, events: list[Event]) -> Iterator[Event]:
        """The events as the engine takes them: each to be numbered by the engine (across all feeds), counted,
        and kept as the one in hand (the one a fault of the engine is put down to)."""
        for ev in events:
            ev.seq = -1
            self.events_taken += 1
            if ev.ts > self._last_ts:
                self._last_ts = ev.ts
            self._in_hand = ev
            yield ev

    def _advance_idle(self, out: _Results) -> None:
        """With ``advance_idle``: once the feed was quiet that long, stream time follows the wall clock."""
        idle = self.config.advance_idle
        if idle is None or self._last_ts == float("-inf"):
            return
        quiet = time.monotonic() - self._last_wall
        if quiet < idle:
            return
        target = self._last_ts + quiet
        if target <= self._advanced:
            return
        self._advanced = target
        try:
            self.engine.advance_time(target, out)
            self.isolation.advance(target)
            if self.workers is not None:
                self.workers.advance(target)
        except Exception:
            log.exception("advance_time failed", extra={"ts": target})

    def _hand_over(self, results: list[dict]) -> None:
        """Engine thread: queue a batch for the loop, waking the loop only if it has no routing pending.

        While :data:`HANDED_OVER` results wait for the loop, the engine thread waits (a loop that
        falls behind slows the engine, and so the feeds, rather than holding results without bound);
        it may hold ``engine_lock`` meanwhile, which the loop never takes.
        (Each wake-up is a write to the loop's self-pipe, and every system call the engine
        thread makes gives the GIL away; a busy loop takes several batches in one turn.)
        """
        loop = self.loop
        assert loop is not None
        with self._room:
            while self._handed_over >= HANDED_OVER and not loop.is_closed():
                self._room.wait(0.5)
            if loop.is_closed():  # (the service stopped without this thread: nothing routes them any more)
                return
            self._results.append(results)
            self._arrivals.append(self._arrived)
            self._handed_over += len(results)
            wake, self._route_scheduled = not self._route_scheduled, True
        if wake:
            loop.call_soon_threadsafe(self._route_turn)

    def _route(self) -> None:
        """On the loop: every result handed over to its subscription (results of a just-deleted one are dropped)."""
        self._route_turn(everything=True)

    def _route_turn(self, everything: bool = False) -> None:
        """On the loop: the batches handed over, :data:`ROUTE_TURN` results of them at least (or ``everything``),
        to their subscriptions; the rest on the loop's next turn, so that requests are answered in between (each result is
        queued for every pull stream of its subscription: 65,536 of them to 20 streams held the loop a second)."""
        taken: list[tuple[list[dict], float | None]] = []
        n, most = 0, None if everything else ROUTE_TURN
        with self._room:  # a batch queued after this schedules another turn
            results, arrivals = self._results, self._arrivals
            while results and (most is None or n < most):
                taken.append((results.popleft(), arrivals.popleft()))
                n += len(taken[-1][0])
            self._handed_over -= n
            self._route_scheduled = more = bool(results)
            self._room.notify_all()
        for batch, arrived in taken:
            self._route_batch(batch, arrived)
        if more:
            asyncio.get_running_loop().call_soon(self._route_turn)

    def _route_batch(self, batch: Iterable[dict], arrived: float | None) -> None:
        """On the loop: results of one batch of events, which arrived at ``arrived``, to their subscriptions."""
        by_name = self.by_name
        for r in batch:
            sub = by_name.get(r["query"])
            if sub is not None:
                sub.deliver(r, arrived)

    def _returned(self, packed: Packed, arrived: float | None) -> None:
        """On the loop: what a child sent back (:class:`Packed`, by its ``kind``) to its subscription."""
        if packed.kind == "results":
            self._route_batch(packed, arrived)
            return
        sub = self.by_name.get(packed.query) if packed.kind == "listeners" else self.subs.get(packed.query)  # type: ignore[arg-type]
        if sub is None:
            return
        if packed.kind == "listeners":
            sub.to_listeners(list(packed), arrived)
        elif packed.kind == "held":
            sub.take_back(list(packed))
        else:
            sub.tally(packed.value())

    def _unwanted(self, name: str, n: int) -> bool:
        """(the loop) Whether ``n`` results of query ``name``, from its isolation engine, have no destination
        (counted then: :meth:`Subscription.discard`)."""
        sub = self.by_name.get(name)
        return sub is None or sub.discard(n)

    def save_checkpoint(self, wait: bool = True) -> bool:
        """Checkpoint the engine state as it is now (engine thread, or with the engine stopped): the state is
        taken as plain data (``checkpoint.take``, the only time the engine thread gives) while the loop says what
        the push sinks hold at this point; a thread of its own then writes the data, stores what the sinks held
        in the registry and moves the checkpoint into place. False if none was started (the previous one still
        being written, or no state kept); ``wait``: return once it is written."""
        if self.checkpoint_path is None:
            return False
        if self._writer is not None and self._writer.is_alive():
            if not wait:
                return False
            self._writer.join()
        loop = self.loop
        held: Future = Future()
        start = time.perf_counter()
        with self.engine_lock:
            try:
                taken = checkpoint.take(self.engine, self.checkpoint_path, self._checkpoint_sources, self.patterns,
                                        self.query_base)
            except Exception as e:  # (state the format cannot hold: the same as a failed write)
                self._checkpoint_failed(e)
                return False
            children = self._children_checkpoint(self.checkpoint_path.parent)
            if loop is not None and not loop.is_closed():
                loop.call_soon_threadsafe(self._hold, held, _delivering(children))  # (the results so far are handed over: _step)
            else:
                held.set_result(None)
        stall = time.perf_counter() - start  # (what the engine thread gave: taking the state)
        self._staged = taken
        self._writer = threading.Thread(target=self._finish_checkpoint,
                                        args=(taken, held, self.events_in, stall, children),
                                        name="checkpoint", daemon=True)
        self._writer.start()
        if wait:
            self._writer.join()
        return True

    def _checkpoint_sources(self) -> dict[str, Any]:
        """The checkpoint's ``service`` field (taken with the engine's state): what each query was registered from, its
        query text null where it is the text the engine's query was registered from, which the checkpoint
        holds already (with 100,000 subscriptions the texts again were 72 % of the file). A subscription's
        source is made once for its spec and query (the same object from checkpoint to checkpoint: the base
        holds it, ``yfpp.state.query_base``); with no subscription changed since the last take, its very map."""
        changed, (taken_at, queries) = self._subs_changed, self._sources_taken
        if taken_at == changed:
            return {"window_unit": self.config.window_unit, "workers": self.config.workers, "queries": queries}
        sources, kept = self.engine.sources, self._source_of
        queries = {}
        for sub in list(self.subs.values()):  # (the loop may add one meanwhile)
            was = kept.get(sub.name)
            if was is not None and was[0] is sub.spec and was[1] == sub.qid:
                queries[sub.name] = was[2]
                continue
            source = _source(sub.spec)
            if sub.qid in sources and sources.text(sub.qid) == source[0]:
                source[0] = None
            kept[sub.name] = (sub.spec, sub.qid, source)
            queries[sub.name] = source
        if len(kept) > len(queries):  # (those of subscriptions deleted)
            for name in [name for name in kept if name not in queries]:
                del kept[name]
        self._sources_taken = (changed, queries)
        return {"window_unit": self.config.window_unit, "workers": self.config.workers, "queries": queries}

    def _hold(self, held: Future, also: list[str]) -> None:
        """On the loop: route what the engine thread has handed over, then say what the sinks hold."""
        try:
            self._route()
            held.set_result(self._held(also))
        except BaseException as e:
            held.set_exception(e)

    def _finish_checkpoint(self, taken: checkpoint.Staged, held: Future, events_in: int, stall: float,
                           children: list[tuple[Any, Path]]) -> None:
        """The checkpoint's own thread: once it has written the state and the loop has said what the sinks
        hold, store that, then put the isolation engines' checkpoints and the checkpoint in place (so a crash
        between keeps results twice, never none)."""
        kept = False
        try:
            taken.write()
            state = held.result(CHECKPOINT_WAIT)
            errors = [iso.checkpointed(CHECKPOINT_WAIT) for iso, _ in children]
            if state is not None:
                self._keep(*_with_children(state, [iso for iso, _ in children]), state.gone)
            kept = True
            _commit_isolated(children, errors)
            taken.commit()
        except Exception as e:  # a full disk (OSError), state the format cannot hold, a loop that did not answer, a cancel at the stop
            if not kept:  # (what the loop took as kept was not: the next checkpoint stores every subscription's)
                self.counts_kept.not_kept()
            taken.discard()
            if taken.cancelled:
                log.info("checkpoint dropped at the stop: the final checkpoint supersedes it", extra={"events_in": events_in})
            else:
                self._checkpoint_failed(e)
            return
        self.last_checkpoint_error = None
        log.info("checkpoint written", extra={"path": str(self.checkpoint_path), "events_in": events_in,
                                              "engine_thread_s": round(stall, 4)})

    def _checkpoint_failed(self, e: Exception) -> None:
        self.checkpoint_errors += 1
        self.last_checkpoint_error = f"{type(e).__name__}: {e}"
        log.error("checkpoint failed", extra={"path": str(self.checkpoint_path), "error": self.last_checkpoint_error})

    @property
    def status(self) -> str:
        """``failed`` (the engine thread died), ``degraded`` (checkpoints or dead-letter writes failing), else ``ok``."""
        if self.failed is not None:
            return "failed"
        return "degraded" if self.last_checkpoint_error or self.dead_letters.failing else "ok"

    def health(self) -> dict[str, Any]:
        return {"status": self.status, "error": self.failed, "uptime_s": round(time.time() - self.started_at, 3), "events_in": self.events_in,
                "events_per_s": round(self.rate, 1), "dead_letters": self.dead_letters.count,
                "dead_letters_lost": self.dead_letters.lost,
                "dead_letters_suppressed": self.dead_letters.suppressed, "dead_letters_error": self.dead_letters.failing,
                "live_runs": self.live_runs, "subscriptions": len(self.subs),
                "inbox": self.inbox.qsize(), "isolated": self.isolation.info(),
                "workers": self.workers.info() if self.workers is not None else [], "feeds": {f.fmt: f.port for f in self.feeds},
                "mqtt": [f.info() for f in self.mqtt_feeds] + self.api_feeds.all(),
                "checkpoints": self.checkpoint_path is not None, "last_checkpoint_error": self.last_checkpoint_error}


class _Results:
    """The engine thread's ``out`` (``Engine.process_batch``, ``advance_time``): the matches as the engine makes
    them, handed to the loop :data:`CHUNK` at a time (fewer at :meth:`hand_over`); so at most
    ``HANDED_OVER + CHUNK`` wait for the loop, also when the engine gives one event's matches in one list (those
    of a pattern query)."""

    def __init__(self, hand_over: Callable[[list[dict]], None]):
        self._hand_over = hand_over
        self.items: list[dict] = []

    def extend(self, matches: list[dict]) -> None:
        items = self.items
        items += matches
        if len(items) >= CHUNK:
            self.items = []
            for i in range(0, len(items), CHUNK):
                self._hand_over(items[i:i + CHUNK] if len(items) > CHUNK else items)

    def hand_over(self) -> None:
        """What is gathered, to the loop."""
        if self.items:
            items, self.items = self.items, []
            self._hand_over(items)


class Held(NamedTuple):
    """What :meth:`Service._held` says the push sinks hold and the counts, for the registry (``Registry.keep_queued``)."""

    queued: dict[str, list[dict]]  #: the results the push sinks hold, by subscription
    counts: dict[str, dict[str, int]]  #: the counts of the subscriptions changed since the last kept (``""``: the totals)
    applied: dict[str, dict[int, dict]]  #: the isolation engines' counts they hold, by subscription and pid
    gone: list[str] | None  #: the subscriptions deleted since (None: ``counts`` holds every subscription's)


def _delivering(children: list[tuple[Any, Path]]) -> list[str]:
    """The subscriptions whose isolation engine, among ``children``, delivers its results itself."""
    return [iso.delivery.sid for iso, _ in children if iso.delivery is not None]


def _with_children(held: Held, children: list[Any]) -> tuple[dict, dict]:
    """What the push sinks hold and the counts (:meth:`Service._held`), with what each isolation engine
    delivering itself held at its checkpoint and its counts then (in place of those the loop had applied)."""
    queued, counts, applied = held.queued, held.counts, held.applied
    for iso in children:
        snapshot = iso.snapshot
        if snapshot is None or iso.delivery is None:
            continue
        sid, (theirs, held) = iso.delivery.sid, snapshot
        if sid not in counts:  # (deleted meanwhile)
            continue
        before = applied.get(sid, {}).get(theirs["pid"], {})
        for count in COUNTED:
            counts[sid][count] += theirs[count] - before.get(count, 0)
            counts[""][count] += theirs[count] - before.get(count, 0)
        if held:
            queued[sid] = [*queued.get(sid, ()), *held]
    return queued, counts


def _commit_isolated(children: list[tuple[Any, Path]], errors: list[str | None]) -> None:
    """Put the isolation engines' checkpoints in place, each once its child has written it (``errors``: each
    one's ``checkpointed``); one that did not (a child far behind, or ended) is logged and has none: its query
    starts afresh at the next start, the others' checkpoints are kept all the same."""
    for (iso, path), error in zip(children, errors):
        if error is None:
            checkpoint.Staged(None, path).commit()
            continue
        log.error("an isolation engine wrote no checkpoint: its query starts afresh at the next start",
                  extra={"query_name": iso.name, "error": error})
        checkpoint.Staged(None, path).discard()
        path.unlink(missing_ok=True)


def _source(spec: SubscriptionSpec) -> list[Any]:
    """What a subscription's query is registered from (with the service's window unit): the checkpoint keeps it
    for each query, so that a start knows the query it restores is this one without parsing it."""
    return [spec.query, spec.language, spec.policy]


def _parsed(spec: SubscriptionSpec, window_unit: str | None, shapes: QueryShapes) -> Pattern | RequestError:
    """The pattern of a subscription's query, or the 400 that refuses it."""
    try:
        return parse_written_query(spec.query, spec.language, window_unit, shapes)
    except YfppError as e:
        return RequestError(400, f"query: {e}", **_error_position(e))
    except (RecursionError, ValueError, OverflowError) as e:  # a parser limit, not the client's fault alone
        log.warning("query refused by a parser limit", extra={"error": repr(e)[:300]})
        return RequestError(400, f"query: cannot be parsed ({type(e).__name__})")


def _error_position(e: Exception) -> dict[str, Any]:
    """line, column, message (and what was expected) of a query error, for the JSON body."""
    line, column = getattr(e, "line", None), getattr(e, "column", None)
    first = str(e).split("\n", 1)[0]
    return {"line": line, "column": column,
            "message": getattr(e, "message", None) or first.removeprefix(f"line {line}, column {column}: "),
            "expected": getattr(e, "expected", None) or []}


# --- running it ------------------------------------------------------------------------------


class _Server(uvicorn.Server):
    """uvicorn's Server, made to stop cleanly on SIGTERM/SIGINT instead of re-raising the signal after shutdown,
    and to tell the service first (so feeds and pull streams end before uvicorn waits for connections)."""

    def __init__(self, config: uvicorn.Config, service: Service):
        super().__init__(config)
        self.service = service
        service.on_failure = self._stop

    def _stop(self) -> None:
        self.should_exit = True

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        self.service.stopping.set()
        await super().shutdown(sockets)

    @contextmanager
    def capture_signals(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        old = {sig: signal.signal(sig, self.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for sig, handler in old.items():
                signal.signal(sig, handler)


def make_server(service: Service) -> _Server:
    """The uvicorn server of ``service``'s app (bind first)."""
    from yfpp.service.app import create_app

    config = uvicorn.Config(create_app(service), log_config=None, access_log=False, lifespan="on",
                            log_level=service.config.log_level, timeout_graceful_shutdown=3,
                            ssl_certfile=service.config.tls_cert, ssl_keyfile=service.config.tls_key)
    return _Server(config, service)


def run(config: ServiceConfig) -> int:
    """``yfpp serve``: run until SIGTERM / SIGINT; 0 on a clean stop, 1 when it could not start or its engine
    thread died."""
    gc.set_threshold(*RARE_COLLECTIONS)  # (as yfpp run: 10-25 % of the CPU per event at 100,000 subscriptions)
    service = Service(config)
    service.bind()
    server = make_server(service)
    asyncio.run(server.serve(sockets=[service.http_socket]))
    return 0 if server.started and service.failed is None else 1


class BackgroundService:
    """A service on its own thread and loop (tests, benchmarks): ``with BackgroundService(cfg) as svc: …``."""

    def __init__(self, config: ServiceConfig, timeout: float = 10.0):
        self.service = Service(config)
        self.service.bind()
        self.server = make_server(self.service)
        self._thread = threading.Thread(target=lambda: asyncio.run(self.server.serve(sockets=[self.service.http_socket])),
                                        name="service", daemon=True)
        self._timeout = timeout

    @property
    def url(self) -> str:
        scheme = "https" if self.service.config.tls_cert else "http"
        return f"{scheme}://{self.service.config.host}:{self.service.port}"

    def __enter__(self) -> Service:
        self._thread.start()
        end = time.monotonic() + self._timeout
        while not self.server.started:
            if time.monotonic() > end or not self._thread.is_alive():
                raise RuntimeError("service did not start")
            time.sleep(0.01)
        return self.service

    def stop(self) -> None:
        self.server.should_exit = True
        self._thread.join(self._timeout)

    def __exit__(self, *exc: object) -> None:
        self.stop()
