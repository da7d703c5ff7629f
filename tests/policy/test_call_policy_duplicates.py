"""Identical copies of a call through the policy: in flight here they share one execution (shared_calls.py);
across processes the durable record decides who pays (duplicates.py), and a call that ran is paid once."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from satgate_mcp.auth.base import Identity
from satgate_mcp.errors import GatewayError
from satgate_mcp.jsonrpc import JsonObj
from satgate_mcp.policy.engine import CallPolicy
from satgate_mcp.stores import LocalState
from tests.fakes import FakeClock, until
from tests.policy import helpers
from tests.policy.helpers import (
    ALICE,
    WALL,
    admit_tool,
    call,
    make_policy,
    refusal,
    sharing_stores,
)


class CountingUpstream:
    """An upstream call that counts its runs and blocks until released."""

    def __init__(self) -> None:
        self.runs = 0
        self.started = asyncio.Event()
        self.release = asyncio.Event()
        self.cancelled = asyncio.Event()

    async def __call__(self) -> JsonObj:
        self.runs += 1
        self.started.set()
        try:
            await self.release.wait()
        except asyncio.CancelledError:
            self.cancelled.set()
            raise
        return {"jsonrpc": "2.0", "id": None, "result": {"content": [], "run": self.runs}}


@pytest.fixture(params=["memory", "state-folder"], autouse=True)
async def stores(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                 ) -> AsyncIterator[str]:
    """Every rule twice: on memory stores (the general path, a step per store) and on a state folder, where
    arrival and charge are one job and a settled record is written behind."""
    opened: list[LocalState] = []
    if request.param == "state-folder":
        def on_state_folder(clock: FakeClock | None = None, **overrides: Any) -> Any:
            clock = clock or FakeClock(WALL)
            if not opened:  # the folder's records expire on its wall clock: the test's clock drives it
                opened.append(LocalState.open(tmp_path / "state", clock=clock))
            return helpers.make_policy(clock, state=opened[0], **overrides)

        monkeypatch.setattr(sys.modules[__name__], "make_policy", on_state_folder)
    yield str(request.param)
    for local in opened:
        await local.aclose()


async def call_once(policy: CallPolicy, upstream: CountingUpstream, identity: Identity = ALICE,
                    params: JsonObj | None = None, session: str = "s1") -> JsonObj:
    return await policy.run(await admit_tool(policy, identity, session=session, params=params), upstream)


async def test_attack_identical_copies_in_flight_run_once_and_pay_once() -> None:
    policy, *_ = make_policy()
    upstream = CountingUpstream()
    copies = [asyncio.create_task(call_once(policy, upstream, params=call("echo", text="hi"))) for _ in range(20)]
    await asyncio.wait_for(upstream.started.wait(), 5)
    upstream.release.set()
    answers = await asyncio.wait_for(asyncio.gather(*copies), 5)
    assert upstream.runs == 1
    assert all(a["result"]["run"] == 1 for a in answers)
    assert (await policy.budget_status(ALICE))["remaining"] == 9


async def test_attack_a_re_send_after_settlement_is_a_new_call_and_is_refused_when_exhausted() -> None:
    policy, *_ = make_policy()
    poor = Identity("poor", budget_limit=1)
    upstream = CountingUpstream()
    upstream.release.set()
    await call_once(policy, upstream, poor)
    err = await refusal(admit_tool(policy, poor))
    assert err.data["error"] == "budget_exhausted"  # type: ignore[index]
    assert upstream.runs == 1


async def test_attack_only_one_free_re_send_of_a_call_whose_process_died() -> None:
    first, *_ = make_policy()
    await admit_tool(first, params=call("echo", text="hi"))  # charged; then its process dies in flight
    upstream = CountingUpstream()
    upstream.release.set()
    restarted = sharing_stores(first)
    await call_once(restarted, upstream, params=call("echo", text="hi"))  # the one free re-send
    assert (await restarted.budget_status(ALICE))["remaining"] == 9
    again = sharing_stores(first)  # and once more, in yet another process
    await call_once(again, upstream, params=call("echo", text="hi"))
    assert (await again.budget_status(ALICE))["remaining"] == 8
    assert upstream.runs == 2


async def test_copies_share_the_first_copys_refusal() -> None:
    policy, *_ = make_policy()
    poor = Identity("poor", budget_limit=0.5)
    upstream = CountingUpstream()
    results = await asyncio.gather(*(call_once(policy, upstream, poor) for _ in range(5)), return_exceptions=True)
    assert all(isinstance(r, GatewayError) and r.data and r.data["error"] == "budget_exhausted" for r in results)
    assert upstream.runs == 0


async def test_cancelling_one_copy_leaves_the_shared_call_running_for_the_others() -> None:
    policy, *_ = make_policy()
    upstream = CountingUpstream()
    leader = asyncio.create_task(call_once(policy, upstream))
    await asyncio.wait_for(upstream.started.wait(), 5)
    follower = asyncio.create_task(call_once(policy, upstream))
    [shared] = policy._in_flight
    await until(lambda: shared.waiters == 2)  # the follower is admitted and joins
    leader.cancel()
    with pytest.raises(asyncio.CancelledError):
        await leader
    upstream.release.set()
    assert (await asyncio.wait_for(follower, 5))["result"]["run"] == 1
    assert not upstream.cancelled.is_set()
    assert upstream.runs == 1


async def test_when_every_copy_goes_away_the_call_is_cancelled_and_stays_charged() -> None:
    policy, *_ = make_policy()
    upstream = CountingUpstream()
    copies = [asyncio.create_task(call_once(policy, upstream)) for _ in range(3)]
    await asyncio.wait_for(upstream.started.wait(), 5)
    for task in copies:
        task.cancel()
    await asyncio.gather(*copies, return_exceptions=True)
    assert upstream.cancelled.is_set()
    assert not policy._in_flight
    assert (await policy.budget_status(ALICE))["remaining"] == 9  # it may have run


@pytest.mark.parametrize(
    ("first_settled", "original_ran", "resend_ran", "remaining"),
    [
        pytest.param("resend", False, True, 9, id="re-send-ran-then-original-refunded"),
        pytest.param("original", False, True, 9, id="original-refunded-then-re-send-ran"),
        pytest.param("original", True, True, 9, id="both-ran"),
        pytest.param("original", False, False, 10, id="neither-ran"),
        pytest.param("resend", False, False, 10, id="neither-ran-re-send-first"),
    ],
)
async def test_a_call_that_ran_is_paid_exactly_once_whichever_copy_settles_first(
        first_settled: str, original_ran: bool, resend_ran: bool, remaining: int) -> None:
    first, *_ = make_policy()
    original = await admit_tool(first, params=call("echo", text="hi"))
    other = sharing_stores(first)  # the client re-sends to another process while the original is in flight
    resend = await admit_tool(other, params=call("echo", text="hi"))
    assert resend.duplicate
    order = [(first, original, original_ran), (other, resend, resend_ran)]
    for policy, admission, ran in (order if first_settled == "original" else order[::-1]):
        await policy.settle(admission, ran=ran)
    assert (await first.budget_status(ALICE))["remaining"] == remaining


async def test_different_params_or_id_are_charged_again() -> None:
    policy, *_ = make_policy()
    await admit_tool(policy, params=call("echo", text="hi"))
    await admit_tool(policy, params=call("echo", text="bye"))
    await admit_tool(policy, request_id=2, params=call("echo", text="hi"))
    assert (await policy.budget_status(ALICE))["remaining"] == 7


async def test_no_session_id_means_no_duplicate_guard() -> None:
    policy, *_ = make_policy()
    await admit_tool(policy, session="")
    assert not (await admit_tool(policy, session="")).duplicate
    assert (await policy.budget_status(ALICE))["remaining"] == 8


async def test_an_in_flight_record_expires_after_24_hours() -> None:
    clock = FakeClock()
    first, *_ = make_policy(clock)
    await admit_tool(first)  # its process dies in flight
    clock.advance(24 * 3600)
    late = sharing_stores(first)
    assert not (await admit_tool(late)).duplicate
    assert (await late.budget_status(ALICE))["remaining"] == 8


async def test_refused_call_leaves_no_duplicate_record() -> None:
    policy, *_ = make_policy()
    poor = Identity("poor", budget_limit=0.5)
    with pytest.raises(GatewayError):
        await admit_tool(policy, poor)
    with pytest.raises(GatewayError):  # refused again, not waved through as a re-send
        await admit_tool(sharing_stores(policy), poor)


async def test_a_new_session_resets_nothing() -> None:
    """Rate buckets and budgets follow the token; only the duplicate guard looks at the session id,
    by design (it recognises one client re-sending one call, and a resumed session keeps its id)."""
    clock = FakeClock()
    policy, *_ = make_policy(clock, rate_limit="2/s")
    await admit_tool(policy, session="old", request_id=1)
    # DELETE + initialize: a new session id, the same token: same bucket, same budget.
    second = await admit_tool(policy, session="new", request_id=1)
    assert not second.duplicate
    assert (await refusal(admit_tool(policy, session="newer", request_id=1))).code == -32004
    assert (await policy.budget_status(ALICE))["remaining"] == 8
    # A resumed session keeps its id, so the call it re-sends while the first is in flight joins it.
    clock.advance(1)
    assert (await admit_tool(policy, session="old", request_id=1)).duplicate
    assert (await policy.budget_status(ALICE))["remaining"] == 8
