"""Isolation engines (docs/service.md, "Isolation engines"): a heavy subscription's query moved out of the service's
engine into an engine of its own, in a child process, so that the main engine's latency no longer depends on it.

A move happens with the main engine quiet (``engine_lock`` held): the
service process forks; the child keeps, of the engine it inherits, the moved
query (with its runs, buffer and clock: nothing of its state is lost) and the
feedback queries (whose derived events it may read), and the parent
unregisters the moved query. A feedback query registered or unregistered in
the main engine later is registered or unregistered in every child too, at
the same point of its stream (:meth:`Isolation.registered`,
:meth:`Isolation.drop`), so the derived events the moved query reads are the
main engine's. A feedback query itself is never moved (:data:`FEEDBACK_STAYS`). From then on every batch of events the main
engine takes, and each ``advance_time``, goes to the child too, in the same
order: so the child numbers the events as the main engine does, and the
query's matches are exactly those it has alone. A child given its
subscription's :class:`~yfpp.service.child_delivery.Delivery` (a TCP, webhook
or file sink, or none) delivers its query's results itself and sends back only
its counts, once a second with its usage (``counts``), and the results
themselves only while the subscription has pull-stream readers (``listeners``);
what its sink held comes back at a checkpoint (:attr:`Isolated.snapshot`) and
at its stop (``held``). Any other child sends its results (only the moved
query's, :data:`RESULT_CHUNK` at a time, each chunk pickled by the child:
:class:`Packed`) and, once a second, its usage back; the service routes them
as its own, unpickling a chunk only when it has a destination (a chunk of a
subscription with no push sink and no pull stream is counted as made and
dropped, never unpickled).

Per child, two threads of the service: a sender (pickles what the engine
thread queued and writes it to the child: the engine thread never waits for
the child) and a reader (results to :class:`Returns`, which routes them on the
loop :data:`TURN` at a time, so that a burst of them never holds the loop
long: the main engine's results go between). A child
whose queue holds :data:`BACKLOG` events, or that ends, is reported to the
service (``failed``, or the engine thread's feed): its subscription is
suspended, saying why. The child runs at a
lower CPU priority than the service (``isolation_priority``: ``idle``, Linux's
SCHED_IDLE, by default, or a nice value: :func:`_lower_priority`).

Checkpoints: with the main engine's (engine_lock held), each child is sent a
``checkpoint`` message in its stream of events, so it writes its own state
(:func:`state_path`) at exactly the point of the stream the main checkpoint
holds; the service commits those files with the main one, and a start
restores each in a child again (:meth:`Isolation.adopt`) when its stream
position is the main checkpoint's.
"""

from __future__ import annotations

import logging
import os
import pickle
import queue
import tempfile
import threading
import time
from collections import deque
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, Callable

from yfpp.engine import Engine
from yfpp.input.dead_letters import DeadLetters
from yfpp.input.events import Event
from yfpp.service import checkpoint
from yfpp.service.child_delivery import ChildDelivery, Delivery

log = logging.getLogger("yfpp.service")

BACKLOG = 500_000  #: events queued for a child before its subscription is suspended as fallen behind
USAGE_EVERY = 1.0  #: seconds between a child's usage reports
STOP_WAIT = 3.0  #: seconds a stopped child has to finish what it was sent before it is killed
RESULT_CHUNK = 256  #: results a child sends at once (one message: unpickled holding the GIL)
TURN = 512  #: results from the children routed in one turn of the loop
HELD = 65_536  #: results from the children waiting for the loop before their readers wait

#: why a feedback query is not moved (it is suspended instead when it costs more than it may)
FEEDBACK_STAYS = ("a feedback query is not moved to an isolation engine: its derived events must enter the main "
                  "engine's stream right after the event that made them, which a child process cannot do (and "
                  "every isolation engine runs its own copy of it)")

Deliver = Callable[["Packed", "float | None"], None]  #: results (and when their event arrived) to the service
Unwanted = Callable[[str, int], bool]  #: (query name, n): whether n results of it have no destination (counted then)


