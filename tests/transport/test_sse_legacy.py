"""The legacy HTTP+SSE transport (2024-11-05) with the official SDK's SSE client."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from mcp.client.session import ClientSession
from mcp.client.sse import sse_client

from satgate_mcp import events, jsonrpc
from satgate_mcp.app import create_app
from satgate_mcp.auth.base import NoAuthenticator, StaticTokenAuthenticator
from satgate_mcp.events import RecordingPublisher
from satgate_mcp.keys import INFLIGHT, METRICS, REGISTRY
from satgate_mcp.settings import Settings
from tests.fakes import AllowAllPolicy, AwaitablePublisher, FakePool

AppFactory = Callable[..., web.Application]


def make_app(publisher: RecordingPublisher, **settings: Any) -> web.Application:
    auth = (StaticTokenAuthenticator("s3cret-token") if settings.get("auth_mode") == "config"
            else NoAuthenticator())
    return create_app(Settings(**settings), authenticator=auth, pool=FakePool(), policy=AllowAllPolicy(),
                      publisher=publisher)


async def test_sdk_sse_client_initializes_lists_and_calls() -> None:
    publisher = AwaitablePublisher()
    app = make_app(publisher)
    async with TestServer(app) as server:
        async with sse_client(str(server.make_url("/sse"))) as (read, write), ClientSession(read, write) as session:
            init = await session.initialize()
            assert init.protocol_version == "2024-11-05"
            tools = await session.list_tools()
            assert "echo" in [t.name for t in tools.tools]
            result = await session.call_tool("echo", {"text": "over sse"})
            assert result.content[0].text == "over sse"  # type: ignore[union-attr]
        # The stream closing ends the session, without a tombstone (legacy sessions are never resumed).
        closed = await publisher.first(events.SESSION_CLOSE)
        assert closed["reason"] == "disconnected"
        assert app[REGISTRY].tombstone_count == 0


async def test_sse_refuses_a_missing_token_in_config_mode() -> None:
    app = make_app(RecordingPublisher(), auth_mode="config", static_token="s3cret-token")
    async with TestClient(TestServer(app)) as client:
        resp = await client.get("/sse")
        assert resp.status == 401
        body = await resp.json()
        assert body["error"]["data"]["error"] == "unauthorized"
        assert len(app[REGISTRY]) == 0


@pytest.mark.parametrize("session_id", [pytest.param("", id="none"), pytest.param("mcp-unknown", id="unknown")])
async def test_message_for_an_unknown_stream_is_404(session_id: str) -> None:
    app = make_app(RecordingPublisher())
    async with TestClient(TestServer(app)) as client:
        resp = await client.post(f"/message?sessionId={session_id}", json={"jsonrpc": "2.0", "id": 1, "method": "ping"})
        assert resp.status == 404
        assert (await resp.json())["error"]["data"]["error"] == "session_not_found"


async def test_shutdown_ends_open_streams_so_the_drain_need_not_wait() -> None:
    app = make_app(RecordingPublisher())
    async with TestClient(TestServer(app)) as client:
        resp = await client.get("/sse")
        first = await resp.content.readuntil(b"\n\n")
        assert first.startswith(b"event: endpoint")
        await app.shutdown()
        rest = await asyncio.wait_for(resp.content.read(), 5)
        assert rest == b""  # the server ended the stream


async def test_attack_a_message_flood_gets_rate_limited_replies_and_no_pile_of_tasks() -> None:
    """Past the in-flight bound each /message is refused at once (-32004 on the stream), never queued. In none
    mode that is the process's bound: ``anonymous`` is every client, so no per-token bound applies (issue 23)."""
    pool = FakePool()
    app = create_app(Settings(max_inflight=3), authenticator=NoAuthenticator(), pool=pool,
                     policy=AllowAllPolicy(), publisher=RecordingPublisher())
    async with TestClient(TestServer(app)) as client:
        stream = await client.get("/sse")
        endpoint = (await stream.content.readuntil(b"\n\n")).decode().split("data: ", 1)[1].strip()
        for n in range(50):
            resp = await client.post(endpoint, json={"jsonrpc": "2.0", "id": n, "method": "tools/call",
                                                     "params": {"name": "block", "arguments": {}}})
            assert resp.status == 202
        refused: list[dict[str, Any]] = []
        while len(refused) < 47:
            event = (await asyncio.wait_for(stream.content.readuntil(b"\n\n"), 5)).decode()
            if event.startswith("event: message"):
                refused.append(json.loads(event.split("data: ", 1)[1]))
        assert all(r["error"]["code"] == jsonrpc.RATE_LIMITED for r in refused)
        assert all(r["error"]["data"] == {"error": "rate_limited", "retry_after_seconds": 1} for r in refused)
        assert len(pool.calls) == 3
        assert app[INFLIGHT].in_flight == 3
        pool.release.set()
        answered: list[dict[str, Any]] = []
        while len(answered) < 3:
            event = (await asyncio.wait_for(stream.content.readuntil(b"\n\n"), 5)).decode()
            if event.startswith("event: message"):
                answered.append(json.loads(event.split("data: ", 1)[1]))
        assert all("result" in a for a in answered)
        assert app[INFLIGHT].in_flight == 0


