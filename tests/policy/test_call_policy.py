"""The CallPolicy facade: rate limits, budgets and refunds as the transports see them (admit, run, settle)."""

from __future__ import annotations

import asyncio

import pytest

from satgate_mcp import events
from satgate_mcp.auth.base import Identity
from satgate_mcp.errors import GatewayError, UpstreamUnavailable
from satgate_mcp.events import RecordingPublisher
from satgate_mcp.jsonrpc import JsonObj
from satgate_mcp.metrics import Metrics
from satgate_mcp.policy.engine import CallPolicy
from satgate_mcp.policy.limits import rate_spec
from tests.fakes import FakeClock
from tests.policy.helpers import (
    ALICE,
    admit_tool,
    make_policy,
    refusal,
    refusals,
)

# -- rate limits ---------------------------------------------------------------------------------------


async def test_rate_limit_refusal_shape_and_no_charge() -> None:
    clock = FakeClock()
    policy, publisher, metrics, _ = make_policy(clock, rate_limit="2/s")
    await admit_tool(policy, request_id=1)
    await admit_tool(policy, request_id=2)
    err = await refusal(admit_tool(policy, request_id=3))
    assert (err.code, err.message, err.data) == (-32004, "rate limit exceeded",
                                                 {"error": "rate_limited", "retry_after_seconds": 1})
    assert refusals(metrics, "rate_limited") == 1
    assert publisher.named(events.RATE_LIMITED) == [
        {"token_id": "alice", "method": "tools/call", "tool": "echo", "retry_after_seconds": 1}]
    assert (await policy.budget_status(ALICE))["remaining"] == 8  # the refused call paid nothing
    clock.advance(0.5)
    await admit_tool(policy, request_id=4)


async def test_retry_after_rounds_up_for_slow_rates() -> None:
    policy, *_ = make_policy(rate_limit="6/m")
    await admit_tool(policy)
    err = await refusal(admit_tool(policy, request_id=2))
    assert err.data == {"error": "rate_limited", "retry_after_seconds": 10}


async def test_gateway_methods_share_the_bucket_other_methods_pass() -> None:
    policy, *_ = make_policy(rate_limit="1/s")
    for _ in range(3):
        await policy.admit(ALICE, method="tools/list", tool=None, session_id="s", request_id=1, params=None)
    await policy.admit(ALICE, method="satgate/budget", tool=None, session_id="s", request_id=2, params=None)
    err = await refusal(admit_tool(policy, request_id=3))
    assert err.code == -32004


async def test_rate_limit_is_per_token() -> None:
    policy, *_ = make_policy(rate_limit="1/s")
    await admit_tool(policy, ALICE)
    await admit_tool(policy, Identity("bob"))
    with pytest.raises(GatewayError):
        await admit_tool(policy, ALICE, request_id=2)


async def test_no_rate_limit_when_unset() -> None:
    policy, publisher, metrics, _ = make_policy()
    admitted = [await admit_tool(policy, Identity("free"), request_id=i) for i in range(50)]  # all at one instant
    assert len(admitted) == 50
    assert publisher.named(events.RATE_LIMITED) == []
    assert refusals(metrics, "rate_limited") == 0


async def test_per_tool_rate_limits() -> None:
    policy, *_ = make_policy(tool_rate_limits={"db_*": "1/s"}, rate_limit="100/s")
    await admit_tool(policy, tool="db_query")
    assert (await refusal(admit_tool(policy, tool="db_write", request_id=2))).code == -32004
    await admit_tool(policy, tool="echo", request_id=3)


# -- budgets ---------------------------------------------------------------------------------------------


async def test_budget_exhausted_refusal_shape() -> None:
    policy, publisher, metrics, _ = make_policy(tool_costs={"expensive": 4})
    identity = Identity("alice", budget_id="team", budget_limit=10)
    await admit_tool(policy, identity, "expensive", request_id=1)
    await admit_tool(policy, identity, "expensive", request_id=2)
    err = await refusal(admit_tool(policy, identity, "expensive", request_id=3))
    assert (err.code, err.message) == (-32000, "Budget exhausted")
    assert err.data == {"error": "budget_exhausted", "tool": "expensive", "cost_credits": 4,
                        "remaining_credits": 2, "token_id": "alice", "budget_id": "team"}
    assert refusals(metrics, "budget_exhausted") == 1
    assert publisher.named(events.BUDGET_EXHAUSTED) == [
        {"token_id": "alice", "budget_id": "team", "tool": "expensive", "cost": 4, "remaining": 2, "enforced": True}]
    assert [e["remaining"] for e in publisher.named(events.BUDGET_SPEND)] == [6, 2]


async def test_observe_charges_and_logs_but_never_refuses() -> None:
    policy, publisher, metrics, _ = make_policy(enforcement="shadow", tool_costs={"*": 4})
    for i in range(5):
        await admit_tool(policy, request_id=i)
    assert (await policy.budget_status(ALICE))["remaining"] == 0
    assert [e["enforced"] for e in publisher.named(events.BUDGET_EXHAUSTED)] == [False, False, False]
    assert refusals(metrics, "budget_exhausted") == 0


