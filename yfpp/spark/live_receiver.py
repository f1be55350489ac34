"""The receiver of a live source (:mod:`yfpp.spark.live_sources`): a Spark job of one task that runs on an executor
for the stream's life, receives the feed and appends it to the spool (:mod:`yfpp.spark.live_spool`).

* **tcp://HOST:PORT** — connects to a producer and reads what it sends, one record per line. When
  ``$YFPP_FEED_KEY`` is set on the driver it first sends ``AUTH <key>`` and a newline (the line a feed
  connection to ``yfpp serve`` sends). A connection that closes or drops is connected again, after
  :data:`BACKOFF` seconds doubling up to :data:`MAX_BACKOFF` while it fails (a last line without its newline
  is a record); only the first connection's failure is an error. While the spool holds ``max_spool`` bytes
  Spark has not committed it stops reading (TCP's flow control holds the producer back).
* **mqtt://…** — subscribes with :class:`yfpp.input.mqtt.Subscriber` (acknowledging by hand); each message is
  appended (as a frame) as it comes; the task's loop then makes what came durable and publishes it at once
  (one fsync of the segment, one of the end, for all the messages that came during the former batch's — or
  paho's thread does, once :data:`ACK_MESSAGES` messages or :data:`ACK_BYTES` bytes wait), then acknowledges
  them to the broker, in order. A crash loses no message the broker had acknowledged; the broker sends again
  (a persistent session, QoS 1) the messages not acknowledged: those taken since the last publication and
  those published whose acknowledgements it had not read when the connection was lost — duplicates, at most the
  broker's window of unacknowledged messages (mosquitto's ``max_inflight_messages``, 20 by default) where it
  keeps to it. Mosquitto 2.0.0 to 2.0.12 does not for a backlog (each acknowledgement of the oldest message in
  flight sends up to a window more; fixed in 2.0.13): then the acknowledgements still unread in its socket are
  lost with the connection, hundreds on a loaded host. While the spool is full a message is dropped and
  counted, and acknowledged with its batch (the messages spooled before it published first); the count is
  spooled as one drop report (:data:`yfpp.spark.live_parse.DROPPED`) once
  there is room, ahead of any later message.

:class:`ReceiverJob` submits the task from a driver thread, in a job group of its own, and submits it again
(at most :data:`RESTARTS` times) when it fails — its executor died: the new receiver opens the spool at its
published end and connects again. It ends the task by the spool's ``stop`` file when the stream stops (and
cancels the job group if the task does not end in time): a stop file of its own (``stop-<job>``), so that
a receiver still ending does not stop the next one. One receiver at a time holds the spool's lock.
"""

from __future__ import annotations

import fcntl
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import suppress
from dataclasses import dataclass
from functools import partial
from typing import Any

from yfpp.errors import YfppError
from yfpp.input.mqtt import Broker, Subscriber, Topic, parse_url
from yfpp.spark.inputs import socket_address
from yfpp.spark.live_parse import DROPPED, frame
from yfpp.spark.live_spool import (
    ERROR,
    MARK_BYTES,
    SEGMENT_BYTES,
    STOP,
    Spool,
    line_marks,
    read_committed,
    whole_lines,
    write_atomically,
)
from yfpp.spark.source import CONNECT_TIMEOUT

log = logging.getLogger(__name__)

FEED_KEY_ENV = "YFPP_FEED_KEY"  #: the feed key a tcp:// source sends as its AUTH line
BACKOFF, MAX_BACKOFF = 0.2, 5.0  #: seconds before a TCP source connects again, doubling while it fails
READ_BYTES = 16 << 20  #: a TCP source's bytes appended at once, at most
FLUSH_SECONDS = 0.2  #: a TCP source appends what it read at least this often
POLL = 0.1  #: seconds between looks at the ``stop`` file and, while the spool is full, at ``committed.json``
#: The most a spool holds that Spark has not committed (option ``max_spool_bytes``, ``yfpp spark --max-spool``).
MAX_SPOOL_BYTES = 1 << 30
#: An MQTT receiver's task loop publishes and acknowledges what came as soon as it can (a batch: what came during
#: the former batch's fsyncs); paho's thread does it itself once this many messages or bytes wait.
ACK_MESSAGES, ACK_BYTES = 1000, 4 << 20
RESTARTS = 10  #: the times a failed receiver is started again in a stream's life before the stream fails
STOP_WAIT = 30.0  #: seconds the driver waits for a stopped receiver to end before cancelling its job


