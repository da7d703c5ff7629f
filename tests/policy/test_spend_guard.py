"""Spend limits in the controls guard, with an injected clock: the window resets at New York's midnight, not
UTC's; the amount is given back only when the call certainly did not run; a re-send is not charged twice; a
parent's and a child's limit on one sum charge it once; observe mode lets through without adding; a store that
cannot answer refuses."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import pytest

from satgate_mcp import jsonrpc
from satgate_mcp.auth.base import Identity
from satgate_mcp.errors import GatewayError, UpstreamTimeout, UpstreamUnavailable
from satgate_mcp.events import RecordingPublisher
from satgate_mcp.guards import Asked, Proceed
from satgate_mcp.jsonrpc import JsonObj
from satgate_mcp.metrics import Metrics
from satgate_mcp.policy.control_guard import ControlsGuard
from satgate_mcp.policy.controls import Controls, parse_controls
from satgate_mcp.policy.holds import Holds
from satgate_mcp.policy.spend import Charge, Reservation
from satgate_mcp.stores.memory_approvals import MemoryApprovalStore
from satgate_mcp.stores.memory_spend import MemorySpendStore

NY_DAY = {"spend_limits": [{"tools": ["pay*"], "field": "amount", "max": "200", "window": "day",
                            "tz": "America/New_York"}]}


def holds() -> Holds:
    return Holds(MemoryApprovalStore(), publisher=RecordingPublisher(), metrics=Metrics(), ttl=900, per_family=20)


def controls(document: object) -> Controls:
    return parse_controls(json.dumps(document))


class Clock:
    def __init__(self, iso: str) -> None:
        self.now = datetime.fromisoformat(iso).timestamp()

    def __call__(self) -> float:
        return self.now

    def set(self, iso: str) -> None:
        self.now = datetime.fromisoformat(iso).timestamp()


def make_guard(clock: Clock, *, enforce: bool = True) -> tuple[ControlsGuard, MemorySpendStore, RecordingPublisher]:
    store, publisher = MemorySpendStore(clock=clock), RecordingPublisher()
    return ControlsGuard(enforce=enforce, publisher=publisher, metrics=Metrics(), spend=store, holds=holds(),
                         clock=clock), store, publisher


def asked(amount: object, *caveats: Controls, request_id: int = 1, tool: str = "pay", session: str = "s1",
          tenant: str | None = None) -> Asked:
    identity = Identity("agent", tenant=tenant, controls=caveats or (controls(NY_DAY),))
    return Asked("tools/call", identity, session, "tool", tool, {"name": tool, "arguments": {"amount": amount}},
                 request_id=request_id)


async def served() -> JsonObj:
    return jsonrpc.result_response(1, {"content": []})


def answering(reply: JsonObj) -> Proceed:
    async def proceed() -> JsonObj:
        return reply
    return proceed


def raising(exc: BaseException) -> Proceed:
    async def proceed() -> JsonObj:
        raise exc
    return proceed


async def outcome(guard: ControlsGuard, call: Asked, proceed: Proceed = served) -> dict[str, Any]:
    """``{"ok": True}``, or the refusal's data."""
    refused: GatewayError | None = None
    try:
        await guard.guard(call, proceed)
    except GatewayError as exc:
        refused = exc
    if refused is None:
        return {"ok": True}
    assert isinstance(refused.data, dict)
    assert refused.code == -32001 or refused.data["error"] == "store_unavailable"
    return dict(refused.data)


