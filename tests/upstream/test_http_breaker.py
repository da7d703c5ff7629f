"""The circuit breaker through the gateway: an HTTP upstream that answers 503, and one that is stopped.

After ``failures`` failures in a row the next calls fail at once without reaching the upstream (its own request
count says so, not a stopwatch); after the backoff (an injected clock, moved by hand) one probe goes while every
other call keeps failing fast; a failed probe reopens for longer, an answer closes it. ``/readyz`` and
``/metrics`` show the state as it moves.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient
from prometheus_client.parser import text_string_to_metric_families
from pytest_aiohttp import AiohttpClient, AiohttpServer

from satgate_mcp import jsonrpc
from satgate_mcp.app import create_app
from satgate_mcp.events import RecordingPublisher
from satgate_mcp.jsonrpc import JsonObj
from satgate_mcp.metrics import Metrics
from satgate_mcp.settings import Settings
from satgate_mcp.upstream.base import UPSTREAM_PROTOCOL_VERSION
from satgate_mcp.upstream.pool import UpstreamPool
from tests.answers import read_answer
from tests.conftest import HttpUpstreamProcess
from tests.fakes import FakeClock

TOKEN = "breaker-static-token-0123456789abcdef"
VERSION = "2025-11-25"
#: Three failures open the circuit for 10 s, then 20 s, ... capped at 40 s; no jitter, so the hint is exact.
BREAKER = {"failures": 3, "backoff": 10, "max_backoff": 40, "jitter": 0}

Client = TestClient[web.Request, web.Application]


@dataclass
class Flaky:
    """An MCP upstream (initialize, tools/list with ``echo``) whose ``tools/call`` answers as ``mode`` says:
    ``503``, ``ok``, or ``hold`` (waits for ``release``). ``calls`` counts the calls that reached it."""

    mode: str = "503"
    calls: int = 0
    arrived: asyncio.Event = field(default_factory=asyncio.Event)
    release: asyncio.Event = field(default_factory=asyncio.Event)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/mcp", self._post)
        app.router.add_delete("/mcp", self._delete)
        return app

    async def _delete(self, request: web.Request) -> web.Response:
        return web.Response(status=204)

    async def _post(self, request: web.Request) -> web.StreamResponse:
        message = json.loads(await request.read())
        if "id" not in message:
            return web.Response(status=202)
        method = message["method"]
        if method == "initialize":
            return self._reply(message, {"protocolVersion": UPSTREAM_PROTOCOL_VERSION, "capabilities": {"tools": {}},
                                         "serverInfo": {"name": "flaky", "version": "1"}})
        if method == "tools/list":
            return self._reply(message, {"tools": [{"name": "echo", "inputSchema": {"type": "object"}}]})
        self.calls += 1
        self.arrived.set()
        if self.mode == "hold":
            await self.release.wait()
        if self.mode == "503":
            return web.Response(status=503, text="overloaded")
        return self._reply(message, {"content": [{"type": "text", "text": "ok"}]})

    @staticmethod
    def _reply(message: JsonObj, result: JsonObj) -> web.Response:
        return web.json_response({"jsonrpc": "2.0", "id": message["id"], "result": result},
                                 headers={"Mcp-Session-Id": "flaky-1"})


@dataclass
class Gateway:
    client: Client
    session: str
    clock: FakeClock
    calls: int = 0

    async def call(self) -> JsonObj:
        self.calls += 1
        body = jsonrpc.request_message(self.calls + 1, "tools/call", {"name": "echo", "arguments": {}})
        resp = await self.client.post("/mcp", data=json.dumps(body), headers=headers(self.session))
        assert resp.status == 200
        answer: JsonObj = await read_answer(resp)
        return answer

    async def readyz(self) -> tuple[int, Any]:
        resp = await self.client.get("/readyz")
        return resp.status, await resp.json()

    async def metric(self, name: str, upstream: str) -> float:
        text = await (await self.client.get("/metrics")).text()
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == name and sample.labels.get("upstream") == upstream:
                    return float(sample.value)
        return 0.0


def headers(session: str | None) -> dict[str, str]:
    sent = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json",
            "Accept": "application/json, text/event-stream", "MCP-Protocol-Version": VERSION}
    if session is not None:
        sent["Mcp-Session-Id"] = session
    return sent


StartGateway = Callable[[str], Awaitable["Gateway"]]


@pytest.fixture
def gateway_for(aiohttp_client: AiohttpClient) -> StartGateway:
    async def start(url: str) -> Gateway:
        spec = {"transport": "http", "url": url, "timeout": 5, "breaker": BREAKER}
        settings = Settings.model_validate({"auth_mode": "config", "static_token": TOKEN, "state_dir": "memory",
                                            "upstreams": {"flaky": spec}})
        clock, metrics, publisher = FakeClock(), Metrics(), RecordingPublisher()
        pool = UpstreamPool(settings.upstreams, publisher=publisher, metrics=metrics, clock=clock)
        client = await aiohttp_client(create_app(settings, pool=pool, publisher=publisher, metrics=metrics))
        body = jsonrpc.request_message(1, "initialize", {"protocolVersion": VERSION, "capabilities": {},
                                                         "clientInfo": {"name": "t", "version": "1"}})
        resp = await client.post("/mcp", data=json.dumps(body), headers=headers(None))
        assert resp.status == 200
        return Gateway(client, resp.headers["Mcp-Session-Id"], clock)

    return start


def error_data(answer: JsonObj) -> JsonObj:
    assert "error" in answer, answer
    data: JsonObj = answer["error"]["data"]
    return data


def fast_failure(answer: JsonObj, retry: int) -> bool:
    return error_data(answer) == {"error": "upstream_unavailable", "upstream": "flaky", "circuit": "open",
                                  "retry_after_seconds": retry}


async def test_an_upstream_answering_503_is_left_alone_after_three_failures_and_probed_once_after_the_backoff(
        aiohttp_server: AiohttpServer, gateway_for: StartGateway) -> None:
    flaky = Flaky()
    server = await aiohttp_server(flaky.app())
    gw = await gateway_for(str(server.make_url("/mcp")))

    for _ in range(3):
        assert error_data(await gw.call())["status"] == 503
    assert flaky.calls == 3
    assert await gw.metric("satgate_upstream_circuit_state", "flaky") == 1

    for _ in range(5):  # open: refused at once, the upstream hears nothing
        assert fast_failure(await gw.call(), retry=10)
    assert flaky.calls == 3
    assert await gw.metric("satgate_upstream_circuit_fast_failures_total", "flaky") == 5
    status, ready = await gw.readyz()
    assert status == 503
    assert ready["circuits"]["flaky"] == {"state": "open", "retry_in": 10.0}
    assert ready["down"]["flaky"]["status"].startswith("circuit open")

    gw.clock.advance(10)  # the backoff is over: one probe, still 503: open again, for twice as long
    assert error_data(await gw.call())["status"] == 503
    assert flaky.calls == 4
    assert fast_failure(await gw.call(), retry=20)
    assert flaky.calls == 4

    flaky.mode = "hold"  # the upstream recovers; while the probe is out, every other call still fails fast
    gw.clock.advance(20)
    flaky.arrived.clear()
    probe = asyncio.ensure_future(gw.call())
    await flaky.arrived.wait()
    assert await gw.metric("satgate_upstream_circuit_state", "flaky") == 2
    assert (await gw.readyz())[1]["circuits"]["flaky"] == {"state": "half_open"}
    assert fast_failure(await gw.call(), retry=1)
    assert flaky.calls == 5
    flaky.release.set()
    assert (await probe)["result"]["content"][0]["text"] == "ok"

    assert await gw.metric("satgate_upstream_circuit_state", "flaky") == 0
    assert (await gw.call())["result"]["content"][0]["text"] == "ok"  # closed: calls go again
    assert flaky.calls == 6
    status, ready = await gw.readyz()
    assert (status, ready["status"], ready["circuits"]) == (200, "ready", {"flaky": {"state": "closed"}})


async def test_json_rpc_errors_and_4xx_never_open_the_circuit(aiohttp_server: AiohttpServer,
                                                              gateway_for: StartGateway) -> None:
    """The upstream answered: that it said no is not a fault of the upstream."""
    flaky = Flaky(mode="ok")
    server = await aiohttp_server(flaky.app())
    gw = await gateway_for(str(server.make_url("/mcp")))
    flaky.mode = "503"
    for _ in range(2):
        await gw.call()
    flaky.mode = "ok"  # an answer between failures: the run starts again
    await gw.call()
    flaky.mode = "503"
    for _ in range(2):
        await gw.call()
    assert await gw.metric("satgate_upstream_circuit_state", "flaky") == 0
    assert flaky.calls == 5


@pytest.mark.process
async def test_a_stopped_upstream_fails_fast_after_three_refusals_and_a_probe_closes_it_once_it_is_back(
        gateway_for: StartGateway) -> None:
    server = HttpUpstreamProcess("--name", "web").start()
    try:
        gw = await gateway_for(server.url)
        assert "error" not in await gw.call()
        server.stop()  # connection refused from now on
        for _ in range(3):
            data = error_data(await gw.call())
            assert data["error"] == "upstream_unavailable"
            assert "circuit" not in data
        assert fast_failure(await gw.call(), retry=10)
        assert await gw.metric("satgate_upstream_circuit_fast_failures_total", "flaky") == 1
        assert (await gw.readyz())[1]["circuits"]["flaky"]["state"] == "open"

        await server.arestart()  # back on the same port
        gw.clock.advance(10)  # (or its reconnect got through first: either way the next call is the probe)
        answer = await gw.call()
        assert answer["result"]["content"][0]["type"] == "text", answer
        assert (await gw.readyz())[1]["circuits"]["flaky"] == {"state": "closed"}
        assert await gw.metric("satgate_upstream_circuit_state", "flaky") == 0
    finally:
        server.stop()
