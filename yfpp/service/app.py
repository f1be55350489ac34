"""The HTTP API (FastAPI): subscriptions, events in, the pull stream, health and metrics.

FastAPI gives request validation through pydantic models and the OpenAPI page
(``/docs``, ``/openapi.json``) for free; it runs on uvicorn.
"""

from __future__ import annotations

import asyncio
import gzip
import hmac
import io
import json
import zlib
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, AsyncIterator

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response, StreamingResponse

from yfpp.service import batch, metrics
from yfpp.service.dashboard import add_dashboard
from yfpp.service.errors import RequestError
from yfpp.service.subscriptions import SubscriptionSpec

if TYPE_CHECKING:
    from yfpp.service.server import Service

HEARTBEAT = 15.0  #: seconds between SSE keep-alive comments
GZIP_MAGIC = b"\x1f\x8b"
SPEC_SCHEMA = SubscriptionSpec.model_json_schema()
POLL = 0.5  #: how often a quiet pull stream checks that its subscription and the service are still there


def create_app(service: Service) -> FastAPI:
    # a scrape renders here, one at a time: with thousands of subscriptions that takes seconds, which the
    # loop (routing results, writing TCP sinks, serving the API) must not wait for
    scrapes = ThreadPoolExecutor(1, thread_name_prefix="metrics")

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await service.start()
        try:
            yield
        finally:
            scrapes.shutdown(wait=False)
            await service.stop()

    app = FastAPI(title="yfpp serve", version="1",
                  description="Subscriptions (SASE+ or extended XPath) on live event feeds; see docs/service.md.",
                  lifespan=lifespan, docs_url=None, redoc_url=None)  # (served offline by add_dashboard)
    registry = metrics.registry_for(service)

    def authorised(request: Request) -> None:
        token = service.config.token
        if token is None:
            return
        given = request.headers.get("authorization", "")
        if not hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
            raise RequestError(401, "missing or wrong bearer token (Authorization: Bearer TOKEN)")

    @app.exception_handler(RequestError)
    async def request_error(request: Request, e: RequestError) -> Response:
        headers = {"WWW-Authenticate": "Bearer"} if e.status == 401 else None
        return _json_response(e.body, e.status, headers)

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, e: RequestValidationError) -> Response:
        """FastAPI's 422 without the offending input echoed back (a lone surrogate or 1e400 would make it a 500)."""
        detail = [{"loc": [str(part) for part in err.get("loc", ())], "msg": str(err.get("msg", "")),
                   "type": str(err.get("type", ""))} for err in e.errors()]
        return _json_response({"detail": detail}, 422)

    guarded = [Depends(authorised)]
    add_dashboard(app, service, guarded)

    @app.post("/subscriptions", status_code=201, dependencies=guarded, summary="Add a subscription, or many",
              description="One subscription (a JSON object: 201 and the subscription), or many (a JSON array, or "
                          "NDJSON: 200 and, for each in order, {status: 201, subscription} or {status, error}).",
              openapi_extra={"requestBody": {"required": True, "content": {
                  "application/json": {"schema": {"anyOf": [SPEC_SCHEMA, {"type": "array", "items": SPEC_SCHEMA}]}},
                  "application/x-ndjson": {"schema": SPEC_SCHEMA}}}})
    async def add_subscription(request: Request) -> Response:
        body = await _body(request, service.config.max_body_bytes)
        many, items = batch.read_body(body, request.headers.get("content-type", ""))
        if not many:
            (spec,) = items
            if isinstance(spec, RequestError):
                raise spec
            return _json_response((await service.subscribe(spec)).info(), 201)
        return _json_response([batch.answer(x) for x in await service.subscribe_many(items)], 200)

    @app.get("/subscriptions", dependencies=guarded, summary="List the subscriptions")
    async def list_subscriptions() -> list[dict[str, Any]]:
        return [s.info() for s in service.subs.values()]

    @app.get("/subscriptions/{sid}", dependencies=guarded, summary="One subscription and its counters")
    async def get_subscription(sid: str) -> dict[str, Any]:
        return service.get(sid).info()

    @app.delete("/subscriptions/{sid}", status_code=204, dependencies=guarded, summary="Remove a subscription")
    async def delete_subscription(sid: str) -> Response:
        await service.unsubscribe(sid)
        return Response(status_code=204)

    @app.get("/subscriptions/{sid}/matches", dependencies=guarded, summary="Results as Server-Sent Events",
             response_class=StreamingResponse)
    async def pull_matches(sid: str, request: Request) -> StreamingResponse:
        sub = service.get(sid)
        box = sub.listen()

        async def events() -> AsyncIterator[bytes]:
            try:
                yield b": subscribed " + sub.id.encode() + b"\n\n"
                quiet = 0.0
                while sub.id in service.subs and not service.stopping.is_set():
                    try:
                        batch = await asyncio.wait_for(box.take(), POLL)
                    except asyncio.TimeoutError:
                        quiet += POLL
                        if quiet >= HEARTBEAT:
                            quiet = 0.0
                            yield b": keep-alive\n\n"
                        continue
                    quiet = 0.0
                    yield b"".join(f"id: {r['id']}\ndata: {json.dumps(r, separators=(',', ':'))}\n\n".encode()
                                   for r in batch)
                    sub.pull.add("delivered", len(batch))
                    box.done()
            finally:
                sub.listeners.discard(box)

        return StreamingResponse(events(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    @app.post("/events", status_code=202, dependencies=guarded, summary="Feed events (JSON lines or XML body)")
    async def post_events(request: Request, format: str | None = None) -> dict[str, int]:
        fmt = format or ("xml" if "xml" in request.headers.get("content-type", "") else "jsonl")
        if fmt not in ("xml", "jsonl"):
            raise RequestError(400, f"format must be xml or jsonl, got {fmt!r}")
        limit = service.config.max_body_bytes
        body = await _body(request, limit, "; use a TCP feed for streams")
        return await asyncio.get_running_loop().run_in_executor(
            service.ingest, lambda: service.post_events(_unpacked(body, limit), fmt))

    @app.get("/health", summary="Liveness and a few figures (503 when the engine thread has died)")
    async def health() -> Response:
        body = service.health()
        return _json_response(body, 503 if body["status"] == "failed" else 200)

    @app.get("/metrics", summary="Prometheus metrics", response_class=Response)
    async def prometheus() -> Response:
        text = await asyncio.get_running_loop().run_in_executor(scrapes, metrics.render, registry)
        return Response(text, media_type="text/plain; version=0.0.4; charset=utf-8")

    return app


async def _body(request: Request, limit: int, hint: str = "") -> bytes:
    """The request's body, refused (413) past ``limit`` bytes."""
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise RequestError(413, f"body over {limit} bytes{hint}")
    return bytes(body)


def _unpacked(body: bytes, limit: int) -> bytes:
    """A gzip body unpacked, held to ``limit`` bytes unpacked too (a small bomb would otherwise stand for
    gigabytes); any other body as it is."""
    if body[:2] != GZIP_MAGIC:
        return body
    try:
        with gzip.GzipFile(fileobj=io.BytesIO(body)) as f:
            data = f.read(limit + 1)
    except (OSError, EOFError, zlib.error) as e:
        raise RequestError(400, f"body: not a readable gzip stream ({e})") from e
    if len(data) > limit:
        raise RequestError(413, f"body over {limit} bytes unpacked; use a TCP feed for streams")
    if data[:2] == GZIP_MAGIC:
        raise RequestError(400, "body: gzip inside gzip")
    return data


def _json_response(body: dict[str, Any], status: int, headers: dict[str, str] | None = None) -> Response:
    """A JSON body that encodes whatever text it holds (non-ASCII escaped, so lone surrogates too)."""
    return Response(json.dumps(body, ensure_ascii=True, default=str), status_code=status, headers=headers,
                    media_type="application/json")
