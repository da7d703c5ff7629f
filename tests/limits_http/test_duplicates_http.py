"""The duplicate guard over HTTP, across restarts and replicas; and a new session resets nothing."""

from __future__ import annotations

import asyncio

import pytest

from satgate_mcp import jsonrpc
from satgate_mcp.jsonrpc import JsonObj, RequestId
from satgate_mcp.metrics import Metrics
from tests.limits_http.deployment import (
    BATCH_ERA,
    WAIT,
    Deploy,
    DownBeforeSendingPool,
    echoed,
    mint,
    refused_for,
    sample,
)

# --- the duplicate guard ------------------------------------------------------------------------------

SAME_CALL: JsonObj = {"name": "echo", "arguments": {"text": "pay once"}}


@pytest.mark.parametrize(("another_session", "request_id", "params"), [
    pytest.param(False, 1, SAME_CALL, id="same-session-id-and-params"),
    pytest.param(False, 1, {**SAME_CALL, "_meta": {"traceparent": "00-ab-cd-01"}}, id="only-meta-differs"),
    pytest.param(False, 1, {"name": "echo", "arguments": {"text": "other"}}, id="same-id-other-params"),
    pytest.param(False, 2, SAME_CALL, id="other-id-same-params"),
    pytest.param(False, "1", SAME_CALL, id="same-id-as-a-string"),
    pytest.param(True, 1, SAME_CALL, id="same-call-in-another-session"),
])
async def test_attack_re_sending_a_settled_call_is_charged_as_a_new_call(
        deploy: Deploy, another_session: bool, request_id: RequestId, params: JsonObj) -> None:
    deployment = deploy()
    gw = await deployment.start()
    token = mint(budget_limit=10)
    sid = await gw.initialize(token)
    assert echoed(await gw.rpc(token, sid, "tools/call", SAME_CALL, request_id=1), "pay once")

    second_sid = await gw.initialize(token) if another_session else sid
    again = await gw.rpc(token, second_sid, "tools/call", params, request_id=request_id)

    assert "result" in again.body
    assert gw.forwarded() == 2
    assert await deployment.remaining(token) == 8


async def test_attack_re_sending_a_settled_call_with_an_exhausted_budget_is_refused(deploy: Deploy) -> None:
    deployment = deploy()
    gw = await deployment.start()
    token = mint(budget_limit=1)
    sid = await gw.initialize(token)
    assert echoed(await gw.rpc(token, sid, "tools/call", SAME_CALL, request_id=1), "pay once")

    for _ in range(3):
        assert refused_for(await gw.rpc(token, sid, "tools/call", SAME_CALL, request_id=1)) == "budget_exhausted"

    assert gw.forwarded() == 1
    assert await deployment.remaining(token) == 0


async def test_attack_twenty_identical_copies_in_one_batch_run_once_upstream(deploy: Deploy) -> None:
    deployment = deploy()
    gw = await deployment.start()
    token = mint(budget_limit=10)
    sid = await gw.initialize(token, BATCH_ERA)
    copy = jsonrpc.request_message(7, "tools/call", {"name": "block", "arguments": {"text": "once"}})

    batch = asyncio.create_task(gw.post(token, [copy] * 20, sid, BATCH_ERA))
    await asyncio.wait_for(gw.pool.started.wait(), WAIT)
    gw.pool.release.set()
    answer = await asyncio.wait_for(batch, WAIT)

    assert answer.status == 200
    assert len(answer.body) == 20
    assert all(item["id"] == 7 and item["result"]["content"][0]["text"] == "once" for item in answer.body)
    assert gw.forwarded() == 1
    assert await deployment.remaining(token) == 9


async def test_attack_a_call_whose_process_died_lets_one_re_send_through_and_no_more(deploy: Deploy) -> None:
    deployment = deploy()
    first = await deployment.start()
    token = mint(budget_limit=1)
    sid = await first.initialize(token)
    lost = asyncio.create_task(first.call(token, sid, "block", request_id=7, text="once"))
    await asyncio.wait_for(first.pool.started.wait(), WAIT)  # charged, in flight; then the process is gone

    second, third = await deployment.start(metrics=Metrics()), await deployment.start(metrics=Metrics())
    second.pool.release.set()
    third.pool.release.set()
    assert echoed(await second.call(token, sid, "block", request_id=7, text="once"), "once")  # the one free re-send
    refused = await third.call(token, sid, "block", request_id=7, text="once")

    assert refused_for(refused) == "budget_exhausted"
    assert (first.forwarded(), second.forwarded(), third.forwarded()) == (1, 1, 0)
    assert await deployment.remaining(token) == 0
    lost.cancel()
    await asyncio.gather(lost, return_exceptions=True)


