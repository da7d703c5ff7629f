"""Resumable sessions end to end: real ``python -m satgate_mcp serve`` processes, a real stdio MCP upstream
(tests/upstream_server.py), and the official ``mcp`` Python SDK client, which never re-initializes on its own.

One ``ClientSession`` must keep working (a) across SIGKILLs and restarts of the gateway on the same port and
(b) when consecutive calls alternate between two gateway processes on two ports. The client is not told
anything: the gateway serves the same session id again.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2
import mcp_types as types
import pytest
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client

REPO = Path(__file__).resolve().parents[2]
UPSTREAM_SERVER = REPO / "tests" / "upstream_server.py"
ROOT_KEY = "e2e-resume-root-key-0123456789abcdefghij"
#: Bounds: a gateway start (its upstream child imports the mcp SDK), one MCP call, one child's exit.
START_TIMEOUT = 20.0
CALL_TIMEOUT = 15.0
EXIT_TIMEOUT = 5.0
READY_POLL_INTERVAL = 0.05
KILLS = 3


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def child_pids(pid: int) -> list[int]:
    pids: set[int] = set()
    with contextlib.suppress(OSError):
        for tid in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError), open(f"/proc/{pid}/task/{tid}/children") as fh:
                pids.update(int(p) for p in fh.read().split())
    return sorted(pids)


async def exited(pid: int, timeout: float) -> bool:
    """Wait (bounded) for a process that is not our child to exit, via a pidfd: no polling."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    loop = asyncio.get_running_loop()
    gone: asyncio.Future[None] = loop.create_future()

    def on_exit() -> None:
        if not gone.done():
            gone.set_result(None)

    loop.add_reader(fd, on_exit)
    try:
        await asyncio.wait_for(gone, timeout)
        return True
    except TimeoutError:
        return False
    finally:
        loop.remove_reader(fd)
        os.close(fd)


def base_env() -> dict[str, str]:
    """The test runner's environment without any SATGATE_* it may carry, and without proxies."""
    drop = ("SATGATE_", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy")
    return {k: v for k, v in os.environ.items() if not k.startswith(drop)}


def mint_with_cli(token_id: str) -> str:
    env = {**base_env(), "SATGATE_ROOT_KEY": ROOT_KEY}
    done = subprocess.run([sys.executable, "-m", "satgate_mcp", "token", "mint", "--id", token_id], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=30, check=True)
    return done.stdout.strip()


class GatewayProcess:
    """``python -m satgate_mcp serve`` in its own process group; each (re)start writes its own events file."""

    def __init__(self, port: int, workdir: Path) -> None:
        self.port = port
        self.workdir = workdir
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def events_file(self) -> Path:
        return self.workdir / f"events-{self.port}-{self.starts}.jsonl"

    @property
    def log_file(self) -> Path:
        return self.workdir / f"serve-{self.port}-{self.starts}.log"

    def start(self) -> None:
        self.starts += 1
        upstreams = {"t": {"transport": "stdio", "command": [sys.executable, str(UPSTREAM_SERVER), "stdio"]}}
        env = {**base_env(), "SATGATE_HOST": "127.0.0.1", "SATGATE_PORT": str(self.port),
               "SATGATE_AUTH_MODE": "header", "SATGATE_ROOT_KEY": ROOT_KEY,
               "SATGATE_UPSTREAMS": json.dumps(upstreams), "SATGATE_EVENTS_FILE": str(self.events_file),
               "SATGATE_LOG_FORMAT": "json", "SATGATE_DRAIN_SECONDS": "1"}
        with self.log_file.open("wb") as log:
            self.proc = subprocess.Popen([sys.executable, "-m", "satgate_mcp", "serve"], cwd=REPO, env=env,
                                         stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True)

    def log_tail(self, lines: int = 30) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log_file.read_text(errors="replace").splitlines()[-lines:])
        return ""

    async def wait_ready(self, http: httpx2.AsyncClient) -> None:
        """Bounded poll of /readyz: a process that is not listening yet has nothing to await."""
        assert self.proc is not None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + START_TIMEOUT
        while True:
            if self.proc.poll() is not None:
                raise AssertionError(f"gateway exited with {self.proc.returncode}:\n{self.log_tail()}")
            with contextlib.suppress(httpx2.TransportError):
                if (await http.get(f"{self.url}/readyz")).status_code == 200:
                    return
            if loop.time() >= deadline:
                raise AssertionError(f"gateway not ready within {START_TIMEOUT}s:\n{self.log_tail()}")
            await asyncio.sleep(READY_POLL_INTERVAL)

    async def kill(self) -> list[int]:
        """SIGKILL the process group; return the upstream children that did not follow it down (killed now)."""
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return []
        children = child_pids(proc.pid)
        os.killpg(proc.pid, signal.SIGKILL)
        await asyncio.to_thread(proc.wait, EXIT_TIMEOUT)
        leftovers = [pid for pid in children if not await exited(pid, EXIT_TIMEOUT)]
        for pid in leftovers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return leftovers

    def session_connects(self) -> list[dict[str, Any]]:
        """``session_connect`` events this start of the process published."""
        if not self.events_file.exists():
            return []
        events = [json.loads(line) for line in self.events_file.read_text().splitlines() if line.strip()]
        return [e for e in events if e.get("event") == "session_connect"]


