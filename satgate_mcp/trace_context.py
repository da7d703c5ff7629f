"""W3C trace context in and out: HTTP headers, and ``params._meta`` as MCP puts it (SEP-414).

Only ``traceparent`` and ``tracestate`` are read or written (``baggage`` is neither taken from a client
nor forwarded). A malformed ``traceparent`` is no parent at all: the request starts a new trace and
never fails for it. Used only while tracing is on; nothing here runs on the off path.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from satgate_mcp.jsonrpc import JsonObj

#: The keys of W3C Trace Context, in headers and (unprefixed, as SEP-414 says) in ``_meta``.
KEYS = ("traceparent", "tracestate")

_W3C = TraceContextTextMapPropagator()


def remote_parent(carrier: Mapping[str, Any] | None) -> Context | None:
    """The context a carrier's ``traceparent`` (with its ``tracestate``) names; None when it names none or a
    malformed one (the caller's span then starts where it would without it)."""
    if not carrier:
        return None
    found = {key: value for key in KEYS if isinstance(value := carrier.get(key), str)}
    if "traceparent" not in found:
        return None
    context = _W3C.extract(found)
    return context if trace.get_current_span(context).get_span_context().is_valid else None


def meta_of(params: JsonObj | None) -> Mapping[str, Any] | None:
    meta = params.get("_meta") if params else None
    return meta if isinstance(meta, dict) else None


def with_current_meta(params: JsonObj | None) -> JsonObj | None:
    """``params`` (a copy) whose ``_meta`` carries the current context in place of any the client sent, so the
    upstream continues the gateway's span; the client's own ``params`` are never changed."""
    carrier: dict[str, str] = {}
    _W3C.inject(carrier)
    meta = meta_of(params)
    if not carrier and (meta is None or not any(key in meta for key in KEYS)):
        return params
    kept = {k: v for k, v in (meta or {}).items() if k not in KEYS}
    return {**(params or {}), "_meta": {**kept, **carrier}}


def inject_headers(headers: dict[str, str]) -> None:
    """The current context as ``traceparent`` / ``tracestate`` headers (none when no span is current)."""
    for key in KEYS:
        headers.pop(key, None)
    _W3C.inject(headers)


def current_ids() -> tuple[str, str] | None:
    """(trace id, span id) of the current span, lower-case hex as W3C writes them; None when no span is current."""
    context = trace.get_current_span().get_span_context()
    if not context.is_valid:
        return None
    return format(context.trace_id, "032x"), format(context.span_id, "016x")
