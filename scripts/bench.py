#!/usr/bin/env python3
"""Load benchmark: a real gateway process, the real stdio test upstream, N concurrent clients.

Starts ``python -m satgate_mcp serve`` on a free loopback port with ``tests/upstream_server.py`` as
its one stdio upstream, opens N MCP sessions (raw aiohttp JSON-RPC, or the official SDK client),
then has every client call ``echo`` COUNT times in a loop, all clients at once. Prints calls/s,
latency percentiles and the gateway's resident memory before and after (from /proc/<pid>/status),
then stops the gateway's process group. Everything is bounded by ``--timeout``; nothing listens
beyond 127.0.0.1.

    .venv/bin/python scripts/bench.py --clients 20 --calls 200 --auth header --client raw
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

REPO = Path(__file__).resolve().parents[1]
UPSTREAM_SERVER = REPO / "tests" / "upstream_server.py"
HOST = "127.0.0.1"
PROTOCOL_VERSION = "2025-11-25"
MAX_CLIENTS = 1000
MAX_CALLS = 1_000_000
START_TIMEOUT = 30.0
STOP_TIMEOUT = 10.0
POLL_INTERVAL = 0.05

CallOnce = Callable[[int], Awaitable[bool]]


# --- pure parts -------------------------------------------------------------------------------------


def percentile(sorted_values: Sequence[float], fraction: float) -> float:
    """Nearest-rank percentile of already sorted values (``fraction`` in 0..1); NaN when empty."""
    if not sorted_values:
        return math.nan
    rank = max(1, math.ceil(fraction * len(sorted_values)))
    return sorted_values[min(rank, len(sorted_values)) - 1]


def rss_kib(status_text: str, field_name: str = "VmRSS") -> int | None:
    """A ``/proc/<pid>/status`` memory field in KiB, or None when absent (process gone, kernel thread)."""
    for line in status_text.splitlines():
        name, _, value = line.partition(":")
        if name == field_name:
            parts = value.split()
            return int(parts[0]) if parts and parts[0].isdigit() else None
    return None


def base_env() -> dict[str, str]:
    """This environment without any SATGATE_* it may carry, and without proxies (all traffic is loopback)."""
    drop = ("SATGATE_", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy")
    return {k: v for k, v in os.environ.items() if not k.startswith(drop)}


@dataclass(frozen=True)
class Auth:
    """The gateway's auth settings and one bearer token per client (None in mode ``none``)."""

    env: dict[str, str]
    tokens: list[str | None]


def make_auth(mode: str, clients: int) -> Auth:
    if mode == "none":
        return Auth({"SATGATE_AUTH_MODE": "none"}, [None] * clients)
    if mode == "config":
        token = secrets.token_urlsafe(32)
        return Auth({"SATGATE_AUTH_MODE": "config", "SATGATE_STATIC_TOKEN": token}, [token] * clients)
    from satgate_mcp.auth.macaroons import mint_token

    root_key = secrets.token_urlsafe(48)
    tokens: list[str | None] = [mint_token(root_key, f"bench-{n}") for n in range(clients)]
    return Auth({"SATGATE_AUTH_MODE": "header", "SATGATE_ROOT_KEY": root_key}, tokens)


@dataclass
class Tally:
    latencies: list[float] = field(default_factory=list)
    errors: int = 0


@dataclass(frozen=True)
class Report:
    clients: int
    calls_per_client: int
    client_kind: str
    auth: str
    ok: int
    errors: int
    seconds: float
    p50_ms: float
    p90_ms: float
    p99_ms: float
    max_ms: float
    rss_before_kib: int | None
    rss_after_kib: int | None
    rss_peak_kib: int | None

    @property
    def calls_per_second(self) -> float:
        return (self.ok + self.errors) / self.seconds if self.seconds > 0 else math.nan

    def text(self) -> str:
        def mib(kib: int | None) -> str:
            return "n/a" if kib is None else f"{kib / 1024:.1f} MiB"

        return "\n".join([
            f"satgate-mcp bench: {self.clients} clients x {self.calls_per_client} calls "
            f"({self.client_kind} client, auth={self.auth})",
            f"calls        {self.ok} ok, {self.errors} errors in {self.seconds:.3f} s",
            f"throughput   {self.calls_per_second:.1f} calls/s",
            f"latency      p50 {self.p50_ms:.2f} ms   p90 {self.p90_ms:.2f} ms   p99 {self.p99_ms:.2f} ms"
            f"   max {self.max_ms:.2f} ms",
            f"gateway RSS  before {mib(self.rss_before_kib)}, after {mib(self.rss_after_kib)}"
            f" (peak {mib(self.rss_peak_kib)})",
        ])


