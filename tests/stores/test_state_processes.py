"""The state folder with real ``python -m satgate_mcp serve`` processes: SIGKILL, two gateways on one
folder, and ``token revoke`` with nothing configured. No Redis and no revocation file anywhere."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from mcp.client.session import ClientSession
from mcp.shared.exceptions import MCPError

from tests.gateway_process import GatewayProcess, call_text, sdk_session

pytestmark = pytest.mark.process

ROOT_KEY = "state-process-tests-root-key-0123456789abcdef"
CALL_TIMEOUT = 15.0
TEST_TIMEOUT = 60.0
REVOCATION_LATENCY = 1.0
POLL_PAUSE = 0.02


@pytest.fixture
async def gateways(tmp_path: Path) -> AsyncIterator[Callable[[], GatewayProcess]]:
    """Gateways in control mode sharing one state folder; the CLI they come with uses it too."""
    made: list[GatewayProcess] = []
    state = {"SATGATE_STATE_DIR": str(tmp_path / "state"), "SATGATE_ENFORCEMENT": "control"}

    def make() -> GatewayProcess:
        gw = GatewayProcess(tmp_path, root_key=ROOT_KEY, settings=state)
        gw.cli_env["SATGATE_STATE_DIR"] = state["SATGATE_STATE_DIR"]
        made.append(gw)
        return gw

    yield make
    for gw in made:
        await gw.kill()


async def outcome(session: ClientSession, text: str) -> str:
    """``served`` or the refusal's ``data.error``."""
    try:
        assert await call_text(session, "echo", {"text": text}, timeout=CALL_TIMEOUT) == text
    except MCPError as exc:
        return str(exc.error.data["error"]) if isinstance(exc.error.data, dict) else repr(exc)
    return "served"


async def test_attack_sigkill_then_restart_hands_out_no_fresh_budget(
        gateways: Callable[[], GatewayProcess]) -> None:
    gw = gateways()
    async with asyncio.timeout(TEST_TIMEOUT):
        gw.start()
        token = (await gw.cli("token", "mint", "--id", "agent-k", "--budget-limit", "3")).strip()
        await gw.wait_ready()
        async with sdk_session(gw.url, token, timeout=CALL_TIMEOUT) as session:
            assert [await outcome(session, f"c{i}") for i in range(2)] == ["served", "served"]
        await gw.kill()  # SIGKILL right after the answers: no cleanup runs
        gw.start()
        await gw.wait_ready()
        async with sdk_session(gw.url, token, timeout=CALL_TIMEOUT) as session:
            assert [await outcome(session, f"d{i}") for i in range(2)] == ["served", "budget_exhausted"]


async def test_two_gateways_on_one_state_folder_share_a_budget_exactly(
        gateways: Callable[[], GatewayProcess]) -> None:
    a, b = gateways(), gateways()
    async with asyncio.timeout(TEST_TIMEOUT):
        a.start()
        b.start()
        token = (await a.cli("token", "mint", "--id", "agent-shared", "--budget-limit", "10")).strip()
        await asyncio.gather(a.wait_ready(), b.wait_ready())
        async with (sdk_session(a.url, token, timeout=CALL_TIMEOUT) as on_a,
                    sdk_session(b.url, token, timeout=CALL_TIMEOUT) as on_b):
            results = await asyncio.gather(*(outcome(on_a if i % 2 else on_b, f"x{i}") for i in range(40)))
    assert results.count("served") == 10
    assert results.count("budget_exhausted") == 30


async def test_token_revoke_with_nothing_configured_revokes_in_a_running_daemon(
        gateways: Callable[[], GatewayProcess]) -> None:
    gw = gateways()
    async with asyncio.timeout(TEST_TIMEOUT):
        gw.start()
        token = (await gw.cli("token", "mint", "--id", "agent-r")).strip()
        await gw.wait_ready()
        async with sdk_session(gw.url, token, timeout=CALL_TIMEOUT) as session:
            assert await outcome(session, "before") == "served"
            assert (await gw.cli("token", "revoke", "agent-r")).strip() == "revoked agent-r"
            revoked_at = time.monotonic()
            while (refused := await outcome(session, "after")) == "served":
                assert time.monotonic() - revoked_at < REVOCATION_LATENCY, "still served a second after the revoke"
                await asyncio.sleep(POLL_PAUSE)  # the daemon re-reads the state at most every 0.25 s
    assert refused == "token_revoked"
    assert gw.cli_env.get("SATGATE_REVOCATION_FILE") is None
