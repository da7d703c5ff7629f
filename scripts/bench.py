#!/usr/bin/env python3
"""Load benchmark: a real gateway process, the real stdio test upstream, N concurrent clients.

Starts ``python -m satgate_mcp serve`` on a free loopback port with ``tests/upstream_server.py`` as
its one stdio upstream, opens N MCP sessions (raw aiohttp JSON-RPC, or the official SDK client),
then has every client call ``echo`` COUNT times in a loop, all clients at once. Prints calls/s,
latency percentiles and the gateway's resident memory before and after (from /proc/<pid>/status),
then stops the gateway's process group. Everything is bounded by ``--timeout``; nothing listens
beyond 127.0.0.1.

    .venv/bin/python scripts/bench.py --clients 20 --calls 200 --auth header --client raw

``--compare`` runs a side-by-side benchmark instead. The baseline is the same SDK upstream served alone
over Streamable HTTP. It is compared with the gateway over that upstream via stdio, in auth ``none`` and
``header``: N sessions and M workers calling ``echo`` for ``--duration`` seconds, in ``--rounds``
interleaved rounds (a fresh server each time). Per target it reports calls/s, the ratio to the same
round's baseline, p50/p99 under load, p50 of one call at a time, server CPU ms per call from
/proc/<pid>/stat (the process and its children, separately and together, over the load window only) and
initialize/s. For the gateway alone it adds idle KiB per session, a resumed session's first call (on a
second process) against an ordinary first call, and the SSE answer path against the JSON one: for
``echo`` when the gateway answers it SSE, and always for a call with one progress notification (``slow``,
which streams when the client reads SSE). ``--soak SECONDS`` adds a gateway under load for that long with
its RSS sampled (flat or not). With ``taskset`` and two CPUs, the server under test runs on the first CPU and the
load generator on the second. Figures are printed, never asserted; ``--json`` prints them as one object.

    .venv/bin/python scripts/bench.py --compare                  # 8 sessions, 16 workers, 10 s x 3 rounds
    .venv/bin/python scripts/bench.py --compare --duration 2 --rounds 1 --json
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import math
import os
import secrets
import shutil
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


def make_auth(mode: str, clients: int, budget_limit: float | None = None) -> Auth:
    if mode == "none":
        return Auth({"SATGATE_AUTH_MODE": "none"}, [None] * clients)
    if mode == "config":
        token = secrets.token_urlsafe(32)
        return Auth({"SATGATE_AUTH_MODE": "config", "SATGATE_STATIC_TOKEN": token}, [token] * clients)
    from satgate_mcp.auth.macaroons import mint_token

    root_key = secrets.token_urlsafe(48)
    tokens: list[str | None] = [mint_token(root_key, f"bench-{n}", budget_limit=budget_limit) for n in range(clients)]
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
    def pid(self) -> int | None:
        return None if self.proc is None else self.proc.pid

    def start(self) -> None:
        argv = self.command()
        if self.pin_cpu is not None:
            argv = [TASKSET, "-c", str(self.pin_cpu), *argv]  # taskset execs: the pid stays the server's
        with self.log_file.open("wb") as log:
            self.proc = subprocess.Popen(argv, cwd=REPO, env=self.env, stdin=subprocess.DEVNULL, stdout=log,
                                         stderr=subprocess.STDOUT, start_new_session=True)
        LIVE.add(self)

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

    def check_alive(self) -> None:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise RuntimeError(f"{self.name} exited with {self.proc.returncode}:\n{self.log_tail()}")

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
TASKSET = shutil.which("taskset") or "taskset"


def stop_all() -> None:
    for server in list(LIVE):
        server.stop()


class Gateway(ServerProcess):
    """``python -m satgate_mcp serve`` with ``tests/upstream_server.py`` as its one stdio upstream."""

    name = "gateway"

    def __init__(self, auth: Auth, log_level: str, workdir: Path, *, name: str | None = None,
                 pin_cpu: int | None = None, extra_env: dict[str, str] | None = None) -> None:
        super().__init__(workdir, name=name, pin_cpu=pin_cpu)
        upstreams = {"bench": {"transport": "stdio", "command": [sys.executable, str(UPSTREAM_SERVER), "stdio"]}}
        self.env = {**self.env, **auth.env, "SATGATE_HOST": HOST, "SATGATE_PORT": str(self.port),
                    "SATGATE_UPSTREAMS": json.dumps(upstreams), "SATGATE_LOG_FORMAT": "json",
                    "SATGATE_LOG_LEVEL": log_level, "SATGATE_DRAIN_SECONDS": "1", **(extra_env or {})}

    def command(self) -> list[str]:
        return [sys.executable, "-m", "satgate_mcp", "serve"]

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def mcp_url(self) -> str:
        return f"{self.url}/mcp"

    async def wait_ready(self, http: aiohttp.ClientSession) -> None:
        """Bounded poll of /readyz: until the process listens there is nothing to await."""
        deadline = time.monotonic() + self.start_timeout
        while True:
            self.check_alive()
            with contextlib.suppress(aiohttp.ClientError):
                async with http.get(f"{self.url}/readyz") as resp:
                    if resp.status == 200:
                        return
            if time.monotonic() >= deadline:
                raise RuntimeError(f"{self.name} not ready within {self.start_timeout:.0f}s:\n{self.log_tail()}")
            await asyncio.sleep(POLL_INTERVAL)


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


VALGRIND = shutil.which("valgrind") or "valgrind"
CALLGRIND_CONTROL = shutil.which("callgrind_control") or "callgrind_control"


def callgrind_total(text: str) -> int | None:
    """The ``totals:`` (else ``summary:``) instruction count of a callgrind output file; None when absent."""
    found: dict[str, int] = {}
    for line in text.splitlines():
        name, _, value = line.partition(":")
        if name in ("totals", "summary") and value.split() and value.split()[0].isdecimal():
            found[name] = int(value.split()[0])
    return found.get("totals", found.get("summary"))


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

    @property
    def mcp_url(self) -> str:
        return f"http://{HOST}:{self.port}/mcp"

    async def wait_ready(self, http: aiohttp.ClientSession) -> None:
        """Bounded wait for the ``READY <url>`` line the server prints once it accepts connections."""
        deadline = time.monotonic() + self.start_timeout
        while True:
            self.check_alive()
            with contextlib.suppress(OSError):
                if "READY " in self.log_file.read_text(errors="replace"):
                    return
            if time.monotonic() >= deadline:
                raise RuntimeError(f"{self.name} not ready within {START_TIMEOUT:.0f}s:\n{self.log_tail()}")
            await asyncio.sleep(POLL_INTERVAL)


class CallgrindUpstream(Callgrind, Upstream):
    """The baseline counted: the same server the load rounds compare against."""


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


# --- compare: pure parts ------------------------------------------------------------------------------

TARGETS = ("baseline", "gateway-none", "gateway-header")
ACCEPT_BOTH = "application/json, text/event-stream"
ACCEPT_JSON = "application/json"


@dataclass(frozen=True)
class ProcStat:
    pid: int
    ppid: int
    ticks: int  # utime + stime, in clock ticks (os.sysconf("SC_CLK_TCK") per second)


def parse_proc_stat(text: str) -> ProcStat:
    """One ``/proc/<pid>/stat`` line; ``comm`` is in parentheses and may hold spaces or ``)``: split at the last."""
    head, sep, rest = text.rpartition(")")
    if not sep:
        raise ValueError("not a /proc/<pid>/stat line")
    pid = int(head.split("(", 1)[0])
    fields = rest.split()  # fields[0] is field 3 (state); utime and stime are fields 14 and 15
    if len(fields) < 13:
        raise ValueError("short /proc/<pid>/stat line")
    return ProcStat(pid, int(fields[1]), int(fields[11]) + int(fields[12]))


def descendants(root: int, parent_of: dict[int, int]) -> list[int]:
    """Every process below ``root`` in the tree that ``parent_of`` (pid -> ppid) describes, sorted."""
    children: dict[int, list[int]] = {}
    for pid, ppid in parent_of.items():
        children.setdefault(ppid, []).append(pid)
    found: list[int] = []
    todo = list(children.get(root, []))
    while todo:
        pid = todo.pop()
        if pid in found or pid == root:
            continue
        found.append(pid)
        todo.extend(children.get(pid, []))
    return sorted(found)


def tick_delta(before: dict[int, int], after: dict[int, int]) -> int:
    """Ticks spent between two snapshots (pid -> ticks); a process born in between (or a reused pid: its count
    went down) counts from zero. One that died in between is lost: the window should hold no restarts."""
    return sum(ticks - before.get(pid, 0) if ticks >= before.get(pid, 0) else ticks for pid, ticks in after.items())


def cpu_ms_per_call(ticks: int, clk_tck: int, calls: int) -> float:
    return ticks * 1000.0 / clk_tck / calls if calls > 0 and clk_tck > 0 else math.nan


def sse_data(text: str) -> list[str]:
    """The ``data`` of each event in a ``text/event-stream`` body (multi-line data joined by newlines)."""
    events: list[str] = []
    data: list[str] | None = None
    for line in text.replace("\r\n", "\n").replace("\r", "\n").split("\n"):
        if line == "":
            if data is not None:
                events.append("\n".join(data))
            data = None
        elif line.startswith("data:"):
            value = line[5:]
            (data := data if data is not None else []).append(value[1:] if value.startswith(" ") else value)
    if data is not None:
        events.append("\n".join(data))
    return events


def jsonrpc_answer(content_type: str, body: bytes, request_id: object) -> dict[str, Any] | None:
    """The JSON-RPC answer to ``request_id`` in a JSON or SSE body, or None when it holds none."""
    texts = sse_data(body.decode(errors="replace")) if content_type == "text/event-stream" else [body.decode()]
    for text in texts:
        try:
            decoded: Any = json.loads(text)
        except ValueError:
            continue  # an SSE priming event, a keep-alive, an empty body
        for message in decoded if isinstance(decoded, list) else [decoded]:
            if (isinstance(message, dict) and message.get("id") == request_id
                    and ("result" in message or "error" in message)):
                return message
    return None


def call_succeeded(message: dict[str, Any] | None) -> bool:
    result = None if message is None else message.get("result")
    return isinstance(result, dict) and result.get("isError") is not True


def interleave(rounds: int, targets: Sequence[str] = TARGETS) -> list[tuple[int, str]]:
    """(round, target) in run order: every target once per round, so drift hits each alike."""
    return [(r, t) for r in range(1, rounds + 1) for t in targets]


def ratio(value: float, base: float) -> float:
    return value / base if base > 0 and not math.isnan(value) and not math.isnan(base) else math.nan


def median(values: Sequence[float]) -> float:
    real = sorted(v for v in values if not math.isnan(v))
    if not real:
        return math.nan
    mid = len(real) // 2
    return real[mid] if len(real) % 2 else (real[mid - 1] + real[mid]) / 2


def fmt(value: float | None, digits: int = 1, suffix: str = "") -> str:
    if value is None or math.isnan(value):
        return "n/a"
    return f"{value:,.{digits}f}{suffix}"


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max([len(h), *(len(r[i]) for r in rows)]) for i, h in enumerate(headers)]
    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)) + " |"
    return "\n".join([line(headers), "|" + "|".join("-" * (w + 2) for w in widths) + "|", *map(line, rows)])


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


def jsonable(value: Any) -> Any:
    """NaN (a figure that could not be had) becomes null, so ``--json`` stays valid JSON."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    return value


