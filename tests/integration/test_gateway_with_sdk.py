"""The whole gateway as an agent meets it: ``create_app`` on a real port, in front of real upstreams
(tests/upstream_server.py as stdio children and as a Streamable HTTP server process), driven over real
HTTP by the official ``mcp`` Python SDK client.

One gateway serves the module (``config`` auth, so every client carries a bearer token):

- ``alpha``: stdio, no prefix;
- ``beta``: stdio, gateway ``tool_prefix`` ``b_`` (its ``echo`` clashes with alpha's otherwise), and
  700 extra tools that it lists 100 per page;
- ``web``: Streamable HTTP, tools named ``web_*`` by the server itself, its own credential header and
  a short timeout.

The tests that disturb an upstream (timeout, crash, a dropped session, a restart) come last and leave it
ready again.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import Any, cast

import httpx2
import mcp_types as types
import pytest
import pytest_asyncio
from aiohttp.test_utils import TestServer
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp_types.version import LATEST_HANDSHAKE_VERSION
from prometheus_client.parser import text_string_to_metric_families

from satgate_mcp import SERVER_NAME, jsonrpc
from satgate_mcp.app import create_app
from satgate_mcp.errors import ConfigError
from satgate_mcp.events import UPSTREAM_RESTART, FanoutPublisher, LogPublisher, RecordingPublisher
from satgate_mcp.jsonrpc import JsonObj
from satgate_mcp.paging import TOOLS_PAGE_SIZE
from satgate_mcp.settings import Settings
from tests.conftest import HttpUpstreamProcess, upstream_command
from tests.upstream_server import BASE_TOOLS

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.process]

TOKEN = "integration-static-token-0123456789"
#: The web upstream's own credential, from the gateway's upstream config.
UPSTREAM_KEY = "web-upstream-own-credential"
MANY_TOOLS = 700
UPSTREAM_PAGE = 100
#: Bounds: one MCP call, a gateway (re)start with its upstream children, an upstream noticing a cancel.
CALL_TIMEOUT = 15.0
READY_TIMEOUT = 20.0
SETTLE_TIMEOUT = 5.0
READY_POLL_INTERVAL = 0.05
#: The web upstream's per-call timeout: short, so a hanging call fails fast; the others keep 30 s.
WEB_TIMEOUT = 2.0
#: A client that puts its token in ``_meta`` too; the other key must still arrive. (A cast: mypy does not
#: know the open ``extra_items`` of this TypedDict.)
CLIENT_META = cast(types.RequestParamsMeta, {"token": TOKEN, "trace": "kept"})


# -- the parts ---------------------------------------------------------------------------------


def stdio_upstream(*args: str, **extra: Any) -> JsonObj:
    return {"transport": "stdio", "command": upstream_command(*args), **extra}


def http_upstream(url: str, **extra: Any) -> JsonObj:
    return {"transport": "http", "url": url, **extra}


def gateway_settings(upstreams: Mapping[str, JsonObj]) -> Settings:
    """Config auth with a static token; nothing from the test runner's own SATGATE_* environment."""
    values: dict[str, Any] = {"auth_mode": "config", "static_token": TOKEN, "upstreams": dict(upstreams)}
    with pytest.MonkeyPatch.context() as env:
        for key in list(os.environ):
            if key.startswith("SATGATE_"):
                env.delenv(key)
        return Settings(**values, state_dir="memory")  # no state folder in the repository


@contextlib.asynccontextmanager
async def serving(settings: Settings, events: RecordingPublisher | None = None) -> AsyncIterator[str]:
    """The real app (real upstream pool) on a real loopback port; its base URL."""
    publisher = FanoutPublisher([LogPublisher(), events]) if events is not None else None
    server = TestServer(create_app(settings, publisher=publisher), host="127.0.0.1")
    try:
        await server.start_server()
        yield f"http://127.0.0.1:{server.port}"
    finally:
        await server.close()


@dataclass(frozen=True)
class Exchange:
    http_method: str
    rpc_method: str | None
    tool: str | None
    status: int
    content_type: str


