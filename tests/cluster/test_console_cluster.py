"""The console across two real ``serve`` processes on one Redis: each lists both (their figures on the board), a
login taken on one holds on the other (the cookie is sealed under the shared root key), and a Revoke pressed on
one is refused on the other within a second."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import httpx2
import pytest

from satgate_mcp.auth.macaroons import mint_token
from tests.cluster.cluster import ROOT_KEY, Cluster, Mcp, shared_redis_url, unique

pytestmark = pytest.mark.process

SPREAD = 1.0
POLL_PAUSE = 0.05
TEST_TIMEOUT = 60.0


async def test_each_process_lists_both_and_a_console_revoke_reaches_the_other(
        make_cluster: Callable[..., Cluster], http: httpx2.AsyncClient) -> None:
    cluster = make_cluster(await shared_redis_url())
    admin = {"Authorization": f"Bearer {mint_token(ROOT_KEY, unique('ops'), admin=True)}"}
    async with asyncio.timeout(TEST_TIMEOUT):
        a, b = await cluster.started(2)
        started = time.monotonic()
        for gateway in (a, b):  # each samples at start; the other publishes when its own start samples
            while len((await http.get(f"{gateway.url}/console/api/overview", headers=admin)).json()["processes"]) < 2:
                assert time.monotonic() - started < 10.0, "the other process never appeared on the board"
                await asyncio.sleep(POLL_PAUSE)
        token_id = unique("agent")
        client = Mcp.mint(http, token_id)
        on_b = await client.initialize(b)
        login = await http.post(f"{a.url}/console/login", data={"token": admin["Authorization"][7:]},
                                headers={"Origin": a.url})
        cookie = login.cookies["satgate_console"]
        me = await http.get(f"{b.url}/console/api/me", headers={"Cookie": f"satgate_console={cookie}"})
        assert me.status_code == 200
        revoked = await http.post(f"{a.url}/console/api/tokens/revoke", json={"token_id": token_id}, headers=admin)
        assert revoked.status_code == 200
        revoked_at = time.monotonic()
        while (await client.echo(b, on_b, 2, "after")).outcome != "token_revoked":
            assert time.monotonic() - revoked_at < SPREAD
            await asyncio.sleep(POLL_PAUSE)
