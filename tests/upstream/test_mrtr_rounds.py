"""An upstream's timeout bounds each round of a call, not the time its client takes to answer (issue 12).

A 2025 upstream that asks its client something mid-call (``relay_elicit``) waits for a person: with a 2026
client that is a whole MRTR round trip (``input_required``, the client's retry). The upstream's timeout stops
while the question is open and starts again, whole, once it is answered; an upstream that then takes too long
still times out. Real upstreams (tests/upstream_server.py) over stdio and over Streamable HTTP.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable

import pytest

from satgate_mcp.errors import UpstreamTimeout
from satgate_mcp.events import RecordingPublisher
from satgate_mcp.jsonrpc import JsonObj
from satgate_mcp.metrics import Metrics
from satgate_mcp.settings import HttpUpstreamSpec, StdioUpstreamSpec
from satgate_mcp.upstream.base import Upstream
from satgate_mcp.upstream.http import HttpUpstream
from satgate_mcp.upstream.stdio import StdioUpstream
from tests.conftest import HttpUpstreamProcess, upstream_command

pytestmark = pytest.mark.process

#: The upstream's timeout, and the client's time to answer: longer than the whole timeout.
TIMEOUT = 0.5
THINK = 1.2


class ThinkingClient:
    """A client that takes ``THINK`` seconds to answer each question it is asked (a person at a form)."""

    session_key = "s"

    def __init__(self) -> None:
        self.asked: list[str] = []

    async def __call__(self, params: JsonObj) -> None:
        return None

    def admit(self) -> None:
        return None

    async def notify(self, method: str, params: JsonObj | None) -> None:
        return None

    def lacks(self, method: str, params: JsonObj | None) -> JsonObj | None:
        return None

    def log_level(self) -> str | None:
        return None

    async def ask(self, method: str, params: JsonObj | None, timeout: float) -> JsonObj:
        self.asked.append(method)
        await asyncio.sleep(THINK)  # the client's think time is the subject here, not something to await
        return {"jsonrpc": "2.0", "id": None, "result": {"action": "accept", "content": {"answer": "late"}}}


async def _noop(method: str, params: JsonObj | None) -> None:
    return None


@pytest.fixture(params=["stdio", "http"])
async def upstream(request: pytest.FixtureRequest,
                   http_upstream_factory: Callable[..., HttpUpstreamProcess]) -> AsyncIterator[Upstream]:
    made: Upstream
    if request.param == "http":
        server = http_upstream_factory("--name", "slow-answers")
        made = HttpUpstream("u", HttpUpstreamSpec(transport="http", url=server.url, timeout=TIMEOUT),
                            publisher=RecordingPublisher(), metrics=Metrics())
    else:
        made = StdioUpstream("u", StdioUpstreamSpec(transport="stdio", command=upstream_command(), timeout=TIMEOUT),
                             publisher=RecordingPublisher(), metrics=Metrics())
    await made.start(_noop)
    try:
        assert await made.wait_ready(20)
        yield made
    finally:
        await made.close()


async def test_a_client_slower_than_the_upstreams_timeout_still_completes_the_call(upstream: Upstream) -> None:
    client = ThinkingClient()
    reply = await upstream.request("tools/call", {"name": "relay_elicit", "arguments": {"question": "sure?"}},
                                   on_progress=client, timeout=TIMEOUT)
    assert client.asked == ["elicitation/create"]
    assert json.loads(reply["result"]["content"][0]["text"]) == {"action": "accept", "content": {"answer": "late"}}


async def test_an_upstream_that_takes_too_long_on_its_own_still_times_out(upstream: Upstream) -> None:
    started = time.monotonic()
    with pytest.raises(UpstreamTimeout):
        await upstream.request("tools/call", {"name": "hang", "arguments": {}}, on_progress=ThinkingClient(),
                               timeout=TIMEOUT)
    assert time.monotonic() - started < THINK  # nothing was asked, so nothing held the clock
