"""Traces end to end: a real ``satgate-mcp serve`` (SATGATE_TRACING=otlp) exports to a real OTLP/HTTP receiver
(tests/otlp_receiver.py) while the official SDK clients call it under a root span of their own; the test upstreams
(stdio, and Streamable HTTP) record the ``traceparent`` they were sent.

One trace runs from the client's root span through the gateway's HTTP server span, its JSON-RPC span and its
client span to the upstream, for a call, a refused call, a relayed elicitation, a 2026-07-28 request and a
batch. A malformed ``traceparent`` starts a new trace and the call still succeeds; a collector down or never
answering leaves calls unaffected and counts in ``satgate_trace_export_failures_total``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx2
import mcp_types as types
import pytest
from aiohttp import web
from mcp import Client
from mcp.client.context import ClientRequestContext
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider

from satgate_mcp import jsonrpc
from tests.conftest import HttpUpstreamProcess, upstream_command
from tests.gateway_process import GatewayProcess, free_port
from tests.otlp_receiver import OtlpReceiver, Span

pytestmark = pytest.mark.process

ROOT_KEY = "e2e-tracing-root-key-0123456789abcdefghijklmn"
CALL_TIMEOUT = 15.0
MINT_TIMEOUT = 30.0
TRACER = TracerProvider().get_tracer("agent")  # the client's own spans; not exported, only propagated


def traceparent_of(span: trace.Span) -> str:
    context = span.get_span_context()
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-01"


class TraceHeaders(httpx2.AsyncBaseTransport):
    """An instrumented HTTP client: each POST carries, as headers, the trace context its body's ``_meta`` has."""

    def __init__(self) -> None:
        self._inner = httpx2.AsyncHTTPTransport(trust_env=False)

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        if request.method == "POST":
            body = json.loads(request.content)
            meta = ((body.get("params") or {}).get("_meta") or {}) if isinstance(body, dict) else {}
            if isinstance(meta.get("traceparent"), str):
                request.headers["traceparent"] = meta["traceparent"]
        return await self._inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self._inner.aclose()


async def elicit(ctx: ClientRequestContext, params: types.ElicitRequestParams) -> types.ElicitResult:
    return types.ElicitResult(action="accept", content={"answer": "yes"})


@contextlib.asynccontextmanager
async def receiving(hang: bool = False) -> AsyncIterator[tuple[OtlpReceiver, int]]:
    receiver = OtlpReceiver(hang=hang)
    runner = web.AppRunner(receiver.app(), shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield receiver, port
    finally:
        await runner.cleanup()


@pytest.fixture
def web_upstream(tmp_path: Path) -> Iterator[HttpUpstreamProcess]:
    upstream = HttpUpstreamProcess("--prefix", "h_", "--name", "web", "--trace-file",
                                   str(tmp_path / "web-trace.jsonl")).start()
    yield upstream
    upstream.stop()


def tracing_env(port: int, **extra: str) -> dict[str, str]:
    return {"SATGATE_TRACING": "otlp", "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{port}",
            "OTEL_BSP_SCHEDULE_DELAY": "50", "OTEL_TRACES_SAMPLER": "always_on", **extra}


@contextlib.asynccontextmanager
async def gateway(tmp_path: Path, env: dict[str, str], web_url: str | None = None
                  ) -> AsyncIterator[tuple[GatewayProcess, str]]:
    upstreams: dict[str, Any] = {"t": {"transport": "stdio", "command": upstream_command(
        "--trace-file", str(tmp_path / "stdio-trace.jsonl"))}}
    if web_url is not None:
        upstreams["web"] = {"transport": "http", "url": web_url}
    gw = GatewayProcess(tmp_path, root_key=ROOT_KEY, settings={**env, "SATGATE_UPSTREAMS": json.dumps(upstreams)})
    gw.start()
    try:
        token, _ = await asyncio.gather(gw.cli("token", "mint", "--id", "traced-agent", "--tools", "echo,h_*,relay_*",
                                               timeout=MINT_TIMEOUT), gw.wait_ready())
        yield gw, token.strip()
    finally:
        gw.terminate()


@contextlib.asynccontextmanager
async def session(gw: GatewayProcess, token: str) -> AsyncIterator[ClientSession]:
    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, transport=TraceHeaders(),
                              trust_env=False, timeout=httpx2.Timeout(CALL_TIMEOUT))
    callbacks: dict[str, Any] = {"elicitation_callback": elicit}
    async with (http, streamable_http_client(f"{gw.url}/mcp", http_client=http) as (read, write),
                ClientSession(read, write, read_timeout_seconds=CALL_TIMEOUT, **callbacks) as s):
        await asyncio.wait_for(s.initialize(), CALL_TIMEOUT)
        yield s


