"""Hole 10 end to end: a real gateway (create_app, real upstream pool, real policy) in front of the real MCP
test upstream over stdio. A token's ``resources``/``prompts`` caveats decide what it reads and sees, and
resources, prompts and completions count against its rate limit like tool calls.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from pydantic import SecretStr

from satgate_mcp import jsonrpc
from satgate_mcp.app import create_app
from satgate_mcp.auth.macaroons import mint_token
from satgate_mcp.events import RecordingPublisher
from satgate_mcp.jsonrpc import JsonObj
from satgate_mcp.settings import Settings
from tests.conftest import upstream_command

KEY = "scopes-http-tests-root-key-0123456789abcdef"
#: Requests each token may make per minute (and at once): the flood test sends one more.
RATE = 4
READY_TIMEOUT = 20.0
READY_POLL = 0.05

Client = TestClient[web.Request, web.Application]

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.process]


def gateway_settings() -> Settings:
    """Header mode, a rate limit, one stdio upstream; nothing from the test runner's own SATGATE_* environment."""
    values: dict[str, Any] = {
        "auth_mode": "header", "root_key": SecretStr(KEY), "rate_limit": f"{RATE}/m", "rate_burst": RATE,
        "upstreams": {"alpha": {"transport": "stdio", "command": upstream_command("--name", "alpha")}},
    }
    with pytest.MonkeyPatch.context() as env:
        for key in list(os.environ):
            if key.startswith("SATGATE_"):
                env.delenv(key)
        return Settings(**values, state_dir="memory")  # no state folder in the repository


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def client() -> AsyncIterator[Client]:
    """One gateway (and one upstream child) for the module; each test uses token ids of its own."""
    async with TestClient(TestServer(create_app(gateway_settings(), publisher=RecordingPublisher()))) as gateway:
        async with asyncio.timeout(READY_TIMEOUT):  # a child process starting: nothing to await but readiness
            while True:
                if (await gateway.get("/readyz")).status == 200:
                    break
                await asyncio.sleep(READY_POLL)
        yield gateway


class Agent:
    def __init__(self, client: Client, token: str) -> None:
        self.client, self.token, self.session, self.next_id = client, token, "", 1

    async def rpc(self, method: str, params: JsonObj | None = None) -> Any:
        headers = {"Authorization": f"Bearer {self.token}", "Accept": "application/json",
                   "Content-Type": "application/json", "MCP-Protocol-Version": "2025-06-18"}
        if self.session:
            headers["Mcp-Session-Id"] = self.session
        self.next_id += 1
        message = jsonrpc.request_message(self.next_id, method, params)
        async with self.client.post("/mcp", data=json.dumps(message), headers=headers) as resp:
            assert resp.status == 200, await resp.text()
            if method == "initialize":
                self.session = resp.headers["Mcp-Session-Id"]
            return await resp.json()

    @classmethod
    async def connect(cls, client: Client, token: str) -> Agent:
        agent = cls(client, token)
        await agent.rpc("initialize", {"protocolVersion": "2025-06-18", "capabilities": {},
                                       "clientInfo": {"name": "scopes", "version": "1"}})
        return agent


def error_of(reply: Any) -> str:
    return str(reply["error"]["data"]["error"])


async def test_attack_token_without_resource_scope_reads_a_resource_over_http(client: Client) -> None:
    token = mint_token(KEY, "notes-only", resources=["memo://alpha/notes/*"], prompts=["nothing"])
    agent = await Agent.connect(client, token)

    assert error_of(await agent.rpc("resources/read", {"uri": "memo://alpha/readme"})) == "resource_not_allowed"
    assert error_of(await agent.rpc("prompts/get", {"name": "greet", "arguments": {"who": "x"}})) == \
        "prompt_not_allowed"
    completion = {"ref": {"type": "ref/prompt", "name": "greet"}, "argument": {"name": "who", "value": "a"}}
    assert error_of(await agent.rpc("completion/complete", completion)) == "prompt_not_allowed"

    assert (await agent.rpc("resources/list"))["result"]["resources"] == []
    assert (await agent.rpc("prompts/list"))["result"]["prompts"] == []
    [template] = (await agent.rpc("resources/templates/list"))["result"]["resourceTemplates"]
    assert template["uriTemplate"] == "memo://alpha/notes/{id}"
    read = await agent.rpc("resources/read", {"uri": "memo://alpha/notes/7"})
    assert read["result"]["contents"][0]["text"] == "hello from alpha: memo://alpha/notes/7"


async def test_a_token_without_scope_caveats_reads_and_sees_everything(client: Client) -> None:
    agent = await Agent.connect(client, mint_token(KEY, "everything"))
    [resource] = (await agent.rpc("resources/list"))["result"]["resources"]
    assert resource["uri"] == "memo://alpha/readme"
    assert "result" in await agent.rpc("resources/read", {"uri": "memo://alpha/readme"})


@pytest.mark.parametrize(
    ("method", "params"),
    [
        pytest.param("resources/read", {"uri": "memo://alpha/readme"}, id="read"),
        pytest.param("prompts/get", {"name": "greet", "arguments": {"who": "x"}}, id="prompt"),
        pytest.param("resources/list", None, id="list"),
    ],
)
async def test_attack_resources_read_floods_bypass_rate_limit_over_http(client: Client, method: str,
                                                                        params: JsonObj | None) -> None:
    agent = await Agent.connect(client, mint_token(KEY, f"flooder-{method.replace('/', '-')}"))
    for _ in range(RATE):
        assert "result" in await agent.rpc(method, params)
    flood = await agent.rpc(method, params)
    assert flood["error"]["code"] == jsonrpc.RATE_LIMITED
    assert error_of(flood) == "rate_limited"
    assert "result" in await agent.rpc("tools/list"), "the gateway's own listing costs nothing"
    other = await Agent.connect(client, mint_token(KEY, f"bystander-{method.replace('/', '-')}"))
    assert "result" in await other.rpc(method, params), "another token has its own allowance"