def summarize(tallies: Sequence[Tally], seconds: float, args: argparse.Namespace,
              rss: tuple[int | None, int | None, int | None]) -> Report:
    latencies = sorted(x for t in tallies for x in t.latencies)
    errors = sum(t.errors for t in tallies)
    ms = [x * 1000 for x in latencies]
    return Report(args.clients, args.calls, args.client, args.auth, len(latencies) - errors, errors, seconds,
                  percentile(ms, 0.50), percentile(ms, 0.90), percentile(ms, 0.99), ms[-1] if ms else math.nan,
                  *rss)


# --- the gateway process ------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        port: int = sock.getsockname()[1]
        return port


class Gateway:
    def __init__(self, auth: Auth, log_level: str, workdir: Path) -> None:
        self.port = free_port()
        self.log_file = workdir / "gateway.log"
        upstreams = {"bench": {"transport": "stdio", "command": [sys.executable, str(UPSTREAM_SERVER), "stdio"]}}
        self.env = {**base_env(), **auth.env, "SATGATE_HOST": HOST, "SATGATE_PORT": str(self.port),
                    "SATGATE_UPSTREAMS": json.dumps(upstreams), "SATGATE_LOG_FORMAT": "json",
                    "SATGATE_LOG_LEVEL": log_level, "SATGATE_DRAIN_SECONDS": "1"}
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def start(self) -> None:
        with self.log_file.open("wb") as log:
            self.proc = subprocess.Popen([sys.executable, "-m", "satgate_mcp", "serve"], cwd=REPO, env=self.env,
                                         stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True)

    def memory_kib(self, field_name: str = "VmRSS") -> int | None:
        if self.proc is None:
            return None
        try:
            return rss_kib(Path(f"/proc/{self.proc.pid}/status").read_text(), field_name)
        except OSError:
            return None

    def log_tail(self, lines: int = 20) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log_file.read_text(errors="replace").splitlines()[-lines:])
        return ""

    async def wait_ready(self, http: aiohttp.ClientSession) -> None:
        """Bounded poll of /readyz: until the process listens there is nothing to await."""
        assert self.proc is not None
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"gateway exited with {self.proc.returncode}:\n{self.log_tail()}")
            with contextlib.suppress(aiohttp.ClientError):
                async with http.get(f"{self.url}/readyz") as resp:
                    if resp.status == 200:
                        return
            if time.monotonic() >= deadline:
                raise RuntimeError(f"gateway not ready within {START_TIMEOUT:.0f}s:\n{self.log_tail()}")
            await asyncio.sleep(POLL_INTERVAL)

    def stop(self) -> None:
        """SIGTERM the process group (the gateway drains and stops its upstream), SIGKILL if it lingers."""
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(STOP_TIMEOUT)


# --- clients ------------------------------------------------------------------------------------------


def _headers(token: str | None, session_id: str | None = None) -> dict[str, str]:
    headers = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    if session_id is not None:
        headers["Mcp-Session-Id"] = session_id
        headers["MCP-Protocol-Version"] = PROTOCOL_VERSION
    return headers


async def run_raw_client(url: str, token: str | None, calls: int, go: asyncio.Event, ready: Callable[[], None]
                         ) -> Tally:
    """One keep-alive connection speaking JSON-RPC over Streamable HTTP by hand: the gateway's cost, not a client's."""
    tally = Tally()
    connector = aiohttp.TCPConnector(limit=1)
    async with aiohttp.ClientSession(connector=connector) as http:
        init = {"jsonrpc": "2.0", "id": 0, "method": "initialize",
                "params": {"protocolVersion": PROTOCOL_VERSION, "capabilities": {},
                           "clientInfo": {"name": "satgate-bench", "version": "1"}}}
        async with http.post(f"{url}/mcp", json=init, headers=_headers(token)) as resp:
            resp.raise_for_status()
            session_id = resp.headers["Mcp-Session-Id"]
            await resp.read()
        note = {"jsonrpc": "2.0", "method": "notifications/initialized"}
        async with http.post(f"{url}/mcp", json=note, headers=_headers(token, session_id)) as resp:
            await resp.read()
        headers = _headers(token, session_id)
        ready()
        await go.wait()
        for n in range(1, calls + 1):
            body = {"jsonrpc": "2.0", "id": n, "method": "tools/call",
                    "params": {"name": "echo", "arguments": {"text": f"call {n}"}}}
            started = time.perf_counter()
            try:
                async with http.post(f"{url}/mcp", json=body, headers=headers) as resp:
                    answer: Any = await resp.json(content_type=None)
                ok = resp.status == 200 and isinstance(answer, dict) and "result" in answer
            except (aiohttp.ClientError, ValueError):
                ok = False
            tally.latencies.append(time.perf_counter() - started)
            tally.errors += not ok
        async with http.delete(f"{url}/mcp", headers=headers) as resp:
            await resp.read()
    return tally


