"""One stdio upstream whose command exits at once must not keep the gateway from listening (issue 23).

The rules: the gateway listens without waiting out start-up timeouts for a child that already exited; it serves
the upstreams that work; ``/readyz`` answers 503 naming the broken one with its exit status and last stderr line;
one warning line says so at start.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx2
import pytest

from satgate_mcp.daemon.runner import settled
from tests.conftest import upstream_command
from tests.gateway_process import GatewayProcess, call_text, sdk_session

ROOT_KEY = "broken-upstream-root-key-0123456789abcdef"
BROKEN = [sys.executable, "-c", "import sys; sys.stderr.write('boom: no config\\n'); sys.exit(3)"]
CALL_TIMEOUT = 15.0


@pytest.mark.parametrize(("readiness", "failures", "expected"), [
    pytest.param({}, {}, True, id="no-upstreams"),
    pytest.param({"a": True, "b": True}, {}, True, id="all-ready"),
    pytest.param({"a": True, "b": False}, {}, False, id="one-still-starting"),
    pytest.param({"a": True, "b": False}, {"b": {"status": "exited with status 3"}}, True, id="one-down"),
    pytest.param({"a": False, "b": False}, {"b": {"status": "exited with status 3"}}, False,
                 id="one-down-one-starting"),
])
def test_start_up_waits_only_for_upstreams_that_may_still_come_up(
        readiness: dict[str, bool], failures: dict[str, dict[str, str]], expected: bool) -> None:
    assert settled(readiness, failures) is expected


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[GatewayProcess]:
    upstreams = {"t": {"transport": "stdio", "command": upstream_command()},
                 "broken": {"transport": "stdio", "command": BROKEN}}
    gw = GatewayProcess(tmp_path, root_key=ROOT_KEY, settings={"SATGATE_UPSTREAMS": json.dumps(upstreams)})
    yield gw
    gw.terminate()


async def answering_readyz(gw: GatewayProcess) -> httpx2.Response:
    """/readyz's first answer, bounded well below the old 40 s of waiting (a separate process: polled)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 20.0
    async with httpx2.AsyncClient(trust_env=False, timeout=2.0) as http:
        while True:
            try:
                return await http.get(f"{gw.url}/readyz")
            except httpx2.TransportError:
                assert loop.time() < deadline, f"not listening within 20 s:\n{gw.log_tail()}"
                await asyncio.sleep(0.05)


@pytest.mark.process
async def test_a_child_that_exits_at_once_is_named_in_readyz_and_the_others_are_served(
        gateway: GatewayProcess) -> None:
    gateway.start()
    ready = await answering_readyz(gateway)

    assert ready.status_code == 503
    body = ready.json()
    assert body["status"] == "upstream_down"
    assert body["upstreams"] == {"t": True, "broken": False}
    assert body["down"]["broken"]["status"] == "exited with status 3"
    assert body["down"]["broken"]["stderr"] == "boom: no config"

    token = (await gateway.cli("token", "mint", "--id", "agent-1")).strip()
    async with sdk_session(gateway.url, token, timeout=CALL_TIMEOUT) as session:
        assert await call_text(session, "echo", {"text": "still served"}, timeout=CALL_TIMEOUT) == "still served"

    lines = [json.loads(line) for line in gateway.log_file.read_text().splitlines() if line.startswith("{")]
    warnings = [line for line in lines if line.get("event") == "upstreams_down"]
    assert len(warnings) == 1
    assert warnings[0]["upstreams"]["broken"]["stderr"] == "boom: no config"
    assert [line["ready"] for line in lines if line.get("event") == "listening"] == [False]
