"""Real gateway processes for the restart tests: spawn, read their JSON log, signal, and never leave one behind.

A gateway runs as ``python -m satgate_mcp serve`` in its own session; a test waits on the log
events it prints (``listening``, ``drain_finished``...) instead of sleeping. ``SystemdSocket`` plays
systemd: it owns a listening socket and starts each gateway with it as fd 3 and ``LISTEN_PID``
naming the gateway itself (a tiny exec wrapper sets it, as systemd does between fork and exec).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import httpx2
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client

from satgate_mcp.auth.macaroons import mint_token
from tests.conftest import pid_alive as pid_alive  # re-exported for the restart tests
from tests.gateway_process import EXIT_TIMEOUT, base_env, stdio_upstreams
from tests.gateway_process import REPO as REPO  # re-exported for the restart tests
from tests.gateway_process import SERVE as SERVE  # re-exported for the restart tests
from tests.gateway_process import free_port as free_port  # re-exported for the restart tests

ROOT_KEY = "deploy-tests-root-key-0123456789abcdef-xyz"
#: Bound on a gateway's start (its stdio upstream imports the mcp SDK) and on any awaited log event.
START_TIMEOUT = 20.0
EVENT_TIMEOUT = 20.0

# Sets LISTEN_PID to its own pid, moves the inherited socket to fd 3, then becomes the gateway:
# the pid systemd would put in LISTEN_PID is the pid that ends up running the gateway.
_SYSTEMD_EXEC = """
import os, sys
fd = int(os.environ.pop("HARNESS_LISTEN_FD"))
if fd != 3:
    os.dup2(fd, 3)
    os.close(fd)