class Packed:
    """A chunk of results as a child pickled them, of one ``query`` (an isolation engine's) or of several
    (``None``: a worker engine's): unpickled when iterated. ``kind``: ``results`` (to route), ``listeners``
    (to the pull streams only: a child delivering itself counted them), ``held`` (what a child's sink held
    at its stop, to queue again; ``query`` is then the subscription's id) or ``counts`` (a child's counts,
    one dict; by subscription id)."""

    __slots__ = ("query", "n", "_payload", "kind")

    def __init__(self, query: str | None, n: int, payload: bytes, kind: str = "results"):
        self.query, self.n, self._payload, self.kind = query, n, payload, kind

    def __len__(self) -> int:
        return self.n

    def __iter__(self) -> Any:
        return iter(self.value())

    def value(self) -> Any:
        """What the child pickled."""
        return pickle.loads(self._payload)
Failed = Callable[[str, str], None]  #: (query name, why) of an isolated query that no longer runs


class Returns:
    """The children's results, handed from their readers to the loop, where ``route`` takes them :data:`TURN`
    at a time (a reader waits while :data:`HELD` wait); a chunk ``unwanted`` says has no destination is not
    unpickled (``unwanted`` counts it)."""

    def __init__(self, route: Callable[[Packed, float | None], None], loop: Callable[[], Any],
                 unwanted: Unwanted = lambda query, n: False):
        self._route, self._loop, self._unwanted = route, loop, unwanted
        self._batches: deque[tuple[Packed, float | None]] = deque()
        self._held = 0
        self._room = threading.Condition()
        self._scheduled = False

    def put(self, results: Packed, arrived: float | None) -> None:
        """(a reader) Queue results for the loop."""
        loop = self._loop()
        if loop is None:
            return
        with self._room:
            while self._held >= HELD and not loop.is_closed():
                self._room.wait(0.5)
            if loop.is_closed():
                return
            self._batches.append((results, arrived))
            self._held += len(results)
            wake, self._scheduled = not self._scheduled, True
        if wake:
            loop.call_soon_threadsafe(self.drain)

    def drain(self, most: float = TURN) -> None:
        """(the loop) Route up to ``most`` results; another turn for the rest."""
        n = 0
        while n < most:
            with self._room:
                if not self._batches:
                    self._scheduled = False
                    return
                results, arrived = self._batches.popleft()
                self._held -= len(results)
                self._room.notify_all()
            if results.query is None or results.kind != "results" or not self._unwanted(results.query, len(results)):
                self._route(results, arrived)
            n += len(results)
        self._loop().call_soon(self.drain)


def pack(ev: Event) -> tuple:
    """An event as the child rebuilds it (its element as XML text when it was parsed already)."""
    el = ev._el
    if el is not None and type(el) not in (int, tuple):
        from lxml import etree

        el = etree.tostring(el)
    return ev.type, ev.ts, ev.attrs, ev._texts, el


def unpack(t: tuple) -> Event:
    """The event of :func:`pack` (numbered by the child's engine)."""
    kind, ts, attrs, texts, el = t
    if type(el) is bytes:
        from lxml import etree

        el = etree.fromstring(el, etree.XMLParser(resolve_entities=False, no_network=True, load_dtd=False))
    ev = Event(kind, ts, attrs)
    ev._texts, ev._el = texts, el
    return ev


