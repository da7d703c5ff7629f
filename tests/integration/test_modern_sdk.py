"""MCP 2026-07-28 end to end: the official SDK's ``mcp.Client`` (mode "auto") against a real
``python -m satgate_mcp serve`` in front of the real stdio test upstream (tests/upstream_server.py).

The client must settle on 2026-07-28 by itself (``server/discover``, never ``initialize``), and no
request or answer may name a session: a SIGKILL and restart of the gateway between two calls is then
nothing the client notices. A 2025 client (the SDK's legacy ``ClientSession``) keeps its session on
the same process meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2
import mcp_types as types
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from tests.gateway_process import GatewayProcess, call_text, sdk_session

pytestmark = pytest.mark.process

ROOT_KEY = "e2e-modern-sdk-root-key-0123456789abcdefghij"
MODERN = "2026-07-28"
LEGACY_VERSIONS = ("2025-03-26", "2025-06-18", "2025-11-25")
#: Bounds: one MCP call (or the client's connect), one ``token mint`` run.
CALL_TIMEOUT = 15.0
MINT_TIMEOUT = 30.0


@dataclass(frozen=True)
class Exchange:
    http_method: str
    rpc_method: str | None
    status: int
    #: ``Mcp-Session-Id`` as sent, and as answered.
    sent_session: str | None
    got_session: str | None
    protocol_header: str | None


class Recorder(httpx2.AsyncBaseTransport):
    """Every HTTP exchange the client makes, with the session headers both ways."""

    def __init__(self) -> None:
        self._inner = httpx2.AsyncHTTPTransport(trust_env=False)
        self.exchanges: list[Exchange] = []

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        rpc_method = None
        if request.method == "POST":
            body = json.loads(request.content)
            rpc_method = body.get("method") if isinstance(body, dict) else "batch"
        response = await self._inner.handle_async_request(request)
        self.exchanges.append(Exchange(request.method, rpc_method, response.status_code,
                                       request.headers.get("mcp-session-id"), response.headers.get("mcp-session-id"),
                                       request.headers.get("mcp-protocol-version")))
        return response

    async def aclose(self) -> None:
        await self._inner.aclose()

    def rpc_methods(self) -> list[str | None]:
        return [e.rpc_method for e in self.exchanges]


def assert_stateless(recorder: Recorder) -> None:
    """What a 2026-07-28 client's traffic is: POSTs only, each naming the revision, none naming a session."""
    assert recorder.exchanges
    for exchange in recorder.exchanges:
        assert exchange.http_method == "POST", exchange
        assert exchange.sent_session is None, exchange
        assert exchange.got_session is None, exchange
        assert exchange.protocol_header == MODERN, exchange
        assert exchange.rpc_method != "initialize", exchange
        assert exchange.status in (200, 202), exchange


@contextlib.asynccontextmanager
async def modern_client(url: str, token: str | None, recorder: Recorder) -> AsyncIterator[Client]:
    """``mcp.Client`` in its default mode ("auto") over an HTTP client that records, the bearer (when given) in a
    default header; connecting and every read bounded."""
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    http = httpx2.AsyncClient(headers=headers, transport=recorder, trust_env=False,
                              timeout=httpx2.Timeout(CALL_TIMEOUT))
    async with http, contextlib.AsyncExitStack() as stack:
        client = Client(streamable_http_client(f"{url}/mcp", http_client=http), read_timeout_seconds=CALL_TIMEOUT)
        assert client.mode == "auto"
        async with asyncio.timeout(CALL_TIMEOUT):
            await stack.enter_async_context(client)
        yield client


async def tool_text(client: Client, name: str, arguments: dict[str, Any]) -> str:
    result = await asyncio.wait_for(client.call_tool(name, arguments), CALL_TIMEOUT)
    assert not result.is_error, result
    [content] = result.content
    assert isinstance(content, types.TextContent)
    return content.text


def http_request_lines(gw: GatewayProcess) -> list[dict[str, Any]]:
    """The canonical ``http_request`` log lines of the gateway's current start for /mcp."""
    lines = [json.loads(line) for line in gw.log_file.read_text().splitlines() if line.startswith("{")]
    return [line for line in lines if line.get("event") == "http_request" and line.get("path") == "/mcp"]


@pytest.fixture
def gateways(tmp_path: Path) -> Iterator[list[GatewayProcess]]:
    made: list[GatewayProcess] = []
    yield made
    for gw in made:
        gw.terminate()


async def header_mode_gateway(gateways: list[GatewayProcess], tmp_path: Path) -> tuple[GatewayProcess, str]:
    """A header-mode gateway (its default) and a token minted for it."""
    gw = GatewayProcess(tmp_path, root_key=ROOT_KEY)
    gateways.append(gw)
    gw.start()
    token, _ = await asyncio.gather(gw.cli("token", "mint", "--id", "modern-agent", timeout=MINT_TIMEOUT),
                                    gw.wait_ready())
    return gw, token.strip()