@dataclass(frozen=True)
class Feed:
    """What a receiver needs, made on the driver (secrets included: the executors need not have them)."""

    url: str
    folder: str
    segment_bytes: int = SEGMENT_BYTES
    max_spool: int = MAX_SPOOL_BYTES
    feed_key: str | None = None
    broker: Broker | None = None
    topic: Topic | None = None

    @classmethod
    def of(cls, url: str, folder: str, options: dict[str, str]) -> Feed:
        sizes = {"segment_bytes": int(options.get("segment_bytes", SEGMENT_BYTES)),
                 "max_spool": int(options.get("max_spool_bytes", MAX_SPOOL_BYTES))}
        if url.startswith("tcp://"):
            return cls(url, folder, feed_key=os.environ.get(FEED_KEY_ENV) or None, **sizes)
        broker, topic, opts = parse_url(url)
        return cls(url, folder, broker=broker, topic=Topic(topic, opts.get("format")), **sizes)


class _Receiver:
    """What the two receivers share: the spool, the cap."""

    def __init__(self, feed: Feed, spool: Spool):
        self.feed, self.spool = feed, spool
        self.committed = read_committed(feed.folder)

    def room(self, size: int) -> bool:
        """Does ``size`` more bytes fit under the cap? (``committed.json`` read again when not.)"""
        if self.spool.size - self.committed + size <= self.feed.max_spool:
            return True
        self.committed = read_committed(self.feed.folder)
        return self.spool.size - self.committed + size <= self.feed.max_spool

    def connect(self) -> None:
        """The first connection (its failure: YfppError)."""
        raise NotImplementedError

    def step(self) -> None:
        """Receive for a moment."""
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError


class TcpReceiver(_Receiver):
    """``tcp://HOST:PORT``: lines from a producer, appended as they come; connected again (bounded backoff)."""

    def __init__(self, feed: Feed, spool: Spool):
        super().__init__(feed, spool)
        address = socket_address(feed.url.removeprefix("tcp://").rstrip("/"))
        if address is None:
            raise YfppError(f"a TCP source is tcp://HOST:PORT, not {feed.url!r}")
        self.address = address
        self.sock: socket.socket | None = None
        self.connected = False  # once: later failures are retried
        self.backoff, self.retry_at = BACKOFF, 0.0
        self.pending = b""

    def connect(self) -> None:
        host, port = self.address
        try:
            self.sock = socket.create_connection(self.address, timeout=CONNECT_TIMEOUT)
        except OSError as e:
            if not self.connected:
                raise YfppError(f"cannot connect to {host}:{port}: {e.strerror or e}") from None
            self.retry_at = time.monotonic() + self.backoff
            self.backoff = min(2 * self.backoff, MAX_BACKOFF)
            return
        self.connected, self.backoff = True, BACKOFF
        if self.feed.feed_key:
            self.sock.sendall(f"AUTH {self.feed.feed_key}\n".encode())
        self.sock.settimeout(POLL)

    def step(self) -> None:
        if self.sock is None:
            if time.monotonic() < self.retry_at:
                time.sleep(POLL)
                return
            self.connect()
            if self.sock is None:
                return
        if not self.room(1):
            time.sleep(POLL)  # full: the producer waits (TCP's flow control)
            return
        room = min(READ_BYTES, self.feed.max_spool - (self.spool.size - self.committed))
        got, ended = bytearray(), False  # (a bytes += would copy all it holds at each chunk)
        until = time.monotonic() + FLUSH_SECONDS
        try:
            while not ended and len(got) < room and time.monotonic() < until:
                chunk = self.sock.recv(min(1 << 16, room - len(got)))
                ended = not chunk
                got += chunk
        except TimeoutError:
            pass
        except OSError:  # reset: what came before it is kept
            ended = True
        data = self.pending + bytes(got)
        cut, lines = whole_lines(data)
        if ended:
            self.sock.close()
            self.sock, self.retry_at = None, time.monotonic() + self.backoff
            if cut < len(data):  # the connection's last line, without its newline
                data, cut, lines = data + b"\n", len(data) + 1, lines + 1
        self.pending = data[cut:]
        if cut:
            self.spool.append(data[:cut], lines, self.committed, line_marks(data[:cut], MARK_BYTES))

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()