os.environ.update(LISTEN_PID=str(os.getpid()), LISTEN_FDS="1", LISTEN_FDNAMES="satgate-mcp.socket")
os.execv(sys.executable, [sys.executable, "-m", "satgate_mcp", "serve"])
"""


def gateway_env(port: int, **extra: str) -> dict[str, str]:
    """What every test gateway gets; ``extra`` adds or overrides."""
    return {
        **base_env(),
        "SATGATE_PORT": str(port),
        "SATGATE_AUTH_MODE": "header",
        "SATGATE_ROOT_KEY": ROOT_KEY,
        "SATGATE_UPSTREAMS": stdio_upstreams("up"),
        "SATGATE_LOG_FORMAT": "json",
        "SATGATE_LOG_LEVEL": "INFO",
        "PYTHONUNBUFFERED": "1",
        **extra,
    }


def token(token_id: str = "deploy-test") -> str:
    return mint_token(ROOT_KEY, token_id)


@dataclass
class Gateway:
    """One gateway process and what it logged."""

    proc: asyncio.subprocess.Process
    name: str
    events: list[dict[str, Any]] = field(default_factory=list)
    changed: asyncio.Condition = field(default_factory=asyncio.Condition)
    reader: asyncio.Task[None] | None = None

    @property
    def pid(self) -> int:
        return self.proc.pid

    async def _read(self) -> None:
        assert self.proc.stdout is not None
        async for raw in self.proc.stdout:
            line = raw.decode(errors="replace").strip()
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                event = {"event": "raw", "line": line}
            async with self.changed:
                self.events.append(event if isinstance(event, dict) else {"event": "raw", "line": line})
                self.changed.notify_all()
        async with self.changed:
            self.events.append({"event": "<eof>"})
            self.changed.notify_all()

    def find(self, name: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e.get("event") == name]

    async def wait_event(self, name: str, timeout: float = EVENT_TIMEOUT) -> dict[str, Any]:
        return await self.wait_line(lambda e: e.get("event") == name, name, timeout)

    async def wait_line(self, match: Callable[[dict[str, Any]], bool], name: str,
                        timeout: float = EVENT_TIMEOUT) -> dict[str, Any]:
        async def first() -> dict[str, Any]:
            async with self.changed:
                while True:
                    found = [e for e in self.events if match(e)]
                    if found:
                        return found[0]
                    if self.find("<eof>"):
                        raise AssertionError(f"{self.name} exited before logging {name!r}: {self.tail()}")
                    await self.changed.wait()

        try:
            return await asyncio.wait_for(first(), timeout)
        except TimeoutError:
            raise AssertionError(f"{self.name} did not log {name!r} within {timeout}s: {self.tail()}") from None

    def tail(self, n: int = 15) -> str:
        return "\n".join(json.dumps(e) for e in self.events[-n:])

    def signal(self, signum: signal.Signals = signal.SIGTERM) -> None:
        if self.proc.returncode is None:
            self.proc.send_signal(signum)

    async def exited(self, timeout: float = EVENT_TIMEOUT) -> int:
        code = await asyncio.wait_for(self.proc.wait(), timeout)
        if self.reader is not None:
            await asyncio.wait_for(self.reader, timeout)
        return code

    def upstream_pids(self) -> list[int]:
        return [int(e["pid"]) for e in self.find("upstream_spawned") if "pid" in e]

    def kill_everything(self) -> None:
        """Teardown: the gateway's group and each upstream's own group (stdio children get new sessions)."""
        for pgid in [self.pid, *self.upstream_pids()]:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, signal.SIGKILL)


class Gateways:
    """Starts gateways for one test and kills whatever is left when it ends."""

    def __init__(self) -> None:
        self.started: list[Gateway] = []

    async def start(self, env: dict[str, str], *, name: str, pass_fd: int | None = None,
                    wrapper: list[str] | None = None, args: tuple[str, ...] = ()) -> Gateway:
        """``wrapper`` (e.g. systemd-socket-activate) runs in front of the gateway and execs it;
        ``args`` follow ``serve`` (e.g. ``--handover``)."""
        fds: tuple[int, ...] = ()
        if pass_fd is None:
            argv = [*(wrapper or []), *SERVE, *args]
        else:
            argv = [sys.executable, "-c", _SYSTEMD_EXEC]
            env = {**env, "HARNESS_LISTEN_FD": str(pass_fd)}
            fds = (pass_fd,)
        proc = await asyncio.create_subprocess_exec(
            *argv, env=env, cwd=REPO, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT, start_new_session=True, pass_fds=fds,
        )
        gateway = Gateway(proc, name)
        gateway.reader = asyncio.create_task(gateway._read())
        self.started.append(gateway)
        return gateway

    async def close(self) -> None:
        for gateway in self.started:
            gateway.kill_everything()
            with contextlib.suppress(ProcessLookupError):
                await asyncio.wait_for(gateway.proc.wait(), EXIT_TIMEOUT)
            if gateway.reader is not None:
                gateway.reader.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await gateway.reader


@dataclass
class LoopStats:
    ok: int = 0
    failures: list[str] = field(default_factory=list)
    progress: asyncio.Event = field(default_factory=asyncio.Event)
    goal: int = 0

    def succeeded(self) -> None:
        self.ok += 1
        if self.ok >= self.goal:
            self.progress.set()

    async def reach(self, more: int, timeout: float = EVENT_TIMEOUT) -> None:
        """Wait until ``more`` further calls succeeded (or fail the test with what went wrong)."""
        self.goal, self.progress = self.ok + more, asyncio.Event()
        try:
            await asyncio.wait_for(self.progress.wait(), timeout)
        except TimeoutError:
            raise AssertionError(f"only {self.ok} calls; failures: {self.failures[:5]}") from None


@contextlib.asynccontextmanager
async def mcp_session(url: str, bearer: str) -> AsyncIterator[ClientSession]:
    """The official SDK client over Streamable HTTP, as an agent would connect."""
    # The SDK's own client settings: 30 s to connect and write, 300 s to read (an SSE stream stays open).
    client = httpx2.AsyncClient(headers={"Authorization": f"Bearer {bearer}"}, timeout=httpx2.Timeout(30.0, read=300.0))
    async with client, streamable_http_client(url, http_client=client) as (read, write), \
            ClientSession(read, write) as session:
        await session.initialize()
        yield session


async def sdk_call_loop(session: ClientSession, stats: LoopStats, stop: asyncio.Event) -> None:
    """Call ``echo`` back to back until told to stop; every exception or wrong answer is a failure."""
    i = 0
    while not stop.is_set():
        i += 1
        try:
            with anyio.fail_after(10):
                result = await session.call_tool("echo", {"text": f"n{i}"})
            text = result.content[0].text if result.content else None  # type: ignore[union-attr]
            if result.is_error or text != f"n{i}":
                stats.failures.append(f"call {i}: {result}")
            else:
                stats.succeeded()
        except Exception as exc:  # the assertion reports them all
            stats.failures.append(f"call {i}: {type(exc).__name__}: {exc}")
            if len(stats.failures) > 20:
                return


async def fresh_connection_loop(port: int, stats: LoopStats, stop: asyncio.Event) -> None:
    """``/healthz`` on a new TCP connection every time: a refused connection shows up here first."""
    import aiohttp

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as http:
        while not stop.is_set():
            try:
                async with http.get(f"http://127.0.0.1:{port}/healthz",
                                    timeout=aiohttp.ClientTimeout(total=10)) as response:
                    await response.read()
                    if response.status == 200:
                        stats.succeeded()
                    else:
                        stats.failures.append(f"status {response.status}")
            except Exception as exc:
                stats.failures.append(f"{type(exc).__name__}: {exc}")
                if len(stats.failures) > 20:
                    return


async def run_until(stop: asyncio.Event, *loops: Awaitable[None]) -> Callable[[], Awaitable[None]]:
    """Start loops as tasks; returns an awaitable that stops and joins them."""
    tasks = [asyncio.ensure_future(loop) for loop in loops]

    async def finish() -> None:
        stop.set()
        await asyncio.wait_for(asyncio.gather(*tasks), 15)

    return finish


_TCP_STATES = {"01": "ESTABLISHED", "04": "FIN_WAIT1", "05": "FIN_WAIT2", "06": "TIME_WAIT", "08": "CLOSE_WAIT",
               "0A": "LISTEN"}


def tcp_states(port: int) -> set[str]:
    """States of the IPv4 sockets on ``port`` (Linux /proc/net/tcp), to check a test's premise."""
    states = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if int(fields[1].rsplit(":", 1)[1], 16) == port:
            states.add(_TCP_STATES.get(fields[3], fields[3]))
    return states
