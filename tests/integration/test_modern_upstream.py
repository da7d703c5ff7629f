"""A 2026-07-28-only upstream behind a real ``python -m satgate_mcp serve`` (issue 12, upstream side).

The upstream (tests/upstream_server.py ``--modern-only``, the official SDK's modern loop over stdio) knows no
``initialize``; the gateway discovers it and speaks to it statelessly. Its ``mrtr_ask`` tool answers
``input_required`` (an elicitation and its own requestState) and completes on the retry. Every test runs
with the upstream over stdio and over Streamable HTTP. A 2025 client is
asked with a real request on its call's stream; a 2026 client gets the ``input_required`` with the
upstream's state sealed in the gateway's, so a gateway SIGKILLed and restarted between the answer and
the retry continues the call: nothing waited in memory. Another token's retry and a tampered state are
refused.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx2
import mcp_types as types
import pytest
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from tests.gateway_process import GatewayProcess
from tests.integration.front import gateway_in_front
from tests.integration.test_mrtr_sdk import mint, modern_client, text_of

pytestmark = pytest.mark.process

ROOT_KEY = "e2e-modern-upstream-root-key-0123456789abcdef"
CALL_TIMEOUT = 15.0
MODERN = "2026-07-28"
META = {"io.modelcontextprotocol/protocolVersion": MODERN,
        "io.modelcontextprotocol/clientCapabilities": {"elicitation": {}}}


@pytest.fixture(params=["stdio", "http"])
async def gateway(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[GatewayProcess]:
    """The gateway in front of the 2026-only upstream, as a stdio child or as a Streamable HTTP server."""
    async with gateway_in_front(tmp_path, root_key=ROOT_KEY, name="m", transport=request.param,
                                args=("--name", "m", "--modern-only")) as gw:
        yield gw


async def elicit(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
    assert isinstance(params, types.ElicitRequestFormParams)
    return types.ElicitResult(action="accept", content={"answer": f"re: {params.message}"})


@contextlib.asynccontextmanager
async def legacy_client(gw: GatewayProcess, token: str, *, elicits: bool = True) -> AsyncIterator[ClientSession]:
    """A 2025 SDK session that answers elicitations (the gateway relays them on the call's POST stream);
    ``elicits=False``: one that declares no elicitation capability."""
    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, trust_env=False,
                              timeout=httpx2.Timeout(CALL_TIMEOUT))
    callbacks: dict[str, Any] = {"elicitation_callback": elicit} if elicits else {}
    async with (http, streamable_http_client(f"{gw.url}/mcp", http_client=http) as (read, write),
                ClientSession(read, write, read_timeout_seconds=CALL_TIMEOUT, **callbacks) as session):
        await asyncio.wait_for(session.initialize(), CALL_TIMEOUT)
        yield session


def answer_of(text: str) -> Any:
    return json.loads(text)


async def test_a_2025_client_lists_calls_and_answers_the_modern_upstreams_elicitation(gateway: GatewayProcess) -> None:
    token = await mint(gateway, "legacy-agent")
    async with legacy_client(gateway, token) as session:
        tools = {t.name for t in (await asyncio.wait_for(session.list_tools(), CALL_TIMEOUT)).tools}
        assert {"echo", "mrtr_ask"} <= tools
        echoed = await asyncio.wait_for(session.call_tool("echo", {"text": "hi"}), CALL_TIMEOUT)
        assert isinstance(echoed.content[0], types.TextContent)
        assert echoed.content[0].text == "hi"
        asked = answer_of(await text_of(session.call_tool("mrtr_ask", {"question": "colour?"})))
    assert asked == {"action": "accept", "content": {"answer": "re: colour?"}}
    lines = [json.loads(line) for line in gateway.log_file.read_text().splitlines() if line.startswith("{")]
    assert any(line.get("event") == "upstream_ready" and line.get("upstream") == "m" for line in lines)


async def test_a_2025_client_without_elicitation_gets_minus_32021_naming_the_capability(
        gateway: GatewayProcess) -> None:
    token = await mint(gateway, "plain-legacy")
    async with legacy_client(gateway, token, elicits=False) as session:
        with pytest.raises(MCPError) as refused:
            await asyncio.wait_for(session.call_tool("mrtr_ask", {"question": "colour?"}), CALL_TIMEOUT)
        echoed = await asyncio.wait_for(session.call_tool("echo", {"text": "still here"}), CALL_TIMEOUT)
    assert refused.value.error.code == -32021
    assert refused.value.error.data["requiredCapabilities"] == {"elicitation": {}}
    assert isinstance(echoed.content[0], types.TextContent)
    assert echoed.content[0].text == "still here"


async def test_a_2025_sessions_log_level_reaches_the_modern_upstream_with_each_call(gateway: GatewayProcess) -> None:
    """A 2026 upstream has no logging/setLevel: the session's level travels in each request's ``_meta``."""
    token = await mint(gateway, "logs-legacy")
    heard: list[str] = []

    async def on_log(params: types.LoggingMessageNotificationParams) -> None:
        heard.append(params.level)

    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, trust_env=False,
                              timeout=httpx2.Timeout(CALL_TIMEOUT))
    async with (http, streamable_http_client(f"{gateway.url}/mcp", http_client=http) as (read, write),
                ClientSession(read, write, read_timeout_seconds=CALL_TIMEOUT, logging_callback=on_log) as session):
        await asyncio.wait_for(session.initialize(), CALL_TIMEOUT)
        await asyncio.wait_for(session.call_tool("relay_log", {"tag": "unset"}), CALL_TIMEOUT)
        assert heard == []  # no level set: a 2026 upstream sends nothing (its revision's default)
        await asyncio.wait_for(session.set_logging_level("warning"), CALL_TIMEOUT)
        await asyncio.wait_for(session.call_tool("relay_log", {"tag": "set"}), CALL_TIMEOUT)
    assert heard == ["warning", "error"]


async def test_a_2026_clients_log_level_reaches_the_modern_upstream(gateway: GatewayProcess) -> None:
    token = await mint(gateway, "logs-modern")
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
        "_meta": {**META, "io.modelcontextprotocol/logLevel": "error"}, "name": "relay_log", "arguments": {}}}
    answer = await _post(gateway, token, body)
    events = [json.loads(line[5:]) for line in answer.text.splitlines() if line.startswith("data:")]
    levels = [e["params"]["level"] for e in events if e.get("method") == "notifications/message"]
    assert levels == ["error"]
    assert events[-1]["result"]["content"][0]["text"] == "logged"


@pytest.mark.filterwarnings("ignore:resources/(un)?subscribe is removed as of 2026-07-28")
async def test_a_2025_sessions_resource_subscription_reaches_the_modern_upstream_as_its_listen_filter(
        gateway: GatewayProcess) -> None:
    """2026-07-28 has no resources/subscribe: the gateway asks the upstream's listen stream for the URI instead,
    and the upstream's updates of it (only of it) reach the subscribed session."""
    token = await mint(gateway, "subscriber")
    updates: asyncio.Queue[str] = asyncio.Queue()

    async def on_message(message: Any) -> None:
        if isinstance(message, types.ResourceUpdatedNotification):
            await updates.put(str(message.params.uri))

    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, trust_env=False,
                              timeout=httpx2.Timeout(CALL_TIMEOUT))
    async with (http, streamable_http_client(f"{gateway.url}/mcp", http_client=http) as (read, write),
                ClientSession(read, write, read_timeout_seconds=CALL_TIMEOUT, message_handler=on_message) as session):
        await asyncio.wait_for(session.initialize(), CALL_TIMEOUT)
        await asyncio.wait_for(session.subscribe_resource("memo://m/readme"), CALL_TIMEOUT)
        async with asyncio.timeout(CALL_TIMEOUT):
            while updates.empty():  # the session's GET stream opens on its own after initialize: touch until it hears
                for uri in ("memo://m/elsewhere", "memo://m/readme"):
                    await session.call_tool("stream_touch", {"uri": uri})
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(0.5):
                        await updates.put(await updates.get())
        await asyncio.wait_for(session.unsubscribe_resource("memo://m/readme"), CALL_TIMEOUT)
    heard = [updates.get_nowait() for _ in range(updates.qsize())]
    assert heard
    assert set(heard) == {"memo://m/readme"}


