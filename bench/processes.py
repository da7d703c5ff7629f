"""The processes under test: the gateway, the baseline (the SDK upstream alone over HTTP), either under callgrind,
each in its own process group so one signal stops it and every child it spawned, on every exit path."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp

from bench.procfs import memory_kib

REPO = Path(__file__).resolve().parents[1]
UPSTREAM_SERVER = REPO / "tests" / "upstream_server.py"
#: What a gateway fronts over stdio: the test upstream (every test tool), or the direct baseline's own server.
STDIO_UPSTREAMS: dict[str, dict[str, Any]] = {
    "test-upstream": {"command": [sys.executable, str(UPSTREAM_SERVER), "stdio"]},
    "direct": {"command": [sys.executable, "-m", "bench.direct", "--stdio"], "cwd": str(REPO)},
}
HOST = "127.0.0.1"
START_TIMEOUT = 30.0
STOP_TIMEOUT = 10.0
POLL_INTERVAL = 0.05
TASKSET = shutil.which("taskset") or "taskset"
VALGRIND = shutil.which("valgrind") or "valgrind"
CALLGRIND_CONTROL = shutil.which("callgrind_control") or "callgrind_control"


def base_env() -> dict[str, str]:
    """This environment without any SATGATE_* it may carry, and without proxies (all traffic is loopback)."""
    drop = ("SATGATE_", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy")
    return {k: v for k, v in os.environ.items() if not k.startswith(drop)}


def pinned(argv: list[str], cpu: int | None) -> list[str]:
    """``argv`` under ``taskset -c cpu`` (taskset execs: the pid stays the server's), or as is."""
    return argv if cpu is None else [TASKSET, "-c", str(cpu), *argv]


@dataclass(frozen=True)
class Pinning:
    server_cpu: int | None
    client_cpu: int | None
    note: str


def pin_plan(taskset: str | None, cpus: Sequence[int]) -> Pinning:
    """Server under test on the first allowed CPU, the load generator on the second, when both can be had."""
    if taskset is None:
        return Pinning(None, None, "not pinned: taskset not found (server and load generator share every CPU)")
    if len(cpus) < 2:
        return Pinning(None, None, f"not pinned: only {len(cpus)} CPU available (server and load generator share it)")
    return Pinning(cpus[0], cpus[1], f"server under test on CPU {cpus[0]} (taskset), load generator on CPU {cpus[1]}")


@dataclass(frozen=True)
class Auth:
    """The gateway's auth settings and one bearer token per client (None in mode ``none``)."""

    env: dict[str, str]
    tokens: list[str | None]


#: The Redis the ``metered`` target shares its budgets and rate buckets on (a database of its own).
BENCH_REDIS_URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/14")
#: A budget and a rate no bench run exhausts: every call is charged and counted, none is refused.
METERED_BUDGET = 1e12
METERED_RATE = "1000000/s"


def redis_reachable(url: str = BENCH_REDIS_URL, timeout: float = 1.0) -> bool:
    """Whether something listens where the metered target's Redis should be (it is skipped otherwise)."""
    parts = urlsplit(url)
    try:
        with socket.create_connection((parts.hostname or HOST, parts.port or 6379), timeout=timeout):
            return True
    except OSError:
        return False


def make_auth(mode: str, clients: int, budget_limit: float | None = None, *, controls: str | None = None) -> Auth:
    """Fresh secrets per run: ``header`` mints one macaroon per client so each is its own agent to the gateway;
    ``metered`` is header mode on Redis with every call charged to a budget and counted by a rate limit."""
    if mode == "metered":
        header = make_auth("header", clients, METERED_BUDGET)
        env = {**header.env, "SATGATE_REDIS_URL": BENCH_REDIS_URL, "SATGATE_RATE_LIMIT": METERED_RATE,
               "SATGATE_ENFORCEMENT": "control"}
        return Auth(env, header.tokens)
    if mode == "none":
        return Auth({"SATGATE_AUTH_MODE": "none"}, [None] * clients)
    if mode == "config":
        token = secrets.token_urlsafe(32)
        return Auth({"SATGATE_AUTH_MODE": "config", "SATGATE_STATIC_TOKEN": token}, [token] * clients)
    from satgate_mcp.auth.macaroons import mint_token
    from satgate_mcp.policy.controls import parse_controls

    root_key = secrets.token_urlsafe(48)
    run = secrets.token_hex(4)  # a shared store keeps budgets: each run's token ids are its own
    carried = parse_controls(controls) if controls is not None else None
    tokens: list[str | None] = [mint_token(root_key, f"bench-{run}-{n}", budget_limit=budget_limit, controls=carried)
                                for n in range(clients)]
    return Auth({"SATGATE_AUTH_MODE": "header", "SATGATE_ROOT_KEY": root_key}, tokens)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        port: int = sock.getsockname()[1]
        return port


class ServerProcess:
    """A server under test in its own process group (so one signal reaches it and every child it spawns)."""

    name = "server"
    start_timeout = START_TIMEOUT

    def __init__(self, workdir: Path, *, name: str | None = None, pin_cpu: int | None = None) -> None:
        self.port = free_port()
        if name is not None:
            self.name = name
        self.log_file = workdir / f"{self.name}.log"
        self.pin_cpu = pin_cpu
        self.env: dict[str, str] = base_env()
        self.proc: subprocess.Popen[bytes] | None = None

    def command(self) -> list[str]:
        raise NotImplementedError

    @property
    def mcp_url(self) -> str:
        return f"http://{HOST}:{self.port}/mcp"

    @property
    def pid(self) -> int | None:
        return None if self.proc is None else self.proc.pid

    def start(self) -> None:
        with self.log_file.open("wb") as log:
            self.proc = subprocess.Popen(pinned(self.command(), self.pin_cpu), cwd=REPO, env=self.env,
                                         stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True)
        LIVE.add(self)

    def memory_kib(self, field_name: str = "VmRSS") -> int | None:
        return None if self.proc is None else memory_kib(self.proc.pid, field_name)

    def log_tail(self, lines: int = 20) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log_file.read_text(errors="replace").splitlines()[-lines:])
        return ""

    def check_alive(self) -> None:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise RuntimeError(f"{self.name} exited with {self.proc.returncode}:\n{self.log_tail()}")

    async def is_ready(self, http: aiohttp.ClientSession) -> bool:
        raise NotImplementedError

    async def wait_ready(self, http: aiohttp.ClientSession) -> None:
        """Bounded poll: until the process listens there is nothing to await, and a dead one fails at once."""
        deadline = time.monotonic() + self.start_timeout
        while True:
            self.check_alive()
            if await self.is_ready(http):
                return
            if time.monotonic() >= deadline:
                raise RuntimeError(f"{self.name} not ready within {self.start_timeout:.0f}s:\n{self.log_tail()}")
            await asyncio.sleep(POLL_INTERVAL)

    def stop(self) -> None:
        """SIGTERM the process group (a gateway drains and stops its upstream), SIGKILL if it lingers."""
        LIVE.discard(self)
        proc, self.proc = self.proc, None
        if proc is None:
            return
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(STOP_TIMEOUT)
        # The leader may be gone while a child it spawned lingers: the group gets SIGKILL either way.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(STOP_TIMEOUT)