class Wire(httpx2.AsyncBaseTransport):
    """Real HTTP to the gateway, recording how each message was answered (JSON or an SSE stream)."""

    def __init__(self) -> None:
        self._inner = httpx2.AsyncHTTPTransport(trust_env=False)
        self.exchanges: list[Exchange] = []

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        rpc_method = tool = None
        if request.method == "POST":
            body = json.loads(request.content)
            if isinstance(body, dict):
                rpc_method = body.get("method")
                tool = (body.get("params") or {}).get("name") if rpc_method == "tools/call" else None
        response = await self._inner.handle_async_request(request)
        content_type = response.headers.get("content-type", "").split(";")[0]
        self.exchanges.append(Exchange(request.method, rpc_method, tool, response.status_code, content_type))
        return response

    async def aclose(self) -> None:
        await self._inner.aclose()

    def answers_to(self, tool: str) -> list[str]:
        return [e.content_type for e in self.exchanges if e.tool == tool]


class Progress:
    """A ``progress_callback`` that keeps what it was given and signals the first update."""

    def __init__(self) -> None:
        self.updates: list[tuple[float, float | None, str | None]] = []
        self.first = asyncio.Event()

    async def __call__(self, progress: float, total: float | None, message: str | None) -> None:
        self.updates.append((progress, total, message))
        self.first.set()


@dataclass
class Agent:
    """One SDK ``ClientSession`` through the gateway, initialized once, as an agent holds it."""

    session: ClientSession
    wire: Wire
    init: types.InitializeResult

    async def text(self, tool: str, **arguments: Any) -> str:
        result = await asyncio.wait_for(self.session.call_tool(tool, arguments), CALL_TIMEOUT)
        assert not result.is_error, result
        [content] = result.content
        assert isinstance(content, types.TextContent)
        return content.text

    async def counters(self, prefix: str) -> JsonObj:
        """What an upstream recorded about cancellations (``cancelled``, ``hang_interrupted``)."""
        seen: JsonObj = json.loads(await self.text(f"{prefix}cancelled_count"))
        return seen

    async def counters_until(self, prefix: str, done: Callable[[JsonObj], bool]) -> JsonObj:
        """Ask again (bounded) until the upstream has seen what ``done`` looks for: a cancel is a separate POST."""
        async with asyncio.timeout(SETTLE_TIMEOUT):
            while not done(seen := await self.counters(prefix)):
                pass
        return seen

    async def all_tools(self) -> list[list[str]]:
        """Every page of ``tools/list``, following the gateway's cursors."""
        pages: list[list[str]] = []
        cursor: str | None = None
        while True:
            params = types.PaginatedRequestParams(cursor=cursor) if cursor else None
            listed = await asyncio.wait_for(self.session.list_tools(params=params), CALL_TIMEOUT)
            pages.append([tool.name for tool in listed.tools])
            cursor = listed.next_cursor
            if cursor is None:
                return pages


@contextlib.asynccontextmanager
async def connect(url: str, token: str = TOKEN) -> AsyncIterator[Agent]:
    wire = Wire()
    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, transport=wire, trust_env=False,
                              timeout=httpx2.Timeout(CALL_TIMEOUT))
    try:
        async with (http, streamable_http_client(f"{url}/mcp", http_client=http) as (read, write),
                    ClientSession(read, write, read_timeout_seconds=CALL_TIMEOUT) as session):
            init = await asyncio.wait_for(session.initialize(), CALL_TIMEOUT)
            yield Agent(session, wire, init)
    except BaseExceptionGroup as group:
        raise sole(group) from None


