"""A 2026-07-28 client's ``subscriptions/listen`` stream hears every change, from upstreams of either era (issue 25).

Real upstreams (tests/upstream_server.py ``--era 2025``, ``--era 2026`` and ``--era both``, over stdio and over
Streamable HTTP) behind a real ``python -m satgate_mcp serve``. The upstream announces each change in the era of
the call that made it, as the SDK's MCPServer does: a 2025 session's call on its session, a 2026-07-28 call on
its listen streams only. So a dual-revision upstream's change made by a 2026 client is heard only when the gateway
listens to that upstream's 2026-07-28 side too, and (over stdio, where that side is a second child) lists it there.
The client is raw HTTP: it reads the stream's frames exactly as sent.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx2
import pytest

from tests.conftest import upstream_command
from tests.gateway_process import GatewayProcess, call_text, child_pids, sdk_session
from tests.integration.front import gateway_in_front
from tests.integration.test_mrtr_sdk import mint

pytestmark = pytest.mark.process

ROOT_KEY = "e2e-listen-eras-root-key-0123456789abcdef"
TIMEOUT = 20.0
MODERN = "2026-07-28"
META = {"io.modelcontextprotocol/protocolVersion": MODERN, "io.modelcontextprotocol/clientCapabilities": {}}
README = "memo://u/readme"
WANTED = {"toolsListChanged": True, "promptsListChanged": True, "resourcesListChanged": True,
          "resourceSubscriptions": [README]}
#: (tool, arguments): each changes one list, or touches the subscribed resource.
CHANGES: list[tuple[str, dict[str, Any]]] = [
    ("add_tool", {"name": "added_tool", "standalone": True}), ("stream_add_prompt", {"name": "added_prompt"}),
    ("stream_add_resources", {"count": 1}), ("stream_touch", {"uri": README})]
HEARD = {"notifications/tools/list_changed", "notifications/prompts/list_changed",
         "notifications/resources/list_changed", "notifications/resources/updated"}


@pytest.fixture(params=[(era, transport) for era in ("2025", "2026", "both") for transport in ("stdio", "http")],
                ids=lambda p: f"{p[0]}-{p[1]}")
async def gateway(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[GatewayProcess]:
    era, transport = request.param
    async with gateway_in_front(tmp_path, root_key=ROOT_KEY, name="u", transport=transport,
                                args=("--name", "u", "--era", era)) as gw:
        yield gw


def _headers(token: str, method: str, name: str | None = None) -> dict[str, str]:
    headers = {"Authorization": f"Bearer {token}", "Accept": "text/event-stream, application/json",
               "MCP-Protocol-Version": MODERN, "Mcp-Method": method}
    return headers | ({"Mcp-Name": name} if name is not None else {})


async def _frames(lines: AsyncIterator[str], found: list[Any], until: int) -> None:
    while len(found) < until:
        line = await anext(lines)
        found += [json.loads(line[5:])] if line.startswith("data:") else []


async def _modern_call(http: httpx2.AsyncClient, url: str, token: str, tool: str, arguments: dict[str, Any]) -> Any:
    body = {"jsonrpc": "2.0", "id": tool, "method": "tools/call",
            "params": {"_meta": META, "name": tool, "arguments": arguments}}
    answer = await http.post(url, json=body, headers=_headers(token, "tools/call", tool))
    data = [line[5:] for line in answer.text.splitlines() if line.startswith("data:")] or [answer.text]
    return json.loads(data[-1])


async def _listen_while(gw: GatewayProcess, token: str, change: Any) -> list[Any]:
    """Open a listen stream asking for everything, run ``change()`` once it is acknowledged, and return its frames
    until one of each kind of change arrived."""
    listen = {"jsonrpc": "2.0", "id": "sub-1", "method": "subscriptions/listen",
              "params": {"_meta": META, "notifications": WANTED}}
    frames: list[Any] = []
    async with (httpx2.AsyncClient(trust_env=False, timeout=TIMEOUT) as http,
                http.stream("POST", f"{gw.url}/mcp", json=listen, headers=_headers(token, "subscriptions/listen"))
                as stream):
        lines = stream.aiter_lines()
        async with asyncio.timeout(TIMEOUT):
            await _frames(lines, frames, 1)
            await change(http)
            while not {f.get("method") for f in frames[1:]} >= HEARD:
                await _frames(lines, frames, len(frames) + 1)
    return frames


async def test_every_list_change_and_the_subscribed_update_reach_the_listen_stream(gateway: GatewayProcess) -> None:
    token = await mint(gateway, "listener")

    async def change(http: httpx2.AsyncClient) -> None:
        for tool, arguments in CHANGES:
            assert "result" in await _modern_call(http, f"{gateway.url}/mcp", token, tool, arguments)

    ack, *notes = await _listen_while(gateway, token, change)
    assert ack["method"] == "notifications/subscriptions/acknowledged"
    assert ack["params"]["notifications"] == WANTED
    assert {n["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"] for n in notes} == {"sub-1"}
    assert {n["params"]["uri"] for n in notes if n["method"] == "notifications/resources/updated"} == {README}
    async with httpx2.AsyncClient(trust_env=False, timeout=TIMEOUT) as http:
        for method, key, name in (("tools/list", "tools", "added_tool"), ("prompts/list", "prompts", "added_prompt")):
            body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": {"_meta": META}}
            listed = (await http.post(f"{gateway.url}/mcp", json=body, headers=_headers(token, method))).json()
            names = [item["name"] for item in listed["result"][key]]
            assert name in names
            assert names == sorted(names)


async def test_a_2025_sessions_change_reaches_a_2026_listen_stream(gateway: GatewayProcess) -> None:
    """The other way round: the upstream announces on the gateway's 2025 session (or, for a 2026-only upstream,
    translated onto its listen stream)."""
    token = await mint(gateway, "both-eras")

    async def change(http: httpx2.AsyncClient) -> None:
        async with sdk_session(gateway.url, token, timeout=TIMEOUT) as session:
            for tool, arguments in CHANGES:
                await call_text(session, tool, arguments, timeout=TIMEOUT)

    ack, *notes = await _listen_while(gateway, token, change)
    assert ack["params"]["notifications"] == WANTED
    assert {n["method"] for n in notes} >= HEARD


async def test_a_2026_clients_discover_starts_the_dual_stdio_upstreams_2026_side(tmp_path: Path) -> None:
    """The first 2026 client's ``server/discover`` looks for the upstream's 2026-07-28 side in the background (over
    stdio a second child), so its first request does not wait for that child to start."""
    spec = {"transport": "stdio", "command": upstream_command("--name", "u", "--era", "both")}
    gw = GatewayProcess(tmp_path, root_key=ROOT_KEY, settings={"SATGATE_UPSTREAMS": json.dumps({"u": spec})})
    gw.start()
    try:
        await gw.wait_ready()
        assert gw.proc is not None
        assert len(child_pids(gw.proc.pid)) == 1
        token = await mint(gw, "discoverer")
        body = {"jsonrpc": "2.0", "id": 1, "method": "server/discover", "params": {"_meta": META}}
        async with httpx2.AsyncClient(trust_env=False, timeout=TIMEOUT) as http:
            found = await http.post(f"{gw.url}/mcp", json=body, headers=_headers(token, "server/discover"))
        assert "result" in found.json()
        async with asyncio.timeout(TIMEOUT):
            while len(child_pids(gw.proc.pid)) < 2:  # noqa: ASYNC110 (another process: nothing to await)
                await asyncio.sleep(0.05)
    finally:
        await gw.kill()
