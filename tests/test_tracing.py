"""Tracing's pure parts as tables (names, attributes, failures, context in and out, the exporter plan), log lines
carrying the current span's ids, and an app in-process: spans with tracing on, not one span object with it off."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest
from aiohttp.test_utils import TestClient
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from pydantic import SecretStr
from pytest_aiohttp import AiohttpClient

from satgate_mcp import jsonrpc, logs, tracing
from satgate_mcp.app import create_app
from satgate_mcp.errors import ConfigError
from satgate_mcp.metrics import Metrics
from satgate_mcp.settings import Settings
from satgate_mcp.trace_context import current_ids, inject_headers, remote_parent, with_current_meta
from satgate_mcp.trace_spans import (
    progress_event,
    relay_event,
    reply_failure,
    request_attributes,
    span_name,
    upstream_attributes,
)
from satgate_mcp.upstream.client_trace import error_type
from tests.fakes import AllowAllPolicy, FakePool

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = "00f067aa0ba902b7"
VALID = f"00-{TRACE}-{PARENT}-01"
ACCEPT = "application/json, text/event-stream"


@pytest.mark.parametrize(("method", "params", "name"), [
    ("tools/call", {"name": "echo", "arguments": {"secret": "x"}}, "tools/call echo"),
    ("prompts/get", {"name": "greet"}, "prompts/get greet"),
    ("resources/read", {"uri": "file:///a"}, "resources/read"),  # a URI is too many names
    ("tools/call", {"name": ""}, "tools/call"),
    ("tools/call", None, "tools/call"),
    ("tools/list", {}, "tools/list"),
])
def test_span_names(method: str, params: dict[str, Any] | None, name: str) -> None:
    assert span_name(method, params) == name


@pytest.mark.parametrize(("method", "params", "rid", "session", "version", "expected"), [
    ("tools/call", {"name": "echo", "arguments": {"text": "secret"}}, 7, "mcp-s", "2025-11-25",
     {"mcp.method.name": "tools/call", "jsonrpc.request.id": "7", "mcp.session.id": "mcp-s",
      "mcp.protocol.version": "2025-11-25", "gen_ai.tool.name": "echo", "gen_ai.operation.name": "execute_tool",
      "network.transport": "tcp", "network.protocol.name": "http"}),
    ("prompts/get", {"name": "p"}, "a", None, "2026-07-28",
     {"mcp.method.name": "prompts/get", "jsonrpc.request.id": "a", "mcp.protocol.version": "2026-07-28",
      "gen_ai.prompt.name": "p", "network.transport": "tcp", "network.protocol.name": "http"}),
    ("resources/read", {"uri": "memo://x"}, None, None, None,
     {"mcp.method.name": "resources/read", "mcp.resource.uri": "memo://x", "network.transport": "tcp",
      "network.protocol.name": "http"}),
])
def test_request_attributes(method: str, params: dict[str, Any], rid: Any, session: str | None,
                            version: str | None, expected: dict[str, Any]) -> None:
    got = request_attributes(method, params, rid, session_id=session, protocol_version=version)
    assert got == expected
    assert "secret" not in json.dumps(got)  # never the arguments


@pytest.mark.parametrize(("reply", "expected"), [
    (jsonrpc.result_response(1, {"content": []}), None),
    (jsonrpc.result_response(1, {"content": [], "isError": True}), {"error.type": "tool_error"}),
    (jsonrpc.error_response(1, -32003, "no", {"error": "tool_not_allowed", "tool": "x"}),
     {"error.type": "tool_not_allowed", "rpc.response.status_code": "-32003",
      "satgate.refusal.reason": "tool_not_allowed", "satgate.refusal.kind": "caveat"}),
    (jsonrpc.error_response(1, -32029, "slow down", {"error": "rate_limited"}),
     {"error.type": "rate_limited", "rpc.response.status_code": "-32029", "satgate.refusal.reason": "rate_limited",
      "satgate.refusal.kind": "rate"}),
    (jsonrpc.error_response(1, -32002, "spent", {"error": "budget_exhausted"}),
     {"error.type": "budget_exhausted", "rpc.response.status_code": "-32002",
      "satgate.refusal.reason": "budget_exhausted", "satgate.refusal.kind": "budget"}),
    (jsonrpc.error_response(1, -32602, "bad"), {"error.type": "-32602", "rpc.response.status_code": "-32602"}),
    (jsonrpc.error_response(1, -32050, "upstream's own", {"error": "whatever"}),
     {"error.type": "whatever", "rpc.response.status_code": "-32050", "satgate.refusal.reason": "whatever"}),
])
def test_reply_failures(reply: dict[str, Any], expected: dict[str, Any] | None) -> None:
    failure = reply_failure(reply)
    assert (failure.attributes() if failure is not None else None) == expected


@pytest.mark.parametrize(("transport", "url", "expected"), [
    ("stdio", None, {"satgate.upstream.name": "u", "network.transport": "pipe"}),
    ("http", "http://docs.internal:3001/mcp", {"satgate.upstream.name": "u", "network.transport": "tcp",
                                               "network.protocol.name": "http", "server.address": "docs.internal",
                                               "server.port": 3001}),
    ("http", "https://user:pw@api.example/mcp", {"satgate.upstream.name": "u", "network.transport": "tcp",
                                                 "network.protocol.name": "http", "server.address": "api.example",
                                                 "server.port": 443}),
])
def test_upstream_attributes(transport: str, url: str | None, expected: dict[str, Any]) -> None:
    assert upstream_attributes("u", transport, url) == expected


@pytest.mark.parametrize(("carrier", "parent"), [
    ({"traceparent": VALID}, (TRACE, PARENT)),
    ({"traceparent": VALID, "tracestate": "rojo=1"}, (TRACE, PARENT)),
    ({"traceparent": "00-not-a-trace-context"}, None),
    ({"traceparent": f"00-{'0' * 32}-{PARENT}-01"}, None),  # an all-zero trace id is invalid
    ({"traceparent": 42}, None),
    ({"tracestate": "rojo=1"}, None),
    ({}, None),
    (None, None),
])
def test_remote_parents(carrier: dict[str, Any] | None, parent: tuple[str, str] | None) -> None:
    context = remote_parent(carrier)
    if parent is None:
        assert context is None
        return
    assert context is not None
    found = trace.get_current_span(context).get_span_context()
    assert (format(found.trace_id, "032x"), format(found.span_id, "016x")) == parent


@pytest.fixture
def provider() -> Iterator[tuple[trace.Tracer, InMemorySpanExporter]]:
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    exporter = InMemorySpanExporter()
    made = TracerProvider()
    made.add_span_processor(SimpleSpanProcessor(exporter))
    yield made.get_tracer("test"), exporter
    made.shutdown()


def test_the_current_context_replaces_the_clients_in_meta_and_headers(
        provider: tuple[trace.Tracer, InMemorySpanExporter]) -> None:
    tracer, _ = provider
    params: dict[str, Any] = {"name": "echo", "_meta": {"traceparent": VALID, "tracestate": "x=1", "progressToken": 3}}
    assert with_current_meta(params) == {"name": "echo", "_meta": {"progressToken": 3}}  # no span: none forwarded
    assert with_current_meta({"name": "echo"}) == {"name": "echo"}
    with tracer.start_as_current_span("s") as span:
        now = span.get_span_context()
        ours = f"00-{now.trace_id:032x}-{now.span_id:016x}-{now.trace_flags:02x}"
        sent = with_current_meta(params)
        headers = {"traceparent": VALID}
        inject_headers(headers)
        assert current_ids() == (ours[3:35], ours[36:52])
    assert sent == {"name": "echo", "_meta": {"progressToken": 3, "traceparent": ours}}
    assert params["_meta"]["traceparent"] == VALID  # the client's own params are not changed
    assert headers == {"traceparent": ours}
    assert current_ids() is None


def test_log_lines_carry_the_current_spans_ids(provider: tuple[trace.Tracer, InMemorySpanExporter],
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    tracer, _ = provider
    processor = logs.LineProcessor()
    assert "trace_id" not in processor(None, "info", {"event": "x"})  # tracing off: nothing looked up
    monkeypatch.setattr(tracing, "TRACER", tracer)
    assert "trace_id" not in processor(None, "info", {"event": "x"})  # no span current
    with tracer.start_as_current_span("s") as span:
        line = processor(None, "info", {"event": "x"})
        foreign = logs.add_trace_ids(None, "info", {"event": "y"})
    context = span.get_span_context()
    assert line["trace_id"] == foreign["trace_id"] == format(context.trace_id, "032x")
    assert line["span_id"] == format(context.span_id, "016x")


@pytest.mark.parametrize(("mode", "env", "expected"), [
    ("off", {}, None),
    ("otlp", {}, tracing.Plan("http", "satgate-mcp")),
    ("otlp", {"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, tracing.Plan("grpc", "satgate-mcp")),
    ("otlp", {"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf"},
     tracing.Plan("http", "satgate-mcp")),
    ("otlp", {"OTEL_SERVICE_NAME": "gw-eu"}, tracing.Plan("http", None)),
    ("otlp", {"OTEL_RESOURCE_ATTRIBUTES": "deployment.environment=prod, service.name=gw"}, tracing.Plan("http", None)),
    ("otlp", {"OTEL_RESOURCE_ATTRIBUTES": "my.service.name=x"}, tracing.Plan("http", "satgate-mcp")),
    ("console", {"OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}, tracing.Plan("console", "satgate-mcp")),
])
def test_plans(mode: str, env: dict[str, str], expected: tracing.Plan | None) -> None:
    assert tracing.plan(mode, env) == expected


def test_a_protocol_no_exporter_speaks_stops_start_up() -> None:
    with pytest.raises(ConfigError, match="http/json"):
        tracing.plan("otlp", {"OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"})


class Failing(SpanExporter):
    def __init__(self, result: SpanExportResult | Exception) -> None:
        self.result = result

    def export(self, spans: Any) -> SpanExportResult:
        if isinstance(self.result, Exception):
            raise self.result
        return self.result


@pytest.mark.parametrize(("result", "counted"), [
    (SpanExportResult.SUCCESS, 0), (SpanExportResult.FAILURE, 1), (OSError("collector gone"), 1)])
def test_failed_exports_are_counted(result: SpanExportResult | Exception, counted: int) -> None:
    metrics = Metrics()
    exporter = tracing.counting(Failing(result), metrics.trace_export_failures)
    spans: list[ReadableSpan] = []
    assert (exporter.export(spans) is SpanExportResult.SUCCESS) == (counted == 0)
    assert metrics.registry.get_sample_value("satgate_trace_export_failures_total") == counted


def test_events_name_what_was_relayed_never_its_content() -> None:
    assert progress_event({"progressToken": 1, "progress": 2, "total": 5, "message": "secret"}) == (
        "notifications/progress",
        {"mcp.method.name": "notifications/progress", "satgate.progress": 2, "satgate.progress.total": 5})
    name, attrs = relay_event("elicitation/create", {"result": {"content": {"pw": "x"}}}, 0.25)
    assert (name, attrs["satgate.relay.outcome"], attrs["satgate.relay.wait_ms"]) == (
        "elicitation/create", "answered", 250.0)
    refused = jsonrpc.error_response(None, -32600, "no", {"error": "not_relayed"})
    assert relay_event("roots/list", refused, 0)[1]["satgate.relay.outcome"] == "not_relayed"
    assert relay_event("sampling/createMessage", jsonrpc.error_response(None, -1, "x"), 0)[1][
        "satgate.relay.outcome"] == "error"
    assert error_type(asyncio.CancelledError()) == "cancelled"
    assert error_type(ValueError()) == "ValueError"


# --- an app in-process --------------------------------------------------------------------------------------


async def _call(client: TestClient[Any, Any], headers: dict[str, str], params: dict[str, Any]) -> dict[str, Any]:
    """A 2026-07-28 request (no session to open first)."""
    response = await client.post("/mcp", headers={
        "Accept": ACCEPT, "MCP-Protocol-Version": "2026-07-28", "Mcp-Method": "tools/call",
        "Mcp-Name": str(params["name"]), **headers}, json={
        "jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {**params, "_meta": {
            **params.get("_meta", {}), "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": {}}}})
    body: dict[str, Any] = await response.json()
    return body


async def test_an_app_with_tracing_on_makes_the_http_and_request_spans(
        aiohttp_client: AiohttpClient, monkeypatch: pytest.MonkeyPatch) -> None:
    exporter = InMemorySpanExporter()
    monkeypatch.setattr(tracing, "_exporter", lambda kind: exporter)
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "10")
    client = await aiohttp_client(create_app(Settings(tracing="console", state_dir="memory"), pool=FakePool(),
                                             policy=AllowAllPolicy()))
    assert tracing.TRACER is not None
    reply = await _call(client, {"traceparent": VALID}, {"name": "echo", "arguments": {"text": "hi"}})
    assert reply["result"]["content"][0]["text"] == "hi"
    unknown = await _call(client, {"traceparent": "garbage"}, {"name": "nope"})
    assert unknown["error"]["data"]["error"] == "unknown_tool"
    async with asyncio.timeout(5):
        while len(exporter.get_finished_spans()) < 4:  # noqa: ASYNC110 (the export thread has no awaitable)
            await asyncio.sleep(0.01)
    spans = {(s.name, s.context.trace_id): s for s in exporter.get_finished_spans()}
    http, rpc = spans[("POST /mcp", int(TRACE, 16))], spans[("tools/call echo", int(TRACE, 16))]
    assert http.parent is not None
    assert format(http.parent.span_id, "016x") == PARENT
    assert rpc.parent is not None
    assert rpc.parent.span_id == http.context.span_id
    assert dict(rpc.attributes or {})["mcp.protocol.version"] == "2026-07-28"
    assert dict(http.attributes or {})["http.response.status_code"] == 200
    [failed] = [s for s in exporter.get_finished_spans() if s.name == "tools/call nope"]
    assert failed.context.trace_id != int(TRACE, 16)  # the malformed header started a new trace
    assert dict(failed.attributes or {})["error.type"] == "unknown_tool"
    assert failed.status.status_code.name == "ERROR"
    await client.close()
    assert tracing.TRACER is None


async def test_an_auth_refusal_is_the_http_spans_error(aiohttp_client: AiohttpClient,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    exporter = InMemorySpanExporter()
    monkeypatch.setattr(tracing, "_exporter", lambda kind: exporter)
    settings = Settings(tracing="console", state_dir="memory", auth_mode="config", static_token=SecretStr("s" * 40))
    client = await aiohttp_client(create_app(settings, pool=FakePool(), policy=AllowAllPolicy()))
    reply = await _call(client, {"traceparent": VALID}, {"name": "echo"})
    assert reply["error"]["data"]["error"] == "unauthorized"
    await client.close()  # the provider's shutdown exports what is queued
    [http] = exporter.get_finished_spans()
    attributes = dict(http.attributes or {})
    assert (attributes["error.type"], attributes["satgate.refusal.kind"]) == ("unauthorized", "auth")
    assert attributes["http.response.status_code"] == 401
    assert "s" * 40 not in json.dumps(attributes)


async def test_tracing_off_makes_no_span_object(aiohttp_client: AiohttpClient,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[str] = []

    def count(self: Any, *args: Any, **kwargs: Any) -> None:
        made.append(type(self).__name__)

    import opentelemetry.sdk.trace as sdk_trace

    monkeypatch.setattr(sdk_trace.Span, "__init__", count)
    monkeypatch.setattr(trace.NonRecordingSpan, "__init__", count)
    app = create_app(Settings(state_dir="memory"), pool=FakePool(), policy=AllowAllPolicy())
    assert len(app.middlewares) == 1  # the request line only
    client = await aiohttp_client(app)
    assert tracing.TRACER is None
    reply = await _call(client, {"traceparent": VALID}, {"name": "progress", "_meta": {"traceparent": VALID}})
    assert "result" in reply
    await client.close()
    assert made == []
