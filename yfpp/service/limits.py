"""Request bodies bounded by the server before any parsing (docs/service.md, "Security").

An ASGI middleware: a request whose ``Content-Length`` is over its route's cap
is answered 413 without a byte of its body read; a body sent without a length
(chunked) is counted as it streams in and cut off at the cap: answered 413 then,
and the route sees the client gone (what it answers to that is dropped).
"""

from __future__ import annotations

import json
from typing import Any, Awaitable, Callable

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


class BodyLimit:
    """Caps every HTTP request's body at ``limit_for(path)`` bytes."""

    def __init__(self, app: Any, limit_for: Callable[[str], int]):
        self.app = app
        self.limit_for = limit_for

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.limit_for(scope["path"])
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > limit):
            await _too_large(send, limit)
            return
        seen = 0
        started = cut = False

        async def counted() -> dict[str, Any]:
            nonlocal seen, started, cut
            if cut:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    cut = True
                    if not started:
                        started = True
                        await _too_large(send, limit)
                    return {"type": "http.disconnect"}
            return message

        async def watched(message: dict[str, Any]) -> None:
            nonlocal started
            if cut:
                return  # the route's answer to a body cut off: the 413 went instead
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counted, watched)
        except Exception:
            if not cut:  # (a route may raise on the disconnect it was shown: that is the cut, answered)
                raise


async def _too_large(send: Send, limit: int) -> None:
    body = json.dumps({"error": f"body over {limit} bytes (or a Content-Length that is not a number)"}).encode()
    await send({"type": "http.response.start", "status": 413,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})