async def test_the_day_resets_at_new_yorks_midnight_not_utcs() -> None:
    clock = Clock("2026-03-07T20:00:00-05:00")  # Saturday evening in New York; already Sunday 01:00 in UTC
    guard, _, _ = make_guard(clock)
    assert await outcome(guard, asked(150, request_id=1)) == {"ok": True}
    assert await outcome(guard, asked("50.000000", request_id=2)) == {"ok": True}
    assert await outcome(guard, asked(0.01, request_id=3)) == {
        "error": "spend_limit_exceeded", "tool": "pay", "field": "amount", "window": "day", "limit": "200",
        "remaining": "0", "resets_at": "2026-03-08T00:00:00-05:00"}
    clock.set("2026-03-07T23:59:59-05:00")
    assert (await outcome(guard, asked(1, request_id=4)))["error"] == "spend_limit_exceeded"
    clock.set("2026-03-08T00:00:00-05:00")  # the short (23 h) day begins
    assert await outcome(guard, asked(199, request_id=5)) == {"ok": True}
    refused = await outcome(guard, asked(2, request_id=6))
    assert (refused["remaining"], refused["resets_at"]) == ("1", "2026-03-09T00:00:00-04:00")
    clock.set("2026-03-09T03:59:59+00:00")  # 23:59:59 EDT: still the same day
    assert (await outcome(guard, asked(2, request_id=7)))["error"] == "spend_limit_exceeded"
    clock.set("2026-03-09T04:00:00+00:00")
    assert await outcome(guard, asked(200, request_id=8)) == {"ok": True}


@pytest.mark.parametrize(("proceed", "given_back"), [
    pytest.param(answering(jsonrpc.error_response(1, jsonrpc.INVALID_PARAMS, "bad")), True, id="upstream-32602"),
    pytest.param(answering(jsonrpc.error_response(1, jsonrpc.PARSE_ERROR, "bad")), True, id="upstream-32700"),
    pytest.param(answering(jsonrpc.error_response(1, jsonrpc.METHOD_NOT_FOUND, "no")), True, id="upstream-32601"),
    pytest.param(raising(UpstreamUnavailable("down", sent=False)), True, id="never-sent"),
    pytest.param(raising(GatewayError("slow down", {"error": "rate_limited"}, code=jsonrpc.RATE_LIMITED)), True,
                 id="rate-limited-before-sending"),
    pytest.param(raising(GatewayError("broke", {"error": "budget_exhausted"}, code=-32002)), True,
                 id="budget-refused-before-sending"),
    pytest.param(answering(jsonrpc.error_response(1, jsonrpc.INTERNAL_ERROR, "boom")), False, id="upstream-32603"),
    pytest.param(answering(jsonrpc.result_response(1, {"isError": True, "content": []})), False, id="tool-error"),
    pytest.param(raising(UpstreamUnavailable("reset", sent=True)), False, id="lost-after-sending"),
    pytest.param(raising(UpstreamTimeout("late")), False, id="timeout"),
    pytest.param(raising(asyncio.CancelledError()), False, id="cancelled"),
    pytest.param(served, False, id="ran"),
])
async def test_the_amount_comes_back_only_when_the_call_certainly_did_not_run(proceed: Proceed,
                                                                              given_back: bool) -> None:
    clock = Clock("2026-06-10T12:00:00-04:00")
    guard, _, _ = make_guard(clock)
    with contextlib.suppress(BaseException):  # what the call raised reaches its caller; here only the sum matters
        await guard.guard(asked(150, request_id=1), proceed)
    expected = {"ok": True} if given_back else {"error": "spend_limit_exceeded"}
    got = await outcome(guard, asked(100, request_id=2))
    assert {k: v for k, v in got.items() if k in expected} == expected


async def test_a_re_send_while_the_first_copy_is_unsettled_is_not_charged_twice() -> None:
    clock = Clock("2026-06-10T12:00:00-04:00")
    guard, _, _ = make_guard(clock)
    release = asyncio.Event()

    async def slow() -> JsonObj:
        await release.wait()
        return await served()

    first = asyncio.create_task(guard.guard(asked(150, request_id=7), slow))
    await asyncio.sleep(0)
    second = asyncio.create_task(guard.guard(asked(150, request_id=7), slow))  # the same call, sent again
    await asyncio.sleep(0)
    release.set()
    await asyncio.gather(first, second)
    assert await outcome(guard, asked(50, request_id=8)) == {"ok": True}  # 150 + 50: the copy cost nothing
    assert (await outcome(guard, asked(150, request_id=7)))["error"] == "spend_limit_exceeded"  # settled: new call
    # Another session's call with the same id is another call.
    assert (await outcome(guard, asked(1, request_id=8, session="s2")))["error"] == "spend_limit_exceeded"


