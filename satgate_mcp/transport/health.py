"""Liveness, readiness and metrics endpoints; none of them needs a session.

``/readyz`` and ``/metrics`` get the Host/Origin rules of ``/mcp``: after DNS rebinding a web page
could otherwise read them. ``/metrics`` may also require a bearer (``SATGATE_METRICS_TOKEN``).
``/healthz`` stays open: it says only "ok", and liveness probes (Docker, Kubernetes) call it with
whatever Host they like.
"""

from __future__ import annotations

import hmac

from aiohttp import web

from satgate_mcp import jsonrpc
from satgate_mcp.keys import METRICS, POOL, SETTINGS, STORE_PROBE
from satgate_mcp.metrics import CONTENT_TYPE
from satgate_mcp.settings import Settings
from satgate_mcp.transport.answers import refusal_answer
from satgate_mcp.transport.checks import host_origin_refusal
from satgate_mcp.transport.rules import Refusal, bearer_challenge

METRICS_UNAUTHORIZED = Refusal(401, "unauthorized",
                               "Unauthorized: /metrics needs Authorization: Bearer <SATGATE_METRICS_TOKEN>",
                               code=jsonrpc.SERVER_ERROR, headers={"WWW-Authenticate": bearer_challenge(None)})


def metrics_refusal(authorization: str | None, settings: Settings) -> Refusal | None:
    """With a metrics token configured, only ``Bearer <it>`` reads /metrics (constant-time compare)."""
    if settings.metrics_token is None:
        return None
    scheme, _, presented = (authorization or "").strip().partition(" ")
    expected = settings.metrics_token.get_secret_value().encode("utf-8")
    ok = scheme.lower() == "bearer" and hmac.compare_digest(presented.strip().encode("utf-8", "surrogatepass"),
                                                             expected)
    return None if ok else METRICS_UNAUTHORIZED


async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def readyz(request: web.Request) -> web.StreamResponse:
    """Ready only when every upstream is initialized and (closed fail mode) the store (Redis, or the state
    database) answers: a proxy should not send calls that would fail.

    503 while any configured upstream is down, even though the others are served (``/mcp`` keeps answering): a
    balancer should prefer a machine where every tool works. ``status`` says which wait this is: ``starting``
    (none has failed yet) or ``upstream_down``, and ``down`` names each failed upstream with its last exit status
    and stderr line (what an operator needs to fix it). ``circuits`` gives each HTTP upstream's circuit breaker;
    one that is not closed counts as down.
    """
    refusal = host_origin_refusal(request, request.app[SETTINGS])
    if refusal:
        return refusal_answer(refusal)
    pool = request.app[POOL]
    upstreams, down, circuits = pool.readiness(), pool.failures(), pool.circuits()
    for name, circuit in circuits.items():
        if circuit["state"] != "closed" and name not in down:  # it answers the handshake, yet calls fail
            down[name] = {"status": f"circuit {circuit['state']}: calls to it fail at once"}
    ready = all(upstreams.values()) and not down
    body: dict[str, object] = {"status": "ready" if ready else "upstream_down" if down else "starting",
                               "upstreams": upstreams}
    if circuits:
        body["circuits"] = circuits
    if down:  # which one, and why: its last exit status and stderr line (a half-working machine stays out: 503)
        body["down"] = down
    probe = request.app.get(STORE_PROBE)
    if probe is not None:
        store_up = await probe()
        body["store"] = "up" if store_up else "down"
        if not store_up and request.app[SETTINGS].store_fail_mode == "closed":
            # Closed mode refuses metered calls meanwhile: a balancer should send them to another machine.
            ready, body["status"] = False, "store_unavailable"
    return web.json_response(body, status=200 if ready else 503)


async def metrics(request: web.Request) -> web.StreamResponse:
    settings = request.app[SETTINGS]
    refusal = host_origin_refusal(request, settings) or metrics_refusal(request.headers.get("Authorization"),
                                                                        settings)
    if refusal:
        return refusal_answer(refusal)
    body = request.app[METRICS].render()
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})


def add_routes(app: web.Application) -> None:
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
