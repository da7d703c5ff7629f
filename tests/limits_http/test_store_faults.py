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
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
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
from satgate_mcp.auth.macaroons import mint_token
from satgate_mcp.errors import GatewayError
from satgate_mcp.events import RecordingPublisher
from satgate_mcp.keys import STORES
from satgate_mcp.metrics import Metrics
from satgate_mcp.policy.budget import Charge
from satgate_mcp.policy.duplicates import Table
from satgate_mcp.policy.engine import CallPolicy
from satgate_mcp.policy.limits import Bucket, rate_spec
from satgate_mcp.settings import Settings
from satgate_mcp.stores.memory import MemoryBudgetStore, MemoryDuplicateStore, MemoryRateLimiter
from satgate_mcp.stores.redis.policy import RedisStores
from satgate_mcp.stores.redis.revocations import RedisRevocationStore
from satgate_mcp.stores.redis.tombstones import RedisTombstones
from tests.answers import read_answer
from tests.cluster.redis_server import RedisServer, own_redis
from tests.fakes import FakePool

TOKEN = "store-fault-static-token-0123456789"
VERSION = "2025-11-25"
#: What a paused or dead Redis may cost one call: the configured timeout, with room for a loaded machine.
REDIS_TIMEOUT = 0.5
BOUND = REDIS_TIMEOUT * 4


@pytest.fixture
async def redis_server(tmp_path: Path) -> AsyncIterator[RedisServer]:
    async with own_redis(tmp_path) as server:
        yield server


async def gateway(aiohttp_client: AiohttpClient, redis_url: str, **overrides: Any
                  ) -> TestClient[web.Request, web.Application]:
    chosen: dict[str, Any] = {"rate_limit": "1000/s", **overrides}
    settings = Settings(auth_mode="config", static_token=SecretStr(TOKEN), redis_url=redis_url,
                        redis_timeout=REDIS_TIMEOUT, budgets={"static": 100.0}, enforcement="control", **chosen)
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


@pytest.mark.process
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


@pytest.mark.parametrize("rate_limit", ["1000/s", None], ids=["rate-bucket-first", "duplicate-record-first"])
@pytest.mark.process
async def test_a_paused_redis_costs_a_call_at_most_the_timeout(aiohttp_client: AiohttpClient,
                                                               redis_server: RedisServer, rate_limit: str | None
                                                               ) -> None:
    """CLIENT PAUSE: the connection stays up and every command waits; the call's store work (rate bucket,
    duplicate record, charge, the refusal's clean-up) shares one deadline."""
    client = await gateway(aiohttp_client, redis_server.url, rate_limit=rate_limit)
    session = await session_of(client)
    assert (await rpc(client, session, 2, "tools/call", echo("warm")))[0] == 200
    await redis_server.pause(3000)
    status, sent, body, took = await rpc(client, session, 3, "tools/call", echo("paused"))
    print(f"paused Redis: 503 after {took:.3f}s (SATGATE_REDIS_TIMEOUT={REDIS_TIMEOUT})")
    assert (status, sent["Retry-After"]) == (503, "1")
    assert body["error"]["data"]["error"] == "store_unavailable"
    assert took < REDIS_TIMEOUT * 2 + 0.5


@pytest.mark.process
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

    async def refund(self, budget_id: str, amount: float, *, refund_id: str = "") -> None:
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


@pytest.mark.process

async def test_header_mode_keeps_authenticating_from_the_revocation_mirror_while_redis_is_down(
        aiohttp_client: AiohttpClient, redis_server: RedisServer) -> None:
    """Revocation checks never wait on Redis: once the mirror synced, a token is checked with Redis gone, so
    what needs no store is served; the metered call alone is refused with 503."""
    key = "store-fault-header-root-key-0123456789abcdef"
    settings = Settings(auth_mode="header", root_key=SecretStr(key), redis_url=redis_server.url,
                        redis_timeout=REDIS_TIMEOUT, budgets={"agent": 100.0}, enforcement="control")
    app = create_app(settings, pool=FakePool())
    mirror = app[STORES].revocations  # the store the app's authenticator checks
    assert isinstance(mirror, RedisRevocationStore)
    client = await aiohttp_client(app)
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


# --- one allowance of store time per call (issue 14: "retries included") ------------------------------------

SLOW = 0.45  # each store operation of a slow store: under the timeout, but three in a row are not
STORE_UNAVAILABLE = {"error": "store_unavailable", "retry_after_seconds": 1}


class SlowRates(MemoryRateLimiter):
    async def acquire(self, buckets: Sequence[Bucket]) -> float:
        wait = await super().acquire(buckets)
        await asyncio.sleep(SLOW)
        return wait


class SlowRecords(MemoryDuplicateStore):
    """Applies at once (as a Redis script that ran), then its answer is slow to come back."""

    async def apply(self, key: str, table: Table) -> str:
        outcome = await super().apply(key, table)
        await asyncio.sleep(SLOW)
        return outcome


class SlowBudgets(MemoryBudgetStore):
    async def charge(self, key: str, cost: float, *, limit: float | None, enforce: bool,
                     charge_id: str = "") -> Charge:
        await asyncio.sleep(SLOW)
        return await super().charge(key, cost, limit=limit, enforce=enforce)


