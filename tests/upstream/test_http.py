"""A real MCP server (official SDK) behind Streamable HTTP: SSE and JSON answers, sessions, credentials."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator, Awaitable, Callable

import aiohttp
import pytest

from satgate_mcp import events
from satgate_mcp.errors import UpstreamTimeout, UpstreamUnavailable
from satgate_mcp.events import RecordingPublisher
from satgate_mcp.jsonrpc import JsonObj
from satgate_mcp.metrics import Metrics
from satgate_mcp.settings import HttpUpstreamSpec
from satgate_mcp.upstream.base import UPSTREAM_READY
from satgate_mcp.upstream.http import HttpUpstream
from tests.conftest import HttpUpstreamProcess

pytestmark = pytest.mark.process

READY = 20.0

StartUpstream = Callable[..., Awaitable[HttpUpstream]]


class Recorder:
    def __init__(self) -> None:
        self.notifications: list[str] = []
        self.changed = asyncio.Condition()
        self.progress: list[JsonObj] = []
        self.first_progress = asyncio.Event()

    async def on_notification(self, method: str, params: JsonObj | None) -> None:
        async with self.changed:
            self.notifications.append(method)
            self.changed.notify_all()

    async def on_progress(self, params: JsonObj) -> None:
        self.progress.append(params)
        self.first_progress.set()

    async def wait_for(self, method: str, count: int) -> None:
        async with asyncio.timeout(10), self.changed:
            await self.changed.wait_for(lambda: self.notifications.count(method) >= count)


@pytest.fixture
def publisher() -> RecordingPublisher:
    return RecordingPublisher()


@pytest.fixture
async def start_upstream(publisher: RecordingPublisher) -> AsyncIterator[StartUpstream]:
    started: list[HttpUpstream] = []

    async def start(url: str, *, headers: dict[str, str] | None = None, timeout: float = 10.0,
                    recorder: Recorder | None = None, listen: bool = True, wait: bool = True) -> HttpUpstream:
        spec = HttpUpstreamSpec(transport="http", url=url, headers=headers or {}, timeout=timeout)
        upstream = HttpUpstream("web", spec, publisher=publisher, metrics=Metrics(), listen=listen)
        started.append(upstream)
        await upstream.start((recorder or Recorder()).on_notification)
        if wait:
            assert await upstream.wait_ready(READY)
        return upstream

    yield start
    await asyncio.gather(*(u.close() for u in started))


async def call(upstream: HttpUpstream, tool: str, **arguments: object) -> JsonObj:
    return await upstream.request("tools/call", {"name": tool, "arguments": arguments})


def text_of(reply: JsonObj) -> str:
    return str(reply["result"]["content"][0]["text"])


async def cancellations(upstream: HttpUpstream, more_than: int = -1) -> int:
    """How many cancellations the (shared) server saw, asking again (bounded) until it is more than before."""
    for _ in range(50):
        seen = int(json.loads(text_of(await call(upstream, "cancelled_count")))["cancelled"])
        if seen > more_than:
            break
    return seen


async def test_initialize_list_call_and_progress_over_sse(
    http_upstream: HttpUpstreamProcess, start_upstream: StartUpstream
) -> None:
    upstream = await start_upstream(http_upstream.url)
    recorder = Recorder()

    assert upstream.session_id
    assert upstream.initialize_result is not None
    assert upstream.initialize_result["serverInfo"]["name"] == "web"
    listed = await upstream.request("tools/list", None)
    assert "echo" in [t["name"] for t in listed["result"]["tools"]]
    replies = await asyncio.gather(*(call(upstream, "echo", text=f"m{i}") for i in range(10)))
    assert [text_of(r) for r in replies] == [f"m{i}" for i in range(10)]
    params = {"name": "slow", "arguments": {"steps": 3, "delay": 0.01}, "_meta": {"progressToken": "mine"}}
    reply = await upstream.request("tools/call", params, on_progress=recorder.on_progress)
    assert text_of(reply) == "done 3"
    assert [(p["progressToken"], p["progress"]) for p in recorder.progress] == [("mine", 1), ("mine", 2),
                                                                                 ("mine", 3)]


async def test_configured_headers_arrive_and_client_credentials_never_do(
    http_upstream: HttpUpstreamProcess, start_upstream: StartUpstream
) -> None:
    upstream = await start_upstream(http_upstream.url, headers={"X-Api-Key": "upstream-key"})

    seen = json.loads(text_of(await upstream.request(
        "tools/call", {"name": "headers", "arguments": {}, "_meta": {"token": "client-bearer"}})))
    meta = json.loads(text_of(await upstream.request(
        "tools/call", {"name": "seen_meta", "arguments": {}, "_meta": {"token": "client-bearer", "k": 1}})))

    assert seen["x-api-key"] == "upstream-key"
    assert "authorization" not in seen
    assert seen["mcp-protocol-version"] == "2025-11-25"
    assert seen["mcp-session-id"] == upstream.session_id
    assert "client-bearer" not in json.dumps(seen)
    assert meta == {"k": 1}


async def test_plain_json_answers_work_too(
    http_upstream_factory: Callable[..., HttpUpstreamProcess], start_upstream: StartUpstream
) -> None:
    server = http_upstream_factory("--json-response")
    upstream = await start_upstream(server.url)

    assert text_of(await call(upstream, "echo", text="json")) == "json"
    assert text_of(await call(upstream, "add", a=1, b=1)) == "2"


async def test_an_expired_session_is_renewed_and_the_call_retried_once(
    http_upstream_factory: Callable[..., HttpUpstreamProcess], start_upstream: StartUpstream,
    publisher: RecordingPublisher,
) -> None:
    server = http_upstream_factory("--name", "phoenix")
    # Without the GET stream nothing notices the restart before the next call does.
    upstream = await start_upstream(server.url, listen=False)
    old_session = upstream.session_id
    assert text_of(await call(upstream, "whoami")) == "phoenix"

    await server.arestart()  # same port; the new process knows no session

    assert text_of(await call(upstream, "echo", text="still here")) == "still here"
    assert upstream.session_id not in (None, old_session)
    assert [e["reason"] for e in publisher.named(events.UPSTREAM_RESTART)] == ["session expired (HTTP 404)"]


async def test_a_restarted_server_is_noticed_on_the_notification_stream(
    http_upstream_factory: Callable[..., HttpUpstreamProcess], start_upstream: StartUpstream
) -> None:
    server = http_upstream_factory()
    recorder = Recorder()
    upstream = await start_upstream(server.url, recorder=recorder)

    await server.arestart()

    # A fresh session and a relisting hint, without any call having been made.
    await recorder.wait_for(UPSTREAM_READY, 2)
    assert upstream.ready
    assert text_of(await call(upstream, "echo", text="x")) == "x"


async def test_timeout_and_cancellation_are_sent_upstream(
    http_upstream: HttpUpstreamProcess, start_upstream: StartUpstream
) -> None:
    upstream = await start_upstream(http_upstream.url)
    before = await cancellations(upstream)

    with pytest.raises(UpstreamTimeout):
        await upstream.request("tools/call", {"name": "hang", "arguments": {}}, timeout=0.3)
    assert await cancellations(upstream, before) == before + 1

    recorder = Recorder()
    params = {"name": "slow", "arguments": {"steps": 1000, "delay": 0.05}, "_meta": {"progressToken": 9}}
    task = asyncio.create_task(upstream.request("tools/call", params, on_progress=recorder.on_progress))
    await asyncio.wait_for(recorder.first_progress.wait(), 10)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await cancellations(upstream, before + 1) == before + 2


async def test_notifications_arrive_on_responses_and_on_the_get_stream(
    http_upstream: HttpUpstreamProcess, start_upstream: StartUpstream
) -> None:
    recorder = Recorder()
    upstream = await start_upstream(http_upstream.url, recorder=recorder)
    await recorder.wait_for(UPSTREAM_READY, 1)  # the hint after initialize

    await call(upstream, "add_tool", name="on_response")
    await recorder.wait_for("notifications/tools/list_changed", 1)
    await call(upstream, "add_tool", name="on_stream", standalone=True)
    await recorder.wait_for("notifications/tools/list_changed", 2)

    assert text_of(await call(upstream, "ask_client", method="ping")) == "pong"


async def test_an_unreachable_server_is_unavailable_not_a_crash(start_upstream: StartUpstream) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound but never listening: connections are refused
        upstream = await start_upstream(f"http://127.0.0.1:{port}/mcp", wait=False)

        with pytest.raises(UpstreamUnavailable, match="cannot reach"):
            await call(upstream, "echo", text="x")
        assert not upstream.ready


async def test_an_unreachable_server_is_known_down_so_start_up_stops_waiting_for_it(
        start_upstream: StartUpstream) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound but never listening: connections are refused
        upstream = await start_upstream(f"http://127.0.0.1:{port}/mcp", wait=False)

        # Settles on the first refused connection (the bound only guards the test), not after a start-up timeout.
        async with asyncio.timeout(10):
            assert await upstream.wait_settled(60.0) is False
        failure = upstream.last_failure
        assert failure is not None
        assert failure["status"].startswith(f"cannot reach upstream {upstream.name!r}")


async def test_close_deletes_the_upstream_session(
    http_upstream: HttpUpstreamProcess, start_upstream: StartUpstream
) -> None:
    upstream = await start_upstream(http_upstream.url)
    session_id = upstream.session_id
    assert session_id is not None

    await upstream.close()

    headers = {"Mcp-Session-Id": session_id, "MCP-Protocol-Version": "2025-06-18",
               "Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
    async with aiohttp.ClientSession() as http, http.post(
        http_upstream.url, json={"jsonrpc": "2.0", "id": 1, "method": "ping"}, headers=headers
    ) as resp:
        assert resp.status == 404
