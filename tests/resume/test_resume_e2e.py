"""Resumable sessions end to end: real ``python -m satgate_mcp serve`` processes, a real stdio MCP upstream
(tests/upstream_server.py), and the official ``mcp`` Python SDK client, which never re-initializes on its own.

One ``ClientSession`` must keep working (a) across SIGKILLs and restarts of the gateway on the same port and
(b) when consecutive calls alternate between two gateway processes on two ports. The client is not told
anything: the gateway serves the same session id again.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from mcp.client.session import ClientSession

from tests.gateway_process import GatewayProcess, PortRotation, call_text, sdk_session

pytestmark = pytest.mark.process

ROOT_KEY = "e2e-resume-root-key-0123456789abcdefghij"
#: Bounds: one MCP call, one ``token mint`` run.
CALL_TIMEOUT = 15.0
MINT_TIMEOUT = 30.0
KILLS = 3


@pytest.fixture
def gateways(tmp_path: Path) -> Iterator[Callable[[], GatewayProcess]]:
    made: list[GatewayProcess] = []

    def make() -> GatewayProcess:
        gw = GatewayProcess(tmp_path, root_key=ROOT_KEY)
        made.append(gw)
        return gw

    yield make
    for gw in made:
        gw.terminate()


async def mint(gw: GatewayProcess, token_id: str) -> str:
    return (await gw.cli("token", "mint", "--id", token_id, timeout=MINT_TIMEOUT)).strip()


async def echo(session: ClientSession, text: str) -> str:
    return await call_text(session, "echo", {"text": text}, timeout=CALL_TIMEOUT)


def the_one_session_id(rotation: PortRotation) -> str:
    ids = {s.session_id for s in rotation.sent if s.rpc_method not in (None, "initialize")}
    assert len(ids) == 1, ids
    [session_id] = ids
    assert session_id is not None
    assert session_id.startswith("mcp-")
    return session_id


async def test_sdk_client_session_survives_three_sigkills_and_restarts(
        gateways: Callable[[], GatewayProcess]) -> None:
    gw = gateways()
    gw.start()
    token, _ = await asyncio.gather(mint(gw, "agent-1"), gw.wait_ready())
    rotation = PortRotation([gw.port])

    async with sdk_session(gw.url, token, timeout=CALL_TIMEOUT, transport=rotation) as session:
        assert await echo(session, "before") == "before"
        session_id = the_one_session_id(rotation)
        for kill in range(1, KILLS + 1):
            assert await gw.kill() == [], "an upstream child outlived the SIGKILLed gateway"
            gw.start()
            await gw.wait_ready()
            assert await echo(session, f"after kill {kill}") == f"after kill {kill}"
            [connect] = gw.events("session_connect")
            assert connect["session_id"] == session_id
            assert connect["resumed"] is True
            assert connect["token_id"] == "agent-1"

    assert the_one_session_id(rotation) == session_id
    assert [s.status for s in rotation.calls()] == [200] * (KILLS + 1)


async def test_sdk_client_session_alternates_between_two_processes(
        gateways: Callable[[], GatewayProcess]) -> None:
    one, two = gateways(), gateways()
    one.start()
    two.start()
    token, _, _ = await asyncio.gather(mint(one, "agent-2"), one.wait_ready(), two.wait_ready())
    rotation = PortRotation([one.port, two.port])

    async with sdk_session(one.url, token, timeout=CALL_TIMEOUT, transport=rotation) as session:
        for n in range(6):
            assert await echo(session, f"call {n}") == f"call {n}"

    trace = "\n".join(map(str, rotation.sent))
    calls = rotation.calls()
    assert [s.status for s in calls] == [200] * 6, trace
    for port in (one.port, two.port):  # every other POST (the SDK adds a tools/list) went to each process
        assert sum(s.port == port for s in calls) >= 2, trace
    assert all(s.status in (200, 202) for s in rotation.sent if s.http_method == "POST"), trace
    session_id = the_one_session_id(rotation)
    # one process opened it, the other rebuilt it from the token: one session_connect each
    connects = one.events("session_connect") + two.events("session_connect")
    assert [e["session_id"] for e in connects] == [session_id, session_id]
    assert sorted(e["resumed"] for e in connects) == [False, True]
