"""The HTTP API (FastAPI): subscriptions, events in, the pull stream, health and metrics.

FastAPI gives request validation through pydantic models and the OpenAPI page
(``/docs``, ``/openapi.json``) for free; it runs on uvicorn.
"""

from __future__ import annotations

import asyncio
import gzip
import io
import json
import zlib
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, AsyncIterator, Callable, Literal

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response, StreamingResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel, Field

from yfpp.service import batch, metrics
from yfpp.service.auth import Principal
from yfpp.service.dashboard import add_dashboard
from yfpp.service.errors import RequestError
from yfpp.service.limits import BodyLimit
from yfpp.service.mqtt_api import add_feed_routes
from yfpp.service.registry import RegistryError
from yfpp.service.subscriptions import SubscriptionSpec

if TYPE_CHECKING:
    from yfpp.service.server import Service

HEARTBEAT = 15.0  #: seconds between SSE keep-alive comments
GZIP_MAGIC = b"\x1f\x8b"
SPEC_SCHEMA = SubscriptionSpec.model_json_schema()
POLL = 0.5  #: how often a quiet pull stream checks that its subscription, its key and the service are still there

#: the answers of the routes, for the OpenAPI document (each route lists those it gives)
ANSWERS: dict[int, str] = {
    400: "a bad request (the error says what)", 401: "no key, or a wrong or revoked one",
    403: "the key's role may not do this, or the sink or query is not allowed (the error says why)",
    404: "no such subscription or key (another key's subscription too)", 409: "a name taken, or a server limit",
    413: "a body or query over its cap (every route: a body over the server's cap is refused unread)",
    422: "a body that is not the model", 429: "over the key's quota",
    502: "the MQTT broker refused the connection or did not answer (the error says which)",
    503: "the registry or the service cannot take it now (GET /health: the engine thread has died)"}


def _answers(*codes: int) -> dict[int | str, dict[str, Any]]:
    return {code: {"description": ANSWERS[code]} for code in codes}


def _declare_everywhere(app: FastAPI) -> None:
    """Have the OpenAPI document declare, on every route, what the service may answer on any: 413 (the body cap,
    before a route is reached) and, on every route that takes a key, 401 and 403."""
    made = app.openapi

    def document() -> dict[str, Any]:
        if app.openapi_schema is None:
            for operation in (op for ops in made()["paths"].values() for op in ops.values()):
                answers = operation.setdefault("responses", {})
                for code in (401, 403, 413) if operation.get("security") else (413,):
                    answers.setdefault(str(code), {"description": ANSWERS[code]})
        return app.openapi_schema  # type: ignore[return-value]

    app.openapi = document  # type: ignore[method-assign]