@pytest.fixture
def gateways(tmp_path: Path) -> Iterator[Callable[[], GatewayProcess]]:
    made: list[GatewayProcess] = []

    def make() -> GatewayProcess:
        gw = GatewayProcess(free_port(), tmp_path)
        made.append(gw)
        return gw

    yield make
    for gw in made:
        proc = gw.proc
        if proc is not None and proc.poll() is None:
            children = child_pids(proc.pid)
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(EXIT_TIMEOUT)
            for pid in children:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)


@pytest.fixture
async def plain_http() -> AsyncIterator[httpx2.AsyncClient]:
    """For /readyz only; the MCP traffic goes through the SDK client."""
    async with httpx2.AsyncClient(trust_env=False, timeout=2.0) as client:
        yield client


@dataclass(frozen=True)
class Sent:
    port: int
    http_method: str
    rpc_method: str | None
    session_id: str | None
    status: int


class PortRotation(httpx2.AsyncBaseTransport):
    """Sends each POST to the next gateway port in turn (a round-robin load balancer with no affinity),
    and records what went where. Other requests (the client's GET, its closing DELETE) go to the first port."""

    def __init__(self, ports: Sequence[int]) -> None:
        self._inner = httpx2.AsyncHTTPTransport(trust_env=False)
        self._first = ports[0]
        self._next = itertools.cycle(ports)
        self.sent: list[Sent] = []

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        port = next(self._next) if request.method == "POST" else self._first
        request.url = request.url.copy_with(port=port)
        request.headers["Host"] = f"{request.url.host}:{port}"
        rpc_method = None
        if request.method == "POST":
            body = json.loads(request.content)
            rpc_method = body.get("method") if isinstance(body, dict) else "batch"
        response = await self._inner.handle_async_request(request)
        self.sent.append(Sent(port, request.method, rpc_method, request.headers.get("mcp-session-id"),
                              response.status_code))
        return response

    async def aclose(self) -> None:
        await self._inner.aclose()

    def calls(self) -> list[Sent]:
        return [s for s in self.sent if s.rpc_method == "tools/call"]


@contextlib.asynccontextmanager
async def sdk_session(url: str, token: str, rotation: PortRotation) -> AsyncIterator[ClientSession]:
    """The official client exactly as an agent would hold it: one ClientSession, initialized once."""
    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, transport=rotation,
                              trust_env=False, timeout=httpx2.Timeout(CALL_TIMEOUT))
    async with (http, streamable_http_client(f"{url}/mcp", http_client=http) as (read, write),
                ClientSession(read, write, read_timeout_seconds=CALL_TIMEOUT) as session):
        await asyncio.wait_for(session.initialize(), CALL_TIMEOUT)
        yield session


async def echo(session: ClientSession, text: str) -> str:
    result = await asyncio.wait_for(session.call_tool("echo", {"text": text}), CALL_TIMEOUT)
    assert not result.is_error, result
    [content] = result.content
    assert isinstance(content, types.TextContent)
    return content.text


def the_one_session_id(rotation: PortRotation) -> str:
    ids = {s.session_id for s in rotation.sent if s.rpc_method not in (None, "initialize")}
    assert len(ids) == 1, ids
    [session_id] = ids
    assert session_id is not None
    assert session_id.startswith("mcp-")
    return session_id


async def test_sdk_client_session_survives_three_sigkills_and_restarts(
        gateways: Callable[[], GatewayProcess], plain_http: httpx2.AsyncClient) -> None:
    token = mint_with_cli("agent-1")
    gw = gateways()
    gw.start()
    await gw.wait_ready(plain_http)
    rotation = PortRotation([gw.port])

    async with sdk_session(gw.url, token, rotation) as session:
        assert await echo(session, "before") == "before"
        session_id = the_one_session_id(rotation)
        for kill in range(1, KILLS + 1):
            assert await gw.kill() == [], "an upstream child outlived the SIGKILLed gateway"
            gw.start()
            await gw.wait_ready(plain_http)
            assert await echo(session, f"after kill {kill}") == f"after kill {kill}"
            [connect] = gw.session_connects()
            assert connect["session_id"] == session_id
            assert connect["resumed"] is True
            assert connect["token_id"] == "agent-1"

    assert the_one_session_id(rotation) == session_id
    assert [s.status for s in rotation.calls()] == [200] * (KILLS + 1)


async def test_sdk_client_session_alternates_between_two_processes(
        gateways: Callable[[], GatewayProcess], plain_http: httpx2.AsyncClient) -> None:
    token = mint_with_cli("agent-2")
    one, two = gateways(), gateways()
    one.start()
    two.start()
    await asyncio.gather(one.wait_ready(plain_http), two.wait_ready(plain_http))
    rotation = PortRotation([one.port, two.port])

    async with sdk_session(one.url, token, rotation) as session:
        for n in range(6):
            assert await echo(session, f"call {n}") == f"call {n}"

    trace = "\n".join(map(str, rotation.sent))
    calls = rotation.calls()
    assert [s.status for s in calls] == [200] * 6, trace
    for port in (one.port, two.port):  # every other POST (the SDK adds a tools/list) went to each process
        assert sum(s.port == port for s in calls) >= 2, trace
    assert all(s.status in (200, 202) for s in rotation.sent if s.http_method == "POST"), trace
    session_id = the_one_session_id(rotation)
    # one process opened it, the other rebuilt it from the token: one session_connect each
    connects = one.session_connects() + two.session_connects()
    assert [e["session_id"] for e in connects] == [session_id, session_id]
    assert sorted(e["resumed"] for e in connects) == [False, True]
