"""Exact accounting under store faults (issue 31): every metered call is charged and answered, or neither.

A real Redis behind a client that loses one script's answer on purpose: ``before`` (the script never ran),
``after`` (it ran, and the client saw a timeout: the charge landed, the answer did not). The fault is put on each
step of a call's store work in turn: the arrival with its charge (a session's call), the bare charge (a stateless
call), the resolution that asks whether a lost charge landed, the settlement's record, its refund. Each scenario
runs one clean call first, then the faulty one as a client would (a 503 is retried with the same request, once);
once the policy has finished its background work the budget has paid for exactly the calls that were answered,
and a retry of a refused call is charged once at most.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import redis.asyncio as redis
from redis.exceptions import TimeoutError as RedisTimeout

from satgate_mcp.auth.base import Identity
from satgate_mcp.errors import GatewayError, UpstreamUnavailable
from satgate_mcp.events import RecordingPublisher
from satgate_mcp.jsonrpc import JsonObj
from satgate_mcp.metrics import Metrics
from satgate_mcp.policy.engine import CallPolicy
from satgate_mcp.stores.memory import MemoryRateLimiter
from satgate_mcp.stores.redis import admissions as redis_admissions
from satgate_mcp.stores.redis import policy as redis_policy
from satgate_mcp.stores.redis.admissions import RedisAdmissions
from satgate_mcp.stores.redis.policy import RedisBudgetStore, RedisDuplicateStore
from tests.stores.conftest import REDIS_URL

STORE_TIMEOUT = 0.5
LIMIT = 10.0
SCRIPTS = {
    "arrive": redis_admissions._ARRIVE_SCRIPT,
    "charge": redis_policy._CHARGE_LUA,
    "landed": redis_policy.LANDED_LUA,
    "record": redis_policy._APPLY_LUA,
    "refund": redis_policy._REFUND_LUA,
}
BY_SHA = {hashlib.sha1(lua.encode()).hexdigest(): name for name, lua in SCRIPTS.items()}


class LosingRedis(redis.Redis):
    """A Redis client that loses the answers a test plans: per script, the next calls' faults in order."""

    plan: dict[str, list[str]]
    seen: list[str]

    async def evalsha(self, sha: str, numkeys: int, *keys_and_args: Any) -> Any:
        name = BY_SHA.get(sha, "?")
        faults = self.plan.get(name) or []
        fault = faults.pop(0) if faults else "none"
        self.seen.append(f"{name}:{fault}")
        if fault == "before":
            raise RedisTimeout("injected: the command never left")
        reply = await super().evalsha(sha, numkeys, *keys_and_args)
        if fault == "after":
            raise RedisTimeout("injected: the command ran, its answer was lost")
        return reply


@dataclass
class Upstream:
    """Runs every call it gets (counted), or refuses it unsent when ``down``."""

    runs: int = 0
    down: bool = False

    async def __call__(self) -> JsonObj:
        if self.down:
            raise UpstreamUnavailable("connection refused", sent=False)
        self.runs += 1
        return {"jsonrpc": "2.0", "id": 1, "result": {"content": []}}


@dataclass
class Ledger:
    """What the clients saw: calls answered with a result, refusals (503), upstream errors."""

    answered: int = 0
    refused: int = 0
    failed: int = 0
    answers: list[str] = field(default_factory=list)


@pytest.fixture
async def client(redis_client: redis.Redis) -> AsyncIterator[LosingRedis]:
    pool = redis.ConnectionPool.from_url(REDIS_URL, socket_timeout=STORE_TIMEOUT)
    losing = LosingRedis(connection_pool=pool)
    losing.auto_close_connection_pool = True
    losing.plan, losing.seen = {}, []
    yield losing
    await losing.aclose()


def make_policy(client: LosingRedis) -> CallPolicy:
    prefix = f"test:lost:{uuid.uuid4().hex}:"
    return CallPolicy(publisher=RecordingPublisher(), metrics=Metrics(), rate_limiter=MemoryRateLimiter(),
                      budgets=RedisBudgetStore(client, prefix=prefix),
                      duplicates=RedisDuplicateStore(client, prefix=prefix),
                      admissions=RedisAdmissions(client, prefix=prefix),
                      operator_budgets={"agent": LIMIT}, enforcement="control", store_timeout=STORE_TIMEOUT)


AGENT = Identity(token_id="agent")


async def one_try(policy: CallPolicy, upstream: Upstream, ledger: Ledger, *, session: str, request_id: int) -> bool:
    """One client request; whether it got an answer it need not retry."""
    params = {"name": "echo", "arguments": {"n": request_id}}
    try:
        admission = await policy.admit(AGENT, method="tools/call", tool="echo", session_id=session,
                                       request_id=request_id, params=params)
    except GatewayError as refused:
        why = (refused.data or {}).get("error")
        ledger.refused += 1
        ledger.answers.append("503" if why == "store_unavailable" else str(why))
        return False
    try:
        await policy.run(admission, upstream)
    except UpstreamUnavailable:
        ledger.failed += 1
        ledger.answers.append("error")
        return True
    ledger.answered += 1
    ledger.answers.append("ok")
    return True


