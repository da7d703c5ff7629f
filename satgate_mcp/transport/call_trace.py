"""One JSON-RPC request's server span, around its run (only while tracing is on).

The parent is the trace context the request's ``params._meta`` carries when it carries a valid one (the
MCP conventions: one MCP request may span several HTTP requests), linked to the HTTP request's span;
else the HTTP request's span itself. The span is handed to the call's relay, so progress and the
requests put to the client become its events, whichever task delivers them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from opentelemetry import trace
from opentelemetry.trace import Link, SpanKind, Tracer

from satgate_mcp import jsonrpc
from satgate_mcp.jsonrpc import JsonObj
from satgate_mcp.trace_context import meta_of, remote_parent
from satgate_mcp.trace_spans import request_attributes, span_name
from satgate_mcp.transport.mrtr import ModernRelay
from satgate_mcp.transport.relay import CallRelay
from satgate_mcp.upstream.client_trace import mark_failed, mark_reply


async def traced_call(tracer: Tracer, request: jsonrpc.Request, run: Callable[[], Awaitable[JsonObj]], *,
                      session_id: str | None, protocol_version: str | None, relay: object) -> JsonObj:
    """``run()`` under the request's span, whose status and ``error.type`` say how the request ended."""
    parent = remote_parent(meta_of(request.params))
    ambient = trace.get_current_span().get_span_context()
    links = [Link(ambient)] if parent is not None and ambient.is_valid else None
    attributes = request_attributes(request.method, request.params, request.id, session_id=session_id,
                                    protocol_version=protocol_version)
    with tracer.start_as_current_span(span_name(request.method, request.params), context=parent,
                                      kind=SpanKind.SERVER, attributes=attributes, links=links,
                                      record_exception=False, set_status_on_exception=False) as span:
        if isinstance(relay, CallRelay | ModernRelay):
            relay.span = span
        try:
            reply = await run()
        except asyncio.CancelledError:
            mark_failed(span, "cancelled")
            raise
        except Exception as exc:
            mark_failed(span, type(exc).__qualname__)
            raise
        mark_reply(span, reply)
        return reply
