"""How an admitted call settles, decided from how it was admitted and what happened: no I/O here.

``CallPolicy`` carries the decision out: it moves the duplicate record (atomically, in the store),
lets go of the execution identical copies share, and refunds when the decision (or, for a copy
that owns a record, the record's answer) says so. What is refundable is refunds.py's rule; who
pays when copies race is duplicates.py's transitions; this module only says which applies.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from satgate_mcp.jsonrpc import JsonObj
from satgate_mcp.policy.duplicates import FIRST_SETTLED, REFUSED, REPLAY_SETTLED, Arrival, Settlement, Table
from satgate_mcp.policy.refunds import failure_kind, refundable


class Role(StrEnum):
    """How ``admit`` let a request through: all that settling it depends on."""

    #: Not a ``tools/call``: nothing charged, nothing to settle.
    UNMETERED = "unmetered"
    #: No session id (stateless): charged, and no duplicate guard.
    UNGUARDED = "unguarded"
    #: Joins an identical copy in flight in this process: free, and the copy it joins settles.
    JOINED = "joined"
    #: Leads a call in flight here before its durable record has answered (seen only if that fails).
    LEADING = "leading"
    #: Leads, charged, and recorded as running.
    FIRST = "first"
    #: Leads the one free re-send of a copy whose record says it never settled.
    REPLAY = "replay"
    #: Leads a charged copy while a re-send runs elsewhere, leaving that record alone.
    AGAIN = "again"
    #: Settled already: settling again does nothing.
    SETTLED = "settled"


#: The role of a leading copy once its record says how it arrived.
ROLE_ON_ARRIVAL = {Arrival.FIRST: Role.FIRST, Arrival.REPLAY: Role.REPLAY, Arrival.AGAIN: Role.AGAIN}


class Outcome(StrEnum):
    """What happened to an admitted call."""

    #: The upstream ran it, or may have.
    RAN = "ran"
    #: The upstream certainly never ran it (refunds.py).
    NOT_RUN = "not_run"
    #: The leading copy was refused (or cancelled) while being admitted.
    REFUSED = "refused"


class Refund(StrEnum):
    NO = "no"
    YES = "yes"
    #: As the record's transition answers: only the record knows whether another copy used the charge.
    AS_RECORD_SAYS = "as_record_says"


@dataclass(frozen=True, slots=True)
class Closing:
    """What settling does, in the order the engine carries it out."""

    #: The duplicate-record transition to apply (None: this copy owns no record).
    record: Table | None = None
    #: Let go of the execution this copy leads: a copy arriving later is a new call, and copies
    #: waiting on one that never started get a cancellation.
    release: bool = False
    refund: Refund = Refund.NO

    def answer_matters(self, stake: float) -> bool:
        """Whether the refund waits for the record transition's answer: only when there is a stake to
        give back and the transition can say REFUND. Otherwise the record may be written behind."""
        return (self.refund is Refund.AS_RECORD_SAYS and stake > 0 and self.record is not None
                and any(out == Settlement.REFUND for _, out in self.record.values()))

    def refunds(self, record_says: str | None) -> bool:
        """Whether the stake goes back, given the record transition's answer (None if none applied)."""
        if self.refund is Refund.AS_RECORD_SAYS:
            return record_says == Settlement.REFUND
        return self.refund is Refund.YES


_NOTHING = Closing()


def closing(role: Role, outcome: Outcome) -> Closing:
    """The settlement of a call admitted as ``role`` that ended as ``outcome``."""
    if role in (Role.UNMETERED, Role.JOINED, Role.SETTLED):
        return _NOTHING
    if role is Role.UNGUARDED:
        return Closing(refund=Refund.YES if outcome is Outcome.NOT_RUN else Refund.NO)
    if role is Role.LEADING:
        return Closing(release=True)
    if role is Role.AGAIN:
        return Closing(release=True, refund=Refund.YES if outcome is Outcome.NOT_RUN else Refund.NO)
    if outcome is Outcome.REFUSED:
        # Nothing ran and nothing is owed: undo this copy's part of the record, refund nothing.
        return Closing(REFUSED if role is Role.FIRST else REPLAY_SETTLED[False], release=True)
    ran = outcome is Outcome.RAN
    # A re-send's refund gives back the first copy's charge, which it handed over to pay for this one.
    record = FIRST_SETTLED[ran] if role is Role.FIRST else REPLAY_SETTLED[ran]
    return Closing(record, release=True, refund=Refund.AS_RECORD_SAYS)


def outcome_of(reply: JsonObj | None, failure: BaseException | None) -> Outcome:
    """How a forwarded call ended, by refunds.py's rule."""
    return Outcome.NOT_RUN if refundable(failure_kind(reply, failure)) else Outcome.RAN