async def test_a_full_registry_refuses_a_stream_with_503_and_counts_it_like_mcp() -> None:
    """The 503 for a full registry is one refusal wherever it is built: /sse counts it as /mcp does."""
    app = make_app(RecordingPublisher(), session_cap=1)
    async with TestClient(TestServer(app)) as client:
        first = await client.get("/sse")
        assert (await first.content.readuntil(b"\n\n")).startswith(b"event: endpoint")
        refused = await client.get("/sse")
        assert refused.status == 503
        assert refused.headers["Retry-After"].isdigit()
        assert (await refused.json())["error"]["data"]["error"] == "session_cap_reached"
        counted = app[METRICS].registry.get_sample_value("satgate_refusals_total", {"reason": "session_cap_reached"})
        assert counted == 1
        assert len(app[REGISTRY]) == 1


@pytest.mark.parametrize(
    ("body", "status", "error"),
    [
        pytest.param(b"{not json", 400, "parse_error", id="not-json"),
        pytest.param(b'{"id": 1, "method": "ping"}', 400, "invalid_request", id="json-but-not-json-rpc"),
        pytest.param(b'[{"jsonrpc": "2.0", "id": 1, "method": "ping"}]', 400, "invalid_request", id="a-batch"),
    ],
)
async def test_a_bad_message_is_refused_as_on_mcp(body: bytes, status: int, error: str) -> None:
    """/message parses with the rules of /mcp: JSON that is not a JSON-RPC message is an invalid request."""
    app = make_app(RecordingPublisher())
    async with TestClient(TestServer(app)) as client:
        stream = await client.get("/sse")
        endpoint = (await stream.content.readuntil(b"\n\n")).decode().split("data: ", 1)[1].strip()
        resp = await client.post(endpoint, data=body, headers={"Content-Type": "application/json"})
        assert resp.status == status
        assert (await resp.json())["error"]["data"]["error"] == error


async def test_a_legacy_stream_gets_list_changes_and_updates_of_the_resources_it_subscribed_to() -> None:
    """The legacy stream is its session's only stream: what GET /mcp would carry goes on it too."""
    from tests.transport.test_session_stream import SubscribablePool

    pool = SubscribablePool()
    app = create_app(Settings(), authenticator=NoAuthenticator(), pool=pool, policy=AllowAllPolicy(),
                     publisher=RecordingPublisher())

    async def next_message(stream: Any) -> dict[str, Any]:
        while True:
            event = (await asyncio.wait_for(stream.content.readuntil(b"\n\n"), 5)).decode()
            if event.startswith("event: message"):
                message: dict[str, Any] = json.loads(event.split("data: ", 1)[1])
                return message

    async with TestClient(TestServer(app)) as client:
        subscriber, other = await client.get("/sse"), await client.get("/sse")
        endpoints = [(await s.content.readuntil(b"\n\n")).decode().split("data: ", 1)[1].strip()
                     for s in (subscriber, other)]
        await client.post(endpoints[0], json={"jsonrpc": "2.0", "id": 1, "method": "resources/subscribe",
                                              "params": {"uri": "memo://a"}})
        assert (await next_message(subscriber))["id"] == 1
        assert pool.listener is not None
        pool.listener("notifications/resources/updated", {"uri": "memo://a"})
        pool.listener("notifications/prompts/list_changed", None)
        assert await next_message(subscriber) == jsonrpc.notification_message(
            "notifications/resources/updated", {"uri": "memo://a"})
        assert (await next_message(subscriber))["method"] == "notifications/prompts/list_changed"
        # the other session did not subscribe: only the list change reaches it
        assert (await next_message(other))["method"] == "notifications/prompts/list_changed"