async def test_a_2026_clients_listen_stream_gets_the_modern_upstreams_resource_updates(
        gateway: GatewayProcess) -> None:
    token = await mint(gateway, "listener")
    listen = {"jsonrpc": "2.0", "id": "sub-1", "method": "subscriptions/listen",
              "params": {"_meta": META, "notifications": {"resourceSubscriptions": ["memo://m/readme"]}}}
    headers = {"Authorization": f"Bearer {token}", "Accept": "text/event-stream, application/json",
               "MCP-Protocol-Version": MODERN, "Mcp-Method": "subscriptions/listen"}
    frames: list[Any] = []
    async with (httpx2.AsyncClient(trust_env=False, timeout=CALL_TIMEOUT) as http,
                http.stream("POST", f"{gateway.url}/mcp", json=listen, headers=headers) as stream):
        lines = stream.aiter_lines()
        async with asyncio.timeout(CALL_TIMEOUT):
            while not frames:
                line = await anext(lines)
                frames += [json.loads(line[5:])] if line.startswith("data:") else []
            touch = {"jsonrpc": "2.0", "id": 2, "method": "tools/call",
                     "params": {"_meta": META, "name": "stream_touch", "arguments": {"uri": "memo://m/readme"}}}
            assert "result" in _json_of(await _post(gateway, token, touch))
            while len(frames) < 2:
                line = await anext(lines)
                frames += [json.loads(line[5:])] if line.startswith("data:") else []
    ack, update = frames
    assert ack["method"] == "notifications/subscriptions/acknowledged"
    assert ack["params"]["notifications"]["resourceSubscriptions"] == ["memo://m/readme"]
    assert update["method"] == "notifications/resources/updated"
    assert update["params"]["uri"] == "memo://m/readme"
    assert update["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"] == "sub-1"


