"""OAuth mode end to end: the official SDK client with a bearer from a real authorization server, through a
real ``python -m satgate_mcp serve`` that is SIGKILLed and started again mid-session.

The authorization server is tests/oauth_server.py on 127.0.0.1; the gateway discovers its keys over HTTP. The
client's token is refreshed (a new JWT for the same subject and client) across the restart, as an OAuth client's
would be: the session id stays the same and every call succeeds; a step-up scope challenge reaches the client.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import httpx2
import pytest
from mcp.shared.exceptions import MCPError

from tests.gateway_process import GatewayProcess, call_text, sdk_session
from tests.oauth_server import AuthServer

pytestmark = pytest.mark.process

CALL_TIMEOUT = 15.0
TEST_TIMEOUT = 45.0


class RefreshingBearer(httpx2.AsyncBaseTransport):
    """Sends whatever token the client holds now, and records (session id, status) of each POST."""

    def __init__(self, token: str) -> None:
        self.token = token
        self._inner = httpx2.AsyncHTTPTransport(trust_env=False)
        self.posts: list[tuple[str | None, int]] = []

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        request.headers["Authorization"] = f"Bearer {self.token}"
        response = await self._inner.handle_async_request(request)
        if request.method == "POST":
            self.posts.append((request.headers.get("mcp-session-id"), response.status_code))
        return response

    async def aclose(self) -> None:
        await self._inner.aclose()


@pytest.fixture
async def idp() -> AsyncIterator[AuthServer]:
    async with AuthServer(path="/realms/e2e") as server:
        yield server


@pytest.fixture
async def gateway(tmp_path: Path, idp: AuthServer) -> AsyncIterator[GatewayProcess]:
    gw = GatewayProcess(tmp_path, root_key="unused-in-oauth-mode-0123456789abcdef")
    audience = f"{gw.url}/mcp"
    idp.default_audience = audience
    gw.settings.update({
        "SATGATE_AUTH_MODE": "oauth", "SATGATE_OAUTH_ISSUER": idp.issuer, "SATGATE_OAUTH_AUDIENCE": audience,
        "SATGATE_OAUTH_TOOL_SCOPES": json.dumps({"add*": "math", "*": "mcp"}),
        "SATGATE_STATE_DIR": str(tmp_path / "state"),
    })
    yield gw
    await gw.kill()


async def test_sdk_client_keeps_its_session_across_a_sigkill_restart_and_a_token_refresh(
        gateway: GatewayProcess, idp: AuthServer) -> None:
    async with asyncio.timeout(TEST_TIMEOUT):
        gateway.start()
        await gateway.wait_ready()
        bearer = RefreshingBearer(idp.mint("alice", scope="mcp"))
        async with sdk_session(gateway.url, bearer.token, timeout=CALL_TIMEOUT, transport=bearer) as session:
            assert await call_text(session, "echo", {"text": "before"}, timeout=CALL_TIMEOUT) == "before"

            with pytest.raises(MCPError) as challenged:  # the SDK surfaces the 403 step-up challenge
                await asyncio.wait_for(session.call_tool("add", {"a": 1, "b": 2}), CALL_TIMEOUT)
            assert challenged.value.data == {"error": "insufficient_scope", "scope": "math"}

            await gateway.kill()
            gateway.start()
            await gateway.wait_ready()
            bearer.token = idp.mint("alice", scope="mcp math")  # refreshed, and stepped up
            assert await call_text(session, "echo", {"text": "after"}, timeout=CALL_TIMEOUT) == "after"
            assert await call_text(session, "add", {"a": 2, "b": 3}, timeout=CALL_TIMEOUT) == "5"

        sessions = {sid for sid, _ in bearer.posts if sid is not None}
        assert len(sessions) == 1, f"one session, never re-initialized: {bearer.posts}"
        statuses = [status for _, status in bearer.posts]
        assert statuses.count(403) == 1
        assert set(statuses) <= {200, 202, 403}
    connected = gateway.events("session_connect")
    assert [(e["token_id"], e.get("resumed")) for e in connected] == [("alice", True)]
