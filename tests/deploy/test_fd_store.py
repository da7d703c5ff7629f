"""Stdio children survive even a SIGKILL of the daemon under systemd's fd store (issue 32); the test plays systemd.

systemd's side, as sd_notify(3) and sd_listen_fds(3) describe it: a datagram socket at ``NOTIFY_SOCKET`` keeps
each descriptor sent with ``FDSTORE=1`` under its ``FDNAME`` (``FDSTOREREMOVE=1`` drops it), and the next start
gets them back from fd 3 on with ``LISTEN_FDS``, ``LISTEN_FDNAMES`` and its own pid in ``LISTEN_PID``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from tests.deploy.harness import REPO, Gateway, Gateways, free_port, gateway_env, mcp_session, pid_alive, token
from tests.gateway_process import exited

pytestmark = pytest.mark.process

PREFIX = "satgate-child-"
ROLES = {"stdin", "stdout", "stderr", "pidfd", "state"}
WAIT = 20.0

#: What systemd does between fork and exec: the stored descriptors from fd 3 on, and LISTEN_* naming them.
_SYSTEMD_EXEC = """
import fcntl, os, sys
fds = [int(fd) for fd in os.environ.pop("HARNESS_FDS").split(",")]
high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 100) for fd in fds]
for fd in fds:
    os.close(fd)
for i, fd in enumerate(high):
    os.dup2(fd, 3 + i)
    os.close(fd)
os.environ.update(LISTEN_PID=str(os.getpid()), LISTEN_FDS=str(len(fds)))
os.execv(sys.executable, [sys.executable, "-m", "satgate_mcp", "serve"])
"""


class FakeSystemd:
    """The fd store: descriptors kept by name, as the daemon sends and replaces them."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.fds: dict[str, int] = {}
        self.changed = asyncio.Event()
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._sock.bind(str(path))
        self._sock.setblocking(False)
        asyncio.get_running_loop().add_reader(self._sock, self._receive)

    def _receive(self) -> None:
        while True:
            try:
                data, fds, _flags, _addr = socket.recv_fds(self._sock, 4096, 16)
            except BlockingIOError:
                return
            fields = dict(line.split("=", 1) for line in data.decode().splitlines() if "=" in line)
            name = fields.get("FDNAME", "stored")
            if fields.get("FDSTOREREMOVE") == "1" and name in self.fds:
                os.close(self.fds.pop(name))
            for fd in fds:
                if fields.get("FDSTORE") == "1" and name not in self.fds:
                    self.fds[name] = fd
                else:
                    os.close(fd)
            self.changed.set()

    def children(self) -> dict[str, set[str]]:
        found: dict[str, set[str]] = {}
        for name in self.fds:
            if name.startswith(PREFIX):
                key, _, role = name[len(PREFIX):].rpartition("-")
                found.setdefault(key, set()).add(role)
        return found

    async def until(self, ready: Callable[[], bool]) -> None:
        async with asyncio.timeout(WAIT):
            while not ready():
                self.changed.clear()
                await self.changed.wait()

    def close(self) -> None:
        asyncio.get_running_loop().remove_reader(self._sock)
        self._sock.close()
        for fd in self.fds.values():
            with contextlib.suppress(OSError):
                os.close(fd)


async def restart_from_store(gateways: Gateways, env: dict[str, str], store: FakeSystemd, name: str) -> Gateway:
    """What systemd does after the daemon died: start it again with the store's descriptors, sorted by name."""
    names = sorted(store.fds)
    fds = [store.fds[n] for n in names]
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _SYSTEMD_EXEC, cwd=REPO, stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, start_new_session=True, pass_fds=fds,
        env={**env, "HARNESS_FDS": ",".join(map(str, fds)), "LISTEN_FDNAMES": ":".join(names)})
    gateway = Gateway(proc, name)
    gateway.reader = asyncio.create_task(gateway._read())
    gateways.started.append(gateway)
    return gateway


def stored_state(store: FakeSystemd) -> dict[str, Any]:
    states = [fd for name, fd in store.fds.items() if name.endswith("-state")]
    return json.loads(os.pread(states[0], 1 << 20, 0)) if len(states) == 1 else {}


async def counter(port: int) -> dict[str, int]:
    async with mcp_session(f"http://127.0.0.1:{port}/mcp", token("agent")) as session:
        result = await session.call_tool("counter", {})
    text = result.content[0].text  # type: ignore[union-attr]
    answer: dict[str, int] = json.loads(text)
    return answer


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[FakeSystemd]:
    fake = FakeSystemd(tmp_path / "notify.sock")
    yield fake
    fake.close()


async def crash_with_child(gateways: Gateways, store: FakeSystemd) -> tuple[int, dict[str, str], int]:
    """A daemon whose child counted to 2, killed with SIGKILL: (port, its env, the child's pid)."""
    port = free_port()
    env = gateway_env(port, NOTIFY_SOCKET=str(store.path), FDSTORE="64")
    first = await gateways.start(env, name="first")
    await first.wait_event("listening")
    await store.until(lambda: ROLES in store.children().values())
    assert [(await counter(port))["count"] for _ in range(2)] == [1, 2]
    pid = (await counter(port))["pid"]
    async with mcp_session(f"http://127.0.0.1:{port}/mcp", token("subscriber")) as session:
        uri = str((await session.list_resources()).resources[0].uri)
        await session.subscribe_resource(uri)  # the shared child's stored record follows what it was told
        await store.until(lambda: uri in stored_state(store).get("subscriptions", []))
    os.kill(first.pid, signal.SIGKILL)
    assert await first.exited() == -signal.SIGKILL
    assert pid_alive(pid)
    return port, env, pid


@pytest.mark.filterwarnings("ignore:resources/(un)?subscribe is removed as of 2026-07-28")
async def test_a_killed_daemon_s_successor_adopts_its_children_from_the_fd_store(
        gateways: Gateways, store: FakeSystemd) -> None:
    port, env, pid = await crash_with_child(gateways, store)
    second = await restart_from_store(gateways, env, store, "second")
    adopted = await second.wait_event("upstream_adopted")
    assert (adopted["pid"], adopted["crashed"]) == (pid, True)
    await second.wait_event("listening")
    assert await counter(port) == {"count": 4, "pid": pid}
    assert not second.find("upstream_spawned")
    second.signal()
    assert await second.exited() == 0


@pytest.mark.filterwarnings("ignore:resources/(un)?subscribe is removed as of 2026-07-28")
async def test_a_corrupt_state_memfd_gives_a_fresh_child_never_a_crash(
        gateways: Gateways, store: FakeSystemd) -> None:
    port, env, pid = await crash_with_child(gateways, store)
    [state] = [fd for name, fd in store.fds.items() if name.endswith("-state")]
    os.ftruncate(state, 0)
    os.pwrite(state, b'{"version": 1, "pid": "not', 0)
    second = await restart_from_store(gateways, env, store, "second")
    refused = await second.wait_event("upstream_handover_refused")
    assert refused["source"] == "fd_store"
    fresh = (await second.wait_event("upstream_spawned"))["pid"]
    await second.wait_event("listening")
    assert await counter(port) == {"count": 1, "pid": fresh}
    assert fresh != pid
    second.signal()
    assert await second.exited() == 0
    assert await exited(pid, 5.0), "the child nobody could adopt was left running"