async def test_a_2026_client_continues_the_flow_on_a_restarted_gateway(gateway: GatewayProcess) -> None:
    """The key property: the state is sealed, so a new process with the same keys continues the call."""
    token = await mint(gateway, "modern-agent")
    restarted = asyncio.Event()

    async def elicit_across_a_restart(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        if not restarted.is_set():
            await gateway.kill()
            gateway.start()
            await gateway.wait_ready()
            restarted.set()
        return await elicit(context, params)

    async with modern_client(gateway, token, elicitation_callback=elicit_across_a_restart) as client:
        tools = {t.name for t in (await asyncio.wait_for(client.list_tools(), CALL_TIMEOUT)).tools}
        assert "mrtr_ask" in tools
        asked = answer_of(await text_of(client.call_tool("mrtr_ask", {"question": "after a restart?"})))
    assert restarted.is_set()
    assert asked == {"action": "accept", "content": {"answer": "re: after a restart?"}}


async def _post(gw: GatewayProcess, token: str, body: dict[str, Any]) -> httpx2.Response:
    headers = {"Authorization": f"Bearer {token}", "Accept": "application/json, text/event-stream",
               "MCP-Protocol-Version": MODERN, "Mcp-Method": body["method"], "Mcp-Name": body["params"]["name"]}
    async with httpx2.AsyncClient(trust_env=False, timeout=CALL_TIMEOUT) as http:
        return await http.post(f"{gw.url}/mcp", json=body, headers=headers)


def _call(request_id: int, **extra: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "method": "tools/call",
            "params": {"_meta": META, "name": "mrtr_ask", "arguments": {"question": "q"}, **extra}}


def _json_of(response: httpx2.Response) -> Any:
    if response.headers.get("content-type", "").startswith("text/event-stream"):
        data = [line[5:].strip() for line in response.text.splitlines() if line.startswith("data:")]
        return json.loads(data[-1])
    return response.json()


async def test_another_tokens_retry_and_a_tampered_state_are_refused(gateway: GatewayProcess) -> None:
    owner, other = await mint(gateway, "owner"), await mint(gateway, "intruder")
    first = _json_of(await _post(gateway, owner, _call(1)))["result"]
    assert first["resultType"] == "input_required"
    assert first["inputRequests"]["ask"]["method"] == "elicitation/create"
    state = first["requestState"]
    assert "upstream-state" not in state  # the upstream's own state travels sealed, never as it is
    answer = {"ask": {"action": "accept", "content": {"answer": "mine"}}}

    stolen = _json_of(await _post(gateway, other, _call(2, inputResponses=answer, requestState=state)))
    assert "another token" in stolen["error"]["message"]
    payload, mac = state.split(".")
    tampered = f"{payload[:-2]}{'A' if payload[-2] != 'A' else 'B'}{payload[-1]}.{mac}"
    forged = _json_of(await _post(gateway, owner, _call(3, inputResponses=answer, requestState=tampered)))
    assert forged["error"]["data"]["error"] == "request_state_refused"

    done = _json_of(await _post(gateway, owner, _call(4, inputResponses=answer, requestState=state)))["result"]
    assert answer_of(done["content"][0]["text"]) == {"action": "accept", "content": {"answer": "mine"}}


async def test_a_2026_client_without_elicitation_gets_what_the_upstream_decided(gateway: GatewayProcess) -> None:
    """The upstream saw the client's own (empty) capabilities and asked anyway: its answer passes as written."""
    token = await mint(gateway, "plain")
    body = _call(1)
    body["params"]["_meta"] = {**META, "io.modelcontextprotocol/clientCapabilities": {}}
    answered = _json_of(await _post(gateway, token, body))
    assert answered["result"]["resultType"] == "input_required"
    assert list(answered["result"]["inputRequests"]) == ["ask"]


async def test_a_2025_sessions_own_capabilities_reach_the_modern_upstream(gateway: GatewayProcess) -> None:
    token = await mint(gateway, "declares")
    async with legacy_client(gateway, token, elicits=False) as session:
        seen = json.loads(await text_of(session.call_tool("seen_era", {})))
    assert seen["protocolVersion"] == MODERN
    assert "elicitation" not in (seen["capabilities"] or {})  # the session's declaration, not the gateway's
