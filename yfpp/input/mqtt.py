"""Reading MQTT (paho-mqtt): broker URLs, topic filters with named levels, messages to events, and a
subscribing client — shared by ``yfpp serve``'s and ``yfpp run``'s feeds (:mod:`yfpp.service.mqtt`) and
``yfpp spark``'s live source (:mod:`yfpp.spark.live_sources`).

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
paho acknowledges a QoS 1 message when :meth:`Subscriber.on_message` returns.
"""

from __future__ import annotations

import dataclasses
import io
import logging
import os
import re
import ssl
import threading
from typing import Any
from urllib.parse import parse_qsl, unquote

import orjson

from yfpp.errors import InputError, YfppError
from yfpp.input.dead_letters import DeadLetters
from yfpp.input.events import Event
from yfpp.input.readers import read_events
from yfpp.input.record_fields import typed_value

log = logging.getLogger("yfpp.input.mqtt")

CONNECT_TIMEOUT = 10.0  #: seconds the first connection may take before the feed or sink gives up
RECONNECT_MIN, RECONNECT_MAX = 1, 60  #: backoff between reconnect attempts, seconds
PASSWORD_ENV = "YFPP_MQTT_PASSWORD"
_OPTIONS = ("qos", "format", "client_id", "clean", "ca", "cert", "key", "password_file")
LEVEL = re.compile(r"\{([A-Za-z_][\w.\-]*)\}")  #: a named level of a topic template, {name}


def paho() -> Any:
    """paho-mqtt's client module, or YfppError saying how to install it."""
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

    def client(self, name: str, manual_ack: bool = False) -> Any:
        """A paho client for this broker, not yet connected (``name``: what its log lines and errors say;
        ``manual_ack``: a QoS 1 message is acknowledged by ``client.ack(mid, qos)``, not when its callback returns)."""
        mod = paho()
        c = mod.Client(mod.CallbackAPIVersion.VERSION2, client_id=self.client_id, clean_session=self.clean,
                        protocol=mod.MQTTv311, manual_ack=manual_ack)
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
            if "{" in lv and not LEVEL.fullmatch(lv):
                raise YfppError(f"MQTT topic {self.template!r}: a named level is a whole level, {{name}}")
        if self.format not in (None, "xml", "jsonl"):
            raise YfppError(f"MQTT topic {self.template!r}: format must be xml or jsonl, got {self.format!r}")

    @property
    def filter(self) -> str:
        return LEVEL.sub("+", self.template)

    def attributes(self, topic: str) -> dict[str, Any] | None:
        """The named levels of ``topic`` if it is one of this filter's, else None."""
        got = topic.split("/")
        attrs: dict[str, Any] = {}
        for i, lv in enumerate(self.template.split("/")):
            if lv == "#":
                return attrs
            if i >= len(got):
                return None
            m = LEVEL.fullmatch(lv)
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


# --- the subscribing client ------------------------------------------------------------------


class Subscriber:
    """Subscribes ``topics`` at ``broker``; each message goes to :meth:`on_message` (on paho's thread; a
    QoS 1 message is acknowledged when it returns — or, ``manual_ack`` True, when ``self.client.ack(msg.mid,
    msg.qos)`` is called, from any thread, in the order the messages came).

    :meth:`start` returns once the broker has acknowledged the subscription, and raises YfppError when the
    first connection or the subscription fails (refused, unreachable, wrong password, a topic not allowed);
    later losses are reconnected with backoff, and the topics subscribed again (a persistent session,
    ``clean=0``, keeps them at the broker, which sends what came meanwhile)."""

    def __init__(self, broker: Broker, topics: list[Topic], name: str, manual_ack: bool = False):
        if not topics:
            raise YfppError(f"{name}: no topic to subscribe to")
        self.broker, self.topics, self.name = broker, topics, name
        self.connects = 0
        self.connected = False
        self.last_error: str | None = None
        self._first = threading.Event()
        self._refused: str | None = None
        self.client = broker.client(self.name, manual_ack)
        self.client.on_connect = self._on_connect
        self.client.on_connect_fail = self._on_connect_fail
        self.client.on_disconnect = self._on_disconnect
        self.client.on_subscribe = self._on_subscribe
        self.client.on_message = lambda client, userdata, msg: self.on_message(msg)

    def on_message(self, msg: Any) -> None:
        """One message (``msg.topic``, ``msg.payload``)."""
        raise NotImplementedError

    def spec(self, topic: str) -> Topic:
        """The subscribed :class:`Topic` a message's topic belongs to."""
        return next((t for t in self.topics if t.attributes(topic) is not None), self.topics[0])

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
        if flags.session_present:  # subscribed already: what the broker kept comes before the SUBACK, and
            self._first.set()      # on_message may wait for a consumer that start() is keeping

    def _on_subscribe(self, client: Any, userdata: Any, mid: Any, reasons: Any, properties: Any) -> None:
        """The broker's answer to the subscription: :meth:`start` returns once it came (or at once when the
        broker kept the session), so that a message published after it is delivered (one published before
        a new session's subscription is not)."""
        refused = [str(r) for r in reasons if r.is_failure]
        if refused:
            self.last_error = f"the broker refused the subscription: {', '.join(refused)}"
            log.error("MQTT subscription refused", extra={"feed": self.name, "error": self.last_error})
            if not self._first.is_set():
                self._refused = self.last_error
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
