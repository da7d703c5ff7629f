"""A guarded call's arrival and charge as one store operation, where the store can make them one.

The engine's general path asks the duplicate store how a copy arrives, then the budget store for
the charge (or, for the free re-send, what remains), then takes the record back if the charge is
refused: two or three round trips. A store holding both in one database (the state folder's
SQLite) does the same steps in one transaction: one trip, and a refused call's record never
exists outside it. The steps and their order are the same; only where they run differs.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from satgate_mcp.auth.base import Identity
from satgate_mcp.policy.budget import Charge
from satgate_mcp.policy.duplicates import Arrival, Table
from satgate_mcp.policy.limits import Bucket
from satgate_mcp.policy.settlement import ROLE_ON_ARRIVAL, Outcome, Role, closing
from satgate_mcp.policy.shared_calls import SharedCall
from satgate_mcp.policy.store_time import StoreTime


@dataclass(frozen=True, slots=True)
class ChargeAsk:
    """What the charge of an arriving copy would take, and from which budget."""

    budget_key: str
    cost: float
    limit: float | None
    enforce: bool
    #: Names this charge in the store's ledger, so a charge whose answer was lost can be found or voided.
    charge_id: str = ""
    #: Rate buckets to take one token from first, in the same operation (only where ``Admissions.takes_rate``):
    #: a bucket that is empty refuses the call before it arrives, and ``Arrived.rate_wait`` says for how long.
    buckets: tuple[Bucket, ...] = ()


@dataclass(frozen=True, slots=True)
class Arrived:
    """How a copy arrived and what it paid: ``charge`` for a charged copy (refused: its record is
    already taken back), None for the free re-send, which gets ``remaining`` instead."""

    arrival: Arrival
    charge: Charge | None
    remaining: float | None
    #: Over zero: the rate limit refused the call first (seconds to wait); it neither arrived nor paid.
    rate_wait: float = 0.0


def refused_record(arrival: Arrival) -> Table | None:
    """The record transition that undoes a copy's arrival when its charge is refused (None: nothing to undo)."""
    return closing(ROLE_ON_ARRIVAL[arrival], Outcome.REFUSED).record


class Admissions(Protocol):
    async def arrive(self, key: str, ask: ChargeAsk) -> Arrived:
        """Atomically: the ``ARRIVAL`` transition of ``key``'s record, then the charge it calls for (or, for
        the free re-send, what remains), and the record taken back when the charge is refused."""
        ...


@runtime_checkable
class RateTaking(Protocol):
    """``Admissions`` that also take ``ChargeAsk.buckets`` in the arrival's one operation (Redis: one script, so a
    metered call's rate check, record and charge are one round trip instead of two)."""

    takes_rate: bool



#: Roles that took their stake from the budget at admission.
_CHARGED = frozenset({Role.UNGUARDED, Role.FIRST, Role.AGAIN})


@dataclass(slots=True, eq=False)
class Admission:
    """What ``admit`` let through; hand it to ``run`` (or ``settle``) exactly once."""

    identity: Identity
    tool: str | None
    role: Role
    #: What a refund gives back: the cost, when the budget is limited (0 otherwise). A re-send's
    #: is the first copy's charge, which it handed over to pay for this one.
    stake: float = 0.0
    #: Credits left as this admission last saw them (None: unlimited), for the spend events.
    remaining: float | None = None
    duplicate_key: str | None = None
    #: The execution identical copies share; None when the guard is off.
    shared: SharedCall | None = None
    #: What is left of the call's store time; settlement spends from the same allowance as admission.
    store_time: StoreTime = field(default_factory=lambda: StoreTime(None))
    #: Names its charge in the store's ledger, and its refund (policy/ledger.py): unique to this admission.
    charge_id: str = field(default_factory=lambda: secrets.token_hex(16))

    @property
    def duplicate(self) -> bool:
        """Admitted free: it joins a copy in flight here, or is the one re-send of a copy that never settled."""
        return self.role in (Role.JOINED, Role.REPLAY)

    @property
    def charged(self) -> float:
        """Credits this open admission took from a limited budget (0 for copies and free passes)."""
        return self.stake if self.role in _CHARGED else 0.0
