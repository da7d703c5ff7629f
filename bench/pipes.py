"""The calibration row: the stdio test upstream driven directly over its pipes, no HTTP and no gateway.

What this machine does with the same Python the issue measured, so its figures can be set beside the issue's.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import sys
import time
from typing import Any

from bench.calibration import ISSUE_PIPES_CALLS_PER_SECOND, machine_factor
from bench.client import (
    INITIALIZED,
    REQUEST_TIMEOUT,
    call_succeeded,
    initialize_params,
    jsonrpc_request,
    next_id,
)
from bench.load import WARMUP_SECONDS
from bench.phases import CompareConfig
from bench.processes import REPO, STOP_TIMEOUT, UPSTREAM_SERVER, base_env, pinned
from bench.procfs import CLK_TCK, tick_delta, tree_ticks
from bench.stats import cpu_ms_per_call


class PipeClient:
    """JSON-RPC lines out on the child's stdin, answers matched by id as they come back on its stdout."""

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

    async def send(self, message: dict[str, Any]) -> None:
        self._stdin.write(json.dumps(message).encode() + b"\n")
        await self._stdin.drain()

    async def request(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        n = next_id()
        waiter = self._waiting[n] = asyncio.get_running_loop().create_future()
        await self.send(jsonrpc_request(n, method, params))
        return await asyncio.wait_for(waiter, REQUEST_TIMEOUT)

    async def initialize(self) -> None:
        await self.request("initialize", initialize_params())
        await self.send(INITIALIZED)

    async def close(self) -> None:
        self._stdin.close()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.proc.wait(), STOP_TIMEOUT)
        if self.proc.returncode is None:
            self.proc.kill()
            await self.proc.wait()
        self._reader.cancel()


async def calls_for(client: PipeClient, workers: int, seconds: float) -> tuple[int, int]:
    """``workers`` callers keeping ``echo`` calls in flight until ``seconds`` pass; (calls, errors)."""
    calls = errors = 0
    stop_at = time.perf_counter() + seconds

    async def worker() -> None:
        nonlocal calls, errors
        while time.perf_counter() < stop_at:
            answer = await client.request("tools/call", {"name": "echo", "arguments": {"text": "pipes"}})
            calls += 1
            errors += not call_succeeded(answer)

    await asyncio.gather(*(worker() for _ in range(workers)))
    return calls, errors


async def pipes_phase(cfg: CompareConfig, command: list[str] | None = None) -> dict[str, Any]:
    """The issue's calibration row: ``workers`` callers keep ``echo`` calls in flight on the stdio test upstream's
    own pipes for ``duration`` seconds; calls/s and the child's CPU per call. With ``command``, that upstream
    instead (the floor of a gateway in front of it)."""
    argv = pinned(command or [sys.executable, str(UPSTREAM_SERVER), "stdio"], cfg.pinning.server_cpu)
    proc = await asyncio.create_subprocess_exec(*argv, cwd=REPO, env=base_env(), stdin=asyncio.subprocess.PIPE,
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL,
                                                limit=2 ** 20)
    client = PipeClient(proc)
    try:
        await client.initialize()
        await calls_for(client, cfg.workers, min(WARMUP_SECONDS, cfg.duration))  # warm-up
        before = tree_ticks(proc.pid)
        started = time.perf_counter()
        calls, errors = await calls_for(client, cfg.workers, cfg.duration)
        elapsed = time.perf_counter() - started
        after = tree_ticks(proc.pid)
    finally:
        await client.close()
    cps = calls / elapsed if elapsed > 0 else math.nan
    return {"calls": calls, "errors": errors, "seconds": elapsed, "calls_per_second": cps,
            "cpu_ms_per_call": cpu_ms_per_call(tick_delta(before[0], after[0]), CLK_TCK, calls),
            "issue_calls_per_second": ISSUE_PIPES_CALLS_PER_SECOND, "machine_factor": machine_factor(cps)}
