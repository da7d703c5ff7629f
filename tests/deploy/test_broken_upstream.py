"""One stdio upstream whose command exits at once must not keep the gateway from listening (issue 23).

The rules: the gateway listens without waiting out start-up timeouts for a child that already exited; it serves
the upstreams that work, and a call to one of the broken one's tools says it is down; ``/readyz`` answers 503
naming the broken one with its exit status and last stderr line; one warning line says so at start. The process
test waits on the gateway's log lines (``listening``), never on sleeps.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Mapping

import httpx2
import pytest
from mcp.shared.exceptions import MCPError

from satgate_mcp import jsonrpc
from satgate_mcp.daemon.runner import READY_WAIT_SECONDS, settled
from satgate_mcp.errors import GatewayError, UnknownTarget, UpstreamUnavailable
from satgate_mcp.upstream.surface import unlisted_tool
from tests.conftest import upstream_command
from tests.deploy.harness import Gateways, free_port, gateway_env, mcp_session, token
from tests.gateway_process import call_text

BROKEN = [sys.executable, "-c", "import sys; sys.stderr.write('boom: no config\\n'); sys.exit(3)"]
CALL_TIMEOUT = 15.0
#: Listening must come well before the old wait for a broken upstream (READY_WAIT_SECONDS and more) ran out.
LISTEN_WITHIN = 15.0


@pytest.mark.parametrize(("readiness", "failures", "expected"), [
    pytest.param({}, {}, True, id="no-upstreams"),
    pytest.param({"a": True, "b": True}, {}, True, id="all-ready"),
    pytest.param({"a": True, "b": False}, {}, False, id="one-still-starting"),
    pytest.param({"a": True, "b": False}, {"b": {"status": "exited with status 3"}}, True, id="one-down"),
    pytest.param({"a": False, "b": False}, {"b": {"status": "exited with status 3"}}, False,
                 id="one-down-one-starting"),
])
def test_start_up_waits_only_for_upstreams_that_may_still_come_up(
        readiness: dict[str, bool], failures: dict[str, dict[str, str]], expected: bool) -> None:
    assert settled(readiness, failures) is expected


DOWN = {"status": "exited with status 3", "stderr": "boom: no config"}


@pytest.mark.parametrize(("name", "down", "prefixes", "expected"), [
    pytest.param("nope", {}, {}, (UnknownTarget, "Unknown tool: nope", {"error": "unknown_tool", "tool": "nope"}),
                 id="nothing-down"),
    pytest.param("b_echo", {"broken": DOWN}, {"broken": "b_"},
                 (UpstreamUnavailable,
                  "Tool 'b_echo' belongs to upstream 'broken', which is down (exited with status 3)",
                  {"error": "upstream_unavailable", "upstream": "broken", "tool": "b_echo",
                   "status": "exited with status 3"}), id="prefix-of-a-down-upstream"),
    pytest.param("db_query", {"d": DOWN, "db": DOWN}, {"d": "d", "db": "db_"},
                 (UpstreamUnavailable, "Tool 'db_query' belongs to upstream 'db'", None), id="longest-prefix-wins"),
    pytest.param("db_query", {"d": DOWN}, {"d": "d", "db": "db_"},
                 (UnknownTarget, "Unknown tool: db_query", {"error": "unknown_tool", "tool": "db_query"}),
                 id="a-longer-prefix-of-an-upstream-that-is-up"),
    pytest.param("echo", {"broken": DOWN}, {"broken": "b_"},
                 (UnknownTarget, "Unknown tool: echo", {"error": "unknown_tool", "tool": "echo"}),
                 id="another-prefix-is-not-its-own"),
    pytest.param("search", {"broken": DOWN}, {"broken": ""},
                 (UnknownTarget, "Unknown tool: search (perhaps one of upstream 'broken', down",
                  {"error": "unknown_tool", "tool": "search", "down": ["broken"]}), id="unprefixed-down-upstream"),
    pytest.param("search", {"a": DOWN, "b": DOWN}, {},
                 (UnknownTarget, "perhaps one of upstreams 'a', 'b', down", None), id="several-unprefixed-down"),
])
def test_a_tool_nobody_lists_names_the_down_upstream_that_may_own_it(
        name: str, down: Mapping[str, Mapping[str, str]], prefixes: Mapping[str, str],
        expected: tuple[type[GatewayError], str, dict[str, object] | None]) -> None:
    kind, message, data = expected
    error = unlisted_tool(name, down, prefixes)
    assert type(error) is kind
    assert error.message.startswith(message) or message in error.message
    assert "boom" not in error.message  # the stderr line is the operator's (logs, /readyz), not the agent's
    if data is not None:
        assert error.data == data


@pytest.mark.process
async def test_a_child_that_exits_at_once_is_named_in_readyz_and_the_others_are_served(gateways: Gateways) -> None:
    port = free_port()
    upstreams = {"t": {"transport": "stdio", "command": upstream_command()},
                 "broken": {"transport": "stdio", "command": BROKEN, "tool_prefix": "b_"}}
    gateway = await gateways.start(gateway_env(port, SATGATE_UPSTREAMS=json.dumps(upstreams)), name="gateway")

    assert LISTEN_WITHIN < READY_WAIT_SECONDS
    listening = await gateway.wait_event("listening", timeout=LISTEN_WITHIN)
    assert listening["ready"] is False
    [warning] = gateway.find("upstreams_down")  # logged once, before listening
    assert warning["level"] == "warning"
    assert warning["upstreams"] == {"broken": DOWN}

    async with httpx2.AsyncClient(trust_env=False, timeout=CALL_TIMEOUT) as http:
        ready = await http.get(f"http://127.0.0.1:{port}/readyz")
    assert ready.status_code == 503
    assert ready.json() == {"status": "upstream_down", "upstreams": {"t": True, "broken": False},
                            "down": {"broken": DOWN}}

    async with mcp_session(f"http://127.0.0.1:{port}/mcp", token()) as session:
        assert await call_text(session, "echo", {"text": "still served"}, timeout=CALL_TIMEOUT) == "still served"
        with pytest.raises(MCPError) as refused:
            await asyncio.wait_for(session.call_tool("b_echo", {"text": "x"}), CALL_TIMEOUT)
    assert refused.value.code == jsonrpc.UPSTREAM_UNAVAILABLE
    assert "upstream 'broken', which is down (exited with status 3)" in refused.value.message
    assert len(gateway.find("upstreams_down")) == 1
