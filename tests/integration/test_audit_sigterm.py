"""SIGTERM with calls in flight loses no audit line (SATGATE_AUDIT_FILE): a real ``serve`` in front of the real test
upstream, official SDK clients each in the middle of a call when the signal comes; every call that was answered
has its line in the trail, and the trail verifies."""

from __future__ import annotations

import asyncio
import json
import signal
from pathlib import Path

import mcp_types as types
import pytest

from satgate_mcp.auth.macaroons import mint_token
from satgate_mcp.policy.audit import verify
from tests.gateway_process import GatewayProcess, sdk_session

pytestmark = pytest.mark.process

ROOT_KEY = "audit-sigterm-tests-root-key-0123456789abcd"
CALLERS = 8
TIMEOUT = 20.0


async def test_sigterm_with_calls_in_flight_loses_no_line_of_an_answered_call(tmp_path: Path) -> None:
    trail = tmp_path / "audit.jsonl"
    gw = GatewayProcess(tmp_path, root_key=ROOT_KEY, settings={
        "SATGATE_AUDIT_FILE": str(trail), "SATGATE_AUDIT_ARGS": "full", "SATGATE_DRAIN_SECONDS": "5"})
    gw.start()
    await gw.wait_ready()
    running = [asyncio.Event() for _ in range(CALLERS)]
    answered: list[str] = []

    async def caller(n: int) -> None:
        async def first_step(progress: float, total: float | None, message: str | None) -> None:
            running[n].set()

        async with sdk_session(gw.url, mint_token(ROOT_KEY, f"caller-{n}"), timeout=TIMEOUT) as session:
            result = await session.call_tool("slow", {"steps": 3, "delay": 0.4, "who": f"caller-{n}"},
                                             progress_callback=first_step)
            assert isinstance(result.content[0], types.TextContent)
            answered.append(f"caller-{n}")

    async with asyncio.timeout(TIMEOUT * 2):
        calls = [asyncio.ensure_future(caller(n)) for n in range(CALLERS)]
        await asyncio.gather(*(event.wait() for event in running))  # every call is under way upstream
        assert gw.proc is not None
        gw.proc.send_signal(signal.SIGTERM)
        await asyncio.gather(*calls, return_exceptions=True)
        assert await asyncio.to_thread(gw.proc.wait, TIMEOUT) == 0

    assert answered, "the drain let no call finish: nothing to check"
    recorded = [json.loads(line) for line in trail.read_text().splitlines()]
    served = {line["args"]["who"] for line in recorded if line["event"] == "tool_call" and line["outcome"] == "ok"}
    assert set(answered) <= served
    assert verify([(str(trail), trail.read_text().splitlines())])[1] is None