#: Every server started and not yet stopped; ``stop_all`` runs on any exit path.
LIVE: set[ServerProcess] = set()


def stop_all() -> None:
    for server in list(LIVE):
        server.stop()


class Gateway(ServerProcess):
    """``python -m satgate_mcp serve`` with one stdio upstream (``STDIO_UPSTREAMS``; the test upstream unless
    ``upstream`` says otherwise)."""

    name = "gateway"

    def __init__(self, auth: Auth, log_level: str, workdir: Path, *, name: str | None = None,
                 pin_cpu: int | None = None, extra_env: dict[str, str] | None = None,
                 upstream: str = "test-upstream") -> None:
        super().__init__(workdir, name=name, pin_cpu=pin_cpu)
        upstreams = {"bench": {"transport": "stdio", **STDIO_UPSTREAMS[upstream]}}
        self.env = {**self.env, **auth.env, "SATGATE_HOST": HOST, "SATGATE_PORT": str(self.port),
                    "SATGATE_UPSTREAMS": json.dumps(upstreams), "SATGATE_LOG_FORMAT": "json",
                    "SATGATE_LOG_LEVEL": log_level, "SATGATE_DRAIN_SECONDS": "1", **(extra_env or {})}

    def command(self) -> list[str]:
        return [sys.executable, "-m", "satgate_mcp", "serve"]

    async def is_ready(self, http: aiohttp.ClientSession) -> bool:
        """/readyz answers 200 once the upstream is connected, not merely once the port is open."""
        with contextlib.suppress(aiohttp.ClientError):
            async with http.get(f"http://{HOST}:{self.port}/readyz") as resp:
                return resp.status == 200
        return False


