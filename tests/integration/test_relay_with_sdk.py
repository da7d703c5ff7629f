"""What an upstream says during a call reaches the client that made it, through the whole gateway.

The official SDK client, with its callbacks, talks to a real gateway in front of the test upstream
(``relay_*`` tools) as a stdio child (``kid``, tools unprefixed) and as a Streamable HTTP server
(``web``, tools ``web_relay_*``). Each rule is checked over both.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx2
import mcp_types as types
import pytest
import pytest_asyncio
from aiohttp.test_utils import TestServer
from mcp.client.session import ClientRequestContext, ClientSession
from mcp.client.sse import sse_client
from mcp.client.streamable_http import streamable_http_client
from pydantic import SecretStr

from satgate_mcp.app import create_app
from satgate_mcp.auth.macaroons import mint_token
from satgate_mcp.settings import Settings
from tests.conftest import HttpUpstreamProcess
from tests.integration.test_gateway_with_sdk import (
    TOKEN,
    Gateway,
    Wire,
    gateway_settings,
    http_upstream,
    serving,
    sole,
    stdio_upstream,
)

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.process]

CALL_TIMEOUT = 15.0
SSE_ACCEPT = "application/json, text/event-stream"
#: The relay tools over a stdio child (no prefix) and over an HTTP upstream (its own ``web_`` prefix).
OVER = [pytest.param("", id="stdio"), pytest.param("web_", id="http")]


@dataclass
class Client:
    """What one SDK client's callbacks were asked and told; each answer names the client."""

    name: str
    logs: list[types.LoggingMessageNotificationParams] = field(default_factory=list)
    asked: list[str] = field(default_factory=list)
    elicitation_modes: list[str] = field(default_factory=list)

    async def elicit(self, ctx: ClientRequestContext, params: types.ElicitRequestParams) -> types.ElicitResult:
        self.asked.append("elicitation/create")
        self.elicitation_modes.append(params.mode or "form")
        if isinstance(params, types.ElicitRequestURLParams):
            return types.ElicitResult(action="accept")
        return types.ElicitResult(action="accept", content={"answer": f"{self.name} says yes"})

    async def sample(self, ctx: ClientRequestContext, params: types.CreateMessageRequestParams
                     ) -> types.CreateMessageResult:
        self.asked.append("sampling/createMessage")
        [message] = params.messages
        assert isinstance(message.content, types.TextContent)
        reply = types.TextContent(type="text", text=f"{self.name}: {message.content.text}")
        return types.CreateMessageResult(role="assistant", model="test-model", content=reply)

    async def roots(self, ctx: ClientRequestContext) -> types.ListRootsResult:
        self.asked.append("roots/list")
        return types.ListRootsResult(roots=[types.Root(uri=f"file:///home/{self.name}")])  # type: ignore[arg-type]

    async def log(self, params: types.LoggingMessageNotificationParams) -> None:
        self.logs.append(params)

    def log_data(self) -> list[str]:
        return [str(p.data) for p in self.logs]


@dataclass
class Agent:
    session: ClientSession
    client: Client
    wire: Wire

    async def text(self, tool: str, **arguments: Any) -> str:
        result = await asyncio.wait_for(self.session.call_tool(tool, arguments), CALL_TIMEOUT)
        assert not result.is_error, result
        [content] = result.content
        assert isinstance(content, types.TextContent)
        return content.text


@contextlib.asynccontextmanager
async def connect(url: str, name: str, *, token: str = TOKEN, features: bool = True,
                  transport: httpx2.AsyncBaseTransport | None = None) -> AsyncIterator[Agent]:
    client = Client(name)
    wire = Wire()
    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, transport=transport or wire,
                              trust_env=False, timeout=httpx2.Timeout(CALL_TIMEOUT))
    callbacks: dict[str, Any] = dict(sampling_callback=client.sample, elicitation_callback=client.elicit,
                                     list_roots_callback=client.roots) if features else {}
    try:
        async with (http, streamable_http_client(f"{url}/mcp", http_client=http) as (read, write),
                    ClientSession(read, write, read_timeout_seconds=CALL_TIMEOUT, logging_callback=client.log,
                                  **callbacks) as session):
            await asyncio.wait_for(session.initialize(), CALL_TIMEOUT)
            yield Agent(session, client, wire)
    except BaseExceptionGroup as group:
        raise sole(group) from None


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def gateway(web: HttpUpstreamProcess) -> AsyncIterator[Gateway]:
    from satgate_mcp.events import RecordingPublisher

    settings = gateway_settings({"kid": stdio_upstream("--name", "kid"), "web": http_upstream(web.url)})
    events = RecordingPublisher()
    async with (serving(settings, events) as url,
                httpx2.AsyncClient(base_url=url, trust_env=False, timeout=httpx2.Timeout(5.0)) as http):
        gw = Gateway(url, web, http, events)
        await gw.wait_ready()
        yield gw


