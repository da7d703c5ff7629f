"""The policy facade the transports call: admit a request, run and settle it, report budgets, delegate.

Order for ``tools/call``: rate limit, then the duplicate guard, then the charge; a refusal at any
step leaves nothing charged. Every other method admitted (``satgate/*`` and whatever the gateway
forwards upstream: resources, prompts, completions) passes the rate limit only; what the gateway
answers itself (``tools/list``, ``ping``) passes freely. Every limit is keyed by the verified token
(its delegation family for rates) or budget id, never by session; only the duplicate guard uses the
session id (with the token id, request id and params), by design: it recognises one client
re-sending one call, which a resumed session does under the same id. Identical copies in flight
share one execution (``run``, shared_calls.py); who pays is duplicates.py's. How a call settles
is decided purely in settlement.py from its ``Role`` and what happened; this module carries it out.
An empty session id (stateless requests) turns the guard off for that call. The store time of a
whole call, admission and settlement together, is bounded by one allowance (store_time.py).
"""

from __future__ import annotations

import contextlib
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from types import MappingProxyType
from typing import TypedDict, Unpack

import structlog

from satgate_mcp import events
from satgate_mcp.auth.base import Identity
from satgate_mcp.errors import GatewayError, store_unavailable
from satgate_mcp.events import Publisher
from satgate_mcp.jsonrpc import RATE_LIMITED, JsonObj, RequestId
from satgate_mcp.metrics import Metrics
from satgate_mcp.policy.admissions import Admission, Admissions, Arrived, ChargeAsk, RateTaking
from satgate_mcp.policy.budget import BudgetStore, initial_limit, kept_in_store, resolve_cost, shown_remaining
from satgate_mcp.policy.charging import UNLIMITED, Charging
from satgate_mcp.policy.closing import Closer
from satgate_mcp.policy.delegate import Delegator
from satgate_mcp.policy.delegation import DEFAULT_MAX_DEPTH, Minter, Verifier
from satgate_mcp.policy.duplicates import (
    ARRIVAL,
    DUPLICATE_TTL_SECONDS,
    Arrival,
    DuplicateStore,
    duplicate_key,
)
from satgate_mcp.policy.ledger import ArrivalLedger, ChargeLedger, LostCharges
from satgate_mcp.policy.limits import (
    Bucket,
    RateLimiter,
    RateSpec,
    ToolRate,
    buckets_for,
    parse_tool_rates,
    rate_family,
    rate_spec,
    retry_after_seconds,
)
from satgate_mcp.policy.settlement import ROLE_ON_ARRIVAL, Outcome, Role, outcome_of
from satgate_mcp.policy.shared_calls import InFlight, UpstreamCall, cancelled
from satgate_mcp.policy.store_time import StoreTime
from satgate_mcp.settings import Settings
from satgate_mcp.stores import STORE_ERRORS, Stores
from satgate_mcp.stores.memory import MemoryBudgetStore, MemoryDuplicateStore, MemoryRateLimiter

log = structlog.get_logger("satgate_mcp.policy")

TOOLS_CALL = "tools/call"
#: Answered by the gateway from its own state: they cost no upstream work, so no rate limit.
UNMETERED_METHODS = frozenset({"ping", "initialize", "tools/list", "logging/setLevel"})

_NONE: Mapping[str, float] = MappingProxyType({})

class Parts(TypedDict, total=False):
    """What a deployment (or a test) plugs in besides the configuration: clocks, stores, minting."""

    clock: Callable[[], float]
    wall_clock: Callable[[], float]
    minter: Minter | None
    verifier: Verifier | None
    rate_limiter: RateLimiter | None
    budgets: BudgetStore | None
    duplicates: DuplicateStore | None
    admissions: Admissions | None
    max_delegation_depth: int
    duplicate_ttl: float
    new_id: Callable[[], str]
    on_close: Sequence[Callable[[], Awaitable[None]]]
    store_timeout: float | None