async def test_a_resumed_session_re_sending_its_in_flight_call_after_a_restart_is_charged_once(
        deploy: Deploy) -> None:
    deployment = deploy()
    first = await deployment.start()
    token = mint(budget_limit=10)
    sid = await first.initialize(token)
    in_flight = asyncio.create_task(first.call(token, sid, "block", request_id=7, text="pay once"))
    await asyncio.wait_for(first.pool.started.wait(), WAIT)
    assert await deployment.remaining(token) == 9

    # The client's connection to the first process is gone; it re-sends the call to the process now serving.
    second = await deployment.start(metrics=Metrics())
    second.pool.release.set()
    again = await second.call(token, sid, "block", request_id=7, text="pay once")

    assert again.headers["Mcp-Session-Id"] == sid
    assert echoed(again, "pay once")
    assert sample(await second.metrics(), "satgate_sessions_resumed_total") == 1
    first.pool.release.set()
    assert echoed(await asyncio.wait_for(in_flight, WAIT), "pay once")
    assert await deployment.remaining(token) == 9
    # the same id with other params is another call, and pays
    assert echoed(await second.call(token, sid, "block", request_id=7, text="changed"), "changed")
    assert await deployment.remaining(token) == 8


async def test_a_re_sent_call_that_ran_is_paid_even_when_the_original_is_refunded(deploy: Deploy) -> None:
    deployment = deploy()
    first = await deployment.start(pool=DownBeforeSendingPool())
    token = mint(budget_limit=10)
    sid = await first.initialize(token)
    original = asyncio.create_task(first.call(token, sid, request_id=7, text="pay once"))
    await asyncio.wait_for(first.pool.started.wait(), WAIT)

    second = await deployment.start(metrics=Metrics())
    assert echoed(await second.call(token, sid, request_id=7, text="pay once"), "pay once")  # it ran here
    first.pool.release.set()
    assert (await asyncio.wait_for(original, WAIT)).error["code"] == jsonrpc.UPSTREAM_UNAVAILABLE

    assert await deployment.remaining(token) == 9


# --- a new session resets nothing --------------------------------------------------------------------


async def test_delete_then_initialize_or_a_resume_gets_no_fresh_rate_bucket(deploy: Deploy) -> None:
    deployment = deploy(rate_limit="2/s")
    first = await deployment.start()
    token = mint()
    old = await first.initialize(token)
    for n in (1, 2):
        assert echoed(await first.call(token, old, request_id=n, text="hi"))
    assert await first.delete(token, old) == 200

    new = await first.initialize(token)
    assert refused_for(await first.call(token, new, request_id=3)) == "rate_limited"
    second = await deployment.start(metrics=Metrics())
    resumed = await second.call(token, new, request_id=4)
    assert resumed.headers["Mcp-Session-Id"] == new
    assert refused_for(resumed) == "rate_limited"

    deployment.clock.advance(0.5)  # only time refills the bucket
    assert echoed(await second.call(token, new, request_id=5, text="hi"))
    assert first.forwarded() + second.forwarded() == 3


async def test_delete_then_initialize_or_a_resume_gets_no_fresh_budget(deploy: Deploy) -> None:
    deployment = deploy()
    first = await deployment.start()
    token = mint(budget_limit=2)
    old = await first.initialize(token)
    for n in (1, 2):
        assert echoed(await first.call(token, old, request_id=n, text="hi"))
    assert await first.delete(token, old) == 200

    new = await first.initialize(token)
    assert refused_for(await first.call(token, new, request_id=3)) == "budget_exhausted"
    second = await deployment.start(metrics=Metrics())
    assert refused_for(await second.call(token, new, request_id=4)) == "budget_exhausted"
    status = (await second.rpc(token, new, "satgate/budget", request_id=5)).result
    assert status["remaining"] == 0
    assert first.forwarded() + second.forwarded() == 2


async def test_a_settled_call_re_sent_from_a_deleted_session_on_another_process_is_a_new_call(
        deploy: Deploy) -> None:
    """Deleting the session and resuming its old id on another process (a tombstone is per process) gives
    no free call: the first copy settled, so the re-send pays like any other call."""
    deployment = deploy()
    first = await deployment.start()
    token = mint(budget_limit=10)
    old = await first.initialize(token)
    assert echoed(await first.rpc(token, old, "tools/call", SAME_CALL, request_id=7), "pay once")
    assert await first.delete(token, old) == 200
    await first.initialize(token)

    second = await deployment.start(metrics=Metrics())
    again = await second.rpc(token, old, "tools/call", SAME_CALL, request_id=7)

    assert again.headers["Mcp-Session-Id"] == old
    assert echoed(again, "pay once")
    assert await deployment.remaining(token) == 8
