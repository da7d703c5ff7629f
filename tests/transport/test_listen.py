"""``subscriptions/listen`` (2026-07-28): acknowledgement first, only what was asked for, stamped, ended at shutdown;
and a token cannot hold listen streams without bound."""

from __future__ import annotations

import json
from typing import Any

from aiohttp import ClientResponse, web
from aiohttp.test_utils import TestClient
from pydantic import SecretStr
from pytest_aiohttp import AiohttpClient

from satgate_mcp import jsonrpc
from satgate_mcp.app import create_app
from satgate_mcp.auth.macaroons import mint_token
from satgate_mcp.settings import Settings
from tests.fakes import AllowAllPolicy, FakePool

META = {"io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientCapabilities": {}}


async def listen(client: TestClient[web.Request, web.Application], request_id: str,
                 notifications: dict[str, Any], token: str | None = None) -> ClientResponse:
    body = jsonrpc.request_message(request_id, "subscriptions/listen", {"notifications": notifications, "_meta": META})
    headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream",
               "MCP-Protocol-Version": "2026-07-28", "Mcp-Method": "subscriptions/listen"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    return await client.post("/mcp", data=json.dumps(body), headers=headers)


async def next_message(resp: ClientResponse) -> Any:
    while line := await resp.content.readline():
        if line.startswith(b"data: "):
            return json.loads(line[6:])
    raise AssertionError("the stream ended")


async def test_a_listen_stream_acknowledges_then_sends_only_what_was_asked_stamped_and_ends_at_shutdown(
        aiohttp_client: AiohttpClient) -> None:
    pool = FakePool()
    app = create_app(Settings(state_dir="memory"), pool=pool, policy=AllowAllPolicy())
    client = await aiohttp_client(app)
    resp = await listen(client, "sub-1", {"toolsListChanged": True, "promptsListChanged": True})
    ack = await next_message(resp)
    assert ack["method"] == "notifications/subscriptions/acknowledged"
    assert ack["params"]["notifications"] == {"toolsListChanged": True}  # no upstream offers prompts
    assert pool.listener is not None
    pool.listener("notifications/prompts/list_changed", None)  # not honoured: never sent
    pool.listener("notifications/tools/list_changed", None)
    changed = await next_message(resp)
    assert changed["method"] == "notifications/tools/list_changed"
    assert changed["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"] == "sub-1"
    await app.shutdown()
    ended = await next_message(resp)
    assert ended == {"jsonrpc": "2.0", "id": "sub-1", "result": {
        "resultType": "complete", "_meta": {"io.modelcontextprotocol/subscriptionId": "sub-1"}}}


async def test_attack_a_token_cannot_hold_listen_streams_past_its_in_flight_quota(
        aiohttp_client: AiohttpClient) -> None:
    # Header mode: a token id is a tenant (in none mode only the process bound applies, issue 23).
    key = "k" * 40
    app = create_app(Settings(state_dir="memory", auth_mode="header", root_key=SecretStr(key),
                              max_inflight_per_token=2),
                     pool=FakePool(), policy=AllowAllPolicy())
    client = await aiohttp_client(app)
    token = mint_token(key, "agent-1")
    held = [await listen(client, f"s{i}", {"toolsListChanged": True}, token) for i in range(2)]
    for resp in held:
        assert (await next_message(resp))["method"] == "notifications/subscriptions/acknowledged"
    refused = await listen(client, "s3", {"toolsListChanged": True}, token)
    assert (await refused.json())["error"]["data"]["error"] == "rate_limited"
    held[0].close()
