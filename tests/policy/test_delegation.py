"""The child-token rules as pure functions: never wider than the parent."""

from __future__ import annotations

from typing import Any

import pytest

from satgate_mcp.auth.base import Identity
from satgate_mcp.auth.macaroons import mint_token
from satgate_mcp.policy.delegation import (
    ChildPlan,
    DelegationRefused,
    plan_child,
)

NOW = 1_700_000_000.0
KEY = "delegation-tests-root-key-0123456789"


def parent(**kw: Any) -> Identity:
    return Identity(**{"token_id": "root-1", "budget_id": "team", **kw})


def test_plan_inherits_narrows_and_goes_one_deeper() -> None:
    plan = plan_child(parent(tool_filters=(("db_*", "search"),), expires_at=NOW + 100),
                      {"budget": 5, "tools": ["db_read"], "ttl": 30, "label": "worker"}, now=NOW)
    assert plan == ChildPlan(budget=5.0, tools=("db_read",), ttl=30.0, expires_at=NOW + 30, depth=1,
                             max_depth=None, ancestors=("root-1",), label="worker")


@pytest.mark.parametrize(
    ("kw", "params", "tools", "expires_at"),
    [
        pytest.param({}, {"budget": 1}, None, None, id="unrestricted-parent-no-ttl"),
        pytest.param({"expires_at": NOW + 60}, {"budget": 1, "ttl": 3600}, None, NOW + 60,
                     id="ttl-capped-by-parent-expiry"),
        pytest.param({"expires_at": NOW + 60}, {"budget": 1}, None, NOW + 60, id="no-ttl-inherits-expiry"),
        pytest.param({}, {"budget": 1, "ttl": 10}, None, NOW + 10, id="ttl-honoured"),
        pytest.param({"tool_filters": (("a*",), ("ab*", "c"))}, {"budget": 1}, ("ab*",), None,
                     id="inherits-all-parent-filters-as-one"),
        pytest.param({"tool_filters": (("a*",),)}, {"budget": 1, "tools": "ab, ac*"}, ("ab", "ac*"), None,
                     id="comma-string-tools"),
    ],
)
def test_plan_expiry_and_tools(kw: dict[str, Any], params: dict[str, Any], tools: tuple[str, ...] | None,
                               expires_at: float | None) -> None:
    plan = plan_child(parent(**kw), params, now=NOW)
    assert (plan.tools, plan.expires_at) == (tools, expires_at)
    assert plan.ttl == (None if expires_at is None else pytest.approx(expires_at - NOW))


@pytest.mark.parametrize(
    ("kw", "params", "reason"),
    [
        pytest.param({}, None, "budget is required", id="no-params"),
        pytest.param({}, ["budget", 1], "params must be an object", id="params-not-an-object"),
        pytest.param({}, {"budget": 0}, "budget must be greater than 0", id="zero-budget"),
        pytest.param({}, {"budget": -5}, "budget must be greater than 0", id="negative-budget"),
        pytest.param({}, {"budget": "5"}, "budget must be a number", id="string-budget"),
        pytest.param({}, {"budget": True}, "budget must be a number", id="bool-budget"),
        pytest.param({}, {"budget": float("nan")}, "budget must be a finite number", id="nan-budget"),
        pytest.param({}, {"budget": float("inf")}, "budget must be a finite number", id="infinite-budget"),
        pytest.param({}, {"budget": 1e15}, "budget must be less than 1e+15", id="budget-1e15"),
        pytest.param({}, {"budget": 10**400}, "budget must be less than 1e+15", id="budget-400-digits"),
        pytest.param({}, {"budget": 1, "ttl": 1e15}, "ttl must be less than 1e+15", id="ttl-1e15"),
        pytest.param({}, {"budget": 1, "ttl": -1}, "ttl must be greater than 0", id="negative-ttl"),
        pytest.param({}, {"budget": 1, "ttl": 0}, "ttl must be greater than 0", id="zero-ttl"),
        pytest.param({}, {"budget": 1, "label": 7}, "label must be a string", id="bad-label"),
        pytest.param({}, {"budget": 1, "tools": []}, "tools must be a non-empty list", id="empty-tools"),
        pytest.param({}, {"budget": 1, "tools": ["a*b"]}, "is not a name", id="star-inside"),
        pytest.param({"tool_filters": (("db_*",),)}, {"budget": 1, "tools": ["*"]}, "wider than the parent",
                     id="wider-tools"),
        pytest.param({"tool_filters": (("db_*",), ("db_read",))}, {"budget": 1, "tools": ["db_write"]},
                     "wider than the parent", id="outside-second-caveat"),
        pytest.param({"tool_filters": (("a*",), ("b*",))}, {"budget": 1}, "allows no tools",
                     id="parent-allows-nothing"),
        pytest.param({"depth": 3}, {"budget": 1}, "depth limit (3)", id="depth-limit"),
        pytest.param({"expires_at": NOW}, {"budget": 1}, "parent token has expired", id="expired-parent"),
    ],
)
def test_plan_refusals(kw: dict[str, Any], params: Any, reason: str) -> None:
    with pytest.raises(DelegationRefused) as info:
        plan_child(parent(**kw), params, now=NOW)
    assert reason in info.value.reason


@pytest.mark.parametrize(
    ("pattern", "valid"),
    [
        pytest.param("db_read", True, id="name"),
        pytest.param("ns:v1/db@host.read-only*", True, id="prefix-with-punctuation"),
        pytest.param("*", True, id="star"),
        pytest.param("a#b", False, id="hash"),
        pytest.param("caf\u00e9", False, id="non-ascii"),
        pytest.param("t" * 257, False, id="longer-than-a-caveat-takes"),
        pytest.param("a*b", False, id="star-inside"),
    ],
)
def test_attack_delegated_tool_pattern_that_minting_refuses_is_refused_by_the_plan(pattern: str, valid: bool) -> None:
    """One grammar: what the plan accepts always mints, what it refuses never would."""
    if valid:
        assert plan_child(parent(), {"budget": 1, "tools": [pattern]}, now=NOW).tools == (pattern,)
        assert mint_token(KEY, "child", tools=[pattern], now=NOW)
    else:
        with pytest.raises(DelegationRefused, match="invalid tool pattern"):
            plan_child(parent(), {"budget": 1, "tools": [pattern]}, now=NOW)
        with pytest.raises(ValueError, match="invalid tool pattern"):
            mint_token(KEY, "child", tools=[pattern], now=NOW)


def test_depth_limit_is_configurable() -> None:
    assert plan_child(parent(depth=1), {"budget": 1}, now=NOW, max_depth=2).depth == 2
    with pytest.raises(DelegationRefused):
        plan_child(parent(depth=2), {"budget": 1}, now=NOW, max_depth=2)


def test_parent_depth_caveat_caps_and_is_inherited() -> None:
    capped = Identity("p", depth=1, max_depth=2, ancestors=("root",))
    plan = plan_child(capped, {"budget": 1}, now=NOW)
    assert (plan.depth, plan.max_depth, plan.ancestors) == (2, 2, ("root", "p"))
    deeper = Identity("p", depth=1, max_depth=1)
    with pytest.raises(DelegationRefused, match=r"depth limit \(1\)"):
        plan_child(deeper, {"budget": 1}, now=NOW)
