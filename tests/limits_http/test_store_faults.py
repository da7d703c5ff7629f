"""A store fault costs no session and gets the right answer (issue 14): a Redis server this test starts, kills,
pauses and starts again behind the real app.

Closed fail mode: a metered call is 503 + Retry-After with a JSON-RPC body naming the store (never 401/403,
never -32603), what needs no store keeps working, and everything works again once Redis is back, without a
restart. Open fail mode: the call is admitted unmetered and counted. A paused Redis costs a call at most the
timeout. A fault after a call ran never costs the client its answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import socket
import subprocess
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as redis
from aiohttp import web
from aiohttp.test_utils import TestClient
from pydantic import SecretStr
from pytest_aiohttp import AiohttpClient

from satgate_mcp import jsonrpc
from satgate_mcp.app import create_app
from satgate_mcp.auth.base import Identity
from satgate_mcp.auth.factory import authenticator_from_settings
from satgate_mcp.auth.header import MacaroonAuthenticator
from satgate_mcp.auth.macaroons import mint_token
from satgate_mcp.auth.revocation import RedisRevocationStore
from satgate_mcp.events import RecordingPublisher
from satgate_mcp.metrics import Metrics
from satgate_mcp.policy.budget import MemoryBudgetStore
from satgate_mcp.policy.engine import CallPolicy
from satgate_mcp.settings import Settings
from tests.answers import read_answer
from tests.fakes import FakePool

TOKEN = "store-fault-static-token-0123456789"
VERSION = "2025-11-25"
#: What a paused or dead Redis may cost one call: the configured timeout, with room for a loaded machine.
REDIS_TIMEOUT = 0.5
BOUND = REDIS_TIMEOUT * 4
START_TIMEOUT = 10.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class RedisServer:
    """A redis-server of this test's own, on a free port, that it may kill and start again."""

    def __init__(self, workdir: Path) -> None:
        self.port = free_port()
        self.workdir = workdir
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def spawn(self) -> None:
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", str(self.workdir)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    async def start(self) -> None:
        self.spawn()
        client = redis.Redis.from_url(self.url, socket_connect_timeout=0.2)
        try:
            async with asyncio.timeout(START_TIMEOUT):
                while True:  # a fresh server has nothing to await but its port
                    with contextlib.suppress(OSError, redis.RedisError):
                        if await client.ping():
                            return
                    await asyncio.sleep(0.05)
        finally:
            await client.aclose()

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)
        self.proc = None

    async def pause(self, milliseconds: int) -> None:
        client = redis.Redis.from_url(self.url)
        try:
            await client.client_pause(milliseconds)
        finally:
            await client.aclose()


@pytest.fixture
async def redis_server(tmp_path: Path) -> AsyncIterator[RedisServer]:
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed")
    server = RedisServer(tmp_path)
    await server.start()
    yield server
    server.kill()


async def gateway(aiohttp_client: AiohttpClient, redis_url: str, **overrides: Any
                  ) -> TestClient[web.Request, web.Application]:
    settings = Settings(auth_mode="config", static_token=SecretStr(TOKEN), redis_url=redis_url,
                        redis_timeout=REDIS_TIMEOUT, rate_limit="1000/s", budgets={"static": 100.0},
                        enforcement="control", **overrides)
    return await aiohttp_client(create_app(settings, pool=FakePool()))


async def session_of(client: TestClient[web.Request, web.Application]) -> str:
    body = jsonrpc.request_message(1, "initialize", {"protocolVersion": VERSION, "capabilities": {},
                                                     "clientInfo": {"name": "t", "version": "1"}})
    resp = await client.post("/mcp", data=json.dumps(body), headers=headers(None))
    assert resp.status == 200
    return resp.headers["Mcp-Session-Id"]


def headers(session: str | None) -> dict[str, str]:
    sent = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json",
            "Accept": "application/json, text/event-stream", "MCP-Protocol-Version": VERSION}
    if session is not None:
        sent["Mcp-Session-Id"] = session
    return sent


async def rpc(client: TestClient[web.Request, web.Application], session: str, request_id: int, method: str,
              params: dict[str, Any] | None = None) -> tuple[int, dict[str, str], Any, float]:
    started = time.monotonic()
    resp = await client.post("/mcp", data=json.dumps(jsonrpc.request_message(request_id, method, params)),
                             headers=headers(session))
    return resp.status, dict(resp.headers), await read_answer(resp), time.monotonic() - started


def echo(text: str) -> dict[str, Any]:
    return {"name": "echo", "arguments": {"text": text}}