async def test_a_call_waits_on_a_slow_store_at_most_the_timeout_in_all_not_once_per_operation() -> None:
    """Rate bucket, duplicate record and charge are each answered within the timeout, yet together they
    would cost a call three times it (four with the refusal's clean-up): the call's store work has one
    deadline, and the record it left is put right after the refusal went out."""
    records = SlowRecords()
    policy = CallPolicy(publisher=RecordingPublisher(), metrics=Metrics(), rate=rate_spec("100/s", None),
                        rate_limiter=SlowRates(), duplicates=records, budgets=SlowBudgets(),
                        operator_budgets={"t": 10}, enforcement="control", store_timeout=REDIS_TIMEOUT)
    started = time.monotonic()
    with pytest.raises(GatewayError) as refused:
        await policy.admit(Identity(token_id="t"), method="tools/call", tool="echo", session_id="s", request_id=1,
                           params=echo("x"))
    took = time.monotonic() - started
    print(f"refused after {took:.3f}s (timeout {REDIS_TIMEOUT}s; unbounded it would be {4 * SLOW:.2f}s)")
    assert refused.value.data == STORE_UNAVAILABLE
    assert took < REDIS_TIMEOUT * 2
    assert len(records) == 1  # the arrival was recorded before its answer timed out
    await policy.close()  # waits for the clean-up that runs after the refusal
    assert len(records) == 0  # ... and is gone again, so a re-send is charged like a first copy


class DeadBudgets(MemoryBudgetStore):
    async def remaining(self, key: str, *, limit: float | None) -> float | None:
        raise ConnectionError("store went away")

    async def transfer(self, parent: str, child: str, amount: float, *, parent_limit: float | None,
                       ttl: float | None = None) -> Charge:
        raise ConnectionError("store went away")


@pytest.mark.parametrize("fail_mode", ["closed", "open"])
async def test_satgate_budget_and_delegate_answer_store_unavailable_never_an_internal_error(fail_mode: str) -> None:
    metrics = Metrics()
    policy = CallPolicy(publisher=RecordingPublisher(), metrics=metrics, budgets=DeadBudgets(),
                        operator_budgets={"t": 10}, enforcement="control", root_key="k" * 32,
                        fail_open=fail_mode == "open", store_timeout=REDIS_TIMEOUT)
    identity = Identity(token_id="t")
    with pytest.raises(GatewayError) as status:
        await policy.budget_status(identity)
    assert status.value.data == STORE_UNAVAILABLE
    with pytest.raises(GatewayError) as delegated:
        await policy.delegate(identity, {"budget": 1, "ttl": 60})
    assert delegated.value.data == STORE_UNAVAILABLE
    assert metrics.store_errors.labels(op="budget")._value.get() == 1
    assert metrics.store_errors.labels(op="delegate")._value.get() == 1


@pytest.mark.process
async def test_the_revocation_mirror_loads_at_start_up_so_redis_gone_before_the_first_request_costs_nothing(
        aiohttp_client: AiohttpClient, redis_server: RedisServer) -> None:
    key = "store-fault-startup-root-key-0123456789abcdef"
    settings = Settings(auth_mode="header", root_key=SecretStr(key), redis_url=redis_server.url,
                        redis_timeout=REDIS_TIMEOUT, enforcement="control")
    app = create_app(settings, pool=FakePool())
    mirror = app[STORES].revocations  # the store the app's authenticator checks
    assert isinstance(mirror, RedisRevocationStore)
    client = await aiohttp_client(app)
    await asyncio.wait_for(mirror.synced.wait(), 5)  # no request was made: the start-up loaded it
    redis_server.kill()
    body = jsonrpc.request_message(1, "initialize", {"protocolVersion": VERSION, "capabilities": {},
                                                     "clientInfo": {"name": "t", "version": "1"}})
    resp = await client.post("/mcp", data=json.dumps(body),
                             headers={**headers(None), "Authorization": f"Bearer {mint_token(key, 'agent')}"})
    assert resp.status == 200


@pytest.mark.process
async def test_every_redis_client_tries_a_command_once_so_a_paused_redis_costs_it_one_timeout(
        redis_server: RedisServer) -> None:
    """redis-py's ``Redis()`` retries three times with backoff by default: none of the gateway's clients may."""
    timeout = 0.3
    stores = RedisStores.from_url(redis_server.url, timeout=timeout)
    tombstones = RedisTombstones(redis_server.url, timeout=timeout)
    revocations = RedisRevocationStore(redis_server.url, timeout=timeout)
    operations: dict[str, Callable[[], Awaitable[object]]] = {
        "charge": lambda: stores.budgets.charge("b", 1.0, limit=5.0, enforce=True),
        "tombstone": lambda: tombstones.mark("mcp-x", 60),
        "revoke": lambda: revocations.revoke("tok-x"),
    }
    try:
        await stores.client.ping()
        await redis_server.pause(5000)
        for name, operation in operations.items():
            started = time.monotonic()
            with contextlib.suppress(redis.RedisError):
                await operation()
            took = time.monotonic() - started
            print(f"{name} with Redis paused: gave up after {took:.3f}s (timeout {timeout}s)")
            assert took < timeout * 2 + 0.3, name
    finally:
        await stores.aclose()
        await tombstones.aclose()
        await revocations.aclose()