def recorded(path: Path, tool: str) -> dict[str, Any]:
    """The last trace context the test upstream recorded for ``tool``."""
    lines: list[dict[str, Any]] = [json.loads(line) for line in path.read_text().splitlines()]
    return [line for line in lines if line["tool"] == tool][-1]


def ids(traceparent: str) -> tuple[str, str]:
    _, trace_id, span_id, _ = traceparent.split("-")
    return trace_id, span_id


async def chain(receiver: OtlpReceiver, trace_id: str, name: str, parent_id: str) -> tuple[Span, Span, Span]:
    """The gateway's HTTP server span, JSON-RPC span and upstream client span for one call, each checked to sit in
    the client's trace under the one before it."""
    rpc = await receiver.wait_for(trace_id, name, "SERVER")
    client = await receiver.wait_for(trace_id, name, "CLIENT")
    assert rpc.parent_span_id == parent_id  # params._meta.traceparent
    [(link_trace, link_span)] = rpc.links  # the HTTP request it came in
    http = await receiver.wait_span(link_span)
    assert (link_trace, http.name, http.kind) == (trace_id, "POST /mcp", "SERVER")
    assert http.parent_span_id == parent_id  # the traceparent header
    assert http.attributes["http.request.method"] == "POST"
    assert http.attributes["url.path"] == "/mcp"
    assert http.attributes["http.response.status_code"] == 200
    assert client.parent_span_id == rpc.span_id
    assert rpc.resource["service.name"] == "satgate-mcp"
    return http, rpc, client


