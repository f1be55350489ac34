"""MQTT in and out (paho-mqtt): a feed subscribing to topics, a sink publishing a subscription's results.

Broker URLs (``mqtt://[USER@]HOST[:PORT][/TOPIC][?OPTIONS]``), topic filters with named levels, messages
to events and the subscribing client (reconnecting with backoff) are :mod:`yfpp.input.mqtt`'s, shared with
``yfpp spark``: its docstring and docs/service.md say what each option does.
A QoS 1 message is acknowledged once its events are handed to the engine.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import queue
import re
import threading
import time
from typing import Any, Callable, Iterator
from urllib.parse import parse_qsl

from yfpp.errors import YfppError
from yfpp.input.dead_letters import DeadLetters
from yfpp.input.events import Event
from yfpp.input.mqtt import (
    CONNECT_TIMEOUT,
    LEVEL,
    PASSWORD_ENV,
    Broker,
    Subscriber,
    Topic,
    message_events,
    paho,
    parse_url,
    topic_of,
)
from yfpp.service.feeds import FeedClosed
from yfpp.service.sink_policy import SinkPolicy
from yfpp.service.sinks import TaskSink, check_host

log = logging.getLogger("yfpp.service.mqtt")

PUBLISH_TIMEOUT = 10.0  #: seconds a QoS 1 batch may wait for the broker's acknowledgements


# --- the feed --------------------------------------------------------------------------------


class MqttFeed(Subscriber):
    """Subscribes ``topics`` at ``broker`` and hands each message's events to ``put`` (from paho's thread).

    :meth:`start` raises YfppError when the first connection fails (refused, unreachable, wrong password);
    later losses are reconnected with backoff, and the topics subscribed again."""

    def __init__(self, broker: Broker, topics: list[Topic], put: Callable[[list[Event]], None],
                 dead_letters: DeadLetters, read_opts: dict[str, Any], fmt: str | None = None):
        if not topics:
            raise YfppError(f"MQTT feed {broker.address}: no topic to subscribe to (--mqtt-topic)")
        super().__init__(broker, topics, f"mqtt feed {broker.address}")
        self.put, self.dead_letters = put, dead_letters
        self.read_opts, self.fmt = read_opts, fmt
        self.messages = 0
        self.events = 0
        self.dead = 0
        self._lock = threading.Lock()

    def on_message(self, msg: Any) -> None:
        topic = msg.topic
        spec = self.spec(topic)
        spec = next((t for t in self.topics if t.attributes(topic) is not None), self.topics[0])
        with self._lock:
            self.messages += 1
            number = self.messages
        before = self.dead_letters.count
        events = message_events(msg.payload, topic, spec, number, self.dead_letters, self.read_opts, self.fmt)
        self.dead += self.dead_letters.count - before
        if events:
            try:
                self.put(events)  # blocks while the engine is behind (so does the broker's flow to us)
            except FeedClosed:  # the service is stopping: (a QoS 1 message may come again at the next start)
                return
            self.events += len(events)

    def info(self) -> dict[str, Any]:
        return {"name": self.name, "broker": self.broker.address, "topics": [t.template for t in self.topics],
                "qos": self.broker.qos, "connected": self.connected, "connects": self.connects,
                "messages": self.messages, "events": self.events, "dead_letters": self.dead,
                "last_error": self.last_error}


def start_feeds(url: str | None, topics: list[Any], put: Callable[[list[Event]], None], dead_letters: DeadLetters,
                read_opts: dict[str, Any]) -> list[MqttFeed]:
    """``yfpp serve --mqtt URL --mqtt-topic …``: the feed of the URL's topic and ``topics`` (none without a
    topic: the broker is then only the sinks'), connected; the broker's credentials become the sinks'."""
    if url is None:
        PUBLISHERS.configure(None)
        return []
    broker, topic, opts = parse_url(url)
    specs = [topic_of(t) for t in topics] + ([Topic(topic, opts.get("format"))] if topic else [])
    PUBLISHERS.configure(broker)
    if not specs:
        return []
    feed = MqttFeed(broker, specs, put, dead_letters, read_opts, opts.get("format"))
    feed.start()
    log.info("MQTT feed connected", extra={"feed": feed.name, "topics": [t.filter for t in specs]})
    return [feed]