ROUND_METRICS = ("calls_per_second", "ratio", "p50_ms", "p99_ms", "sequential_p50_ms", "server_cpu_ms_per_call",
                 "server_main_cpu_ms_per_call", "server_children_cpu_ms_per_call", "initialize_per_second",
                 "loadgen_cpu_pct")


def with_ratios(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each row plus ``ratio``: its calls/s over the baseline's in the same round (NaN without one)."""
    base = {r["round"]: float(r["calls_per_second"]) for r in rows if r["target"] == "baseline"}
    return [{**r, "ratio": ratio(float(r["calls_per_second"]), base.get(r["round"], math.nan))} for r in rows]


def summarize_rounds(rows: Sequence[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per target, the median over rounds of every figure (ratios are per round first, then the median)."""
    out: dict[str, dict[str, float]] = {}
    for target in dict.fromkeys(r["target"] for r in rows):
        mine = [r for r in rows if r["target"] == target]
        out[target] = {m: median([float(r[m]) for r in mine if r.get(m) is not None]) for m in ROUND_METRICS}
        out[target]["errors"] = float(sum(int(r.get("errors", 0)) for r in mine))
    return out


TABLE_HEADERS = ("target", "calls/s", "x baseline", "p50 ms", "p99 ms", "1-call p50 ms",
                 "server CPU ms/call (proc + children)", "initialize/s", "load-gen CPU", "errors")


def table_row(label: str, figures: dict[str, Any]) -> list[str]:
    def num(key: str, digits: int = 1) -> str:
        value = figures.get(key)
        return fmt(None if value is None else float(value), digits)

    cpu = (f"{num('server_cpu_ms_per_call', 3)} ({num('server_main_cpu_ms_per_call', 3)}"
           f" + {num('server_children_cpu_ms_per_call', 3)})")
    return [label, num("calls_per_second"), num("ratio", 2), num("p50_ms", 2), num("p99_ms", 2),
            num("sequential_p50_ms", 2), cpu, num("initialize_per_second"), num("loadgen_cpu_pct", 0) + " %",
            str(int(figures.get("errors") or 0))]


# --- compare: measuring -------------------------------------------------------------------------------

CLK_TCK = os.sysconf("SC_CLK_TCK")
REQUEST_TIMEOUT = 30.0
WARMUP_SECONDS = 1.0
SEQUENTIAL_MAX_SECONDS = 5.0
INIT_LIMIT = 50_000
IDLE_BUDGET_SECONDS = 90.0
IDLE_WARM_SESSIONS = 100
MAX_IDLE_SESSIONS = 100_000
_ids = itertools.count(1)


def process_table() -> dict[int, ProcStat]:
    table: dict[int, ProcStat] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError, ValueError):
                stat = parse_proc_stat(Path(f"/proc/{entry}/stat").read_text())
                table[stat.pid] = stat
    return table


def tree_ticks(root: int | None) -> tuple[dict[int, int], dict[int, int]]:
    """CPU ticks so far of ``root`` and, separately, of every process below it (pid -> ticks)."""
    if root is None:
        return {}, {}
    table = process_table()
    below = descendants(root, {pid: s.ppid for pid, s in table.items()})
    main = {root: table[root].ticks} if root in table else {}
    return main, {pid: table[pid].ticks for pid in below if pid in table}


@dataclass(frozen=True)
class ToolCall:
    """What a load phase calls instead of ``echo``; ``progress`` asks for progress (a progressToken)."""

    name: str
    arguments: dict[str, Any]
    progress: bool = False


#: One progress notification before the answer: the gateway must answer it on an SSE stream when the client
#: reads one (Accept: both), and can only answer JSON (the progress dropped) when it does not.
PROGRESS_CALL = ToolCall("slow", {"steps": 1, "delay": 0}, progress=True)


@dataclass(frozen=True)
class McpSession:
    id: str
    headers: dict[str, str]


class RawClient:
    """Streamable HTTP by hand over aiohttp keep-alive connections: initialize, initialized, tools/call."""

    def __init__(self, http: aiohttp.ClientSession, mcp_url: str) -> None:
        self.http = http
        self.url = mcp_url

    async def post(self, payload: dict[str, Any], headers: dict[str, str]
                   ) -> tuple[int, str, dict[str, Any] | None, str | None]:
        async with self.http.post(self.url, data=json.dumps(payload).encode(), headers=headers) as resp:
            body = await resp.read()
            return (resp.status, resp.content_type, jsonrpc_answer(resp.content_type, body, payload.get("id")),
                    resp.headers.get("Mcp-Session-Id"))

    async def open(self, token: str | None) -> McpSession:
        headers = {"Accept": ACCEPT_BOTH, "Content-Type": "application/json"}
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        init = {"jsonrpc": "2.0", "id": next(_ids), "method": "initialize",
                "params": {"protocolVersion": PROTOCOL_VERSION, "capabilities": {},
                           "clientInfo": {"name": "satgate-bench", "version": "1"}}}
        status, _, answer, session_id = await self.post(init, headers)
        result = None if answer is None else answer.get("result")
        if status != 200 or session_id is None or not isinstance(result, dict):
            raise RuntimeError(f"initialize at {self.url} answered {status}: {answer}")
        session = McpSession(session_id, {**headers, "Mcp-Session-Id": session_id,
                                          "MCP-Protocol-Version": str(result.get("protocolVersion", PROTOCOL_VERSION))})
        note = {"jsonrpc": "2.0", "method": "notifications/initialized"}
        async with self.http.post(self.url, data=json.dumps(note).encode(), headers=session.headers) as resp:
            await resp.read()
            if resp.status >= 300:
                raise RuntimeError(f"notifications/initialized at {self.url} answered {resp.status}")
        return session

    async def call(self, session: McpSession, accept: str | None = None, tool: ToolCall | None = None
                   ) -> tuple[bool, str]:
        """One ``echo`` (or ``tool``); (succeeded, the answer's content type)."""
        n = next(_ids)
        params: dict[str, Any] = ({"name": "echo", "arguments": {"text": f"call {n}"}} if tool is None
                                  else {"name": tool.name, "arguments": dict(tool.arguments)})
        if tool is not None and tool.progress:
            params["_meta"] = {"progressToken": f"p{n}"}
        body = {"jsonrpc": "2.0", "id": n, "method": "tools/call", "params": params}
        headers = session.headers if accept is None else {**session.headers, "Accept": accept}
        try:
            status, content_type, answer, _ = await self.post(body, headers)
        except (aiohttp.ClientError, TimeoutError, ValueError):
            return False, "error"
        return status == 200 and call_succeeded(answer), content_type


async def timed_call(client: RawClient, session: McpSession, accept: str | None = None,
                     tool: ToolCall | None = None) -> tuple[float, bool, str]:
    started = time.perf_counter()
    ok, content_type = await client.call(session, accept, tool)
    return (time.perf_counter() - started) * 1000, ok, content_type


async def load_phase(client: RawClient, sessions: Sequence[McpSession], workers: int, seconds: float,
                     server_pid: int | None, accept: str | None = None, tool: ToolCall | None = None
                     ) -> dict[str, Any]:
    """``workers`` loops calling ``echo`` over ``sessions`` until ``seconds`` pass; CPU over that window only."""
    latencies: list[float] = []
    errors = 0
    answer_types: dict[str, int] = {}
    stop_at = time.perf_counter() + seconds

    async def worker(index: int) -> None:
        nonlocal errors
        session = sessions[index % len(sessions)]
        while time.perf_counter() < stop_at:
            ms, ok, content_type = await timed_call(client, session, accept, tool)
            latencies.append(ms)
            errors += not ok
            answer_types[content_type] = answer_types.get(content_type, 0) + 1

    main0, kids0 = tree_ticks(server_pid)
    cpu0, started = time.process_time(), time.perf_counter()
    await asyncio.gather(*(worker(i) for i in range(workers)))
    elapsed, cpu1 = time.perf_counter() - started, time.process_time()
    main1, kids1 = tree_ticks(server_pid)
    calls = len(latencies)
    main_ms = cpu_ms_per_call(tick_delta(main0, main1), CLK_TCK, calls)
    kids_ms = cpu_ms_per_call(tick_delta(kids0, kids1), CLK_TCK, calls)
    latencies.sort()
    return {"calls": calls, "errors": errors, "seconds": elapsed,
            "calls_per_second": calls / elapsed if elapsed > 0 else math.nan,
            "p50_ms": percentile(latencies, 0.50), "p99_ms": percentile(latencies, 0.99),
            "server_cpu_ms_per_call": main_ms + kids_ms if server_pid is not None else math.nan,
            "server_main_cpu_ms_per_call": main_ms if server_pid is not None else math.nan,
            "server_children_cpu_ms_per_call": kids_ms if server_pid is not None else math.nan,
            "server_children": len(kids1),
            # Below 100 % with a load generator that is not saturated either: the server's CPU was shared.
            "server_cpu_pct": (100 * (tick_delta(main0, main1) + tick_delta(kids0, kids1)) / CLK_TCK / elapsed
                               if server_pid is not None and elapsed > 0 else math.nan),
            "loadgen_cpu_pct": 100 * (cpu1 - cpu0) / elapsed if elapsed > 0 else math.nan,
            "answer_types": answer_types}


async def sequential_p50(client: RawClient, session: McpSession, calls: int, accept: str | None = None,
                         tool: ToolCall | None = None) -> tuple[float, int]:
    """p50 of one call at a time (nothing else in flight), bounded in count and time; (p50 ms, errors)."""
    latencies: list[float] = []
    errors = 0
    deadline = time.perf_counter() + SEQUENTIAL_MAX_SECONDS
    while len(latencies) < calls and time.perf_counter() < deadline:
        ms, ok, _ = await timed_call(client, session, accept, tool)
        latencies.append(ms)
        errors += not ok
    return percentile(sorted(latencies), 0.50), errors


async def open_many(client: RawClient, tokens: Sequence[str | None], workers: int, seconds: float, limit: int
                    ) -> tuple[int, int, float]:
    """Open sessions (initialize + initialized) as fast as ``workers`` can, until ``seconds`` or ``limit``."""
    opened = errors = claimed = 0
    started = time.perf_counter()
    stop_at = started + seconds

    async def worker() -> None:
        nonlocal opened, errors, claimed
        while time.perf_counter() < stop_at and claimed < limit:
            claimed += 1  # claimed before the await, so the workers together never pass the limit
            try:
                await client.open(tokens[claimed % len(tokens)])
                opened += 1
            except (RuntimeError, aiohttp.ClientError, TimeoutError, ValueError):
                errors += 1

    await asyncio.gather(*(worker() for _ in range(workers)))
    return opened, errors, time.perf_counter() - started


@dataclass(frozen=True)
class CompareConfig:
    sessions: int
    workers: int
    duration: float
    rounds: int
    init_seconds: float
    idle_sessions: int
    sequential_calls: int
    resume_samples: int
    baseline_json: bool
    log_level: str
    pinning: Pinning
    workdir: Path
    soak_seconds: float = 0.0
    instruction_calls: int = 0
    paired_calls: int = 0

    def gateway_env(self) -> dict[str, str]:
        """Quotas out of the way of what is measured: session-opening phases hold many sessions on few tokens."""
        cap = str(max(self.idle_sessions + IDLE_WARM_SESSIONS, INIT_LIMIT) + 1000)
        return {"SATGATE_SESSION_CAP": cap, "SATGATE_SESSIONS_PER_TOKEN": cap,
                "SATGATE_STATE_DIR": str(self.workdir / "state")}

    def gateway(self, auth: Auth, name: str) -> Gateway:
        return Gateway(auth, self.log_level, self.workdir, name=name, pin_cpu=self.pinning.server_cpu,
                       extra_env=self.gateway_env())


def client_session(workers: int) -> aiohttp.ClientSession:
    return aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT),
                                 connector=aiohttp.TCPConnector(limit=workers + 4))


async def run_target(cfg: CompareConfig, round_no: int, target: str) -> dict[str, Any]:
    """A fresh server for one target in one round: sessions, warm-up, one-at-a-time, load, initialize/s."""
    server: Gateway | Upstream
    if target == "baseline":
        server = Upstream(cfg.workdir, json_response=cfg.baseline_json, pin_cpu=cfg.pinning.server_cpu)
        tokens: list[str | None] = [None] * cfg.sessions
    else:
        auth = make_auth(target.removeprefix("gateway-"), cfg.sessions)
        server, tokens = cfg.gateway(auth, f"{target}-r{round_no}"), auth.tokens
    server.start()
    try:
        async with client_session(cfg.workers) as http:
            await server.wait_ready(http)
            client = RawClient(http, server.mcp_url)
            sessions = [await client.open(token) for token in tokens]
            await load_phase(client, sessions, cfg.workers, min(WARMUP_SECONDS, cfg.duration), None)
            seq_p50, seq_errors = await sequential_p50(client, sessions[0], cfg.sequential_calls)
            load = await load_phase(client, sessions, cfg.workers, cfg.duration, server.pid)
            rss = server.memory_kib()
            opened, init_errors, init_seconds = await open_many(client, tokens, cfg.workers, cfg.init_seconds,
                                                                INIT_LIMIT)
    finally:
        server.stop()
    return {"round": round_no, "target": target, **load, "errors": load["errors"] + seq_errors,
            "sequential_p50_ms": seq_p50, "initialize_per_second": opened / init_seconds if init_seconds else math.nan,
            "initialize_errors": init_errors, "rss_kib_after_load": rss}


async def idle_phase(cfg: CompareConfig) -> dict[str, Any]:
    """RSS growth of one gateway (auth=header) per idle session, over ``cfg.idle_sessions`` opened sessions."""
    auth = make_auth("header", cfg.sessions)
    gateway = cfg.gateway(auth, "gateway-idle")
    gateway.start()
    try:
        async with client_session(cfg.workers) as http:
            await gateway.wait_ready(http)
            client = RawClient(http, gateway.mcp_url)
            warm = await client.open(auth.tokens[0])
            for _ in range(20):
                await client.call(warm)
            await open_many(client, auth.tokens, cfg.workers, IDLE_BUDGET_SECONDS, IDLE_WARM_SESSIONS)
            before = gateway.memory_kib()
            opened, errors, seconds = await open_many(client, auth.tokens, cfg.workers, IDLE_BUDGET_SECONDS,
                                                      cfg.idle_sessions)
            after = gateway.memory_kib()
            peak = gateway.memory_kib("VmHWM")
    finally:
        gateway.stop()
    grown = after - before if after is not None and before is not None else None
    return {"sessions": opened, "errors": errors, "seconds": seconds, "rss_before_kib": before,
            "rss_after_kib": after, "rss_peak_kib": peak,
            "kib_per_session": grown / opened if grown is not None and opened else math.nan}


async def resume_and_sse_phase(cfg: CompareConfig) -> dict[str, Any]:
    """Two gateway processes, one root key: a session opened on A, first called on B, is resumed there.
    Then, on A: does the gateway answer SSE when the client accepts it, and what does that path cost?"""
    auth = make_auth("header", cfg.sessions)
    a, b = cfg.gateway(auth, "gateway-a"), cfg.gateway(auth, "gateway-b")
    a.start()
    b.start()
    try:
        async with client_session(cfg.workers) as http:
            await a.wait_ready(http)
            await b.wait_ready(http)
            on_a, on_b = RawClient(http, a.mcp_url), RawClient(http, b.mcp_url)
            for client in (on_a, on_b):  # both processes warm: imports done, upstream child answering
                warm = await client.open(auth.tokens[0])
                for _ in range(20):
                    await client.call(warm)
            ordinary: list[float] = []
            resumed: list[float] = []
            errors = {"ordinary": 0, "resumed": 0}
            for n in range(cfg.resume_samples):
                token = auth.tokens[n % len(auth.tokens)]
                fresh = await on_a.open(token)
                ms, ok, _ = await timed_call(on_a, fresh)
                ordinary.append(ms)
                errors["ordinary"] += not ok
                elsewhere = await on_a.open(token)
                ms, ok, _ = await timed_call(on_b, elsewhere)
                resumed.append(ms)
                errors["resumed"] += not ok
            resume = {"samples": cfg.resume_samples, "ordinary_first_call_p50_ms": percentile(sorted(ordinary), 0.5),
                      "resumed_first_call_p50_ms": percentile(sorted(resumed), 0.5),
                      "ordinary_errors": errors["ordinary"], "resumed_errors": errors["resumed"]}

            session = await on_a.open(auth.tokens[0])
            _, probe_type = await on_a.call(session, ACCEPT_BOTH)
            sse: dict[str, Any] = {"answers_when_both_accepted": probe_type}
            sessions = [await on_a.open(t) for t in auth.tokens]

            async def both_ways(tool: ToolCall | None) -> dict[str, Any]:
                figures: dict[str, Any] = {}
                for label, accept in (("sse", ACCEPT_BOTH), ("json", ACCEPT_JSON)):
                    p50, _ = await sequential_p50(on_a, session, cfg.sequential_calls, accept, tool)
                    load = await load_phase(on_a, sessions, cfg.workers, cfg.duration, a.pid, accept, tool)
                    figures[label] = {"sequential_p50_ms": p50, **{k: load[k] for k in (
                        "calls_per_second", "p50_ms", "p99_ms", "server_cpu_ms_per_call", "errors", "answer_types")}}
                return figures

            if probe_type == "text/event-stream":
                sse.update(await both_ways(None))
            # A call with progress streams whenever the client reads SSE: that path is measured either way.
            sse["progress"] = await both_ways(PROGRESS_CALL)
    finally:
        a.stop()
        b.stop()
    return {"resume": resume, "sse": sse}


#: RSS samples a soak takes (first and last included).
SOAK_SAMPLES = 11


async def soak_phase(cfg: CompareConfig, seconds: float) -> dict[str, Any]:
    """One gateway (auth=header) under the load of the rounds for ``seconds``, RSS sampled evenly: flat or not."""
    auth = make_auth("header", cfg.sessions)
    gateway = cfg.gateway(auth, "gateway-soak")
    gateway.start()
    rss: list[int] = []
    calls = errors = 0
    try:
        async with client_session(cfg.workers) as http:
            await gateway.wait_ready(http)
            client = RawClient(http, gateway.mcp_url)
            sessions = [await client.open(t) for t in auth.tokens]
            await load_phase(client, sessions, cfg.workers, min(WARMUP_SECONDS, seconds), None)
            step = seconds / (SOAK_SAMPLES - 1)
            for n in range(SOAK_SAMPLES):
                kib = gateway.memory_kib()
                if kib is not None:
                    rss.append(kib)
                if n < SOAK_SAMPLES - 1:
                    load = await load_phase(client, sessions, cfg.workers, step, None)
                    calls, errors = calls + load["calls"], errors + load["errors"]
    finally:
        gateway.stop()
    return {"seconds": seconds, "calls": calls, "errors": errors, "rss_kib": rss,
            "rss_growth_kib": rss[-1] - rss[0] if len(rss) > 1 else math.nan}


async def compare(cfg: CompareConfig, report: dict[str, Any], progress: Callable[[str], None]) -> None:
    """Fills ``report`` as it goes, so what was measured before a failure or a timeout can still be printed."""
    for round_no, target in interleave(cfg.rounds):
        progress(f"round {round_no}/{cfg.rounds}: {target}")
        report["rounds"].append(await run_target(cfg, round_no, target))
    progress("the stdio upstream over its own pipes (the issue's calibration row)")
    report["pipes"] = await pipes_phase(cfg)
    if cfg.paired_calls > 0:
        progress(f"one call at a time: {cfg.paired_calls} calls each to the baseline and both gateways, in turn")
        report["paired"] = await paired_phase(cfg)
    if cfg.idle_sessions > 0:
        progress(f"idle sessions: opening {cfg.idle_sessions:,} on one gateway")
        report["idle"] = await idle_phase(cfg)
    progress("resume and SSE: two gateway processes")
    report.update(await resume_and_sse_phase(cfg))
    if cfg.soak_seconds > 0:
        progress(f"soak: {cfg.soak_seconds:g} s of load on one gateway")
        report["soak"] = await soak_phase(cfg, cfg.soak_seconds)
    if cfg.instruction_calls > 0:
        report["instructions"] = {}
        for target in ("baseline", "none", "header"):
            progress(f"instructions: {cfg.instruction_calls} calls under callgrind, {target}")
            report["instructions"][target] = await instruction_phase(cfg, target)


#: The issue's figure for the stdio upstream driven over its pipes on its machine: no HTTP, no gateway, so the
#: ratio to this run's figure is how much faster or slower this machine runs the same Python.
ISSUE_PIPES_CALLS_PER_SECOND = 5973.0


class PipeClient:
    """The stdio test upstream driven directly over its pipes: JSON-RPC lines out, answers matched by id."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        assert proc.stdin is not None
        assert proc.stdout is not None
        self.proc, self._stdin, self._stdout = proc, proc.stdin, proc.stdout
        self._waiting: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        while line := await self._stdout.readline():
            message = json.loads(line)
            request_id = message.get("id") if isinstance(message, dict) else None
            waiter = self._waiting.pop(request_id, None) if isinstance(request_id, int) else None
            if waiter is not None and not waiter.done():
                waiter.set_result(message)
        for waiter in self._waiting.values():
            if not waiter.done():
                waiter.set_exception(RuntimeError("the upstream closed its output"))

    async def request(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        n = next(_ids)
        waiter = self._waiting[n] = asyncio.get_running_loop().create_future()
        self._stdin.write(json.dumps({"jsonrpc": "2.0", "id": n, "method": method, "params": params}).encode()
                          + b"\n")
        await self._stdin.drain()
        return await asyncio.wait_for(waiter, REQUEST_TIMEOUT)

    async def initialize(self) -> None:
        await self.request("initialize", {"protocolVersion": PROTOCOL_VERSION, "capabilities": {},
                                          "clientInfo": {"name": "satgate-bench", "version": "1"}})
        self._stdin.write(b'{"jsonrpc": "2.0", "method": "notifications/initialized"}\n')
        await self._stdin.drain()

    async def close(self) -> None:
        self._stdin.close()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.proc.wait(), STOP_TIMEOUT)
        if self.proc.returncode is None:
            self.proc.kill()
            await self.proc.wait()
        self._reader.cancel()


async def pipes_phase(cfg: CompareConfig) -> dict[str, Any]:
    """The issue's calibration row: ``workers`` callers keep ``echo`` calls in flight on the stdio upstream's own
    pipes for ``duration`` seconds; calls/s and the child's CPU per call."""
    argv = [sys.executable, str(UPSTREAM_SERVER), "stdio"]
    if cfg.pinning.server_cpu is not None:
        argv = [TASKSET, "-c", str(cfg.pinning.server_cpu), *argv]
    proc = await asyncio.create_subprocess_exec(*argv, cwd=REPO, env=base_env(), stdin=asyncio.subprocess.PIPE,
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL,
                                                limit=2 ** 20)
    client = PipeClient(proc)

    async def calls_for(seconds: float) -> tuple[int, int]:
        """``cfg.workers`` callers until ``seconds`` pass; (calls, errors)."""
        calls = errors = 0
        stop_at = time.perf_counter() + seconds

        async def worker() -> None:
            nonlocal calls, errors
            while time.perf_counter() < stop_at:
                answer = await client.request("tools/call", {"name": "echo", "arguments": {"text": "pipes"}})
                calls += 1
                errors += not call_succeeded(answer)

        await asyncio.gather(*(worker() for _ in range(cfg.workers)))
        return calls, errors

    try:
        await client.initialize()
        await calls_for(min(WARMUP_SECONDS, cfg.duration))  # warm-up
        before = tree_ticks(proc.pid)
        started = time.perf_counter()
        calls, errors = await calls_for(cfg.duration)
        elapsed = time.perf_counter() - started
        after = tree_ticks(proc.pid)
    finally:
        await client.close()
    cps = calls / elapsed if elapsed > 0 else math.nan
    return {"calls": calls, "errors": errors, "seconds": elapsed, "calls_per_second": cps,
            "cpu_ms_per_call": cpu_ms_per_call(tick_delta(before[0], after[0]), CLK_TCK, calls),
            "issue_calls_per_second": ISSUE_PIPES_CALLS_PER_SECOND,
            "machine_factor": ratio(ISSUE_PIPES_CALLS_PER_SECOND, cps)}


PAIRED_TARGETS = ("baseline", "gateway-none", "gateway-header")
PAIRED_WARMUP_CALLS = 50


async def paired_phase(cfg: CompareConfig) -> dict[str, Any]:
    """One call at a time to the baseline and to each gateway in turn, call by call, all running at once on the
    server CPU: every target sees the same moment of the machine, so the ratios hold even where the machine's
    speed drifts between rounds (it does, on a shared host)."""
    servers: dict[str, Gateway | Upstream] = {
        "baseline": Upstream(cfg.workdir, json_response=cfg.baseline_json, pin_cpu=cfg.pinning.server_cpu)}
    tokens: dict[str, str | None] = {"baseline": None}
    for target in PAIRED_TARGETS[1:]:
        auth = make_auth(target.removeprefix("gateway-"), 1)
        servers[target], tokens[target] = cfg.gateway(auth, f"{target}-paired"), auth.tokens[0]
    latencies: dict[str, list[float]] = {target: [] for target in PAIRED_TARGETS}
    errors = dict.fromkeys(PAIRED_TARGETS, 0)
    for server in servers.values():
        server.start()
    try:
        async with client_session(len(PAIRED_TARGETS)) as http:
            sessions: dict[str, tuple[RawClient, McpSession]] = {}
            for target, server in servers.items():
                await server.wait_ready(http)
                client = RawClient(http, server.mcp_url)
                sessions[target] = (client, await client.open(tokens[target]))
                for _ in range(PAIRED_WARMUP_CALLS):
                    await client.call(sessions[target][1])
            for n in range(cfg.paired_calls):
                for k in range(len(PAIRED_TARGETS)):  # each target first, second and last equally often
                    target = PAIRED_TARGETS[(n + k) % len(PAIRED_TARGETS)]
                    ms, ok, _ = await timed_call(*sessions[target])
                    latencies[target].append(ms)
                    errors[target] += not ok
    finally:
        for server in servers.values():
            server.stop()
    p50 = {target: percentile(sorted(values), 0.50) for target, values in latencies.items()}
    return {"calls": cfg.paired_calls, "p50_ms": p50, "errors": errors,
            "ratio": {target: ratio(p50[target], p50["baseline"]) for target in PAIRED_TARGETS[1:]}}


#: Workers of the instruction count: a little concurrency, as a real client mix has.
INSTRUCTION_WORKERS = 4
INSTRUCTION_WARMUP_CALLS = 60


async def instruction_phase(cfg: CompareConfig, target: str) -> dict[str, Any]:
    """Instructions per ``echo`` call of ``baseline`` or of the gateway in auth ``none``/``header`` (its stdio
    child not counted), after a warm-up."""
    server: CallgrindGateway | CallgrindUpstream
    if target == "baseline":
        server = CallgrindUpstream(cfg.workdir, json_response=cfg.baseline_json, name="baseline-callgrind")
        tokens: list[str | None] = [None] * INSTRUCTION_WORKERS
    else:
        auth = make_auth(target, INSTRUCTION_WORKERS)
        server = CallgrindGateway(auth, cfg.log_level, cfg.workdir, name=f"gateway-callgrind-{target}",
                                  extra_env=cfg.gateway_env())
        tokens = auth.tokens
    server.start()
    errors = 0
    try:
        async with client_session(INSTRUCTION_WORKERS) as http:
            await server.wait_ready(http)
            client = RawClient(http, server.mcp_url)
            sessions = [await client.open(token) for token in tokens]
            for n in range(INSTRUCTION_WARMUP_CALLS):
                await client.call(sessions[n % len(sessions)])
            per_worker = max(1, cfg.instruction_calls // INSTRUCTION_WORKERS)

            async def worker(session: McpSession) -> None:
                nonlocal errors
                for _ in range(per_worker):
                    ok, _ = await client.call(session)
                    errors += not ok

            await asyncio.to_thread(server.count, True)
            await asyncio.gather(*(worker(session) for session in sessions))
            await asyncio.to_thread(server.count, False)
            total = await asyncio.to_thread(server.instructions)
    finally:
        server.stop()
    calls = per_worker * INSTRUCTION_WORKERS
    return {"calls": calls, "errors": errors, "instructions": total,
            "per_call": total / calls if total is not None else math.nan}


def instructions_line(instructions: dict[str, dict[str, Any]]) -> str:
    """Instructions per call of each target, the gateway's also as a share of the baseline's: the one ratio a
    noisy machine cannot move (the issue's CPU target, 0.20 ms beside its baseline's 0.28 ms, is 0.71x)."""
    base = float(instructions.get("baseline", {}).get("per_call", math.nan))
    parts = []
    for target, f in instructions.items():
        share = (f" = {fmt(f['per_call'] / base, 2)}x the baseline's" if target != "baseline" and base > 0 else "")
        parts.append(f"{target} {fmt(f['per_call'] / 1e6, 3)} M{share} ({f['calls']} calls, {f['errors']} errors)")
    return ("- instructions per call (callgrind; a gateway's process and threads, not its stdio child): "
            + ", ".join(parts))


def render_compare(report: dict[str, Any]) -> str:
    cfg = report["config"]
    rows = with_ratios(report["rounds"])
    baseline_types = sorted({t for r in rows if r["target"] == "baseline" for t in r.get("answer_types", {})})
    out = [f"# satgate-mcp compare: {cfg['sessions']} sessions, {cfg['workers']} workers, echo tool, "
           f"{cfg['duration']:g} s per load phase, {cfg['rounds']} interleaved round(s)",
           "",
           f"- pinning: {report['pinning']}",
           f"- baseline: tests/upstream_server.py alone over Streamable HTTP (official SDK; answers "
           f"{', '.join(baseline_types) or 'n/a'}); gateway: python -m satgate_mcp serve over the same upstream "
           "via stdio",
           "- clients: raw aiohttp JSON-RPC (Accept: application/json, text/event-stream); server CPU is "
           f"/proc utime+stime over the load window (CLK_TCK {CLK_TCK}); 1-call p50 is a separate sequential "
           f"phase; initialize/s opens sessions for {cfg['init_seconds']:g} s",
           "", "## Per round", "",
           markdown_table(TABLE_HEADERS, [table_row(f"r{r['round']} {r['target']}", r) for r in rows])]
    if cfg["rounds"] > 1 and rows:
        summary = summarize_rounds(rows)
        out += ["", "## Median over rounds", "",
                markdown_table(TABLE_HEADERS, [table_row(t, s) for t, s in summary.items()])]
        share = cpu_share(summary)
        if share:
            out += ["", share]
    pipes = report.get("pipes")
    if pipes:
        out += ["", pipes_line(pipes, summarize_rounds(rows) if rows else None)]
    busy = [f"{r['target']} {fmt(r.get('server_cpu_pct'), 0)} %" for r in rows if r["round"] == 1]
    if busy:
        out += ["", f"Server CPU share during round 1's load: {', '.join(busy)}. Well under 100 % while the load "
                "generator is not saturated either means the server's core was shared: the figures are noisy."]
    if any(report.get(k) for k in ("idle", "resume", "sse")):
        out += ["", "## Gateway only (auth=header)", ""]
    paired = report.get("paired")
    if paired:
        p50, ratios = paired["p50_ms"], paired["ratio"]
        out.append(f"- one call at a time, the three servers called in turn ({paired['calls']} calls each): p50 "
                   f"baseline {fmt(p50['baseline'], 2)} ms, gateway-none {fmt(p50['gateway-none'], 2)} ms "
                   f"(x{fmt(ratios['gateway-none'], 2)}), gateway-header {fmt(p50['gateway-header'], 2)} ms "
                   f"(x{fmt(ratios['gateway-header'], 2)}); errors {sum(paired['errors'].values())}")
    idle = report.get("idle")
    if idle:
        out.append(f"- idle sessions: {idle['sessions']:,} opened in {idle['seconds']:.1f} s "
                   f"({idle['errors']} errors); "
                   f"RSS {fmt(idle['rss_before_kib'], 0)} -> {fmt(idle['rss_after_kib'], 0)} KiB: "
                   f"**{fmt(idle['kib_per_session'], 2)} KiB per session**")
    resume = report.get("resume")
    if resume:
        out.append(f"- first call on a session: ordinary p50 {fmt(resume['ordinary_first_call_p50_ms'], 2)} ms, "
                   f"resumed on a second process p50 {fmt(resume['resumed_first_call_p50_ms'], 2)} ms "
                   f"(n={resume['samples']}, errors {resume['ordinary_errors']} / {resume['resumed_errors']})")
    sse = report.get("sse")
    if sse:
        if "sse" in sse:
            out.append("- echo answer path: " + answer_paths(sse))
        else:
            out.append(f"- echo answer path: SSE n/a (the gateway answers {sse['answers_when_both_accepted']} "
                       "when the client accepts both)")
        if "progress" in sse:
            out.append("- a call with one progress notification (slow, 1 step): " + answer_paths(sse["progress"]))
    soak = report.get("soak")
    if soak:
        out.append(f"- soak: {soak['calls']:,} calls in {soak['seconds']:.0f} s ({soak['errors']} errors); RSS "
                   + " -> ".join(fmt(kib / 1024, 1) for kib in soak["rss_kib"]) + " MiB "
                   f"(first to last {fmt(soak['rss_growth_kib'], 0)} KiB)")
    instructions = report.get("instructions")
    if instructions:
        out.append(instructions_line(instructions))
    if report.get("error"):
        out += ["", f"**incomplete: {report['error']}**"]
    return "\n".join(out)


#: The issue's CPU target measured on its machine: the gateway process 0.20 ms a call where the upstream's own
#: HTTP server took 0.28 ms. Machines differ severalfold in Python speed; the share travels between them.
ISSUE_CPU_TARGET_MS, ISSUE_BASELINE_CPU_MS = 0.20, 0.28


def cpu_share(summary: dict[str, dict[str, float]]) -> str:
    """The gateway process's CPU per call beside the baseline server's in the same run, as a share, and what that
    share would be on the machine the issue measured (its baseline 0.28 ms); "" without a baseline figure."""
    base = summary.get("baseline", {}).get("server_main_cpu_ms_per_call", math.nan)
    if not base > 0:
        return ""
    parts = []
    for target, figures in summary.items():
        mine = figures.get("server_main_cpu_ms_per_call", math.nan)
        if target != "baseline" and mine > 0:
            parts.append(f"{target} {fmt(mine, 3)} ms = {fmt(mine / base, 2)}x "
                         f"(~{fmt(mine / base * ISSUE_BASELINE_CPU_MS, 2)} ms on the issue's machine)")
    if not parts:
        return ""
    return (f"Gateway process CPU per call (the stdio child apart) against the baseline server's {fmt(base, 3)} ms: "
            + "; ".join(parts) + f". The issue's target {ISSUE_CPU_TARGET_MS:g} ms beside its baseline's "
            f"{ISSUE_BASELINE_CPU_MS:g} ms is {fmt(ISSUE_CPU_TARGET_MS / ISSUE_BASELINE_CPU_MS, 2)}x.")


def pipes_line(pipes: dict[str, Any], summary: dict[str, dict[str, float]] | None = None) -> str:
    """The calibration row: what this machine does with no HTTP and no gateway, beside the issue's figure, and
    the gateway process's CPU per call at the issue machine's speed by that factor."""
    factor = float(pipes["machine_factor"])
    line = (f"The stdio upstream over its own pipes (no HTTP, no gateway): {fmt(pipes['calls_per_second'])} calls/s, "
            f"child CPU {fmt(pipes['cpu_ms_per_call'], 3)} ms/call, {pipes['errors']} errors; the issue measured "
            f"{fmt(pipes['issue_calls_per_second'])} calls/s there, so this machine runs the same Python "
            f"{fmt(factor, 2)}x slower (below 1: faster).")
    scaled = [f"{target} {fmt(mine / factor, 3)} ms" for target, figures in (summary or {}).items()
              if target != "baseline" and (mine := figures.get("server_main_cpu_ms_per_call", math.nan)) > 0
              and factor > 0]
    if scaled:
        line += (" Gateway process CPU per call at the issue machine's speed by that factor: " + ", ".join(scaled)
                 + f" (target {ISSUE_CPU_TARGET_MS:g} ms).")
    return line


def answer_paths(figures: dict[str, Any]) -> str:
    """The SSE and JSON answers to one kind of call, side by side, and their calls/s ratio."""
    parts = []
    for kind in ("sse", "json"):
        f = figures[kind]
        parts.append(f"{kind.upper()} {fmt(f['calls_per_second'])} calls/s, p50 {fmt(f['p50_ms'], 2)} ms, "
                     f"1-call p50 {fmt(f['sequential_p50_ms'], 2)} ms, "
                     f"CPU {fmt(f['server_cpu_ms_per_call'], 3)} ms/call, "
                     f"answered {'/'.join(sorted(f.get('answer_types') or {})) or 'n/a'}")
    paths = ratio(float(figures["sse"]["calls_per_second"]), float(figures["json"]["calls_per_second"]))
    return "; ".join(parts) + f" (SSE/JSON calls/s {fmt(paths, 2)})"


def estimated_seconds(args: argparse.Namespace) -> float:
    duration, init_seconds, rounds = float(args.duration), float(args.init_seconds), int(args.rounds)
    per_target = 12 + WARMUP_SECONDS + SEQUENTIAL_MAX_SECONDS + duration + init_seconds
    extras = (IDLE_BUDGET_SECONDS + 15 if args.idle_sessions else 0) + 30 + 4 * duration + 10
    extras += 10 + WARMUP_SECONDS + duration  # the stdio upstream over its pipes
    extras += float(args.soak) + 20 if args.soak > 0 else 0
    extras += 3 * (90 + args.instructions / 10) if args.instructions > 0 else 0
    extras += 20 + args.paired_calls * 0.05 if args.paired_calls > 0 else 0
    return rounds * len(TARGETS) * per_target + extras


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main_compare(args: argparse.Namespace) -> int:
    pinning = pin_plan(shutil.which("taskset"), sorted(os.sched_getaffinity(0)))
    if pinning.client_cpu is not None:
        os.sched_setaffinity(0, {pinning.client_cpu})  # before any thread exists: they all inherit it
    timeout = args.timeout if args.timeout is not None else estimated_seconds(args) * 1.5
    report: dict[str, Any] = {
        "config": {"sessions": args.sessions, "workers": args.workers, "duration": args.duration,
                   "rounds": args.rounds, "init_seconds": args.init_seconds, "idle_sessions": args.idle_sessions,
                   "sequential_calls": args.sequential_calls, "resume_samples": args.resume_samples,
                   "baseline_json_response": args.baseline_json, "soak_seconds": args.soak,
                   "instruction_calls": args.instructions, "paired_calls": args.paired_calls, "timeout": timeout,
                   "cpus": os.cpu_count()},
        "pinning": pinning.note, "rounds": []}
    quiet = args.json

    def progress(text: str) -> None:
        print(f"bench: {text}", file=sys.stderr, flush=True)

    previous = signal.signal(signal.SIGTERM, _interrupt)
    status = 0
    try:
        with tempfile.TemporaryDirectory(prefix="satgate-bench-") as workdir:
            cfg = CompareConfig(args.sessions, args.workers, args.duration, args.rounds, args.init_seconds,
                                args.idle_sessions, args.sequential_calls, args.resume_samples, args.baseline_json,
                                args.log_level, pinning, Path(workdir), args.soak, args.instructions,
                                args.paired_calls)
            try:
                asyncio.run(asyncio.wait_for(compare(cfg, report, progress), timeout))
            except TimeoutError:
                report["error"] = f"gave up after {timeout:.0f}s"
                status = 1
            except (RuntimeError, aiohttp.ClientError, OSError) as exc:
                report["error"] = f"{type(exc).__name__}: {exc}"
                status = 1
            except KeyboardInterrupt:
                report["error"] = "interrupted"
                status = 130
            finally:
                stop_all()
    finally:
        signal.signal(signal.SIGTERM, previous)
    report["rounds"] = with_ratios(report["rounds"])
    if len(report["rounds"]) and args.rounds > 1:
        report["summary"] = summarize_rounds(report["rounds"])
    if quiet:
        print(json.dumps(jsonable(report)))
    else:
        print(render_compare(report))
    if status:
        print(f"bench: {report['error']}", file=sys.stderr)
        return status
    return 2 if any(r["errors"] for r in report["rounds"]) else 0



# --- entry --------------------------------------------------------------------------------------------


def bounded_int(low: int, high: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        value = int(text)
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be between {low} and {high}")
        return value

    return parse


def positive_float(text: str) -> float:
    value = float(text)
    if not 0 < value < 86_400:
        raise argparse.ArgumentTypeError("must be a positive number of seconds below a day")
    return value


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
    parser.add_argument("--timeout", type=positive_float, default=None,
                        help="give up after this many seconds (default 300; with --compare: from the options)")
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    parser.add_argument("--state-dir", default="",
                        help="the gateway's SATGATE_STATE_DIR, or memory (default: a folder in the bench's temp dir)")
    parser.add_argument("--budget-limit", type=float, default=None,
                        help="header mode: mint each token with this budget, so every call is a durable charge")
    compare = parser.add_argument_group("side-by-side comparison (--compare)")
    compare.add_argument("--compare", action="store_true",
                         help="baseline (the SDK upstream alone over HTTP) vs the gateway in auth none and header")
    compare.add_argument("--sessions", type=bounded_int(1, MAX_CLIENTS), default=8, help="MCP sessions (default 8)")
    compare.add_argument("--workers", type=bounded_int(1, MAX_CLIENTS), default=16,
                         help="concurrent callers spread over the sessions (default 16)")
    compare.add_argument("--duration", type=positive_float, default=10.0, help="seconds per load phase (default 10)")
    compare.add_argument("--rounds", type=bounded_int(1, 20), default=3,
                         help="interleaved rounds of baseline, gateway-none, gateway-header (default 3)")
    compare.add_argument("--init-seconds", type=positive_float, default=3.0,
                         help="seconds of the initialize/s phase (default 3)")
    compare.add_argument("--idle-sessions", type=bounded_int(0, MAX_IDLE_SESSIONS), default=10_000,
                         help="idle sessions opened on one gateway for KiB/session; 0 skips (default 10000)")
    compare.add_argument("--sequential-calls", type=bounded_int(1, 10_000), default=200,
                         help="calls of the one-at-a-time phase (default 200, at most 5 s)")
    compare.add_argument("--resume-samples", type=bounded_int(1, 1000), default=20,
                         help="sessions resumed on a second gateway process (default 20)")
    compare.add_argument("--soak", type=float, default=0.0, metavar="SECONDS",
                         help="then load one gateway this long, sampling its RSS (600 for the issue's soak; "
                              "default 0: skipped)")
    compare.add_argument("--paired-calls", type=bounded_int(0, 100_000), default=300, metavar="CALLS",
                         help="one call at a time to the baseline and both gateways in turn, this many each "
                              "(default 300; 0 skips)")
    compare.add_argument("--instructions", type=bounded_int(0, 100_000), default=0, metavar="CALLS",
                         help="then count instructions per call under valgrind's callgrind over this many "
                              "calls: the baseline, and the gateway in auth none and header (400 is plenty; "
                              "default 0: skipped)")
    compare.add_argument("--baseline-json", action="store_true",
                         help="run the baseline with --json-response (default: the SDK's SSE answers)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.compare:
        return main_compare(args)
    if args.timeout is None:
        args.timeout = 300.0
    auth = make_auth(args.auth, args.clients, args.budget_limit)
    with tempfile.TemporaryDirectory(prefix="satgate-bench-") as workdir:
        gateway = Gateway(auth, args.log_level, Path(workdir),
                          extra_env={"SATGATE_STATE_DIR": args.state_dir or str(Path(workdir) / "state")})
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
