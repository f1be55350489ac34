"""``yfpp serve`` settings: defaults, a TOML file (``--config``) and command-line flags, in that order."""

from __future__ import annotations

import dataclasses
import tomllib
from pathlib import Path
from typing import Any

from yfpp.errors import YfppError
from yfpp.input.record_fields import reading_unit, unit_factors, window_unit

LOG_LEVELS = ("debug", "info", "warning", "error")


@dataclasses.dataclass
class ServiceConfig:
    """Every setting of the service; the TOML keys are these field names."""

    host: str = "127.0.0.1"  #: HTTP control API and TCP feeds bind here
    port: int = 8765  #: HTTP port (0: any free port)
    xml_port: int | None = None  #: TCP feed of XML elements (root-less, or a root that never closes)
    health_port: int | None = None  #: GET /health also on this port, answered by a thread of its own
    jsonl_port: int | None = None  #: TCP feed of JSON lines
    inputs: list[str] = dataclasses.field(default_factory=list)  #: files (or "-" for stdin) read once at start
    input_format: str | None = None  #: format of ``inputs`` (default: from the extension or content)
    ts_field: str = "ts"
    ts_unit: str = "s"  #: also the unit of a query window written without one
    ts_format: str = "number"  #: "iso": timestamps are ISO-8601 text (results' start and end stay in seconds)
    type_field: str | None = None  #: the event type is this JSON field / XML attribute (default: "type" / element name)
    max_delay: float = 0.0  #: reorder buffer that merges the feeds, in stream seconds
    advance_idle: float | None = None  #: after this many wall seconds without events, stream time follows the wall clock
    state: str | None = "yfpp-state"  #: directory of the SQLite registry and the checkpoint; None: nothing kept
    registry_lost: bool = False  #: start although the registry is empty or missing beside a checkpoint with queries
    checkpoint_every: float = 60.0  #: seconds between engine checkpoints (when the engine supports them)
    dead_letters: str | None = None  #: file of dead letters (JSON lines); default stderr
    admin_key_file: str | None = None  #: file whose first line is the admin key (else $YFPP_ADMIN_KEY); auth is on with one
    admin_key: str | None = None  #: the admin key itself (set from admin_key_file or the environment; never a flag)
    tls_cert: str | None = None  #: PEM certificate (chain): the HTTP API answers HTTPS, the TCP feed ports speak TLS
    tls_key: str | None = None  #: its private key
    file_sink_dir: str | None = None  #: file sinks only under this directory (None: no file sinks)
    sink_networks: list[str] = dataclasses.field(default_factory=lambda: ["127.0.0.0/8", "::1/128"])  #: where network sinks may connect
    max_subscriptions: int = 10_000
    max_query_chars: int = 65_536
    max_body_bytes: int = 16 * 1024 * 1024  #: POST /events body cap
    max_request_bytes: int = 1024 * 1024  #: body cap of every other request
    max_feed_connections: int = 64  #: concurrent TCP feed connections per port
    max_feed_connections_per_key: int = 8  #: of them, per feed key
    feed_idle_timeout: float = 300.0  #: seconds a feed connection may send nothing before it is closed
    queue_size: int = 10_000  #: default per-subscription sink queue (results)
    max_queue: int = 100_000  #: the largest ``queue`` a subscription may ask
    key_max_subscriptions: int = 1_000  #: subscriptions per subscriber key
    key_max_queue: int = 1_000_000  #: results queued per subscriber key, over its subscriptions' ``queue``
    queue_bytes: int = 64 * 1024 * 1024  #: default per-subscription sink queue in bytes (results as JSON lines)
    max_queue_bytes: int = 256 * 1024 * 1024  #: the largest ``queue_bytes`` a subscription may ask
    key_max_queue_bytes: int = 1024 * 1024 * 1024  #: bytes queued per subscriber key, over its subscriptions
    max_query_degree: int | None = None  #: refuse a subscriber's query whose runs may grow faster than events**this
    max_cpu_share: float | None = None  #: suspend (or isolate) a subscription taking more of the engine's CPU, beside others
    key_max_runs: int | None = None  #: live runs per subscriber key, over its subscriptions (sampled)
    key_max_buffered: int | None = None  #: buffered events per subscriber key, over its subscriptions (sampled)
    key_max_cpu_share: float | None = None  #: a subscriber key's subscriptions' share of the engine's time
    max_isolated: int = 0  #: queries moved to isolation engines (child processes) at most, rather than suspended
    isolate_degree: int | None = None  #: a query estimated to grow faster than events**this starts isolated
    #: the isolation engines' CPU priority: "idle" (Linux SCHED_IDLE: they run only on CPU no other process wants;
    #: docs/service.md, "Priorities") or a nice value 0-19 above the service's
    isolation_priority: int | str = "idle"
    workers: int | str = 1  #: engines the subscriptions' queries are spread over, each fed every event ("auto": one per core)
    dead_letters_per_second: float = 100.0  #: dead letters written per second at most (the others are counted)
    dead_letters_max_bytes: int = 64 * 1024 * 1024  #: a dead-letter file this big is rotated to FILE.1
    subscription_metrics: bool = True  #: GET /metrics has series per subscription (False: totals only)
    log_level: str = "info"
    mqtt: str | None = None  #: MQTT broker to subscribe to, mqtt(s)://[USER@]HOST[:PORT][/TOPIC][?OPTIONS] (yfpp.service.mqtt)
    mqtt_topics: list[Any] = dataclasses.field(default_factory=list)  #: topic filters ("sensors/{site}/#" or {topic, format})

    @property
    def read_opts(self) -> dict[str, Any]:
        """The readers' options for every feed."""
        return {"ts_field": self.ts_field, "ts_unit": reading_unit(self.ts_unit, self.ts_format),
                "type_field": self.type_field}

    @property
    def window_unit(self) -> str:
        """The unit of a query window written without one: the feeds' timestamp unit (seconds for ISO text)."""
        return window_unit(self.ts_unit, self.ts_format)

    @classmethod
    def load(cls, path: str | None, overrides: dict[str, Any]) -> "ServiceConfig":
        """Defaults, then the TOML file at ``path`` (if any), then ``overrides`` whose value is not None."""
        values: dict[str, Any] = {}
        if path:
            try:
                values = tomllib.loads(Path(path).read_text(encoding="utf-8"))
            except OSError as e:
                raise YfppError(f"config {path}: {e.strerror}") from e
            except tomllib.TOMLDecodeError as e:
                raise YfppError(f"config {path}: {e}") from e
        known = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - set(known))
        if unknown:
            raise YfppError(f"config {path}: unknown key(s) {', '.join(unknown)}; known: {', '.join(known)}")
        values.update({k: v for k, v in overrides.items() if v is not None})
        cfg = cls(**values)
        cfg.check()
        return cfg

    def _check_workers(self) -> None:
        """``workers`` as a count (``auto``: the cores available); isolation engines only with one."""
        from yfpp.workers.pool import worker_count

        if isinstance(self.workers, bool) or not isinstance(self.workers, (int, str)):
            raise YfppError(f"workers must be a number of engines or 'auto', got {self.workers!r}")
        self.workers = worker_count(str(self.workers))
        if self.workers > 1 and self.max_isolated:
            raise YfppError("max_isolated (isolation engines) and workers > 1 (worker engines) do not go together: "
                            "with workers, a heavy query is suspended (max_cpu_share), not isolated")

    def check(self) -> None:
        """Refuse values that would fail later, with the setting's name."""
        for name in ("port", "xml_port", "jsonl_port", "health_port"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, int) or not 0 <= v <= 65535):
                raise YfppError(f"{name} must be a port number 0-65535, got {v!r}")
        for name in ("max_subscriptions", "max_query_chars", "max_body_bytes", "max_request_bytes", "max_feed_connections",
                     "max_feed_connections_per_key", "queue_size", "max_queue", "key_max_subscriptions", "key_max_queue",
                     "queue_bytes", "max_queue_bytes", "key_max_queue_bytes",
                     "dead_letters_max_bytes"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise YfppError(f"{name} must be a positive integer, got {v!r}")
        if not (isinstance(self.max_delay, (int, float)) and self.max_delay >= 0):
            raise YfppError(f"max_delay must be a number >= 0, got {self.max_delay!r}")
        for name in ("advance_idle", "checkpoint_every", "feed_idle_timeout", "dead_letters_per_second"):
            v = getattr(self, name)
            if v is not None and not (isinstance(v, (int, float)) and v > 0):
                raise YfppError(f"{name} must be a number > 0, got {v!r}")
        if not (isinstance(self.inputs, list) and all(isinstance(path, str) for path in self.inputs)):
            raise YfppError("inputs must be a list of paths")
        for name in ("host", "ts_field", "ts_unit"):
            v = getattr(self, name)
            if not (isinstance(v, str) and v):
                raise YfppError(f"{name} must be a non-empty string, got {v!r}")
        if not isinstance(self.mqtt_topics, list) or (self.mqtt_topics and self.mqtt is None):
            raise YfppError("mqtt_topics must be a list of topic filters, and needs mqtt (the broker URL)")
        if not (isinstance(self.sink_networks, list) and all(isinstance(n, str) for n in self.sink_networks)):
            raise YfppError("sink_networks must be a list of networks (\"10.0.0.0/8\") or addresses")
        for name in ("state", "dead_letters", "admin_key_file", "admin_key", "tls_cert", "tls_key", "file_sink_dir",
                     "type_field", "mqtt"):
            v = getattr(self, name)
            if v is not None and not isinstance(v, str):
                raise YfppError(f"{name} must be a string, got {v!r}")
        if self.max_query_degree is not None and not (isinstance(self.max_query_degree, int) and self.max_query_degree >= 1):
            raise YfppError(f"max_query_degree must be a positive integer, got {self.max_query_degree!r}")
        if not (isinstance(self.max_isolated, int) and self.max_isolated >= 0):
            raise YfppError(f"max_isolated must be an integer >= 0, got {self.max_isolated!r}")
        self._check_workers()
        if self.isolate_degree is not None and not (isinstance(self.isolate_degree, int) and self.isolate_degree >= 1):
            raise YfppError(f"isolate_degree must be a positive integer, got {self.isolate_degree!r}")
        v = self.isolation_priority
        if v != "idle" and not (isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= 19):
            raise YfppError(f"isolation_priority must be a nice value 0-19 or \"idle\", got {v!r}")
        for name in ("key_max_runs", "key_max_buffered"):
            v = getattr(self, name)
            if v is not None and not (isinstance(v, int) and not isinstance(v, bool) and v >= 1):
                raise YfppError(f"{name} must be a positive integer, got {v!r}")
        for name in ("max_cpu_share", "key_max_cpu_share"):
            v = getattr(self, name)
            if v is not None and not (isinstance(v, (int, float)) and 0 < v <= 1):
                raise YfppError(f"{name} must be a number in (0, 1], got {v!r}")
        if (self.tls_cert is None) != (self.tls_key is None):
            raise YfppError("tls_cert and tls_key go together")
        if not isinstance(self.subscription_metrics, bool):
            raise YfppError(f"subscription_metrics must be true or false, got {self.subscription_metrics!r}")
        if self.type_field is not None and not self.type_field:
            raise YfppError("type_field must be a non-empty string")
        if self.ts_field == (self.type_field or "type") and (self.type_field or self.input_format != "xml"):
            raise YfppError(f"ts_field cannot be {self.ts_field!r}: that field is the event type")
        try:
            unit_factors(self.ts_unit)
        except ValueError as e:
            raise YfppError(str(e)) from None
        for name, allowed in (("input_format", ("xml", "jsonl")), ("log_level", LOG_LEVELS), ("ts_format", ("number", "iso"))):
            v = getattr(self, name)
            if v not in allowed and not (v is None and name == "input_format"):
                raise YfppError(f"{name} must be one of {', '.join(allowed)}, got {v!r}")