# -- requests to the client ------------------------------------------------------------------------


@pytest.mark.parametrize("prefix", OVER)
async def test_an_elicitation_reaches_the_client_and_its_answer_the_upstream(gateway: Gateway, prefix: str) -> None:
    async with connect(gateway.url, "ann") as agent:
        answer = json.loads(await agent.text(f"{prefix}relay_elicit", question="go on?"))
        assert answer == {"action": "accept", "content": {"answer": "ann says yes"}}
        assert agent.wire.answers_to(f"{prefix}relay_elicit") == ["text/event-stream"]


@pytest.mark.parametrize("prefix", OVER)
async def test_a_url_mode_elicitation_reaches_the_client(gateway: Gateway, prefix: str) -> None:
    async with connect(gateway.url, "ann") as agent:
        assert json.loads(await agent.text(f"{prefix}relay_elicit_url")) == {"action": "accept"}
        assert agent.client.elicitation_modes == ["url"]


@pytest.mark.parametrize("prefix", OVER)
async def test_sampling_reaches_the_clients_model(gateway: Gateway, prefix: str) -> None:
    async with connect(gateway.url, "ann") as agent:
        assert await agent.text(f"{prefix}relay_sample", prompt="hi") == "ann: hi"


@pytest.mark.parametrize("prefix", OVER)
async def test_roots_are_the_calling_clients(gateway: Gateway, prefix: str) -> None:
    async with connect(gateway.url, "ann") as agent:
        assert json.loads(await agent.text(f"{prefix}relay_roots")) == ["file:///home/ann"]


@pytest.mark.parametrize("prefix", OVER)
async def test_a_client_without_the_feature_has_its_refusal_relayed(gateway: Gateway, prefix: str) -> None:
    async with connect(gateway.url, "bare", features=False) as agent:
        text = await agent.text(f"{prefix}relay_sample", prompt="hi")
        assert text.startswith("error:")
        assert "sampling" in text


@pytest.mark.parametrize("prefix", OVER)
async def test_two_sessions_calling_at_once_each_get_only_their_own(gateway: Gateway, prefix: str) -> None:
    async with connect(gateway.url, "ann") as ann, connect(gateway.url, "bob") as bob:
        for _ in range(3):
            a, b = await asyncio.gather(ann.text(f"{prefix}relay_elicit"), bob.text(f"{prefix}relay_elicit"))
            # over a shared stdio child, a question asked while both call is refused, never guessed
            for text, owner, other in ((a, ann, "bob"), (b, bob, "ann")):
                assert f"{other} says yes" not in text
                if not text.startswith("error:"):
                    assert json.loads(text)["content"]["answer"] == f"{owner.client.name} says yes"
        if prefix:  # HTTP: every question rides its call's own stream, so none is ever refused
            assert len(ann.client.asked) == len(bob.client.asked) == 3


async def test_a_question_nobody_can_be_named_for_is_refused_and_counted(gateway: Gateway) -> None:
    """Two sessions with calls in flight on one shared stdio child: neither gets the other's question."""
    before = await gateway.metric("satgate_upstream_unattributed_total", upstream="kid", kind="request")
    async with connect(gateway.url, "ann") as ann, connect(gateway.url, "bob") as bob:
        slow = asyncio.ensure_future(ann.text("slow", steps=20, delay=0.05))
        text = await bob.text("relay_roots")
        await slow
    assert text.startswith("error:")
    assert '"isolation": "shared"' in text
    assert ann.client.asked == []
    assert bob.client.asked == []
    assert await gateway.metric("satgate_upstream_unattributed_total", upstream="kid", kind="request") == before + 1


