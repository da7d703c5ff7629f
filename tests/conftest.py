"""Shared fixtures: the real MCP upstream server (tests/upstream_server.py) as a stdio command and
as a Streamable HTTP server process that a test can stop and restart on the same port."""

from __future__ import annotations

import asyncio
import atexit
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

# Apps built in tests keep today's in-memory state unless a test hands them a state folder (tmp_path):
# nothing litters the repository with ./satgate-state. Processes get the same through tests.gateway_process.
os.environ.setdefault("SATGATE_STATE_DIR", "memory")
# A test that strips SATGATE_* falls back to $STATE_DIRECTORY: a throwaway folder, never the repository.
_FALLBACK_STATE = tempfile.mkdtemp(prefix="satgate-test-state-")
os.environ.setdefault("STATE_DIRECTORY", _FALLBACK_STATE)
atexit.register(shutil.rmtree, _FALLBACK_STATE, True)


class _ProcessGuard:
    """``-m "not process"`` runs every test that starts no process, in seconds; this keeps the mark honest.

    While a test without ``@pytest.mark.process`` runs (its fixtures included), starting a process fails
    it with a message naming the mark. The audit hook sees every ``subprocess.Popen``, asyncio's included.
    """

    allowed = True

    @classmethod
    def audit(cls, event: str, args: tuple[object, ...]) -> None:
        if event == "subprocess.Popen" and not cls.allowed:
            raise RuntimeError(f"this test starts a process ({args[0]!r}): mark it @pytest.mark.process")


sys.addaudithook(_ProcessGuard.audit)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> object:
    _ProcessGuard.allowed = item.get_closest_marker("process") is not None
    try:
        return (yield)
    finally:
        _ProcessGuard.allowed = True


TESTS_DIR = Path(__file__).resolve().parent
UPSTREAM_SERVER = TESTS_DIR / "upstream_server.py"
#: Bound on how long an upstream server process may take to print its ready line.
SERVER_START_TIMEOUT = 20.0


def upstream_command(*args: str) -> list[str]:
    """Command line that runs the test upstream over stdio, e.g. ``upstream_command("--name", "a")``."""
    return [sys.executable, str(UPSTREAM_SERVER), "stdio", *args]


def pid_alive(pid: int) -> bool:
    """True while the process exists (a zombie counts: it was not reaped)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


class HttpUpstreamProcess:
    """The test upstream as a Streamable HTTP server in its own process.

    ``restart()`` starts a fresh process on the same port: every session the old one issued is
    unknown to the new one, which is how a test makes an upstream session expire.
    """

    def __init__(self, *args: str) -> None:
        self.args = list(args)
        self.port = 0
        self.url = ""
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> HttpUpstreamProcess:
        cmd = [sys.executable, str(UPSTREAM_SERVER), "http", "--port", str(self.port), *self.args]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)
        line = self._read_ready_line(self.proc)
        self.url = line.split()[1]
        self.port = int(self.url.rsplit(":", 1)[1].split("/", 1)[0])
        return self

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()

    def restart(self) -> HttpUpstreamProcess:
        self.stop()
        return self.start()

    async def arestart(self) -> HttpUpstreamProcess:
        """``restart`` off the event loop, so in-process clients keep running meanwhile."""
        return await asyncio.to_thread(self.restart)

    @staticmethod
    def _read_ready_line(proc: subprocess.Popen[bytes]) -> str:
        assert proc.stdout is not None
        deadline = time.monotonic() + SERVER_START_TIMEOUT
        buffer = b""
        with selectors.DefaultSelector() as sel:
            sel.register(proc.stdout, selectors.EVENT_READ)
            while b"\n" not in buffer:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not sel.select(remaining):
                    proc.kill()
                    raise RuntimeError("the HTTP upstream did not print its ready line in time")
                chunk = os.read(proc.stdout.fileno(), 4096)
                if not chunk:
                    raise RuntimeError(f"the HTTP upstream exited early with status {proc.wait()}")
                buffer += chunk
        line = buffer.split(b"\n", 1)[0].decode()
        if not line.startswith("READY "):
            raise RuntimeError(f"unexpected first line from the HTTP upstream: {line!r}")
        return line


@pytest.fixture
def http_upstream_factory() -> Iterator[Callable[..., HttpUpstreamProcess]]:
    """Start HTTP upstreams with the given server arguments; all are stopped after the test."""
    started: list[HttpUpstreamProcess] = []

    def start(*args: str) -> HttpUpstreamProcess:
        server = HttpUpstreamProcess(*args).start()
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


@pytest.fixture(scope="session")
def http_upstream() -> Iterator[HttpUpstreamProcess]:
    """One shared HTTP upstream (name ``web``) for tests that do not change its state."""
    server = HttpUpstreamProcess("--name", "web").start()
    yield server
    server.stop()

