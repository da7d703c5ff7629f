"""Load phases over the one client: calls in a loop, one call at a time, sessions opened as fast as possible.

Each is bounded in time, so a slow or stuck server shortens a phase instead of hanging the run.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Sequence
from typing import Any

import aiohttp

from bench.client import Client, McpSession, ToolCall
from bench.procfs import CLK_TCK, tick_delta, tree_ticks
from bench.stats import cpu_ms_per_call, percentile

WARMUP_SECONDS = 1.0
SEQUENTIAL_MAX_SECONDS = 5.0


async def timed_call(client: Client, session: McpSession, accept: str | None = None,
                     tool: ToolCall | None = None) -> tuple[float, bool, str]:
    """(milliseconds, succeeded, the answer's content type) of one call."""
    started = time.perf_counter()
    ok, content_type = await client.call(session, accept, tool)
    return (time.perf_counter() - started) * 1000, ok, content_type


async def load_phase(client: Client, sessions: Sequence[McpSession], workers: int, seconds: float,
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
    latencies.sort()
    main_ticks, kid_ticks = tick_delta(main0, main1), tick_delta(kids0, kids1)
    return {"calls": len(latencies), "errors": errors, "seconds": elapsed,
            "calls_per_second": len(latencies) / elapsed if elapsed > 0 else math.nan,
            "p50_ms": percentile(latencies, 0.50), "p99_ms": percentile(latencies, 0.99),
            **server_cpu_per_call(server_pid, main_ticks, kid_ticks, len(latencies)),
            "server_children": len(kids1),
            # Below 100 % with a load generator that is not saturated either: the server's CPU was shared.
            "server_cpu_pct": (100 * (main_ticks + kid_ticks) / CLK_TCK / elapsed
                               if server_pid is not None and elapsed > 0 else math.nan),
            "loadgen_cpu_pct": 100 * (cpu1 - cpu0) / elapsed if elapsed > 0 else math.nan,
            "answer_types": answer_types}


def server_cpu_per_call(server_pid: int | None, main_ticks: int, kid_ticks: int, calls: int) -> dict[str, float]:
    """The server's CPU per call over a load window: its process, its children, both. NaN when no server was
    watched (a warm-up), so an unmeasured figure never reads as zero."""
    if server_pid is None:
        return dict.fromkeys(("server_cpu_ms_per_call", "server_main_cpu_ms_per_call",
                              "server_children_cpu_ms_per_call"), math.nan)
    main_ms = cpu_ms_per_call(main_ticks, CLK_TCK, calls)
    kids_ms = cpu_ms_per_call(kid_ticks, CLK_TCK, calls)
    return {"server_cpu_ms_per_call": main_ms + kids_ms, "server_main_cpu_ms_per_call": main_ms,
            "server_children_cpu_ms_per_call": kids_ms}


async def sequential_p50(client: Client, session: McpSession, calls: int, accept: str | None = None,
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


async def open_many(client: Client, tokens: Sequence[str | None], workers: int, seconds: float, limit: int
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
