"""Budgets over HTTP: refusals and their shape, observe mode, no overspending, refunds, ``satgate/budget``."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from satgate_mcp import events
from satgate_mcp.jsonrpc import JsonObj
from tests.limits_http.deployment import (
    CONCURRENT_CALLS,
    CONCURRENT_SESSIONS,
    WAIT,
    Deploy,
    echoed,
    mint,
    refused_for,
)

# --- budgets -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("enforcement", ["control", "hard", "soft"])
async def test_an_exhausted_budget_refuses_with_the_documented_shape_and_forwards_nothing(
        deploy: Deploy, enforcement: str) -> None:
    deployment = deploy(enforcement=enforcement, tool_costs={"echo": 2, "other": 1})
    gw = await deployment.start()
    token = mint("agent-1", budget_id="team-a", budget_limit=3)
    sid = await gw.initialize(token)
    assert echoed(await gw.call(token, sid, request_id=1, text="hi"))

    refused = await gw.call(token, sid, request_id=2, text="hi")

    assert refused.status == 200
    assert refused.body == {"jsonrpc": "2.0", "id": 2, "error": {
        "code": -32000, "message": "Budget exhausted",
        "data": {"error": "budget_exhausted", "tool": "echo", "cost_credits": 2, "remaining_credits": 1,
                 "token_id": "agent-1", "budget_id": "team-a"}}}
    assert gw.forwarded() == 1
    assert await deployment.remaining(token) == 1
    assert deployment.refusals("budget_exhausted") == 1
    # a cheaper tool that fits what remains still runs
    assert echoed(await gw.call(token, sid, "other", request_id=3), "other")
    assert await deployment.remaining(token) == 0


@pytest.mark.parametrize("enforcement", ["observe", "shadow"])
async def test_observe_mode_charges_and_logs_but_never_refuses(deploy: Deploy, enforcement: str) -> None:
    deployment = deploy(enforcement=enforcement, tool_costs={"echo": 2})
    gw = await deployment.start()
    token = mint(budget_limit=3)
    sid = await gw.initialize(token)
    for n in range(4):
        assert echoed(await gw.call(token, sid, request_id=n, text="hi"))

    assert gw.forwarded() == 4
    assert (await gw.rpc(token, sid, "satgate/budget", request_id=9)).result["remaining"] == 0  # never below 0
    assert sum(e["cost"] for e in deployment.publisher.named(events.BUDGET_SPEND)) == 8
    exhausted = deployment.publisher.named(events.BUDGET_EXHAUSTED)
    assert [e["enforced"] for e in exhausted] == [False, False, False]  # calls 2, 3 and 4 did not fit
    assert deployment.refusals("budget_exhausted") == 0


@pytest.mark.parametrize(("cost", "budget", "fits"), [
    pytest.param(1, 10, 10, id="cost-1-budget-10"),
    pytest.param(3, 10, 3, id="cost-3-budget-10"),
    pytest.param(0.1, 1, 10, id="cost-0.1-budget-1-float-slack"),
])
async def test_concurrent_calls_on_a_small_budget_never_overspend(
        deploy: Deploy, cost: float, budget: float, fits: int) -> None:
    # Above SATGATE_MAX_INFLIGHT_PER_TOKEN's default (64), so the in-flight bound (hole 11) stays out of the way.
    deployment = deploy(tool_costs={"block": cost}, max_inflight_per_token=CONCURRENT_CALLS)
    gw = await deployment.start()
    token = mint(budget_limit=budget)
    sessions = [await gw.initialize(token) for _ in range(CONCURRENT_SESSIONS)]
    tasks = [asyncio.create_task(gw.call(token, sessions[n % CONCURRENT_SESSIONS], "block", request_id=n))
             for n in range(CONCURRENT_CALLS)]
    try:
        # Every call is admitted or refused while the admitted ones are all still running upstream.
        await deployment.publisher.wait_count({events.BUDGET_SPEND, events.BUDGET_EXHAUSTED}, CONCURRENT_CALLS)
        assert gw.forwarded() == fits
    finally:
        gw.pool.release.set()
    answers = await asyncio.wait_for(asyncio.gather(*tasks), WAIT)

    assert sum("result" in a.body for a in answers) == fits
    assert sum(refused_for(a) == "budget_exhausted" for a in answers if "error" in a.body) == CONCURRENT_CALLS - fits
    assert gw.forwarded() == fits
    assert await deployment.remaining(token) == pytest.approx(budget - fits * cost)
    assert await deployment.remaining(token) >= 0


@pytest.mark.parametrize(("arguments", "refunded"), [
    pytest.param({"code": -32602}, True, id="upstream-answered-invalid-params"),
    pytest.param({"code": -32601}, True, id="upstream-answered-method-not-found"),
    pytest.param({"code": -32600}, True, id="upstream-answered-invalid-request"),
    pytest.param({"unreachable": "before_sending"}, True, id="upstream-unreachable"),
    pytest.param({"code": -32603}, False, id="internal-error-may-have-run"),
    pytest.param({"code": -32000}, False, id="server-error-may-have-run"),
    pytest.param({"unreachable": "in_flight"}, False, id="connection-lost-in-flight-may-have-run"),
])
async def test_a_call_the_upstream_certainly_never_ran_is_refunded(
        deploy: Deploy, arguments: JsonObj, refunded: bool) -> None:
    deployment = deploy(tool_costs={"fail": 3})
    gw = await deployment.start()
    token = mint(budget_limit=10)
    sid = await gw.initialize(token)

    answer = await gw.call(token, sid, "fail", request_id=1, **arguments)

    assert answer.status == 200
    assert "error" in answer.body
    status = (await gw.rpc(token, sid, "satgate/budget", request_id=2)).result
    assert status["remaining"] == (10 if refunded else 7)
    refunds = [e for e in deployment.publisher.named(events.BUDGET_SPEND) if e.get("refund")]
    assert [e["cost"] for e in refunds] == ([-3] if refunded else [])


# --- satgate/budget -----------------------------------------------------------------------------------


@pytest.mark.parametrize(("caveats", "operator_budgets", "expected"), [
    pytest.param({}, {}, {"tokenId": "agent-1", "budgetId": "agent-1", "remaining": -1}, id="unlimited"),
    pytest.param({"budget_limit": 5}, {}, {"tokenId": "agent-1", "budgetId": "agent-1", "remaining": 5},
                 id="no-budget-id-spends-from-the-token-id"),
    pytest.param({"budget_id": "team-a", "budget_limit": 5}, {},
                 {"tokenId": "agent-1", "budgetId": "team-a", "remaining": 5}, id="budget-id"),
    pytest.param({"budget_id": "team-a", "budget_limit": 5}, {"team-a": 7},
                 {"tokenId": "agent-1", "budgetId": "team-a", "remaining": 7}, id="operator-budget-wins"),
    pytest.param({"budget_id": "team-a"}, {"team-a": 7},
                 {"tokenId": "agent-1", "budgetId": "team-a", "remaining": 7}, id="operator-budget-only"),
])
async def test_satgate_budget_returns_token_id_budget_id_and_remaining(
        deploy: Deploy, caveats: dict[str, Any], operator_budgets: dict[str, float], expected: JsonObj) -> None:
    deployment = deploy(budgets=operator_budgets, tool_costs={"echo": 2})
    gw = await deployment.start()
    token = mint("agent-1", **caveats)
    sid = await gw.initialize(token)

    before = (await gw.rpc(token, sid, "satgate/budget", request_id=1)).result
    assert echoed(await gw.call(token, sid, request_id=2, text="hi"))
    after = (await gw.rpc(token, sid, "satgate/budget", request_id=3)).result

    assert {k: before[k] for k in ("tokenId", "budgetId", "remaining")} == expected
    assert after["remaining"] == (-1 if expected["remaining"] == -1 else expected["remaining"] - 2)


async def test_tokens_sharing_a_budget_id_spend_the_same_credits(deploy: Deploy) -> None:
    deployment = deploy()
    gw = await deployment.start()
    alice, bob = mint("alice", budget_id="team", budget_limit=3), mint("bob", budget_id="team", budget_limit=3)
    alice_sid, bob_sid = await gw.initialize(alice), await gw.initialize(bob)
    for n in range(3):
        assert echoed(await gw.call(alice, alice_sid, request_id=n, text="hi"))
    refused = await gw.call(bob, bob_sid, request_id=1)
    assert refused.error["data"]["budget_id"] == "team"
    assert refused.error["data"]["token_id"] == "bob"


async def test_delegation_failure_has_its_shape_and_moves_nothing(deploy: Deploy) -> None:
    deployment = deploy()
    gw = await deployment.start()
    token = mint("parent", budget_limit=3)
    sid = await gw.initialize(token)
    refused = await gw.rpc(token, sid, "satgate/delegate", {"budget": 5}, request_id=1)
    assert refused.error["code"] == -32000
    assert refused.error["data"]["error"] == "delegation_failed"
    assert await deployment.remaining(token) == 3
