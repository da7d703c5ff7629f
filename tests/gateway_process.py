"""Real ``python -m satgate_mcp serve`` processes for end-to-end tests: one copy of the helpers they share.

A gateway runs in its own process group so a test can SIGKILL it with everything it spawned; its environment
starts from the test runner's without anything that would configure it behind the test's back.
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
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2
import mcp_types as types
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client

from satgate_mcp.daemon.children import child_pids
from tests.conftest import upstream_command

__all__ = [
    "EXIT_TIMEOUT",
    "REPO",
    "SERVE",
    "GatewayProcess",
    "PortRotation",
    "Sent",
    "base_env",
    "call_text",
    "child_pids",
    "exited",
    "free_port",
    "satgate_cli",
    "sdk_session",
    "stdio_upstreams",
]

REPO = Path(__file__).resolve().parents[1]
SERVE = [sys.executable, "-m", "satgate_mcp", "serve"]
#: Bounds: a gateway start (its upstream child imports the mcp SDK), one child's exit, one CLI run.
START_TIMEOUT = 20.0
EXIT_TIMEOUT = 5.0
CLI_TIMEOUT = 20.0
READY_POLL_INTERVAL = 0.05
#: Variables that would configure the gateway (or route its traffic) from the runner's environment.
_INHERITED_NOT = ("SATGATE_", "LISTEN_", "NOTIFY_SOCKET",
                  "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def base_env() -> dict[str, str]:
    """The test runner's environment without SATGATE_*, socket-activation variables or proxies; state in memory
    (a test that wants the state folder sets SATGATE_STATE_DIR to one in its tmp_path)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(_INHERITED_NOT) and k != "STATE_DIRECTORY"}
    return {**env, "SATGATE_STATE_DIR": "memory"}


def stdio_upstreams(name: str = "t") -> str:
    """``SATGATE_UPSTREAMS``: the real test upstream (tests/upstream_server.py) over stdio, as ``name``."""
    return json.dumps({name: {"transport": "stdio", "command": upstream_command()}})


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


async def satgate_cli(*args: str, env: Mapping[str, str], timeout: float = CLI_TIMEOUT) -> str:
    """``satgate-mcp <args>`` as the operator runs it, without blocking live SDK sessions: its stdout as
    printed, or the test fails with its stderr."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "satgate_mcp", *args, cwd=REPO, env=env,
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    assert proc.returncode == 0, err.decode()
    return out.decode()


class GatewayProcess:
    """``python -m satgate_mcp serve`` in header mode, in its own process group; each (re)start writes its own
    log and events files. ``settings`` adds SATGATE_* variables; the ``satgate-mcp`` commands run by ``cli``
    share the root key and revocation file with it."""

    def __init__(self, workdir: Path, *, root_key: str, port: int | None = None,
                 revocation_file: Path | None = None, settings: Mapping[str, str] | None = None) -> None:
        self.port = free_port() if port is None else port
        self.workdir = workdir
        self.revocation_file = revocation_file
        self.cli_env = {**base_env(), "SATGATE_ROOT_KEY": root_key}
        if revocation_file is not None:
            self.cli_env["SATGATE_REVOCATION_FILE"] = str(revocation_file)
        self.settings = dict(settings or {})
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
        env = {**self.cli_env, "SATGATE_HOST": "127.0.0.1", "SATGATE_PORT": str(self.port),
               "SATGATE_AUTH_MODE": "header", "SATGATE_UPSTREAMS": stdio_upstreams(),
               "SATGATE_EVENTS_FILE": str(self.events_file), "SATGATE_LOG_FORMAT": "json",
               "SATGATE_DRAIN_SECONDS": "1", **self.settings}
        with self.log_file.open("wb") as log:
            self.proc = subprocess.Popen(SERVE, cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=log,
                                         stderr=subprocess.STDOUT, start_new_session=True)

    def log_tail(self, lines: int = 30) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log_file.read_text(errors="replace").splitlines()[-lines:])
        return ""

    async def wait_ready(self) -> None:
        """Bounded poll of /readyz: a process that is not listening yet has nothing to await."""
        proc = self.proc
        assert proc is not None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + START_TIMEOUT
        async with httpx2.AsyncClient(trust_env=False, timeout=2.0) as http:
            while True:
                if proc.poll() is not None:
                    raise AssertionError(f"gateway exited with {proc.returncode}:\n{self.log_tail()}")
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

    def terminate(self) -> None:
        """Teardown that asks nothing: SIGKILL the process group, reap it, SIGKILL each child it had."""
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        children = child_pids(proc.pid)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(EXIT_TIMEOUT)
        for pid in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    async def cli(self, *args: str, timeout: float = CLI_TIMEOUT) -> str:
        """``satgate-mcp <args>`` with this gateway's root key and revocation file."""
        return await satgate_cli(*args, env=self.cli_env, timeout=timeout)

    def events(self, name: str | None = None) -> list[dict[str, Any]]:
        """What this start of the process published (only ``name`` events when given)."""
        if not self.events_file.exists():
            return []
        events = [json.loads(line) for line in self.events_file.read_text().splitlines() if line.strip()]
        return [e for e in events if name is None or e.get("event") == name]


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
async def sdk_session(url: str, token: str, *, timeout: float,
                      transport: httpx2.AsyncBaseTransport | None = None) -> AsyncIterator[ClientSession]:
    """The official client exactly as an agent holds it: one ClientSession, initialized once, the bearer in a
    default ``Authorization`` header; every request and the handshake bounded by ``timeout``."""
    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, transport=transport,
                              trust_env=False, timeout=httpx2.Timeout(timeout))
    async with (http, streamable_http_client(f"{url}/mcp", http_client=http) as (read, write),
                ClientSession(read, write, read_timeout_seconds=timeout) as session):
        await asyncio.wait_for(session.initialize(), timeout)
        yield session


async def call_text(session: ClientSession, name: str, arguments: dict[str, Any], *, timeout: float) -> str:
    """A tool call that must succeed with exactly one text block; that text."""
    result = await asyncio.wait_for(session.call_tool(name, arguments), timeout)
    assert not result.is_error, result
    [content] = result.content
    assert isinstance(content, types.TextContent)
    return content.text
