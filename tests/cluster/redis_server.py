"""A redis-server a test starts, kills, pauses and starts again itself, on a free port (the machine's shared
Redis must never be paused or killed by a test)."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import redis.asyncio as redis

from tests.gateway_process import free_port

#: Bound on a fresh redis-server answering its first PING.
START_TIMEOUT = 10.0
START_POLL = 0.05


class RedisServer:
    """A redis-server of this test's own, on a free port, that it may kill and start again (same port)."""

    def __init__(self, workdir: Path) -> None:
        self.port = free_port()
        self.workdir = workdir
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def spawn(self) -> None:
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", str(self.workdir)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    async def start(self) -> None:
        self.spawn()
        client = redis.Redis.from_url(self.url, socket_connect_timeout=0.2)
        try:
            async with asyncio.timeout(START_TIMEOUT):
                while True:  # a fresh server has nothing to await but its port
                    with contextlib.suppress(OSError, redis.RedisError):
                        if await client.ping():
                            return
                    await asyncio.sleep(START_POLL)
        finally:
            await client.aclose()

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)
        self.proc = None

    async def pause(self, milliseconds: int) -> None:
        """``CLIENT PAUSE``: every other client's commands wait until it ends (connections stay up)."""
        client = redis.Redis.from_url(self.url)
        try:
            await client.client_pause(milliseconds)
        finally:
            await client.aclose()


@contextlib.asynccontextmanager
async def own_redis(workdir: Path) -> AsyncIterator[RedisServer]:
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed")
    server = RedisServer(workdir)
    await server.start()
    try:
        yield server
    finally:
        server.kill()
