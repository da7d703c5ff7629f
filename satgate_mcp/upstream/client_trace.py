"""The client span of one request to an upstream, whose context the request carries on (only while tracing is on).

The context goes in ``params._meta`` (both transports; it replaces any the client sent, so the upstream
continues the gateway's span, not the client's) and, for HTTP, in the headers ``http_channel`` adds.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer

from satgate_mcp.errors import GatewayError
from satgate_mcp.jsonrpc import JsonObj
from satgate_mcp.trace_context import with_current_meta
from satgate_mcp.trace_spans import Attributes, reply_failure, span_name, target

Send = Callable[[JsonObj | None], Awaitable[JsonObj]]


def client_attributes(upstream: Attributes, method: str, params: JsonObj | None, modern: bool) -> Attributes:
    """The upstream's own attributes, the method, and the tool or prompt it names."""
    attributes: Attributes = {**upstream, "mcp.method.name": method}
    named = target(method, params)
    if named is not None:
        attributes["gen_ai.prompt.name" if method == "prompts/get" else "gen_ai.tool.name"] = named
    if method == "tools/call":
        attributes["gen_ai.operation.name"] = "execute_tool"
    if modern:
        attributes["mcp.protocol.version"] = "2026-07-28"
    return attributes


def error_type(exc: BaseException) -> str:
    """A gateway error's reason (``upstream_timeout``, ``upstream_unavailable``), else the exception's class."""
    if isinstance(exc, asyncio.CancelledError):
        return "cancelled"
    if isinstance(exc, GatewayError) and isinstance(reason := (exc.data or {}).get("error"), str):
        return reason
    return type(exc).__qualname__


async def traced_request(tracer: Tracer, method: str, params: JsonObj | None, attributes: Attributes,
                         send: Send) -> JsonObj:
    with tracer.start_as_current_span(span_name(method, params), kind=SpanKind.CLIENT, attributes=attributes,
                                      record_exception=False, set_status_on_exception=False) as span:
        try:
            reply = await send(with_current_meta(params))
        except BaseException as exc:
            mark_failed(span, error_type(exc))
            raise
        mark_reply(span, reply)
        return reply


def mark_failed(span: Span, kind: str) -> None:
    """A request that ended without an answer: ``error.type`` and an error status, both saying ``kind``."""
    span.set_attribute("error.type", kind)
    span.set_status(Status(StatusCode.ERROR, kind))


def mark_reply(span: Span, reply: JsonObj) -> None:
    """An answer that is an error (a JSON-RPC error, or a tool result flagged ``isError``) marks its span so."""
    failure = reply_failure(reply)
    if failure is not None:
        span.set_attributes(failure.attributes())
        span.set_status(Status(StatusCode.ERROR, failure.description))
