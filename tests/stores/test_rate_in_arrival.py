"""On Redis a metered call's rate check rides in its arrival's script: one round trip takes the rate token, records
the call and charges it. What must still hold: an empty bucket refuses the call before it arrives (no record, no
charge, so its retry after the wait is a fresh call), a copy of a call in flight still pays its rate token, and a
lost answer to the combined script is resolved like any lost charge (the rate refusal it kept is a refusal).
Real Redis; faults injected by the losing client of test_lost_answers.py."""

from __future__ import annotations

import asyncio
import hashlib
import uuid

import pytest

from satgate_mcp import jsonrpc
from satgate_mcp.errors import GatewayError
from satgate_mcp.events import RecordingPublisher
from satgate_mcp.jsonrpc import JsonObj
from satgate_mcp.metrics import Metrics
from satgate_mcp.policy.engine import CallPolicy
from satgate_mcp.policy.limits import rate_spec
from satgate_mcp.stores.redis import policy as redis_policy
from satgate_mcp.stores.redis.admissions import RedisAdmissions
from satgate_mcp.stores.redis.policy import RedisBudgetStore, RedisDuplicateStore, RedisRateLimiter
from tests.stores.test_lost_answers import (
    AGENT,
    BY_SHA,
    LIMIT,
    STORE_TIMEOUT,
    Ledger,
    LosingRedis,
    Upstream,
    client,
    one_try,
    spent,
)

__all__ = ["client"]

BY_SHA.setdefault(hashlib.sha1(redis_policy._RATE_LUA.encode()).hexdigest(), "rate")


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def rated_policy(client: LosingRedis, clock: Clock, burst: int = 2) -> CallPolicy:
    """One call a minute after a burst of ``burst``, on Redis for everything (rate buckets included)."""
    prefix = f"test:rate:{uuid.uuid4().hex}:"
    return CallPolicy(publisher=RecordingPublisher(), metrics=Metrics(), rate=rate_spec("1/m", burst),
                      rate_limiter=RedisRateLimiter(client, prefix=prefix, clock=clock),
                      budgets=RedisBudgetStore(client, prefix=prefix),
                      duplicates=RedisDuplicateStore(client, prefix=prefix),
                      admissions=RedisAdmissions(client, prefix=prefix, clock=clock),
                      operator_budgets={"agent": LIMIT}, enforcement="control", store_timeout=STORE_TIMEOUT)


async def test_a_metered_call_is_one_round_trip_and_past_the_burst_is_refused_unrecorded(client: LosingRedis) -> None:
    clock = Clock()
    policy = rated_policy(client, clock)
    upstream, ledger = Upstream(), Ledger()
    for n in (1, 2, 3):
        await one_try(policy, upstream, ledger, session="s", request_id=n)
    assert ledger.answers == ["ok", "ok", "rate_limited"]
    assert [seen for seen in client.seen if not seen.startswith("record")] == ["arrive:none"] * 3  # no rate script
    assert await spent(policy) == 2 == upstream.runs
    clock.now += 61  # a token again: the refused call's retry is a fresh call, charged once
    await one_try(policy, upstream, ledger, session="s", request_id=3)
    await policy.close()
    assert ledger.answers[-1] == "ok"
    assert await spent(policy) == 3 == upstream.runs


async def test_a_resent_call_still_pays_its_rate_token(client: LosingRedis) -> None:
    """The same request again (free when it may run: a re-send) is rate limited like any other."""
    clock = Clock()
    policy = rated_policy(client, clock, burst=1)
    upstream, ledger = Upstream(), Ledger()
    await one_try(policy, upstream, ledger, session="s", request_id=1)
    await one_try(policy, upstream, ledger, session="s", request_id=1)
    await policy.close()
    assert ledger.answers == ["ok", "rate_limited"]
    assert await spent(policy) == 1 == upstream.runs


async def test_a_copy_of_a_call_in_flight_takes_its_rate_token_on_its_own(client: LosingRedis) -> None:
    """A copy that joins a running call has no arrival of its own: its rate is checked alone, first."""
    clock = Clock()
    policy = rated_policy(client, clock, burst=1)
    release = asyncio.Event()

    async def slow() -> JsonObj:
        await release.wait()
        return jsonrpc.result_response(None, {"content": []})

    params = {"name": "echo", "arguments": {"n": 1}}
    first = await policy.admit(AGENT, method="tools/call", tool="echo", session_id="s", request_id=1, params=params)
    running = asyncio.ensure_future(policy.run(first, slow))
    with pytest.raises(GatewayError) as refused:
        await policy.admit(AGENT, method="tools/call", tool="echo", session_id="s", request_id=1, params=params)
    release.set()
    await running
    await policy.close()
    assert (refused.value.data or {}).get("error") == "rate_limited"
    assert "rate:none" in client.seen
    assert await spent(policy) == 1


async def test_a_lost_answer_of_a_rate_refusal_is_resolved_as_a_refusal(client: LosingRedis) -> None:
    clock = Clock()
    policy = rated_policy(client, clock, burst=1)
    upstream, ledger = Upstream(), Ledger()
    await one_try(policy, upstream, ledger, session="s", request_id=1)
    client.plan = {"arrive": ["after"]}  # the script refused on the rate limit; its answer is lost
    await one_try(policy, upstream, ledger, session="s", request_id=2)
    await policy.close()
    assert ledger.answers == ["ok", "rate_limited"], client.seen
    assert "landed:none" in client.seen  # asked, found the kept refusal
    assert await spent(policy) == 1 == upstream.runs
