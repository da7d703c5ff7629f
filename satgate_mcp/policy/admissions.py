"""A guarded call's arrival and charge as one store operation, where the store can make them one.

The engine's general path asks the duplicate store how a copy arrives, then the budget store for
the charge (or, for the free re-send, what remains), then takes the record back if the charge is
refused: two or three round trips. A store holding both in one database (the state folder's
SQLite) does the same steps in one transaction: one trip, and a refused call's record never
exists outside it. The steps and their order are the same; only where they run differs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from satgate_mcp.policy.budget import Charge
from satgate_mcp.policy.duplicates import Arrival, Table
from satgate_mcp.policy.settlement import ROLE_ON_ARRIVAL, Outcome, closing


@dataclass(frozen=True, slots=True)
class ChargeAsk:
    """What the charge of an arriving copy would take, and from which budget."""

    budget_key: str
    cost: float
    limit: float | None
    enforce: bool


@dataclass(frozen=True, slots=True)
class Arrived:
    """How a copy arrived and what it paid: ``charge`` for a charged copy (refused: its record is
    already taken back), None for the free re-send, which gets ``remaining`` instead."""

    arrival: Arrival
    charge: Charge | None
    remaining: float | None


def refused_record(arrival: Arrival) -> Table | None:
    """The record transition that undoes a copy's arrival when its charge is refused (None: nothing to undo)."""
    return closing(ROLE_ON_ARRIVAL[arrival], Outcome.REFUSED).record


class Admissions(Protocol):
    async def arrive(self, key: str, ask: ChargeAsk) -> Arrived:
        """Atomically: the ``ARRIVAL`` transition of ``key``'s record, then the charge it calls for (or, for
        the free re-send, what remains), and the record taken back when the charge is refused."""
        ...
