"""What a call's credits do: a charge taken or refused, a copy admitted free, a refund, each with its events.

The engine decides which of these a call gets (its ``Role``); this carries one out against the budget
store and tells the operator: a ``budget_spend`` for every move of credits (a refund is a negative one,
so summing them gives what was paid) and ``budget_exhausted`` when a cost did not fit.
"""

from __future__ import annotations

from typing import Any

from satgate_mcp import events
from satgate_mcp.auth.base import Identity
from satgate_mcp.errors import GatewayError
from satgate_mcp.events import Publisher
from satgate_mcp.metrics import Metrics
from satgate_mcp.policy.admissions import Admission
from satgate_mcp.policy.budget import BudgetStore, Charge, kept_in_store, shown_remaining
from satgate_mcp.policy.settlement import Role

BUDGET_EXHAUSTED_CODE = -32000
#: The answer of a budget that is not kept in the store: taken, nothing remaining to count.
UNLIMITED = Charge(True, None)


class Charging:
    """The budget half of admission and settlement, over one budget store."""

    def __init__(self, budgets: BudgetStore, *, publisher: Publisher, metrics: Metrics, enforce: bool) -> None:
        self._budgets = budgets
        self._publisher = publisher
        self._metrics = metrics
        self._enforce = enforce

    async def charge(self, admission: Admission, cost: float, limit: float | None) -> Admission:
        identity = admission.identity
        if not kept_in_store(limit, identity.budget_id):
            return self.take(admission, cost, UNLIMITED)
        charge = await admission.store_time.run(
            lambda: self._budgets.charge(identity.budget_key, cost, limit=limit, enforce=self._enforce))
        return self.take(admission, cost, charge)

    def take(self, admission: Admission, cost: float, charge: Charge) -> Admission:
        """What a charge's answer means for the call: refused (GatewayError) or taken, with its events."""
        identity, name = admission.identity, admission.tool or ""
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
        admission.stake = cost if charge.remaining is not None else 0.0
        admission.remaining = charge.remaining
        self._publisher.publish(events.BUDGET_SPEND, **self._fields(identity), tool=name, cost=cost,
                                remaining=shown_remaining(charge.remaining))
        return admission

    async def admit_free(self, admission: Admission, cost: float, limit: float | None) -> Admission:
        """A copy joining one in flight, or the one re-send of a copy that never settled: nothing charged."""
        if not kept_in_store(limit, admission.identity.budget_id):
            return self.free(admission, cost, None)
        remaining = await admission.store_time.run(
            lambda: self._budgets.remaining(admission.identity.budget_key, limit=limit))
        return self.free(admission, cost, remaining)

    def free(self, admission: Admission, cost: float, remaining: float | None) -> Admission:
        admission.remaining = remaining
        admission.stake = cost if admission.remaining is not None else 0.0
        extra = {"replay": True} if admission.role is Role.REPLAY else {}
        self._publisher.publish(events.BUDGET_SPEND, **self._fields(admission.identity), tool=admission.tool or "",
                                cost=0, duplicate=True, remaining=shown_remaining(admission.remaining), **extra)
        return admission

    async def refund(self, admission: Admission) -> None:
        """Give a settled call's stake back (a no-op when it took none), published as a negative spend."""
        amount = admission.stake
        if not amount:
            return
        await admission.store_time.run(
            lambda: self._budgets.refund(admission.identity.budget_key, amount, refund_id=admission.charge_id))
        admission.remaining = (admission.remaining or 0.0) + amount
        self._publisher.publish(events.BUDGET_SPEND, **self._fields(admission.identity),
                                tool=admission.tool or "", cost=-amount, refund=True,
                                remaining=shown_remaining(admission.remaining))

    @staticmethod
    def _fields(identity: Identity) -> dict[str, Any]:
        return {"token_id": identity.token_id, "budget_id": identity.budget_key}


def _before(remaining_after: float | None, cost: float) -> float | None:
    return None if remaining_after is None else remaining_after + cost