class Isolated:
    """One query in a child process: what the service holds of it."""

    backlog = BACKLOG  #: events queued for the child before :meth:`feed` refuses more
    kind = "isolation engine"  #: what the child is called in what the service says of it

    def __init__(self, qid: int, name: str, source: tuple, pid: int, to_child: Connection, from_child: Connection,
                 deliver: Deliver, failed: Failed, delivery: Delivery | None = None):
        self.qid, self.name, self.source, self.pid = qid, name, source, pid
        self.delivery = delivery  #: the subscription's delivery when the child delivers its results itself
        self.delivering = delivery is not None  #: whether it still does (a sink it cannot reach: no more)
        self.snapshot: tuple[dict, list[dict]] | None = None  #: (delivering itself) its last checkpoint's counts, held
        self._counts: dict[str, Any] | None = None  # (delivering itself) its last counts
        self._to, self._from = to_child, from_child
        self._deliver, self._failed = deliver, failed
        self._queue: deque[tuple] = deque()  # messages for the child: ("events", arrived, packed) / ("advance", ts)
        self._queued = 0  # events in _queue
        self._wake = threading.Condition()
        self._stopping = False
        self.usage: dict[str, Any] = {"runs": 0, "runs_shed": 0, "buffered": 0, "cpu_s": 0.0, "engine": "isolated",
                                      "pid": pid}
        self._acks: queue.Queue[str | None] = queue.Queue()  # each checkpoint's error (None: written)
        self._sender = threading.Thread(target=self._send, name=f"isolated-{pid}-send", daemon=True)
        self._reader = threading.Thread(target=self._read, name=f"isolated-{pid}-read", daemon=True)
        self._sender.start()
        self._reader.start()

    def feed(self, arrived: float | None, packed: list[tuple]) -> bool:
        """(engine thread) Queue a batch for the child; False when it is :attr:`backlog` events behind."""
        with self._wake:
            if self._queued + len(packed) > self.backlog:
                return False
            self._queue.append(("events", arrived, packed))
            self._queued += len(packed)
            self._wake.notify()
        return True

    def tell(self, *msg: Any) -> None:
        """Queue a message for the child, after the events queued so far: ``("advance", ts)``, ``("register",
        qid, pattern, name)``, ``("unregister", qid)``; to one delivering itself ``("want", readers)``,
        ``("delivery", Delivery)``."""
        with self._wake:
            self._queue.append(msg)
            self._wake.notify()

    def checkpoint(self, path: Path) -> None:
        """(holding ``engine_lock``) Have the child write its state, once it has the events queued so far, to
        ``checkpoint.staged(path)`` (:meth:`checkpointed` says when)."""
        self.tell("checkpoint", str(checkpoint.staged(path)))

    def checkpointed(self, timeout: float) -> str | None:
        """Wait for the child's checkpoint (``timeout`` seconds at most; no longer once it has ended): None once
        written, else why not."""
        end = time.monotonic() + timeout
        while True:
            try:
                return self._acks.get(timeout=0.1)
            except queue.Empty:
                if not self._reader.is_alive() and self._acks.empty():
                    return f"its {self.kind} (pid {self.pid}) ended before it wrote its checkpoint"
                if time.monotonic() > end:
                    return f"its {self.kind} (pid {self.pid}) wrote no checkpoint within {timeout:g} s"

    def stop(self) -> None:
        """Tell the child to end once it has what was queued (the sender reaps it, or kills it after
        :data:`STOP_WAIT` seconds)."""
        self._stopping = True
        self.tell("stop")

    def join(self, timeout: float) -> None:
        self._sender.join(timeout)
        self._reader.join(timeout)

    def info(self) -> dict[str, Any]:
        return {"name": self.name, "pid": self.pid, "queued_events": self._queued, **self.usage}

    def took(self, msg: tuple) -> None:
        """(the reader) A message of the child's not handled here (a subclass's)."""

    def _send(self) -> None:
        try:
            while True:
                with self._wake:
                    while not self._queue:
                        self._wake.wait()
                    msg = self._queue.popleft()
                    if msg[0] == "events":
                        self._queued -= len(msg[2])
                        self._wake.notify_all()  # (a feed waiting for room: yfpp.service.worker_engines)
                self._to.send(msg)
                if msg[0] == "stop":
                    break
        except OSError as e:  # the child ended (the reader says so)
            log.debug("isolated query's child no longer reads", extra={"query_name": self.name, "error": str(e)})
        finally:
            self._to.close()
            self._reap()

    def _reap(self) -> None:
        """Wait for the child to end (killed after :data:`STOP_WAIT` seconds)."""
        end = time.monotonic() + STOP_WAIT
        try:
            while time.monotonic() < end:
                if os.waitpid(self.pid, os.WNOHANG)[0]:
                    return
                time.sleep(0.02)
            os.kill(self.pid, 9)
            os.waitpid(self.pid, 0)
        except (ProcessLookupError, ChildProcessError):  # (reaped already)
            pass

    def _read(self) -> None:
        why = f"its {self.kind} ended"
        try:
            while True:
                msg = self._from.recv()
                if msg[0] == "results":
                    self._deliver(Packed(msg[2], msg[3], msg[4]), msg[1])  # (Returns.put)
                elif msg[0] == "usage":
                    usage = dict(msg[1])
                    if "counts" in usage:
                        self._counted(usage.pop("counts"))
                    self.usage = {**usage, "engine": "isolated", "pid": self.pid}
                elif msg[0] == "checkpointed":
                    self.snapshot = msg[2] if len(msg) > 2 else None
                    self._acks.put(msg[1])
                elif msg[0] == "listeners":
                    self._deliver(Packed(msg[2], msg[3], msg[4], "listeners"), msg[1])
                elif msg[0] == "left":  # (delivering itself, at its stop)
                    self._counted(msg[1])
                    if msg[2]:
                        self._deliver(Packed(self.delivery.sid, msg[2], msg[3], "held"), None)  # type: ignore[union-attr]
                elif msg[0] == "error":
                    why = f"its {self.kind} failed: {msg[1]}"
                else:
                    self.took(msg)
        except (EOFError, OSError):
            pass
        finally:
            self._from.close()
        if not self._stopping:
            if self._counts is not None and self._counts["queued"]:  # (what it had queued is lost with it)
                counts = {**self._counts, "dropped": self._counts["dropped"] + self._counts["queued"], "queued": 0}
                self._counted({k: v for k, v in counts.items() if k != "latency"})
            self.stop()  # (the sender ends too)
            self._failed(self.name, why)

    def _counted(self, counts: dict[str, Any]) -> None:
        """(the reader) A child's counts, to the service (applied to its subscription on the loop)."""
        self._counts = counts
        self._deliver(Packed(self.delivery.sid, 0, pickle.dumps(counts), "counts"), None)  # type: ignore[union-attr]