async def test_redis_killed_refuses_metered_calls_with_503_keeps_the_rest_and_recovers_without_a_restart(
        aiohttp_client: AiohttpClient, redis_server: RedisServer) -> None:
    client = await gateway(aiohttp_client, redis_server.url)
    session = await session_of(client)
    assert (await rpc(client, session, 2, "tools/call", echo("before")))[0] == 200

    redis_server.kill()
    status, sent, body, took = await rpc(client, session, 3, "tools/call", echo("during"))
    assert (status, sent["Retry-After"]) == (503, "1")
    assert body["id"] == 3
    assert body["error"]["data"] == {"error": "store_unavailable", "retry_after_seconds": 1}
    assert took < BOUND
    ready = await client.get("/readyz")
    assert (ready.status, (await ready.json())["store"]) == (503, "down")  # a balancer drains this machine
    listed = await rpc(client, session, 4, "tools/list")
    assert listed[0] == 200
    assert [t["name"] for t in listed[2]["result"]["tools"]][:1] == ["echo"]  # needs no store: still served

    await redis_server.start()
    async with asyncio.timeout(3.0):  # the bound for recovery once Redis is back
        # A client retries after its Retry-After; the gateway's recovery has no event a test could await.
        while (answer := await rpc(client, session, 5, "tools/call", echo("after")))[0] != 200:  # noqa: ASYNC110
            await asyncio.sleep(0.05)
    assert answer[2]["result"]["content"][0]["text"] == "after"
    ready = await client.get("/readyz")
    assert (ready.status, (await ready.json())["store"]) == (200, "up")


async def test_a_paused_redis_costs_a_call_at_most_the_timeout(aiohttp_client: AiohttpClient,
                                                               redis_server: RedisServer) -> None:
    client = await gateway(aiohttp_client, redis_server.url)
    session = await session_of(client)
    assert (await rpc(client, session, 2, "tools/call", echo("warm")))[0] == 200
    await redis_server.pause(3000)
    status, _, body, took = await rpc(client, session, 3, "tools/call", echo("paused"))
    assert status == 503
    assert body["error"]["data"]["error"] == "store_unavailable"
    assert took < BOUND


async def test_fail_open_admits_the_call_unmetered_and_counts_it(aiohttp_client: AiohttpClient,
                                                                 redis_server: RedisServer) -> None:
    client = await gateway(aiohttp_client, redis_server.url, store_fail_mode="open")
    session = await session_of(client)
    redis_server.kill()
    status, _, body, _ = await rpc(client, session, 2, "tools/call", echo("open"))
    assert status == 200
    assert body["result"]["content"][0]["text"] == "open"
    metrics = await (await client.get("/metrics")).text()
    assert "satgate_fail_open_admissions_total 1.0" in metrics
    assert 'satgate_store_errors_total{op="admit"}' in metrics


class FailingRefunds(MemoryBudgetStore):
    """Charges work; the refund after a call that certainly did not run cannot be written."""

    async def refund(self, budget_id: str, amount: float) -> None:
        raise ConnectionError("store went away")


async def test_a_store_fault_after_the_call_never_costs_the_client_its_answer() -> None:
    publisher, metrics = RecordingPublisher(), Metrics()
    policy = CallPolicy(publisher=publisher, metrics=metrics, budgets=FailingRefunds(),
                        operator_budgets={"t": 10}, enforcement="control")
    identity = Identity(token_id="t")
    admission = await policy.admit(identity, method="tools/call", tool="echo", session_id="s", request_id=1,
                                   params=echo("x"))
    await policy.settle(admission, ran=False)  # wants a refund, the store refuses: logged, not raised
    assert metrics.store_errors.labels(op="settle")._value.get() == 1



async def test_header_mode_keeps_authenticating_from_the_revocation_mirror_while_redis_is_down(
        aiohttp_client: AiohttpClient, redis_server: RedisServer) -> None:
    """Revocation checks never wait on Redis: once the mirror synced, a token is checked with Redis gone, so
    what needs no store is served; the metered call alone is refused with 503."""
    key = "store-fault-header-root-key-0123456789abcdef"
    settings = Settings(auth_mode="header", root_key=SecretStr(key), redis_url=redis_server.url,
                        redis_timeout=REDIS_TIMEOUT, budgets={"agent": 100.0}, enforcement="control")
    authenticator = authenticator_from_settings(settings)
    assert isinstance(authenticator, MacaroonAuthenticator)
    mirror = authenticator.revocations
    assert isinstance(mirror, RedisRevocationStore)
    client = await aiohttp_client(create_app(settings, pool=FakePool(), authenticator=authenticator))
    token = mint_token(key, "agent")
    auth = {"Authorization": f"Bearer {token}"}
    body = jsonrpc.request_message(1, "initialize", {"protocolVersion": VERSION, "capabilities": {},
                                                     "clientInfo": {"name": "t", "version": "1"}})
    resp = await client.post("/mcp", data=json.dumps(body), headers={**headers(None), **auth})
    assert resp.status == 200
    session = resp.headers["Mcp-Session-Id"]
    await asyncio.wait_for(mirror.synced.wait(), 5)
    redis_server.kill()
    listed = await client.post("/mcp", data=json.dumps(jsonrpc.request_message(2, "tools/list")),
                               headers={**headers(session), **auth})
    assert listed.status == 200
    called = await client.post("/mcp", data=json.dumps(jsonrpc.request_message(3, "tools/call", echo("x"))),
                               headers={**headers(session), **auth})
    assert called.status == 503
    await authenticator.aclose()
