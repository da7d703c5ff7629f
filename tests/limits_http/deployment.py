"""What the limits-over-HTTP tests run on: rate limits, budgets, refunds, the duplicate guard, events and
metrics are each checked over real HTTP (``aiohttp_client``) against a real ``CallPolicy``.

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
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestClient
from multidict import CIMultiDictProxy
from prometheus_client.parser import text_string_to_metric_families
from pytest_aiohttp import AiohttpClient

from satgate_mcp import jsonrpc
from satgate_mcp.app import create_app
from satgate_mcp.auth.header import MacaroonAuthenticator
from satgate_mcp.auth.macaroons import mint_token, verify_token
from satgate_mcp.errors import UpstreamUnavailable
from satgate_mcp.events import RecordingPublisher
from satgate_mcp.jsonrpc import JsonObj, RequestId
from satgate_mcp.metrics import Metrics
from satgate_mcp.policy.engine import CallPolicy
from satgate_mcp.settings import Settings
from satgate_mcp.upstream.base import ProgressCallback
from tests.answers import decode_answer
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
            return Answer(resp.status, resp.headers, decode_answer(resp.content_type, text))

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
        policy = CallPolicy.from_settings(self.settings, publisher=self.publisher, metrics=metrics, clock=self.clock,
                                          budgets=self.policy._budgets, duplicates=self.policy._duplicates,
                                          rate_limiter=self.policy._limiter)
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