class MqttReceiver(_Receiver):
    """``mqtt://…/TOPIC``: messages appended as they come and acknowledged in batches — each batch made durable
    and published once (:meth:`flush`), then its messages acknowledged, in order — or dropped and counted while
    the spool is full."""

    def __init__(self, feed: Feed, spool: Spool):
        super().__init__(feed, spool)
        self.subscriber: Subscriber | None = None
        self.dropped = 0  # messages dropped since the last drop report was spooled
        self.unacked: list[tuple[int, int, int]] = []  # (mid, qos, connection) of messages taken since the last flush
        self.unflushed = 0  # bytes appended since the last flush
        self.guard = threading.Lock()  # paho's thread spools messages, the task's loop drop reports and flushes
        self.came = threading.Event()  # a message was taken since the task's loop last flushed

    def connect(self) -> None:
        broker, topic, take = self.feed.broker, self.feed.topic, self.take
        assert broker is not None and topic is not None

        class Spooling(Subscriber):
            def on_message(self, msg: Any) -> None:
                take(frame(msg.topic, msg.payload), (msg.mid, msg.qos, self.connects))

        self.subscriber = Spooling(broker, [topic], f"mqtt source {broker.address}", manual_ack=True)
        self.subscriber.start()

    def take(self, message: bytes | None, ack: tuple[int, int, int] | None = None) -> None:
        """Spool ``message`` (a frame; None: none, a pending drop report only) if the spool has room, else drop
        it and count it; ``ack``: its (mid, qos, connection), acknowledged once the batch it is in is published
        (a dropped message's too, with the batch it came in: the acknowledgements keep the messages' order, and a
        run of drops costs one flush a batch, as spooled messages do). The drops since the last report are spooled
        as one drop report once it fits, before any later message: drops are reported in stream order."""
        with self.guard:
            if self.dropped:
                report = frame(DROPPED, str(self.dropped).encode())
                if self.room(len(report)):
                    self.append(report)
                    self.dropped = 0
            if message is None:
                return
            if ack is not None:
                self.unacked.append(ack)
            if self.dropped or not self.room(len(message)):
                if not self.dropped:
                    log.warning("the MQTT spool is full (max_spool_bytes %d not yet committed): dropping messages "
                                "until Spark commits a micro-batch", self.feed.max_spool)
                self.dropped += 1
            else:
                self.append(message)
            if len(self.unacked) >= ACK_MESSAGES or self.unflushed >= ACK_BYTES:
                self.flush()
            self.came.set()

    def append(self, data: bytes) -> None:
        """Append one record, not yet durable (with :attr:`guard` held)."""
        with self.spool.lock:
            self.spool.write(data, 1, self.committed)
        self.unflushed += len(data)

    def flush(self) -> None:
        """Make what was appended durable and publish it (one fsync of the segment, one of the end), then
        acknowledge the messages taken before, in order (with :attr:`guard` held). A message taken on a former
        connection is not acknowledged: the broker sends it again (a persistent session), a duplicate."""
        with self.spool.lock:
            self.spool.sync()
        unacked, self.unacked, self.unflushed = self.unacked, [], 0
        if self.subscriber is not None:
            for mid, qos, connection in unacked:
                if connection == self.subscriber.connects:
                    self.subscriber.client.ack(mid, qos)

    def step(self) -> None:
        self.came.wait(POLL)
        self.came.clear()  # (a message taken after this is in this flush or wakes the next)
        self.take(None)
        with self.guard:
            if self.unacked or self.unflushed:
                self.flush()

    def close(self) -> None:
        """Publish and acknowledge what was taken, then disconnect."""
        if self.subscriber is not None:
            with self.guard:
                self.flush()
            self.subscriber.stop()


