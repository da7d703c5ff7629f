"""A real MCP server (official SDK) as a stdio child: multiplexing, progress, timeouts, crashes."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
import pytest_asyncio
import structlog

from satgate_mcp import events
from satgate_mcp.errors import UpstreamTimeout, UpstreamUnavailable
from satgate_mcp.events import RecordingPublisher
from satgate_mcp.jsonrpc import JsonObj
from satgate_mcp.metrics import Metrics
from satgate_mcp.settings import StdioUpstreamSpec
from satgate_mcp.upstream.base import UPSTREAM_READY
from satgate_mcp.upstream.stdio import StdioUpstream
from tests.conftest import pid_alive, upstream_command

READY = 20.0

StartUpstream = Callable[..., Awaitable[StdioUpstream]]


class Recorder:
    def __init__(self) -> None:
        self.notifications: list[str] = []
        self.progress: list[JsonObj] = []
        self.first_progress = asyncio.Event()

    async def on_notification(self, method: str, params: JsonObj | None) -> None:
        self.notifications.append(method)

    async def on_progress(self, params: JsonObj) -> None:
        self.progress.append(params)
        self.first_progress.set()


# One event loop per module, so tests that do not change the child's state can share one child.
pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.process]


@pytest.fixture
def publisher() -> RecordingPublisher:
    return RecordingPublisher()


@pytest.fixture
def metrics() -> Metrics:
    return Metrics()


def make(*args: str, timeout: float = 10.0, publisher: RecordingPublisher | None = None,
         metrics: Metrics | None = None) -> StdioUpstream:
    spec = StdioUpstreamSpec(transport="stdio", command=upstream_command(*args), timeout=timeout)
    return StdioUpstream("kid", spec, publisher=publisher or RecordingPublisher(), metrics=metrics or Metrics())


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def shared() -> AsyncIterator[StdioUpstream]:
    """One child for the tests that only call it; its cancellation counters only grow."""
    upstream = make("--name", "alpha")
    await upstream.start(Recorder().on_notification)
    assert await upstream.wait_ready(READY)
    yield upstream
    await upstream.close()


@pytest_asyncio.fixture(loop_scope="module")
async def start_upstream(publisher: RecordingPublisher, metrics: Metrics) -> AsyncIterator[StartUpstream]:
    started: list[StdioUpstream] = []

    async def start(*args: str, timeout: float = 10.0, recorder: Recorder | None = None) -> StdioUpstream:
        upstream = make(*args, timeout=timeout, publisher=publisher, metrics=metrics)
        started.append(upstream)
        await upstream.start((recorder or Recorder()).on_notification)
        assert await upstream.wait_ready(READY)
        return upstream

    yield start
    await asyncio.gather(*(u.close() for u in started))


async def call(upstream: StdioUpstream, tool: str, **arguments: object) -> JsonObj:
    reply = await upstream.request("tools/call", {"name": tool, "arguments": arguments})
    return reply


def text_of(reply: JsonObj) -> str:
    return str(reply["result"]["content"][0]["text"])


async def cancellations(upstream: StdioUpstream) -> JsonObj:
    seen: JsonObj = json.loads(text_of(await call(upstream, "cancelled_count")))
    return seen


async def more_cancellations(upstream: StdioUpstream, than: int) -> JsonObj:
    """What the upstream recorded about cancellations, asking again (bounded) until it saw more than before."""
    for _ in range(50):
        seen = await cancellations(upstream)
        if seen["cancelled"] > than:
            break
    return seen


async def test_initialize_list_and_call(shared: StdioUpstream) -> None:
    assert shared.ready
    assert shared.initialize_result is not None
    assert shared.initialize_result["serverInfo"]["name"] == "alpha"
    listed = await shared.request("tools/list", None)
    assert "echo" in [t["name"] for t in listed["result"]["tools"]]
    assert text_of(await call(shared, "echo", text="hello")) == "hello"
    assert text_of(await call(shared, "add", a=2, b=3)) == "5"


async def test_concurrent_calls_run_concurrently_and_map_back_to_their_callers(shared: StdioUpstream) -> None:
    # 20 calls that each take 0.2 s: serially 4 s, concurrently well under the 3 s timeout.
    slow = [shared.request("tools/call", {"name": "slow", "arguments": {"steps": 1, "delay": 0.2}},
                           timeout=3.0) for _ in range(20)]
    echoes = [call(shared, "echo", text=f"message {i}") for i in range(20)]
    replies = await asyncio.gather(*slow, *echoes)

    assert [text_of(r) for r in replies[:20]] == ["done 1"] * 20
    assert [text_of(r) for r in replies[20:]] == [f"message {i}" for i in range(20)]


async def test_progress_reaches_the_caller_under_its_own_token(shared: StdioUpstream) -> None:
    first, second = Recorder(), Recorder()

    # Two callers chose the same token; each must see only its own progress, in order.
    params = {"name": "slow", "arguments": {"steps": 3, "delay": 0.01}, "_meta": {"progressToken": "same"}}
    replies = await asyncio.gather(
        shared.request("tools/call", params, on_progress=first.on_progress),
        shared.request("tools/call", {**params, "arguments": {"steps": 2, "delay": 0.01}},
                       on_progress=second.on_progress),
    )

    assert [text_of(r) for r in replies] == ["done 3", "done 2"]
    assert [(p["progressToken"], p["progress"]) for p in first.progress] == [("same", 1), ("same", 2), ("same", 3)]
    assert [(p["progressToken"], p["progress"]) for p in second.progress] == [("same", 1), ("same", 2)]


async def test_the_clients_token_never_reaches_the_upstream(shared: StdioUpstream) -> None:
    reply = await shared.request(
        "tools/call", {"name": "seen_meta", "arguments": {}, "_meta": {"token": "bearer-secret", "trace": "t1"}})

    assert json.loads(text_of(reply)) == {"trace": "t1"}


async def test_a_timeout_fails_the_call_and_cancels_it_upstream(shared: StdioUpstream) -> None:
    before = await cancellations(shared)

    with pytest.raises(UpstreamTimeout, match=r"within 0\.3s"):
        await shared.request("tools/call", {"name": "hang", "arguments": {}}, timeout=0.3)

    seen = await more_cancellations(shared, than=before["cancelled"])
    assert seen["cancelled"] == before["cancelled"] + 1
    assert seen["hang_interrupted"] == before["hang_interrupted"] + 1
    assert isinstance(seen["request_ids"][-1], int)  # the gateway's id, not a client's


async def test_cancelling_the_awaiting_task_cancels_the_call_upstream(shared: StdioUpstream) -> None:
    before = await cancellations(shared)
    recorder = Recorder()
    params = {"name": "slow", "arguments": {"steps": 1000, "delay": 0.05}, "_meta": {"progressToken": 1}}
    task = asyncio.create_task(shared.request("tools/call", params, on_progress=recorder.on_progress))

    await asyncio.wait_for(recorder.first_progress.wait(), 10)  # the upstream is running it now
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task

    assert (await more_cancellations(shared, than=before["cancelled"]))["cancelled"] == before["cancelled"] + 1


async def test_a_crash_fails_calls_in_flight_at_once_and_the_child_comes_back(
    start_upstream: StartUpstream, publisher: RecordingPublisher, metrics: Metrics
) -> None:
    upstream = await start_upstream(timeout=30.0)
    first_pid = upstream.pid
    assert first_pid is not None

    async with asyncio.timeout(10):  # far below the 30 s call timeout: the failure is not a timeout
        hanging = asyncio.create_task(call(upstream, "hang"))
        with pytest.raises(UpstreamUnavailable):
            await call(upstream, "crash")
        with pytest.raises(UpstreamUnavailable, match="went away"):
            await hanging

    assert await upstream.wait_ready(READY)
    assert upstream.pid not in (None, first_pid)
    assert not pid_alive(first_pid)
    assert text_of(await call(upstream, "echo", text="back")) == "back"
    assert [e["upstream"] for e in publisher.named(events.UPSTREAM_RESTART)] == ["kid"]
    assert metrics.registry.get_sample_value("satgate_upstream_restarts_total", {"upstream": "kid"}) == 1


async def test_the_child_asking_the_gateway_something_gets_an_answer(shared: StdioUpstream) -> None:
    assert text_of(await call(shared, "ask_client", method="ping")) == "pong"
    # Called with no client session behind it, roots/list has nobody to go to: refused, never guessed.
    assert "cannot tell which client 'roots/list' is for" in text_of(await call(shared, "ask_client", method="roots"))


async def test_list_changed_reaches_the_notification_callback(start_upstream: StartUpstream) -> None:
    recorder = Recorder()
    upstream = await start_upstream(recorder=recorder)

    await call(upstream, "add_tool", name="fresh")

    listed = await upstream.request("tools/list", None)
    assert "fresh" in [t["name"] for t in listed["result"]["tools"]]
    # One relisting hint after initialize, one from the upstream itself.
    assert recorder.notifications.count(UPSTREAM_READY) == 1
    assert recorder.notifications.count("notifications/tools/list_changed") == 1


async def test_stderr_goes_to_the_log_and_non_json_output_is_skipped(
    publisher: RecordingPublisher, metrics: Metrics
) -> None:
    script = ("import sys, json\n"
              "print('booting', file=sys.stderr, flush=True)\n"
              "for line in sys.stdin:\n"
              "    msg = json.loads(line)\n"
              "    if 'id' not in msg: continue\n"
              "    print('this is not json', flush=True)\n"
              "    result = {'protocolVersion': '2025-06-18', 'capabilities': {}, 'serverInfo': {'name': 'raw'}}\n"
              "    print(json.dumps({'jsonrpc': '2.0', 'id': msg['id'], 'result': result}), flush=True)\n")
    spec = StdioUpstreamSpec(transport="stdio", command=[sys.executable, "-c", script], timeout=5)
    with structlog.testing.capture_logs() as logs:
        upstream = StdioUpstream("raw", spec, publisher=publisher, metrics=metrics)
        await upstream.start(Recorder().on_notification)
        try:
            assert await upstream.wait_ready(READY)
            assert (await upstream.request("ping", None))["result"]["protocolVersion"] == "2025-06-18"
        finally:
            await upstream.close()

    assert {"event": "upstream_stderr", "line": "booting", "upstream": "raw"}.items() <= next(
        e for e in logs if e["event"] == "upstream_stderr").items()
    assert any(e["event"] == "upstream_output_not_json" and e["upstream"] == "raw" for e in logs)


async def test_replies_are_read_exactly_even_with_bad_utf8_or_integers_beyond_64_bits(
    publisher: RecordingPublisher, metrics: Metrics
) -> None:
    """The fast decoder must not change what is read: invalid UTF-8 still becomes U+FFFD, a long integer stays exact."""
    script = ("import sys, json\n"
              "for line in sys.stdin:\n"
              "    msg = json.loads(line)\n"
              "    if 'id' not in msg: continue\n"
              "    result = {'protocolVersion': '2025-06-18', 'capabilities': {}, 'serverInfo': {'name': 'raw'},\n"
              "              'big': 123456789012345678901234567890}\n"
              "    out = json.dumps({'jsonrpc': '2.0', 'id': msg['id'], 'result': result}).encode()\n"
              "    if msg['method'] == 'ping': out = out.replace(b'raw', b'r\\xffw')\n"
              "    sys.stdout.buffer.write(out + b'\\n'); sys.stdout.flush()\n")
    spec = StdioUpstreamSpec(transport="stdio", command=[sys.executable, "-c", script], timeout=5)
    upstream = StdioUpstream("raw", spec, publisher=publisher, metrics=metrics)
    await upstream.start(Recorder().on_notification)
    try:
        assert await upstream.wait_ready(READY)
        result = (await upstream.request("ping", None))["result"]
    finally:
        await upstream.close()
    assert result["serverInfo"]["name"] == "r\ufffdw"
    assert result["big"] == 123456789012345678901234567890


async def test_close_leaves_no_process_behind(publisher: RecordingPublisher, metrics: Metrics) -> None:
    upstream = make(publisher=publisher, metrics=metrics)
    await upstream.start(Recorder().on_notification)
    assert await upstream.wait_ready(READY)
    pid = upstream.pid
    assert pid is not None
    recorder = Recorder()
    params = {"name": "slow", "arguments": {"steps": 1000, "delay": 0.05}, "_meta": {"progressToken": 1}}
    in_flight = asyncio.create_task(upstream.request("tools/call", params, on_progress=recorder.on_progress))
    await asyncio.wait_for(recorder.first_progress.wait(), 10)

    await upstream.close()

    assert not pid_alive(pid)
    with pytest.raises(ProcessLookupError):
        os.killpg(pid, 0)  # nothing left in its process group either
    with pytest.raises(UpstreamUnavailable):
        await in_flight
    with pytest.raises(UpstreamUnavailable, match="shut down"):
        await call(upstream, "echo", text="too late")


async def test_a_command_that_cannot_start_is_retried_not_fatal(publisher: RecordingPublisher,
                                                                metrics: Metrics) -> None:
    spec = StdioUpstreamSpec(transport="stdio", command=["/nonexistent/mcp-server"], timeout=5)
    upstream = StdioUpstream("ghost", spec, publisher=publisher, metrics=metrics)
    await upstream.start(Recorder().on_notification)
    try:
        assert not await upstream.wait_ready(0.5)
        with pytest.raises(UpstreamUnavailable, match="not running"):
            await upstream.request("tools/list", None, timeout=0.2)
        assert publisher.named(events.UPSTREAM_RESTART)  # it keeps trying, with backoff
    finally:
        await upstream.close()
