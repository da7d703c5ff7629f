"""The call runner without a transport in front: calls with and without a session, bounds and cancellation.

A stateless (2026-07-28) request runs calls for a principal alone; these rules hold for it as for a session.
"""

from __future__ import annotations

import asyncio

from satgate_mcp import jsonrpc
from satgate_mcp.auth.base import Identity
from satgate_mcp.jsonrpc import JsonObj
from satgate_mcp.transport.checks import Principal
from tests.fakes import FakePool, until
from tests.transport.pieces import ALICE, call, make_pieces, open_session, text_of


async def test_a_principal_alone_runs_a_call() -> None:
    runner = make_pieces(FakePool()).runner
    reply = await runner.run(ALICE, call(1, "echo"))
    assert reply["id"] == 1
    assert text_of(reply) == "echo"


async def test_calls_without_a_session_are_bounded_by_their_tokens_in_flight_quota() -> None:
    pool = FakePool()
    runner = make_pieces(pool, per_token=1).runner
    running = asyncio.ensure_future(runner.run(ALICE, call(1, "block")))
    await pool.started.wait()
    refused = await runner.run(ALICE, call(2, "echo"))
    assert refused["error"]["code"] == jsonrpc.RATE_LIMITED
    other = Principal("tok-bob", Identity(token_id="bob"))
    assert text_of(await runner.run(other, call(3, "echo"))) == "echo"  # another token has its own quota
    pool.release.set()
    assert text_of(await running) == "block"
    assert runner.limiter.in_flight == 0


async def test_a_batch_past_the_bound_is_answered_in_order_with_the_excess_refused() -> None:
    runner = make_pieces(FakePool(), per_token=2).runner
    replies = await runner.run_batch(ALICE, [call(1, "echo"), call(2, "echo"), call(3, "echo")])
    assert [r["id"] for r in replies] == [1, 2, 3]
    assert [("error" in r) for r in replies] == [False, False, True]
    assert runner.limiter.in_flight == 0


async def test_cancelled_stops_the_named_call_of_that_session_only() -> None:
    pool = FakePool()
    _, gate, runner = make_pieces(pool)
    session = open_session(gate)
    running = asyncio.ensure_future(runner.run(session, call(7, "block")))
    await pool.started.wait()
    cancel = jsonrpc.Notification("notifications/cancelled", {"requestId": 7})
    runner.on_notification(ALICE, cancel)  # no session: nothing names a call to cancel
    await asyncio.sleep(0)
    assert not running.done()
    runner.on_notification(session, cancel)
    reply = await running
    assert reply["error"]["code"] == jsonrpc.REQUEST_CANCELLED
    await until(pool.cancelled.is_set)
    assert session.inflight == 0


async def test_a_cancelled_call_leaves_its_callers_task_free_to_go_on() -> None:
    """The call runs in the caller's own task: after the cancel answer, that task is not left cancelling."""
    pool = FakePool()
    _, gate, runner = make_pieces(pool)
    session = open_session(gate)

    async def handler() -> tuple[JsonObj, JsonObj]:
        cancelled = await runner.run(session, call(7, "block"))
        await asyncio.sleep(0)  # the answer is written after awaits like this one
        return cancelled, await runner.run(session, call(8, "echo"))

    running = asyncio.ensure_future(handler())
    await pool.started.wait()
    runner.on_notification(session, jsonrpc.Notification("notifications/cancelled", {"requestId": 7}))
    cancelled, after = await running
    assert cancelled["error"]["code"] == jsonrpc.REQUEST_CANCELLED
    assert text_of(after) == "echo"
    assert runner.limiter.in_flight == 0


async def test_a_cancel_from_outside_the_call_still_cancels_its_caller() -> None:
    """A handler cancelled from outside (its client went away) is not turned into an answer, even when the
    client's own cancel arrived too."""
    pool = FakePool()
    _, gate, runner = make_pieces(pool)
    session = open_session(gate)
    for also_by_client in (False, True):
        pool.started.clear()
        running = asyncio.ensure_future(runner.run(session, call(7, "block")))
        await pool.started.wait()
        if also_by_client:
            runner.on_notification(session, jsonrpc.Notification("notifications/cancelled", {"requestId": 7}))
        running.cancel()
        await asyncio.wait([running])
        assert running.cancelled()
        assert session.inflight == 0
        assert runner.limiter.in_flight == 0
