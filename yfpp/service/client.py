"""A small client of the ``yfpp serve`` HTTP API (stdlib only).

>>> c = Client("http://127.0.0.1:8765")                       # doctest: +SKIP
>>> sub = c.subscribe("PATTERN SEQ(shelf a, exit c)", sink="tcp://127.0.0.1:9000")  # doctest: +SKIP
>>> c.unsubscribe(sub["id"])                                   # doctest: +SKIP
"""

from __future__ import annotations

import http.client
import json
import urllib.error
import urllib.request
from typing import Any, Iterator
from urllib.parse import quote

from yfpp.errors import YfppError


class ServiceError(YfppError):
    """The server refused a request: ``status`` and its JSON ``body`` (for query errors: line, column)."""

    def __init__(self, status: int, body: Any):
        self.status = status
        self.body = body
        text = body.get("error") if isinstance(body, dict) and "error" in body else json.dumps(body)
        super().__init__(f"HTTP {status}: {text}")


class Client:
    def __init__(self, url: str, token: str | None = None, timeout: float = 10.0, context: Any = None):
        self.url = url.rstrip("/")
        self.token = token  #: the API key sent as ``Authorization: Bearer``
        self.timeout = timeout
        self.context = context  #: an ssl.SSLContext for https (default: the system's)

    def _open(self, method: str, path: str, body: bytes | None = None, content_type: str = "application/json",
              timeout: float | None = None) -> http.client.HTTPResponse:
        """The response to a request; ServiceError if the server refused it, YfppError if it cannot be sent."""
        try:
            req = urllib.request.Request(self.url + path, data=body, method=method)
            if body is not None:
                req.add_header("Content-Type", content_type)
            if self.token:
                req.add_header("Authorization", f"Bearer {self.token}")
            return urllib.request.urlopen(req, timeout=timeout or self.timeout, context=self.context)
        except urllib.error.HTTPError as e:
            raw = e.read()
            try:
                detail = json.loads(raw)
            except ValueError:
                detail = {"error": raw.decode("utf-8", "replace")}
            raise ServiceError(e.code, detail) from None
        except (urllib.error.URLError, OSError) as e:
            reason = getattr(e, "reason", e)
            raise YfppError(f"cannot reach {self.url}: {reason}") from None
        except (ValueError, http.client.InvalidURL) as e:  # such as an unclosed [ of an IPv6 address
            raise YfppError(f"invalid server URL {self.url!r}: {e}") from None

    def _request(self, method: str, path: str, body: bytes | None = None, content_type: str = "application/json",
                 timeout: float | None = None) -> Any:
        with self._open(method, path, body, content_type, timeout) as r:
            data = r.read()
        return json.loads(data) if data else None

    def subscribe(self, query: str, sink: str | None = None, name: str | None = None, **options: Any) -> dict[str, Any]:
        """Add a subscription (options: language, format, policy, queue, overflow); return its description."""
        spec = {"query": query, "sink": sink, "name": name, **options}
        return self._request("POST", "/subscriptions", json.dumps({k: v for k, v in spec.items() if v is not None}).encode())

    def subscribe_many(self, specs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Add many subscriptions in one request (each a dict of query, sink, name and options); for each, in
        order, ``{"status": 201, "subscription": …}`` or ``{"status": …, "error": …}``."""
        return self._request("POST", "/subscriptions", json.dumps(specs).encode())

    def unsubscribe(self, sid: str) -> None:
        self._request("DELETE", _path(sid))

    def subscriptions(self) -> list[dict[str, Any]]:
        return self._request("GET", "/subscriptions")

    def subscription(self, sid: str) -> dict[str, Any]:
        return self._request("GET", _path(sid))

    def post_events(self, data: bytes, format: str = "jsonl") -> dict[str, int]:
        """Feed a body of JSON lines or XML; return how many events and dead letters it held."""
        kind = "application/xml" if format == "xml" else "application/x-ndjson"
        return self._request("POST", f"/events?format={format}", data, kind)

    def create_key(self, name: str, role: str) -> dict[str, Any]:
        """A new key (admin): its id, name, role and ``key``, its text (shown this once)."""
        return self._request("POST", "/keys", json.dumps({"name": name, "role": role}).encode())

    def keys(self) -> list[dict[str, Any]]:
        return self._request("GET", "/keys")

    def revoke_key(self, kid: str) -> None:
        self._request("DELETE", "/keys/" + quote(kid, safe=""))

    def add_mqtt_feed(self, broker: str, topics: list[Any]) -> dict[str, Any]:
        """Add an MQTT feed (admin): ``broker`` a URL without password, ``topics`` filters or
        ``{"topic": …, "format": …}``; return its description (its ``id`` among them)."""
        return self._request("POST", "/feeds/mqtt", json.dumps({"broker": broker, "topics": topics}).encode())

    def mqtt_feeds(self) -> list[dict[str, Any]]:
        return self._request("GET", "/feeds/mqtt")

    def remove_mqtt_feed(self, fid: str) -> None:
        self._request("DELETE", "/feeds/mqtt/" + quote(fid, safe=""))

    def health(self) -> dict[str, Any]:
        return self._request("GET", "/health")

    def matches(self, sid: str, timeout: float | None = None) -> Iterator[dict[str, Any]]:
        """The pull stream of a subscription: results as they come (ends when the server closes it)."""
        with self._open("GET", _path(sid) + "/matches", timeout=timeout) as resp:
            for line in resp:
                if line.startswith(b"data: "):
                    yield json.loads(line[6:])


def _path(sid: str) -> str:
    """The API path of subscription ``sid``, quoted (an id holding '#' or a space names no other resource).

    No id or name holds a '/', and the server decodes ``%2F`` before routing (``x/matches`` would be
    another resource): such an id is refused here."""
    if "/" in sid:
        raise ServiceError(404, {"error": f"no subscription {sid!r}: ids and names hold no '/'"})
    return "/subscriptions/" + quote(sid, safe="")