async def test_one_trace_from_the_client_through_the_gateway_to_each_upstream(
        tmp_path: Path, web_upstream: HttpUpstreamProcess) -> None:
    async with receiving() as (receiver, port), gateway(tmp_path, tracing_env(port), web_upstream.url) as (gw, token):
        async with session(gw, token) as s:
            with TRACER.start_as_current_span("agent turn") as root:
                trace_id, root_id = ids(traceparent_of(root))
                assert (await s.call_tool("echo", {"text": "hi"})).content[0].text == "hi"  # type: ignore[union-attr]
                await s.call_tool("h_echo", {"text": "web"})
                with pytest.raises(MCPError, match="not allowed"):
                    await s.call_tool("add", {"a": 1, "b": 2})
                elicited = await s.call_tool("relay_elicit", {"question": "ok?"})
        assert "accept" in elicited.content[0].text  # type: ignore[union-attr]

        # the stdio call: _meta carries the gateway's client span to the child
        _, rpc, client = await chain(receiver, trace_id, "tools/call echo", root_id)
        assert rpc.attributes["mcp.method.name"] == "tools/call"
        assert rpc.attributes["gen_ai.tool.name"] == "echo"
        assert rpc.attributes["gen_ai.operation.name"] == "execute_tool"
        assert rpc.attributes["mcp.protocol.version"] == "2025-11-25"
        assert rpc.attributes["mcp.session.id"].startswith("mcp-")
        assert rpc.attributes["jsonrpc.request.id"].isdigit()
        assert rpc.status == "UNSET"
        assert client.attributes["satgate.upstream.name"] == "t"
        assert client.attributes["network.transport"] == "pipe"
        seen = recorded(tmp_path / "stdio-trace.jsonl", "echo")
        assert ids(seen["meta"]["traceparent"]) == (trace_id, client.span_id)

        # the HTTP call: both _meta and the headers carry it, and the span names the server
        _, _, web_client = await chain(receiver, trace_id, "tools/call h_echo", root_id)
        assert web_client.attributes["server.address"] == "127.0.0.1"
        assert web_client.attributes["server.port"] == web_upstream.port
        assert web_client.attributes["network.transport"] == "tcp"
        seen = recorded(tmp_path / "web-trace.jsonl", "h_echo")
        assert ids(seen["meta"]["traceparent"]) == (trace_id, web_client.span_id)
        assert ids(seen["headers"]["traceparent"]) == (trace_id, web_client.span_id)

        # the refused call: its reason on the span, and no upstream request
        add = await receiver.wait_for(trace_id, "tools/call add", "SERVER")
        assert add.parent_span_id == root_id
        assert add.status == "ERROR"
        assert add.attributes["error.type"] == "tool_not_allowed"
        assert add.attributes["satgate.refusal.kind"] == "caveat"
        assert add.attributes["rpc.response.status_code"] == str(jsonrpc.TOOL_NOT_ALLOWED)
        assert not [s for s in receiver.trace(trace_id) if s.name == "tools/call add" and s.kind == "CLIENT"]

        # the relayed elicitation: an event on the call's span, the answer's outcome with it
        _, relay_rpc, _ = await chain(receiver, trace_id, "tools/call relay_elicit", root_id)
        [event] = [e for e in relay_rpc.events if e.name == "elicitation/create"]
        assert event.attributes["satgate.relay.outcome"] == "answered"

        # nothing secret, nor the arguments, on any span
        for span in receiver.trace(trace_id):
            text = json.dumps(span.attributes)
            for secret in (token, "Bearer", "ok?", '"hi"'):
                assert secret not in text

        # the access log line of a traced request names its trace
        lines = [json.loads(line) for line in gw.log_file.read_text().splitlines() if line.startswith("{")]
        assert any(line.get("event") == "http_request" and line.get("trace_id") == trace_id
                   and len(line.get("span_id", "")) == 16 for line in lines)


async def test_a_2026_request_and_a_batch_continue_the_callers_trace(tmp_path: Path) -> None:
    async with receiving() as (receiver, port), gateway(tmp_path, tracing_env(port)) as (gw, token):
        http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, transport=TraceHeaders(),
                                  trust_env=False, timeout=httpx2.Timeout(CALL_TIMEOUT))
        async with http, contextlib.AsyncExitStack() as stack:
            client = Client(streamable_http_client(f"{gw.url}/mcp", http_client=http),
                            read_timeout_seconds=CALL_TIMEOUT)
            await stack.enter_async_context(client)
            with TRACER.start_as_current_span("modern turn") as root:
                trace_id, root_id = ids(traceparent_of(root))
                await asyncio.wait_for(client.call_tool("echo", {"text": "2026"}), CALL_TIMEOUT)
        _, rpc, client_span = await chain(receiver, trace_id, "tools/call echo", root_id)
        assert rpc.attributes["mcp.protocol.version"] == "2026-07-28"
        assert "mcp.session.id" not in rpc.attributes
        seen = recorded(tmp_path / "stdio-trace.jsonl", "echo")
        assert ids(seen["meta"]["traceparent"]) == (trace_id, client_span.span_id)

        # a batch (2025-03-26) under one traceparent header: one JSON-RPC span per item, each under the HTTP span
        with TRACER.start_as_current_span("batch turn") as root:
            batch_trace, batch_root = ids(traceparent_of(root))
            headers = {"Authorization": f"Bearer {token}", "Accept": "application/json, text/event-stream",
                       "traceparent": traceparent_of(root)}
        async with httpx2.AsyncClient(trust_env=False, timeout=CALL_TIMEOUT) as raw:
            init = await raw.post(f"{gw.url}/mcp", headers=headers, json={
                "jsonrpc": "2.0", "id": 0, "method": "initialize",
                "params": {"protocolVersion": "2025-03-26", "capabilities": {},
                           "clientInfo": {"name": "batch", "version": "1"}}})
            session_headers = {**headers, "Mcp-Session-Id": init.headers["mcp-session-id"],
                               "MCP-Protocol-Version": "2025-03-26"}
            answer = await raw.post(f"{gw.url}/mcp", headers=session_headers, json=[
                {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "echo", "arguments": {}}},
                {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "add", "arguments": {}}}])
        assert answer.status_code == 200
        assert [item["id"] for item in answer.json()] == [1, 2]
        echo = await receiver.wait_for(batch_trace, "tools/call echo", "SERVER")
        add = await receiver.wait_for(batch_trace, "tools/call add", "SERVER")
        http_spans = [s for s in receiver.trace(batch_trace) if s.name == "POST /mcp"]
        assert all(s.parent_span_id == batch_root for s in http_spans)
        batch_http = [s for s in http_spans if s.attributes.get("mcp.session.id")
                      and s.span_id in (echo.parent_span_id, add.parent_span_id)]
        assert batch_http
        assert echo.parent_span_id == add.parent_span_id == batch_http[0].span_id
        assert add.attributes["error.type"] == "tool_not_allowed"


