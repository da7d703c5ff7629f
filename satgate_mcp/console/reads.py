"""The reads behind the upstreams, tokens and policy views: the pool, the budget and pin stores, the metrics
registry and the policy in force, each bounded (a store wait by the stores' own timeout)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Iterable
from typing import Any, TypeVar

import structlog
from prometheus_client.metrics import MetricWrapperBase

from satgate_mcp.console import views
from satgate_mcp.console.features import off
from satgate_mcp.console.parts import Parts
from satgate_mcp.metrics import Metrics
from satgate_mcp.policy.budget import initial_limit
from satgate_mcp.policy.pins import Pin
from satgate_mcp.upstream.pool import UpstreamPool

log = structlog.get_logger(__name__)
T = TypeVar("T")

#: Budget ids the tokens view reads at most (each is one store read).
MAX_BUDGETS = 200


def counter_values(metric: MetricWrapperBase) -> dict[tuple[str, ...], float]:
    """A labelled counter's ``_total`` values by label values, in the order the metric declares its labels."""
    found: dict[tuple[str, ...], float] = {}
    for family in metric.collect():
        for sample in family.samples:
            if sample.name.endswith("_total"):
                found[tuple(sample.labels.values())] = sample.value
    return found


def rate_refusals(metrics: Metrics, reasons: Iterable[str]) -> dict[str, int]:
    values = counter_values(metrics.refusals)
    return {reason: int(values.get((reason,), 0)) for reason in reasons}


async def _bounded(parts: Parts, pending: Awaitable[T]) -> T:
    timeout = parts.stores.timeout
    return await (asyncio.wait_for(pending, timeout) if timeout is not None else pending)


async def pins_or_none(parts: Parts) -> list[Pin] | None:
    """Every pin, or None when pinning is off; a store fault reads as no pins (logged), never a 500."""
    if parts.pins is None:
        return None
    try:
        return await _bounded(parts, parts.pins.pins())
    except Exception as exc:
        log.warning("console_pins_unread", error=type(exc).__name__)
        return []


async def upstreams_view(parts: Parts) -> dict[str, Any]:
    pool, specs = parts.pool, parts.settings.upstreams
    pinned = await pins_or_none(parts)
    tools: dict[str, set[str]] = {name: set() for name in specs}
    for tool in pool.tools():
        listed, owner = str(tool.get("name", "")), pool.owner_of_tool(str(tool.get("name", "")))
        if owner in specs:
            tools[owner].add(listed.removeprefix(specs[owner].tool_prefix))
    for pin in pinned or ():
        tools.setdefault(pin.upstream, set()).add(pin.tool)
    pids = pool.child_pids() if isinstance(pool, UpstreamPool) else {}
    restarts = {labels[0]: value for labels, value in counter_values(parts.metrics.upstream_restarts).items()}
    rows = views.upstream_rows(specs, pool.readiness(), pool.failures(), pids, restarts,
                               {name: sorted(found) for name, found in tools.items()}, pinned)
    breakers = parts.features.breakers
    states = breakers.states() if breakers is not None else {}
    for row in rows:
        row["breaker"] = states.get(row["name"])
    return {"upstreams": rows, "pinning": parts.settings.tool_pinning,
            "pins": None if pinned is None else [views.pin_row(pin) for pin in pinned],
            "breakers": {"enabled": True} if breakers is not None else off("breakers")}


async def budgets(parts: Parts) -> dict[str, Any]:
    """Spend against limit for the operator's budgets and those of the tokens holding sessions here."""
    operator = parts.settings.budgets
    limits: dict[str, float | None] = dict(operator)
    holders: dict[str, set[str]] = {}
    for session in parts.registry:
        identity = session.identity
        key = identity.budget_key
        if key not in limits and len(limits) >= MAX_BUDGETS:
            continue
        limits.setdefault(key, initial_limit(identity, operator))
        holders.setdefault(key, set()).add(identity.token_id)
    remaining: dict[str, float | None] = {}
    problem = None
    for key, limit in limits.items():
        try:
            remaining[key] = await _bounded(parts, parts.stores.budgets.remaining(key, limit=limit))
        except Exception as exc:
            problem = f"the budget store did not answer ({type(exc).__name__})"
            break
    return {"rows": views.budget_rows(limits, remaining, holders), "problem": problem,
            "enforcement": parts.settings.enforcement}


def policy_view(parts: Parts) -> dict[str, Any]:
    if parts.policy_file is None:
        return {"policy": off("policy")}
    rules = parts.policy_file.rules
    counts = {(labels[0], labels[1]): value
              for labels, value in counter_values(parts.metrics.policy_decisions).items()}
    default = {effect: int(n) for (name, effect), n in counts.items() if name == "(default)"}
    return {"policy": {"enabled": True, "file": str(parts.policy_file.path), "default": str(rules.default),
                       "default_decisions": default, "rules": views.rule_rows(rules.rules, counts)}}
