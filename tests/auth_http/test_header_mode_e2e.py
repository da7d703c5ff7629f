"""Header mode end to end, as an operator and an agent meet it.

A real ``python -m satgate_mcp serve`` (header mode, a revocation file) in front of the real stdio upstream
(tests/upstream_server.py); a token minted with ``python -m satgate_mcp token mint``; the official ``mcp``
SDK client carrying it in ``Authorization``; ``python -m satgate_mcp token revoke`` while the client's
session is live, and the very next calls refused within one second.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import httpx2
import mcp_types as types
import pytest
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from satgate_mcp import jsonrpc
from tests.resume.test_resume_e2e import (
    CALL_TIMEOUT,
    UPSTREAM_SERVER,
    GatewayProcess,
    PortRotation,
    base_env,
    free_port,
)

REPO = Path(__file__).resolve().parents[2]
ROOT_KEY = "e2e-header-mode-root-key-0123456789abcdefgh"
TOKEN_ID = "agent-e2e"
#: ``echo`` by name, ``add`` and ``add_tool`` by prefix; the upstream also has ``whoami``, ``headers``, ...
TOOLS_CAVEAT = "echo,ad*"
ALLOWED = ["echo", "add", "add_tool"]
REVOCATION_LATENCY = 1.0
POLL_PAUSE = 0.02
CLI_TIMEOUT = 20.0
#: Whole-test bound: gateway start, two CLI runs, a handful of calls.
TEST_TIMEOUT = 35.0


class HeaderModeGateway(GatewayProcess):
    """The resume suite's gateway process, started with a revocation file as well."""

    def __init__(self, port: int, workdir: Path) -> None:
        super().__init__(port, workdir)
        self.revocation_file = workdir / "revoked-tokens"

    def start(self) -> None:
        self.starts += 1
        upstreams = {"t": {"transport": "stdio", "command": [sys.executable, str(UPSTREAM_SERVER), "stdio"]}}
        env = {**base_env(), "SATGATE_HOST": "127.0.0.1", "SATGATE_PORT": str(self.port),
               "SATGATE_AUTH_MODE": "header", "SATGATE_ROOT_KEY": ROOT_KEY,
               "SATGATE_REVOCATION_FILE": str(self.revocation_file),
               "SATGATE_UPSTREAMS": json.dumps(upstreams), "SATGATE_EVENTS_FILE": str(self.events_file),
               "SATGATE_LOG_FORMAT": "json", "SATGATE_DRAIN_SECONDS": "1"}
        with self.log_file.open("wb") as log:
            self.proc = subprocess.Popen([sys.executable, "-m", "satgate_mcp", "serve"], cwd=REPO, env=env,
                                         stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True)


async def satgate_cli(*args: str, revocation_file: Path) -> str:
    """``python -m satgate_mcp ...`` as the operator runs it: its stdout, or the test fails with its stderr."""
    env = {**base_env(), "SATGATE_ROOT_KEY": ROOT_KEY, "SATGATE_REVOCATION_FILE": str(revocation_file)}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "satgate_mcp", *args, cwd=REPO, env=env, stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        out, err = await asyncio.wait_for(proc.communicate(), CLI_TIMEOUT)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    assert proc.returncode == 0, err.decode()
    return out.decode()


@pytest.fixture
async def gateway(tmp_path: Path) -> AsyncIterator[HeaderModeGateway]:
    gw = HeaderModeGateway(free_port(), tmp_path)
    yield gw
    await gw.kill()  # SIGKILLs the process group, then any upstream child that outlived it


@pytest.fixture
async def plain_http() -> AsyncIterator[httpx2.AsyncClient]:
    """For /readyz only; the MCP traffic goes through the SDK client."""
    async with httpx2.AsyncClient(trust_env=False, timeout=2.0) as client:
        yield client


@contextlib.asynccontextmanager
async def sdk_session(url: str, token: str, recorder: PortRotation) -> AsyncIterator[ClientSession]:
    """The official client as an agent holds it, the bearer in a default ``Authorization`` header."""
    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, transport=recorder,
                              trust_env=False, timeout=httpx2.Timeout(CALL_TIMEOUT))
    async with (http, streamable_http_client(f"{url}/mcp", http_client=http) as (read, write),
                ClientSession(read, write, read_timeout_seconds=CALL_TIMEOUT) as session):
        await asyncio.wait_for(session.initialize(), CALL_TIMEOUT)
        yield session


async def call(session: ClientSession, name: str, arguments: dict[str, object]) -> str:
    result = await asyncio.wait_for(session.call_tool(name, arguments), CALL_TIMEOUT)
    assert not result.is_error, result
    [content] = result.content
    assert isinstance(content, types.TextContent)
    return content.text


async def test_sdk_client_with_a_minted_token_is_filtered_refused_and_revoked_within_a_second(
    gateway: HeaderModeGateway, plain_http: httpx2.AsyncClient
) -> None:
    async with asyncio.timeout(TEST_TIMEOUT):
        gateway.start()
        minted = asyncio.ensure_future(satgate_cli("token", "mint", "--id", TOKEN_ID, "--ttl", "600",
                                                   "--tools", TOOLS_CAVEAT,
                                                   revocation_file=gateway.revocation_file))
        await gateway.wait_ready(plain_http)
        stdout = await minted
        token = stdout.strip()
        assert stdout == token + "\n"
        recorder = PortRotation([gateway.port])  # one port: it only records what was sent and answered

        async with sdk_session(gateway.url, token, recorder) as session:
            listed = await asyncio.wait_for(session.list_tools(), CALL_TIMEOUT)
            assert [tool.name for tool in listed.tools] == ALLOWED
            assert await call(session, "echo", {"text": "hello"}) == "hello"
            assert await call(session, "add", {"a": 2, "b": 3}) == "5"

            with pytest.raises(MCPError) as refused:
                await asyncio.wait_for(session.call_tool("whoami", {}), CALL_TIMEOUT)
            assert refused.value.code == jsonrpc.TOOL_NOT_ALLOWED == -32001
            assert refused.value.data["error"] == "tool_not_allowed"

            revoked = await satgate_cli("token", "revoke", TOKEN_ID, revocation_file=gateway.revocation_file)
            assert revoked.strip() == f"revoked {TOKEN_ID}"
            appended_at = gateway.revocation_file.stat().st_mtime_ns / 1e9
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