class Upstream(ServerProcess):
    """The official-SDK test upstream served alone over Streamable HTTP: the baseline."""

    name = "baseline"

    def __init__(self, workdir: Path, *, json_response: bool, pin_cpu: int | None = None,
                 name: str | None = None) -> None:
        super().__init__(workdir, name=name, pin_cpu=pin_cpu)
        self.json_response = json_response

    def command(self) -> list[str]:
        return [sys.executable, str(UPSTREAM_SERVER), "http", "--host", HOST, "--port", str(self.port),
                *(["--json-response"] if self.json_response else [])]

    async def is_ready(self, http: aiohttp.ClientSession) -> bool:
        """The ``READY <url>`` line the server prints once it accepts connections."""
        with contextlib.suppress(OSError):
            return "READY " in self.log_file.read_text(errors="replace")
        return False


class BenchServer(ServerProcess):
    """One of the benchmark's own servers (``python -m bench.<module> --port N``): the direct baseline
    (``bench/direct.py``) or the harness's ceiling (``bench/noop.py``)."""

    def __init__(self, module: str, workdir: Path, *, name: str, pin_cpu: int | None = None) -> None:
        super().__init__(workdir, name=name, pin_cpu=pin_cpu)
        self.module = module

    def command(self) -> list[str]:
        return [sys.executable, "-m", f"bench.{self.module}", "--port", str(self.port)]

    async def is_ready(self, http: aiohttp.ClientSession) -> bool:
        """The ``READY <url>`` line the server prints once it accepts connections."""
        with contextlib.suppress(OSError):
            return "READY " in self.log_file.read_text(errors="replace")
        return False


def callgrind_total(text: str) -> int | None:
    """The ``totals:`` (else ``summary:``) instruction count of a callgrind output file; None when absent."""
    found: dict[str, int] = {}
    for line in text.splitlines():
        name, _, value = line.partition(":")
        if name in ("totals", "summary") and value.split() and value.split()[0].isdecimal():
            found[name] = int(value.split()[0])
    return found.get("totals", found.get("summary"))


class Callgrind(ServerProcess):
    """A server under ``valgrind --tool=callgrind`` with counting off until ``count(True)``: instructions are
    what the process executes (every thread), the same figure on a busy machine as on a quiet one."""

    start_timeout = 300.0  # startup under valgrind is some fifty times slower

    @property
    def out(self) -> Path:
        return self.log_file.with_suffix(".callgrind")

    def command(self) -> list[str]:
        return [VALGRIND, "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={self.out}",
                *super().command()]

    def count(self, on: bool) -> None:
        assert self.pid is not None
        subprocess.run([CALLGRIND_CONTROL, "-i", "on" if on else "off", str(self.pid)], check=True,
                       capture_output=True, timeout=60)

    def instructions(self) -> int | None:
        """Dump, then the counted total (the dump holds every instruction counted since counting began)."""
        assert self.pid is not None
        subprocess.run([CALLGRIND_CONTROL, "-d", str(self.pid)], check=True, capture_output=True, timeout=60)
        totals = [callgrind_total(f.read_text(errors="replace")) for f in self.out.parent.glob(f"{self.out.name}*")]
        return max((t for t in totals if t is not None), default=None)


class CallgrindGateway(Callgrind, Gateway):
    """The gateway counted (its process and threads, not the stdio child)."""


class CallgrindUpstream(Callgrind, Upstream):
    """The baseline counted: the same server the load rounds compare against."""
