"""Spend limits per window in the console's tokens view: the sum each live token's limit adds to, in its current
window, as the spend store has it (a tenant's tokens share one row), against the limit."""

from __future__ import annotations

import json
from typing import Any

from pydantic import SecretStr
from pytest_aiohttp import AiohttpClient

from satgate_mcp.app import create_app
from satgate_mcp.auth.macaroons import mint_token
from satgate_mcp.events import RecordingPublisher
from satgate_mcp.policy.controls import parse_controls
from satgate_mcp.settings import Settings
from tests.answers import read_answer
from tests.fakes import FakePool

KEY = "console-spend-root-key-0123456789-abcdefghij"
ADMIN = mint_token(KEY, "ops", admin=True, ttl=3600)
LIMITED = parse_controls(json.dumps({"spend_limits": [
    {"tools": ["pay"], "field": "amount", "max": "200", "window": "day", "tz": "Asia/Tokyo"}]}))


async def test_the_tokens_view_shows_each_live_tokens_spend_against_its_limit(aiohttp_client: AiohttpClient) -> None:
    settings = Settings(auth_mode="header", root_key=SecretStr(KEY), state_dir="memory")
    client = await aiohttp_client(create_app(settings, pool=FakePool(["pay"]), publisher=RecordingPublisher()),
                                  headers={"Host": "127.0.0.1"})
    agent = mint_token(KEY, "payer", controls=LIMITED)
    headers: dict[str, Any] = {"Authorization": f"Bearer {agent}", "Content-Type": "application/json",
                               "Accept": "application/json, text/event-stream"}
    opened = await client.post("/mcp", headers=headers, data=json.dumps({
        "jsonrpc": "2.0", "id": 0, "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}))
    headers["Mcp-Session-Id"] = opened.headers["Mcp-Session-Id"]
    for request_id, amount in ((1, "30.5"), (2, 12)):
        paid = await client.post("/mcp", headers=headers, data=json.dumps({
            "jsonrpc": "2.0", "id": request_id, "method": "tools/call",
            "params": {"name": "pay", "arguments": {"amount": amount}}}))
        assert "result" in await read_answer(paid)
    view = await (await client.get("/console/api/tokens", headers={"Authorization": f"Bearer {ADMIN}"})).json()
    [row] = view["spend_limits"]["rows"]
    assert (row["token_id"], row["tool"], row["window"], row["tz"], row["spent"], row["limit"]) == (
        "payer", "pay", "day", "Asia/Tokyo", "42.5", "200")
    assert row["resets_at"].endswith("+09:00")