class KeySpec(BaseModel):
    """``POST /keys`` body."""

    model_config = {"extra": "forbid"}

    name: str = Field(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9_.\-@ ]+$", description="who holds it")
    role: Literal["subscriber", "feed"] = Field(description="subscriber: its own subscriptions; feed: events in")


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
    cfg = service.config
    app.add_middleware(BodyLimit, limit_for=lambda path: cfg.max_body_bytes if path == "/events" else cfg.max_request_bytes)
    registry = metrics.registry_for(service)
    bearer = HTTPBearer(auto_error=False, description="an API key (admin, subscriber or feed); see docs/service.md")

    # (the key checks are async: a plain function would cost each request a hop to the thread pool and back; one
    # dependency, not a role check on top of an authentication: solving them was a fifth of a POST's loop CPU)
    def acting_as(role: str) -> Callable[..., Principal]:
        async def check(credentials: HTTPAuthorizationCredentials | None = Depends(bearer)) -> Principal:
            who = service.keys.authenticate(credentials.credentials if credentials else None)
            if who is None:
                raise RequestError(401, "missing, wrong or revoked key (Authorization: Bearer KEY)")
            if not who.may(role):
                raise RequestError(403, f"this key's role ({who.role}) may not do this: it needs a {role} key")
            return who
        return check

    subscriber, feeder, admin = acting_as("subscriber"), acting_as("feed"), acting_as("admin")

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

    add_dashboard(app, service, [Depends(admin)])  # the shared NFA holds every key's queries: the admin's view
    add_feed_routes(app, service, [Depends(admin)], _answers)

    @app.post("/subscriptions", status_code=201, summary="Add a subscription, or many (of the key that asks)",
              description="One subscription (a JSON object: 201 and the subscription), or many (a JSON array, or "
                          "NDJSON: 200 and, for each in order, {status: 201, subscription} or {status, error}).",
              responses={200: {"description": "many: for each in order, its subscription or its error"},
                         **_answers(400, 401, 403, 409, 413, 422, 429, 503)},
              openapi_extra={"requestBody": {"required": True, "content": {
                  "application/json": {"schema": {"anyOf": [SPEC_SCHEMA, {"type": "array", "items": SPEC_SCHEMA}]}},
                  "application/x-ndjson": {"schema": SPEC_SCHEMA}}}})
    async def add_subscription(request: Request, who: Principal = Depends(subscriber)) -> Response:
        body = await _body(request, service.config.max_request_bytes)
        many, items = batch.read_body(body, request.headers.get("content-type", ""))
        if not many:
            (spec,) = items
            if isinstance(spec, RequestError):
                raise spec
            return _json_response((await service.subscribe(spec, who.key_id)).info(), 201)
        return _json_response([batch.answer(x) for x in await service.subscribe_many(items, who.key_id)], 200)

    @app.get("/subscriptions", summary="List the subscriptions (a subscriber key: its own)",
             responses=_answers(401, 403))
    async def list_subscriptions(who: Principal = Depends(subscriber)) -> list[dict[str, Any]]:
        return [s.info() for s in service.visible(who)]

    @app.get("/subscriptions/{sid}", summary="One subscription and its counters", responses=_answers(401, 403, 404))
    async def get_subscription(sid: str, who: Principal = Depends(subscriber)) -> dict[str, Any]:
        return service.get(sid, who).info()

    @app.put("/subscriptions/{sid}", summary="Change a subscription in place (its id stays)",
             description="The fields given replace the subscription's. A changed query, language, policy or name "
                         "starts its query afresh (the old one's partial matches are dropped); a changed sink gets "
                         "the results the old one still held.",
             responses=_answers(400, 401, 403, 404, 409, 413, 422, 429, 503))
    async def change_subscription(sid: str, request: Request, who: Principal = Depends(subscriber)) -> Response:
        body = await _body(request, service.config.max_request_bytes)
        try:
            changes = json.loads(body)
        except ValueError as e:
            raise RequestError(400, f"body: not JSON ({e})") from None
        if not isinstance(changes, dict):
            raise RequestError(400, "body: a JSON object of the fields to change")
        return _json_response((await service.update(sid, changes, who)).info(), 200)

    @app.delete("/subscriptions/{sid}", status_code=204, summary="Remove a subscription",
                responses=_answers(401, 403, 404, 503))
    async def delete_subscription(sid: str, who: Principal = Depends(subscriber)) -> Response:
        await service.unsubscribe(sid, who)
        return Response(status_code=204)

    @app.get("/subscriptions/{sid}/matches", summary="Results as Server-Sent Events",
             response_class=StreamingResponse, responses=_answers(401, 403, 404))
    async def pull_matches(sid: str, request: Request, who: Principal = Depends(subscriber)) -> StreamingResponse:
        sub = service.get(sid, who)
        box = sub.listen()

        async def events() -> AsyncIterator[bytes]:
            try:
                yield b": subscribed " + sub.id.encode() + b"\n\n"
                quiet = 0.0
                while sub.id in service.subs and not service.stopping.is_set() and service.keys.active(who):
                    try:
                        batch = await asyncio.wait_for(box.take(), POLL)
                    except asyncio.TimeoutError:
                        quiet += POLL
                        if quiet >= HEARTBEAT:
                            quiet = 0.0
                            yield b": keep-alive\n\n"
                        continue
                    quiet = 0.0
                    yield b"".join(batch)  # (each result's event, encoded once for every stream)
                    box.delivered()
                    box.done()
            finally:
                sub.unlisten(box)

        return StreamingResponse(events(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    @app.post("/events", status_code=202, summary="Feed events (JSON lines or XML body; a feed key)",
              responses=_answers(400, 401, 403, 413, 503))
    async def post_events(request: Request, format: str | None = None, who: Principal = Depends(feeder)) -> dict[str, int]:
        if format not in (None, "xml", "jsonl"):
            raise RequestError(400, f"format must be xml or jsonl, got {format!r}")
        said = format or ("xml" if "xml" in request.headers.get("content-type", "") else None)
        limit = service.config.max_body_bytes
        body = await _body(request, limit, "; use a TCP feed for streams")

        def read() -> dict[str, int]:
            data = _unpacked(body, limit)
            return service.post_events(data, _events_format(data, said))

        return await asyncio.get_running_loop().run_in_executor(service.ingest, read)

    @app.post("/keys", status_code=201, summary="Create a key (admin); its text is shown this once",
              responses=_answers(401, 403, 413, 422, 503))
    async def create_key(spec: KeySpec, who: Principal = Depends(admin)) -> dict[str, Any]:
        try:
            key, text = await asyncio.to_thread(service.keys.create, spec.name, spec.role)
        except RegistryError as e:
            raise RequestError(503, f"cannot store the key; none was made: {e}") from e
        return {**key.info(), "key": text}

    @app.get("/keys", summary="List the keys (admin; never their secrets)", responses=_answers(401, 403))
    async def list_keys(who: Principal = Depends(admin)) -> list[dict[str, Any]]:
        return [k.info() for k in service.keys.all()]

    @app.delete("/keys/{kid}", status_code=204, summary="Revoke a key (admin): it fails from the next request on",
                responses=_answers(401, 403, 404, 503))
    async def revoke_key(kid: str, who: Principal = Depends(admin)) -> Response:
        try:
            revoked = await asyncio.to_thread(service.keys.revoke, kid)
        except RegistryError as e:
            raise RequestError(503, f"cannot record the revocation; the key stays: {e}") from e
        if not revoked:
            raise RequestError(404, f"no key {kid!r}")
        return Response(status_code=204)

    @app.get("/health", summary="Liveness and a few figures (503 when the engine thread has died)",
             responses=_answers(503))
    async def health() -> Response:
        body = service.health()
        return _json_response(body, 503 if body["status"] == "failed" else 200)

    @app.get("/metrics", summary="Prometheus metrics (admin key when keys are on)", response_class=Response,
             responses=_answers(401, 403))
    async def prometheus(who: Principal = Depends(admin)) -> Response:
        text = await asyncio.get_running_loop().run_in_executor(scrapes, metrics.render, registry)
        return Response(text, media_type="text/plain; version=0.0.4; charset=utf-8")

    _declare_everywhere(app)
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


def _events_format(body: bytes, said: str | None) -> str:
    """The format of a ``POST /events`` body: what the request says (``format``, else an XML content type),
    else what the body evidently is (XML starts with ``<``), else JSON lines; a 400 when what it says is not
    what the body evidently is."""
    first = body.lstrip()[:1]
    evident = "xml" if first == b"<" else "jsonl" if first in (b"{", b"[") else None
    if said is not None and evident is not None and said != evident:
        raise RequestError(400, f"the body is {'XML' if evident == 'xml' else 'JSON'} (it starts with "
                                f"{first.decode()!r}), not {said}: send it with format={evident}")
    return said or evident or "jsonl"


def _json_response(body: dict[str, Any], status: int, headers: dict[str, str] | None = None) -> Response:
    """A JSON body that encodes whatever text it holds (non-ASCII escaped, so lone surrogates too)."""
    return Response(json.dumps(body, ensure_ascii=True, default=str), status_code=status, headers=headers,
                    media_type="application/json")
