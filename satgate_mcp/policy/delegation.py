"""Delegation: the rules for a child token, as pure functions over the parent's identity.

A child is never wider than its parent: its tools are each allowed by every one of the
parent's tools caveats, it inherits the parent's resources and prompts caveats (as one
equivalent list each), it expires no later, it sits one level deeper (up to a limit), and
its credits are moved out of the parent's budget (done by the budget store, atomically).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from satgate_mcp.auth.base import Identity
from satgate_mcp.auth.caveats import CAVEAT_NUMBER_LIMIT
from satgate_mcp.jsonrpc import JsonObj
from satgate_mcp.patterns import PatternKind, allowed_by, is_pattern, merge_filters, pattern_error
from satgate_mcp.policy.controls import Controls

DEFAULT_MAX_DEPTH = 3
MAX_LABEL_CHARS = 200
MAX_TOOL_PATTERNS = 100


class Minter(Protocol):
    """The shape of ``satgate_mcp.auth.macaroons.mint_token``, injectable for tests."""

    def __call__(
        self,
        root_key: str,
        token_id: str,
        *,
        ttl: float | None = None,
        tools: Sequence[str] | None = None,
        budget_id: str | None = None,
        budget_limit: float | None = None,
        tenant: str | None = None,
        parent_id: str | None = None,
        depth: int = 0,
        now: float | None = None,
        ancestors: Sequence[str] = (),
        max_depth: int | None = None,
        resources: Sequence[str] | None = None,
        prompts: Sequence[str] | None = None,
        controls: Sequence[Controls] = (),
    ) -> str: ...


class Verifier(Protocol):
    """The shape of ``satgate_mcp.auth.macaroons.verify_signature``: the identity a token verifies as."""

    def __call__(self, root_key: str, token: str) -> Identity: ...


class DelegationRefused(Exception):
    """Why a child cannot be minted; the reason is shown to the client."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class ChildPlan:
    budget: float
    #: The single tools caveat the child carries; None when neither parent nor child restricts tools.
    tools: tuple[str, ...] | None
    #: Seconds from ``now``; None when neither the request nor the parent sets an expiry.
    ttl: float | None
    expires_at: float | None
    depth: int
    #: The parent's ``depth <=`` cap, carried over so the child cannot delegate deeper than it could.
    max_depth: int | None
    #: The child's delegation chain, root first, the parent last (revoking any of them revokes it).
    ancestors: tuple[str, ...]
    label: str | None
    #: The parent's resources / prompts caveats folded into one list each (None: the parent has none).
    resources: tuple[str, ...] | None = None
    prompts: tuple[str, ...] | None = None


def _number(value: Any, name: str) -> float:
    """A positive number a caveat can carry; checked before any float conversion (a 400-digit int overflows)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise DelegationRefused(f"{name} must be a number")
    if isinstance(value, float) and not math.isfinite(value):
        raise DelegationRefused(f"{name} must be a finite number")
    if value <= 0:
        raise DelegationRefused(f"{name} must be greater than 0")
    if value >= CAVEAT_NUMBER_LIMIT:
        raise DelegationRefused(f"{name} must be less than {CAVEAT_NUMBER_LIMIT:.0e}")
    return float(value)


def _tools(value: Any) -> tuple[str, ...] | None:
    if value is None:
        return None
    if isinstance(value, str):
        value = [part.strip() for part in value.split(",") if part.strip()]
    if not isinstance(value, list) or not value or not all(isinstance(p, str) for p in value):
        raise DelegationRefused("tools must be a non-empty list of tool names or 'prefix*' patterns")
    if len(value) > MAX_TOOL_PATTERNS:
        raise DelegationRefused(f"tools may list at most {MAX_TOOL_PATTERNS} patterns")
    for pattern in value:
        if not is_pattern(pattern, PatternKind.TOOL):  # the grammar minting applies: what passes here mints
            raise DelegationRefused(pattern_error(pattern, PatternKind.TOOL))
    return tuple(dict.fromkeys(value))


def plan_child(parent: Identity, params: JsonObj | None, *, now: float,
               max_depth: int = DEFAULT_MAX_DEPTH) -> ChildPlan:
    """Validate ``{budget, tools?, label?, ttl?}`` against the parent; raise DelegationRefused."""
    params = params if params is not None else {}
    if not isinstance(params, dict):
        raise DelegationRefused("params must be an object")
    if "budget" not in params:
        raise DelegationRefused("budget is required")
    budget = _number(params["budget"], "budget")
    ttl = _number(params["ttl"], "ttl") if params.get("ttl") is not None else None
    label = params.get("label")
    if label is not None and (not isinstance(label, str) or len(label) > MAX_LABEL_CHARS):
        raise DelegationRefused(f"label must be a string of at most {MAX_LABEL_CHARS} characters")
    requested = _tools(params.get("tools"))

    depth = parent.depth + 1
    token_cap = parent.max_depth
    limit = max_depth if token_cap is None else min(max_depth, token_cap)
    if depth > limit:
        raise DelegationRefused(f"delegation depth limit ({limit}) reached")

    if parent.expires_at is not None and parent.expires_at <= now:
        raise DelegationRefused("parent token has expired")
    expires_at = now + ttl if ttl is not None else None
    if parent.expires_at is not None and (expires_at is None or expires_at > parent.expires_at):
        expires_at = parent.expires_at

    if requested is not None:
        for pattern in requested:
            if not allowed_by(parent.tool_filters, pattern):
                raise DelegationRefused(f"tool {pattern!r} is wider than the parent token allows")
        tools: tuple[str, ...] | None = requested
    else:
        tools = merge_filters(parent.tool_filters)
        if tools == ():
            raise DelegationRefused("the parent token allows no tools")

    return ChildPlan(
        budget=budget,
        tools=tools,
        ttl=expires_at - now if expires_at is not None else None,
        expires_at=expires_at,
        depth=depth,
        max_depth=token_cap,
        ancestors=(*parent.ancestors, parent.token_id),
        label=label,
        resources=merge_filters(parent.resource_filters),
        prompts=merge_filters(parent.prompt_filters),
    )

