"""The canonical request line: one structured log line and one metric per HTTP request.

A call's own events (``tool_call``, ``budget_spend``) add their fields to this line through
``logs.ACCESS_FIELDS``, so a call costs one INFO line, not three.
"""

from __future__ import annotations

import time

import structlog
from aiohttp import web
from aiohttp.typedefs import Handler, Middleware
from prometheus_client import Counter

from satgate_mcp.guards import REMOTE_ADDR
from satgate_mcp.keys import CLOSE_CONNECTION, RPC_METHOD, SESSION_ID, TOKEN_ID
from satgate_mcp.logs import ACCESS_FIELDS
from satgate_mcp.metrics import Metrics

#: Methods we label metrics with; anything else is "other" so clients cannot blow up cardinality.
KNOWN_METHODS = frozenset({
    "initialize", "ping", "tools/list", "tools/call", "resources/list", "resources/read",
    "resources/templates/list", "resources/subscribe", "resources/unsubscribe", "prompts/list", "prompts/get",
    "completion/complete", "logging/setLevel", "notifications/initialized", "notifications/cancelled",
    "satgate/budget", "satgate/delegate", "response",
})

#: HTTP methods we label with; any other is "other" (llhttp refuses unknown methods, the pure-Python parser not).
HTTP_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "DELETE", "OPTIONS", "PATCH", "CONNECT", "TRACE"})

#: Probe paths ``SATGATE_ACCESS_LOG_HEALTH=false`` keeps out of the access log (their metric still counts).
HEALTH_PATHS = frozenset({"/healthz", "/readyz"})

log = structlog.get_logger("satgate_mcp.http")


def metric_label(rpc_method: str | None, http_method: str) -> str:
    """A bounded label: known JSON-RPC methods, then standard HTTP methods, else "other"."""
    if rpc_method:
        return rpc_method if rpc_method in KNOWN_METHODS else "other"
    return http_method if http_method in HTTP_METHODS else "other"


def logs_request(path: str, *, log_health: bool) -> bool:
    """A probe every few seconds would drown the access log; operators may leave those lines out."""
    return log_health or path not in HEALTH_PATHS


def request_logger(metrics: Metrics, *, log_health: bool = True) -> Middleware:
    # labels() takes a lock and builds a key per call; the bounded label set makes a cache safe.
    counters: dict[tuple[str, int], Counter] = {}
    http_log = log.bind()  # the configured logger, not the lazy proxy that looks it up on every line

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        started = time.perf_counter()
        status = 500
        note: dict[str, object] = {}
        reset = ACCESS_FIELDS.set(note)
        REMOTE_ADDR.set(request.remote)  # each request is handled in a task (a context) of its own
        try:
            response = await handler(request)
            status = response.status
            if request.get(CLOSE_CONNECTION):
                response.force_close()
            return response
        except web.HTTPException as exc:
            status = exc.status
            raise
        finally:
            ACCESS_FIELDS.reset(reset)
            rpc_method = request.get(RPC_METHOD)
            key = (metric_label(rpc_method, request.method), status)
            counter = counters.get(key)
            if counter is None:
                counter = counters[key] = metrics.requests.labels(method=key[0], status=str(status))
            counter.inc()
            if logs_request(request.path, log_health=log_health):
                http_log.info("http_request", method=request.method, path=request.path, status=status,
                              session_id=request.get(SESSION_ID), rpc_method=rpc_method,
                              token_id=request.get(TOKEN_ID), client=request.remote,
                              duration_ms=round((time.perf_counter() - started) * 1000, 2), **note)

    return middleware
