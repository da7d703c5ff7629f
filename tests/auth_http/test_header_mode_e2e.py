"""Header mode end to end, as an operator and an agent meet it.

A real ``python -m satgate_mcp serve`` (header mode, a revocation file) in front of the real stdio upstream
(tests/upstream_server.py); a token minted with ``python -m satgate_mcp token mint``; the official ``mcp``
SDK client carrying it in ``Authorization``; ``python -m satgate_mcp token revoke`` while the client's
session is live, and the very next calls refused within one second.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from mcp.client.session import ClientSession
from mcp.shared.exceptions import MCPError

from satgate_mcp import jsonrpc
from tests.gateway_process import GatewayProcess, PortRotation, call_text, sdk_session

pytestmark = pytest.mark.process

ROOT_KEY = "e2e-header-mode-root-key-0123456789abcdefgh"
TOKEN_ID = "agent-e2e"
#: ``echo`` by name, ``add`` and ``add_tool`` by prefix; the upstream also has ``whoami``, ``headers``, ...
TOOLS_CAVEAT = "echo,ad*"
ALLOWED = ["add", "add_tool", "echo"]  # the merged list is sorted by name
REVOCATION_LATENCY = 1.0
POLL_PAUSE = 0.02
CALL_TIMEOUT = 15.0
#: Whole-test bound: gateway start, two CLI runs, a handful of calls.
TEST_TIMEOUT = 35.0


@pytest.fixture
async def gateway(tmp_path: Path) -> AsyncIterator[GatewayProcess]:
    """A header-mode gateway whose revocation file the operator's ``token revoke`` appends to."""
    gw = GatewayProcess(tmp_path, root_key=ROOT_KEY, revocation_file=tmp_path / "revoked-tokens")
    yield gw
    await gw.kill()  # SIGKILLs the process group, then any upstream child that outlived it


async def call(session: ClientSession, name: str, arguments: dict[str, object]) -> str:
    return await call_text(session, name, arguments, timeout=CALL_TIMEOUT)


async def test_sdk_client_with_a_minted_token_is_filtered_refused_and_revoked_within_a_second(
    gateway: GatewayProcess,
) -> None:
    revocation_file = gateway.revocation_file
    assert revocation_file is not None
    async with asyncio.timeout(TEST_TIMEOUT):
        gateway.start()
        minted = asyncio.ensure_future(gateway.cli("token", "mint", "--id", TOKEN_ID, "--ttl", "600",
                                                   "--tools", TOOLS_CAVEAT))
        await gateway.wait_ready()
        stdout = await minted
        token = stdout.strip()
        assert stdout == token + "\n"
        recorder = PortRotation([gateway.port])  # one port: it only records what was sent and answered

        async with sdk_session(gateway.url, token, timeout=CALL_TIMEOUT, transport=recorder) as session:
            listed = await asyncio.wait_for(session.list_tools(), CALL_TIMEOUT)
            assert [tool.name for tool in listed.tools] == ALLOWED
            assert await call(session, "echo", {"text": "hello"}) == "hello"
            assert await call(session, "add", {"a": 2, "b": 3}) == "5"

            with pytest.raises(MCPError) as refused:
                await asyncio.wait_for(session.call_tool("whoami", {}), CALL_TIMEOUT)
            assert refused.value.code == jsonrpc.TOOL_NOT_ALLOWED == -32001
            assert refused.value.data["error"] == "tool_not_allowed"

            revoked = await gateway.cli("token", "revoke", TOKEN_ID)
            assert revoked.strip() == f"revoked {TOKEN_ID}"
            appended_at = revocation_file.stat().st_mtime_ns / 1e9
            calls = 0
            while True:
                calls += 1
                try:
                    await call(session, "echo", {"text": f"after revoke {calls}"})
                except MCPError as exc:
                    refused_at, error = time.time(), exc
                    break
                assert time.time() - appended_at < REVOCATION_LATENCY, "still served a second after the revoke"
                await asyncio.sleep(POLL_PAUSE)  # polling a file-backed condition under a bounded deadline

        assert refused_at - appended_at < REVOCATION_LATENCY
        assert error.data == {"error": "token_revoked", "code": "TOKEN_REVOKED"}
        tool_calls = recorder.calls()
        # echo, add, whoami (a JSON-RPC error in a 200), the calls served before the store re-read, the 403
        assert [s.status for s in tool_calls] == [200] * (len(tool_calls) - 1) + [403]
        assert len(tool_calls) == 3 + calls
        assert len({s.session_id for s in tool_calls}) == 1, "one session, never re-initialized"

    for written in (gateway.log_file, gateway.events_file):
        assert token not in written.read_text(errors="replace"), f"the bearer leaked into {written.name}"
