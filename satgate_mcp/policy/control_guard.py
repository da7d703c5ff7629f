"""Tool controls as a guard (guards.py): each call judged by its token's ``controls`` caveats before it goes on.

A token without controls (and any request but a tool call) goes straight through: nothing is paid for
controls nobody carries. Otherwise, in the order a caller can act on them: the argument rules' breaches
(control_checks.py) are refused with the first one, JSON-RPC -32001 and ``data.error`` naming the control;
then an approval hold, then the user's confirmation (policy/holds.py), then the spend limits' reservation
around the call (so nothing is reserved while a person decides). Under ``SATGATE_ENFORCEMENT=observe`` chosen by the
operator, each breach is logged and counted and the call goes on. The setting's default is ``observe`` for
rate limits and budgets; controls a token carries are enforced unless the operator chose ``observe`` outright
(``enforces``), so no control is fail-open by default.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from functools import partial
from typing import TypeVar

import structlog

from satgate_mcp import events, jsonrpc
from satgate_mcp.auth.base import Identity
from satgate_mcp.errors import GatewayError
from satgate_mcp.events import Publisher
from satgate_mcp.guards import Asked, ClientFacts, Proceed
from satgate_mcp.jsonrpc import JsonObj
from satgate_mcp.metrics import Metrics
from satgate_mcp.policy.control_checks import (
    SPEND_LIMIT_EXCEEDED,
    Breach,
    amount_breach,
    approval_breach,
    arguments_of,
    confirm_breach,
    confirm_for,
    hold_for,
    judge,
)
from satgate_mcp.policy.holds import Holds
from satgate_mcp.policy.spend import (
    Charge,
    Planned,
    SpendStore,
    amount_of,
    applicable,
    did_not_run,
    exceeded_data,
    plan,
    reservation_key,
)
from satgate_mcp.policy.store_time import never_waived
from satgate_mcp.upstream.catalog import Kind

log = structlog.get_logger("satgate_mcp.controls")
T = TypeVar("T")


def enforces(enforcement: str, explicit: bool) -> bool:
    """Whether controls refuse: always, unless the operator set ``SATGATE_ENFORCEMENT=observe`` themselves."""
    return not (enforcement == "observe" and explicit)


class ControlsGuard:
    """``Guard``: the calling token's tool controls; ``enforce`` False only observes. Spend limits reserve in
    ``spend`` (the state store) around the call, bounded by ``timeout``; a store that cannot answer refuses."""

    def __init__(self, *, enforce: bool, publisher: Publisher, metrics: Metrics, spend: SpendStore, holds: Holds,
                 clock: Callable[[], float] = time.time, timeout: float | None = None) -> None:
        self.enforce = enforce
        self._holds = holds
        self._publisher = publisher
        self._metrics = metrics
        self._spend = spend
        self._clock = clock
        self._timeout = timeout

    async def guard(self, asked: Asked, proceed: Proceed) -> JsonObj:
        controls = asked.identity.controls
        if not controls or asked.target != "tool" or not any(caveat.names(asked.name) for caveat in controls):
            return await proceed()
        arguments = arguments_of(asked.params)
        breaches = judge(controls, asked.name, arguments)
        limits = applicable(controls, asked.name)
        unpriced = [limit for limit in limits if amount_of(limit, arguments) is None]
        breaches += [amount_breach(asked.name, limit.field) for limit in unpriced]
        if breaches:
            self.breached(asked, breaches)
        spending: Proceed = proceed
        if limits and not unpriced:
            planned = plan(limits, asked.identity, arguments, self._clock())
            spending = partial(self._spending, asked, planned, proceed)
        confirmed: Proceed = spending
        if (confirm := confirm_for(controls, asked.name)) is not None:
            if self.enforce:
                confirmed = partial(self._holds.confirm, asked, confirm.message, confirm.fields, spending)
            else:
                self.breached(asked, [confirm_breach(asked.name)])
        if (hold := hold_for(controls, asked.name, arguments)) is not None:
            if self.enforce:
                return await self._holds.hold(asked, hold.reason, hold.wait, confirmed, shown=hold.fields)
            self.breached(asked, [approval_breach(hold, asked.name)])
        return await confirmed()

    async def _spending(self, asked: Asked, planned: list[Planned], proceed: Proceed) -> JsonObj:
        """Reserve every charge, run the call, then give the amount back only if the call certainly did not run."""
        key = reservation_key(asked.identity, asked.session_id, asked.request_id, asked.params)
        charges = [p.charge for p in planned]
        try:
            reservation = await self._store(lambda: self._spend.reserve(key, charges, self._clock()))
        except GatewayError:
            if self.enforce:
                raise
            return await proceed()  # observing refuses nothing, not even for a store that cannot answer
        if reservation.exceeded is not None:
            over = planned[reservation.exceeded]
            self.breached(asked, [Breach(SPEND_LIMIT_EXCEEDED, f"Tool {asked.name!r}: the amount would pass the "
                                         f"{over.limit.window}'s spend limit",
                                         exceeded_data(asked.name, over, reservation.total))])
            return await proceed()  # observed: not reserved, nothing to give back
        if reservation.duplicate:
            return await proceed()  # a copy of a call whose first copy holds the reservation (and settles it)
        reply: JsonObj | None = None
        failure: BaseException | None = None
        try:
            reply = await proceed()
            return reply
        except BaseException as exc:
            failure = exc
            raise
        finally:
            await self._close(key, charges, did_not_run(reply, failure))

    async def _close(self, key: str, charges: list[Charge], give_back: bool) -> None:
        try:
            if give_back:
                await self._store(lambda: self._spend.release(key, charges))
            else:
                await self._store(lambda: self._spend.settle(key))
        except GatewayError:  # kept: a hold that outlives its call only stays charged (fail closed)
            log.warning("spend_close_failed", give_back=give_back)

    async def _store(self, operation: Callable[[], Awaitable[T]]) -> T:
        """A store operation, bounded; a fault is the closed refusal (a spend limit is never waived)."""
        return await never_waived(operation, self._timeout, self._fault)

    def _fault(self, error: str) -> None:
        self._metrics.store_errors.labels(op="spend").inc()
        log.warning("spend_store_failed", error=error)

    def breached(self, asked: Asked, breaches: list[Breach]) -> None:
        """Count and log each breach; enforcing, refuse with the first."""
        mode = "enforced" if self.enforce else "observed"
        for breach in breaches:
            self._metrics.control_breaches.labels(error=breach.error, mode=mode).inc()
            self._publisher.publish(events.CONTROL_BREACH, token_id=asked.identity.token_id,
                                    session_id=asked.session_id, tool=asked.name[:200], error=breach.error,
                                    field=breach.data.get("field"), enforced=self.enforce)
            if not self.enforce:
                log.warning("control_observed", tool=asked.name[:200], error=breach.error,
                            field=breach.data.get("field"), token_id=asked.identity.token_id)
        if self.enforce:
            first = breaches[0]
            self._metrics.refusals.labels(reason=first.error).inc()
            raise GatewayError(first.message, {"error": first.error, **first.data}, code=jsonrpc.TOOL_NOT_ALLOWED)

    def hides(self, identity: Identity, kind: Kind, item: JsonObj, client: ClientFacts | None) -> bool:
        return False  # a tool with rules on its arguments is still callable within them
