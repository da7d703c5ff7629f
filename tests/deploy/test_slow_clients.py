"""A slow client holds nothing for long (SATGATE_READ_TIMEOUT): headers never finished and a body trickled byte by
byte are cut, against a real ``serve`` process, while well-behaved clients keep being served."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from satgate_mcp.daemon.drain import ConnectionTracker
from tests.fakes import FakePool
from tests.gateway_process import GatewayProcess

ROOT_KEY = "slow-clients-root-key-0123456789abcdef-0123"
READ_TIMEOUT = 1.0


@pytest.fixture
async def gateway(tmp_path: Path) -> AsyncIterator[GatewayProcess]:
    gw = GatewayProcess(tmp_path, root_key=ROOT_KEY, settings={"SATGATE_READ_TIMEOUT": str(READ_TIMEOUT)})
    gw.start()
    try:
        await gw.wait_ready()
        yield gw
    finally:
        gw.terminate()


async def closed_within(reader: asyncio.StreamReader, seconds: float) -> bytes:
    """Everything the server sends until it closes the connection; the test fails if it stays open longer."""
    received = b""
    async with asyncio.timeout(seconds):
        while chunk := await reader.read(65536):
            received += chunk
    return received


async def close(writer: asyncio.StreamWriter) -> None:
    writer.close()
    with contextlib.suppress(ConnectionError):
        await writer.wait_closed()


@pytest.mark.process
async def test_attack_headers_never_finished_are_cut_after_the_read_timeout(gateway: GatewayProcess) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", gateway.port)
    started = time.monotonic()
    writer.write(b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
    await writer.drain()
    with contextlib.suppress(ConnectionError):
        for _ in range(6):  # a byte now and then does not keep it open
            await asyncio.sleep(READ_TIMEOUT / 3)
            writer.write(b"a")
            await writer.drain()
    with contextlib.suppress(ConnectionError):
        assert await closed_within(reader, READ_TIMEOUT * 4) == b""
    assert time.monotonic() - started < READ_TIMEOUT * 5
    await close(writer)


@pytest.mark.process
async def test_attack_a_trickled_body_is_answered_408_and_closed(gateway: GatewayProcess) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", gateway.port)
    writer.write(b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                 b"Accept: application/json, text/event-stream\r\nContent-Length: 100\r\n\r\n{")
    await writer.drain()
    answer = await closed_within(reader, READ_TIMEOUT * 4)
    assert answer.startswith(b"HTTP/1.1 408")
    assert b'"read_timeout"' in answer
    await close(writer)


@pytest.mark.process
async def test_a_client_that_sends_in_time_is_served(gateway: GatewayProcess) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", gateway.port)
    writer.write(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    await writer.drain()
    assert (await reader.readline()).startswith(b"HTTP/1.1 200")
    await close(writer)


# --- SATGATE_MAX_CONNECTIONS, in process: the tracker the runner puts outermost, on a real socket server ------------


@pytest.fixture
async def capped(aiohttp_server: Any) -> tuple[Any, ConnectionTracker]:
    from satgate_mcp.app import create_app
    from satgate_mcp.settings import Settings

    app = create_app(Settings(state_dir="memory"), pool=FakePool())
    tracker = ConnectionTracker(time.monotonic, max_connections=2)
    app.middlewares.insert(0, tracker.middleware)
    return await aiohttp_server(app), tracker


async def answer_head(reader: asyncio.StreamReader) -> bytes:
    """One whole answer read off the connection (its body by Content-Length); its head returned."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                   if line.lower().startswith(b"content-length:")), 0)
    await reader.readexactly(length)
    return head


async def healthz(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, bytes]:
    """A new connection, kept open, and the head of the answer its first request got."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    await writer.drain()
    return reader, writer, await answer_head(reader)


async def test_attack_connections_past_the_cap_are_refused_503_while_open_ones_are_served(
        capped: tuple[Any, ConnectionTracker]) -> None:
    server, tracker = capped
    first, second = await healthz(server.port), await healthz(server.port)
    assert first[2].startswith(b"HTTP/1.1 200")
    assert second[2].startswith(b"HTTP/1.1 200")
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    refused = await closed_within(reader, 5)  # the answer, then the connection is closed
    assert refused.startswith(b"HTTP/1.1 503")
    assert b"Retry-After: 1" in refused
    assert b'"too_many_connections"' in refused
    await close(writer)
    # The connections already open are not disturbed.
    first[1].write(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    assert (await answer_head(first[0])).startswith(b"HTTP/1.1 200")
    # One closes; once the server has seen it go, a new connection is served.
    tracker.changed.clear()
    await close(second[1])
    await asyncio.wait_for(tracker.changed.wait(), 5)
    again = await healthz(server.port)
    assert again[2].startswith(b"HTTP/1.1 200")
    await close(again[1])
    await close(first[1])
