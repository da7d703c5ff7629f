"""Policy rules in the gateway: a refusal reaches no upstream and says which rule; lists follow the rules; a
batch is judged call by call; the file is re-read, a bad version is refused, and no call sees half a policy."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from pathlib import Path

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient
from pytest_aiohttp import AiohttpClient

from satgate_mcp import events
from satgate_mcp.app import create_app
from satgate_mcp.auth.base import NoAuthenticator
from satgate_mcp.errors import ConfigError
from satgate_mcp.events import RecordingPublisher
from satgate_mcp.jsonrpc import JsonObj
from satgate_mcp.keys import METRICS, POLICY_FILE
from satgate_mcp.settings import Settings
from tests.answers import read_answer
from tests.fakes import AllowAllPolicy, FakePool

ACCEPT = "application/json, text/event-stream"
DENY_SECRET = {"rules": [{"name": "no-secrets", "tools": ["secret*"], "effect": "deny", "reason": "not for agents"}]}
DENY_ECHO = {"rules": [{"name": "no-echo", "tools": ["echo"], "effect": "deny", "reason": "echo is off"}]}


@dataclass
class Gateway:
    client: TestClient[web.Request, web.Application]
    pool: FakePool
    publisher: RecordingPublisher
    policy_file: Path

    async def post(self, body: object, session: str | None = None) -> JsonObj | list[JsonObj]:
        headers = {"Content-Type": "application/json", "Accept": ACCEPT}
        if session:
            headers["Mcp-Session-Id"] = session
        resp = await self.client.post("/mcp", data=json.dumps(body), headers=headers)
        assert resp.status == 200, await resp.text()
        answer: JsonObj | list[JsonObj] = await read_answer(resp)
        return answer

    async def initialize(self, version: str = "2025-06-18") -> str:
        resp = await self.client.post("/mcp", headers={"Content-Type": "application/json", "Accept": ACCEPT},
                                      data=json.dumps({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
                                          "protocolVersion": version, "capabilities": {},
                                          "clientInfo": {"name": "t", "version": "1"}}}))
        assert resp.status == 200
        return resp.headers["Mcp-Session-Id"]

    async def call(self, session: str, name: str, request_id: int = 1) -> JsonObj:
        answer = await self.post(call(request_id, name), session)
        assert isinstance(answer, dict)
        return answer

    async def tools(self, session: str) -> list[str]:
        answer = await self.post({"jsonrpc": "2.0", "id": 9, "method": "tools/list"}, session)
        assert isinstance(answer, dict)
        return [t["name"] for t in answer["result"]["tools"]]

    async def reload(self, document: object) -> bool:
        write_policy(self.policy_file, document)
        app = self.client.app
        assert app is not None
        return await app[POLICY_FILE].check()


def call(request_id: int, name: str) -> JsonObj:
    return {"jsonrpc": "2.0", "id": request_id, "method": "tools/call",
            "params": {"name": name, "arguments": {"text": "hi"}}}


def write_policy(path: Path, document: object) -> None:
    """As an operator should: a new file renamed over the old one, so no reader sees it half written."""
    staged = path.with_suffix(".tmp")
    staged.write_text(json.dumps(document))
    staged.replace(path)


@pytest.fixture
async def gw(aiohttp_client: AiohttpClient, tmp_path: Path) -> Gateway:
    policy_file = tmp_path / "policy.json"
    write_policy(policy_file, DENY_SECRET)
    pool, publisher = FakePool(), RecordingPublisher()
    app = create_app(Settings(policy_file=policy_file), authenticator=NoAuthenticator(), pool=pool,
                     policy=AllowAllPolicy(), publisher=publisher)
    return Gateway(await aiohttp_client(app), pool, publisher, policy_file)


async def test_a_denied_call_reaches_no_upstream_and_names_the_rule(gw: Gateway) -> None:
    session = await gw.initialize()
    answer = await gw.call(session, "secret_tool")
    assert answer["error"]["code"] == -32001
    assert answer["error"]["data"] == {"error": "policy_denied", "rule": "no-secrets", "reason": "not for agents"}
    assert gw.pool.calls == []
    [denied] = gw.publisher.named(events.POLICY_DENIED)
    assert (denied["rule"], denied["name"]) == ("no-secrets", "secret_tool")
    assert "result" in await gw.call(session, "echo")
    app = gw.client.app
    assert app is not None
    rendered = app[METRICS].render().decode()
    assert 'satgate_policy_decisions_total{effect="deny",rule="no-secrets"} 1.0' in rendered
    assert 'satgate_policy_decisions_total{effect="allow",rule="(default)"} 1.0' in rendered


async def test_a_batch_is_judged_call_by_call(gw: Gateway) -> None:
    session = await gw.initialize("2025-03-26")  # the last revision with batches
    answers = await gw.post([call(1, "echo"), call(2, "secret_tool"), call(3, "echo")], session)
    assert isinstance(answers, list)
    by_id = {a["id"]: a for a in answers}
    assert "result" in by_id[1]
    assert "result" in by_id[3]
    assert by_id[2]["error"]["data"]["error"] == "policy_denied"
    assert len(gw.pool.calls) == 2
    assert "secret_tool" not in json.dumps(gw.pool.calls)


async def test_a_tool_denied_whatever_the_arguments_is_not_listed(gw: Gateway) -> None:
    session = await gw.initialize()
    assert "secret_tool" not in await gw.tools(session)
    assert "echo" in await gw.tools(session)


async def test_a_rule_reading_the_arguments_does_not_hide_the_tool(gw: Gateway) -> None:
    await gw.reload({"rules": [{"name": "n", "tools": ["echo"], "when": "args.text == 'no'", "effect": "deny"}]})
    session = await gw.initialize()
    assert "echo" in await gw.tools(session)


async def test_a_reload_takes_effect_and_tells_sessions_their_list_changed(gw: Gateway) -> None:
    session = await gw.initialize()
    assert "secret_tool" not in await gw.tools(session)
    assert await gw.reload(DENY_ECHO)
    assert gw.publisher.named(events.POLICY_LOADED)
    resp = await gw.client.post("/mcp", data=json.dumps({"jsonrpc": "2.0", "id": 5, "method": "ping"}),
                                headers={"Content-Type": "application/json", "Accept": ACCEPT,
                                         "Mcp-Session-Id": session})
    assert "notifications/tools/list_changed" in await resp.text()  # owed ahead of its next answer
    listed = await gw.tools(session)
    assert "secret_tool" in listed
    assert "echo" not in listed
    assert (await gw.call(session, "echo"))["error"]["data"]["rule"] == "no-echo"


async def test_a_reload_that_changes_only_a_reason_tells_no_session(gw: Gateway) -> None:
    session = await gw.initialize()
    await gw.tools(session)
    assert await gw.reload({"rules": [{**DENY_SECRET["rules"][0], "reason": "reworded"}]})
    resp = await gw.client.post("/mcp", data=json.dumps({"jsonrpc": "2.0", "id": 5, "method": "ping"}),
                                headers={"Content-Type": "application/json", "Accept": ACCEPT,
                                         "Mcp-Session-Id": session})
    assert "list_changed" not in await resp.text()


@pytest.mark.parametrize("bad", [
    pytest.param("rules: [", id="not-yaml"),
    pytest.param(json.dumps({"rules": [{"name": "x", "when": "args.(", "effect": "deny"}]}), id="bad-cel"),
    pytest.param("", id="emptied"),
])
async def test_a_bad_file_at_runtime_keeps_the_last_good_policy(gw: Gateway, bad: str) -> None:
    session = await gw.initialize()
    gw.policy_file.write_text(bad)
    app = gw.client.app
    assert app is not None
    assert not await app[POLICY_FILE].check()
    assert gw.publisher.named(events.POLICY_REJECTED)
    assert (await gw.call(session, "secret_tool"))["error"]["data"]["rule"] == "no-secrets"
    assert (await gw.client.get("/readyz")).status == 200


async def test_a_deleted_file_keeps_the_last_good_policy(gw: Gateway) -> None:
    session = await gw.initialize()
    gw.policy_file.unlink()
    app = gw.client.app
    assert app is not None
    assert not await app[POLICY_FILE].check()
    assert (await gw.call(session, "secret_tool"))["error"]["data"]["error"] == "policy_denied"


async def test_no_call_sees_half_a_policy_while_the_file_is_rewritten(gw: Gateway) -> None:
    """Two policies that each deny exactly one of two tools: under a reload, every call is judged wholly by one
    of them, so at no moment are both tools (or neither) refused for the same decision."""
    deny_a = {"rules": [{"name": "deny-echo", "tools": ["echo"], "effect": "deny"},
                        {"name": "allow-rest", "effect": "allow"}]}
    deny_b = {"rules": [{"name": "deny-secret", "tools": ["secret_tool"], "effect": "deny"},
                        {"name": "allow-rest", "effect": "allow"}]}
    session = await gw.initialize()
    app = gw.client.app
    assert app is not None
    guard_file = app[POLICY_FILE]

    async def rewrite() -> None:
        for i in range(20):
            write_policy(gw.policy_file, deny_a if i % 2 else deny_b)
            await guard_file.check()

    calls = [gw.call(session, "echo" if i % 2 else "secret_tool", i) for i in range(100)]
    answers, _ = await asyncio.gather(asyncio.gather(*calls), rewrite())
    for answer in answers:
        if "error" in answer:
            assert answer["error"]["data"]["rule"] in {"deny-echo", "deny-secret", "no-secrets"}
        assert answer.get("error", {}).get("data", {}).get("error") != "policy_error"


def test_a_bad_file_at_start_stops_the_app_in_one_line_naming_rule_and_position(tmp_path: Path) -> None:
    policy_file = tmp_path / "policy.yaml"
    policy_file.write_text("rules:\n  - name: broken\n    when: 'args.repo =='\n    effect: deny\n")
    with pytest.raises(ConfigError) as caught:
        create_app(Settings(policy_file=policy_file), authenticator=NoAuthenticator(), pool=FakePool(),
                   policy=AllowAllPolicy(), publisher=RecordingPublisher())
    message = str(caught.value)
    assert "\n" not in message
    assert str(policy_file) in message
    assert "'broken'" in message
    assert "line 1, column" in message
