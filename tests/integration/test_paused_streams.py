"""An upstream that closes a call's stream mid-call to be polled (SEP-1699), through the gateway.

The real SDK upstream (``--conformance``: an event store, and ``test_reconnection``, which closes
its stream before answering) over HTTP. The gateway resumes the upstream's stream with
``Last-Event-ID`` itself, closes its client's stream likewise, and the client resumes from the
gateway the same way: through the gateway as directly.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import aiohttp
import pytest
import pytest_asyncio

from satgate_mcp.upstream.wire import SseDecoder, SseEvent
from tests.conftest import HttpUpstreamProcess
from tests.integration.test_gateway_with_sdk import TOKEN, connect, gateway_settings, http_upstream, serving

pytestmark = pytest.mark.process

VERSION = "2025-11-25"
BOTH = "application/json, text/event-stream"
CALL_TIMEOUT = 20.0
RECONNECT = {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
             "params": {"name": "test_reconnection", "arguments": {}}}


@pytest_asyncio.fixture
async def gateway(http_upstream_factory: type[HttpUpstreamProcess]) -> AsyncIterator[str]:
    upstream = http_upstream_factory("--name", "conf", "--conformance")
    async with serving(gateway_settings({"conf": http_upstream(upstream.url)})) as base:
        yield f"{base}/mcp"


def headers(session: str | None = None, accept: str = BOTH) -> dict[str, str]:
    sent = {"Authorization": f"Bearer {TOKEN}", "Accept": accept, "Content-Type": "application/json",
            "MCP-Protocol-Version": VERSION}
    if session:
        sent["Mcp-Session-Id"] = session
    return sent


async def open_session(http: aiohttp.ClientSession, url: str) -> str:
    init = {"jsonrpc": "2.0", "id": 0, "method": "initialize",
            "params": {"protocolVersion": VERSION, "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}
    async with http.post(url, json=init, headers=headers()) as resp:
        assert resp.status == 200
        return resp.headers["Mcp-Session-Id"]


async def events_of(resp: aiohttp.ClientResponse) -> list[SseEvent]:
    assert resp.content_type == "text/event-stream"
    return SseDecoder().feed(await resp.read() + b"\n\n")


async def test_the_gateway_closes_the_clients_stream_as_the_upstream_did_and_the_client_resumes_it(
        gateway: str) -> None:
    async with aiohttp.ClientSession() as http:
        session = await open_session(http, gateway)
        async with asyncio.timeout(CALL_TIMEOUT):
            async with http.post(gateway, json=RECONNECT, headers=headers(session)) as resp:
                first = await events_of(resp)
            assert [e.data for e in first if e.data.strip()] == []  # closed before the answer
            last_id = first[-1].id
            assert last_id is not None
            resume = {**headers(session, "text/event-stream"), "Last-Event-ID": last_id}
            async with http.get(gateway, headers=resume) as resp:
                rest = [json.loads(e.data) for e in await events_of(resp) if e.data.strip()]
    [answer] = rest
    assert answer["id"] == 1
    assert answer["result"]["content"][0]["text"] == "Reconnection test finished"


async def test_a_client_that_cannot_resume_gets_the_answer_the_gateway_resumed_for_it(gateway: str) -> None:
    async with aiohttp.ClientSession() as http:
        session = await open_session(http, gateway)
        async with asyncio.timeout(CALL_TIMEOUT), http.post(gateway, json=RECONNECT,
                                                             headers=headers(session, "application/json")) as resp:
            assert resp.content_type == "application/json"
            answer = await resp.json()
    assert answer["result"]["content"][0]["text"] == "Reconnection test finished"


async def test_an_older_session_has_no_ids_to_resume_so_its_stream_stays_open_until_the_answer(gateway: str) -> None:
    async with aiohttp.ClientSession() as http:
        init = {"jsonrpc": "2.0", "id": 0, "method": "initialize",
                "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                           "clientInfo": {"name": "t", "version": "1"}}}
        async with http.post(gateway, json=init, headers=headers()) as resp:
            session = resp.headers["Mcp-Session-Id"]
        old = {**headers(session), "MCP-Protocol-Version": "2025-06-18"}
        async with asyncio.timeout(CALL_TIMEOUT), http.post(gateway, json=RECONNECT, headers=old) as resp:
            messages = [json.loads(e.data) for e in await events_of(resp) if e.data.strip()]
    assert [m.get("id") for m in messages] == [1]


async def test_the_official_sdk_client_resumes_through_the_gateway_by_itself(
        http_upstream_factory: type[HttpUpstreamProcess]) -> None:
    upstream = http_upstream_factory("--name", "conf", "--conformance")
    async with serving(gateway_settings({"conf": http_upstream(upstream.url)})) as base, connect(base) as agent:
        # the POST stream ends before the answer: only a resumption with Last-Event-ID brings it
        assert await agent.text("test_reconnection") == "Reconnection test finished"
