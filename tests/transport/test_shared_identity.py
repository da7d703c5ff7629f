"""Shared identities over HTTP (issue 23): in none and config modes every client is one identity, so a
per-token quota must not turn into a cap on the whole gateway; header mode keeps its per-token quotas."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping, Sequence
from typing import Any

import pytest
from aiohttp import ClientResponse, web
from aiohttp.test_utils import TestClient
from pytest_aiohttp import AiohttpClient
from structlog.testing import capture_logs

from satgate_mcp import events, jsonrpc
from satgate_mcp.app import create_app
from satgate_mcp.auth.base import (
    Authenticator,
    AuthOutcome,
    AuthResult,
    Identity,
    NoAuthenticator,
    StaticTokenAuthenticator,
    bearer_from_header,
)
from satgate_mcp.events import RecordingPublisher
from satgate_mcp.jsonrpc import JsonObj
from satgate_mcp.keys import INFLIGHT, REGISTRY
from satgate_mcp.sessions import QUOTA_EVICTING
from satgate_mcp.settings import Settings
from tests.answers import read_answer
from tests.fakes import AllowAllPolicy, FakePool, until

STATIC = "s3cret-static-token"
CLIENTS = 150
QUOTA = 100
WAIT = 5.0  # bound on waiting for an answer the code under test sends

Client = TestClient[web.Request, web.Application]


class TokenNameAuthenticator:
    """Stand-in for header mode: any ``tok-<name>`` bearer is identity ``<name>``."""

    mode = "header"

    async def authenticate(self, authorization: str | None) -> AuthResult:
        token = bearer_from_header(authorization)
        if token is None or not token.startswith("tok-"):
            return AuthResult(AuthOutcome.MISSING, reason="no tok- bearer")
        return AuthResult(AuthOutcome.OK, Identity(token_id=token[4:]), token)


async def start(aiohttp_client: AiohttpClient, authenticator: Authenticator, publisher: RecordingPublisher,
                pool: FakePool | None = None, **settings: Any) -> Client:
    app = create_app(Settings(**settings), authenticator=authenticator, pool=pool or FakePool(),
                     policy=AllowAllPolicy(), publisher=publisher)
    return await aiohttp_client(app)


async def post(client: Client, body: JsonObj, token: str | None, session: str | None = None) -> ClientResponse:
    headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    if session is not None:
        headers["Mcp-Session-Id"] = session
    return await client.post("/mcp", data=json.dumps(body), headers=headers)


async def initialize(client: Client, token: str | None) -> str:
    resp = await post(client, jsonrpc.request_message(0, "initialize", {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}), token)
    assert resp.status == 200, await resp.text()
    return resp.headers["Mcp-Session-Id"]


async def ping(client: Client, token: str | None, session: str) -> ClientResponse:
    return await post(client, jsonrpc.request_message(1, "ping"), token, session)


def warned(logs: Sequence[Mapping[str, Any]]) -> list[Any]:
    return [e["token_id"] for e in logs if e["event"] == QUOTA_EVICTING and e["log_level"] == "warning"]


@pytest.mark.parametrize(
    ("authenticator", "token"),
    [
        pytest.param(NoAuthenticator(), None, id="none"),
        pytest.param(StaticTokenAuthenticator(STATIC), STATIC, id="config"),
    ],
)
async def test_150_clients_of_a_shared_identity_all_keep_their_sessions(
        aiohttp_client: AiohttpClient, authenticator: Authenticator, token: str | None) -> None:
    """The first 50 used to get 404 session_not_found: SATGATE_SESSIONS_PER_TOKEN capped the whole gateway."""
    publisher = RecordingPublisher()
    client = await start(aiohttp_client, authenticator, publisher, sessions_per_token=QUOTA)
    with capture_logs() as logs:
        sessions = [await initialize(client, token) for _ in range(CLIENTS)]
        for session in sessions:
            resp = await ping(client, token, session)
            assert resp.status == 200, await resp.text()
            assert "result" in await read_answer(resp)
    assert client.app is not None
    assert len(client.app[REGISTRY]) == CLIENTS
    assert publisher.named(events.SESSION_CLOSE) == []
    assert warned(logs) == []


async def test_attack_in_header_mode_one_token_flooding_evicts_only_its_own_sessions_and_warns_once(
        aiohttp_client: AiohttpClient) -> None:
    publisher = RecordingPublisher()
    client = await start(aiohttp_client, TokenNameAuthenticator(), publisher, sessions_per_token=QUOTA)
    bob = await initialize(client, "tok-bob")
    with capture_logs() as logs:
        flood = [await initialize(client, "tok-mallory") for _ in range(CLIENTS)]
    assert warned(logs) == ["mallory"]
    evicted = [e["session_id"] for e in publisher.named(events.SESSION_CLOSE) if e["reason"] == "evicted"]
    assert evicted == flood[:CLIENTS - QUOTA]
    assert (await ping(client, "tok-bob", bob)).status == 200
    assert (await ping(client, "tok-mallory", flood[-1])).status == 200


async def test_requests_in_flight_of_a_shared_identity_are_bounded_by_the_process_only(
        aiohttp_client: AiohttpClient) -> None:
    """SATGATE_MAX_INFLIGHT_PER_TOKEN would be a gateway-wide bound for ``anonymous``: SATGATE_MAX_INFLIGHT rules."""
    pool = FakePool()
    client = await start(aiohttp_client, NoAuthenticator(), RecordingPublisher(), pool=pool,
                         max_inflight_per_token=2, max_inflight=5)
    sessions = [await initialize(client, None) for _ in range(6)]
    calls = [asyncio.create_task(post(client, jsonrpc.request_message(n, "tools/call", {"name": "block",
                                                                                         "arguments": {}}),
                                      None, sessions[n])) for n in range(5)]
    await until(lambda: len(pool.calls) == 5)  # five clients past the per-token bound of 2 are all running
    refused = await read_answer(await post(client, jsonrpc.request_message(9, "tools/call", {
        "name": "echo", "arguments": {}}), None, sessions[5]))
    assert refused["error"]["data"]["error"] == "rate_limited"  # the process bound still holds
    pool.release.set()
    for call in calls:
        assert "result" in await read_answer(await asyncio.wait_for(call, WAIT))
    assert client.app is not None
    assert client.app[INFLIGHT].in_flight == 0