def sole(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """The one failure that the SDK's task groups wrapped (twice), so a failed assert reads as one."""
    inner: BaseException = group
    while isinstance(inner, BaseExceptionGroup) and len(inner.exceptions) == 1:
        inner = inner.exceptions[0]
    return inner


@dataclass
class Gateway:
    url: str
    web: HttpUpstreamProcess
    http: httpx2.AsyncClient
    events: RecordingPublisher

    def restarts_of(self, upstream: str) -> list[dict[str, Any]]:
        return [e for e in self.events.named(UPSTREAM_RESTART) if e["upstream"] == upstream]

    async def readyz(self) -> httpx2.Response:
        return await self.http.get("/readyz")

    async def wait_ready(self) -> None:
        """Bounded poll of /readyz: an upstream child coming back has nothing the test could await."""
        async with asyncio.timeout(READY_TIMEOUT):
            while True:
                if (await self.readyz()).status_code == 200:
                    return
                await asyncio.sleep(READY_POLL_INTERVAL)

    async def metric(self, name: str, **labels: str) -> float:
        """One sample from a ``/metrics`` scrape (0 when the series does not exist yet)."""
        scrape = await self.http.get("/metrics")
        assert scrape.status_code == 200
        for family in text_string_to_metric_families(scrape.text):
            for sample in family.samples:
                if sample.name == name and sample.labels == labels:
                    return float(sample.value)
        return 0.0


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def gateway(web: HttpUpstreamProcess) -> AsyncIterator[Gateway]:
    settings = gateway_settings({
        "alpha": stdio_upstream("--name", "alpha"),
        "beta": stdio_upstream("--name", "beta", "--many-tools", str(MANY_TOOLS), "--page-size", str(UPSTREAM_PAGE),
                               tool_prefix="b_"),
        "web": http_upstream(web.url, headers={"X-Upstream-Key": UPSTREAM_KEY}, timeout=WEB_TIMEOUT),
    })
    events = RecordingPublisher()
    async with (serving(settings, events) as url,
                httpx2.AsyncClient(base_url=url, trust_env=False, timeout=httpx2.Timeout(5.0)) as http):
        gw = Gateway(url, web, http, events)
        await gw.wait_ready()
        yield gw


# -- what an agent sees ------------------------------------------------------------------------


async def test_initialize_negotiates_the_newest_revision_and_advertises_what_the_upstreams_offer(
    gateway: Gateway,
) -> None:
    async with connect(gateway.url) as agent:
        init = agent.init
        assert init.protocol_version == LATEST_HANDSHAKE_VERSION
        assert init.server_info.name == SERVER_NAME
        assert init.capabilities.tools is not None
        # every upstream offers resources and prompts, so the gateway does too
        assert init.capabilities.resources is not None
        assert init.capabilities.prompts is not None
        [initialize] = [e for e in agent.wire.exchanges if e.rpc_method == "initialize"]
        assert (initialize.status, initialize.content_type) == (200, "application/json")


async def test_tools_are_the_union_of_the_upstreams_and_each_call_reaches_its_owner(gateway: Gateway) -> None:
    async with connect(gateway.url) as agent:
        names = {name for page in await agent.all_tools() for name in page}
        assert {"echo", "whoami", "b_echo", "b_whoami", "web_echo", "web_whoami"} <= names

        assert await agent.text("whoami") == "alpha"
        assert await agent.text("b_whoami") == "beta"  # the gateway's prefix was stripped on the way upstream
        assert await agent.text("web_whoami") == "web"
        assert await agent.text("echo", text="through alpha") == "through alpha"
        assert await agent.text("b_add", a=2, b=3) == "5"
        assert await agent.text("web_add", a=-1, b=0.5) == "-0.5"


async def test_every_tool_is_listed_across_the_gateways_own_pages(gateway: Gateway) -> None:
    async with connect(gateway.url) as agent:
        pages = await agent.all_tools()

        total = 3 * len(BASE_TOOLS) + MANY_TOOLS  # beta paged its 711 tools 100 at a time; the gateway took them all
        assert [len(page) for page in pages] == [TOOLS_PAGE_SIZE, total - TOOLS_PAGE_SIZE]
        names = [name for page in pages for name in page]
        assert len(set(names)) == total
        assert {f"b_extra_{i}" for i in range(MANY_TOOLS)} <= set(names)


async def test_resources_and_prompts_are_forwarded_to_their_owner(gateway: Gateway) -> None:
    async with connect(gateway.url) as agent:
        resources = await asyncio.wait_for(agent.session.list_resources(), CALL_TIMEOUT)
        assert {str(r.uri) for r in resources.resources} == {f"memo://{n}/readme" for n in ("alpha", "beta", "web")}
        read = await asyncio.wait_for(agent.session.read_resource("memo://beta/readme"), CALL_TIMEOUT)
        [content] = read.contents
        assert isinstance(content, types.TextResourceContents)
        assert content.text == "hello from beta: memo://beta/readme"

        templates = await asyncio.wait_for(agent.session.list_resource_templates(), CALL_TIMEOUT)
        assert "memo://web/notes/{id}" in {t.uri_template for t in templates.resource_templates}
        read = await asyncio.wait_for(agent.session.read_resource("memo://web/notes/7"), CALL_TIMEOUT)
        [content] = read.contents
        assert isinstance(content, types.TextResourceContents)
        assert content.text == "hello from web: memo://web/notes/7"  # routed by the template that matched

        prompts = await asyncio.wait_for(agent.session.list_prompts(), CALL_TIMEOUT)
        assert {"greet", "web_greet"} <= {p.name for p in prompts.prompts}
        for name, who, said in (("web_greet", "ann", "web greets ann"), ("greet", "bob", "alpha greets bob")):
            got = await asyncio.wait_for(agent.session.get_prompt(name, {"who": who}), CALL_TIMEOUT)
            [message] = got.messages
            assert isinstance(message.content, types.TextContent)
            assert message.content.text == said


async def test_progress_streams_over_sse_before_the_result(gateway: Gateway) -> None:
    async with connect(gateway.url) as agent:
        progress = Progress()

        result = await asyncio.wait_for(
            agent.session.call_tool("slow", {"steps": 3, "delay": 0.01}, progress_callback=progress), CALL_TIMEOUT)

        assert progress.updates == [(1, 3, "step 1"), (2, 3, "step 2"), (3, 3, "step 3")]
        [content] = result.content
        assert isinstance(content, types.TextContent)
        assert content.text == "done 3"
        assert agent.wire.answers_to("slow") == ["text/event-stream"]
        # a quiet call answers on a stream too: the client reads streams
        assert await agent.text("echo", text="plain") == "plain"
        assert agent.wire.answers_to("echo") == ["text/event-stream"]


async def test_a_client_cancel_reaches_the_upstream_and_the_session_keeps_working(gateway: Gateway) -> None:
    async with connect(gateway.url) as agent:
        before = await agent.counters("")
        progress = Progress()
        # ``slow`` rather than ``hang``: its first progress proves the upstream is running the call, so the
        # cancel cannot overtake the call on its way there.
        call = asyncio.create_task(
            agent.session.call_tool("slow", {"steps": 1000, "delay": 0.05}, progress_callback=progress))
        await asyncio.wait_for(progress.first.wait(), CALL_TIMEOUT)

        call.cancel()  # the SDK sends notifications/cancelled for it
        with pytest.raises(asyncio.CancelledError):
            await call

        seen = await agent.counters_until("", lambda c: c["cancelled"] > before["cancelled"])
        assert seen["cancelled"] == before["cancelled"] + 1
        assert await agent.text("echo", text="still here") == "still here"


async def test_the_clients_token_never_reaches_an_upstream(gateway: Gateway) -> None:
    async with connect(gateway.url) as agent:
        headers = json.loads(await agent.text("web_headers"))
        assert "authorization" not in headers
        assert headers["x-upstream-key"] == UPSTREAM_KEY  # the upstream's own credential does arrive
        assert TOKEN not in json.dumps(headers)

        for tool in ("seen_meta", "web_seen_meta"):  # stdio and HTTP
            result = await asyncio.wait_for(
                agent.session.call_tool(tool, {}, meta=CLIENT_META), CALL_TIMEOUT)
            [content] = result.content
            assert isinstance(content, types.TextContent)
            assert json.loads(content.text) == {"trace": "kept"}


async def test_health_readiness_and_a_metrics_scrape(gateway: Gateway) -> None:
    async with connect(gateway.url) as agent:
        healthz = await gateway.http.get("/healthz")
        assert (healthz.status_code, healthz.json()) == (200, {"status": "ok"})
        readyz = await gateway.readyz()
        assert readyz.status_code == 200
        assert readyz.json() == {"status": "ready", "upstreams": {"alpha": True, "beta": True, "web": True},
                                 "circuits": {"web": {"state": "closed"}}}  # HTTP upstreams have a breaker

        ok_calls = await gateway.metric("satgate_tool_calls_total", upstream="web", outcome="ok")
        assert await agent.text("web_echo", text="counted") == "counted"

        assert await gateway.metric("satgate_tool_calls_total", upstream="web", outcome="ok") == ok_calls + 1
        assert await gateway.metric("satgate_active_sessions") >= 1
        assert await gateway.metric("satgate_requests_total", method="tools/call", status="200") >= 1


# -- an upstream misbehaves (these disturb the shared upstreams and leave them ready) ------------


async def test_an_upstream_timeout_is_a_jsonrpc_error_and_cancels_the_call_upstream(gateway: Gateway) -> None:
    async with connect(gateway.url) as agent:
        before = await agent.counters("web_")
        timeouts = await gateway.metric("satgate_tool_calls_total", upstream="web", outcome="timeout")

        async with asyncio.timeout(CALL_TIMEOUT):
            with pytest.raises(MCPError) as caught:
                await agent.session.call_tool("web_hang", {})

        assert caught.value.code == jsonrpc.UPSTREAM_TIMEOUT
        assert f"did not answer tools/call within {WEB_TIMEOUT:g}s" in caught.value.message
        seen = await agent.counters_until("web_", lambda c: c["hang_interrupted"] > before["hang_interrupted"])
        assert seen["cancelled"] == before["cancelled"] + 1
        assert seen["hang_interrupted"] == before["hang_interrupted"] + 1
        assert await gateway.metric("satgate_tool_calls_total", upstream="web", outcome="timeout") == timeouts + 1


async def test_an_upstream_crash_fails_calls_in_flight_at_once_and_the_session_recovers(gateway: Gateway) -> None:
    async with connect(gateway.url) as agent:
        assert await agent.text("b_whoami") == "beta"
        restarts = await gateway.metric("satgate_upstream_restarts_total", upstream="beta")
        progress = Progress()
        in_flight = asyncio.create_task(
            agent.session.call_tool("b_slow", {"steps": 1000, "delay": 0.05}, progress_callback=progress))
        await asyncio.wait_for(progress.first.wait(), CALL_TIMEOUT)

        async with asyncio.timeout(SETTLE_TIMEOUT):  # beta's timeout is 30 s: these fail because it died
            with pytest.raises(MCPError) as crashed:
                await agent.session.call_tool("b_crash", {})
            with pytest.raises(MCPError) as lost:
                await in_flight

        for error in (crashed.value, lost.value):
            assert error.code == jsonrpc.UPSTREAM_UNAVAILABLE
            assert "upstream 'beta' went away" in error.message
        readyz = await gateway.readyz()
        assert readyz.status_code == 503
        assert readyz.json()["upstreams"] == {"alpha": True, "beta": False, "web": True}
        assert await agent.text("whoami") == "alpha"  # the other upstreams never noticed

        await gateway.wait_ready()
        assert await agent.text("b_whoami") == "beta"  # the same SDK session, a new child
        assert await agent.text("b_extra_699") == "extra_699 called"  # its tools were listed again
        assert await gateway.metric("satgate_upstream_restarts_total", upstream="beta") == restarts + 1


async def test_an_http_upstream_that_dropped_the_gateways_session_answers_404_and_gets_a_new_one(
    gateway: Gateway,
) -> None:
    async with connect(gateway.url) as agent:
        seen = json.loads(await agent.text("web_headers"))
        stale = seen["mcp-session-id"]
        # Someone else ends the gateway's session at the upstream: the connection stays up, the session is gone.
        async with httpx2.AsyncClient(trust_env=False, timeout=httpx2.Timeout(5.0)) as other:
            ended = await other.delete(gateway.web.url, headers={
                "Mcp-Session-Id": stale, "MCP-Protocol-Version": seen["mcp-protocol-version"]})
        assert ended.status_code == 200
        renewals = len(gateway.restarts_of("web"))

        assert await agent.text("web_echo", text="after") == "after"

        assert json.loads(await agent.text("web_headers"))["mcp-session-id"] != stale
        assert [e["reason"] for e in gateway.restarts_of("web")[renewals:]] == ["session expired (HTTP 404)"]


async def test_a_restarted_http_upstream_is_reinitialized_transparently(gateway: Gateway) -> None:
    async with connect(gateway.url) as agent:
        stale = json.loads(await agent.text("web_headers"))["mcp-session-id"]
        renewals = len(gateway.restarts_of("web"))

        await gateway.web.arestart()  # same port, a new process that knows none of the old sessions

        assert await agent.text("web_echo", text="after") == "after"
        assert json.loads(await agent.text("web_headers"))["mcp-session-id"] != stale
        assert len(gateway.restarts_of("web")) > renewals
        await gateway.wait_ready()


# -- start-up --------------------------------------------------------------------------------------


async def test_a_tool_name_clash_stops_start_unless_one_upstream_has_a_prefix(web: HttpUpstreamProcess) -> None:
    # The same server configured twice: every tool name clashes.
    clash = gateway_settings({"one": http_upstream(web.url), "two": http_upstream(web.url)})
    with pytest.raises(ConfigError) as caught:
        async with serving(clash):
            pytest.fail("the gateway started with clashing tool names")
    message = str(caught.value)
    for part in ("'web_echo'", "'one'", "'two'", "tool_prefix"):
        assert part in message

    prefixed = gateway_settings({"one": http_upstream(web.url), "two": http_upstream(web.url, tool_prefix="two_")})
    async with serving(prefixed) as url, connect(url) as agent:
        names = {name for page in await agent.all_tools() for name in page}
        assert {"web_echo", "two_web_echo"} <= names
        assert await agent.text("web_echo", text="one") == "one"
        assert await agent.text("two_web_echo", text="two") == "two"


async def test_an_upstream_tool_list_change_reaches_the_client_ahead_of_its_next_answer(gateway: Gateway) -> None:
    changed = asyncio.Event()

    async def on_message(message: types.ServerNotification | Exception) -> None:
        if isinstance(message, types.ToolListChangedNotification):
            changed.set()

    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {TOKEN}"}, trust_env=False,
                              timeout=httpx2.Timeout(CALL_TIMEOUT))
    try:
        async with (http, streamable_http_client(f"{gateway.url}/mcp", http_client=http) as (read, write),
                    ClientSession(read, write, read_timeout_seconds=CALL_TIMEOUT, message_handler=on_message)
                    as session):
            await asyncio.wait_for(session.initialize(), CALL_TIMEOUT)
            await asyncio.wait_for(session.call_tool("add_tool", {"name": "fresh_tool"}), CALL_TIMEOUT)
            # The gateway re-lists alpha in the background; the first answer after that carries the notice.
            async with asyncio.timeout(SETTLE_TIMEOUT):
                while not changed.is_set():
                    await session.call_tool("echo", {"text": "still here"})
            names: list[str] = []
            cursor: str | None = None
            while True:  # every page: the merged list is sorted by name, beta's many tools come first
                page = types.PaginatedRequestParams(cursor=cursor) if cursor else None
                listed = await asyncio.wait_for(session.list_tools(params=page), CALL_TIMEOUT)
                names += [tool.name for tool in listed.tools]
                if not (cursor := listed.next_cursor):
                    break
            assert "fresh_tool" in names
    except BaseExceptionGroup as group:
        raise sole(group) from None
