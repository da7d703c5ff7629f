"""Rate limits over HTTP: -32004 with a whole-second retry, per token (its family), per tool pattern."""

from __future__ import annotations

import pytest

from tests.limits_http.deployment import (
    Deploy,
    echoed,
    mint,
    refused_for,
)

# --- rate limits -----------------------------------------------------------------------------------


async def test_a_rate_limited_call_gets_32004_with_retry_after_and_is_neither_forwarded_nor_charged(
        deploy: Deploy) -> None:
    deployment = deploy(rate_limit="2/s")
    gw = await deployment.start()
    token = mint(budget_limit=10)
    sid = await gw.initialize(token)
    assert echoed(await gw.call(token, sid, request_id=1, text="hi"))
    assert echoed(await gw.call(token, sid, request_id=2, text="hi"))

    refused = await gw.call(token, sid, request_id=3, text="hi")

    assert refused.status == 200
    assert refused.body == {"jsonrpc": "2.0", "id": 3, "error": {
        "code": -32004, "message": "rate limit exceeded",
        "data": {"error": "rate_limited", "retry_after_seconds": 1}}}
    assert gw.forwarded() == 2
    assert await deployment.remaining(token) == 8
    assert deployment.refusals("rate_limited") == 1
    deployment.clock.advance(0.5)
    assert echoed(await gw.call(token, sid, request_id=4, text="hi"))


@pytest.mark.parametrize(("rate", "retry_after"), [
    pytest.param("10/s", 1, id="a-tenth-of-a-second-is-told-as-1"),
    pytest.param("6/m", 10, id="ten-seconds"),
    pytest.param("7/m", 9, id="8.57-seconds-rounds-up"),
    pytest.param("1/h", 3600, id="an-hour"),
])
async def test_retry_after_is_whole_seconds_rounded_up_and_at_least_one(
        deploy: Deploy, rate: str, retry_after: int) -> None:
    deployment = deploy(rate_limit=rate, rate_burst=1)
    gw = await deployment.start()
    token = mint()
    sid = await gw.initialize(token)
    assert echoed(await gw.call(token, sid, request_id=1, text="hi"))
    refused = await gw.call(token, sid, request_id=2, text="hi")
    assert refused.error["data"] == {"error": "rate_limited", "retry_after_seconds": retry_after}
    assert isinstance(refused.error["data"]["retry_after_seconds"], int)


async def test_gateway_methods_draw_from_the_same_bucket_as_tool_calls(deploy: Deploy) -> None:
    deployment = deploy(rate_limit="1/s", rate_burst=1)
    gw = await deployment.start()
    token = mint()
    sid = await gw.initialize(token)
    assert (await gw.rpc(token, sid, "tools/list", request_id=1)).result["tools"]  # other methods pass freely
    assert (await gw.rpc(token, sid, "satgate/budget", request_id=2)).result["remaining"] == -1
    assert refused_for(await gw.call(token, sid, request_id=3)) == "rate_limited"
    assert refused_for(await gw.rpc(token, sid, "satgate/budget", request_id=4)) == "rate_limited"
    assert gw.forwarded() == 0


async def test_a_per_tool_rate_limits_only_the_tools_its_pattern_names(deploy: Deploy) -> None:
    deployment = deploy(tool_rate_limits={"ech*": "1/m"})
    gw = await deployment.start()
    token = mint()
    sid = await gw.initialize(token)
    assert echoed(await gw.call(token, sid, request_id=1, text="hi"))
    refused = await gw.call(token, sid, request_id=2, text="hi")
    assert refused.error["data"] == {"error": "rate_limited", "retry_after_seconds": 60}
    assert echoed(await gw.call(token, sid, "other", request_id=3), "other")


async def test_rate_limits_are_per_token(deploy: Deploy) -> None:
    deployment = deploy(rate_limit="1/s", rate_burst=1)
    gw = await deployment.start()
    alice, bob = mint("alice"), mint("bob")
    alice_sid, bob_sid = await gw.initialize(alice), await gw.initialize(bob)
    assert echoed(await gw.call(alice, alice_sid, text="hi"))
    assert refused_for(await gw.call(alice, alice_sid, request_id=2)) == "rate_limited"
    assert echoed(await gw.call(bob, bob_sid, text="hi"))


async def test_attack_a_refused_call_that_asked_for_progress_is_never_a_200_stream_carrying_the_error(
        deploy: Deploy) -> None:
    """Every check that can refuse a call runs before its answer is prepared: a refusal is a plain JSON answer."""
    deployment = deploy(rate_limit="1/s", rate_burst=1)
    gw = await deployment.start()
    token = mint()
    sid = await gw.initialize(token)
    assert echoed(await gw.call(token, sid, request_id=1, text="hi"))
    params = {"name": "echo", "arguments": {"text": "hi"}, "_meta": {"progressToken": "p-1"}}

    refused = await gw.rpc(token, sid, "tools/call", params, request_id=2)

    assert refused.headers["Content-Type"].startswith("application/json")
    assert refused_for(refused) == "rate_limited"
