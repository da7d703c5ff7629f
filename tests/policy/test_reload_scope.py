"""A policy reload tells ``list_changed`` only to the callers whose lists it changed: a rule that hides a tool from
one tenant reaches that tenant's sessions (owed ahead of their next answer) and no one else's."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import SecretStr
from pytest_aiohttp import AiohttpClient

from satgate_mcp.app import create_app
from satgate_mcp.auth.base import Identity
from satgate_mcp.auth.macaroons import mint_token
from satgate_mcp.events import RecordingPublisher
from satgate_mcp.keys import POLICY_FILE
from satgate_mcp.policy.decide import Decider
from satgate_mcp.policy.reload_scope import Affected
from satgate_mcp.policy.rules import Effect, compile_rules
from satgate_mcp.settings import Settings
from tests.fakes import AllowAllPolicy, FakePool

KEY = "reload-scope-root-key-0123456789-abcdefghij"
ACCEPT = "application/json, text/event-stream"
NONE: dict[str, Any] = {"rules": []}
ACME_NO_ECHO = {"rules": [{"name": "acme-no-echo", "tools": ["echo"], "when": 'token.tenant == "acme"',
                           "effect": "deny"}]}


def decider(document: object) -> Decider:
    return Decider(compile_rules(document, Effect.ALLOW, "test"))


def test_only_callers_whose_list_changes_are_affected() -> None:
    affected = Affected(decider(NONE), decider(ACME_NO_ECHO), {"tools": [({"name": "echo"}, "u"),
                                                                         ({"name": "add"}, "u")]})
    assert affected(Identity("a-1", tenant="acme"), "tools")
    assert not affected(Identity("g-1", tenant="globex"), "tools")
    assert not affected(Identity("a-1", tenant="acme"), "prompts")


async def test_a_reload_tells_the_tenant_it_hides_a_tool_from_and_no_one_else(
        aiohttp_client: AiohttpClient, tmp_path: Path) -> None:
    policy = tmp_path / "policy.json"
    policy.write_text(json.dumps(NONE))
    app = create_app(Settings(auth_mode="header", root_key=SecretStr(KEY), state_dir="memory", policy_file=policy),
                     pool=FakePool(["echo", "add"]), policy=AllowAllPolicy(), publisher=RecordingPublisher())
    client = await aiohttp_client(app)

    async def post(token: str, body: object, session: str | None = None) -> tuple[str | None, str]:
        headers = {"Content-Type": "application/json", "Accept": ACCEPT, "Authorization": f"Bearer {token}"}
        if session is not None:
            headers["Mcp-Session-Id"] = session
        resp = await client.post("/mcp", data=json.dumps(body), headers=headers)
        assert resp.status == 200
        return resp.headers.get("Mcp-Session-Id"), await resp.text()

    sessions = {}
    for tenant in ("acme", "globex"):
        token = mint_token(KEY, f"agent-{tenant}", tenant=tenant)
        session, _ = await post(token, {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}})
        assert session is not None
        await post(token, {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}, session)
        sessions[tenant] = (token, session)
    policy.write_text(json.dumps(ACME_NO_ECHO))
    assert await app[POLICY_FILE].check()
    told = {}
    for tenant, (token, session) in sessions.items():
        _, answer = await post(token, {"jsonrpc": "2.0", "id": 2, "method": "ping"}, session)
        told[tenant] = "notifications/tools/list_changed" in answer
    assert told == {"acme": True, "globex": False}
