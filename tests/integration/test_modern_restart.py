"""After a 2026-07-28 upstream restarts (a stdio child that crashed, an HTTP server killed and started again), a
session still gets what it asked for: the resource it subscribed to (the gateway asks the new child, or the new
server, for the same URIs on its ``subscriptions/listen`` stream) and log messages at the level it set (a 2026
upstream gets the level on every request, so nothing is forgotten), through the official SDK client."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx2
import mcp_types as types
import pytest
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from tests.conftest import HttpUpstreamProcess
from tests.integration.test_gateway_with_sdk import (
    CALL_TIMEOUT,
    SETTLE_TIMEOUT,
    TOKEN,
    gateway_settings,
    http_upstream,
    serving,
    stdio_upstream,
)

pytestmark = [pytest.mark.process, pytest.mark.filterwarnings("ignore:resources/(un)?subscribe is removed")]

URI = "memo://alpha/readme"


class Agent:
    """An SDK client that keeps the resource updates and the log messages it is sent."""

    def __init__(self) -> None:
        self.updates: asyncio.Queue[str] = asyncio.Queue()
        self.logged: asyncio.Queue[str] = asyncio.Queue()
        self.session: ClientSession | None = None

    async def on_message(self, message: Any) -> None:
        if isinstance(message, types.ResourceUpdatedNotification):
            await self.updates.put(str(message.params.uri))

    async def on_log(self, params: types.LoggingMessageNotificationParams) -> None:
        await self.logged.put(str(params.data))

    async def call(self, tool: str, **arguments: Any) -> None:
        assert self.session is not None
        result = await asyncio.wait_for(self.session.call_tool(tool, arguments), CALL_TIMEOUT)
        if result.is_error:
            raise MCPError(-1, "tool error")


@contextlib.asynccontextmanager
async def connect(url: str) -> AsyncIterator[Agent]:
    agent = Agent()
    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {TOKEN}"}, trust_env=False,
                              timeout=httpx2.Timeout(CALL_TIMEOUT))
    async with (http, streamable_http_client(f"{url}/mcp", http_client=http) as (read, write),
                ClientSession(read, write, read_timeout_seconds=CALL_TIMEOUT, message_handler=agent.on_message,
                              logging_callback=agent.on_log) as session):
        await asyncio.wait_for(session.initialize(), CALL_TIMEOUT)
        agent.session = session
        yield agent


async def until_served(agent: Agent, tool: str, **arguments: Any) -> None:
    """Call until the restarted upstream answers (calls during the restart fail, as a crash gives)."""
    async with asyncio.timeout(SETTLE_TIMEOUT):
        while True:
            with contextlib.suppress(MCPError, TimeoutError):
                await agent.call(tool, **arguments)
                return


async def still_subscribed_and_at_its_level(agent: Agent) -> None:
    """What the session asked for before the restart still holds after it."""
    async with asyncio.timeout(SETTLE_TIMEOUT):
        while agent.updates.empty():  # the listen stream is reopened with the URI once the upstream is back
            await until_served(agent, "stream_touch", uri=URI)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(0.5):
                    await agent.updates.put(await agent.updates.get())
    assert agent.updates.get_nowait() == URI
    while not agent.logged.empty():
        agent.logged.get_nowait()
    await until_served(agent, "relay_log", tag="after")  # it logs at debug, info, warning and error
    await agent.call("relay_log", tag="again")
    got = [await asyncio.wait_for(agent.logged.get(), SETTLE_TIMEOUT) for _ in range(2)]
    assert got == ["error after", "error again"]  # at the session's level and above only, as before


async def test_a_crashed_2026_stdio_child_is_asked_again_for_the_subscribed_uri() -> None:
    settings = gateway_settings({"alpha": stdio_upstream("--name", "alpha", "--modern-only")})
    async with serving(settings) as url, connect(url) as agent:
        assert agent.session is not None
        await asyncio.wait_for(agent.session.subscribe_resource(URI), CALL_TIMEOUT)
        await asyncio.wait_for(agent.session.set_logging_level("error"), CALL_TIMEOUT)
        with pytest.raises(MCPError):
            await agent.call("crash")  # the child dies; the gateway starts a fresh one with empty memory
        await still_subscribed_and_at_its_level(agent)


async def test_a_2026_http_upstream_killed_and_started_again_is_asked_again_for_the_subscribed_uri() -> None:
    upstream = HttpUpstreamProcess("--name", "alpha", "--modern-only").start()
    try:
        async with serving(gateway_settings({"alpha": http_upstream(upstream.url)})) as url, connect(url) as agent:
            assert agent.session is not None
            await asyncio.wait_for(agent.session.subscribe_resource(URI), CALL_TIMEOUT)
            await asyncio.wait_for(agent.session.set_logging_level("error"), CALL_TIMEOUT)
            upstream.restart()  # a new process on the same port: it has forgotten every listen stream
            await still_subscribed_and_at_its_level(agent)
    finally:
        upstream.stop()


@pytest.mark.parametrize(("era", "isolation"), [("both", "shared"), ("2025", "session"), ("2026", "session"),
                                                 ("both", "session")])
async def test_a_crashed_child_of_any_era_or_isolation_is_asked_again_for_the_subscribed_uri(
        era: str, isolation: str) -> None:
    """A dual-revision child, and a session's own child (isolation) of each era, keep what the session set."""
    settings = gateway_settings({"alpha": stdio_upstream("--name", "alpha", "--era", era, isolation=isolation)})
    async with serving(settings) as url, connect(url) as agent:
        assert agent.session is not None
        await asyncio.wait_for(agent.session.subscribe_resource(URI), CALL_TIMEOUT)
        await asyncio.wait_for(agent.session.set_logging_level("error"), CALL_TIMEOUT)
        with pytest.raises(MCPError):
            await agent.call("crash")
        await still_subscribed_and_at_its_level(agent)
        if era != "2026":  # a 2025 session's child announces a touch to its caller anyway: ask it what it holds
            assert URI in json.loads(await text_of(agent, "stream_subscribed"))


async def text_of(agent: Agent, tool: str) -> str:
    assert agent.session is not None
    result = await asyncio.wait_for(agent.session.call_tool(tool, {}), CALL_TIMEOUT)
    [content] = result.content
    assert isinstance(content, types.TextContent)
    return content.text
