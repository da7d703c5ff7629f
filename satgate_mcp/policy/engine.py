"""The policy facade the transports call: admit a request, settle it, report budgets, delegate.

Order for ``tools/call``: rate limit, then the duplicate guard, then the charge; a refusal at any
step leaves nothing charged. Every other method admitted (``satgate/*`` and whatever the gateway
forwards upstream: resources, prompts, completions) passes the rate limit only; what the gateway
answers itself (``tools/list``, ``ping``) passes freely.
Every limit is keyed by the verified token id or budget id, never by session; only the
duplicate guard uses the session id (with the token id, request id and params), by design: it
recognises one client re-sending one call, which a resumed session does under the same id. An
empty session id (stateless requests) turns the guard off for that call.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import structlog

from satgate_mcp import events
from satgate_mcp.auth.base import Identity
from satgate_mcp.errors import GatewayError, UpstreamUnavailable
from satgate_mcp.events import Publisher
from satgate_mcp.jsonrpc import INVALID_PARAMS, INVALID_REQUEST, METHOD_NOT_FOUND, RATE_LIMITED, JsonObj, RequestId
from satgate_mcp.metrics import Metrics
from satgate_mcp.policy.budget import (
    DUPLICATE_TTL_SECONDS,
    BudgetStore,
    DuplicateStore,
    MemoryBudgetStore,
    MemoryDuplicateStore,
    duplicate_key,
    initial_limit,
    resolve_cost,
    shown_remaining,
)
from satgate_mcp.policy.delegation import DEFAULT_MAX_DEPTH, DelegationRefused, Minter, plan_child
from satgate_mcp.policy.limits import (
    MemoryRateLimiter,
    RateLimiter,
    RateSpec,
    buckets_for,
    parse_tool_rates,
    rate_spec,
    retry_after_seconds,
)
from satgate_mcp.settings import Settings

TOOLS_CALL = "tools/call"
GATEWAY_METHOD_PREFIX = "satgate/"
#: Answered by the gateway from its own state: they cost no upstream work, so no rate limit.
UNMETERED_METHODS = frozenset({"ping", "initialize", "tools/list", "logging/setLevel"})
BUDGET_EXHAUSTED_CODE = -32000
DELEGATION_FAILED_CODE = -32000
#: Upstream answers that prove the call never ran, so it is refunded.
NOT_RUN_CODES = frozenset({INVALID_REQUEST, METHOD_NOT_FOUND, INVALID_PARAMS})

_log = structlog.get_logger("satgate_mcp.policy")


def upstream_certainly_did_not_run(reply: JsonObj | None, exc: BaseException | None) -> bool:
    """True when the upstream surely never ran the call: it was unreachable, or it (or the
    gateway, before forwarding) answered invalid request / method not found / invalid params.
    A timeout, any other error, and any result mean it may have run: those stay charged."""
    if exc is not None:
        if isinstance(exc, UpstreamUnavailable):
            # A call lost because the connection died mid-flight may have run; only one never sent is refunded.
            return not (exc.data or {}).get("in_flight")
        return isinstance(exc, GatewayError) and exc.code in NOT_RUN_CODES
    if isinstance(reply, dict):
        error = reply.get("error")
        return isinstance(error, dict) and error.get("code") in NOT_RUN_CODES
    return False


#: Marks, beside a duplicate key, that some copy of the call ran (so a refund of another copy is withheld).
RAN_SUFFIX = ":ran"


@dataclass(slots=True)
class Admission:
    """What ``admit`` let through; hand it back to ``settle`` exactly once."""

    identity: Identity
    method: str
    tool: str | None
    budget_key: str
    cost: float = 0.0
    #: Credits taken from a limited budget by this admission (0 for duplicates and free passes).
    charged: float = 0.0
    limited: bool = False
    duplicate: bool = False
    duplicate_key: str | None = None
    #: Set on a re-sent call admitted free: the duplicate key of the original it copies.
    replay_key: str | None = None
    remaining: float | None = None
    settled: bool = False


class CallPolicy:
    def __init__(
        self,
        settings: Settings,
        *,
        publisher: Publisher,
        metrics: Metrics,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        minter: Minter | None = None,
        rate_limiter: RateLimiter | None = None,
        budgets: BudgetStore | None = None,
        duplicates: DuplicateStore | None = None,
        tool_rate_limits: Mapping[str, str] | None = None,
        max_delegation_depth: int = DEFAULT_MAX_DEPTH,
        duplicate_ttl: float = DUPLICATE_TTL_SECONDS,
        new_id: Callable[[], str] = lambda: secrets.token_hex(12),
        on_close: Sequence[Callable[[], Awaitable[None]]] = (),
    ) -> None:
        self._settings = settings
        self._publisher = publisher
        self._metrics = metrics
        self._wall_clock = wall_clock
        self._minter = minter
        self._limiter: RateLimiter = rate_limiter or MemoryRateLimiter(clock=clock)
        self._budgets: BudgetStore = budgets or MemoryBudgetStore()
        self._duplicates: DuplicateStore = duplicates or MemoryDuplicateStore(ttl=duplicate_ttl, clock=clock)
        self._rate: RateSpec | None = (
            rate_spec(settings.rate_limit, settings.rate_burst) if settings.rate_limit else None
        )
        self._tool_rates = parse_tool_rates(tool_rate_limits or {})
        self._enforce = settings.enforcement == "control"
        self._max_depth = max_delegation_depth
        self._new_id = new_id
        self._on_close = tuple(on_close)

    @classmethod
    def from_settings(cls, settings: Settings, *, publisher: Publisher, metrics: Metrics) -> CallPolicy:
        """In-memory stores, or Redis-backed shared ones when ``SATGATE_REDIS_URL`` is set."""
        tool_rates: Mapping[str, str] = settings.tool_rate_limits
        if not settings.redis_url:
            return cls(settings, publisher=publisher, metrics=metrics, tool_rate_limits=tool_rates)
        from satgate_mcp.policy.redis_stores import RedisStores

        stores = RedisStores.from_url(settings.redis_url)
        return cls(settings, publisher=publisher, metrics=metrics, tool_rate_limits=tool_rates,
                   rate_limiter=stores.rate_limiter, budgets=stores.budgets, duplicates=stores.duplicates,
                   on_close=[stores.aclose])

    # -- admit / settle -------------------------------------------------------------------------

    async def admit(self, identity: Identity, *, method: str, tool: str | None, session_id: str,
                    request_id: RequestId, params: JsonObj | None) -> Admission:
        """Let one request through or raise the GatewayError the client should see."""
        admission = Admission(identity, method, tool, identity.budget_key)
        if method in UNMETERED_METHODS:
            return admission
        await self._check_rate(identity, method, tool if method == TOOLS_CALL else None)
        if method != TOOLS_CALL:
            return admission

        name = tool or ""
        # A negative configured cost would mint credits; treat it as free.
        admission.cost = cost = max(0.0, resolve_cost(name, self._settings.tool_costs, self._settings.default_cost))
        limit = initial_limit(identity, self._settings.budgets)
        # No session id (stateless requests) means no guard: such clients reuse ids freely.
        dup_key = duplicate_key(identity.token_id, session_id, request_id, params) if session_id else None
        if dup_key is not None and not await self._duplicates.claim(dup_key):
            admission.duplicate = True
            admission.replay_key = dup_key
            admission.remaining = await self._budgets.remaining(identity.budget_key, limit=limit)
            self._publisher.publish(events.BUDGET_SPEND, **self._fields(identity), tool=name, cost=0,
                                    duplicate=True, remaining=shown_remaining(admission.remaining))
            return admission
        admission.duplicate_key = dup_key

        charge = await self._budgets.charge(identity.budget_key, cost, limit=limit, enforce=self._enforce)
        if charge.exceeded:
            self._publisher.publish(events.BUDGET_EXHAUSTED, **self._fields(identity), tool=name, cost=cost,
                                    remaining=shown_remaining(charge.remaining if not charge.allowed
                                                              else _before(charge.remaining, cost)),
                                    enforced=not charge.allowed)
        if not charge.allowed:
            if dup_key is not None:
                await self._duplicates.release(dup_key)
            self._metrics.refusals.labels(reason="budget_exhausted").inc()
            raise GatewayError("Budget exhausted", {
                "error": "budget_exhausted",
                "tool": name,
                "cost_credits": cost,
                "remaining_credits": shown_remaining(charge.remaining),
                "token_id": identity.token_id,
                "budget_id": identity.budget_key,
            }, code=BUDGET_EXHAUSTED_CODE)
        admission.limited = charge.remaining is not None
        admission.charged = cost
        admission.remaining = charge.remaining
        self._publisher.publish(events.BUDGET_SPEND, **self._fields(identity), tool=name, cost=cost,
                                remaining=shown_remaining(charge.remaining))
        return admission

    async def settle(self, admission: Admission, *, ran: bool) -> None:
        """Close an admission; ``ran=False`` (the upstream certainly never ran it) refunds it.

        The ``tool_call`` event is the dispatcher's (it knows the upstream and outcome); a refund
        is published as a negative ``budget_spend`` so summing spend events gives what was paid.
        """
        if admission.settled:
            return
        admission.settled = True
        if admission.method != TOOLS_CALL:
            return
        if admission.replay_key is not None:
            await self._settle_replay(admission, ran=ran)
            return
        if ran:
            return
        if admission.duplicate_key is not None:
            ran_marker = admission.duplicate_key + RAN_SUFFIX
            if not await self._duplicates.claim(ran_marker):
                return  # a re-send of this call ran: this charge pays for it
            await self._duplicates.release(ran_marker)
            await self._duplicates.release(admission.duplicate_key)
        if admission.limited and admission.charged:
            await self._budgets.refund(admission.budget_key, admission.charged)
            admission.remaining = (admission.remaining or 0.0) + admission.charged
            self._publisher.publish(events.BUDGET_SPEND, **self._fields(admission.identity),
                                    tool=admission.tool or "", cost=-admission.charged, refund=True,
                                    remaining=shown_remaining(admission.remaining))
            admission.charged = 0.0

    async def _settle_replay(self, admission: Admission, *, ran: bool) -> None:
        """A re-sent call that ran is paid exactly once: by the original's charge, unless the original
        was refunded as never sent, in which case this copy pays now."""
        assert admission.replay_key is not None
        if not ran:
            return
        await self._duplicates.claim(admission.replay_key + RAN_SUFFIX)  # the original's refund must keep its charge
        if not await self._duplicates.claim(admission.replay_key):
            return  # the original still holds its charge
        limit = initial_limit(admission.identity, self._settings.budgets)
        charge = await self._budgets.charge(admission.budget_key, admission.cost, limit=limit, enforce=False)
        admission.charged = admission.cost
        admission.remaining = charge.remaining
        self._publisher.publish(events.BUDGET_SPEND, **self._fields(admission.identity), tool=admission.tool or "",
                                cost=admission.cost, replay=True, remaining=shown_remaining(charge.remaining))

    async def _check_rate(self, identity: Identity, method: str, tool: str | None) -> None:
        buckets = buckets_for(identity.token_id, tool, overall=self._rate, tool_rates=self._tool_rates)
        if not buckets:
            return
        wait = await self._limiter.acquire(buckets)
        if wait <= 0:
            return
        retry = retry_after_seconds(wait)
        self._metrics.refusals.labels(reason="rate_limited").inc()
        self._publisher.publish(events.RATE_LIMITED, token_id=identity.token_id, method=method, tool=tool,
                                retry_after_seconds=retry)
        raise GatewayError("rate limit exceeded", {"error": "rate_limited", "retry_after_seconds": retry},
                           code=RATE_LIMITED)

    # -- satgate/budget -------------------------------------------------------------------------

    async def budget_status(self, identity: Identity) -> JsonObj:
        """``{tokenId, budgetId, remaining}``; remaining -1 means unlimited."""
        limit = initial_limit(identity, self._settings.budgets)
        remaining = await self._budgets.remaining(identity.budget_key, limit=limit)
        return {
            "tokenId": identity.token_id,
            "budgetId": identity.budget_key,
            "remaining": shown_remaining(remaining),
            "enforcement": self._settings.enforcement,
        }

    # -- satgate/delegate -----------------------------------------------------------------------

    async def delegate(self, identity: Identity, params: JsonObj | None) -> JsonObj:
        """Mint a child token whose credits move out of the parent's budget; see delegation.py."""
        try:
            return await self._delegate(identity, params)
        except DelegationRefused as exc:
            self._metrics.refusals.labels(reason="delegation_failed").inc()
            self._publisher.publish(events.DELEGATION, ok=False, parent_id=identity.token_id,
                                    parent_budget_id=identity.budget_key, reason=exc.reason)
            data: JsonObj = {"error": "delegation_failed", "reason": exc.reason}
            raise GatewayError(f"Delegation failed: {exc.reason}", data, code=DELEGATION_FAILED_CODE) from None

    async def _delegate(self, parent: Identity, params: JsonObj | None) -> JsonObj:
        if self._settings.auth_mode != "header" or self._settings.root_key is None:
            raise DelegationRefused("delegation needs header auth")
        now = self._wall_clock()
        plan = plan_child(parent, params, now=now, max_depth=self._max_depth)
        suffix = self._new_id()
        child_id, child_budget_id = f"dlg-{suffix}", f"dlg-budget-{suffix}"
        try:
            token = self._mint()(
                self._settings.root_key.get_secret_value(), child_id,
                ttl=plan.ttl, tools=list(plan.tools) if plan.tools is not None else None,
                budget_id=child_budget_id, budget_limit=plan.budget, tenant=parent.tenant,
                parent_id=parent.token_id, depth=plan.depth, now=now,
                ancestors=plan.ancestors, max_depth=plan.max_depth,
                resources=plan.resources, prompts=plan.prompts,
            )
        except ValueError as exc:
            raise DelegationRefused(f"could not mint the child token: {exc}") from None
        except Exception:
            _log.exception("delegation_mint_failed", parent_id=parent.token_id)
            raise DelegationRefused("could not mint the child token") from None

        moved = await self._budgets.transfer(parent.budget_key, child_budget_id, plan.budget,
                                             parent_limit=initial_limit(parent, self._settings.budgets))
        if not moved.allowed:
            if moved.exceeded:
                raise DelegationRefused(
                    f"parent budget holds {shown_remaining(moved.remaining):g} credits, "
                    f"less than the {plan.budget:g} requested")
            raise DelegationRefused("child budget id already exists")
        self._publisher.publish(events.DELEGATION, ok=True, token_id=child_id, budget_id=child_budget_id,
                                parent_id=parent.token_id, parent_budget_id=parent.budget_key,
                                budget=plan.budget, parent_remaining=shown_remaining(moved.remaining),
                                depth=plan.depth, expires_at=plan.expires_at, label=plan.label)
        return {
            "token": token,
            "tokenId": child_id,
            "budgetId": child_budget_id,
            "budget": plan.budget,
            "expiresAt": plan.expires_at,
            "parentId": parent.token_id,
            "depth": plan.depth,
            "tools": list(plan.tools) if plan.tools is not None else None,
            "label": plan.label,
            "parentRemaining": shown_remaining(moved.remaining),
        }

    def _mint(self) -> Minter:
        if self._minter is None:
            from satgate_mcp.auth.macaroons import mint_token

            self._minter = mint_token
        return self._minter

    async def close(self) -> None:
        await self._limiter.close()
        await self._budgets.close()
        await self._duplicates.close()
        for closer in self._on_close:
            await closer()

    @staticmethod
    def _fields(identity: Identity) -> dict[str, Any]:
        return {"token_id": identity.token_id, "budget_id": identity.budget_key}


def _before(remaining_after: float | None, cost: float) -> float | None:
    return None if remaining_after is None else remaining_after + cost
