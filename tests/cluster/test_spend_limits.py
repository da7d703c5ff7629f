"""Spend limits across processes (issue 27 §3): 100 concurrent payments of 10 against a limit of 200, spread over
two real gateways on one Redis, are served exactly 20 times (and the upstream's ledger shows exactly 20); a
gateway SIGKILLed between reserving an amount and answering loses nothing, and the client's re-send of that call
after the restart is not charged again (state folder and Redis)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx2
import pytest

from satgate_mcp.policy.controls import parse_controls
from tests.cluster.cluster import ROOT_KEY, Answer, Cluster, Mcp, shared_redis_url, unique
from tests.conftest import HttpUpstreamProcess, upstream_command
from tests.gateway_process import GatewayProcess

pytestmark = pytest.mark.process

TEST_TIMEOUT = 90.0
POLL_PAUSE = 0.05
LIMIT = {"spend_limits": [{"tools": ["pay*"], "field": "amount", "max": "200", "window": "day",
                           "tz": "America/New_York"}]}


def pay(amount: object, tool: str = "pay") -> dict[str, Any]:
    return {"name": tool, "arguments": {"amount": amount, "vendor": "acme"} if tool == "pay" else {"amount": amount}}


async def test_a_hundred_concurrent_payments_of_ten_over_two_gateways_spend_exactly_two_hundred(
        make_cluster: Callable[..., Cluster], http: httpx2.AsyncClient, tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.jsonl"
    upstreams = {"p": {"transport": "stdio", "command": upstream_command("--payments", "--ledger", str(ledger))}}
    cluster = make_cluster(await shared_redis_url(), SATGATE_UPSTREAMS=json.dumps(upstreams))
    async with asyncio.timeout(TEST_TIMEOUT):
        a, b = await cluster.started(2)
        client = Mcp.mint(http, unique("payer"), controls=parse_controls(json.dumps(LIMIT)))
        sessions = {a.port: await client.initialize(a), b.port: await client.initialize(b)}
        gateways = [a if i % 2 else b for i in range(100)]
        answers = await asyncio.gather(*(client.rpc(gw, sessions[gw.port], i + 1, "tools/call", pay(10))
                                         for i, gw in enumerate(gateways)))
    outcomes = [answer.outcome for answer in answers]
    assert outcomes.count("served") == 20, outcomes
    assert outcomes.count("spend_limit_exceeded") == 80, outcomes
    assert len(ledger.read_text().splitlines()) == 20
    refused = next(answer.body["error"]["data"] for answer in answers if answer.outcome != "served")
    assert (refused["limit"], refused["remaining"], refused["window"]) == ("200", "0", "day")
    assert refused["resets_at"].endswith(("-04:00", "-05:00"))


async def _waiting(client: Mcp, gw: GatewayProcess, session: str, count: int) -> None:
    """Until the upstream holds ``count`` pay_slow calls (it is another process: asking is how we look)."""
    request_id = 1000
    while True:
        request_id += 1
        answer = await client.rpc(gw, session, request_id, "tools/call", {"name": "waiting_payments", "arguments": {}})
        if answer.outcome == "served" and answer.body["result"]["content"][0]["text"] == str(count):
            return
        await asyncio.sleep(POLL_PAUSE)


async def _quietly(call: asyncio.Task[Answer]) -> None:
    with contextlib.suppress(httpx2.TransportError, asyncio.CancelledError):
        await call


@pytest.mark.parametrize("backend", ["state-folder", "redis"])
async def test_a_sigkill_between_reserve_and_answer_loses_nothing_and_the_re_send_is_not_charged_again(
        backend: str, http: httpx2.AsyncClient, tmp_path: Path) -> None:
    store = ({"SATGATE_STATE_DIR": str(tmp_path / "state")} if backend == "state-folder"
             else {"SATGATE_REDIS_URL": await shared_redis_url()})
    upstream = HttpUpstreamProcess("--payments").start()
    gw = GatewayProcess(tmp_path, root_key=ROOT_KEY, settings={
        "SATGATE_UPSTREAMS": json.dumps({"p": {"transport": "http", "url": upstream.url}}), **store})
    limit = {"spend_limits": [{**LIMIT["spend_limits"][0], "max": "20"}]}
    client = Mcp.mint(http, unique("killed"), controls=parse_controls(json.dumps(limit)))
    try:
        async with asyncio.timeout(TEST_TIMEOUT):
            gw.start()
            await gw.wait_ready()
            session = await client.initialize(gw)
            first = asyncio.create_task(client.rpc(gw, session, 5, "tools/call", pay(10, "pay_slow")))
            await _waiting(client, gw, session, 1)  # reserved, forwarded, unanswered
            await gw.kill()
            await _quietly(first)
            gw.start()
            await gw.wait_ready()
            # The client re-sends the call it got no answer to: same session, same id, same arguments.
            again = asyncio.create_task(client.rpc(gw, session, 5, "tools/call", pay(10, "pay_slow")))
            await _waiting(client, gw, session, 2)
            assert (await client.rpc(gw, session, 6, "tools/call", pay(10))).outcome == "served"  # 10 + 10
            over = await client.rpc(gw, session, 7, "tools/call", pay("0.5"))
            assert over.outcome == "spend_limit_exceeded"
            assert over.body["error"]["data"]["remaining"] == "0"
            await client.rpc(gw, session, 8, "tools/call", {"name": "release_payments", "arguments": {}})
            assert (await again).outcome == "served"
            assert (await client.rpc(gw, session, 9, "tools/call", pay("0.5"))).outcome == "spend_limit_exceeded"
    finally:
        await gw.kill()
        upstream.stop()
