"""MRTR end to end: the official SDK's ``mcp.Client`` (2026-07-28, a bearer token) answers what a 2025 upstream
asks mid-call (elicitation, sampling, roots) through a real ``python -m satgate_mcp serve``.

The upstream (tests/upstream_server.py over stdio) asks its client with server-to-client requests, as 2025
servers do; the gateway turns each into an ``input_required`` round and the client's callbacks answer it. A
gateway SIGKILLed and restarted while the client is answering cannot continue that flow (the upstream call
died with it): the client's retry gets a clear error at once, never a hang, and the next call works.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx2
import mcp_types as types
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from pydantic import FileUrl

from tests.gateway_process import GatewayProcess

pytestmark = pytest.mark.process

ROOT_KEY = "e2e-mrtr-sdk-root-key-0123456789abcdefghijkl"
CALL_TIMEOUT = 15.0


@pytest.fixture
async def gateway(tmp_path: Path) -> AsyncIterator[GatewayProcess]:
    gw = GatewayProcess(tmp_path, root_key=ROOT_KEY)
    gw.start()
    await gw.wait_ready()
    yield gw
    await gw.kill()


@contextlib.asynccontextmanager
async def modern_client(gw: GatewayProcess, token: str, **callbacks: Any) -> AsyncIterator[Client]:
    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, trust_env=False,
                              timeout=httpx2.Timeout(CALL_TIMEOUT))
    async with http, contextlib.AsyncExitStack() as stack:
        client = Client(streamable_http_client(f"{gw.url}/mcp", http_client=http), read_timeout_seconds=CALL_TIMEOUT,
                        **callbacks)
        async with asyncio.timeout(CALL_TIMEOUT):
            await stack.enter_async_context(client)
        assert client.protocol_version == "2026-07-28"
        yield client


async def text_of(call: Awaitable[types.CallToolResult]) -> str:
    result = await asyncio.wait_for(call, CALL_TIMEOUT)
    [content] = result.content
    assert isinstance(content, types.TextContent)
    return content.text


async def mint(gw: GatewayProcess, token_id: str) -> str:
    return (await gw.cli("token", "mint", "--id", token_id, "--ttl", "600")).strip()


async def test_the_sdk_client_answers_elicitation_sampling_and_roots_asked_by_a_2025_upstream(
        gateway: GatewayProcess) -> None:
    asked: list[str] = []

    async def elicit(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        asked.append("elicitation")
        return types.ElicitResult(action="accept", content={"answer": "forty-two"})

    async def sample(context: Any, params: types.CreateMessageRequestParams) -> types.CreateMessageResult:
        asked.append("sampling")
        return types.CreateMessageResult(role="assistant", model="test-model",
                                         content=types.TextContent(type="text", text="sampled"))

    async def roots(context: Any) -> types.ListRootsResult:
        asked.append("roots")
        return types.ListRootsResult(roots=[types.Root(uri=FileUrl("file:///srv/project"))])

    token = await mint(gateway, "mrtr-agent")
    async with modern_client(gateway, token, elicitation_callback=elicit, sampling_callback=sample,
                             list_roots_callback=roots) as client:
        elicited = json.loads(await text_of(client.call_tool("relay_elicit", {"question": "meaning?"})))
        assert elicited == {"action": "accept", "content": {"answer": "forty-two"}}
        assert await text_of(client.call_tool("relay_sample", {"prompt": "hi"})) == "sampled"
        assert json.loads(await text_of(client.call_tool("relay_roots", {}))) == ["file:///srv/project"]
    assert asked == ["elicitation", "sampling", "roots"]


async def test_a_client_without_the_capability_gets_the_upstreams_own_answer(gateway: GatewayProcess) -> None:
    """The 2025 upstream's elicitation is refused back to it as the client would refuse it (not -32021 in its
    place): the upstream's tool decides what the call answers."""
    token = await mint(gateway, "mrtr-plain")
    async with modern_client(gateway, token) as client:
        degraded = await text_of(client.call_tool("relay_elicit", {"question": "?"}))
        assert degraded.startswith("error: ")
        assert "elicitation" in degraded
        assert await text_of(client.call_tool("echo", {"text": "still here"})) == "still here"


async def test_a_restart_in_the_middle_of_a_flow_fails_the_retry_clearly_and_the_next_call_works(
        gateway: GatewayProcess) -> None:
    token = await mint(gateway, "mrtr-restart")
    restarted = asyncio.Event()

    async def elicit_across_a_restart(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        if not restarted.is_set():
            await gateway.kill()  # the waiting upstream call dies with the process
            gateway.start()
            await gateway.wait_ready()
            restarted.set()
        return types.ElicitResult(action="accept", content={"answer": "after"})

    callback: Callable[..., Awaitable[types.ElicitResult]] = elicit_across_a_restart
    async with modern_client(gateway, token, elicitation_callback=callback) as client:
        with pytest.raises(MCPError) as refused:
            await asyncio.wait_for(client.call_tool("relay_elicit", {"question": "?"}), CALL_TIMEOUT)
        assert "issue the call again" in refused.value.message
        elicited = json.loads(await text_of(client.call_tool("relay_elicit", {"question": "again?"})))
        assert elicited == {"action": "accept", "content": {"answer": "after"}}


async def test_answers_sent_with_a_new_call_answer_the_2025_upstreams_question_extras_ignored(
        gateway: GatewayProcess) -> None:
    """As a 2026 server reads answers sent up front by key and ignores the rest, the call completes in one round:
    the one answer that fits the 2025 upstream's form is its answer, keys it does not know are ignored."""
    token = await mint(gateway, "up-front")
    meta = {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": {"elicitation": {}}}
    given = {"my_answer": {"action": "accept", "content": {"answer": "forty-two"}},
             "unknown_extra_key": {"action": "accept", "content": {"foo": "bar"}}, "another": {"baz": 123}}
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
            "params": {"_meta": meta, "name": "relay_elicit", "arguments": {"question": "why?"},
                       "inputResponses": given}}
    headers = {"Authorization": f"Bearer {token}", "Accept": "application/json", "MCP-Protocol-Version": "2026-07-28",
               "Mcp-Method": "tools/call", "Mcp-Name": "relay_elicit"}
    async with httpx2.AsyncClient(trust_env=False, timeout=CALL_TIMEOUT) as http:
        answer = (await http.post(f"{gateway.url}/mcp", json=body, headers=headers)).json()
    assert answer["result"].get("resultType", "complete") == "complete", answer
    assert json.loads(answer["result"]["content"][0]["text"]) == {"action": "accept",
                                                                  "content": {"answer": "forty-two"}}