class CallPolicy:
    """The limits of one deployment, given explicitly; ``from_settings`` reads them from ``Settings``."""

    def __init__(
        self,
        *,
        publisher: Publisher,
        metrics: Metrics,
        rate: RateSpec | None = None,
        tool_rates: Sequence[ToolRate] = (),
        costs: Mapping[str, float] = _NONE,
        default_cost: float = 1.0,
        operator_budgets: Mapping[str, float] = _NONE,
        enforcement: str = "observe",
        root_key: str | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        minter: Minter | None = None,
        verifier: Verifier | None = None,
        rate_limiter: RateLimiter | None = None,
        budgets: BudgetStore | None = None,
        duplicates: DuplicateStore | None = None,
        admissions: Admissions | None = None,
        max_delegation_depth: int = DEFAULT_MAX_DEPTH,
        duplicate_ttl: float = DUPLICATE_TTL_SECONDS,
        new_id: Callable[[], str] = lambda: secrets.token_hex(12),
        on_close: Sequence[Callable[[], Awaitable[None]]] = (),
        fail_open: bool = False,
        store_timeout: float | None = None,
    ) -> None:
        """``rate`` and ``tool_rates`` limit each token family; ``costs`` (by tool pattern, else
        ``default_cost``) are charged to budgets that start at the caveat's limit or the operator's
        ``operator_budgets`` entry; ``enforcement`` is ``"control"`` (refuse) or ``"observe"``
        (charge and report). ``root_key`` mints delegated children; None refuses delegation.
        ``admissions``, when the stores can, takes a guarded call's arrival and charge in one operation.
        ``store_timeout`` is the store time one call may spend in all (None: unbounded)."""
        self._publisher, self._metrics = publisher, metrics
        self._rate = rate
        self._tool_rates = tuple(tool_rates)
        self._costs, self._default_cost = costs, default_cost
        self._operator_budgets = operator_budgets
        self._enforcement = enforcement
        self._enforce = enforcement == "control"
        # ``is None``, not ``or``: an empty memory store has a length of 0, yet it is the one given.
        self._limiter: RateLimiter = MemoryRateLimiter(clock=clock) if rate_limiter is None else rate_limiter
        self._budgets: BudgetStore = MemoryBudgetStore(clock=clock) if budgets is None else budgets
        self._duplicates: DuplicateStore = (MemoryDuplicateStore(ttl=duplicate_ttl, clock=clock)
                                            if duplicates is None else duplicates)
        self._admissions = admissions
        self._charging = Charging(self._budgets, publisher=publisher, metrics=metrics, enforce=self._enforce)
        # Decided once: an isinstance check on a runtime protocol costs more than the call it picks.
        self._arrivals_kept = admissions if isinstance(admissions, ArrivalLedger) else None
        self._charges_kept, self._rate_taking = (self._budgets if isinstance(self._budgets, ChargeLedger) else None,
                                                 isinstance(admissions, RateTaking) and admissions.takes_rate)
        self._delegator = Delegator(root_key=root_key, budgets=self._budgets, operator_budgets=operator_budgets,
                                    publisher=publisher, metrics=metrics, wall_clock=wall_clock, minter=minter,
                                    verifier=verifier, max_depth=max_delegation_depth, new_id=new_id)
        self._on_close = tuple(on_close)
        self._in_flight = InFlight()
        self._fail_open, self._store_timeout = fail_open, store_timeout
        self._closer = Closer(duplicates=self._duplicates, charging=self._charging, in_flight=self._in_flight,
                              metrics=metrics, store_timeout=store_timeout)
        self._lost = LostCharges(self._closer, store_timeout=store_timeout)

    @classmethod
    def from_settings(cls, settings: Settings, *, publisher: Publisher, metrics: Metrics,
                      stores: Stores | None = None, **parts: Unpack[Parts]) -> CallPolicy:
        """The one place ``Settings`` become a policy, over ``stores`` (``open_stores``; in memory when
        None). Parts handed in win over the stores'. Delegation needs header auth."""
        if stores is not None:
            # Every store wait is bounded by one allowance, a locked database's as much as a paused Redis's.
            parts = {"rate_limiter": stores.rate_limiter, "budgets": stores.budgets, "duplicates": stores.duplicates,
                     "admissions": stores.admissions, "store_timeout": stores.timeout, **parts}
        root_key = settings.root_key if settings.auth_mode == "header" else None
        return cls(
            publisher=publisher, metrics=metrics,
            rate=rate_spec(settings.rate_limit, settings.rate_burst) if settings.rate_limit else None,
            tool_rates=parse_tool_rates(settings.tool_rate_limits),
            costs=settings.tool_costs, default_cost=settings.default_cost, operator_budgets=settings.budgets,
            enforcement=settings.enforcement,
            root_key=root_key.get_secret_value() if root_key is not None else None,
            fail_open=settings.store_fail_mode == "open",
            **parts,
        )

    # -- admit / run / settle -------------------------------------------------------------------

    async def admit(self, identity: Identity, *, method: str, tool: str | None, session_id: str,
                    request_id: RequestId, params: JsonObj | None) -> Admission:
        """Let one request through or raise the GatewayError the client should see.

        A store that cannot answer (Redis down or paused past its timeout, the state database
        unusable) is the gateway's fault: closed, the call is refused as ``store_unavailable`` (the
        transport answers 503 + Retry-After); open, it is admitted unmetered and counted. Every store
        operation of the call shares one allowance of store time, so a slow store costs it that at most.
        """
        try:
            return await self._admit(identity, method=method, tool=tool, session_id=session_id,
                                     request_id=request_id, params=params, store_time=StoreTime(self._store_timeout))
        except STORE_ERRORS as exc:
            self._metrics.store_errors.labels(op="admit").inc()
            log.warning("store_unavailable", op="admit", error=type(exc).__name__, token_id=identity.token_id,
                        tool=tool, fail_mode="open" if self._fail_open else "closed")
            if not self._fail_open:
                self._metrics.refusals.labels(reason="store_unavailable").inc()
                raise store_unavailable() from None
            self._metrics.fail_open_admissions.inc()
            self._publisher.publish(events.FAIL_OPEN_ADMISSION, token_id=identity.token_id, method=method, tool=tool)
            return Admission(identity, tool, Role.UNMETERED)

    async def _admit(self, identity: Identity, *, method: str, tool: str | None, session_id: str,
                     request_id: RequestId, params: JsonObj | None, store_time: StoreTime) -> Admission:
        if method in UNMETERED_METHODS:
            return Admission(identity, tool, Role.UNMETERED)
        tool = tool if method == TOOLS_CALL else None
        buckets = buckets_for(rate_family(identity), tool, overall=self._rate, tool_rates=self._tool_rates)
        if method != TOOLS_CALL:
            if buckets:
                await self._check_rate(identity, method, tool, buckets, store_time)
            return Admission(identity, tool, Role.UNMETERED)
        # A negative configured cost would mint credits; treat it as free.
        cost = max(0.0, resolve_cost(tool or "", self._costs, self._default_cost))
        limit = initial_limit(identity, self._operator_budgets)
        key = duplicate_key(identity.token_id, session_id, request_id, params) if session_id else ""
        # A leading guarded call on a store that can takes its rate token in its arrival's one operation (decided
        # with no await before the call registers, so no copy slips in between); any other call takes it first.
        with_arrival = (self._rate_taking and bool(buckets) and bool(session_id)
                        and kept_in_store(limit, identity.budget_id) and self._in_flight.get(key) is None)
        if buckets and not with_arrival:
            await self._check_rate(identity, method, tool, buckets, store_time)
        if not session_id:  # stateless requests: no guard, such clients reuse ids freely
            return await self._charge_unguarded(Admission(identity, tool, Role.UNGUARDED, store_time=store_time),
                                                cost, limit)
        shared = self._in_flight.get(key)
        if shared is not None:
            joined = Admission(identity, tool, Role.JOINED, duplicate_key=key, shared=shared, store_time=store_time)
            return await self._charging.admit_free(joined, cost, limit)
        # Registered before any await, so a copy arriving meanwhile joins this one.
        shared = self._in_flight.open(key)
        if not kept_in_store(limit, identity.budget_id):  # nothing to record: copies in flight still share a run
            return self._charging.take(Admission(identity, tool, Role.AGAIN, duplicate_key=key, shared=shared,
                                                 store_time=store_time), cost, UNLIMITED)
        admission = Admission(identity, tool, Role.LEADING, duplicate_key=key, shared=shared, store_time=store_time)
        return await self._lead(admission, cost, limit, tuple(buckets) if with_arrival else ())

    async def _lead(self, admission: Admission, cost: float, limit: float | None, buckets: tuple[Bucket, ...]
                    ) -> Admission:
        """The first copy of a guarded call: its arrival recorded and its charge taken, or it is refused (and
        every copy that joined it with it)."""
        key, shared, store_time = admission.duplicate_key, admission.shared, admission.store_time
        assert key is not None
        assert shared is not None
        try:
            if self._admissions is not None:
                return await self._arrive(self._admissions, admission, cost, limit, buckets)
            arrival = await store_time.run(lambda: self._duplicates.apply(key, ARRIVAL))
            admission.role = ROLE_ON_ARRIVAL[Arrival(arrival)]
            if admission.role is Role.REPLAY:
                return await self._charging.admit_free(admission, cost, limit)
            return await self._charging.charge(admission, cost, limit)
        except BaseException as exc:
            shared.fail(exc if isinstance(exc, GatewayError) else cancelled())  # copies share the refusal
            if store_time.spent:  # the refusal goes out now; its record is put right when the store answers
                self._tidy(admission)
            else:
                await self._closer.close(admission, Outcome.REFUSED)
            raise

    async def _arrive(self, admissions: Admissions, admission: Admission, cost: float, limit: float | None,
                      buckets: tuple[Bucket, ...]) -> Admission:
        """The same steps as the general path, in one store operation (with the rate check, when ``buckets``). A
        refused charge leaves the role LEADING: the store already took its record back (or, refused by the rate
        limit, never made it), so closing it only lets the shared call go."""
        key = admission.duplicate_key
        assert key is not None
        ask = ChargeAsk(admission.identity.budget_key, cost, limit, self._enforce, admission.charge_id, buckets)
        kept = self._arrivals_kept
        arrived = await self._lost.charged(admission, lambda: admissions.arrive(key, ask),
                                      kept.arrival_landed if kept is not None else None,
                                      lambda late, found: self._arrived(late, found, cost))
        return self._arrived(admission, arrived, cost)

    def _arrived(self, admission: Admission, arrived: Arrived, cost: float) -> Admission:
        if arrived.rate_wait > 0:
            raise self._rate_refusal(admission.identity, TOOLS_CALL, admission.tool, arrived.rate_wait)
        if arrived.charge is None:
            admission.role = Role.REPLAY
            return self._charging.free(admission, cost, arrived.remaining)
        if arrived.charge.allowed:
            admission.role = ROLE_ON_ARRIVAL[arrived.arrival]
        return self._charging.take(admission, cost, arrived.charge)

    async def _charge_unguarded(self, admission: Admission, cost: float, limit: float | None) -> Admission:
        if not kept_in_store(limit, admission.identity.budget_id):
            return self._charging.take(admission, cost, UNLIMITED)
        key, kept = admission.identity.budget_key, self._charges_kept
        charge = await self._lost.charged(
            admission, lambda: self._budgets.charge(key, cost, limit=limit, enforce=self._enforce,
                                                    charge_id=admission.charge_id),
            kept.charge_landed if kept is not None else None,
            lambda late, found: self._charging.take(late, cost, found))
        return self._charging.take(admission, cost, charge)

    def _tidy(self, admission: Admission) -> None:
        """Close a refused admission in the background, with an allowance of its own, logged if it fails."""
        admission.store_time = StoreTime(self._store_timeout)
        self._closer.spawn(self._closer.close_recorded(admission, Outcome.REFUSED), charge_id=admission.charge_id)

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
                await self._closer.close_recorded(admission, outcome_of(reply, failure))
        if admission.role is not Role.JOINED:
            shared.start(call, lambda reply, failure: self._closer.close_recorded(admission,
                                                                                  outcome_of(reply, failure)))
        return await shared.join()

    async def settle(self, admission: Admission, *, ran: bool) -> None:
        """Close an admission; ``ran=False`` (the upstream certainly never ran it) refunds it."""
        await self._closer.close_recorded(admission, Outcome.RAN if ran else Outcome.NOT_RUN)

    async def _check_rate(self, identity: Identity, method: str, tool: str | None, buckets: Sequence[Bucket],
                          store_time: StoreTime) -> None:
        """One token from each bucket (a delegated child draws from its root token's: delegation never multiplies
        the rate), or the call is refused."""
        wait = await store_time.run(lambda: self._limiter.acquire(buckets))
        if wait > 0:
            raise self._rate_refusal(identity, method, tool, wait)

    def _rate_refusal(self, identity: Identity, method: str, tool: str | None, wait: float) -> GatewayError:
        retry = retry_after_seconds(wait)
        self._metrics.refusals.labels(reason="rate_limited").inc()
        self._publisher.publish(events.RATE_LIMITED, token_id=identity.token_id, method=method, tool=tool,
                                retry_after_seconds=retry)
        return GatewayError("rate limit exceeded", {"error": "rate_limited", "retry_after_seconds": retry},
                            code=RATE_LIMITED)

    # -- satgate/budget -------------------------------------------------------------------------

    async def budget_status(self, identity: Identity) -> JsonObj:
        """``{tokenId, budgetId, remaining}``; remaining -1 means unlimited. A store that cannot answer is
        ``store_unavailable`` in either fail mode (there is nothing to admit)."""
        limit = initial_limit(identity, self._operator_budgets)
        async with self._store_fault("budget"):
            remaining = await StoreTime(self._store_timeout).run(
                lambda: self._budgets.remaining(identity.budget_key, limit=limit))
        return {
            "tokenId": identity.token_id,
            "budgetId": identity.budget_key,
            "remaining": shown_remaining(remaining),
            "enforcement": self._enforcement,
        }

    # -- satgate/delegate -----------------------------------------------------------------------

    async def delegate(self, identity: Identity, params: JsonObj | None) -> JsonObj:
        """Mint a child token whose credits move out of the parent's budget; see delegate.py. A store
        that cannot answer is ``store_unavailable`` in either fail mode: no credits move."""
        async with self._store_fault("delegate"):
            return await StoreTime(self._store_timeout).run(lambda: self._delegator.delegate(identity, params))

    @contextlib.asynccontextmanager
    async def _store_fault(self, op: str) -> AsyncIterator[None]:
        try:
            yield
        except STORE_ERRORS as exc:
            self._metrics.store_errors.labels(op=op).inc()
            log.warning("store_unavailable", op=op, error=type(exc).__name__)
            raise store_unavailable() from None

    async def close(self) -> None:
        await self._closer.aclose()
        await self._limiter.close()
        await self._budgets.close()
        await self._duplicates.close()
        for closer in self._on_close:
            await closer()
