"""Settling an admitted call: the pure decision from (how it was admitted, what happened)."""

from __future__ import annotations

import pytest

from satgate_mcp.errors import UpstreamTimeout, UpstreamUnavailable
from satgate_mcp.jsonrpc import JsonObj
from satgate_mcp.policy.duplicates import FIRST_SETTLED, REFUSED, REPLAY_SETTLED, Record, State, Table
from satgate_mcp.policy.settlement import Closing, Outcome, Refund, Role, closing, outcome_of

#: Roles that own nothing to settle, whatever happened.
_NOTHING_TO_SETTLE = [
    pytest.param(role, outcome, None, False, Refund.NO, id=f"{role}-{outcome}-nothing")
    for role in (Role.UNMETERED, Role.JOINED, Role.SETTLED) for outcome in Outcome
]


@pytest.mark.parametrize(("role", "outcome", "record", "release", "refund"), [
    *_NOTHING_TO_SETTLE,
    pytest.param(Role.UNGUARDED, Outcome.RAN, None, False, Refund.NO, id="stateless-ran-keeps-its-charge"),
    pytest.param(Role.UNGUARDED, Outcome.NOT_RUN, None, False, Refund.YES, id="stateless-never-ran-refunded"),
    pytest.param(Role.UNGUARDED, Outcome.REFUSED, None, False, Refund.NO, id="stateless-refused-owes-nothing"),
    pytest.param(Role.LEADING, Outcome.REFUSED, None, True, Refund.NO, id="record-never-answered-owns-none"),
    pytest.param(Role.AGAIN, Outcome.RAN, None, True, Refund.NO, id="again-ran-keeps-record-untouched"),
    pytest.param(Role.AGAIN, Outcome.NOT_RUN, None, True, Refund.YES, id="again-never-ran-refunded-record-untouched"),
    pytest.param(Role.AGAIN, Outcome.REFUSED, None, True, Refund.NO, id="again-refused-owes-nothing"),
    pytest.param(Role.FIRST, Outcome.RAN, FIRST_SETTLED[True], True, Refund.AS_RECORD_SAYS, id="first-ran"),
    pytest.param(Role.FIRST, Outcome.NOT_RUN, FIRST_SETTLED[False], True, Refund.AS_RECORD_SAYS,
                 id="first-never-ran-record-decides-who-pays"),
    pytest.param(Role.FIRST, Outcome.REFUSED, REFUSED, True, Refund.NO, id="first-refused-forgets-its-record"),
    pytest.param(Role.REPLAY, Outcome.RAN, REPLAY_SETTLED[True], True, Refund.AS_RECORD_SAYS, id="re-send-ran"),
    pytest.param(Role.REPLAY, Outcome.NOT_RUN, REPLAY_SETTLED[False], True, Refund.AS_RECORD_SAYS,
                 id="re-send-never-ran-record-decides-who-pays"),
    pytest.param(Role.REPLAY, Outcome.REFUSED, REPLAY_SETTLED[False], True, Refund.NO,
                 id="re-send-refused-as-if-never-sent"),
])
def test_closing(role: Role, outcome: Outcome, record: Table | None, release: bool, refund: Refund) -> None:
    assert closing(role, outcome) == Closing(record, release=release, refund=refund)


@pytest.mark.parametrize(("plan", "record_says", "refunded"), [
    pytest.param(Closing(refund=Refund.YES), None, True, id="yes"),
    pytest.param(Closing(refund=Refund.NO), None, False, id="no"),
    pytest.param(Closing(FIRST_SETTLED[False], refund=Refund.AS_RECORD_SAYS), "refund", True,
                 id="record-says-refund"),
    pytest.param(Closing(FIRST_SETTLED[False], refund=Refund.AS_RECORD_SAYS), "keep", False, id="record-says-keep"),
    pytest.param(Closing(REPLAY_SETTLED[False], refund=Refund.NO), "refund", False, id="no-whatever-the-record-says"),
])
def test_refunds(plan: Closing, record_says: str | None, refunded: bool) -> None:
    assert plan.refunds(record_says) is refunded


