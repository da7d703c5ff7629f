"""``GET /mcp``: the session's own stream, its refusals, and what the pool's notices put on it."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any, cast

import pytest
import pytest_asyncio
from aiohttp import ClientResponse, web
from aiohttp.test_utils import TestClient
from pydantic import SecretStr
from pytest_aiohttp import AiohttpClient

from satgate_mcp import jsonrpc
from satgate_mcp.app import create_app
from satgate_mcp.auth.base import Identity
from satgate_mcp.jsonrpc import JsonObj
from satgate_mcp.sessions import Session
from satgate_mcp.settings import Settings
from satgate_mcp.subscriptions import SubscriptionTable
from satgate_mcp.transport.checks import RequestChecks
from satgate_mcp.transport.session_gate import SessionGate
from satgate_mcp.transport.session_stream import MAX_QUEUED, OpenStream, StandaloneStream, StreamHub
from satgate_mcp.upstream.base import ProgressCallback
from tests.answers import stream_messages
from tests.fakes import AllowAllPolicy, FakePool

TOKEN = "stream-test-token-0123456789abcdef"
VERSION = "2025-11-25"
SSE = "text/event-stream"


class SubscribablePool(FakePool):
    """Accepts every resource subscription."""

    async def call(self, method: str, params: JsonObj | None, *, on_progress: ProgressCallback | None = None
                   ) -> JsonObj:
        if method.startswith("resources/"):
            self.calls.append((method, params))
            return jsonrpc.result_response(0, {})
        return await super().call(method, params, on_progress=on_progress)


class Client:
    def __init__(self, client: TestClient[web.Request, web.Application], pool: FakePool) -> None:
        self.http = client
        self.pool = pool

    def headers(self, session: str | None, accept: str = SSE, token: str = TOKEN) -> dict[str, str]:
        sent = {"Accept": accept, "Authorization": f"Bearer {token}", "MCP-Protocol-Version": VERSION,
                "Content-Type": "application/json"}
        if session is not None:
            sent["Mcp-Session-Id"] = session
        return sent

    async def initialize(self) -> str:
        body = jsonrpc.request_message(1, "initialize", {"protocolVersion": VERSION, "capabilities": {},
                                                         "clientInfo": {"name": "t", "version": "1"}})
        resp = await self.http.post("/mcp", data=json.dumps(body),
                                    headers=self.headers(None, "application/json, text/event-stream"))
        assert resp.status == 200
        return resp.headers["Mcp-Session-Id"]

    async def rpc(self, session: str, method: str, params: JsonObj | None = None) -> JsonObj:
        resp = await self.http.post("/mcp", data=json.dumps(jsonrpc.request_message(7, method, params)),
                                    headers=self.headers(session, "application/json"))
        assert resp.status == 200, await resp.text()
        body: JsonObj = await resp.json()
        return body

    async def get(self, session: str | None, **kwargs: Any) -> ClientResponse:
        return await self.http.get("/mcp", headers=self.headers(session, **kwargs))


async def events(resp: ClientResponse) -> AsyncIterator[tuple[str | None, JsonObj | None]]:
    """(id, message) for each event of a stream; comments are skipped, a priming event has no message."""
    event_id: str | None = None
    data: str | None = None
    while line := await resp.content.readline():
        text = line.decode().rstrip("\n")
        if text.startswith("id: "):
            event_id = text[4:]
        elif text.startswith("data:"):
            data = text[5:].strip()
        elif text == "" and (event_id is not None or data is not None):
            yield event_id, (json.loads(data) if data else None)
            event_id = data = None


async def next_message(resp: ClientResponse) -> tuple[str | None, JsonObj]:
    async for event_id, message in events(resp):
        if message is not None:
            return event_id, message
    raise AssertionError("the stream ended")


@pytest_asyncio.fixture
async def gw(aiohttp_client: AiohttpClient) -> Client:
    pool = SubscribablePool()
    settings = Settings(auth_mode="config", static_token=SecretStr(TOKEN))
    app = create_app(settings, pool=pool, policy=AllowAllPolicy())
    return Client(await aiohttp_client(app), pool)


@pytest.mark.parametrize(
    ("accept", "session", "token", "status", "error"),
    [
        pytest.param("application/json", "live", TOKEN, 406, "not_acceptable", id="json-only-accept"),
        pytest.param(SSE, None, TOKEN, 400, "missing_session_id", id="no-session"),
        pytest.param(SSE, "mcp-unknown", TOKEN, 404, "session_not_found", id="unknown-session"),
        pytest.param(SSE, "live", "wrong-token-0123456789abcdef", 401, None, id="wrong-token"),
    ],
)
async def test_a_stream_needs_what_any_request_needs(gw: Client, accept: str, session: str | None, token: str,
                                                     status: int, error: str | None) -> None:
    live = await gw.initialize()
    resp = await gw.get(live if session == "live" else session, accept=accept, token=token)
    assert resp.status == status
    assert resp.content_type == "application/json"
    if error is not None:
        assert (await resp.json())["error"]["data"]["error"] == error


async def test_one_stream_per_session_a_second_gets_409(gw: Client) -> None:
    session = await gw.initialize()
    async with await gw.get(session) as first:
        assert first.status == 200
        assert first.headers["Content-Type"].startswith(SSE)
        assert first.headers["X-Accel-Buffering"] == "no"
        second = await gw.get(session)
        assert second.status == 409
        assert (await second.json())["error"]["data"]["error"] == "stream_already_open"
        other = await gw.initialize()  # another session has its own
        async with await gw.get(other) as own:
            assert own.status == 200


async def test_list_changes_reach_the_open_stream_with_event_ids_and_are_not_owed_again(gw: Client) -> None:
    session = await gw.initialize()
    await gw.rpc(session, "tools/list")
    async with await gw.get(session) as stream:
        priming = await anext(events(stream))
        assert priming == ("0", None)
        assert gw.pool.listener is not None
        gw.pool.tools_version += 1
        gw.pool.listener("notifications/tools/list_changed", None)
        gw.pool.listener("notifications/prompts/list_changed", None)
        assert await next_message(stream) == ("1", jsonrpc.notification_message("notifications/tools/list_changed"))
        assert await next_message(stream) == ("2", jsonrpc.notification_message("notifications/prompts/list_changed"))
        # told on the stream: the next answer carries no second notice (its stream holds the answer alone)
        resp = await gw.http.post("/mcp", data=json.dumps(jsonrpc.request_message(9, "ping")),
                                  headers=gw.headers(session, "application/json, text/event-stream"))
        assert stream_messages(await resp.read()) == [jsonrpc.result_response(9, {})]


async def test_resource_updates_reach_only_the_sessions_subscribed(gw: Client) -> None:
    reader, other = await gw.initialize(), await gw.initialize()
    assert "result" in await gw.rpc(reader, "resources/subscribe", {"uri": "memo://a"})
    async with await gw.get(reader) as mine, await gw.get(other) as theirs:
        assert gw.pool.listener is not None
        gw.pool.listener("notifications/resources/updated", {"uri": "memo://a"})
        gw.pool.listener("notifications/resources/updated", {"uri": "memo://unsubscribed"})
        gw.pool.listener("notifications/resources/list_changed", None)
        assert (await next_message(mine))[1] == jsonrpc.notification_message("notifications/resources/updated",
                                                                             {"uri": "memo://a"})
        assert (await next_message(mine))[1]["method"] == "notifications/resources/list_changed"
        assert (await next_message(theirs))[1]["method"] == "notifications/resources/list_changed"


async def test_the_stream_ends_with_its_session(gw: Client) -> None:
    session = await gw.initialize()
    async with await gw.get(session) as stream:
        deleted = await gw.http.delete("/mcp", headers=gw.headers(session))
        assert deleted.status == 200
        assert [message async for _, message in events(stream) if message is not None] == []


def test_a_slow_reader_is_cut_rather_than_queued_without_bound() -> None:
    stream = OpenStream(Session("s", "h", Identity(token_id="t"), VERSION, 0.0, 0.0))
    for i in range(MAX_QUEUED + 10):
        stream.deliver({"n": i})
    assert stream.queue.qsize() == MAX_QUEUED + 1
    items = [stream.queue.get_nowait() for _ in range(MAX_QUEUED + 1)]
    assert items[-1] is None
    assert items[-2] == {"n": MAX_QUEUED - 1}


async def test_no_stream_opens_once_the_drain_began(gw: Client) -> None:
    session = await gw.initialize()
    app = gw.http.app
    assert app is not None
    await app.shutdown()
    resp = await gw.get(session)
    assert (resp.status, resp.headers["Retry-After"]) == (503, "1")


async def test_shutdown_waits_until_every_open_stream_has_ended() -> None:
    """Regression: a stream still writing its end when a second SIGTERM cut the drain counted as a cut call."""
    hub = StreamHub(SubscriptionTable(), lambda: 0)
    stream = hub.open(Session("s", "h", Identity(token_id="t"), VERSION, 0.0, 0.0))
    assert stream is not None
    standalone = StandaloneStream(cast(RequestChecks, None), cast(SessionGate, None), hub)
    ending = asyncio.ensure_future(standalone.end_streams(web.Application()))
    assert await stream.queue.get() is None  # told to end ...
    assert not ending.done()  # ... and shutdown goes on only once it has
    hub.release(stream)
    await ending
