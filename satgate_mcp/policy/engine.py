"""The policy facade the transports call: admit a request, run and settle it, report budgets, delegate.

Order for ``tools/call``: rate limit, then the duplicate guard, then the charge; a refusal at any
step leaves nothing charged. Every other method admitted (``satgate/*`` and whatever the gateway
forwards upstream: resources, prompts, completions) passes the rate limit only; what the gateway
answers itself (``tools/list``, ``ping``) passes freely. Every limit is keyed by the verified token
(its delegation family for rates) or budget id, never by session; only the duplicate guard uses the
session id (with the token id, request id and params), by design: it recognises one client
re-sending one call, which a resumed session does under the same id. Identical copies in flight
share one execution (``run``); see duplicates.py. An empty session id (stateless requests) turns
the guard off for that call.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import structlog

from satgate_mcp import events
from satgate_mcp.auth.base import Identity
from satgate_mcp.errors import GatewayError
from satgate_mcp.events import Publisher
from satgate_mcp.jsonrpc import RATE_LIMITED, JsonObj, RequestId
from satgate_mcp.metrics import Metrics
from satgate_mcp.policy.budget import (
    BudgetStore,
    MemoryBudgetStore,
    child_account_ttl,
    initial_limit,
    resolve_cost,
    shown_remaining,
)
from satgate_mcp.policy.delegation import DEFAULT_MAX_DEPTH, DelegationRefused, Minter, Verifier, plan_child
from satgate_mcp.policy.duplicates import (
    ARRIVAL,
    DUPLICATE_TTL_SECONDS,
    FIRST_SETTLED,
    REFUSED,
    REPLAY_SETTLED,
    Arrival,
    DuplicateStore,
    MemoryDuplicateStore,
    Settlement,
    duplicate_key,
)
from satgate_mcp.policy.limits import (
    MemoryRateLimiter,
    RateLimiter,
    RateSpec,
    buckets_for,
    parse_tool_rates,
    rate_family,
    rate_spec,
    retry_after_seconds,
)
from satgate_mcp.policy.refunds import failure_kind, refundable
from satgate_mcp.settings import Settings

if TYPE_CHECKING:
    from satgate_mcp.state import LocalState

TOOLS_CALL = "tools/call"
GATEWAY_METHOD_PREFIX = "satgate/"
#: Answered by the gateway from its own state: they cost no upstream work, so no rate limit.
UNMETERED_METHODS = frozenset({"ping", "initialize", "tools/list", "logging/setLevel"})
BUDGET_EXHAUSTED_CODE = -32000
DELEGATION_FAILED_CODE = -32000

_log = structlog.get_logger("satgate_mcp.policy")

UpstreamCall = Callable[[], Awaitable[JsonObj]]


class SharedCall:
    """The one execution that identical copies of a call in flight in this process all await.

    The execution runs in its own task, so one copy going away (its client disconnected or
    cancelled) leaves it running for the others; only when no copy waits any more is it cancelled.
    """

    def __init__(self) -> None:
        self.answer: asyncio.Future[JsonObj] = asyncio.get_running_loop().create_future()
        self.task: asyncio.Task[None] | None = None
        self.waiters = 0

    def fail(self, exc: BaseException) -> None:
        if not self.answer.done():
            self.answer.set_exception(exc)
            self.answer.exception()  # retrieved here: copies that join re-raise it, none need to

    async def join(self) -> JsonObj:
        self.waiters += 1
        try:
            return await asyncio.shield(self.answer)
        finally:
            self.waiters -= 1
            if self.waiters == 0 and self.task is not None and not self.task.done():
                self.task.cancel()  # nobody wants the answer any more: let the upstream know
                await asyncio.wait({self.task})


@dataclass(slots=True)
class Admission:
    """What ``admit`` let through; hand it to ``run`` (or ``settle``) exactly once."""

    identity: Identity
    method: str
    tool: str | None
    budget_key: str
    cost: float = 0.0
    #: Credits taken from a limited budget by this admission (0 for copies and free passes).
    charged: float = 0.0
    limited: bool = False
    #: Admitted free: it joins a copy in flight here, or is the one re-send of a copy that never settled.
    duplicate: bool = False
    duplicate_key: str | None = None
    #: How the durable record admitted it (None: no guard, or a copy joining one in this process).
    arrival: Arrival | None = None
    #: The execution identical copies share; None when the guard is off.
    shared: SharedCall | None = None
    #: This copy joins ``shared`` instead of running it.
    follows: bool = False
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
        verifier: Verifier | None = None,
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
        self._verifier = verifier
        # ``is None``, not ``or``: an empty memory store has a length of 0, yet it is the one given.
        self._limiter: RateLimiter = MemoryRateLimiter(clock=clock) if rate_limiter is None else rate_limiter
        self._budgets: BudgetStore = MemoryBudgetStore(clock=clock) if budgets is None else budgets
        self._duplicates: DuplicateStore = (MemoryDuplicateStore(ttl=duplicate_ttl, clock=clock)
                                            if duplicates is None else duplicates)
        self._rate: RateSpec | None = (
            rate_spec(settings.rate_limit, settings.rate_burst) if settings.rate_limit else None
        )
        self._tool_rates = parse_tool_rates(tool_rate_limits or {})
        self._enforce = settings.enforcement == "control"
        self._max_depth = max_delegation_depth
        self._new_id = new_id
        self._on_close = tuple(on_close)
        #: Calls in flight in this process, by duplicate key: what identical copies join.
        self._in_flight: dict[str, SharedCall] = {}

    @classmethod
    def from_settings(cls, settings: Settings, *, publisher: Publisher, metrics: Metrics,
                      state: LocalState | None = None) -> CallPolicy:
        """In-memory stores (the state folder's with ``state``), or Redis-backed shared ones with a Redis URL."""
        tool_rates: Mapping[str, str] = settings.tool_rate_limits
        if not settings.redis_url:
            return cls(settings, publisher=publisher, metrics=metrics, tool_rate_limits=tool_rates,
                       budgets=None if state is None else state.budgets,
                       duplicates=None if state is None else state.duplicates)
        from satgate_mcp.policy.redis_stores import RedisStores

        stores = RedisStores.from_url(settings.redis_url)
        return cls(settings, publisher=publisher, metrics=metrics, tool_rate_limits=tool_rates,
                   rate_limiter=stores.rate_limiter, budgets=stores.budgets, duplicates=stores.duplicates,
                   on_close=[stores.aclose])

    # -- admit / run / settle -------------------------------------------------------------------

    async def admit(self, identity: Identity, *, method: str, tool: str | None, session_id: str,
                    request_id: RequestId, params: JsonObj | None) -> Admission:
        """Let one request through or raise the GatewayError the client should see."""
        admission = Admission(identity, method, tool, identity.budget_key)
        if method in UNMETERED_METHODS:
            return admission
        await self._check_rate(identity, method, tool if method == TOOLS_CALL else None)
        if method != TOOLS_CALL:
            return admission

        # A negative configured cost would mint credits; treat it as free.
        admission.cost = max(0.0, resolve_cost(tool or "", self._settings.tool_costs, self._settings.default_cost))
        limit = initial_limit(identity, self._settings.budgets)
        if not session_id:  # stateless requests: no guard, such clients reuse ids freely
            await self._charge(admission, limit)
            return admission
        key = admission.duplicate_key = duplicate_key(identity.token_id, session_id, request_id, params)
        shared = self._in_flight.get(key)
        if shared is not None:
            admission.shared, admission.follows = shared, True
            await self._admit_free(admission, limit)
            return admission
        # Registered before any await, so a copy arriving meanwhile joins this one.
        shared = admission.shared = self._in_flight[key] = SharedCall()
        try:
            admission.arrival = Arrival(await self._duplicates.apply(key, ARRIVAL))
            if admission.arrival is Arrival.REPLAY:
                await self._admit_free(admission, limit)
            else:
                await self._charge(admission, limit)
        except BaseException as exc:
            await self._abandon(admission, key, shared, exc)
            raise
        return admission

    async def run(self, admission: Admission, call: UpstreamCall) -> JsonObj:
        """Forward a ``tools/call`` once for every identical copy in flight, then settle it.

        Each copy gets the one answer (the transport puts its own id on it); the execution and the
        settlement belong to the copy that leads, and run to the end whichever copies go away.
        """
        shared = admission.shared
        if shared is None:
            reply: JsonObj | None = None
            failure: BaseException | None = None
            try:
                reply = await call()
                return reply
            except BaseException as exc:
                failure = exc
                raise
            finally:
                await self.settle(admission, ran=not refundable(failure_kind(reply, failure)))
        if not admission.follows and shared.task is None:
            shared.task = asyncio.create_task(self._execute(admission, shared, call))
        return await shared.join()

    async def _execute(self, admission: Admission, shared: SharedCall, call: UpstreamCall) -> None:
        reply: JsonObj | None = None
        failure: BaseException | None = None
        try:
            reply = await call()
        except BaseException as exc:
            failure = exc
        try:
            await self.settle(admission, ran=not refundable(failure_kind(reply, failure)))
        finally:
            self._forget(admission, shared)
            if reply is not None:
                shared.answer.set_result(reply)
            elif isinstance(failure, asyncio.CancelledError):
                shared.fail(_cancelled())
            else:
                shared.fail(failure or RuntimeError("no reply"))

    async def settle(self, admission: Admission, *, ran: bool) -> None:
        """Close an admission; ``ran=False`` (the upstream certainly never ran it) refunds it.

        The ``tool_call`` event is the dispatcher's (it knows the upstream and outcome); a refund
        is published as a negative ``budget_spend`` so summing spend events gives what was paid.
        """
        if admission.settled:
            return
        admission.settled = True
        if admission.method != TOOLS_CALL or admission.follows:
            return
        key, amount, refund = admission.duplicate_key, admission.charged, not ran
        try:
            if key is not None and admission.arrival is Arrival.FIRST:
                refund = Settlement(await self._duplicates.apply(key, FIRST_SETTLED[ran])) is Settlement.REFUND
            elif key is not None and admission.arrival is Arrival.REPLAY:
                # A refund here gives back the first copy's charge, which it handed over to pay for this one.
                refund = Settlement(await self._duplicates.apply(key, REPLAY_SETTLED[ran])) is Settlement.REFUND
                amount = admission.cost
        finally:
            # Only once the record is settled: a copy arriving meanwhile joined this call, not ran it again.
            if admission.shared is not None:
                self._forget(admission, admission.shared)
                if admission.shared.task is None:  # settled without ``run``: copies waiting get no answer
                    admission.shared.fail(_cancelled())
        if refund and admission.limited and amount:
            await self._budgets.refund(admission.budget_key, amount)
            admission.remaining = (admission.remaining or 0.0) + amount
            self._publisher.publish(events.BUDGET_SPEND, **self._fields(admission.identity),
                                    tool=admission.tool or "", cost=-amount, refund=True,
                                    remaining=shown_remaining(admission.remaining))
            admission.charged = 0.0

    async def _charge(self, admission: Admission, limit: float | None) -> None:
        identity, name, cost = admission.identity, admission.tool or "", admission.cost
        charge = await self._budgets.charge(identity.budget_key, cost, limit=limit, enforce=self._enforce)
        if charge.exceeded:
            self._publisher.publish(events.BUDGET_EXHAUSTED, **self._fields(identity), tool=name, cost=cost,
                                    remaining=shown_remaining(charge.remaining if not charge.allowed
                                                              else _before(charge.remaining, cost)),
                                    enforced=not charge.allowed)
        if not charge.allowed:
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

    async def _admit_free(self, admission: Admission, limit: float | None) -> None:
        """A copy joining one in flight, or the one re-send of a copy that never settled: nothing charged."""
        admission.duplicate = True
        admission.remaining = await self._budgets.remaining(admission.budget_key, limit=limit)
        admission.limited = admission.remaining is not None
        extra = {"replay": True} if admission.arrival is Arrival.REPLAY else {}
        self._publisher.publish(events.BUDGET_SPEND, **self._fields(admission.identity), tool=admission.tool or "",
                                cost=0, duplicate=True, remaining=shown_remaining(admission.remaining), **extra)

    async def _abandon(self, admission: Admission, key: str, shared: SharedCall, exc: BaseException) -> None:
        """A leading copy refused (or cancelled) while being admitted: undo its record; copies share the refusal."""
        try:
            if admission.arrival is Arrival.FIRST:
                await self._duplicates.apply(key, REFUSED)
            elif admission.arrival is Arrival.REPLAY:
                await self._duplicates.apply(key, REPLAY_SETTLED[False])
        finally:
            admission.settled = True
            self._forget(admission, shared)
            shared.fail(exc if isinstance(exc, GatewayError) else _cancelled())

    def _forget(self, admission: Admission, shared: SharedCall) -> None:
        if admission.duplicate_key is not None and self._in_flight.get(admission.duplicate_key) is shared:
            del self._in_flight[admission.duplicate_key]

    async def _check_rate(self, identity: Identity, method: str, tool: str | None) -> None:
        # A delegated child draws from its root token's buckets: delegation never multiplies the rate.
        buckets = buckets_for(rate_family(identity), tool, overall=self._rate, tool_rates=self._tool_rates)
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
        """Validate, mint, verify, and only then move the credits: any failure leaves the parent as it was."""
        if self._settings.auth_mode != "header" or self._settings.root_key is None:
            raise DelegationRefused("delegation needs header auth")
        root_key = self._settings.root_key.get_secret_value()
        now = self._wall_clock()
        plan = plan_child(parent, params, now=now, max_depth=self._max_depth)
        suffix = self._new_id()
        child_id, child_budget_id = f"dlg-{suffix}", f"dlg-budget-{suffix}"
        try:
            token = self._mint()(
                root_key, child_id,
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
        self._check_minted(root_key, token, child_id, child_budget_id)

        moved = await self._budgets.transfer(parent.budget_key, child_budget_id, plan.budget,
                                             parent_limit=initial_limit(parent, self._settings.budgets),
                                             ttl=child_account_ttl(plan.ttl))
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

    def _check_minted(self, root_key: str, token: str, child_id: str, child_budget_id: str) -> None:
        """The child must verify as what was meant before any credit moves to it."""
        if self._verifier is None:
            from satgate_mcp.auth.macaroons import verify_signature

            self._verifier = verify_signature
        try:
            child = self._verifier(root_key, token)
        except Exception as exc:
            _log.warning("delegation_child_unverifiable", child_id=child_id, error=str(exc) or repr(exc))
            raise DelegationRefused("the minted child token does not verify") from None
        if (child.token_id, child.budget_id) != (child_id, child_budget_id):
            raise DelegationRefused("the minted child token does not verify")

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


def _cancelled() -> GatewayError:
    """What a copy that joined a call gets when that call was cancelled under it."""
    return GatewayError("Request cancelled", {"error": "cancelled"})


def _before(remaining_after: float | None, cost: float) -> float | None:
    return None if remaining_after is None else remaining_after + cost
