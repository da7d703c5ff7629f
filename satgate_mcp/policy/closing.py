"""Carrying out a call's settlement (settlement.py decides it), and finishing one a store fault interrupted.

The steps: move the duplicate record, let go of the execution identical copies share, refund when the plan (or
the record's answer) says so. A store fault part-way never costs the client its answer; what was not done is
done in the background, under allowances of its own, until the store answers (store_time.py's waits): the record's
answer, once received, is kept, and a refund carries the call's charge id, so a step repeated after a lost
answer is not done twice. Background work of the policy (these, clean-ups of refused calls, late resolutions of
lost charges) is held here so ``close`` can wait for it or account for it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable
from dataclasses import dataclass

import structlog

from satgate_mcp.metrics import Metrics
from satgate_mcp.policy.admissions import Admission
from satgate_mcp.policy.charging import Charging
from satgate_mcp.policy.duplicates import DuplicateStore, WritesBehind
from satgate_mcp.policy.settlement import Closing, Outcome, Role, closing
from satgate_mcp.policy.shared_calls import InFlight
from satgate_mcp.policy.store_time import StoreTime, in_background
from satgate_mcp.stores.errors import STORE_ERRORS

log = structlog.get_logger("satgate_mcp.policy")

#: Background tasks at most (unfinished settlements, lost charges being resolved): beyond, each is logged at once.
MAX_BACKGROUND = 1024


@dataclass(slots=True)
class Settling:
    """How far one settlement got: what is left to do when the store failed part-way."""

    plan: Closing
    recorded: bool = False
    record_says: str | None = None
    refunded: bool = False


class Closer:
    def __init__(self, *, duplicates: DuplicateStore, charging: Charging, in_flight: InFlight, metrics: Metrics,
                 store_timeout: float | None) -> None:
        self._duplicates = duplicates
        # Decided once: an isinstance check on a runtime protocol costs more than the call it picks.
        self._records_behind: WritesBehind | None = duplicates if isinstance(duplicates, WritesBehind) else None
        self._charging = charging
        self._in_flight = in_flight
        self._metrics = metrics
        self._store_timeout = store_timeout
        self._background: set[asyncio.Task[None]] = set()

    def spawn(self, work: Awaitable[None], **context: object) -> None:
        """Run ``work`` after the answer went out; ``close`` waits for it. Over the bound it is not run: logged."""
        if len(self._background) >= MAX_BACKGROUND:
            if asyncio.iscoroutine(work):
                work.close()
            log.error("background_work_dropped", **context)
            return
        task = asyncio.ensure_future(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def close_recorded(self, admission: Admission, outcome: Outcome) -> None:
        """``close``, but a store fault never costs the client its answer: what is left is finished in the
        background (logged with everything needed to reconcile it by hand if even that fails)."""
        step = Settling(closing(admission.role, outcome))
        try:
            await self.close(admission, step=step)
        except STORE_ERRORS as exc:
            self._metrics.store_errors.labels(op="settle").inc()
            log.warning("settlement_deferred", error=type(exc).__name__, outcome=str(outcome),
                        charge_id=admission.charge_id, token_id=admission.identity.token_id)
            self.spawn(self._finish_late(admission, step, outcome), charge_id=admission.charge_id)

    async def close(self, admission: Admission, outcome: Outcome | None = None, *,
                    step: Settling | None = None) -> None:
        """Carry out ``closing``: move the record, let go of the shared call, refund.

        The ``tool_call`` event is the dispatcher's (it knows the upstream and outcome); a refund
        is published as a negative ``budget_spend`` so summing spend events gives what was paid.
        """
        if step is None:
            assert outcome is not None
            step = Settling(closing(admission.role, outcome))
        admission.role = Role.SETTLED
        try:
            await self._record(admission, step)
        finally:
            # Only once the record is settled: a copy arriving meanwhile joined this call, not ran it again.
            if step.plan.release and admission.duplicate_key is not None and admission.shared is not None:
                self._in_flight.release(admission.duplicate_key, admission.shared)
        await self._refund(admission, step)

    async def _record(self, admission: Admission, step: Settling) -> None:
        plan, key = step.plan, admission.duplicate_key
        if step.recorded or plan.record is None or key is None:
            step.recorded = True
            return
        record = plan.record
        if self._records_behind is not None and not plan.answer_matters(admission.stake):
            self._records_behind.apply_behind(key, record)
        else:
            step.record_says = await admission.store_time.run(lambda: self._duplicates.apply(key, record))
        step.recorded = True

    async def _refund(self, admission: Admission, step: Settling) -> None:
        if not step.refunded and step.plan.refunds(step.record_says):
            await self._charging.refund(admission)
        step.refunded = True

    async def _finish_late(self, admission: Admission, step: Settling, outcome: Outcome) -> None:
        async def finish() -> None:
            admission.store_time = StoreTime(None)  # each try is bounded by in_background's allowance
            await self._record(admission, step)
            await self._refund(admission, step)

        fields = {"outcome": str(outcome), "token_id": admission.identity.token_id,
                  "budget_id": admission.identity.budget_key, "tool": admission.tool, "stake": admission.stake,
                  "duplicate_key": admission.duplicate_key, "charge_id": admission.charge_id}
        try:
            await in_background(finish, allowance=self._store_timeout, errors=STORE_ERRORS)
        except asyncio.CancelledError:
            log.error("settlement_not_recorded", error="shutdown", recorded=step.recorded, refunded=step.refunded,
                      **fields)
            raise
        except STORE_ERRORS as exc:
            log.error("settlement_not_recorded", error=type(exc).__name__, recorded=step.recorded,
                      refunded=step.refunded, **fields)
            return
        log.info("settlement_recorded_late", charge_id=admission.charge_id, outcome=str(outcome))

    async def aclose(self) -> None:
        """Give background work one more moment, then stop it (what it could not finish is logged)."""
        if self._background:
            await asyncio.wait(list(self._background), timeout=3 * (self._store_timeout or 1.0))
        for task in list(self._background):
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
