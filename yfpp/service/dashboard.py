"""The dashboard at ``/`` and an offline ``/docs``: every asset served from installed packages, no CDN.

The page (``static/``: plain HTML, a small script, a style sheet) reads the API
itself — ``/health``, ``/subscriptions``, ``/nfa``, the SSE stream of a chosen
subscription — with the token the user gives it, so it shows what the API
lets that token see.  ``/docs`` (Swagger UI) and ``/redoc`` load their scripts from
the ``fastapi-offline`` package's files, under ``/docs-assets``.
"""

from __future__ import annotations

import asyncio
from importlib.resources import files
from pathlib import Path
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import FileResponse, HTMLResponse
from fastapi.staticfiles import StaticFiles

STATIC = Path(str(files("yfpp.service") / "static"))
MAX_NODES = 400  #: NFA nodes drawn at most (the rest are counted)


def add_dashboard(app: FastAPI, service: Any, guarded: list[Any]) -> None:
    """``/``, ``/static``, ``/nfa`` (guarded like the API), ``/docs``, ``/redoc`` and their assets.
    The app must be made with ``docs_url=None, redoc_url=None``."""
    import fastapi_offline

    assets = Path(fastapi_offline.__file__).parent / "static"
    app.mount("/static", StaticFiles(directory=STATIC), name="static")
    app.mount("/docs-assets", StaticFiles(directory=assets), name="docs-assets")

    @app.get("/", include_in_schema=False)
    async def dashboard() -> FileResponse:
        return FileResponse(STATIC / "index.html", media_type="text/html")

    @app.get("/docs", include_in_schema=False)
    async def swagger() -> HTMLResponse:
        return get_swagger_ui_html(openapi_url="/openapi.json", title=f"{app.title} - API",
                                   swagger_js_url="/docs-assets/swagger-ui-bundle.js",
                                   swagger_css_url="/docs-assets/swagger-ui.css",
                                   swagger_favicon_url="/docs-assets/favicon.png")

    @app.get("/redoc", include_in_schema=False)
    async def redoc() -> HTMLResponse:
        return get_redoc_html(openapi_url="/openapi.json", title=f"{app.title} - API",
                              redoc_js_url="/docs-assets/redoc.standalone.js",
                              redoc_favicon_url="/docs-assets/favicon.png", with_google_fonts=False)

    @app.get("/nfa", dependencies=guarded, summary="The shared NFA: nodes and edges (as yfpp explain --format json)")
    async def nfa() -> dict[str, Any]:
        return await asyncio.to_thread(nfa_picture, service)


def nfa_picture(service: Any) -> dict[str, Any]:
    """The engine's shared NFA as nodes (id, label, queries, depth) and edges, at most :data:`MAX_NODES` nodes;
    read under the engine lock (in a worker thread: the loop never takes it)."""
    from yfpp.output.explain import nfa_graph, sharing_figures

    with service.engine_lock:
        g = nfa_graph(service.engine)
        figures = sharing_figures(service.engine, g)
    depth = {"start": 0}
    order = ["start"]
    for node in order:  # breadth first from the start: each node's depth, for a layered drawing
        for child in g.successors(node):
            if child not in depth:
                depth[child] = depth[node] + 1
                order.append(child)
    shown = set(order[:MAX_NODES])
    nodes = [{"id": str(n), "label": g.nodes[n]["label"], "queries": g.nodes[n]["queries"][:20],
              "accepts": len(g.nodes[n]["accepts"]), "depth": depth[n]} for n in order if n in shown]
    edges = [{"from": str(a), "to": str(b), "label": d["label"]} for a, b, d in g.edges(data=True)
             if a in shown and b in shown]
    return {"nodes": nodes, "edges": edges, "hidden": len(order) - len(shown), "figures": figures}