class Isolation:
    """The service's isolated queries, by query id."""

    def __init__(self, deliver: Deliver, failed: Failed, most: int, priority: int | str = "idle"):
        self._deliver, self._failed = deliver, failed
        self.most = most  #: isolated queries at once at most (max_isolated)
        self.priority = priority  #: the children's (isolation_priority): a nice value, or "idle"
        self.by_qid: dict[int, Isolated] = {}
        self._feedback: set[int] = set()  # the feedback queries the children run (their ids, as the main engine's)

    def can_take(self, engine: Engine, qid: int) -> bool:
        """Whether query ``qid`` of ``engine`` may be moved (room left, fork available, not a feedback query)."""
        source = engine.sources.get(qid)
        return (hasattr(os, "fork") and len(self.by_qid) < self.most and source is not None
                and not source[0].feedback)

    def move(self, engine: Engine, qid: int, delivery: Delivery | None = None) -> Isolated:
        """(holding ``engine_lock``) Query ``qid`` out of ``engine`` into a child process of its own, delivering
        its results itself with a ``delivery`` (OSError if no process can be made: the query then stays)."""
        iso = self.adopt(engine, qid, delivery)
        engine.unregister(qid)
        log.warning("query moved to an isolation engine", extra={"query_name": iso.name, "pid": iso.pid})
        return iso

    def adopt(self, engine: Engine, qid: int, delivery: Delivery | None = None) -> Isolated:
        """Query ``qid`` of ``engine`` (the service's, or one restored from :func:`state_path`) run by a child
        process of its own, fed from now on, delivering its results itself with a ``delivery`` (OSError if no
        process can be made)."""
        source = engine.sources[qid]
        name = str(engine.queries[qid].name if qid in engine.queries else engine.set_queries[qid].plan.name)
        pid, to_child, from_child = fork_child(lambda inbox, out: _child(engine, qid, name, inbox, out, delivery),
                                               self.priority)
        self._feedback.update(engine.feedback.order.values())
        iso = self.by_qid[qid] = Isolated(qid, name, source, pid, to_child, from_child, self._deliver, self._failed,
                                          delivery)
        return iso

    def feed(self, arrived: float | None, events: list[Event] | tuple[Event, ...]) -> list[Isolated]:
        """(engine thread, after the main engine took ``events``) The batch to every child; those that are
        too far behind to take it."""
        if not self.by_qid:
            return []
        packed = [pack(ev) for ev in events]
        return [iso for iso in self.by_qid.values() if not iso.feed(arrived, packed)]

    def advance(self, ts: float) -> None:
        for iso in self.by_qid.values():
            iso.tell("advance", ts)

    def registered(self, engine: Engine, qids: list[int]) -> None:
        """(holding ``engine_lock``, the queries ``qids`` just registered in ``engine``) Each feedback query
        among them registered in every child too, at this point of their streams."""
        if not self.by_qid:
            return
        for qid in qids:
            pattern, _, name = engine.sources[qid]
            if pattern.feedback:
                self._feedback.add(qid)
                for iso in self.by_qid.values():
                    iso.tell("register", qid, pattern, name)

    def checkpoint(self, directory: Path) -> list[tuple[Isolated, Path]]:
        """(holding ``engine_lock``) Each child to write its state (:meth:`Isolated.checkpoint`): the children
        and the paths their checkpoints go to once committed."""
        out = []
        for iso in list(self.by_qid.values()):
            path = state_path(directory, iso.qid)
            iso.checkpoint(path)
            out.append((iso, path))
        return out

    def follow(self, engine: Engine) -> None:
        """(holding ``engine_lock``, or before the engine thread starts) Every feedback query the children run
        that ``engine`` no longer has (say one a start unregistered from its restored checkpoint) unregistered
        in them."""
        for qid in self._feedback - set(engine.feedback.order.values()):
            self.drop(qid)

    def drop(self, qid: int) -> None:
        """(holding ``engine_lock``, query ``qid`` unregistered from the main engine) Stop its child, if it has
        one; a feedback query is unregistered in every child, at this point of their streams."""
        iso = self.by_qid.pop(qid, None)
        if iso is not None:
            iso.stop()
        elif qid in self._feedback:
            self._feedback.discard(qid)
            for iso in self.by_qid.values():
                iso.tell("unregister", qid)

    def usages(self) -> dict[str, dict[str, Any]]:
        """The isolated queries' usage (their children's last reports), by query name."""
        return {iso.name: iso.usage for iso in list(self.by_qid.values())}

    def info(self) -> list[dict[str, Any]]:
        return [iso.info() for iso in list(self.by_qid.values())]  # (the loop reads; the engine thread moves)

    def close(self) -> None:
        """Stop every child, each after what it was sent (its results go on to the service meanwhile)."""
        isos = list(self.by_qid.values())
        self.by_qid.clear()
        for iso in isos:
            iso.stop()
        for iso in isos:
            iso.join(STOP_WAIT + 1)