def api_broker(url: str) -> tuple[Broker, str | None]:
    """The broker of a feed added over the API, and its URL's ``format``. The URL names no secret and no file
    of the server's but a CA (no password, ``password_file``, ``key`` or ``cert``) and no topic: the service's
    ``--mqtt`` broker (the same host and port, and user if the URL names one) lends its credentials and TLS
    files; another broker's user gets ``$YFPP_MQTT_PASSWORD``."""
    given, topic, opts = parse_url(url, secrets=False)
    if topic:
        raise YfppError(f"{url!r}: the topics of a feed are its 'topics', not part of the broker URL")
    if given.cert is not None:
        raise YfppError(f"{url!r}: a feed added over the API cannot name a client certificate (the service's "
                        f"--mqtt broker's is used for that broker)")
    known = PUBLISHERS.known.get((given.host, given.port))
    if known is not None and given.username in (None, known.username):
        broker = dataclasses.replace(known, client_id=given.client_id, clean=given.clean, qos=given.qos,
                                     ca=given.ca or known.ca)
    else:
        broker = dataclasses.replace(given, password=os.environ.get(PASSWORD_ENV) if given.username else None)
    return broker, opts.get("format")


def read_batches(url: str, read_opts: dict[str, Any], dead_letters: DeadLetters,
                 idle_stop: float | None = None, fmt: str | None = None) -> Iterator[list[Event]]:
    """``yfpp run -i mqtt://HOST/TOPIC``: each message's events as a batch, until Ctrl-C or, with
    ``idle_stop``, that many seconds without a message; ``fmt``, else the URL's ``format``, else told from
    each message. Connects at the first ``next``."""
    broker, topic, opts = parse_url(url)
    if not topic:
        raise YfppError(f"{url!r} names no topic: mqtt://HOST:PORT/TOPIC")
    inbox: queue.Queue[list[Event]] = queue.Queue(64)
    feed = MqttFeed(broker, [Topic(topic)], inbox.put, dead_letters, read_opts, fmt or opts.get("format"))
    feed.start()
    try:
        last = time.monotonic()
        while True:
            try:
                batch = inbox.get(timeout=0.2)
            except queue.Empty:
                if idle_stop is not None and time.monotonic() - last >= idle_stop:
                    return
                continue
            last = time.monotonic()
            yield batch
    finally:
        feed.stop()


# --- the sink --------------------------------------------------------------------------------


_UNSAFE = re.compile(r"[/+#\x00]")


def topic_for(template: str, result: dict) -> str:
    """``template`` with ``{name}`` filled from the result: ``query``, ``id``, another top-level field, else an
    attribute the query RETURNs; a value's ``/``, ``+``, ``#`` become ``_``, a missing one is ``_``."""
    emitted = (result.get("emit") or {}).get("attrs") or {}

    def value(m: re.Match) -> str:
        v = result.get(m[1], emitted.get(m[1]))
        return "_" if v is None or isinstance(v, (dict, list)) else _UNSAFE.sub("_", str(v)) or "_"

    return LEVEL.sub(value, template)


class Publisher:
    """One connection to a broker that the MQTT sinks naming it share (counted: closed with its last sink)."""

    def __init__(self, broker: Broker):
        self.broker = broker
        self.users = 0
        self.client = broker.client(f"mqtt sink {broker.address}")
        self.client.max_queued_messages_set(65536)
        self.last_error: str | None = None
        self.client.on_connect = self._on_connect
        self.client.on_connect_fail = lambda client, userdata: setattr(self, "last_error", "connection failed")
        self.client.connect_async(broker.host, broker.port, keepalive=30)
        self.client.loop_start()

    def _on_connect(self, client: Any, userdata: Any, flags: Any, reason: Any, properties: Any) -> None:
        self.last_error = f"the broker refused the connection: {reason}" if reason.is_failure else None

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


