"""The server span of each HTTP request (only in an app built with tracing on).

Outermost, so the access log line the request logger writes inside it carries this span's ids. An
incoming ``traceparent`` / ``tracestate`` header is its parent; a malformed one starts a new trace.
"""

from __future__ import annotations

import asyncio

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware
from opentelemetry.trace import Span, SpanKind, Status, StatusCode

from satgate_mcp import tracing
from satgate_mcp.keys import REFUSAL_REASON, RPC_METHOD, SESSION_ID
from satgate_mcp.trace_context import remote_parent
from satgate_mcp.trace_spans import REFUSAL_KINDS, http_server_attributes, http_span_name


def _route(request: web.Request) -> str | None:
    resource = request.match_info.route.resource
    return resource.canonical if resource is not None else None


def _finish(span: Span, request: web.Request, status: int, reason: str | None) -> None:
    """The answer's status, the MCP facts the handler learnt, and why it failed (a refusal's reason, a 5xx)."""
    span.set_attribute("http.response.status_code", status)
    method, session_id = request.get(RPC_METHOD), request.get(SESSION_ID)
    if method:
        span.set_attribute("mcp.method.name", method)
    if session_id:
        span.set_attribute("mcp.session.id", session_id)
    if reason is not None:
        span.set_attribute("error.type", reason)
        span.set_attribute("satgate.refusal.reason", reason)
        kind = REFUSAL_KINDS.get(reason)
        if kind is not None:
            span.set_attribute("satgate.refusal.kind", kind)
        span.set_status(Status(StatusCode.ERROR, reason))
    elif status >= 500:
        span.set_attribute("error.type", str(status))
        span.set_status(Status(StatusCode.ERROR))


def tracing_middleware() -> Middleware:
    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        tracer = tracing.TRACER
        if tracer is None:
            return await handler(request)
        attributes = http_server_attributes(request.method, request.path, request.scheme, request.remote)
        with tracer.start_as_current_span(http_span_name(request.method, _route(request)),
                                          context=remote_parent(request.headers), kind=SpanKind.SERVER,
                                          attributes=attributes, record_exception=False,
                                          set_status_on_exception=False) as span:
            status, reason = 500, None
            try:
                response = await handler(request)
                status, reason = response.status, response.get(REFUSAL_REASON)
                return response
            except web.HTTPException as exc:
                status = exc.status
                raise
            except asyncio.CancelledError:
                status, reason = 499, "cancelled"  # the client left before its answer
                raise
            finally:
                _finish(span, request, status, reason)

    return middleware
