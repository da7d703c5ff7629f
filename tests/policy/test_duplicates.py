"""The duplicate guard's durable half: in-flight records and the transitions that decide who pays."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from satgate_mcp.policy.duplicates import (
    ARRIVAL,
    FIRST_SETTLED,
    REFUSED,
    REPLAY_SETTLED,
    Arrival,
    Record,
    Settlement,
    State,
    duplicate_key,
    on_arrival,
    on_first_settled,
    on_replay_settled,
)
from satgate_mcp.stores.memory import MemoryDuplicateStore
from tests.fakes import FakeClock

Call = tuple[str, str, int | str, dict[str, Any] | None]  # token id, session id, request id, params


@pytest.mark.parametrize(
    ("a", "b", "same"),
    [
        pytest.param(("t", "s", 1, {"name": "x", "arguments": {"q": 1, "r": 2}}),
                     ("t", "s", 1, {"arguments": {"r": 2, "q": 1}, "name": "x"}), True, id="key-order-irrelevant"),
        pytest.param(("t", "s", 1, {"name": "x", "_meta": {"progressToken": 1}}),
                     ("t", "s", 1, {"name": "x", "_meta": {"progressToken": 2}}), True, id="meta-ignored"),
        pytest.param(("t", "s", 1, None), ("t", "s", 1, {}), True, id="no-params-is-empty-params"),
        pytest.param(("t", "s", 1, {"name": "x"}), ("t", "s", "1", {"name": "x"}), False, id="id-type-matters"),
        pytest.param(("t", "s", 1, {"name": "x"}), ("t", "z", 1, {"name": "x"}), False, id="session-matters"),
        pytest.param(("t", "s", 1, {"name": "x"}), ("t", "s", 1, {"name": "y"}), False, id="params-matter"),
        pytest.param(("t", "s", 1, {"name": "x"}), ("u", "s", 1, {"name": "x"}), False, id="token-matters"),
    ],
)
def test_duplicate_key(a: Call, b: Call, same: bool) -> None:
    assert (duplicate_key(*a) == duplicate_key(*b)) is same


@given(params=st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4), max_leaves=12),
    request_id=st.integers() | st.text())
def test_the_key_is_the_one_every_version_computes(params: Any, request_id: int | str) -> None:
    """Processes of an older version (a handover) must find the same record: the key's bytes never change."""
    body = {"arguments": params}
    blob = json.dumps(["t", "s", request_id, body], sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      default=str)
    assert duplicate_key("t", "s", request_id, body) == hashlib.sha256(blob.encode("utf-8")).hexdigest()


@pytest.mark.parametrize(("record", "after", "arrival"), [
    pytest.param(None, Record.RUNNING, Arrival.FIRST, id="nothing-in-flight-first-copy-pays"),
    pytest.param(Record.RUNNING, Record.REPLAYING, Arrival.REPLAY, id="never-settled-one-re-send-free"),
    pytest.param(Record.REPLAYING, Record.REPLAYING, Arrival.AGAIN, id="second-re-send-pays"),
    pytest.param(Record.HANDED, Record.HANDED, Arrival.AGAIN, id="re-send-after-handover-pays"),
    pytest.param(Record.REPLAY_RAN, Record.REPLAY_RAN, Arrival.AGAIN, id="re-send-after-replay-ran-pays"),
])
def test_arrival(record: State, after: State, arrival: Arrival) -> None:
    assert on_arrival(record) == (after, arrival)