@pytest.mark.parametrize(("role", "outcome", "stake", "waits"), [
    pytest.param(Role.FIRST, Outcome.RAN, 1.0, False, id="first-ran-keeps-whatever-the-record-says"),
    pytest.param(Role.REPLAY, Outcome.RAN, 1.0, False, id="re-send-ran-keeps-whatever-the-record-says"),
    pytest.param(Role.FIRST, Outcome.NOT_RUN, 1.0, True, id="first-never-ran-the-record-decides"),
    pytest.param(Role.REPLAY, Outcome.NOT_RUN, 1.0, True, id="re-send-never-ran-the-record-decides"),
    pytest.param(Role.FIRST, Outcome.NOT_RUN, 0.0, False, id="nothing-staked-nothing-to-decide"),
    pytest.param(Role.FIRST, Outcome.REFUSED, 1.0, False, id="refused-refunds-nothing"),
    pytest.param(Role.AGAIN, Outcome.NOT_RUN, 1.0, False, id="no-record-to-wait-for"),
])
def test_the_refund_waits_for_the_record_only_when_its_answer_can_change_it(
        role: Role, outcome: Outcome, stake: float, waits: bool) -> None:
    plan = closing(role, outcome)
    assert plan.answer_matters(stake) is waits
    if not waits and stake:  # whatever the transition can answer, the refund is the one given without it
        answers = {says for _, says in plan.record.values()} if plan.record is not None else set()
        assert {plan.refunds(says) for says in answers} <= {plan.refunds(None)}


def settled(role: Role, outcome: Outcome, record: State) -> tuple[State, bool]:
    """The decision composed with the record transition a store applies: (record after, refunded)."""
    plan = closing(role, outcome)
    if plan.record is None:
        return record, plan.refunds(None)
    after, says = plan.record[record]
    return after, plan.refunds(says)


@pytest.mark.parametrize(("role", "outcome", "record", "after", "refunded"), [
    pytest.param(Role.FIRST, Outcome.RAN, Record.RUNNING, None, False, id="ran-pays"),
    pytest.param(Role.FIRST, Outcome.NOT_RUN, Record.RUNNING, None, True, id="never-ran-refunded"),
    pytest.param(Role.FIRST, Outcome.NOT_RUN, Record.REPLAYING, Record.HANDED, False,
                 id="never-ran-pays-for-the-re-send-running"),
    pytest.param(Role.FIRST, Outcome.NOT_RUN, Record.REPLAY_RAN, None, False, id="the-re-send-ran-on-this-charge"),
    pytest.param(Role.FIRST, Outcome.REFUSED, Record.RUNNING, None, False, id="refused-leaves-no-record"),
    pytest.param(Role.REPLAY, Outcome.RAN, Record.REPLAYING, Record.REPLAY_RAN, False,
                 id="re-send-ran-first-copy-pays"),
    pytest.param(Role.REPLAY, Outcome.NOT_RUN, Record.HANDED, None, True, id="neither-ran-handed-charge-back"),
    pytest.param(Role.REPLAY, Outcome.RAN, Record.HANDED, None, False, id="re-send-ran-on-the-handed-charge"),
    pytest.param(Role.REPLAY, Outcome.REFUSED, Record.REPLAYING, Record.RUNNING, False,
                 id="re-send-refused-first-copy-still-open"),
    pytest.param(Role.AGAIN, Outcome.NOT_RUN, Record.REPLAYING, Record.REPLAYING, True,
                 id="again-refunded-leaves-the-re-sends-record"),
])
def test_a_call_is_paid_once_if_it_ran_and_never_if_not(
        role: Role, outcome: Outcome, record: State, after: State, refunded: bool) -> None:
    assert settled(role, outcome, record) == (after, refunded)


@pytest.mark.parametrize(("reply", "exc", "outcome"), [
    pytest.param({"result": {}}, None, Outcome.RAN, id="answered"),
    pytest.param({"error": {"code": -32602, "message": "no"}}, None, Outcome.NOT_RUN, id="invalid-params"),
    pytest.param(None, UpstreamUnavailable("down", sent=False), Outcome.NOT_RUN, id="never-sent"),
    pytest.param(None, UpstreamUnavailable("reset"), Outcome.RAN, id="lost-after-sending-may-have-run"),
    pytest.param(None, UpstreamTimeout("slow"), Outcome.RAN, id="timeout-may-have-run"),
])
def test_outcome_of(reply: JsonObj | None, exc: BaseException | None, outcome: Outcome) -> None:
    assert outcome_of(reply, exc) is outcome