async def test_a_parent_and_a_childs_limit_on_one_sum_charge_it_once() -> None:
    clock = Clock("2026-06-10T12:00:00-04:00")
    guard, _, _ = make_guard(clock)
    wider = controls({"spend_limits": [{**NY_DAY["spend_limits"][0], "max": "1000000"}]})
    tighter = controls({"spend_limits": [{**NY_DAY["spend_limits"][0], "max": "120"}]})
    assert await outcome(guard, asked(100, controls(NY_DAY), wider, request_id=1)) == {"ok": True}
    assert await outcome(guard, asked(100, controls(NY_DAY), request_id=2)) == {"ok": True}  # 200: once, not twice
    child = await outcome(guard, asked(1, controls(NY_DAY), wider, request_id=3))
    assert (child["limit"], child["remaining"]) == ("200", "0")  # the child's wider limit widened nothing
    assert (await outcome(guard, asked(1, controls(NY_DAY), tighter, request_id=4)))["limit"] == "120"


@pytest.mark.parametrize("amount", [
    pytest.param(None, id="null"), pytest.param("ten", id="text"), pytest.param(-5, id="negative"),
    pytest.param(True, id="boolean"), pytest.param("1e3", id="exponent"), pytest.param([10], id="list"),
])
async def test_an_amount_that_is_not_one_is_refused_not_counted_as_zero(amount: object) -> None:
    guard, _, _ = make_guard(Clock("2026-06-10T12:00:00-04:00"))
    assert await outcome(guard, asked(amount)) == {"error": "argument_denied", "tool": "pay", "field": "amount",
                                                   "allowed": "a number from 0"}
    missing = Asked("tools/call", Identity("agent", controls=(controls(NY_DAY),)), "s1", "tool", "pay",
                    {"name": "pay", "arguments": {}}, request_id=9)
    assert (await outcome(guard, missing))["error"] == "argument_denied"


async def test_observe_lets_an_over_limit_call_through_without_adding_it() -> None:
    clock = Clock("2026-06-10T12:00:00-04:00")
    guard, _, publisher = make_guard(clock, enforce=False)
    assert await outcome(guard, asked(150, request_id=1)) == {"ok": True}
    assert await outcome(guard, asked(150, request_id=2)) == {"ok": True}  # would be refused: observed
    [breach] = publisher.named("control_breach")
    assert (breach["error"], breach["enforced"]) == ("spend_limit_exceeded", False)
    enforcing, _, _ = make_guard(clock)
    enforcing._spend = guard._spend  # the same sums, now enforced: only the first 150 was added
    assert await outcome(enforcing, asked(50, request_id=3)) == {"ok": True}


class BrokenStore(MemorySpendStore):
    async def reserve(self, key: str, charges: Sequence[Charge], now: float) -> Reservation:
        raise ConnectionError("redis went away")


async def test_a_store_that_cannot_answer_refuses_the_call() -> None:
    clock = Clock("2026-06-10T12:00:00-04:00")
    guard = ControlsGuard(enforce=True, publisher=RecordingPublisher(), metrics=Metrics(), spend=BrokenStore(),
                          holds=holds(),                          clock=clock)
    ran: list[bool] = []

    async def proceed() -> JsonObj:
        ran.append(True)
        return await served()

    assert await outcome(guard, asked(1), proceed) == {"error": "store_unavailable", "retry_after_seconds": 1}
    assert ran == []


def test_the_clock_is_utc_seconds() -> None:
    assert Clock("2026-03-08T00:00:00-05:00")() == datetime(2026, 3, 8, 5, tzinfo=UTC).timestamp()


async def test_observing_refuses_nothing_even_when_the_store_cannot_answer() -> None:
    guard = ControlsGuard(enforce=False, publisher=RecordingPublisher(), metrics=Metrics(), spend=BrokenStore(),
                          holds=holds(),                          clock=Clock("2026-06-10T12:00:00-04:00"))
    assert await outcome(guard, asked(1)) == {"ok": True}
