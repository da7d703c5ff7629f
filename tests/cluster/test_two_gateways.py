"""N machines behave as one (issue 14): two real ``satgate-mcp serve`` processes on the machine's Redis, header
mode, one root key. A revocation made with the CLI is refused on the other machine within a second; a budget
is spent exactly once across both under concurrent calls; a DELETE on one is final on the other.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import httpx2
import pytest

from tests.cluster.cluster import Cluster, Mcp, shared_redis_url, unique

pytestmark = pytest.mark.process

#: The issue's bounds: a revocation refused everywhere, a live copy elsewhere ended.
SPREAD = 1.0
POLL_PAUSE = 0.02
TEST_TIMEOUT = 60.0


async def test_token_revoke_with_the_cli_is_refused_on_the_other_machine_within_a_second(
        make_cluster: Callable[..., Cluster], http: httpx2.AsyncClient) -> None:
    cluster = make_cluster(await shared_redis_url())
    async with asyncio.timeout(TEST_TIMEOUT):
        a, b = await cluster.started(2)
        token_id = unique("revoked")
        client = Mcp.mint(http, token_id)
        on_a, on_b = await client.initialize(a), await client.initialize(b)
        assert (await client.echo(b, on_b, 1, "before")).outcome == "served"

        await a.cli("token", "revoke", token_id)  # the operator's command, pointed at Redis only
        revoked_at = time.monotonic()
        while (answer := await client.echo(b, on_b, 2, "after")).outcome != "token_revoked":
            assert time.monotonic() - revoked_at < SPREAD, f"still served {SPREAD}s after the revoke: {answer}"
            await asyncio.sleep(POLL_PAUSE)  # pub/sub reaches B in its own time; a call is how we look
        print(f"refused on B {time.monotonic() - revoked_at:.3f}s after `token revoke` returned")
        assert answer.status == 403
        assert (await client.echo(a, on_a, 3, "after")).outcome == "token_revoked"
        listed = await client.rpc(b, on_b, 4, "tools/list")  # revoked is revoked, metered or not
        assert (listed.status, listed.outcome) == (403, "token_revoked")


async def test_a_budget_of_ten_is_spent_exactly_once_by_forty_concurrent_calls_over_both_machines(
        make_cluster: Callable[..., Cluster], http: httpx2.AsyncClient) -> None:
    cluster = make_cluster(await shared_redis_url())
    async with asyncio.timeout(TEST_TIMEOUT):
        a, b = await cluster.started(2)
        client = Mcp.mint(http, unique("budget"), budget_limit=10)
        sessions = {a.port: await client.initialize(a), b.port: await client.initialize(b)}
        gateways = [a if i % 2 else b for i in range(40)]
        answers = await asyncio.gather(*(client.echo(gw, sessions[gw.port], i + 1, f"x{i}")
                                         for i, gw in enumerate(gateways)))
    outcomes = [answer.outcome for answer in answers]
    assert outcomes.count("served") == 10, outcomes
    assert outcomes.count("budget_exhausted") == 30, outcomes
    served_on = {gw.port for gw, outcome in zip(gateways, outcomes, strict=True) if outcome == "served"}
    print(f"served on {len(served_on)} machine(s): "
          f"{sum(o == 'served' for gw, o in zip(gateways, outcomes, strict=True) if gw is a)} on A")


async def test_a_session_deleted_on_a_answers_404_on_b(
        make_cluster: Callable[..., Cluster], http: httpx2.AsyncClient) -> None:
    cluster = make_cluster(await shared_redis_url())
    async with asyncio.timeout(TEST_TIMEOUT):
        a, b = await cluster.started(2)
        client = Mcp.mint(http, unique("deleted"))

        never_on_b = await client.initialize(a)
        assert await client.delete(a, never_on_b) == 200
        assert (await client.rpc(b, never_on_b, 1, "ping")).status == 404  # B asks Redis before it resumes

        live_on_b = await client.initialize(a)
        assert (await client.rpc(b, live_on_b, 2, "ping")).status == 200  # B resumed it: a live copy there
        assert await client.delete(a, live_on_b) == 200
        deleted_at = time.monotonic()
        while (answer := await client.rpc(b, live_on_b, 3, "ping")).status != 404:
            assert time.monotonic() - deleted_at < SPREAD, f"B still serves it {SPREAD}s after the DELETE: {answer}"
            await asyncio.sleep(POLL_PAUSE)
        print(f"B's live copy ended {time.monotonic() - deleted_at:.3f}s after the DELETE on A")
        assert (await client.echo(a, live_on_b, 4, "x")).status == 404