async def test_a_malformed_traceparent_starts_a_new_trace_and_the_call_succeeds(tmp_path: Path) -> None:
    async with receiving() as (receiver, port), gateway(tmp_path, tracing_env(port)) as (gw, token):
        headers = {"Authorization": f"Bearer {token}", "Accept": "application/json, text/event-stream",
                   "traceparent": "00-not-a-trace-context"}
        async with httpx2.AsyncClient(trust_env=False, timeout=CALL_TIMEOUT) as raw:
            answer = await raw.post(f"{gw.url}/mcp", headers={
                **headers, "MCP-Protocol-Version": "2026-07-28", "Mcp-Method": "tools/call", "Mcp-Name": "echo"}, json={
                "jsonrpc": "2.0", "id": 7, "method": "tools/call",
                "params": {"name": "echo", "arguments": {"text": "fresh"},
                           "_meta": {"traceparent": "00-zzzz-yyyy-01",
                                     "io.modelcontextprotocol/protocolVersion": "2026-07-28",
                                     "io.modelcontextprotocol/clientCapabilities": {}}}})
        assert answer.status_code == 200, answer.text
        assert "fresh" in answer.text
        rpc = await receiver.wait_for(None, "tools/call echo", "SERVER")
        http = await receiver.wait_span(rpc.parent_span_id)
        assert http.parent_span_id == ""  # a root: the malformed header named no parent
        seen = recorded(tmp_path / "stdio-trace.jsonl", "echo")
        assert ids(seen["meta"]["traceparent"])[0] == rpc.trace_id  # the upstream continues the new trace


async def failures_counted(gw: GatewayProcess, token: str) -> None:
    """Calls succeed while the collector fails; the failed exports show in the metric."""
    async with session(gw, token) as s:
        for n in range(3):
            result = await asyncio.wait_for(s.call_tool("echo", {"text": f"n{n}"}), CALL_TIMEOUT)
            assert not result.is_error
    async with httpx2.AsyncClient(trust_env=False, timeout=CALL_TIMEOUT) as http, asyncio.timeout(20):
        while True:
            text = (await http.get(f"{gw.url}/metrics")).text
            counted = [line for line in text.splitlines() if line.startswith("satgate_trace_export_failures_total")]
            if counted and float(counted[0].split()[-1]) >= 1:
                return
            await asyncio.sleep(0.1)


async def test_a_collector_that_is_down_leaves_calls_unaffected_and_is_counted(tmp_path: Path) -> None:
    env = tracing_env(free_port(), OTEL_EXPORTER_OTLP_TIMEOUT="1")
    async with gateway(tmp_path, env) as (gw, token):
        await failures_counted(gw, token)


async def test_a_collector_that_never_answers_leaves_calls_unaffected_and_is_counted(tmp_path: Path) -> None:
    async with receiving(hang=True) as (receiver, port), gateway(
            tmp_path, tracing_env(port, OTEL_EXPORTER_OTLP_TIMEOUT="1")) as (gw, token):
        await failures_counted(gw, token)
        assert receiver.posts >= 1
