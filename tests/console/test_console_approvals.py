"""Held calls in the console (``create_app`` in this process): an admin approves an agent's held call and its
identical repeat runs once; but no admin decides a call of its own delegation family (the token that asked, a
token delegated from it, or its parent): an agent holding an admin token cannot approve what it asked for. A
second decision is a 409 that names the first; an unknown id is a 404. The operator is shown only the arguments the
rule names."""

from __future__ import annotations

import json
from typing import Any

import pytest
from aiohttp.test_utils import TestClient
from pydantic import SecretStr
from pytest_aiohttp import AiohttpClient

from satgate_mcp.app import create_app
from satgate_mcp.auth.macaroons import add_caveats, mint_token
from satgate_mcp.events import RecordingPublisher
from satgate_mcp.policy.controls import parse_controls
from satgate_mcp.settings import Settings
from tests.answers import read_answer
from tests.fakes import FakePool

KEY = "console-approvals-root-key-0123456789-abcdefghij"
HELD = parse_controls(json.dumps({"approvals": [{"tools": ["pay"], "field": "amount", "above": "1"}]}))
#: An argument the rule does not name: never shown to the operator (it may be a secret).
CARD = "4111-1111-1111-1111"
#: An admin that is also an agent: its own calls are held like anyone's.
ADMIN_AGENT = mint_token(KEY, "ops-agent", admin=True, ttl=3600, controls=HELD)
OTHER_ADMIN = mint_token(KEY, "ops-other", admin=True, ttl=3600)
Client = TestClient[Any, Any]


@pytest.fixture
async def client(aiohttp_client: AiohttpClient) -> Client:
    settings = Settings(auth_mode="header", root_key=SecretStr(KEY), state_dir="memory")
    return await aiohttp_client(create_app(settings, pool=FakePool(["pay", "echo"]), publisher=RecordingPublisher()),
                                headers={"Host": "127.0.0.1"})


async def mcp(client: Client, token: str, body: dict[str, Any], session: str | None = None) -> Any:
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json",
               "Accept": "application/json, text/event-stream"}
    if session is not None:
        headers["Mcp-Session-Id"] = session
    answer = await client.post("/mcp", data=json.dumps(body), headers=headers)
    assert answer.status == 200, await answer.text()
    return answer.headers.get("Mcp-Session-Id"), await read_answer(answer)


async def held_call(client: Client, token: str) -> tuple[str, str]:
    """A session of ``token`` and the id of its held ``pay`` call."""
    session, _ = await mcp(client, token, {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}})
    _, answer = await mcp(client, token, pay(1), session)
    assert answer["error"]["data"]["error"] == "approval_required"
    return session, answer["error"]["data"]["approval_id"]


def pay(request_id: int) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "method": "tools/call",
            "params": {"name": "pay", "arguments": {"amount": 5, "card": CARD}}}


async def decide(client: Client, admin: str, action: str, approval_id: str) -> tuple[int, Any]:
    answer = await client.post(f"/console/api/approvals/{action}", json={"id": approval_id},
                               headers={"Authorization": f"Bearer {admin}"})
    return answer.status, await answer.json()


@pytest.mark.parametrize("decider", [
    pytest.param(ADMIN_AGENT, id="the-token-that-asked"),
    pytest.param(add_caveats(ADMIN_AGENT, tools=["pay", "echo"]), id="a-token-delegated-from-it"),
])
async def test_an_admin_never_decides_its_own_familys_call(client: Client, decider: str) -> None:
    session, approval_id = await held_call(client, ADMIN_AGENT)
    for action in ("approve", "deny"):
        status, answer = await decide(client, decider, action, approval_id)
        assert status == 403
        assert "another operator must decide it" in answer["error"]
    _, still = await mcp(client, ADMIN_AGENT, pay(2), session)
    assert still["error"]["data"] == {"error": "approval_required", "tool": "pay", "approval_id": approval_id,
                                      "expires_at": still["error"]["data"]["expires_at"]}


async def test_a_parent_never_decides_its_delegated_childs_call(client: Client) -> None:
    child = add_caveats(ADMIN_AGENT, tools=["pay"])
    _, approval_id = await held_call(client, child)
    status, _ = await decide(client, ADMIN_AGENT, "approve", approval_id)
    assert status == 403


async def test_another_admin_approves_once_and_the_repeat_runs_once(client: Client) -> None:
    session, approval_id = await held_call(client, ADMIN_AGENT)
    listed = await (await client.get("/console/api/approvals",
                                     headers={"Authorization": f"Bearer {OTHER_ADMIN}"})).json()
    assert [(h["id"], h["token_id"], h["tool"], h["args"]) for h in listed["held"]] == [
        (approval_id, "ops-agent", "pay", '{"amount": 5}')]
    assert CARD not in json.dumps(listed)
    assert await decide(client, OTHER_ADMIN, "approve", approval_id) == (200, {"approved": approval_id})
    status, again = await decide(client, OTHER_ADMIN, "deny", approval_id)
    assert status == 409
    assert "already approved by ops-other" in again["error"]
    assert (await decide(client, OTHER_ADMIN, "approve", "apr_nobody"))[0] == 404
    _, ran = await mcp(client, ADMIN_AGENT, pay(3), session)
    assert "result" in ran
    _, copy = await mcp(client, ADMIN_AGENT, pay(4), session)
    assert copy["error"]["data"]["error"] == "approval_required"
    assert copy["error"]["data"]["approval_id"] != approval_id
