"""The default mode: N clients, one MCP session each, all calling ``echo`` COUNT times at once through one
gateway; calls/s, latency percentiles and the gateway's memory before and after."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import sys
import tempfile
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import aiohttp

from bench.client import Client
from bench.load import timed_call
from bench.processes import Auth, Gateway, make_auth
from bench.render import plain_text
from bench.stats import Report, RunLabel, Tally, summarize

#: One client's run: (MCP URL, token, calls, the start signal, "my session is open") -> its tally.
RunClient = Callable[[str, str | None, int, asyncio.Event, Callable[[], None]], Coroutine[Any, Any, Tally]]
DEFAULT_TIMEOUT = 300.0


async def run_raw_client(mcp_url: str, token: str | None, calls: int, go: asyncio.Event, ready: Callable[[], None]
                         ) -> Tally:
    """The raw client on its own keep-alive connection, as each agent would hold one: the gateway's cost only."""
    tally = Tally()
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1)) as http:
        client = Client(http, mcp_url)
        session = await client.open(token)
        ready()
        await go.wait()
        for _ in range(calls):
            ms, ok, _ = await timed_call(client, session)
            tally.latencies_ms.append(ms)
            tally.errors += not ok
        await client.close(session)
    return tally


async def run_sdk_client(mcp_url: str, token: str | None, calls: int, go: asyncio.Event, ready: Callable[[], None]
                         ) -> Tally:
    """The official SDK client, as an agent holds it: one ClientSession, initialized once."""
    import httpx2
    from mcp.client.session import ClientSession
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared.exceptions import MCPError

    tally = Tally()
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    http = httpx2.AsyncClient(headers=headers, trust_env=False, timeout=httpx2.Timeout(30.0))
    async with (http, streamable_http_client(mcp_url, http_client=http) as (read, write),
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
            tally.latencies_ms.append((time.perf_counter() - started) * 1000)
            tally.errors += not ok
    return tally


async def run_clients(run: RunClient, mcp_url: str, tokens: list[str | None], calls: int
                      ) -> tuple[list[Tally], float]:
    """Every client opens its session first; the clock starts when all are ready to call. (tallies, seconds)"""
    go = asyncio.Event()
    all_ready = asyncio.Event()
    waiting = len(tokens)

    def ready() -> None:
        nonlocal waiting
        waiting -= 1
        if waiting == 0:
            all_ready.set()

    tasks = [asyncio.create_task(run(mcp_url, token, calls, go, ready)) for token in tokens]
    try:
        waiter = asyncio.create_task(all_ready.wait())
        done, _ = await asyncio.wait([waiter, *tasks], return_when=asyncio.FIRST_COMPLETED)
        if waiter not in done:
            waiter.cancel()
            for task in done:
                task.result()  # a client that failed to open its session raises here
        started = time.perf_counter()
        go.set()
        tallies = await asyncio.gather(*tasks)
        return list(tallies), time.perf_counter() - started
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def drive(gateway: Gateway, auth: Auth, args: argparse.Namespace) -> Report:
    async with aiohttp.ClientSession() as http:
        await gateway.wait_ready(http)
    rss_before = gateway.memory_kib()
    run = run_sdk_client if args.client == "sdk" else run_raw_client
    tallies, seconds = await run_clients(run, gateway.mcp_url, auth.tokens, args.calls)
    return summarize(tallies, seconds, RunLabel(args.clients, args.calls, args.client, args.auth),
                     (rss_before, gateway.memory_kib(), gateway.memory_kib("VmHWM")))


def main_plain(args: argparse.Namespace) -> int:
    """Exit 0 when every call succeeded, 2 when some failed, 1 when the run itself failed."""
    timeout = args.timeout if args.timeout is not None else DEFAULT_TIMEOUT
    auth = make_auth(args.auth, args.clients, args.budget_limit)
    with tempfile.TemporaryDirectory(prefix="satgate-bench-") as workdir:
        gateway = Gateway(auth, args.log_level, Path(workdir),
                          extra_env={"SATGATE_STATE_DIR": args.state_dir or str(Path(workdir) / "state")})
        gateway.start()
        try:
            report = asyncio.run(asyncio.wait_for(drive(gateway, auth, args), timeout))
        except TimeoutError:
            print(f"bench: gave up after {timeout:.0f}s\n{gateway.log_tail()}", file=sys.stderr)
            return 1
        except (RuntimeError, aiohttp.ClientError, OSError) as exc:
            print(f"bench: {type(exc).__name__}: {exc}\n{gateway.log_tail()}", file=sys.stderr)
            return 1
        finally:
            gateway.stop()
    if args.json:
        print(json.dumps({**dataclasses.asdict(report), "calls_per_second": report.calls_per_second}))
    else:
        print(plain_text(report))
    return 0 if report.errors == 0 else 2
