"""User confirmation (issue 27 §4) through a real gateway in front of the real payments upstream, asked of the
official SDK client's elicitation callback: a decline, a cancel, or an accept without the box ticked stops the
call before the upstream (``confirmation_declined``); an explicit yes runs it; a client that declared no
elicitation is refused (``confirmation_unavailable``, fail closed). The question names the tool and the
arguments the entry lists. A policy rule's ``confirm`` and ``hold`` effects run the same machinery."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx2
import pytest
from mcp import types
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from satgate_mcp.auth.macaroons import mint_token
from satgate_mcp.policy.controls import parse_controls
from tests.conftest import upstream_command
from tests.gateway_process import GatewayProcess, call_text

pytestmark = pytest.mark.process

KEY = "confirmation-e2e-root-key-0123456789abcdef"
TIMEOUT = 15.0
CONFIRM = {"confirm": [{"tools": ["pay"], "message": "Send this payment?", "fields": ["amount", "vendor"]}]}
POLICY = {"rules": [
    {"name": "big-fetch", "tools": ["fetch"], "when": "args.url.startsWith('https://api.example.com/v1/big')",
     "effect": "hold", "reason": "big downloads are approved by an operator"},
    {"name": "ask-first", "tools": ["fetch"], "effect": "confirm", "reason": "Fetch this URL?"}]}


class User:
    """The person behind the client: answers each confirmation as told, and remembers what was asked."""

    def __init__(self, answers: list[types.ElicitResult]) -> None:
        self.answers = answers
        self.asked: list[str] = []

    async def elicit(self, ctx: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        assert isinstance(params, types.ElicitRequestFormParams)
        assert params.requested_schema["properties"]["confirm"]["type"] == "boolean"
        self.asked.append(params.message)
        return self.answers.pop(0)


@asynccontextmanager
async def session(url: str, token: str, user: User | None) -> AsyncIterator[ClientSession]:
    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, trust_env=False,
                              timeout=httpx2.Timeout(TIMEOUT))
    callbacks: dict[str, Any] = {"elicitation_callback": user.elicit} if user is not None else {}
    async with (http, streamable_http_client(f"{url}/mcp", http_client=http) as (read, write),
                ClientSession(read, write, read_timeout_seconds=TIMEOUT, **callbacks) as client):
        await asyncio.wait_for(client.initialize(), TIMEOUT)
        yield client


async def refused(client: ClientSession, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
    with pytest.raises(MCPError) as caught:
        await asyncio.wait_for(client.call_tool(tool, arguments), TIMEOUT)
    assert caught.value.code == -32001
    data = caught.value.data
    assert isinstance(data, dict)
    return data


async def test_the_user_is_asked_and_only_an_explicit_yes_runs_the_call(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.jsonl"
    upstreams = {"p": {"transport": "stdio", "command": upstream_command("--payments", "--ledger", str(ledger))}}
    gw = GatewayProcess(tmp_path, root_key=KEY, settings={"SATGATE_UPSTREAMS": json.dumps(upstreams)})
    token = mint_token(KEY, "agent-c", controls=parse_controls(json.dumps(CONFIRM)))
    user = User([types.ElicitResult(action="decline"), types.ElicitResult(action="cancel"),
                 types.ElicitResult(action="accept", content={"confirm": False}),
                 types.ElicitResult(action="accept", content={"confirm": True})])
    try:
        gw.start()
        await gw.wait_ready()
        async with asyncio.timeout(60):
            async with session(gw.url, token, user) as client:
                for _ in range(3):
                    assert await refused(client, "pay", {"amount": 7, "vendor": "acme"}) == {
                        "error": "confirmation_declined", "tool": "pay"}
                assert await call_text(client, "pay", {"amount": 7, "vendor": "acme"}, timeout=TIMEOUT) \
                    == "paid 7 to acme"
            async with session(gw.url, token, None) as client:
                assert (await refused(client, "pay", {"amount": 8, "vendor": "acme"}))["error"] \
                    == "confirmation_unavailable"
        assert user.asked == ["Send this payment?\n\nTool: pay\namount: 7\nvendor: acme"] * 4
        assert [json.loads(line) for line in ledger.read_text().splitlines()] == [{"amount": 7, "vendor": "acme"}]
        assert [e["answer"] for e in gw.events("confirmation")] == ["declined"] * 3 + ["accepted", "unavailable"]
    finally:
        await gw.kill()


async def test_policy_rules_hold_and_confirm_without_re_minting(tmp_path: Path) -> None:
    policy = tmp_path / "policy.json"
    policy.write_text(json.dumps(POLICY))
    upstreams = {"p": {"transport": "stdio", "command": upstream_command("--payments")}}
    gw = GatewayProcess(tmp_path, root_key=KEY, settings={"SATGATE_UPSTREAMS": json.dumps(upstreams),
                                                          "SATGATE_POLICY_FILE": str(policy),
                                                          "SATGATE_STATE_DIR": str(tmp_path / "state")})
    gw.cli_env["SATGATE_STATE_DIR"] = str(tmp_path / "state")
    user = User([types.ElicitResult(action="accept", content={"confirm": True})])
    try:
        gw.start()
        await gw.wait_ready()
        gw.cli_env["SATGATE_EVENTS_FILE"] = str(gw.events_file)  # the command publishes its decision there too
        async with asyncio.timeout(60), session(gw.url, mint_token(KEY, "agent-p"), user) as client:
            held = await refused(client, "fetch", {"url": "https://api.example.com/v1/big"})
            assert held["error"] == "approval_required"
            await gw.cli("approvals", "approve", held["approval_id"])
            assert await call_text(client, "fetch", {"url": "https://api.example.com/v1/big"}, timeout=TIMEOUT) \
                == "fetched https://api.example.com/v1/big"
            assert await call_text(client, "fetch", {"url": "https://api.example.com/v1/small"}, timeout=TIMEOUT) \
                == "fetched https://api.example.com/v1/small"
        assert user.asked == ["Fetch this URL?\n\nTool: fetch"]
        [requested] = gw.events("approval_requested")
        assert (requested["tool"], requested["reason"]) == ("fetch", "big downloads are approved by an operator")
        [decided] = gw.events("approval_decided")
        assert (decided["approval_id"], decided["decision"]) == (requested["approval_id"], "approved")
        assert [e["approval_id"] for e in gw.events("approval_used")] == [requested["approval_id"]]
    finally:
        await gw.kill()


async def modern_pay(gw: GatewayProcess, token: str, request_id: int, **extra: Any) -> Any:
    """A 2026-07-28 client's ``tools/call`` of ``pay`` (it declares elicitation), as it sends it over plain HTTP."""
    meta = {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": {"elicitation": {}}}
    body = {"jsonrpc": "2.0", "id": request_id, "method": "tools/call",
            "params": {"_meta": meta, "name": "pay", "arguments": {"amount": 3, "vendor": "acme"}, **extra}}
    headers = {"Authorization": f"Bearer {token}", "Accept": "application/json",
               "MCP-Protocol-Version": "2026-07-28", "Mcp-Method": "tools/call", "Mcp-Name": "pay"}
    async with httpx2.AsyncClient(trust_env=False, timeout=TIMEOUT) as http:
        answer = await http.post(f"{gw.url}/mcp", json=body, headers=headers)
    assert answer.status_code == 200, answer.text
    return answer.json()


async def test_a_2026_client_is_asked_with_an_input_required_round(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.jsonl"
    upstreams = {"p": {"transport": "stdio", "command": upstream_command("--payments", "--ledger", str(ledger))}}
    gw = GatewayProcess(tmp_path, root_key=KEY, settings={"SATGATE_UPSTREAMS": json.dumps(upstreams)})
    token = mint_token(KEY, "agent-m", controls=parse_controls(json.dumps(CONFIRM)))
    try:
        gw.start()
        await gw.wait_ready()
        async with asyncio.timeout(60):
            for answer, expected in (({"action": "decline"}, "declined"),
                                     ({"action": "accept", "content": {"confirm": True}}, "paid")):
                first = (await modern_pay(gw, token, 1))["result"]
                assert first["resultType"] == "input_required"
                [(key, asked)] = first["inputRequests"].items()
                assert asked["method"] == "elicitation/create"
                assert asked["params"]["message"].startswith("Send this payment?")
                done = await modern_pay(gw, token, 2, inputResponses={key: answer},
                                        requestState=first["requestState"])
                if expected == "declined":
                    assert done["error"]["data"] == {"error": "confirmation_declined", "tool": "pay"}
                else:
                    assert done["result"]["content"][0]["text"] == "paid 3 to acme"
        assert len(ledger.read_text().splitlines()) == 1
    finally:
        await gw.kill()
