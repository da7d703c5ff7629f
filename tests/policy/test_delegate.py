"""``satgate/delegate`` through the policy (delegate.py): credits move to a narrower child, or nothing moves."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

import pytest

from satgate_mcp import events
from satgate_mcp.auth.base import Identity
from satgate_mcp.auth.macaroons import verify_token
from satgate_mcp.events import RecordingPublisher
from satgate_mcp.jsonrpc import JsonObj
from satgate_mcp.metrics import Metrics
from satgate_mcp.policy.controls import parse_controls
from satgate_mcp.policy.engine import CallPolicy
from tests.fakes import FakeClock
from tests.policy.helpers import (
    ROOT_KEY,
    WALL,
    admit_tool,
    make_policy,
    refusal,
    refusals,
    settings,
)

PARENT = Identity("parent-1", budget_id="team", budget_limit=10, tool_filters=(("db_*", "search"),),
                  expires_at=WALL + 3600, tenant="acme")


async def test_delegate_moves_credits_and_mints_a_narrower_child() -> None:
    policy, publisher, _, minter = make_policy(new_id=lambda: "abc")
    out = await policy.delegate(PARENT, {"budget": 4, "tools": ["db_read"], "ttl": 60, "label": "crawler"})
    assert out == {"token": "fake-token-for-dlg-abc", "tokenId": "dlg-abc", "budgetId": "dlg-budget-abc",
                   "budget": 4, "expiresAt": WALL + 60, "parentId": "parent-1", "depth": 1, "tools": ["db_read"],
                   "label": "crawler", "parentRemaining": 6}
    assert minter.calls == [{"token_id": "dlg-abc", "ttl": 60, "tools": ["db_read"], "budget_id": "dlg-budget-abc",
                             "budget_limit": 4, "tenant": "acme", "parent_id": "parent-1", "depth": 1, "now": WALL,
                             "ancestors": ("parent-1",), "max_depth": None, "resources": None, "prompts": None,
                             "controls": ()}]
    assert (await policy.budget_status(PARENT))["remaining"] == 6
    child = Identity("dlg-abc", budget_id="dlg-budget-abc", budget_limit=4)
    assert (await policy.budget_status(child))["remaining"] == 4
    [event] = publisher.named(events.DELEGATION)
    assert (event["ok"], event["token_id"], event["parent_id"], event["budget"], event["parent_remaining"]) == (
        True, "dlg-abc", "parent-1", 4, 6)
    assert all("fake-token" not in str(fields) for _, fields in publisher.events)


async def test_a_delegated_child_keeps_every_tool_control_of_its_parent() -> None:
    rules = (parse_controls('{"args": [{"tools": ["db_*"], "field": "table", "one_of": ["users"]}]}'),
             parse_controls('{"approvals": [{"tools": ["db_write"]}]}'))
    policy, _, _, minter = make_policy(new_id=lambda: "abc")
    await policy.delegate(replace(PARENT, controls=rules), {"budget": 1, "tools": ["db_read"]})
    assert minter.calls[0]["controls"] == rules


async def test_delegation_refusal_shape() -> None:
    policy, publisher, metrics, _ = make_policy()
    err = await refusal(policy.delegate(PARENT, {"budget": 11}))
    assert err.code == -32000
    assert err.data == {"error": "delegation_failed",
                        "reason": "parent budget holds 10 credits, less than the 11 requested"}
    assert refusals(metrics, "delegation_failed") == 1
    assert publisher.named(events.DELEGATION)[0]["ok"] is False
    assert (await policy.budget_status(PARENT))["remaining"] == 10


@pytest.mark.parametrize("mode", ["none", "config"])
async def test_delegation_needs_header_auth(mode: str) -> None:
    policy, *_ = make_policy(auth_mode=mode, root_key=None, static_token="s" * 8)
    err = await refusal(policy.delegate(PARENT, {"budget": 1}))
    assert err.data == {"error": "delegation_failed", "reason": "delegation needs header auth"}


async def test_delegation_depth_limit() -> None:
    policy, *_ = make_policy(max_delegation_depth=2)
    deep = Identity("deep", depth=2, budget_limit=10)
    err = await refusal(policy.delegate(deep, {"budget": 1}))
    assert err.data == {"error": "delegation_failed", "reason": "delegation depth limit (2) reached"}


async def test_unlimited_parent_gives_without_being_charged() -> None:
    policy, *_ = make_policy()
    out = await policy.delegate(Identity("rich"), {"budget": 1000})
    assert out["parentRemaining"] == -1
    assert (await policy.budget_status(Identity("rich")))["remaining"] == -1


async def test_concurrent_delegations_never_overdraw() -> None:
    ids = iter(range(1000))
    policy, *_ = make_policy(new_id=lambda: f"n{next(ids)}")
    results = await asyncio.gather(*(policy.delegate(PARENT, {"budget": 3}) for _ in range(20)),
                                   return_exceptions=True)
    assert sum(isinstance(r, dict) for r in results) == 3
    assert (await policy.budget_status(PARENT))["remaining"] == 1


async def test_child_spends_only_what_it_was_given() -> None:
    policy, *_ = make_policy(new_id=lambda: "kid")
    out = await policy.delegate(PARENT, {"budget": 2})
    child = Identity(out["tokenId"], budget_id=out["budgetId"], budget_limit=out["budget"], parent_id="parent-1",
                     depth=1)
    await admit_tool(policy, child, request_id=1)
    await admit_tool(policy, child, request_id=2)
    assert (await refusal(admit_tool(policy, child, request_id=3))).data["budget_id"] == "dlg-budget-kid"  # type: ignore[index]
    assert (await policy.budget_status(PARENT))["remaining"] == 8


async def test_minter_errors_become_delegation_failed() -> None:
    def broken(*args: Any, **kwargs: Any) -> str:
        raise ValueError("invalid tool pattern")

    policy = CallPolicy.from_settings(settings(), publisher=RecordingPublisher(), metrics=Metrics(), minter=broken,
                                      wall_clock=FakeClock(WALL))
    err = await refusal(policy.delegate(PARENT, {"budget": 1}))
    assert err.data == {"error": "delegation_failed", "reason": "could not mint the child token: invalid tool pattern"}
    assert (await policy.budget_status(PARENT))["remaining"] == 10


async def test_delegation_with_the_real_minter_verifies() -> None:
    wall = FakeClock(WALL)
    policy = CallPolicy.from_settings(settings(), publisher=RecordingPublisher(), metrics=Metrics(), wall_clock=wall)
    root = Identity("root-tok", budget_limit=100, tool_filters=(("db_*",),), expires_at=WALL + 600)
    first = await policy.delegate(root, {"budget": 30, "tools": "db_read,db_list", "ttl": 300})
    child = verify_token(ROOT_KEY, first["token"], now=WALL + 1)
    assert (child.token_id, child.budget_id, child.budget_limit, child.parent_id, child.depth, child.ancestors) == (
        first["tokenId"], first["budgetId"], 30, "root-tok", 1, ("root-tok",))
    assert child.expires_at == pytest.approx(WALL + 300)
    assert child.allows_tool("db_read")
    assert not child.allows_tool("db_write")
    grandchild = verify_token(ROOT_KEY, (await policy.delegate(child, {"budget": 5}))["token"], now=WALL + 1)
    assert (grandchild.ancestors, grandchild.depth, grandchild.budget_limit) == (
        ("root-tok", first["tokenId"]), 2, 5)
    assert grandchild.allows_tool("db_list")
    assert not grandchild.allows_tool("db_write")
    assert (await policy.budget_status(child))["remaining"] == 25


# -- delegation: rate family and numbers -----------------------------------------------------------------


async def test_attack_children_share_their_roots_rate_bucket() -> None:
    policy, *_ = make_policy(rate_limit="2/s")
    root = Identity("root")
    children = [Identity(f"dlg-{n}", parent_id="root", depth=1, ancestors=("root",)) for n in range(10)]
    await admit_tool(policy, root, request_id=1)
    await admit_tool(policy, children[0], request_id=2)
    for n, child in enumerate(children):
        assert (await refusal(admit_tool(policy, child, request_id=10 + n))).code == -32004
    grandchild = Identity("dlg-deep", parent_id="dlg-0", depth=2, ancestors=("root", "dlg-0"))
    assert (await refusal(admit_tool(policy, grandchild, request_id=99))).code == -32004


async def test_attack_a_delegate_loop_is_refused_once_the_family_bucket_is_empty() -> None:
    """A parent with unlimited credits mints children in a loop: the loop and every child draw from one bucket."""
    clock = FakeClock()
    policy = CallPolicy.from_settings(settings(rate_limit="5/s"), publisher=RecordingPublisher(), metrics=Metrics(),
                                      clock=clock, wall_clock=FakeClock(WALL))
    root = Identity("root")

    async def delegate_once(n: int) -> Identity:
        await policy.admit(root, method="satgate/delegate", tool=None, session_id="s", request_id=n, params=None)
        return verify_token(ROOT_KEY, (await policy.delegate(root, {"budget": 1}))["token"], now=WALL)

    children = [await delegate_once(n) for n in range(5)]
    assert (await refusal(delegate_once(5))).code == -32004
    admitted = len(children)
    for n, child in enumerate(children):
        assert (await refusal(admit_tool(policy, child, request_id=100 + n))).code == -32004
    assert admitted == 5  # the bucket's burst, shared by the root, its loop and all its children


@pytest.mark.parametrize("params", [
    pytest.param({"budget": 1e15}, id="budget-1e15"),
    pytest.param({"budget": 1e300}, id="budget-1e300"),
    pytest.param({"budget": float("inf")}, id="budget-inf"),
    pytest.param({"budget": float("nan")}, id="budget-nan"),
    pytest.param({"budget": 10**400}, id="budget-400-digits"),
    pytest.param({"budget": -1}, id="budget-negative"),
    pytest.param({"budget": 1, "ttl": 1e15}, id="ttl-1e15"),
    pytest.param({"budget": 1, "ttl": 1e300}, id="ttl-1e300"),
    pytest.param({"budget": 1, "ttl": float("inf")}, id="ttl-inf"),
    pytest.param({"budget": 1, "ttl": 10**400}, id="ttl-400-digits"),
    pytest.param({"budget": 1, "ttl": -5}, id="ttl-negative"),
    pytest.param({"budget": 1, "ttl": 1e15 - 1_000_000}, id="expiry-beyond-what-a-caveat-carries"),
])
async def test_attack_out_of_range_numbers_are_refused_before_any_credit_moves(params: JsonObj) -> None:
    policy = CallPolicy.from_settings(settings(), publisher=RecordingPublisher(), metrics=Metrics(),
                                      wall_clock=FakeClock(WALL))
    parent = Identity("parent", budget_limit=10)
    err = await refusal(policy.delegate(parent, params))
    assert err.data is not None
    assert err.data["error"] == "delegation_failed"
    assert (await policy.budget_status(parent))["remaining"] == 10


async def test_a_minted_child_that_does_not_verify_moves_no_credits() -> None:
    def unverifiable(root_key: str, token: str) -> Identity:
        raise ValueError("signature does not verify")

    policy = CallPolicy.from_settings(settings(), publisher=RecordingPublisher(), metrics=Metrics(),
                                      wall_clock=FakeClock(WALL), verifier=unverifiable)
    err = await refusal(policy.delegate(PARENT, {"budget": 4}))
    assert err.data == {"error": "delegation_failed", "reason": "the minted child token does not verify"}
    assert (await policy.budget_status(PARENT))["remaining"] == 10


async def test_an_unlimited_parents_children_accounts_expire_with_them() -> None:
    clock = FakeClock()
    ids = iter(range(1000))
    policy = CallPolicy.from_settings(settings(), publisher=RecordingPublisher(), metrics=Metrics(), clock=clock,
                                      wall_clock=FakeClock(WALL), new_id=lambda: f"n{next(ids)}")
    for _ in range(50):
        await policy.delegate(Identity("rich"), {"budget": 1, "ttl": 30})
    assert len(policy._budgets) == 50  # type: ignore[arg-type]
    clock.advance(30 + 300)
    assert len(policy._budgets) == 0  # type: ignore[arg-type]
