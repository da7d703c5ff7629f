"""The drain: its decisions as tables, and stopping the listener and draining against real sockets in-process."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web

from satgate_mcp.daemon import sockets
from satgate_mcp.daemon.drain import (
    ConnectionTracker,
    DrainReason,
    drain,
    drain_reason,
    exit_code,
    idle_expired,
    next_look,
)
from satgate_mcp.daemon.sockets import bind_socket
from tests.deploy.clocks import SteppingClock, never


@pytest.mark.parametrize(
    ("now", "idle_since", "expected"),
    [
        pytest.param(10.0, 9.5, False, id="just-used-stays-open"),
        pytest.param(10.0, 9.0, True, id="idle-for-the-grace-closes"),
        pytest.param(10.0, 2.0, True, id="long-idle-closes"),
    ],
)
def test_idle_connection_closes_only_after_the_grace(now: float, idle_since: float, expected: bool) -> None:
    assert idle_expired(now, idle_since, grace=1.0) is expected


@pytest.mark.parametrize(
    ("connections", "now", "cut", "expected"),
    [
        pytest.param(0, 1.0, False, "clean", id="all-closed-is-clean"),
        pytest.param(0, 99.0, True, "clean", id="finished-beats-late-cut"),
        pytest.param(2, 1.0, False, None, id="still-draining"),
        pytest.param(2, 1.0, True, "signal", id="second-signal-cuts"),
        pytest.param(2, 5.0, False, "deadline", id="deadline-cuts"),
    ],
)
def test_drain_reason(connections: int, now: float, cut: bool, expected: str | None) -> None:
    assert drain_reason(connections=connections, now=now, deadline=5.0, cut_requested=cut) == expected


@pytest.mark.parametrize(("reason", "code"), [pytest.param("clean", 0, id="clean-exits-0"),
                                              pytest.param("deadline", 1, id="deadline-exits-1"),
                                              pytest.param("signal", 1, id="signal-exits-1")])
def test_exit_code_is_zero_only_for_a_clean_drain(reason: DrainReason, code: int) -> None:
    assert exit_code(reason) == code


@pytest.mark.parametrize(
    ("idle_since", "expected"),
    [
        pytest.param([], 5.0, id="only-busy-connections-wait-for-the-deadline"),
        pytest.param([1.0, 2.5], 2.0, id="the-first-grace-to-run-out"),
        pytest.param([4.5], 5.0, id="the-deadline-comes-before-the-grace"),
    ],
)
def test_the_drain_looks_again_when_a_grace_runs_out_or_at_the_deadline(
    idle_since: list[float], expected: float
) -> None:
    assert next_look(deadline=5.0, idle_since=idle_since, grace=1.0) == expected


# ---------------------------------------------------------------- drain, in-process


class Served:
    def __init__(self, server: web.Server, runner: web.AppRunner, site: web.SockSite, listener: sockets.Listener,
                 tracker: ConnectionTracker, clock: SteppingClock) -> None:
        self.server, self.runner, self.site, self.listener = server, runner, site, listener
        self.tracker, self.clock = tracker, clock
        self.release, self.entered = asyncio.Event(), asyncio.Event()  # /slow
        self.streaming, self.finish_stream = asyncio.Event(), asyncio.Event()  # /stream

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.listener.port}"

    async def stop_listening(self) -> int:
        adopted = await sockets.stop_listening([self.site], [self.listener], self.server)
        self.tracker.draining = True
        return adopted


@pytest.fixture
async def served() -> AsyncIterator[Served]:
    async def slow(request: web.Request) -> web.Response:
        result.entered.set()
        await result.release.wait()
        return web.Response(text="slow done")

    async def stream(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b"data: first\n\n")
        result.streaming.set()
        await result.finish_stream.wait()
        await response.write(b"data: last\n\n")
        await response.write_eof()
        return response

    async def fast(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    clock = SteppingClock()
    tracker = ConnectionTracker(clock)
    app = web.Application(middlewares=[tracker.middleware])
    app.router.add_get("/slow", slow)
    app.router.add_get("/fast", fast)
    app.router.add_get("/stream", stream)
    app.on_response_prepare.append(tracker.on_response_prepare)
    app_runner = web.AppRunner(app, shutdown_timeout=0.5)
    await app_runner.setup()
    listener = bind_socket("127.0.0.1", 0, reuse_port=True)
    site = web.SockSite(app_runner, listener.sock)
    await site.start()
    assert app_runner.server is not None
    result = Served(app_runner.server, app_runner, site, listener, tracker, clock)
    try:
        yield result
    finally:
        result.release.set()
        result.finish_stream.set()
        await app_runner.cleanup()
        listener.sock.close()


async def test_drain_finishes_the_request_in_flight_and_tells_the_client_to_reconnect(served: Served) -> None:
    async with aiohttp.ClientSession() as client:
        call = asyncio.create_task(client.get(served.url + "/slow"))
        await asyncio.wait_for(served.entered.wait(), 5)
        adopted = await served.stop_listening()
        draining = asyncio.create_task(drain(served.server, served.tracker, deadline=served.clock() + 5,
                                             cut=asyncio.Event(), clock=served.clock, sleep=never))
        served.release.set()
        response = await asyncio.wait_for(call, 5)
        assert (response.status, await response.text()) == (200, "slow done")
        assert response.headers["Connection"] == "close"
        report = await asyncio.wait_for(draining, 5)
    assert (adopted, report.reason, report.in_flight_at_start, report.drained, report.cut) == (0, "clean", 1, 1, 0)
    with pytest.raises(aiohttp.ClientConnectionError):
        async with aiohttp.ClientSession() as fresh:
            await fresh.get(served.url + "/fast")


async def test_a_streamed_answer_keeps_its_connection_busy_until_it_is_finished(served: Served) -> None:
    """Busy is the whole response, not its headers: a stream in progress is never closed as idle."""
    async with aiohttp.ClientSession() as client:
        answer = await client.get(served.url + "/stream")
        await asyncio.wait_for(served.streaming.wait(), 5)
        await served.stop_listening()
        draining = asyncio.create_task(drain(served.server, served.tracker, deadline=served.clock() + 5,
                                             cut=asyncio.Event(), clock=served.clock, sleep=never, idle_grace=0.0))
        for _ in range(10):
            await asyncio.sleep(0)  # turns of the loop: an idle connection would be closed in the first
        assert not draining.done(), "a connection streaming an answer is busy, whatever the grace"
        served.finish_stream.set()
        assert await asyncio.wait_for(answer.read(), 5) == b"data: first\n\ndata: last\n\n"
        report = await asyncio.wait_for(draining, 5)
    assert (report.reason, report.in_flight_at_start, report.drained, report.cut) == ("clean", 1, 1, 0)


async def test_idle_keep_alive_connection_is_served_during_grace_then_closed(served: Served) -> None:
    async with aiohttp.ClientSession() as client:
        first = await client.get(served.url + "/fast")
        assert first.headers.get("Connection") != "close"
        await first.read()
        await served.stop_listening()
        # The clock stands still: the grace never runs out while the client comes back.
        draining = asyncio.create_task(drain(served.server, served.tracker, deadline=served.clock() + 5,
                                             cut=asyncio.Event(), clock=served.clock, sleep=never))
        # The client reuses its idle connection right after the drain began: it is served, not reset.
        again = await client.get(served.url + "/fast")
        assert (again.status, again.headers["Connection"]) == (200, "close")
        report = await asyncio.wait_for(draining, 5)
    assert (report.reason, report.idle_at_start, report.drained) == ("clean", 1, 1)


async def test_idle_connection_that_stays_idle_is_closed_after_the_grace(served: Served) -> None:
    async with aiohttp.ClientSession() as client:
        await (await client.get(served.url + "/fast")).read()
        await sockets.stop_listening([served.site], [served.listener], served.server)
        report = await asyncio.wait_for(drain(served.server, served.tracker, deadline=served.clock() + 5,
                                              cut=asyncio.Event(), clock=served.clock, sleep=served.clock.sleep,
                                              idle_grace=0.2), 5)
    assert (report.reason, report.closed_idle, report.cut) == ("clean", 1, 0)
    assert report.seconds >= 0.2


@pytest.mark.parametrize("by", [pytest.param("deadline", id="deadline"), pytest.param("signal", id="signal")])
async def test_deadline_or_second_signal_cuts_and_counts_what_is_left(served: Served, by: str) -> None:
    async with aiohttp.ClientSession() as client:
        call = asyncio.create_task(client.get(served.url + "/slow"))
        await asyncio.wait_for(served.entered.wait(), 5)
        await sockets.stop_listening([served.site], [served.listener], served.server)
        cut = asyncio.Event()
        if by == "signal":
            cut.set()
        report = await asyncio.wait_for(drain(served.server, served.tracker, deadline=served.clock() + 0.2,
                                              cut=cut, clock=served.clock, sleep=served.clock.sleep), 5)
        assert (report.reason, report.cut, report.drained) == (by, 1, 0)
        await served.runner.cleanup()
        with pytest.raises(aiohttp.ClientError):
            await asyncio.wait_for(call, 5)


async def test_connections_queued_on_a_closed_bound_socket_are_served_not_reset(served: Served) -> None:
    # A second bound socket nobody accepts on: the kernel queues the client's connection there.
    queued = bind_socket("127.0.0.1", 0, reuse_port=False)
    queued.sock.listen()
    reader, writer = await asyncio.open_connection("127.0.0.1", queued.port)
    try:
        adopted = await sockets._adopt_queued([queued], served.server)
        writer.write(b"GET /fast HTTP/1.1\r\nHost: x\r\n\r\n")
        status = await asyncio.wait_for(reader.readline(), 5)
        assert (adopted, status) == (1, b"HTTP/1.1 200 OK\r\n")
    finally:
        writer.close()
        queued.sock.close()

