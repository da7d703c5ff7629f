"""An upstream that closes a call's stream to be polled is resumed at once, whatever its ``retry`` (issue 25).

The upstream's ``retry`` is advice to its client; the gateway's client already waits its own poll interval,
so a gateway that also waited ``retry`` (up to 5 s) before resuming upstream made a client that came back
meanwhile find nothing. A small SEP-1699 server on aiohttp: the call's POST stream carries a priming event
with ``retry: 30000`` and closes; the GET with ``Last-Event-ID`` carries the answer.
"""

from __future__ import annotations

import asyncio
import json

from aiohttp import web
from pytest_aiohttp import AiohttpServer

from satgate_mcp.events import RecordingPublisher
from satgate_mcp.metrics import Metrics
from satgate_mcp.settings import HttpUpstreamSpec
from satgate_mcp.upstream.http import HttpUpstream

SESSION = "polled-session"


def _sse(*events: str) -> bytes:
    return "".join(events).encode()


def polling_server() -> tuple[web.Application, list[str]]:
    resumed: list[str] = []
    answers: dict[str, object] = {}

    async def post(request: web.Request) -> web.StreamResponse:
        message = await request.json()
        if "id" not in message:
            return web.Response(status=202)
        if message["method"] == "initialize":
            result = {"protocolVersion": "2025-11-25", "capabilities": {"tools": {}},
                      "serverInfo": {"name": "polled", "version": "1"}}
            return web.json_response({"jsonrpc": "2.0", "id": message["id"], "result": result},
                                     headers={"Mcp-Session-Id": SESSION})
        answer = {"jsonrpc": "2.0", "id": message["id"], "result": {"content": [], "isError": False}}
        answers["last"] = answer
        return web.Response(body=_sse("id: e1\nretry: 30000\ndata: \n\n"), content_type="text/event-stream")

    async def get(request: web.Request) -> web.StreamResponse:
        last = request.headers.get("Last-Event-ID")
        if last is None:
            return web.Response(status=405)
        resumed.append(last)
        event = f"id: e2\ndata: {json.dumps(answers['last'])}\n\n"
        return web.Response(body=_sse(event), content_type="text/event-stream")

    app = web.Application()
    app.router.add_post("/mcp", post)
    app.router.add_get("/mcp", get)
    app.router.add_delete("/mcp", delete)
    return app, resumed


async def delete(request: web.Request) -> web.Response:
    return web.Response(status=200)


async def _ignore(method: str, params: object) -> None:
    return None


async def test_a_paused_call_stream_is_resumed_upstream_at_once(aiohttp_server: AiohttpServer) -> None:
    app, resumed = polling_server()
    server = await aiohttp_server(app)
    spec = HttpUpstreamSpec(transport="http", url=str(server.make_url("/mcp")), timeout=10.0)
    upstream = HttpUpstream("polled", spec, publisher=RecordingPublisher(), metrics=Metrics(), listen=False)
    await upstream.start(_ignore)
    try:
        assert await upstream.wait_ready(5)
        async with asyncio.timeout(2.0):  # well before the upstream's 30 s retry
            reply = await upstream.request("tools/call", {"name": "t", "arguments": {}})
    finally:
        await upstream.close()
    assert reply["result"] == {"content": [], "isError": False}
    assert resumed == ["e1"]
