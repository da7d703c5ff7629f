"""Pinned tool definitions across real processes: two ``serve`` processes on one state folder, and the operator's
``satgate-mcp tools pins`` / ``tools approve`` run as commands; an approval reaches a running gateway within a
second, announced to its sessions."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx2
import pytest

from tests.cluster.cluster import ROOT_KEY, Mcp
from tests.conftest import upstream_command
from tests.gateway_process import GatewayProcess, satgate_cli

pytestmark = pytest.mark.process

#: The promise is one second; the stream's own round trips get a little more.
APPROVAL = 1.5
TOOLS_CHANGED = b"notifications/tools/list_changed"


async def told(stream: httpx2.Response) -> None:
    """Read a session's GET stream until it announces a tools list change."""
    assert stream.status_code == 200
    seen = b""
    async for chunk in stream.aiter_bytes():
        seen += chunk
        if TOOLS_CHANGED in seen:
            return
    raise AssertionError("the stream ended before a tools list change")


async def test_tools_approve_reaches_a_running_gateway_within_a_second(tmp_path: Path,
                                                                       http: httpx2.AsyncClient) -> None:
    state = {"SATGATE_STATE_DIR": str(tmp_path / "state"), "SATGATE_TOOL_PINNING": "enforce"}
    first = GatewayProcess(tmp_path, root_key=ROOT_KEY, settings=state)
    # The same upstream name with every definition changed (its descriptions name another server).
    elsewhere = json.dumps({"t": {"transport": "stdio", "command": upstream_command("--name", "elsewhere")}})
    second = GatewayProcess(tmp_path, root_key=ROOT_KEY, settings={**state, "SATGATE_UPSTREAMS": elsewhere})
    try:
        first.start()
        await first.wait_ready()
        second.start()
        await second.wait_ready()
        agent = Mcp.mint(http, "pins-agent")
        one, two = await agent.initialize(first), await agent.initialize(second)
        assert (await agent.echo(first, one, 1, "pinned")).outcome == "served"
        refused = await agent.echo(second, two, 2, "changed")
        assert refused.outcome == "tool_definition_changed"
        assert "satgate-mcp tools approve t/echo" in refused.body["error"]["message"]
        env = {**second.cli_env, **state}
        listed = (await satgate_cli("tools", "pins", env=env)).splitlines()
        echo = next(line for line in listed if line.startswith("t/echo "))
        assert "changed (pending approval)" in echo
        assert "(description)" in echo
        stream_headers = {gw.url: {**agent.headers(session), "Accept": "text/event-stream"}
                          for gw, session in ((first, one), (second, two))}
        async with (http.stream("GET", f"{first.url}/mcp", headers=stream_headers[first.url]) as on_first,
                    http.stream("GET", f"{second.url}/mcp", headers=stream_headers[second.url]) as on_second):
            assert (await satgate_cli("tools", "approve", "t/echo", env=env)).startswith("approved t/echo")
            async with asyncio.timeout(APPROVAL):  # both processes, each told its sessions
                await asyncio.gather(told(on_first), told(on_second))
        assert (await agent.echo(second, two, 3, "approved")).outcome == "served"
        # One pin per tool: the definition approved is the second gateway's, so the first now holds its echo.
        assert (await agent.echo(first, one, 4, "old")).outcome == "tool_definition_changed"
    finally:
        await first.kill()
        await second.kill()
