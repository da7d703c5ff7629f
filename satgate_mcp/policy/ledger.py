"""Exact accounting when a store answer is lost: every metered call is charged and answered, or neither.

A Redis script that timed out on the client may have run on the server: the charge landed, the answer did not.
Refusing the call then (503, "retry") while keeping the charge makes the client pay for nothing, and twice when
it retries. So every charge carries a charge id the store records with it (its ledger entry), and a charge whose
answer was lost is *resolved* before anything is answered: the store is asked, with a short bounded retry of its
own, whether that charge id landed. Asking voids it when it did not, so a command still on its way (queued in a
paused Redis) can never land afterwards. Then:

- it landed: the call goes on as admitted, its settlement under a fresh allowance (the client never sees the 503);
- it never will: nothing was charged, and the 503 is the truth;
- the store did not answer: the 503 goes out, and the resolution goes on in the background until the store
  answers; a charge found then is settled as not run (refunded, its record put right). Only a process that dies
  before that loses it, and the log line carries the charge id.

Refunds carry an id too, so one retried after a lost answer is given once. Which stores keep a ledger is theirs to
say (``ArrivalLedger``, ``ChargeLedger``); the in-memory ones never lose an answer.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Protocol, TypeVar, runtime_checkable

import structlog

from satgate_mcp.errors import GatewayError
from satgate_mcp.policy.admissions import Admission, Arrived
from satgate_mcp.policy.budget import Charge
from satgate_mcp.policy.closing import Closer
from satgate_mcp.policy.settlement import Outcome
from satgate_mcp.policy.store_time import StoreTime, in_background, resolve
from satgate_mcp.stores.errors import STORE_ERRORS

log = structlog.get_logger("satgate_mcp.policy")

T = TypeVar("T")

@runtime_checkable
class ArrivalLedger(Protocol):
    async def arrival_landed(self, charge_id: str) -> Arrived | None:
        """The arrival made under ``charge_id`` if it landed; None once it certainly never will (voided now)."""
        ...


@runtime_checkable
class ChargeLedger(Protocol):
    async def charge_landed(self, charge_id: str) -> Charge | None:
        """The charge made under ``charge_id`` if it landed; None once it certainly never will (voided now)."""
        ...


class LostCharges:
    """Resolves the charges whose answers were lost, inline (``charged``) or, when the store stays silent, later."""

    def __init__(self, closer: Closer, *, store_timeout: float | None) -> None:
        self._closer = closer
        self._store_timeout = store_timeout

    async def charged(self, admission: Admission, charge: Callable[[], Awaitable[T]],
                      landed: Callable[[str], Awaitable[T | None]] | None,
                      admitted: Callable[[Admission, T], Admission]) -> T:
        """``charge()`` within the call's store time; if its answer is lost, whether it landed: it did, the call
        goes on; it never will, the store fault stands; unknown, it stands and is resolved in the background,
        where a charge found is taken by ``admitted`` (a copy of ``admission``) and settled as not run."""
        try:
            return await admission.store_time.run(charge)
        except STORE_ERRORS as exc:
            if landed is None:
                raise
            lost = exc
        charge_id = admission.charge_id
        try:
            found = await resolve(lambda: landed(charge_id), allowance=self._store_timeout, errors=STORE_ERRORS)
        except STORE_ERRORS:
            late = replace(admission, shared=None)  # its own: the refused one is tidied up meanwhile
            self._closer.spawn(self._resolve_late(late, landed, admitted), charge_id=charge_id)
            raise lost from None
        if found is None:
            log.info("charge_voided", charge_id=charge_id, token_id=admission.identity.token_id)
            raise lost
        log.warning("charge_recovered", charge_id=charge_id, token_id=admission.identity.token_id,
                    error=type(lost).__name__)
        admission.store_time = StoreTime(self._store_timeout)  # its settlement gets an allowance of its own
        return found

    async def _resolve_late(self, admission: Admission, landed: Callable[[str], Awaitable[T | None]],
                            admitted: Callable[[Admission, T], Admission]) -> None:
        fields = {"charge_id": admission.charge_id, "token_id": admission.identity.token_id,
                  "budget_id": admission.identity.budget_key, "tool": admission.tool}
        try:
            found = await in_background(lambda: landed(admission.charge_id), allowance=self._store_timeout,
                                        errors=STORE_ERRORS)
        except asyncio.CancelledError:
            log.error("charge_unresolved", error="shutdown", **fields)
            raise
        except STORE_ERRORS as exc:
            log.error("charge_unresolved", error=type(exc).__name__, **fields)
            return
        if found is None:
            log.info("charge_voided", **fields)
            return
        try:
            settled = admitted(admission, found)
        except GatewayError:  # refused when it landed: it took nothing
            return
        settled.store_time = StoreTime(self._store_timeout)
        await self._closer.close_recorded(settled, Outcome.NOT_RUN)
        log.warning("charge_refunded_late", **fields)