def receive(feed: Feed, stop: str = STOP, _: Iterator[Any] = iter(())) -> Iterator[Any]:
    """The receiver task: takes the spool's lock, opens the spool at its published end, connects and receives
    until the file ``stop`` appears in the spool folder (its job's). A first connection that fails is written
    to the ``error`` file (the planning half raises it) and ends the task. Yields nothing."""
    os.makedirs(feed.folder, exist_ok=True)
    stopped = partial(os.path.exists, os.path.join(feed.folder, stop))
    with open(os.path.join(feed.folder, "receiver.lock"), "a") as lock:
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:  # a receiver that has not ended yet (a duplicate task, a lost executor)
                if stopped():
                    return iter(())
                time.sleep(POLL)
        try:
            spool = Spool(feed.folder, feed.segment_bytes)
        except YfppError as e:
            write_atomically(os.path.join(feed.folder, ERROR), str(e))
            return iter(())
        receiver = (TcpReceiver if feed.url.startswith("tcp://") else MqttReceiver)(feed, spool)
        try:
            receiver.connect()
            while not stopped():
                receiver.step()
        except YfppError as e:
            write_atomically(os.path.join(feed.folder, ERROR), str(e))
        finally:
            receiver.close()
            spool.close()
    return iter(())


#: The receiver of each running live stream, by its ingest query's id.
RUNNING: dict[str, ReceiverJob] = {}


class ReceiverJob:
    """The receiver task of ``feed``, submitted from a driver thread in job group :attr:`group` (its stages are
    those ``--stats`` lists as ``receiver:``), again when it fails, until :meth:`stop`."""

    def __init__(self, spark: Any, feed: Feed):
        self.sc, self.feed = spark.sparkContext, feed
        token = uuid.uuid4().hex
        self.group, self.stop_file = f"yfpp live receiver {token}", os.path.join(feed.folder, f"{STOP}-{token}")
        self.stopping = threading.Event()
        os.makedirs(feed.folder, exist_ok=True)
        with suppress(FileNotFoundError):
            os.remove(os.path.join(feed.folder, ERROR))  # a former run's
        self.thread = threading.Thread(target=self._run, name="yfpp-live-receiver", daemon=True)

    def start(self, query: Any) -> None:
        """Start the receiver, and stop it when ``query`` (the ingest query) ends."""
        RUNNING[str(query.id)] = self
        self.thread.start()
        threading.Thread(target=self._watch, args=(query,), name="yfpp-live-watch", daemon=True).start()

    def _run(self) -> None:
        self.sc.setJobGroup(self.group, f"yfpp: live receiver of {self.feed.url}", interruptOnCancel=True)
        task, why = partial(receive, self.feed, os.path.basename(self.stop_file)), ""
        for attempt in range(RESTARTS + 1):
            if attempt:
                log.warning("the live receiver of %s failed (%s): started again", self.feed.url, why)
                time.sleep(min(BACKOFF * 2 ** (attempt - 1), MAX_BACKOFF))
            try:
                self.sc.parallelize([0], 1).mapPartitions(task).collect()
                return  # stopped, or the first connection failed (the error file says it)
            except Exception as e:  # its executor died, or the task failed
                if self.stopping.is_set():
                    return
                why = str(e).split("\n", 1)[0][:500]
        write_atomically(os.path.join(self.feed.folder, ERROR),
                         f"the receiver of {self.feed.url} failed {RESTARTS + 1} times; the last: {why}")

    def _watch(self, query: Any) -> None:
        try:
            while not self.stopping.is_set() and query.isActive:
                time.sleep(0.5)
        except Exception:  # (the JVM is gone: the process is ending, and the receiver with it)
            return
        self.stop()

    def stop(self) -> None:
        """End the receiver task (its stop file; its job group cancelled if it does not end in time)."""
        if self.thread.ident is None:  # never started
            return
        if not self.stopping.is_set():
            self.stopping.set()
            write_atomically(self.stop_file, "")
        self.thread.join(STOP_WAIT)
        if self.thread.is_alive():
            self.sc.cancelJobGroup(self.group)
            self.thread.join(STOP_WAIT)
        with suppress(FileNotFoundError):
            os.remove(self.stop_file)


def receiver_of(query: Any) -> ReceiverJob | None:
    """The receiver of ``query`` if it is a live stream's ingest query (None otherwise)."""
    return RUNNING.get(str(query.id))
