"""MQTT in and out (paho-mqtt): a feed subscribing to topics, a sink publishing a subscription's results.

A broker is named by a URL, ``mqtt://[USER@]HOST[:PORT][/TOPIC][?OPTIONS]`` (``mqtts://`` for TLS; ports
1883 / 8883 by default). Options: ``qos`` (0 or 1), ``format`` (``xml`` or ``jsonl``; default: told from
each message), ``client_id``, ``clean`` (``0``: a persistent session, kept by the broker while the client
is away; needs ``client_id``), ``ca``, ``cert``, ``key`` (TLS files), ``password_file``. A password is never
part of the URL: it is read from ``password_file`` or ``$YFPP_MQTT_PASSWORD``.

A topic filter may name levels, ``sensors/{site}/{sensor}``: it subscribes to ``sensors/+/+`` and each
event of a message on ``sensors/north/t7`` gets ``site = "north"`` and ``sensor = "t7"`` (typed as the
readers type text; an attribute of the event's own wins).  A message holds one or many events: XML
elements, JSON lines, or a JSON array of objects; each is read by :mod:`yfpp.input.readers`, so a malformed one
is a dead letter at ``mqtt TOPIC message N line L`` and the feed goes on.

The client reconnects after a lost connection with backoff (1 s doubling to 60 s) and subscribes again.
A QoS 1 message is acknowledged once its events are handed to the engine.
"""

from __future__ import annotations

import asyncio
import dataclasses
import io
import logging
import os
import queue
import re
import ssl
import threading
import time
from typing import Any, Callable, Iterator
from urllib.parse import parse_qsl, unquote

import orjson

from yfpp.input.dead_letters import DeadLetters
from yfpp.errors import InputError, YfppError
from yfpp.input.events import Event
from yfpp.input.readers import read_events
from yfpp.input.record_fields import typed_value
from yfpp.service.feeds import FeedClosed
from yfpp.service.sink_policy import SinkPolicy
from yfpp.service.sinks import TaskSink, check_host

log = logging.getLogger("yfpp.service.mqtt")

CONNECT_TIMEOUT = 10.0  #: seconds the first connection may take before the feed or sink gives up
PUBLISH_TIMEOUT = 10.0  #: seconds a QoS 1 batch may wait for the broker's acknowledgements
RECONNECT_MIN, RECONNECT_MAX = 1, 60  #: backoff between reconnect attempts, seconds
PASSWORD_ENV = "YFPP_MQTT_PASSWORD"
_OPTIONS = ("qos", "format", "client_id", "clean", "ca", "cert", "key", "password_file")
_LEVEL = re.compile(r"\{([A-Za-z_][\w.\-]*)\}")


def _paho() -> Any:
    try:
        import paho.mqtt.client as paho
    except ImportError as e:
        raise YfppError(f"MQTT needs paho-mqtt: pip install -e '.[serve]' in yfpp's clone ({e})") from e
    return paho


@dataclasses.dataclass(frozen=True)
class Broker:
    """Where and how to connect: parsed from a URL by :func:`parse_url`."""

    host: str
    port: int
    tls: bool = False
    username: str | None = None
    password: str | None = dataclasses.field(default=None, repr=False)
    ca: str | None = None
    cert: str | None = None
    key: str | None = None
    client_id: str = ""
    clean: bool = True
    qos: int = 0

    @property
    def address(self) -> str:
        return f"{'mqtts' if self.tls else 'mqtt'}://{self.host}:{self.port}"

    def client(self, name: str) -> Any:
        """A paho client for this broker, not yet connected (``name``: what its log lines and errors say)."""
        paho = _paho()
        c = paho.Client(paho.CallbackAPIVersion.VERSION2, client_id=self.client_id, clean_session=self.clean,
                        protocol=paho.MQTTv311)
        if self.username is not None:
            c.username_pw_set(self.username, self.password)
        if self.tls:
            try:
                c.tls_set(ca_certs=self.ca, certfile=self.cert, keyfile=self.key, cert_reqs=ssl.CERT_REQUIRED)
            except (OSError, ssl.SSLError, ValueError) as e:
                raise YfppError(f"{name}: TLS files: {e}") from e
        c.reconnect_delay_set(RECONNECT_MIN, RECONNECT_MAX)
        return c


