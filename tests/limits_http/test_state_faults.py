"""The state database (``SATGATE_STATE_DIR``, no Redis) fails like Redis does (issue 14): another process holds
its write lock past the busy timeout (an exclusive transaction on its own connection) or the file is damaged
mid-run. Closed: metered calls get 503 + Retry-After within the store timeout, what needs no store is served,
``/readyz`` drains the machine, and once the lock goes calls are metered again with no restart, the refused
ones never charged. Open: calls are admitted unmetered and counted.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient
from pydantic import SecretStr
from pytest_aiohttp import AiohttpClient

from satgate_mcp.app import create_app
from satgate_mcp.settings import Settings
from satgate_mcp.stores import LocalState
from satgate_mcp.stores.sqlite.database import DB_NAME
from tests.fakes import FakeClock, FakePool
from tests.limits_http.test_store_faults import TOKEN, echo, rpc, session_of

STORE_TIMEOUT = 0.5
RECOVERY = 3.0
POLL_PAUSE = 0.05

Client = TestClient[web.Request, web.Application]


async def gateway(aiohttp_client: AiohttpClient, state_dir: Path, **overrides: Any) -> Client:
    settings = Settings(auth_mode="config", static_token=SecretStr(TOKEN), state_dir=str(state_dir),
                        redis_timeout=STORE_TIMEOUT, budgets={"static": 100.0}, enforcement="control", **overrides)
    return await aiohttp_client(create_app(settings, pool=FakePool()))


async def readyz(client: Client) -> tuple[int, str]:
    resp = await client.get("/readyz")
    return resp.status, (await resp.json())["store"]


class Locker:
    """Another process's connection to the state database holding its write lock for as long as it likes."""

    def __init__(self, path: Path) -> None:
        self._conn = sqlite3.connect(path, isolation_level=None, timeout=0)

    def lock(self) -> None:
        self._conn.execute("BEGIN EXCLUSIVE")

    def release(self) -> None:
        self._conn.execute("ROLLBACK")

    def close(self) -> None:
        self._conn.close()


@pytest.fixture
def state_dir(tmp_path: Path) -> Path:
    return tmp_path / "state"


async def test_a_locked_state_database_refuses_metered_calls_with_503_keeps_the_rest_and_recovers(
        aiohttp_client: AiohttpClient, state_dir: Path) -> None:
    client = await gateway(aiohttp_client, state_dir)
    session = await session_of(client)
    assert (await rpc(client, session, 2, "tools/call", echo("before")))[0] == 200
    locker = Locker(state_dir / DB_NAME)
    try:
        locker.lock()
        status, sent, body, took = await rpc(client, session, 3, "tools/call", echo("during"))
        print(f"locked state database: {status} after {took:.3f}s (store timeout {STORE_TIMEOUT}s)")
        assert (status, sent["Retry-After"]) == (503, "1")
        assert body["error"]["data"] == {"error": "store_unavailable", "retry_after_seconds": 1}
        assert took < STORE_TIMEOUT * 2 + 0.5
        refused_again = await rpc(client, session, 4, "tools/call", echo("during"))
        assert refused_again[0] == 503
        assert (await rpc(client, session, 5, "tools/list"))[0] == 200  # needs no store
        assert (await rpc(client, session, 6, "ping"))[0] == 200
        budget_while_locked = await rpc(client, session, 9, "satgate/budget")  # a store read: 503, never -32603
        assert (budget_while_locked[0], budget_while_locked[2]["error"]["data"]["error"]) == (503, "store_unavailable")
        assert await readyz(client) == (503, "down")
    finally:
        locker.release()
        locker.close()

    back = time.monotonic()
    # The worker gets the lock back on its own; nothing here can be awaited but the next answer.
    while (answer := await rpc(client, session, 7, "tools/call", echo("after")))[0] != 200:
        assert time.monotonic() - back < RECOVERY, answer
        await asyncio.sleep(POLL_PAUSE)
    assert await readyz(client) == (200, "up")
    budget = await rpc(client, session, 8, "satgate/budget")
    assert budget[2]["result"]["remaining"] == 98  # "before" and "after": the two refused calls cost nothing


async def test_open_mode_admits_calls_while_the_state_database_is_locked_and_counts_them(
        aiohttp_client: AiohttpClient, state_dir: Path) -> None:
    client = await gateway(aiohttp_client, state_dir, store_fail_mode="open")
    session = await session_of(client)
    locker = Locker(state_dir / DB_NAME)
    try:
        locker.lock()
        status, _, body, _ = await rpc(client, session, 2, "tools/call", echo("open"))
        assert status == 200
        assert body["result"]["content"][0]["text"] == "open"
        assert await readyz(client) == (200, "down")  # open mode keeps serving: no reason to drain
        metrics = await (await client.get("/metrics")).text()
        assert "satgate_fail_open_admissions_total 1.0" in metrics
        assert 'satgate_store_errors_total{op="admit"} 1.0' in metrics
    finally:
        locker.release()
        locker.close()


def damage(state_dir: Path) -> None:
    """Overwrite the database, its WAL and the WAL's index under the running gateway."""
    with (state_dir / DB_NAME).open("r+b") as db:
        db.write(b"this is no longer a database" * 200)
    for path in state_dir.glob(f"{DB_NAME}-*"):
        path.write_bytes(b"\0" * 64)


async def test_a_state_database_damaged_mid_run_is_a_store_fault_not_an_internal_error(
        aiohttp_client: AiohttpClient, state_dir: Path) -> None:
    client = await gateway(aiohttp_client, state_dir)
    session = await session_of(client)
    assert (await rpc(client, session, 2, "tools/call", echo("before")))[0] == 200
    damage(state_dir)
    status, sent, body, _ = await rpc(client, session, 3, "tools/call", echo("damaged"))
    assert (status, sent.get("Retry-After")) == (503, "1"), body
    assert body["error"]["data"]["error"] == "store_unavailable"
    assert (await rpc(client, session, 4, "tools/list"))[0] == 200
    assert await readyz(client) == (503, "down")


async def test_attack_a_charge_its_caller_gave_up_on_is_never_made_once_the_lock_goes(state_dir: Path) -> None:
    """A 503 for a charge that would be made later, when the lock is released, would be a charge without a call."""
    state = LocalState.open(state_dir)
    locker = Locker(state_dir / DB_NAME)
    try:
        locker.lock()
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(STORE_TIMEOUT):
                await state.budgets.charge("agent", 1.0, limit=10.0, enforce=True)
        locker.release()
        assert await state.budgets.remaining("agent", limit=10.0) == 10.0  # the abandoned job was dropped
        charged = await state.budgets.charge("agent", 1.0, limit=10.0, enforce=True)
        assert charged.remaining == 9.0
    finally:
        locker.close()
        await state.aclose()


async def test_a_locked_state_database_holds_a_revocation_check_up_at_most_the_store_timeout(state_dir: Path) -> None:
    clock = FakeClock(100.0)
    state = LocalState.open(state_dir, monotonic=clock, timeout=STORE_TIMEOUT)
    await state.revocations.revoke("leaked")
    locker = Locker(state_dir / DB_NAME)
    try:
        locker.lock()
        clock.advance(1.0)  # a look at the database is due
        started = time.monotonic()
        assert await state.revocations.is_revoked("leaked")  # known ids stay revoked
        assert not await state.revocations.is_revoked("fine")
        took = time.monotonic() - started
        print(f"revocation check with the database locked: {took:.3f}s (busy timeout is 5 s)")
        assert took < STORE_TIMEOUT * 2 + 0.5
    finally:
        locker.release()
        locker.close()
        await state.aclose()