class Publishers:
    """The service's publishing connections, by broker; a sink's broker that is the service's ``--mqtt`` one
    uses its credentials and TLS files (a sink URL, which any subscriber may give, carries none)."""

    def __init__(self) -> None:
        self.known: dict[tuple[str, int], Broker] = {}
        self.open: dict[Broker, Publisher] = {}
        self._lock = threading.Lock()

    def configure(self, broker: Broker | None) -> None:
        self.known = {(broker.host, broker.port): broker} if broker is not None else {}

    def acquire(self, url: str, address: str | None = None) -> tuple[Publisher, str, int]:
        """(the connection, the topic template, the QoS) of a sink URL; ``address``: the one the sink policy
        checked for its host, connected to instead of the name (plain MQTT: TLS keeps the name it verifies)."""
        given, topic, _ = parse_url(url, secrets=False)
        known = self.known.get((given.host, given.port))
        broker = dataclasses.replace(
            known if known is not None else given, client_id="", clean=True, qos=given.qos,
            username=given.username if given.username is not None or known is None else known.username)
        if address is not None and not broker.tls:
            broker = dataclasses.replace(broker, host=address)
        with self._lock:
            pub = self.open.get(broker)
            if pub is None:
                pub = self.open[broker] = Publisher(broker)
            pub.users += 1
        return pub, topic, broker.qos

    def release(self, pub: Publisher) -> None:
        with self._lock:
            pub.users -= 1
            if pub.users > 0:
                return
            self.open.pop(pub.broker, None)
        pub.close()


PUBLISHERS = Publishers()


def check_sink_url(url: str) -> str:
    """The URL if it is an MQTT sink, else ValueError (for the subscription's validation)."""
    try:
        broker, topic, _ = parse_url(url, secrets=False)
        check_host(broker.host)
    except YfppError as e:
        raise ValueError(str(e)) from None
    if not topic or "+" in topic or "#" in topic:
        raise ValueError(f"an MQTT sink names the topic to publish to, without + or #: mqtt://HOST:PORT/TOPIC, got {url!r}")
    if set(dict(parse_qsl(url.partition("?")[2]))) - {"qos"}:
        raise ValueError(f"an MQTT sink takes only the option qos, got {url!r}")
    return url


class MqttSink(TaskSink):
    """``mqtt://HOST:PORT/TOPIC``: each result published (one JSON object or XML element per message) to the
    topic its template gives; a QoS 1 batch is delivered once the broker acknowledged all of it."""

    def __init__(self, url: str, encode: Callable[[dict], bytes], policy: SinkPolicy | None = None):
        super().__init__(url, encode, policy)
        self.pub: Publisher | None = None
        self.template, self.qos = "", 0

    async def send(self, batch: list[dict]) -> None:
        if self.pub is None:
            address = None
            if self.policy is not None:  # the broker's host checked again at connect time (no DNS rebinding)
                given, _, _ = parse_url(self.url, secrets=False)
                address = await self.policy.resolve(given.host, given.port)
            self.pub, self.template, self.qos = PUBLISHERS.acquire(self.url, address)
        client = self.pub.client
        end = time.monotonic() + CONNECT_TIMEOUT
        while not client.is_connected():  # (connecting, or reconnecting after a loss)
            if time.monotonic() > end:
                raise ConnectionError(f"not connected to the broker ({self.pub.last_error or 'no answer'})")
            await asyncio.sleep(0.01)
        infos = [client.publish(topic_for(self.template, r), self.encode(r).rstrip(b"\n"), self.qos) for r in batch]
        failed = next((i.rc for i in infos if i.rc != 0), None)
        if failed is not None:
            raise ConnectionError(f"publish failed: {paho().error_string(failed)}")
        if self.qos:
            end = time.monotonic() + PUBLISH_TIMEOUT
            while not all(i.is_published() for i in infos):
                if time.monotonic() > end:
                    raise TimeoutError(f"the broker did not acknowledge in {PUBLISH_TIMEOUT:g} s")
                await asyncio.sleep(0.005)

    async def reset(self) -> None:
        """The shared connection stays: it reconnects by itself."""

    async def stop(self) -> None:
        await super().stop()
        pub, self.pub = self.pub, None
        if pub is not None:
            await asyncio.to_thread(PUBLISHERS.release, pub)
