"""Issue 5 through the gateway: rate limits, budgets, refunds, the duplicate guard, events and metrics,
each checked over real HTTP (``aiohttp_client``) against a real ``CallPolicy``.

A *deployment* is what outlives a process: the authenticator (root key, revocations) and the policy
(its stores). A *process* is an app built by ``create_app`` on that deployment; a restart, or another
replica, is a new app sharing both, which is what a shared store gives several processes. The policy
reads a FakeClock, so buckets refill only when a test moves it.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient
from multidict import CIMultiDictProxy
from prometheus_client.parser import text_string_to_metric_families
from pytest_aiohttp import AiohttpClient

from satgate_mcp import events, jsonrpc
from satgate_mcp.app import create_app
from satgate_mcp.auth.header import MacaroonAuthenticator
from satgate_mcp.auth.macaroons import mint_token, verify_token
from satgate_mcp.auth.revocation import MemoryRevocationStore
from satgate_mcp.errors import UpstreamUnavailable
from satgate_mcp.events import RecordingPublisher
from satgate_mcp.jsonrpc import JsonObj, RequestId
from satgate_mcp.metrics import Metrics
from satgate_mcp.policy.engine import CallPolicy
from satgate_mcp.settings import Settings
from satgate_mcp.upstream.base import ProgressCallback
from tests.fakes import FakeClock, FakePool

ROOT_KEY = "limits-http-root-key-0123456789abcdef"
WALL = 1_700_000_000.0
LATEST = "2025-11-25"
#: The one protocol version with JSON-RPC batches.
BATCH_ERA = "2025-03-26"
#: Bound on awaiting something the gateway does.
WAIT = 10.0
CONCURRENT_CALLS = 100
CONCURRENT_SESSIONS = 4

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


# --- parts ---------------------------------------------------------------------------------------


class ScriptedPool(FakePool):
    """FakePool whose ``fail`` tool answers as its arguments say: ``{"code": N}`` is an upstream JSON-RPC
    error N; ``{"unreachable": "before_sending" | "in_flight"}`` is an upstream that is down."""

    def __init__(self) -> None:
        super().__init__(["echo", "other", "block", "fail"])

    async def call(self, method: str, params: JsonObj | None, *, on_progress: ProgressCallback | None = None
                   ) -> JsonObj:
        if (params or {}).get("name") != "fail":
            return await super().call(method, params, on_progress=on_progress)
        self.calls.append((method, params))
        args = (params or {}).get("arguments") or {}
        if "unreachable" in args:
            raise UpstreamUnavailable("upstream is down", {"error": "upstream_unavailable"},
                                      sent=args["unreachable"] == "in_flight")
        return jsonrpc.error_response(0, int(args["code"]), "the upstream refused")


class DownBeforeSendingPool(ScriptedPool):
    """An upstream that is down: every call waits for ``release``, then fails without having been sent."""

    async def call(self, method: str, params: JsonObj | None, *, on_progress: ProgressCallback | None = None
                   ) -> JsonObj:
        self.calls.append((method, params))
        self.started.set()
        await self.release.wait()
        raise UpstreamUnavailable("upstream is down", {"error": "upstream_unavailable"}, sent=False)


class CountingPublisher(RecordingPublisher):
    """Records events and lets a test await a count of them (bounded) instead of sleeping."""

    def __init__(self) -> None:
        super().__init__()
        self._changed = asyncio.Event()

    def publish(self, event: str, **fields: Any) -> None:
        super().publish(event, **fields)
        self._changed.set()

    async def wait_count(self, names: Collection[str], count: int) -> None:
        async def reached() -> None:
            while sum(name in names for name, _ in self.events) < count:
                self._changed.clear()
                await self._changed.wait()

        await asyncio.wait_for(reached(), WAIT)


@dataclass(frozen=True)
class Answer:
    status: int
    headers: CIMultiDictProxy[str]
    body: Any

    @property
    def error(self) -> JsonObj:
        assert isinstance(self.body, dict), self.body
        assert isinstance(self.body.get("error"), dict), self.body
        error: JsonObj = self.body["error"]
        return error

    @property
    def result(self) -> JsonObj:
        assert self.status == 200, self.body
        assert isinstance(self.body, dict), self.body
        assert "result" in self.body, self.body
        result: JsonObj = self.body["result"]
        return result


def echoed(answer: Answer, text: str = "hi") -> bool:
    return answer.status == 200 and answer.result["content"][0]["text"] == text


def refused_for(answer: Answer) -> str:
    """``data.error`` of a JSON-RPC refusal that came back as HTTP 200 (a refusal of the call, not of HTTP)."""
    assert answer.status == 200, answer.body
    reason: str = answer.error["data"]["error"]
    return reason


@dataclass
class Gateway:
    """One gateway process over real HTTP, and the upstream pool it forwards to."""

    app: web.Application
    client: TestClient[web.Request, web.Application]
    pool: ScriptedPool

    async def post(self, token: str | None, body: Any, session_id: str | None = None, protocol: str = LATEST
                   ) -> Answer:
        headers = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        if session_id is not None:
            headers["Mcp-Session-Id"] = session_id
            headers["MCP-Protocol-Version"] = protocol
        async with self.client.post("/mcp", headers=headers, data=json.dumps(body)) as resp:
            text = await resp.text()
            return Answer(resp.status, resp.headers, json.loads(text) if text else None)

    async def initialize(self, token: str, protocol: str = LATEST) -> str:
        answer = await self.post(token, jsonrpc.request_message(0, "initialize", {
            "protocolVersion": protocol, "capabilities": {}, "clientInfo": {"name": "limits-http", "version": "1"}}))
        assert answer.status == 200, answer.body
        return answer.headers["Mcp-Session-Id"]

    async def rpc(self, token: str, session_id: str, method: str, params: JsonObj | None = None,
                  request_id: RequestId = 1) -> Answer:
        return await self.post(token, jsonrpc.request_message(request_id, method, params), session_id)

    async def call(self, token: str, session_id: str, tool: str = "echo", *, request_id: RequestId = 1,
                   **arguments: Any) -> Answer:
        return await self.rpc(token, session_id, "tools/call", {"name": tool, "arguments": arguments}, request_id)

    async def delete(self, token: str, session_id: str) -> int:
        headers = {"Authorization": f"Bearer {token}", "Mcp-Session-Id": session_id}
        async with self.client.delete("/mcp", headers=headers) as resp:
            return resp.status

    async def metrics(self) -> Samples:
        async with self.client.get("/metrics") as resp:
            assert resp.status == 200
            text = await resp.text()
        return {(s.name, frozenset(s.labels.items())): s.value
                for family in text_string_to_metric_families(text) for s in family.samples}

    def forwarded(self) -> int:
        return sum(method == "tools/call" for method, _ in self.pool.calls)


def sample(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


@dataclass
class Deployment:
    settings: Settings
    policy: CallPolicy
    clock: FakeClock
    publisher: CountingPublisher
    metrics: Metrics
    authenticator: MacaroonAuthenticator
    aiohttp_client: AiohttpClient

    async def start(self, *, metrics: Metrics | None = None, pool: ScriptedPool | None = None) -> Gateway:
        """A gateway process on this deployment; calling it again is a restart or a second replica.

        Each process has its own policy (what it holds in memory: the calls in flight there) over the
        deployment's stores (budgets, duplicate records, rate buckets), as with a shared store.
        """
        pool = pool or ScriptedPool()
        metrics = metrics or self.metrics
        policy = CallPolicy(self.settings, publisher=self.publisher, metrics=metrics, clock=self.clock,
                            tool_rate_limits=self.settings.tool_rate_limits, budgets=self.policy._budgets,
                            duplicates=self.policy._duplicates, rate_limiter=self.policy._limiter)
        app = create_app(self.settings, authenticator=self.authenticator, pool=pool, policy=policy,
                         publisher=self.publisher, metrics=metrics, clock=self.clock)
        return Gateway(app, await self.aiohttp_client(app), pool)

    async def remaining(self, token: str) -> float:
        """What ``satgate/budget`` says, asked of the policy itself so that no rate token is spent."""
        status = await self.policy.budget_status(verify_token(ROOT_KEY, token, now=WALL))
        return float(status["remaining"])

    def refusals(self, reason: str) -> float:
        return self.metrics.registry.get_sample_value("satgate_refusals_total", {"reason": reason}) or 0.0


Deploy = Callable[..., Deployment]


def mint(token_id: str = "agent-1", **caveats: Any) -> str:
    return mint_token(ROOT_KEY, token_id, now=WALL, **caveats)


def header_settings(**overrides: Any) -> Settings:
    values: dict[str, Any] = {"auth_mode": "header", "root_key": ROOT_KEY, "enforcement": "control"}
    values.update(overrides)
    return Settings(**values)


@pytest.fixture
def deploy(aiohttp_client: AiohttpClient) -> Deploy:
    def make(**overrides: Any) -> Deployment:
        settings = header_settings(**overrides)
        clock, publisher, metrics = FakeClock(), CountingPublisher(), Metrics()
        policy = CallPolicy(settings, publisher=publisher, metrics=metrics, clock=clock,
                            tool_rate_limits=settings.tool_rate_limits)
        authenticator = MacaroonAuthenticator(ROOT_KEY, MemoryRevocationStore(), clock=FakeClock(WALL))
        return Deployment(settings, policy, clock, publisher, metrics, authenticator, aiohttp_client)

    return make


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


# --- budgets -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("enforcement", ["control", "hard", "soft"])
async def test_an_exhausted_budget_refuses_with_the_documented_shape_and_forwards_nothing(
        deploy: Deploy, enforcement: str) -> None:
    deployment = deploy(enforcement=enforcement, tool_costs={"echo": 2, "other": 1})
    gw = await deployment.start()
    token = mint("agent-1", budget_id="team-a", budget_limit=3)
    sid = await gw.initialize(token)
    assert echoed(await gw.call(token, sid, request_id=1, text="hi"))

    refused = await gw.call(token, sid, request_id=2, text="hi")

    assert refused.status == 200
    assert refused.body == {"jsonrpc": "2.0", "id": 2, "error": {
        "code": -32000, "message": "Budget exhausted",
        "data": {"error": "budget_exhausted", "tool": "echo", "cost_credits": 2, "remaining_credits": 1,
                 "token_id": "agent-1", "budget_id": "team-a"}}}
    assert gw.forwarded() == 1
    assert await deployment.remaining(token) == 1
    assert deployment.refusals("budget_exhausted") == 1
    # a cheaper tool that fits what remains still runs
    assert echoed(await gw.call(token, sid, "other", request_id=3), "other")
    assert await deployment.remaining(token) == 0


@pytest.mark.parametrize("enforcement", ["observe", "shadow"])
async def test_observe_mode_charges_and_logs_but_never_refuses(deploy: Deploy, enforcement: str) -> None:
    deployment = deploy(enforcement=enforcement, tool_costs={"echo": 2})
    gw = await deployment.start()
    token = mint(budget_limit=3)
    sid = await gw.initialize(token)
    for n in range(4):
        assert echoed(await gw.call(token, sid, request_id=n, text="hi"))

    assert gw.forwarded() == 4
    assert (await gw.rpc(token, sid, "satgate/budget", request_id=9)).result["remaining"] == 0  # never below 0
    assert sum(e["cost"] for e in deployment.publisher.named(events.BUDGET_SPEND)) == 8
    exhausted = deployment.publisher.named(events.BUDGET_EXHAUSTED)
    assert [e["enforced"] for e in exhausted] == [False, False, False]  # calls 2, 3 and 4 did not fit
    assert deployment.refusals("budget_exhausted") == 0


@pytest.mark.parametrize(("cost", "budget", "fits"), [
    pytest.param(1, 10, 10, id="cost-1-budget-10"),
    pytest.param(3, 10, 3, id="cost-3-budget-10"),
    pytest.param(0.1, 1, 10, id="cost-0.1-budget-1-float-slack"),
])
async def test_concurrent_calls_on_a_small_budget_never_overspend(
        deploy: Deploy, cost: float, budget: float, fits: int) -> None:
    # Above SATGATE_MAX_INFLIGHT_PER_TOKEN's default (64), so the in-flight bound (hole 11) stays out of the way.
    deployment = deploy(tool_costs={"block": cost}, max_inflight_per_token=CONCURRENT_CALLS)
    gw = await deployment.start()
    token = mint(budget_limit=budget)
    sessions = [await gw.initialize(token) for _ in range(CONCURRENT_SESSIONS)]
    tasks = [asyncio.create_task(gw.call(token, sessions[n % CONCURRENT_SESSIONS], "block", request_id=n))
             for n in range(CONCURRENT_CALLS)]
    try:
        # Every call is admitted or refused while the admitted ones are all still running upstream.
        await deployment.publisher.wait_count({events.BUDGET_SPEND, events.BUDGET_EXHAUSTED}, CONCURRENT_CALLS)
        assert gw.forwarded() == fits
    finally:
        gw.pool.release.set()
    answers = await asyncio.wait_for(asyncio.gather(*tasks), WAIT)

    assert sum("result" in a.body for a in answers) == fits
    assert sum(refused_for(a) == "budget_exhausted" for a in answers if "error" in a.body) == CONCURRENT_CALLS - fits
    assert gw.forwarded() == fits
    assert await deployment.remaining(token) == pytest.approx(budget - fits * cost)
    assert await deployment.remaining(token) >= 0


@pytest.mark.parametrize(("arguments", "refunded"), [
    pytest.param({"code": -32602}, True, id="upstream-answered-invalid-params"),
    pytest.param({"code": -32601}, True, id="upstream-answered-method-not-found"),
    pytest.param({"code": -32600}, True, id="upstream-answered-invalid-request"),
    pytest.param({"unreachable": "before_sending"}, True, id="upstream-unreachable"),
    pytest.param({"code": -32603}, False, id="internal-error-may-have-run"),
    pytest.param({"code": -32000}, False, id="server-error-may-have-run"),
    pytest.param({"unreachable": "in_flight"}, False, id="connection-lost-in-flight-may-have-run"),
])
async def test_a_call_the_upstream_certainly_never_ran_is_refunded(
        deploy: Deploy, arguments: JsonObj, refunded: bool) -> None:
    deployment = deploy(tool_costs={"fail": 3})
    gw = await deployment.start()
    token = mint(budget_limit=10)
    sid = await gw.initialize(token)

    answer = await gw.call(token, sid, "fail", request_id=1, **arguments)

    assert answer.status == 200
    assert "error" in answer.body
    status = (await gw.rpc(token, sid, "satgate/budget", request_id=2)).result
    assert status["remaining"] == (10 if refunded else 7)
    refunds = [e for e in deployment.publisher.named(events.BUDGET_SPEND) if e.get("refund")]
    assert [e["cost"] for e in refunds] == ([-3] if refunded else [])


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


# --- satgate/budget -----------------------------------------------------------------------------------


@pytest.mark.parametrize(("caveats", "operator_budgets", "expected"), [
    pytest.param({}, {}, {"tokenId": "agent-1", "budgetId": "agent-1", "remaining": -1}, id="unlimited"),
    pytest.param({"budget_limit": 5}, {}, {"tokenId": "agent-1", "budgetId": "agent-1", "remaining": 5},
                 id="no-budget-id-spends-from-the-token-id"),
    pytest.param({"budget_id": "team-a", "budget_limit": 5}, {},
                 {"tokenId": "agent-1", "budgetId": "team-a", "remaining": 5}, id="budget-id"),
    pytest.param({"budget_id": "team-a", "budget_limit": 5}, {"team-a": 7},
                 {"tokenId": "agent-1", "budgetId": "team-a", "remaining": 7}, id="operator-budget-wins"),
    pytest.param({"budget_id": "team-a"}, {"team-a": 7},
                 {"tokenId": "agent-1", "budgetId": "team-a", "remaining": 7}, id="operator-budget-only"),
])
async def test_satgate_budget_returns_token_id_budget_id_and_remaining(
        deploy: Deploy, caveats: dict[str, Any], operator_budgets: dict[str, float], expected: JsonObj) -> None:
    deployment = deploy(budgets=operator_budgets, tool_costs={"echo": 2})
    gw = await deployment.start()
    token = mint("agent-1", **caveats)
    sid = await gw.initialize(token)

    before = (await gw.rpc(token, sid, "satgate/budget", request_id=1)).result
    assert echoed(await gw.call(token, sid, request_id=2, text="hi"))
    after = (await gw.rpc(token, sid, "satgate/budget", request_id=3)).result

    assert {k: before[k] for k in ("tokenId", "budgetId", "remaining")} == expected
    assert after["remaining"] == (-1 if expected["remaining"] == -1 else expected["remaining"] - 2)


async def test_tokens_sharing_a_budget_id_spend_the_same_credits(deploy: Deploy) -> None:
    deployment = deploy()
    gw = await deployment.start()
    alice, bob = mint("alice", budget_id="team", budget_limit=3), mint("bob", budget_id="team", budget_limit=3)
    alice_sid, bob_sid = await gw.initialize(alice), await gw.initialize(bob)
    for n in range(3):
        assert echoed(await gw.call(alice, alice_sid, request_id=n, text="hi"))
    refused = await gw.call(bob, bob_sid, request_id=1)
    assert refused.error["data"]["budget_id"] == "team"
    assert refused.error["data"]["token_id"] == "bob"


async def test_delegation_failure_has_its_shape_and_moves_nothing(deploy: Deploy) -> None:
    deployment = deploy()
    gw = await deployment.start()
    token = mint("parent", budget_limit=3)
    sid = await gw.initialize(token)
    refused = await gw.rpc(token, sid, "satgate/delegate", {"budget": 5}, request_id=1)
    assert refused.error["code"] == -32000
    assert refused.error["data"]["error"] == "delegation_failed"
    assert await deployment.remaining(token) == 3


# --- events and metrics -------------------------------------------------------------------------------


async def test_the_events_file_gets_one_json_line_per_event_and_never_a_token(
        aiohttp_client: AiohttpClient, tmp_path: Path) -> None:
    events_file = tmp_path / "events.jsonl"
    settings = header_settings(rate_limit="1/m", rate_burst=2, events_file=events_file)
    pool = ScriptedPool()
    app = create_app(settings, pool=pool)  # publisher and policy built from the settings
    gw = Gateway(app, await aiohttp_client(app), pool)
    token = mint(budget_limit=1)
    sid = await gw.initialize(token)
    assert echoed(await gw.call(token, sid, request_id=1, text="hi"))
    assert refused_for(await gw.call(token, sid, request_id=2)) == "budget_exhausted"
    assert refused_for(await gw.call(token, sid, request_id=3)) == "rate_limited"
    assert (await gw.post("not-a-token", jsonrpc.request_message(0, "initialize", {}))).status == 401
    assert await gw.delete(token, sid) == 200

    text = events_file.read_text()
    records = [json.loads(line) for line in text.splitlines()]
    assert [r["event"] for r in records] == [
        "session_connect", "budget_spend", "tool_call", "budget_exhausted", "rate_limited", "auth_failure",
        "session_close"]
    by_name = {r["event"]: r for r in records}
    assert by_name["session_connect"]["resumed"] is False
    assert by_name["session_connect"]["session_id"] == sid
    assert by_name["tool_call"]["outcome"] == "ok"
    assert by_name["budget_spend"]["remaining"] == 0
    assert by_name["budget_exhausted"]["tool"] == "echo"
    assert by_name["rate_limited"]["retry_after_seconds"] == 60
    assert by_name["auth_failure"]["outcome"] == "invalid"
    assert by_name["session_close"]["reason"] == "deleted"
    assert all(r["token_id"] == "agent-1" for r in records if "token_id" in r)
    assert token not in text
    assert token[-32:] not in text
    assert "Bearer" not in text


async def test_metrics_count_sessions_requests_tool_calls_latency_and_refusals(deploy: Deploy) -> None:
    deployment = deploy(rate_limit="1/m", rate_burst=2)
    gw = await deployment.start()
    alice, broke = mint("alice"), mint("broke", budget_limit=0)
    alice_sid, broke_sid = await gw.initialize(alice), await gw.initialize(broke)
    samples = await gw.metrics()
    assert sample(samples, "satgate_active_sessions") == 2
    assert sample(samples, "satgate_sessions_opened_total") == 2

    assert echoed(await gw.call(alice, alice_sid, request_id=1, text="hi"))
    assert "error" in (await gw.call(alice, alice_sid, "fail", request_id=2, code=-32603)).body
    assert refused_for(await gw.call(alice, alice_sid, request_id=3)) == "rate_limited"
    assert refused_for(await gw.call(broke, broke_sid, request_id=1)) == "budget_exhausted"
    assert (await gw.call("not-a-token", alice_sid, request_id=4)).status == 401
    assert await gw.delete(alice, alice_sid) == 200

    samples = await gw.metrics()
    assert sample(samples, "satgate_active_sessions") == 1
    assert sample(samples, "satgate_requests_total", method="tools/call", status="200") == 4
    assert sample(samples, "satgate_requests_total", method="tools/call", status="401") == 1
    assert sample(samples, "satgate_requests_total", method="initialize", status="200") == 2
    assert sample(samples, "satgate_tool_calls_total", upstream="fake", outcome="ok") == 1
    assert sample(samples, "satgate_tool_calls_total", upstream="fake", outcome="error") == 1
    assert sample(samples, "satgate_upstream_latency_seconds_count", upstream="fake", method="tools/call") == 2
    assert sample(samples, "satgate_upstream_latency_seconds_bucket", upstream="fake", method="tools/call",
                  le="+Inf") == 2
    assert sample(samples, "satgate_refusals_total", reason="rate_limited") == 1
    assert sample(samples, "satgate_refusals_total", reason="budget_exhausted") == 1
    assert sample(samples, "satgate_refusals_total", reason="invalid") == 1

    second = await deployment.start(metrics=Metrics())
    assert refused_for(await second.call(broke, broke_sid, request_id=2)) == "budget_exhausted"
    samples = await second.metrics()
    assert sample(samples, "satgate_sessions_resumed_total") == 1
    assert sample(samples, "satgate_sessions_opened_total") == 0
    assert sample(samples, "satgate_active_sessions") == 1