def state_path(directory: Path, qid: int) -> Path:
    """Where the checkpoint of the isolation engine of query ``qid`` goes."""
    return directory / f"isolated-q{qid}.json"


def fork_child(
    run: Callable[[Connection, Connection], None], priority: int | str = 0
) -> tuple[int, Connection, Connection]:
    """A child process (of the service, forked: it has the parent's engines as they are) that runs ``run(inbox,
    out)``, then ends (a failure sent as ``("error", why)``), at ``priority`` (:func:`_lower_priority`; 0: the
    service's own): its pid and the parent's ends of the pipes to and from it (OSError if no process can be
    made)."""
    in_r, in_w = _pipe()
    out_r, out_w = _pipe()
    tempfile._get_candidate_names()  # type: ignore[attr-defined]  # (made before the fork: no lock to inherit)
    pid = os.fork()
    if pid == 0:  # the child
        code = 0
        try:
            _close_all_but({in_r.fileno(), out_w.fileno(), 0, 1, 2})
            if priority:
                _lower_priority(priority)
            run(in_r, out_w)
        except BaseException as e:
            code = 1
            try:
                out_w.send(("error", f"{type(e).__name__}: {e}"[:500]))
            except OSError:
                pass
        finally:
            os._exit(code)
    in_r.close()
    out_w.close()
    return pid, in_w, out_r


def _pipe() -> tuple[Connection, Connection]:
    r, w = os.pipe()
    return Connection(r, writable=False), Connection(w, readable=False)