@pytest.mark.parametrize(("record", "ran", "after", "settlement"), [
    pytest.param(Record.RUNNING, True, None, Settlement.KEEP, id="ran-keeps-its-charge"),
    pytest.param(Record.RUNNING, False, None, Settlement.REFUND, id="never-ran-refunded"),
    pytest.param(Record.REPLAYING, True, None, Settlement.KEEP, id="ran-while-re-send-runs"),
    pytest.param(Record.REPLAYING, False, Record.HANDED, Settlement.KEEP, id="never-ran-pays-for-the-re-send"),
    pytest.param(Record.REPLAY_RAN, False, None, Settlement.KEEP, id="re-send-ran-on-this-charge"),
    pytest.param(Record.REPLAY_RAN, True, None, Settlement.KEEP, id="both-ran-one-charge"),
    pytest.param(None, False, None, Settlement.REFUND, id="record-expired-never-ran"),
])
def test_first_copy_settles(record: State, ran: bool, after: State, settlement: Settlement) -> None:
    assert on_first_settled(record, ran=ran) == (after, settlement)


@pytest.mark.parametrize(("record", "ran", "after", "settlement"), [
    pytest.param(Record.REPLAYING, True, Record.REPLAY_RAN, Settlement.KEEP, id="ran-first-copy-pays"),
    pytest.param(Record.REPLAYING, False, Record.RUNNING, Settlement.KEEP, id="never-ran-as-if-never-sent"),
    pytest.param(Record.HANDED, True, None, Settlement.KEEP, id="ran-on-the-handed-charge"),
    pytest.param(Record.HANDED, False, None, Settlement.REFUND, id="neither-ran-handed-charge-refunded"),
    pytest.param(None, True, None, Settlement.KEEP, id="record-gone"),
])
def test_re_send_settles(record: State, ran: bool, after: State, settlement: Settlement) -> None:
    assert on_replay_settled(record, ran=ran) == (after, settlement)


@pytest.mark.parametrize(("first_ran", "re_send_ran", "settle_first_first", "charges_kept"), [
    pytest.param(True, True, True, 1, id="both-ran-first-settles-first"),
    pytest.param(True, True, False, 1, id="both-ran-re-send-settles-first"),
    pytest.param(False, True, True, 1, id="only-re-send-ran-first-settles-first"),
    pytest.param(False, True, False, 1, id="only-re-send-ran-re-send-settles-first"),
    pytest.param(True, False, True, 1, id="only-first-ran"),
    pytest.param(False, False, True, 0, id="neither-ran-first-settles-first"),
    pytest.param(False, False, False, 0, id="neither-ran-re-send-settles-first"),
])
async def test_a_call_that_ran_is_paid_exactly_once_whichever_copy_settles_first(
        first_ran: bool, re_send_ran: bool, settle_first_first: bool, charges_kept: int) -> None:
    store = MemoryDuplicateStore()
    assert Arrival(await store.apply("k", ARRIVAL)) is Arrival.FIRST
    assert Arrival(await store.apply("k", ARRIVAL)) is Arrival.REPLAY  # first copy's process died
    steps = [(FIRST_SETTLED[first_ran], "first"), (REPLAY_SETTLED[re_send_ran], "re-send")]
    refunds = 0
    for table, _who in (steps if settle_first_first else steps[::-1]):
        refunds += Settlement(await store.apply("k", table)) is Settlement.REFUND
    assert 1 - refunds == charges_kept
    assert store.get("k") is None


async def test_a_refused_first_copy_leaves_no_record() -> None:
    store = MemoryDuplicateStore()
    await store.apply("k", ARRIVAL)
    await store.apply("k", REFUSED)
    assert store.get("k") is None


async def test_records_live_for_the_ttl() -> None:
    clock = FakeClock()
    store = MemoryDuplicateStore(ttl=24 * 3600, clock=clock)
    await store.apply("k", ARRIVAL)
    clock.advance(24 * 3600 - 1)
    assert store.get("k") is Record.RUNNING
    clock.advance(1)
    assert store.get("k") is None


async def test_records_are_bounded() -> None:
    store = MemoryDuplicateStore(ttl=10, cap=3)
    for key in "abcd":
        await store.apply(key, ARRIVAL)
    assert len(store) == 3
    assert store.get("a") is None  # the oldest gave way to the cap
