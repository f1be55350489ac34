"""MQTT feeds added over the API, admin key only (docs/service.md): ``POST /feeds/mqtt``, ``GET /feeds/mqtt``,
``DELETE /feeds/mqtt/{id}``.

A feed names its broker by a URL that holds no secret (:func:`yfpp.service.mqtt.api_broker`: the password
comes from the server's environment or its ``--mqtt`` broker, never from the request) and its topics, each
with an optional format. The sink policy's networks (``sink_networks``) apply to the broker's host: it is
resolved and checked when the feed is added (and at each start), and a plain-MQTT feed connects to the very
address checked. The first connection must succeed for the feed to be added. Each feed is kept in the registry
(table ``mqtt_feeds``, made at the first) and started again at the next start, connecting in the background.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
from typing import Any, Callable, Literal

from fastapi import FastAPI
from fastapi.responses import Response
from pydantic import BaseModel, Field, ValidationError

from yfpp.errors import YfppError
from yfpp.input.dead_letters import DeadLetters
from yfpp.input.events import Event
from yfpp.service import mqtt
from yfpp.service.errors import RequestError
from yfpp.service.registry import Registry, RegistryError
from yfpp.service.sink_policy import SinkPolicy, SinkRefused

log = logging.getLogger("yfpp.service.mqtt")

MAX_FEEDS = 100  #: MQTT feeds that may be added over the API
MAX_TOPICS = 100  #: topics of one feed


class TopicSpec(BaseModel):
    """A topic filter with the format of its messages."""

    model_config = {"extra": "forbid"}

    topic: str = Field(min_length=1, max_length=1000, description="filter; {name} levels become attributes")
    format: Literal["xml", "jsonl"] | None = Field(None, description="default: told from each message")


class MqttFeedSpec(BaseModel):
    """``POST /feeds/mqtt`` body; also what the registry stores."""

    model_config = {"extra": "forbid"}

    broker: str = Field(min_length=1, max_length=2000,
                        description="mqtt(s)://[USER@]HOST[:PORT][?qos=…&client_id=…&clean=…&ca=…&format=…]: "
                                    "no password (the server's $YFPP_MQTT_PASSWORD, or its --mqtt broker's)")
    topics: list[str | TopicSpec] = Field(min_length=1, max_length=MAX_TOPICS,
                                          description='"sensors/{site}/#" or {"topic": "…", "format": "xml"}')


class ApiFeeds:
    """The MQTT feeds added over the API, by id (``m1``, ``m2``, …); those stored that did not start (their
    broker no longer allowed, say) are listed with the reason until deleted."""

    def __init__(self, registry: Registry, policy: SinkPolicy, put: Callable[[list[Event]], None],
                 dead_letters: DeadLetters, read_opts: dict[str, Any]):
        self.registry, self.policy, self.put = registry, policy, put
        self.dead_letters, self.read_opts = dead_letters, read_opts
        self.running: dict[str, mqtt.MqttFeed] = {}
        self.not_started: dict[str, tuple[MqttFeedSpec, str]] = {}
        self._lock = threading.Lock()

    def _feed(self, spec: MqttFeedSpec) -> mqtt.MqttFeed:
        """The feed of ``spec``, not started (blocking: resolves the broker's host); RequestError saying why not."""
        try:
            broker, fmt = mqtt.api_broker(spec.broker)
            topics = [mqtt.topic_of(t if isinstance(t, str) else t.model_dump(exclude_none=True)) for t in spec.topics]
        except YfppError as e:
            raise RequestError(400, str(e)) from None
        try:
            address = self.policy.check_host(broker.host, broker.port)
        except SinkRefused as e:
            raise RequestError(403, f"broker: {e}") from None
        if not broker.tls:  # (TLS connects by name: the name is what its certificate is checked against)
            broker = dataclasses.replace(broker, host=address)
        return mqtt.MqttFeed(broker, topics, self.put, self.dead_letters, self.read_opts, fmt)

    def add(self, spec: MqttFeedSpec) -> dict[str, Any]:
        """Check, connect, store and run a feed (blocking); RequestError for what the caller must fix."""
        if len(self.running) + len(self.not_started) >= MAX_FEEDS:
            raise RequestError(409, f"MQTT feed limit reached ({MAX_FEEDS})")
        feed = self._feed(spec)
        try:
            feed.start()
        except YfppError as e:
            raise RequestError(502, str(e)) from None
        try:
            fid = self.registry.add_feed(spec.model_dump(exclude_none=True))
        except RegistryError as e:
            feed.stop()
            raise RequestError(503, f"cannot store the feed; none was added: {e}") from e
        with self._lock:
            self.running[fid] = feed
        log.info("MQTT feed added", extra={"feed": feed.name, "id": fid, "topics": [t.filter for t in feed.topics]})
        return {"id": fid, **feed.info()}

    def remove(self, fid: str) -> None:
        """Stop and forget a feed (blocking); RequestError 404 if there is none of that id."""
        if fid not in self.running and fid not in self.not_started:
            raise RequestError(404, f"no MQTT feed {fid!r} added over the API")
        try:
            self.registry.remove_feed(fid)
        except RegistryError as e:
            raise RequestError(503, f"cannot record the removal; the feed stays: {e}") from e
        with self._lock:
            feed = self.running.pop(fid, None)
            self.not_started.pop(fid, None)
        if feed is not None:
            feed.stop()
        log.info("MQTT feed removed", extra={"id": fid})

    def start_stored(self) -> None:
        """The stored feeds, each connecting in the background (blocking: resolves their hosts)."""
        for fid, text in self.registry.feeds():
            try:
                spec = MqttFeedSpec.model_validate_json(text)
            except ValidationError as e:
                log.error("stored MQTT feed is not one", extra={"id": fid, "error": str(e)})
                continue
            try:
                feed = self._feed(spec)
                feed.start(timeout=None)
            except YfppError as e:  # (a RequestError too)
                self.not_started[fid] = (spec, str(e))
                log.error("stored MQTT feed does not start", extra={"id": fid, "error": str(e)})
                continue
            self.running[fid] = feed

    def stop(self) -> None:
        """Stop every feed (blocking)."""
        with self._lock:
            feeds = list(self.running.values())
        for feed in feeds:
            feed.stop()

    def all(self) -> list[dict[str, Any]]:
        with self._lock:
            running = list(self.running.items())
        out = [{"id": fid, **feed.info()} for fid, feed in running]
        out += [{"id": fid, "broker": spec.broker, "connected": False, "last_error": f"not started: {why}"}
                for fid, (spec, why) in list(self.not_started.items())]
        return out


def add_feed_routes(app: FastAPI, service: Any, guarded: list[Any],
                    answers: Callable[..., dict[int | str, dict[str, Any]]]) -> None:
    """The ``/feeds/mqtt`` routes, each guarded by ``guarded`` (the admin's key)."""
    feeds: ApiFeeds = service.api_feeds

    @app.post("/feeds/mqtt", status_code=201, dependencies=guarded, responses=answers(400, 401, 403, 409, 422, 502, 503),
              summary="Add an MQTT feed (admin): connected, then kept across restarts")
    async def add_mqtt_feed(spec: MqttFeedSpec) -> dict[str, Any]:
        return await asyncio.to_thread(feeds.add, spec)

    @app.get("/feeds/mqtt", dependencies=guarded, responses=answers(401, 403),
             summary="List the MQTT feeds (admin): those of the configuration (id null) and those added here")
    async def list_mqtt_feeds() -> list[dict[str, Any]]:
        return [{"id": None, **f.info()} for f in service.mqtt_feeds] + feeds.all()

    @app.delete("/feeds/mqtt/{fid}", status_code=204, dependencies=guarded, responses=answers(401, 403, 404, 503),
                summary="Remove an MQTT feed added over the API (admin)")
    async def delete_mqtt_feed(fid: str) -> Response:
        await asyncio.to_thread(feeds.remove, fid)
        return Response(status_code=204)