def _lower_priority(priority: int | str) -> None:
    """(the child) Run at ``priority``: ``idle`` (SCHED_IDLE: only when no other process of the machine wants
    the CPU; nice 19 where there is none), else that much nicer than the service."""
    if priority == "idle":
        try:
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
            return
        except (AttributeError, OSError):
            priority = 19
    os.nice(int(priority))


def _close_all_but(keep: set[int]) -> None:
    """Close the inherited descriptors (the service's sockets among them) but ``keep``."""
    last = 3
    for fd in sorted(keep | {os.sysconf("SC_OPEN_MAX")}):
        if fd >= last:
            os.closerange(last, fd)
            last = fd + 1


def _child(engine: Engine, qid: int, name: str, inbox: Connection, out: Connection,
           delivery: Delivery | None = None) -> None:
    """The child: ``engine`` with only query ``qid`` (and the feedback queries) left, fed what the service sends;
    with a ``delivery``, it delivers the query's results itself (:class:`ChildDelivery`)."""
    for other, (first, _, _) in list(engine.sources.kept()):  # (a pattern or a plan: both say feedback)
        if other != qid and not first.feedback:
            engine.unregister(other)
    engine.dead_letters = engine.feedback.dead_letters = DeadLetters(os.devnull)  # the service reports them
    own = ChildDelivery(delivery) if delivery is not None else None
    results: list[dict] = []
    next_usage = time.monotonic()
    cpu0 = time.thread_time()
    while True:
        if own is not None and not inbox.poll(max(0.0, next_usage - time.monotonic())):
            msg: tuple = ("idle",)  # (its counts still go back once a second while no events come)
        else:
            msg = inbox.recv()
        if msg[0] == "stop" or (msg[0] == "delivery" and msg[1] is None and own is not None):
            if own is not None:  # (what its sink still holds, to the service: it delivers from now on)
                counts, held = own.close()
                out.send(("left", counts, len(held), pickle.dumps(held, pickle.HIGHEST_PROTOCOL)))
                own = None
            if msg[0] == "stop":
                return
            continue
        if msg[0] == "checkpoint":
            try:
                checkpoint.save(engine, Path(msg[1]), {"isolated": name})
                out.send(("checkpointed", None, own.snapshot() if own is not None else None))
            except Exception as e:  # (a full disk, state the format cannot hold: the service says so)
                out.send(("checkpointed", f"{type(e).__name__}: {e}"[:500]))
            continue
        if own is not None and msg[0] in ("want", "delivery"):
            if msg[0] == "want":
                own.want = msg[1]
            else:
                own.change(msg[1])
            continue
        # (as in the service's engine thread, one event's or one advance's failure is its own: the service's
        # engine fails on it too, and reports it)
        if msg[0] == "events":
            for t in msg[2]:
                try:
                    engine.process_batch((unpack(t),), results)
                except Exception:
                    pass
        elif msg[0] == "advance":
            try:
                engine.advance_time(msg[1], results)
            except Exception:
                pass
        elif msg[0] == "register" and msg[1] not in engine.sources:  # (a feedback query the service's engine took)
            engine.register(msg[2], msg[3], query_id=msg[1])
        elif msg[0] == "unregister":
            if msg[1] in engine.sources:
                engine.unregister(msg[1])
        mine = [r for r in results if r.get("query") == name]
        results.clear()
        arrived = msg[1] if msg[0] == "events" else None
        if own is not None and mine:
            own.offer(mine, arrived)
        if own is None or own.want:
            for i in range(0, len(mine), RESULT_CHUNK):
                chunk = mine[i:i + RESULT_CHUNK]
                out.send(("results" if own is None else "listeners", arrived, name, len(chunk),
                          pickle.dumps(chunk, pickle.HIGHEST_PROTOCOL)))
        if time.monotonic() >= next_usage:
            next_usage = time.monotonic() + USAGE_EVERY
            rt = engine.runtime
            usage = {"runs": engine.stats.live_runs, "runs_shed": rt.counters.shed_runs.get(name, 0),
                     "buffered": rt.buffer.size, "cpu_s": round(time.thread_time() - cpu0, 3)}
            out.send(("usage", {**usage, "counts": own.report()} if own is not None else usage))