async def run_sdk_client(url: str, token: str | None, calls: int, go: asyncio.Event, ready: Callable[[], None]
                         ) -> Tally:
    """The official SDK client, as an agent holds it: one ClientSession, initialized once."""
    import httpx2
    from mcp.client.session import ClientSession
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared.exceptions import MCPError

    tally = Tally()
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    http = httpx2.AsyncClient(headers=headers, trust_env=False, timeout=httpx2.Timeout(30.0))
    async with (http, streamable_http_client(f"{url}/mcp", http_client=http) as (read, write),
                ClientSession(read, write, read_timeout_seconds=30.0) as session):
        await session.initialize()
        ready()
        await go.wait()
        for n in range(1, calls + 1):
            started = time.perf_counter()
            try:
                result = await session.call_tool("echo", {"text": f"call {n}"})
                ok = not result.is_error
            except (MCPError, httpx2.HTTPError):
                ok = False
            tally.latencies.append(time.perf_counter() - started)
            tally.errors += not ok
    return tally


async def drive(gateway: Gateway, auth: Auth, args: argparse.Namespace) -> Report:
    async with aiohttp.ClientSession() as http:
        await gateway.wait_ready(http)
    rss_before = gateway.memory_kib()
    run = run_sdk_client if args.client == "sdk" else run_raw_client
    go = asyncio.Event()
    all_ready = asyncio.Event()
    ready_count = 0

    def ready() -> None:
        nonlocal ready_count
        ready_count += 1
        if ready_count == args.clients:
            all_ready.set()

    tasks = [asyncio.create_task(run(gateway.url, token, args.calls, go, ready)) for token in auth.tokens]
    try:
        # Sessions are opened first; the clock starts when every client is ready to call.
        waiter = asyncio.create_task(all_ready.wait())
        done, _ = await asyncio.wait([waiter, *tasks], return_when=asyncio.FIRST_COMPLETED)
        if waiter not in done:
            waiter.cancel()
            for task in done:
                task.result()  # a client that failed to open its session raises here
        started = time.perf_counter()
        go.set()
        tallies = await asyncio.gather(*tasks)
        seconds = time.perf_counter() - started
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return summarize(tallies, seconds, args, (rss_before, gateway.memory_kib(), gateway.memory_kib("VmHWM")))


# --- entry --------------------------------------------------------------------------------------------


def bounded_int(low: int, high: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        value = int(text)
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be between {low} and {high}")
        return value

    return parse


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("-n", "--clients", type=bounded_int(1, MAX_CLIENTS), default=10,
                        help="concurrent clients, one MCP session each (default 10)")
    parser.add_argument("-c", "--calls", type=bounded_int(1, MAX_CALLS), default=100,
                        help="tools/call per client (default 100)")
    parser.add_argument("--auth", choices=["none", "config", "header"], default="header",
                        help="gateway auth mode; header mints one macaroon per client (default header)")
    parser.add_argument("--client", choices=["raw", "sdk"], default="raw",
                        help="raw aiohttp JSON-RPC, or the official mcp SDK client (default raw)")
    parser.add_argument("--log-level", default="INFO", help="the gateway's SATGATE_LOG_LEVEL (default INFO)")
    parser.add_argument("--timeout", type=float, default=300.0, help="give up after this many seconds (default 300)")
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    auth = make_auth(args.auth, args.clients)
    with tempfile.TemporaryDirectory(prefix="satgate-bench-") as workdir:
        gateway = Gateway(auth, args.log_level, Path(workdir))
        gateway.start()
        try:
            report = asyncio.run(asyncio.wait_for(drive(gateway, auth, args), args.timeout))
        except TimeoutError:
            print(f"bench: gave up after {args.timeout:.0f}s\n{gateway.log_tail()}", file=sys.stderr)
            return 1
        except (RuntimeError, aiohttp.ClientError, OSError) as exc:
            print(f"bench: {type(exc).__name__}: {exc}\n{gateway.log_tail()}", file=sys.stderr)
            return 1
        finally:
            gateway.stop()
    if args.json:
        print(json.dumps({**report.__dict__, "calls_per_second": report.calls_per_second}))
    else:
        print(report.text())
    return 0 if report.errors == 0 else 2


if __name__ == "__main__":
    sys.exit(main())