def parse_url(url: str, *, secrets: bool = True) -> tuple[Broker, str, dict[str, str]]:
    """(broker, topic — the URL's path, possibly empty —, the other options); YfppError saying what is wrong.

    ``secrets`` False (a sink named over the API): no password, TLS key or password file may be read."""
    scheme, sep, rest = url.partition("://")
    if scheme not in ("mqtt", "mqtts") or not sep:
        raise YfppError(f"an MQTT URL is mqtt://HOST[:PORT]/TOPIC or mqtts://…, got {url!r}")
    rest, _, query = rest.partition("?")
    netloc, _, topic = rest.partition("/")
    user, at, hostport = netloc.rpartition("@")
    if ":" in user:
        raise YfppError(f"{url!r}: give the password in ${PASSWORD_ENV} or password_file=PATH, not in the URL")
    host, colon, port_text = hostport.rpartition(":") if hostport.rpartition(":")[2].isdigit() else (hostport, "", "")
    host = host.strip("[]")
    if not host:
        raise YfppError(f"{url!r} names no broker host")
    port = int(port_text) if colon else (8883 if scheme == "mqtts" else 1883)
    if not 1 <= port <= 65535:
        raise YfppError(f"{url!r}: port must be 1-65535")
    opts = dict(parse_qsl(query, keep_blank_values=True))
    unknown = sorted(set(opts) - set(_OPTIONS))
    if unknown:
        raise YfppError(f"{url!r}: unknown option(s) {', '.join(unknown)}; known: {', '.join(_OPTIONS)}")
    if not secrets and {"key", "password_file"} & set(opts):
        raise YfppError(f"{url!r}: a sink cannot name a key or password file (the service's --mqtt broker's are used)")
    qos = opts.pop("qos", "0")
    if qos not in ("0", "1"):
        raise YfppError(f"{url!r}: qos must be 0 or 1, got {qos!r}")
    clean = opts.pop("clean", "1")
    if clean not in ("0", "1"):
        raise YfppError(f"{url!r}: clean must be 0 or 1, got {clean!r}")
    client_id = opts.pop("client_id", "")
    if clean == "0" and not client_id:
        raise YfppError(f"{url!r}: a persistent session (clean=0) needs client_id=NAME")
    fmt = opts.get("format")
    if fmt not in (None, "xml", "jsonl"):
        raise YfppError(f"{url!r}: format must be xml or jsonl, got {fmt!r}")
    password = None
    if secrets:
        path = opts.pop("password_file", None)
        if path is not None and not at:
            raise YfppError(f"{url!r}: password_file needs a user name: mqtt://USER@HOST…")
        if path is not None:
            try:
                with open(path, encoding="utf-8") as f:
                    password = f.readline().rstrip("\r\n")
            except OSError as e:
                raise YfppError(f"MQTT password file {path}: {e.strerror or e}") from e
        else:
            password = os.environ.get(PASSWORD_ENV)
    broker = Broker(host, port, scheme == "mqtts", unquote(user) if at else None, password if at else None,
                    opts.pop("ca", None), opts.pop("cert", None), opts.pop("key", None), client_id, clean == "1", int(qos))
    return broker, unquote(topic), opts


# --- topics ----------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Topic:
    """A subscription of a feed: ``template`` (``sensors/{site}/#``), its filter and the format of its messages."""

    template: str
    format: str | None = None

    def __post_init__(self) -> None:
        levels = self.template.split("/")
        if not self.template or any(("#" in lv and lv != "#") or ("+" in lv and lv != "+") for lv in levels) \
                or "#" in levels[:-1]:
            raise YfppError(f"MQTT topic filter {self.template!r}: '#' only as the last level, '+' and '#' only as whole levels")
        for lv in levels:
            if "{" in lv and not _LEVEL.fullmatch(lv):
                raise YfppError(f"MQTT topic {self.template!r}: a named level is a whole level, {{name}}")
        if self.format not in (None, "xml", "jsonl"):
            raise YfppError(f"MQTT topic {self.template!r}: format must be xml or jsonl, got {self.format!r}")

    @property
    def filter(self) -> str:
        return _LEVEL.sub("+", self.template)

    def attributes(self, topic: str) -> dict[str, Any] | None:
        """The named levels of ``topic`` if it is one of this filter's, else None."""
        got = topic.split("/")
        attrs: dict[str, Any] = {}
        for i, lv in enumerate(self.template.split("/")):
            if lv == "#":
                return attrs
            if i >= len(got):
                return None
            m = _LEVEL.fullmatch(lv)
            if m:
                attrs[m[1]] = typed_value(got[i])
            elif lv != "+" and lv != got[i]:
                return None
        return attrs if len(got) == len(self.template.split("/")) else None


def topic_of(spec: Any) -> Topic:
    """A :class:`Topic` from a config entry: ``"sensors/{site}/#"`` or ``{topic = "…", format = "xml"}``."""
    if isinstance(spec, str):
        return Topic(spec)
    if isinstance(spec, dict) and isinstance(spec.get("topic"), str) and set(spec) <= {"topic", "format"}:
        return Topic(spec["topic"], spec.get("format"))
    raise YfppError(f"an MQTT topic is a string or {{topic = \"…\", format = \"xml\"|\"jsonl\"}}, got {spec!r}")


# --- messages to events ----------------------------------------------------------------------


class _Positioned(DeadLetters):
    """Forwards a reader's dead letters with the message's position before the reader's own."""

    def __init__(self, where: str, out: DeadLetters):
        super().__init__(None)
        self.where, self.out = where, out

    def report(self, seq: int, position: str, reason: str, raw: str | None = None) -> None:
        super().report(seq, position, reason, raw)
        self.out.report(seq, f"{self.where} {position}", reason, raw)


