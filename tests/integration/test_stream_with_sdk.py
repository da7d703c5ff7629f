"""What upstreams say outside any call, and about themselves, as the official SDK client sees it.

One gateway (``config`` auth) in front of ``alpha`` (stdio), ``beta`` (stdio, gateway ``tool_prefix``
``b_``, which prefixes its prompt too) and ``web`` (Streamable HTTP, names ``web_*`` from the server
itself). Each SDK client opens its GET stream after initialize, as the SDK does on its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx2
import mcp_types as types
import pytest
import pytest_asyncio
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client

from satgate_mcp.errors import ConfigError
from satgate_mcp.paging import LIST_PAGE_SIZE
from tests.conftest import HttpUpstreamProcess
from tests.integration.test_gateway_with_sdk import (
    CALL_TIMEOUT,
    SETTLE_TIMEOUT,
    TOKEN,
    gateway_settings,
    http_upstream,
    serving,
    sole,
    stdio_upstream,
)

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.process]


class StreamWire(httpx2.AsyncBaseTransport):
    """Real HTTP; notes the session id and when the GET stream was answered 200 (it is open from then on)."""

    def __init__(self) -> None:
        self._inner = httpx2.AsyncHTTPTransport(trust_env=False)
        self.stream_open = asyncio.Event()
        self.session_id: str | None = None

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        response = await self._inner.handle_async_request(request)
        self.session_id = response.headers.get("mcp-session-id") or self.session_id
        if request.method == "GET" and response.status_code == 200:
            self.stream_open.set()
        return response

    async def aclose(self) -> None:
        await self._inner.aclose()


@dataclass
class Agent:
    session: ClientSession
    wire: StreamWire
    init: types.InitializeResult
    notices: asyncio.Queue[types.ServerNotification] = field(default_factory=asyncio.Queue)

    async def text(self, tool: str, **arguments: Any) -> str:
        result = await asyncio.wait_for(self.session.call_tool(tool, arguments), CALL_TIMEOUT)
        assert not result.is_error, result
        [content] = result.content
        assert isinstance(content, types.TextContent)
        return content.text

    async def notice(self) -> types.ServerNotification:
        return await asyncio.wait_for(self.notices.get(), SETTLE_TIMEOUT)


@contextlib.asynccontextmanager
async def connect(url: str) -> AsyncIterator[Agent]:
    wire = StreamWire()
    notices: asyncio.Queue[types.ServerNotification] = asyncio.Queue()

    async def on_message(message: Any) -> None:
        if isinstance(message, (types.ResourceUpdatedNotification, types.ResourceListChangedNotification,
                                types.PromptListChangedNotification, types.ToolListChangedNotification)):
            await notices.put(message)

    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {TOKEN}"}, transport=wire, trust_env=False,
                              timeout=httpx2.Timeout(CALL_TIMEOUT))
    try:
        async with (http, streamable_http_client(f"{url}/mcp", http_client=http) as (read, write),
                    ClientSession(read, write, read_timeout_seconds=CALL_TIMEOUT, message_handler=on_message)
                    as session):
            init = await asyncio.wait_for(session.initialize(), CALL_TIMEOUT)
            await asyncio.wait_for(wire.stream_open.wait(), CALL_TIMEOUT)
            yield Agent(session, wire, init, notices)
    except BaseExceptionGroup as group:
        raise sole(group) from None


@dataclass
class Gateway:
    url: str
    web: HttpUpstreamProcess


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def gateway(web: HttpUpstreamProcess) -> AsyncIterator[Gateway]:
    settings = gateway_settings({
        "alpha": stdio_upstream("--name", "alpha"),
        "beta": stdio_upstream("--name", "beta", tool_prefix="b_"),
        "web": http_upstream(web.url),
    })
    async with serving(settings) as url:
        yield Gateway(url, web)


async def subscribed_upstream(agent: Agent, tool: str, expected: list[str]) -> list[str]:
    """What the upstream holds, asked again (bounded) until it is ``expected``: an unsubscribe may be on its way."""
    async with asyncio.timeout(SETTLE_TIMEOUT):
        while (held := json.loads(await agent.text(tool))) != expected:
            pass
    return list(held)


@pytest.mark.filterwarnings("ignore:resources/(un)?subscribe is removed as of 2026-07-28")
@pytest.mark.parametrize(("prefix", "uri"), [pytest.param("", "memo://alpha/readme", id="stdio"),
                                             pytest.param("web_", "memo://web/readme", id="http")])
async def test_two_sessions_subscribe_and_one_unsubscribing_leaves_the_other_its_updates(
        gateway: Gateway, prefix: str, uri: str) -> None:
    async with connect(gateway.url) as leaver, connect(gateway.url) as stayer:
        caps = leaver.init.capabilities.resources
        assert caps is not None
        assert caps.subscribe is True
        await asyncio.wait_for(leaver.session.subscribe_resource(uri), CALL_TIMEOUT)
        await asyncio.wait_for(stayer.session.subscribe_resource(uri), CALL_TIMEOUT)
        assert await subscribed_upstream(leaver, f"{prefix}stream_subscribed", [uri]) == [uri]  # once, not twice

        await asyncio.wait_for(leaver.session.unsubscribe_resource(uri), CALL_TIMEOUT)
        assert json.loads(await leaver.text(f"{prefix}stream_subscribed")) == [uri]
        await leaver.text(f"{prefix}stream_touch", uri=uri)

        updated = await stayer.notice()
        assert isinstance(updated, types.ResourceUpdatedNotification)
        assert str(updated.params.uri) == uri
        await leaver.text(f"{prefix}stream_add_prompt", name=f"{prefix}marker_{id(leaver)}")
        # the leaver's first notice is the prompt list change that followed: it got no update
        assert isinstance(await leaver.notice(), types.PromptListChangedNotification)
        assert isinstance(await stayer.notice(), types.PromptListChangedNotification)

    async with connect(gateway.url) as checker:  # both sessions ended: the upstream subscription went with them
        assert await subscribed_upstream(checker, f"{prefix}stream_subscribed", []) == []


async def test_a_list_change_reaches_the_open_get_stream(gateway: Gateway) -> None:
    async with connect(gateway.url) as agent:
        prompts = agent.init.capabilities.prompts
        assert prompts is not None
        assert prompts.list_changed is True
        await agent.text("web_stream_add_prompt", name="fresh_prompt")
        assert isinstance(await agent.notice(), types.PromptListChangedNotification)
        listed = await asyncio.wait_for(agent.session.list_prompts(), CALL_TIMEOUT)
        assert "fresh_prompt" in {p.name for p in listed.prompts}


async def test_a_second_stream_for_one_session_gets_409(gateway: Gateway) -> None:
    async with connect(gateway.url) as agent:
        assert agent.wire.session_id is not None
        async with httpx2.AsyncClient(trust_env=False, timeout=httpx2.Timeout(5.0)) as raw:
            second = await raw.get(f"{gateway.url}/mcp", headers={
                "Authorization": f"Bearer {TOKEN}", "Accept": "text/event-stream",
                "Mcp-Session-Id": agent.wire.session_id, "MCP-Protocol-Version": agent.init.protocol_version})
        assert second.status_code == 409
        assert second.json()["error"]["data"]["error"] == "stream_already_open"
        assert await agent.text("echo", text="still served") == "still served"


async def test_every_upstreams_instructions_reach_the_client_under_its_name(gateway: Gateway) -> None:
    async with connect(gateway.url) as agent:
        assert agent.init.instructions == (
            "## alpha\nTools of the alpha test server.\n\n"
            "## beta\nTools of the beta test server.\n\n"
            "## web\nTools of the web test server.")


async def test_a_prompt_of_the_same_name_is_prefixed_like_tools(gateway: Gateway) -> None:
    async with connect(gateway.url) as agent:
        listed = await asyncio.wait_for(agent.session.list_prompts(), CALL_TIMEOUT)
        assert {"greet", "b_greet", "web_greet"} <= {p.name for p in listed.prompts}
        got = await asyncio.wait_for(agent.session.get_prompt("b_greet", {"who": "ann"}), CALL_TIMEOUT)
        [message] = got.messages
        assert isinstance(message.content, types.TextContent)
        assert message.content.text == "beta greets ann"  # the upstream was asked under its own name


async def test_a_prompt_clash_without_a_prefix_stops_start(web: HttpUpstreamProcess) -> None:
    clash = gateway_settings({"one": stdio_upstream("--name", "one", "--prefix", "one_"),
                              "two": stdio_upstream("--name", "two", "--prefix", "one_")})
    with pytest.raises(ConfigError) as caught:
        async with serving(clash):
            pytest.fail("the gateway started with clashing prompt names")
    assert "prompt 'one_greet'" in str(caught.value)
    assert "tool_prefix" in str(caught.value)


async def test_resources_list_pages_with_a_cursor(gateway: Gateway) -> None:
    async with connect(gateway.url) as agent:
        extra = LIST_PAGE_SIZE + 20
        await agent.text("b_stream_add_resources", count=extra)
        pages: list[int] = []
        uris: set[str] = set()
        cursor: str | None = None
        while True:
            params = types.PaginatedRequestParams(cursor=cursor) if cursor else None
            listed = await asyncio.wait_for(agent.session.list_resources(params=params), CALL_TIMEOUT)
            pages.append(len(listed.resources))
            uris |= {str(r.uri) for r in listed.resources}
            cursor = listed.next_cursor
            if cursor is None:
                break
        assert pages == [LIST_PAGE_SIZE, extra + 3 - LIST_PAGE_SIZE]
        assert {f"memo://beta/extra/{i}" for i in range(extra)} <= uris


@pytest.mark.filterwarnings("ignore:resources/(un)?subscribe is removed as of 2026-07-28")
async def test_a_restarted_upstream_is_told_again_the_log_level_and_the_subscriptions_it_forgot() -> None:
    from mcp.shared.exceptions import MCPError

    uri = "memo://alpha/readme"
    async with serving(gateway_settings({"alpha": stdio_upstream("--name", "alpha")})) as url, \
            connect(url) as agent:
        await asyncio.wait_for(agent.session.subscribe_resource(uri), CALL_TIMEOUT)
        await asyncio.wait_for(agent.session.set_logging_level("error"), CALL_TIMEOUT)
        assert await agent.text("relay_log_level") == "error"
        with pytest.raises(MCPError):
            await agent.text("crash")  # the child dies; the gateway starts a fresh one with empty memory

        async def told_again() -> tuple[str, list[str]]:
            while True:
                try:
                    level = await agent.text("relay_log_level")
                    held = json.loads(await agent.text("stream_subscribed"))
                except MCPError:
                    continue  # still restarting
                if level != "None" and held:
                    return level, held

        level, held = await asyncio.wait_for(told_again(), SETTLE_TIMEOUT)
        assert (level, held) == ("error", [uri])
        await agent.text("stream_touch", uri=uri)
        updated = await agent.notice()
        assert isinstance(updated, types.ResourceUpdatedNotification)