@pytest.mark.parametrize("prefix", OVER)
async def test_a_json_only_client_gets_a_clear_refusal_upstream(gateway: Gateway, prefix: str) -> None:
    async with httpx2.AsyncClient(base_url=gateway.url, trust_env=False, timeout=CALL_TIMEOUT,
                                  headers={"Authorization": f"Bearer {TOKEN}"}) as http:
        init = await http.post("/mcp", headers={"Accept": SSE_ACCEPT}, json={
            "jsonrpc": "2.0", "id": 1, "method": "initialize",
            "params": {"protocolVersion": "2025-11-25", "clientInfo": {"name": "j", "version": "1"},
                       "capabilities": {"elicitation": {}}}})
        headers = {"Mcp-Session-Id": init.headers["Mcp-Session-Id"], "MCP-Protocol-Version": "2025-11-25",
                   "Accept": "application/json"}
        call = await http.post("/mcp", headers=headers, json={
            "jsonrpc": "2.0", "id": 2, "method": "tools/call",
            "params": {"name": f"{prefix}relay_elicit", "arguments": {}}})
    assert call.status_code == 200
    assert call.headers["content-type"].startswith("application/json")
    [content] = call.json()["result"]["content"]
    assert content["text"].startswith("error:")
    assert "text/event-stream" in content["text"]


# -- logging ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("prefix", OVER)
async def test_each_session_receives_log_messages_at_or_above_its_own_level(gateway: Gateway, prefix: str) -> None:
    async with connect(gateway.url, "ann") as ann, connect(gateway.url, "bob") as bob:
        await ann.session.set_logging_level("debug")
        await bob.session.set_logging_level("warning")
        # the upstream was set to the most verbose level anyone asked for
        assert await ann.text(f"{prefix}relay_log_level") == "debug"
        await asyncio.gather(ann.text(f"{prefix}relay_log", tag="a"), bob.text(f"{prefix}relay_log", tag="b"))
    # over a shared stdio child the messages of overlapping calls may be dropped, never crossed
    assert set(ann.client.log_data()) <= {"debug a", "info a", "warning a", "error a"}
    assert set(bob.client.log_data()) <= {"warning b", "error b"}
    async with connect(gateway.url, "cid") as cid:
        await cid.session.set_logging_level("info")
        await cid.text(f"{prefix}relay_log", tag="c")
    assert cid.client.log_data() == ["info c", "warning c", "error c"]


async def test_the_gateway_advertises_logging_when_an_upstream_does(gateway: Gateway) -> None:
    async with connect(gateway.url, "ann") as agent:
        caps = agent.session.server_capabilities
        assert caps is not None
        assert caps.logging is not None


# -- streams -----------------------------------------------------------------------------------------


async def test_a_2025_11_25_stream_opens_with_a_priming_event_and_ids_every_event(gateway: Gateway) -> None:
    async with httpx2.AsyncClient(base_url=gateway.url, trust_env=False, timeout=CALL_TIMEOUT,
                                  headers={"Authorization": f"Bearer {TOKEN}"}) as http:
        init = await http.post("/mcp", headers={"Accept": SSE_ACCEPT}, json={
            "jsonrpc": "2.0", "id": 1, "method": "initialize",
            "params": {"protocolVersion": "2025-11-25", "clientInfo": {"name": "raw", "version": "1"},
                       "capabilities": {}}})
        headers = {"Mcp-Session-Id": init.headers["Mcp-Session-Id"], "MCP-Protocol-Version": "2025-11-25",
                   "Accept": SSE_ACCEPT}
        call = await http.post("/mcp", headers=headers, json={
            "jsonrpc": "2.0", "id": 2, "method": "tools/call",
            "params": {"name": "relay_log", "arguments": {"tag": "raw"}}})
    assert call.headers["content-type"].startswith("text/event-stream")
    assert call.headers["x-accel-buffering"] == "no"
    events = [block for block in call.text.split("\n\n") if block.strip()]
    # priming: an id, no message
    assert events[0].startswith("id: ")
    assert events[0].endswith("data: ")
    assert all(block.startswith("id: ") for block in events)
    ids = [block.split("\n", 1)[0] for block in events]
    assert len(set(ids)) == len(ids)
    assert '"id":2' in events[-1]
    assert [json.loads(b.split("data: ", 1)[1])["params"]["data"] for b in events[1:-1]] == [
        "debug raw", "info raw", "warning raw", "error raw"]


# -- the legacy transport ------------------------------------------------------------------------------