def message_events(payload: bytes, topic: str, spec: Topic, number: int, dead_letters: DeadLetters,
                   read_opts: dict[str, Any], fmt: str | None = None) -> list[Event]:
    """The events of one message (its topic's named levels added); malformed records to ``dead_letters``."""
    where = f"mqtt {topic} message {number}"
    head = payload.lstrip(b"\xef\xbb\xbf \t\r\n")[:1]
    if not head:
        return []  # an empty message (a retained one being cleared) holds no event
    if head == b"[":  # a JSON array of events: one JSON line each
        try:
            items = orjson.loads(payload)
        except orjson.JSONDecodeError as e:
            dead_letters.report(-1, where, f"not a JSON array: {e}", payload[:500].decode("utf-8", "replace"))
            return []
        payload = b"\n".join(orjson.dumps(item) for item in items)
        fmt = "jsonl"
    fmt = spec.format or fmt or {b"<": "xml", b"{": "jsonl"}.get(head)
    if fmt is None:
        dead_letters.report(-1, where, "neither XML nor JSON: a message starts with '<', '{' or '['",
                            payload[:500].decode("utf-8", "replace"))
        return []
    dl = _Positioned(where, dead_letters)
    try:
        events = list(read_events(io.BytesIO(payload), fmt, dead_letters=dl, **read_opts))
    except InputError as e:  # a gzip message that is truncated
        dead_letters.report(-1, where, str(e), None)
        return []
    attrs = spec.attributes(topic)
    if attrs:
        for ev in events:
            for k, v in attrs.items():
                ev.attrs.setdefault(k, v)
    for ev in events:
        ev.seq = -1  # numbered by the engine, across all feeds
    return events


# --- the feed --------------------------------------------------------------------------------


class MqttFeed:
    """Subscribes ``topics`` at ``broker`` and hands each message's events to ``put`` (from paho's thread).

    :meth:`start` raises YfppError when the first connection fails (refused, unreachable, wrong password);
    later losses are reconnected with backoff, and the topics subscribed again."""

    def __init__(self, broker: Broker, topics: list[Topic], put: Callable[[list[Event]], None],
                 dead_letters: DeadLetters, read_opts: dict[str, Any], fmt: str | None = None):
        if not topics:
            raise YfppError(f"MQTT feed {broker.address}: no topic to subscribe to (--mqtt-topic)")
        self.broker, self.topics, self.put, self.dead_letters = broker, topics, put, dead_letters
        self.read_opts, self.fmt = read_opts, fmt
        self.name = f"mqtt feed {broker.address}"
        self.messages = 0
        self.events = 0
        self.dead = 0
        self.connects = 0
        self.connected = False
        self.last_error: str | None = None
        self._first = threading.Event()
        self._refused: str | None = None
        self._lock = threading.Lock()
        self.client = broker.client(self.name)
        self.client.on_connect = self._on_connect
        self.client.on_connect_fail = self._on_connect_fail
        self.client.on_disconnect = self._on_disconnect
        self.client.on_message = self._on_message

    def start(self, timeout: float | None = CONNECT_TIMEOUT) -> None:
        """Connect; ``timeout`` None: without waiting for the first connection (it is tried, with backoff,
        until it succeeds or the feed stops)."""
        try:
            self.client.connect_async(self.broker.host, self.broker.port, keepalive=30)
        except (OSError, ValueError) as e:
            raise YfppError(f"{self.name}: {e}") from e
        self.client.loop_start()
        if timeout is None:
            return
        if not self._first.wait(timeout) or self._refused is not None:
            self.stop()
            why = self._refused or f"no answer in {timeout:g} s"
            raise YfppError(f"{self.name}: cannot connect: {why}")

    def stop(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()

    def _on_connect(self, client: Any, userdata: Any, flags: Any, reason: Any, properties: Any) -> None:
        if reason.is_failure:
            self.last_error = str(reason)
            if not self._first.is_set():
                self._refused = f"the broker refused it: {reason}" + (
                    " (check the user name and password)" if reason.value in (4, 5, 134, 135) else "")
                self._first.set()
            log.error("MQTT connection refused", extra={"feed": self.name, "error": str(reason)})
            return
        self.connects += 1
        self.connected = True
        client.subscribe([(t.filter, self.broker.qos) for t in self.topics])
        if self.connects > 1:
            log.info("MQTT feed reconnected", extra={"feed": self.name, "session_present": flags.session_present})
        self._first.set()

    def _on_connect_fail(self, client: Any, userdata: Any) -> None:
        self.last_error = "connection failed"
        if not self._first.is_set():
            self._refused = f"connection to {self.broker.host}:{self.broker.port} failed"
            self._first.set()

    def _on_disconnect(self, client: Any, userdata: Any, flags: Any, reason: Any, properties: Any) -> None:
        if self.connected:
            self.connected = False
            if reason.is_failure:
                self.last_error = str(reason)
                log.warning("MQTT feed lost its connection: reconnecting", extra={"feed": self.name, "error": str(reason)})

    def _on_message(self, client: Any, userdata: Any, msg: Any) -> None:
        topic = msg.topic
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

    return _LEVEL.sub(value, template)


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
            raise ConnectionError(f"publish failed: {_paho().error_string(failed)}")
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
