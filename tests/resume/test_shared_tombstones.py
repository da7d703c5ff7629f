"""DELETE is final cluster-wide with Redis (issue 14): two gateways (two apps, empty memories) on the machine's
real Redis at 127.0.0.1:6379, in header mode so either may resume the other's sessions.

The rules: a resume anywhere that starts after a DELETE completed is refused (404); a copy that is live on
another process when the DELETE happens ends within a second; and a DELETE racing resumes keeps both rules,
150 times over.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import pytest
import redis.asyncio as redis
from aiohttp import web
from aiohttp.test_utils import TestClient
from pydantic import SecretStr
from pytest_aiohttp import AiohttpClient

from satgate_mcp import jsonrpc
from satgate_mcp.app import create_app
from satgate_mcp.auth.macaroons import mint_token
from satgate_mcp.keys import TOMBSTONES
from satgate_mcp.settings import Settings
from tests.fakes import AllowAllPolicy, FakePool

REDIS_URL = "redis://127.0.0.1:6379/0"
KEY = "shared-tombstones-root-key-0123456789abcdef"
VERSION = "2025-11-25"
TOKEN = mint_token(KEY, "agent-shared")
#: The issue's bound for a live copy elsewhere to end.
SPREAD = 1.0
RACES = 150


class AppliedDeletes:
    """The session ids whose remote DELETE a gateway has applied, recorded as its tombstones apply them."""

    def __init__(self) -> None:
        self.ids: set[str] = set()
        self.changed = asyncio.Event()

    def follow(self, app: web.Application) -> None:
        tombstones = app[TOMBSTONES]
        apply = tombstones.on_remote_delete

        def applied(session_id: str) -> None:
            apply(session_id)
            self.ids.add(session_id)
            self.changed.set()

        tombstones.on_remote_delete = applied

    async def wait(self, session_id: str) -> None:
        while session_id not in self.ids:
            self.changed.clear()
            await self.changed.wait()


@dataclass
class Gateway:
    http: TestClient[web.Request, web.Application]
    deletes: AppliedDeletes = field(default_factory=AppliedDeletes)

    def headers(self, session: str | None) -> dict[str, str]:
        sent = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json",
                "Accept": "application/json, text/event-stream", "MCP-Protocol-Version": VERSION}
        if session is not None:
            sent["Mcp-Session-Id"] = session
        return sent

    async def initialize(self) -> str:
        body = jsonrpc.request_message(1, "initialize", {"protocolVersion": VERSION, "capabilities": {},
                                                         "clientInfo": {"name": "t", "version": "1"}})
        resp = await self.http.post("/mcp", data=json.dumps(body), headers=self.headers(None))
        assert resp.status == 200
        return resp.headers["Mcp-Session-Id"]

    async def ping(self, session: str) -> int:
        resp = await self.http.post("/mcp", data=json.dumps(jsonrpc.request_message(2, "ping")),
                                    headers=self.headers(session))
        await resp.read()
        return resp.status

    async def delete(self, session: str) -> int:
        resp = await self.http.delete("/mcp", headers=self.headers(session))
        return resp.status

    @property
    def app(self) -> web.Application:
        assert self.http.app is not None
        return self.http.app


StartGateway = Callable[[], Awaitable[Gateway]]


@pytest.fixture
async def start(aiohttp_client: AiohttpClient) -> StartGateway:
    probe = redis.Redis.from_url(REDIS_URL)
    try:
        await asyncio.wait_for(probe.ping(), 2)
    except (OSError, redis.RedisError, TimeoutError):
        pytest.skip("no Redis at 127.0.0.1:6379")
    finally:
        await probe.aclose()

    async def make() -> Gateway:
        settings = Settings(auth_mode="header", root_key=SecretStr(KEY), redis_url=REDIS_URL, state_dir="memory")
        gateway = Gateway(await aiohttp_client(create_app(settings, pool=FakePool(), policy=AllowAllPolicy())))
        await asyncio.wait_for(gateway.app[TOMBSTONES].following.wait(), 5)
        gateway.deletes.follow(gateway.app)
        return gateway

    return make


async def until_refused(gateway: Gateway, session: str) -> None:
    """The DELETE made elsewhere reaches ``gateway`` by pub/sub; once applied there, its copy is gone."""
    await gateway.deletes.wait(session)
    assert await gateway.ping(session) == 404


async def test_a_session_deleted_on_a_is_not_served_again_by_b_or_by_a_fresh_process(start: StartGateway) -> None:
    a, b = await start(), await start()
    session = await a.initialize()
    assert await b.ping(session) == 200  # b resumes it: a live copy there
    assert await a.delete(session) == 200
    await asyncio.wait_for(until_refused(b, session), SPREAD)  # the live copy ends within a second
    fresh = await start()
    assert await fresh.ping(session) == 404  # a process that never held it asks Redis first


async def test_attack_a_delete_racing_resumes_on_another_process_always_wins(start: StartGateway) -> None:
    a, b = await start(), await start()
    for _ in range(RACES):
        session = await a.initialize()
        deleted_at: list[float] = []
        _, (started, status) = await asyncio.gather(delete_and_note(a, session, deleted_at), timed_ping(b, session))
        if started > deleted_at[0]:
            assert status == 404, "a resume that began after the DELETE completed was served"
        await asyncio.wait_for(until_refused(b, session), SPREAD)
        assert await b.ping(session) == 404


async def delete_and_note(gateway: Gateway, session: str, deleted_at: list[float]) -> None:
    assert await gateway.delete(session) == 200
    deleted_at.append(time.monotonic())


async def timed_ping(gateway: Gateway, session: str) -> tuple[float, int]:
    started = time.monotonic()
    return started, await gateway.ping(session)