@pytest.mark.parametrize("prefix", OVER)
async def test_the_legacy_sse_transport_relays_on_its_one_stream(gateway: Gateway, prefix: str) -> None:
    client = Client("leg")
    callbacks: dict[str, Any] = {"elicitation_callback": client.elicit, "sampling_callback": client.sample}
    async with (sse_client(f"{gateway.url}/sse", headers={"Authorization": f"Bearer {TOKEN}"}) as (read, write),
                ClientSession(read, write, read_timeout_seconds=CALL_TIMEOUT, logging_callback=client.log,
                              **callbacks) as session):
        await asyncio.wait_for(session.initialize(), CALL_TIMEOUT)
        elicited = await asyncio.wait_for(session.call_tool(f"{prefix}relay_elicit", {}), CALL_TIMEOUT)
        sampled = await asyncio.wait_for(session.call_tool(f"{prefix}relay_sample", {"prompt": "old"}), CALL_TIMEOUT)
        await asyncio.wait_for(session.call_tool(f"{prefix}relay_log", {"tag": "l"}), CALL_TIMEOUT)
    texts = [c.text for r in (elicited, sampled) for c in r.content if isinstance(c, types.TextContent)]
    # 2024-11-05 has no elicitation: the client's own refusal is what the upstream hears
    assert texts[0] == "error: -32601 Method not found"
    assert texts[1] == "leg: old"
    assert client.log_data() == ["debug l", "info l", "warning l", "error l"]


# -- a resumed session after a restart -----------------------------------------------------------------

ROOT_KEY = "relay-resume-root-key-0123456789abcdefghij"


class Redirect(httpx2.AsyncBaseTransport):
    """The client's one URL, sent to whichever gateway process serves now (a restart on another port)."""

    def __init__(self) -> None:
        self._inner = httpx2.AsyncHTTPTransport(trust_env=False)
        self.port = 0

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        request.url = request.url.copy_with(port=self.port)
        return await self._inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self._inner.aclose()


def header_settings() -> Settings:
    with pytest.MonkeyPatch.context() as env:
        for key in list(os.environ):
            if key.startswith("SATGATE_"):
                env.delenv(key)
        values: dict[str, Any] = {"auth_mode": "header", "root_key": SecretStr(ROOT_KEY),
                                  "upstreams": {"kid": stdio_upstream("--name", "kid")}}
        return Settings(**values)


async def test_a_resumed_session_after_a_restart_still_gets_its_elicitations_and_log_messages() -> None:
    token = mint_token(ROOT_KEY, "relay-agent")
    redirect = Redirect()
    first = TestServer(create_app(header_settings()), host="127.0.0.1")
    await first.start_server()
    assert first.port is not None
    redirect.port = first.port
    try:
        async with connect("http://127.0.0.1:1", "ann", token=token, transport=redirect) as agent:
            assert json.loads(await agent.text("relay_elicit"))["content"] == {"answer": "ann says yes"}
            await first.close()
            second = TestServer(create_app(header_settings()), host="127.0.0.1")
            await second.start_server()
            assert second.port is not None
            redirect.port = second.port
            try:
                assert json.loads(await agent.text("relay_elicit"))["content"] == {"answer": "ann says yes"}
                await agent.text("relay_log", tag="after")
                assert agent.client.log_data()[-4:] == ["debug after", "info after", "warning after", "error after"]
            finally:
                await second.close()
    finally:
        await first.close()


# -- the audit trail -------------------------------------------------------------------------------


async def test_a_relayed_request_and_its_call_are_audited(web: HttpUpstreamProcess, tmp_path: Path) -> None:
    from satgate_mcp.policy.audit import verify

    trail = tmp_path / "audit.jsonl"
    settings = gateway_settings({"web": http_upstream(web.url)}).model_copy(update={"audit_file": str(trail)})
    async with serving(settings) as url, connect(url, "ann") as agent:
        assert "ann says yes" in await agent.text("web_relay_elicit", question="go on?")
    lines = [json.loads(line) for line in trail.read_text().splitlines()]
    asked = [line for line in lines if line["event"] == "client_request"]
    assert [(a["method"], a["outcome"]) for a in asked] == [("elicitation/create", "ok")]
    assert [(c["event"], c["tool"], c["outcome"]) for c in lines if c["event"] == "tool_call"] == [
        ("tool_call", "web_relay_elicit", "ok")]
    assert verify([(str(trail), trail.read_text().splitlines())])[1] is None
