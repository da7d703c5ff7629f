"""Hole 3 at the HTTP upstream: what the connection reports about "was the request sent", and so who pays.

A scripted Streamable HTTP server answers ``initialize`` properly and then fails each ``tools/call`` in
one way; the call goes through a real ``HttpUpstream`` and a real ``CallPolicy``. Only a call whose bytes
never left the gateway, or that the upstream refused with -32600/-32601/-32602, is refunded.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from aiohttp import web
from pytest_aiohttp import AiohttpServer

from satgate_mcp.auth.base import Identity
from satgate_mcp.errors import GatewayError, UpstreamUnavailable
from satgate_mcp.events import RecordingPublisher
from satgate_mcp.jsonrpc import JsonObj
from satgate_mcp.metrics import Metrics
from satgate_mcp.policy.engine import CallPolicy
from satgate_mcp.policy.refunds import FailureKind, failure_kind
from satgate_mcp.settings import HttpUpstreamSpec
from satgate_mcp.upstream import http_channel
from satgate_mcp.upstream.base import UPSTREAM_PROTOCOL_VERSION
from satgate_mcp.upstream.http import HttpUpstream
from tests.policy.helpers import settings

AGENT = Identity("agent", budget_limit=10)
Behaviour = Callable[[web.Request, JsonObj], Awaitable[web.StreamResponse]]


def rpc_reply(message: JsonObj, **body: object) -> web.Response:
    return web.json_response({"jsonrpc": "2.0", "id": message["id"], **body})


async def http_500_text(request: web.Request, message: JsonObj) -> web.StreamResponse:
    return web.Response(status=500, text="internal trouble")


async def http_400_text(request: web.Request, message: JsonObj) -> web.StreamResponse:
    return web.Response(status=400, text="bad")


async def reset_after_request(request: web.Request, message: JsonObj) -> web.StreamResponse:
    assert request.transport is not None
    request.transport.abort()  # the request arrived whole; the connection dies before any answer
    return web.Response()


async def no_reply(request: web.Request, message: JsonObj) -> web.StreamResponse:
    return web.Response(status=200, content_type="application/json", body=b"")


async def stream_closed_without_reply(request: web.Request, message: JsonObj) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    await response.write(b": still thinking\n\n")
    return response


async def over_size(request: web.Request, message: JsonObj) -> web.StreamResponse:
    return rpc_reply(message, result={"content": [{"type": "text", "text": "x" * 4096}]})


async def invalid_params(request: web.Request, message: JsonObj) -> web.StreamResponse:
    return rpc_reply(message, error={"code": -32602, "message": "no such argument"})


async def server_error_answer(request: web.Request, message: JsonObj) -> web.StreamResponse:
    return rpc_reply(message, error={"code": -32603, "message": "tool crashed"})


async def result(request: web.Request, message: JsonObj) -> web.StreamResponse:
    return rpc_reply(message, result={"content": []})


def scripted_upstream(behaviour: Behaviour) -> web.Application:
    async def mcp(request: web.Request) -> web.StreamResponse:
        message = json.loads(await request.read())
        if "id" not in message:
            return web.Response(status=202)
        if message["method"] == "initialize":
            return web.json_response({"jsonrpc": "2.0", "id": message["id"], "result": {
                "protocolVersion": UPSTREAM_PROTOCOL_VERSION, "capabilities": {"tools": {}},
                "serverInfo": {"name": "scripted", "version": "1"}}}, headers={"Mcp-Session-Id": "up-1"})
        return await behaviour(request, message)

    async def delete(request: web.Request) -> web.Response:
        return web.Response(status=204)

    app = web.Application()
    app.router.add_post("/mcp", mcp)
    app.router.add_delete("/mcp", delete)
    return app


async def notify(method: str, params: JsonObj | None) -> None:
    return None


@pytest.fixture
async def policy() -> AsyncIterator[CallPolicy]:
    p = CallPolicy.from_settings(settings(), publisher=RecordingPublisher(), metrics=Metrics())
    yield p
    await p.close()


async def call_through(policy: CallPolicy, upstream: HttpUpstream) -> tuple[JsonObj | None, BaseException | None]:
    admission = await policy.admit(AGENT, method="tools/call", tool="echo", session_id="s", request_id=1,
                                   params={"name": "echo"})
    try:
        return await policy.run(admission, lambda: upstream.request("tools/call", {"name": "echo"})), None
    except GatewayError as exc:
        return None, exc


async def started(server_url: str, timeout: float = 5.0) -> HttpUpstream:
    spec = HttpUpstreamSpec(transport="http", url=server_url, headers={}, timeout=timeout)
    upstream = HttpUpstream("scripted", spec, publisher=RecordingPublisher(), metrics=Metrics(), listen=False)
    await upstream.start(notify)
    return upstream


@pytest.mark.parametrize(("behaviour", "kind", "remaining"), [
    pytest.param(http_500_text, FailureKind.LOST_AFTER_SENDING, 9, id="non-json-500-charged"),
    pytest.param(http_400_text, FailureKind.LOST_AFTER_SENDING, 9, id="non-json-400-charged"),
    pytest.param(reset_after_request, FailureKind.LOST_AFTER_SENDING, 9, id="reset-after-sending-charged"),
    pytest.param(no_reply, FailureKind.LOST_AFTER_SENDING, 9, id="missing-reply-charged"),
    pytest.param(stream_closed_without_reply, FailureKind.LOST_AFTER_SENDING, 9, id="stream-ended-unanswered-charged"),
    pytest.param(over_size, FailureKind.LOST_AFTER_SENDING, 9, id="over-size-answer-charged"),
    pytest.param(server_error_answer, FailureKind.ANSWERED, 9, id="json-rpc-32603-charged"),
    pytest.param(result, FailureKind.ANSWERED, 9, id="result-charged"),
    pytest.param(invalid_params, FailureKind.REFUSED_UNRUN, 10, id="json-rpc-32602-refunded"),
])
async def test_attack_http_failures_after_the_request_was_sent_stay_charged(
        aiohttp_server: AiohttpServer, policy: CallPolicy, monkeypatch: pytest.MonkeyPatch,
        behaviour: Behaviour, kind: FailureKind, remaining: int) -> None:
    monkeypatch.setattr(http_channel, "MAX_BODY", 1024)
    server = await aiohttp_server(scripted_upstream(behaviour))
    upstream = await started(str(server.make_url("/mcp")))
    try:
        assert await upstream.wait_ready(5)
        reply, failure = await call_through(policy, upstream)
    finally:
        await upstream.close()
    assert failure_kind(reply, failure) is kind
    assert (await policy.budget_status(AGENT))["remaining"] == remaining


async def test_a_call_to_an_upstream_that_refuses_connections_was_never_sent_and_is_refunded(
        aiohttp_server: AiohttpServer, policy: CallPolicy) -> None:
    server = await aiohttp_server(scripted_upstream(result))
    upstream = await started(str(server.make_url("/mcp")))
    try:
        assert await upstream.wait_ready(5)
        await server.close()  # nothing listens any more: the connect fails, no byte of the call goes out
        reply, failure = await call_through(policy, upstream)
    finally:
        await upstream.close()
    assert isinstance(failure, UpstreamUnavailable)
    assert failure_kind(reply, failure) is FailureKind.NOT_SENT
    assert (await policy.budget_status(AGENT))["remaining"] == 10


async def test_a_call_while_the_handshake_cannot_complete_was_never_sent(policy: CallPolicy) -> None:
    upstream = await started("http://127.0.0.1:9/mcp", timeout=1.0)  # discard port: nothing answers
    try:
        reply, failure = await call_through(policy, upstream)
    finally:
        await upstream.close()
    assert failure_kind(reply, failure) is FailureKind.NOT_SENT
    assert (await policy.budget_status(AGENT))["remaining"] == 10


async def test_an_upstream_timeout_after_sending_stays_charged(
        aiohttp_server: AiohttpServer, policy: CallPolicy) -> None:
    release = asyncio.Event()

    async def hang(request: web.Request, message: JsonObj) -> web.StreamResponse:
        await release.wait()
        return rpc_reply(message, result={})

    server = await aiohttp_server(scripted_upstream(hang))
    upstream = await started(str(server.make_url("/mcp")), timeout=0.5)
    try:
        assert await upstream.wait_ready(5)
        reply, failure = await call_through(policy, upstream)
    finally:
        release.set()
        await upstream.close()
    assert failure_kind(reply, failure) is FailureKind.TIMEOUT
    assert (await policy.budget_status(AGENT))["remaining"] == 9