async def test_budget_status_and_unlimited() -> None:
    policy, *_ = make_policy(budgets={"team": 3})
    assert await policy.budget_status(Identity("bob")) == {"tokenId": "bob", "budgetId": "bob", "remaining": -1,
                                                         "enforcement": "control"}
    shared = Identity("carol", budget_id="team", budget_limit=100)
    await admit_tool(policy, shared)
    status = await policy.budget_status(shared)
    assert (status["budgetId"], status["remaining"]) == ("team", 2)  # the operator's 3 beat the caveat's 100


async def test_tokens_sharing_a_budget_id_share_its_credits() -> None:
    policy, *_ = make_policy(budgets={"team": 2})
    a, b = Identity("a", budget_id="team"), Identity("b", budget_id="team")
    await admit_tool(policy, a)
    await admit_tool(policy, b)
    assert (await refusal(admit_tool(policy, a, request_id=2))).data["budget_id"] == "team"  # type: ignore[index]


async def test_free_tools_stay_callable_when_exhausted() -> None:
    policy, publisher, *_ = make_policy(tool_costs={"free": 0}, default_cost=10)
    await admit_tool(policy, tool="paid")
    assert (await refusal(admit_tool(policy, tool="paid", request_id=2))).data["error"] == "budget_exhausted"  # type: ignore[index]
    free = await admit_tool(policy, tool="free", request_id=3)
    assert (free.duplicate, free.charged) == (False, 0)
    assert (await policy.budget_status(ALICE))["remaining"] == 0
    assert [(e["tool"], e["cost"]) for e in publisher.named(events.BUDGET_SPEND)] == [("paid", 10), ("free", 0)]


async def test_hundred_concurrent_admits_never_overspend() -> None:
    policy, *_ = make_policy()
    small = Identity("busy", budget_limit=7)
    results = await asyncio.gather(*(admit_tool(policy, small, request_id=i) for i in range(100)),
                                   return_exceptions=True)
    assert sum(not isinstance(r, BaseException) for r in results) == 7
    assert all(isinstance(r, GatewayError) and r.data and r.data["error"] == "budget_exhausted"
               for r in results if isinstance(r, BaseException))
    assert (await policy.budget_status(small))["remaining"] == 0


async def test_the_policy_takes_its_limits_explicitly_without_settings() -> None:
    policy = CallPolicy(publisher=RecordingPublisher(), metrics=Metrics(), clock=FakeClock(), rate=rate_spec("2/s"),
                        costs={"big": 2}, default_cost=0.5, operator_budgets={"team": 3}, enforcement="control")
    team = Identity("a", budget_id="team")
    await admit_tool(policy, team, "big", request_id=1)
    await admit_tool(policy, team, "small", request_id=2)
    assert await policy.budget_status(team) == {"tokenId": "a", "budgetId": "team", "remaining": 0.5,
                                                "enforcement": "control"}
    assert (await refusal(admit_tool(policy, team, "small", request_id=3))).code == -32004
    assert (await refusal(policy.delegate(team, {"budget": 0.5}))).data == {
        "error": "delegation_failed", "reason": "delegation needs header auth"}  # no root key given


async def test_refund_when_the_call_never_ran() -> None:
    policy, publisher, *_ = make_policy()
    admission = await admit_tool(policy)
    await policy.settle(admission, ran=False)
    await policy.settle(admission, ran=False)  # settling twice refunds once
    assert (await policy.budget_status(ALICE))["remaining"] == 10
    assert publisher.named(events.BUDGET_SPEND) == [
        {"token_id": "alice", "budget_id": "alice", "tool": "echo", "cost": 1, "remaining": 9},
        {"token_id": "alice", "budget_id": "alice", "tool": "echo", "cost": -1, "refund": True, "remaining": 10}]
    # Refunded, so the re-sent call is charged as a first attempt.
    again = await admit_tool(policy)
    assert (again.duplicate, again.charged) == (False, 1)


async def test_no_refund_when_it_ran() -> None:
    policy, *_ = make_policy()
    await policy.settle(await admit_tool(policy), ran=True)
    assert (await policy.budget_status(ALICE))["remaining"] == 9


async def test_run_refunds_a_call_that_was_never_sent_and_keeps_one_lost_after_sending() -> None:
    policy, *_ = make_policy()

    async def never_sent() -> JsonObj:
        raise UpstreamUnavailable("refused", sent=False)

    async def lost() -> JsonObj:
        raise UpstreamUnavailable("reset after the request went out")

    for n, call_upstream in enumerate((never_sent, lost)):
        with pytest.raises(UpstreamUnavailable):
            await policy.run(await admit_tool(policy, request_id=n), call_upstream)
    assert (await policy.budget_status(ALICE))["remaining"] == 9