async def test_the_sdk_client_settles_on_2026_and_calls_without_a_session(
        gateways: list[GatewayProcess], tmp_path: Path) -> None:
    gw, token = await header_mode_gateway(gateways, tmp_path)
    recorder = Recorder()
    async with modern_client(gw.url, token, recorder) as client:
        assert client.protocol_version == MODERN
        listed = await asyncio.wait_for(client.list_tools(), CALL_TIMEOUT)
        assert {"echo", "add"} <= {tool.name for tool in listed.tools}
        assert await tool_text(client, "echo", {"text": "modern hello"}) == "modern hello"
        assert await tool_text(client, "add", {"a": 2, "b": 3}) == "5"
    assert recorder.rpc_methods()[0] == "server/discover"
    assert recorder.rpc_methods().count("tools/call") == 2
    assert_stateless(recorder)
    assert gw.events("session_connect") == []


async def test_a_sigkilled_and_restarted_gateway_is_nothing_the_client_notices(
        gateways: list[GatewayProcess], tmp_path: Path) -> None:
    gw, token = await header_mode_gateway(gateways, tmp_path)
    recorder = Recorder()
    async with modern_client(gw.url, token, recorder) as client:
        assert await tool_text(client, "echo", {"text": "before"}) == "before"
        assert await gw.kill() == [], "an upstream child outlived the SIGKILLed gateway"
        gw.start()
        await gw.wait_ready()
        assert await tool_text(client, "echo", {"text": "after"}) == "after"
        assert await tool_text(client, "add", {"a": 40, "b": 2}) == "42"
        assert client.protocol_version == MODERN
    assert recorder.rpc_methods().count("server/discover") == 1  # the client did not reconnect or re-probe
    assert [e.status for e in recorder.exchanges if e.rpc_method == "tools/call"] == [200] * 3
    assert_stateless(recorder)
    assert gw.events("session_connect") == []


async def test_a_plain_url_client_leaves_no_session_in_the_gateways_log(
        gateways: list[GatewayProcess], tmp_path: Path) -> None:
    """``mcp.Client(url)`` exactly as documented (auth mode none: no bearer to add); the gateway's own record of
    every request it served names no session."""
    gw = GatewayProcess(tmp_path, root_key=ROOT_KEY, settings={"SATGATE_AUTH_MODE": "none"})
    gateways.append(gw)
    gw.start()
    await gw.wait_ready()
    async with contextlib.AsyncExitStack() as stack:
        client = Client(f"{gw.url}/mcp", read_timeout_seconds=CALL_TIMEOUT)
        async with asyncio.timeout(CALL_TIMEOUT):
            await stack.enter_async_context(client)
        assert client.protocol_version == MODERN
        assert await tool_text(client, "echo", {"text": "plain"}) == "plain"
    lines = http_request_lines(gw)
    assert "server/discover" in [line["rpc_method"] for line in lines]
    assert "tools/call" in [line["rpc_method"] for line in lines]
    assert "initialize" not in [line["rpc_method"] for line in lines]
    assert [line["session_id"] for line in lines] == [None] * len(lines)


async def test_a_2025_session_and_a_2026_client_at_once(gateways: list[GatewayProcess], tmp_path: Path) -> None:
    gw, token = await header_mode_gateway(gateways, tmp_path)
    legacy_recorder, modern_recorder = Recorder(), Recorder()
    async with (sdk_session(gw.url, token, timeout=CALL_TIMEOUT, transport=legacy_recorder) as legacy,
                modern_client(gw.url, token, modern_recorder) as client):
        assert legacy.protocol_version in LEGACY_VERSIONS
        assert client.protocol_version == MODERN
        assert await call_text(legacy, "echo", {"text": "legacy 1"}, timeout=CALL_TIMEOUT) == "legacy 1"
        assert await tool_text(client, "echo", {"text": "modern 1"}) == "modern 1"
        both = await asyncio.gather(
            *(call_text(legacy, "echo", {"text": f"legacy {i}"}, timeout=CALL_TIMEOUT) for i in range(2, 5)),
            *(tool_text(client, "echo", {"text": f"modern {i}"}) for i in range(2, 5)))
        assert both == [f"legacy {i}" for i in range(2, 5)] + [f"modern {i}" for i in range(2, 5)]
        assert await tool_text(client, "add", {"a": 1, "b": 1}) == "2"
        assert await call_text(legacy, "add", {"a": 2, "b": 2}, timeout=CALL_TIMEOUT) == "4"
    assert_stateless(modern_recorder)
    legacy_sessions = {e.sent_session for e in legacy_recorder.exchanges if e.rpc_method != "initialize"}
    [session_id] = legacy_sessions
    assert session_id is not None
    assert session_id.startswith("mcp-")
    [connect] = gw.events("session_connect")
    assert connect["session_id"] == session_id