async def a_client(policy: CallPolicy, upstream: Upstream, ledger: Ledger, *, session: str,
                   request_id: int) -> None:
    """Sends the call; retries a 503 once, as a client told "not run, retry" does."""
    if not await one_try(policy, upstream, ledger, session=session, request_id=request_id):
        await one_try(policy, upstream, ledger, session=session, request_id=request_id)


async def spent(policy: CallPolicy) -> float:
    status = await policy.budget_status(AGENT)
    return LIMIT - float(status["remaining"])


@pytest.mark.parametrize(("session", "plan", "answers"), [
    pytest.param("s", {"arrive": ["before"]}, ["503", "ok"], id="arrival-never-ran-503-then-retry-charged-once"),
    pytest.param("s", {"arrive": ["after"]}, ["ok"], id="arrival-landed-answer-lost-goes-on-no-503"),
    pytest.param("s", {"arrive": ["after"], "landed": ["before", "before"]}, ["503", "ok"],
                 id="arrival-landed-resolution-silent-503-refunded-later-retry-charged-once"),
    pytest.param("s", {"arrive": ["before"], "landed": ["after", "before"]}, ["503", "ok"],
                 id="arrival-never-ran-voided-but-void-answer-lost"),
    pytest.param("", {"charge": ["before"]}, ["503", "ok"], id="stateless-charge-never-ran-503-then-retry"),
    pytest.param("", {"charge": ["after"]}, ["ok"], id="stateless-charge-landed-answer-lost-goes-on"),
    pytest.param("", {"charge": ["after"], "landed": ["before", "before"]}, ["503", "ok"],
                 id="stateless-charge-landed-resolution-silent-refunded-later"),
    pytest.param("s", {"record": ["before"]}, ["ok"], id="settlement-record-never-written-answer-kept"),
    pytest.param("s", {"record": ["after"]}, ["ok"], id="settlement-record-written-answer-lost"),
])
async def test_a_lost_store_answer_never_charges_a_call_that_was_not_answered(
        client: LosingRedis, session: str, plan: dict[str, list[str]], answers: list[str]) -> None:
    policy = make_policy(client)
    upstream, ledger = Upstream(), Ledger()
    await a_client(policy, upstream, ledger, session=session, request_id=1)  # a clean call first
    client.plan = {name: list(faults) for name, faults in plan.items()}
    await a_client(policy, upstream, ledger, session=session, request_id=2)
    await policy.close()  # finishes what was left to the background (late resolutions, settlements)
    assert ledger.answers == ["ok", *answers], client.seen
    assert all(not faults for faults in client.plan.values()), f"a planned fault never happened: {client.seen}"
    assert upstream.runs == ledger.answered == 2
    assert await spent(policy) == ledger.answered  # charged = answered


@pytest.mark.parametrize("plan", [
    pytest.param({"record": ["before"]}, id="record-never-written"),
    pytest.param({"record": ["after"]}, id="record-written-answer-lost"),
    pytest.param({"refund": ["before"]}, id="refund-never-given"),
    pytest.param({"refund": ["after"]}, id="refund-given-answer-lost-not-given-twice"),
    pytest.param({"record": ["after"], "refund": ["after", "before"]}, id="every-step-lost-once"),
])
async def test_a_call_that_never_ran_is_refunded_exactly_once_whatever_the_settlement_lost(
        client: LosingRedis, plan: dict[str, list[str]]) -> None:
    policy = make_policy(client)
    upstream, ledger = Upstream(), Ledger()
    await a_client(policy, upstream, ledger, session="s", request_id=1)
    upstream.down = True  # refused unsent: the call is owed its refund
    client.plan = {name: list(faults) for name, faults in plan.items()}
    await a_client(policy, upstream, ledger, session="s", request_id=2)
    await policy.close()
    assert ledger.answers == ["ok", "error"], client.seen
    assert all(not faults for faults in client.plan.values()), f"a planned fault never happened: {client.seen}"
    assert await spent(policy) == 1  # the clean call only: refunded once, not zero times, not twice


async def test_a_charge_voided_after_its_answer_was_lost_never_lands_later(client: LosingRedis) -> None:
    """The command still on its way (queued in a paused Redis) arrives after the resolution voided it."""
    budgets = RedisBudgetStore(client, prefix=f"test:lost:{uuid.uuid4().hex}:")
    assert await budgets.charge_landed("c1") is None  # never charged: void from now on
    with pytest.raises(TimeoutError):
        await budgets.charge("agent", 1.0, limit=LIMIT, enforce=True, charge_id="c1")
    assert await budgets.remaining("agent", limit=LIMIT) == LIMIT
    taken = await budgets.charge("agent", 1.0, limit=LIMIT, enforce=True, charge_id="c2")
    again = await budgets.charge("agent", 1.0, limit=LIMIT, enforce=True, charge_id="c2")  # a retry: answered again
    assert taken == again
    assert await budgets.charge_landed("c2") == taken
    assert await budgets.remaining("agent", limit=LIMIT) == LIMIT - 1
    await budgets.refund("agent", 1.0, refund_id="c2")
    await budgets.refund("agent", 1.0, refund_id="c2")
    assert await budgets.remaining("agent", limit=LIMIT) == LIMIT
