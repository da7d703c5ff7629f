"""Liveness, readiness and metrics endpoints; none of them needs auth or a session."""

from __future__ import annotations

from aiohttp import web

from satgate_mcp.keys import METRICS, POOL
from satgate_mcp.metrics import CONTENT_TYPE


async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    """Ready only when every upstream is initialized: a proxy should not send calls that would fail."""
    pool = request.app[POOL]
    upstreams = pool.readiness()
    ready = all(upstreams.values())
    return web.json_response({"status": "ready" if ready else "starting", "upstreams": upstreams},
                             status=200 if ready else 503)


async def metrics(request: web.Request) -> web.Response:
    body = request.app[METRICS].render()
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})


def add_routes(app: web.Application) -> None:
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
