"""Policy rules through a real gateway: ``python -m satgate_mcp serve`` in OAuth mode, serving the README's
policy file verbatim, in front of the real test upstream (with annotated and GitHub-like tools), reached by the
official SDK client. The refusals come back as the README says, nothing refused reaches the upstream, lists
follow the rules, and a rewritten file is in force within a second, in that other process."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from mcp.client.session import ClientSession
from mcp.shared.exceptions import MCPError

from tests.conftest import upstream_command
from tests.gateway_process import GatewayProcess, call_text, sdk_session
from tests.oauth_server import AuthServer
from tests.policy.readme_policy import readme_policy

pytestmark = pytest.mark.process

TIMEOUT = 15.0


@pytest.fixture
async def idp() -> AsyncIterator[AuthServer]:
    async with AuthServer(path="/realms/policy") as server:
        yield server


@pytest.fixture
async def gateway(tmp_path: Path, idp: AuthServer) -> AsyncIterator[GatewayProcess]:
    policy = tmp_path / "policy.yaml"
    policy.write_text(readme_policy())
    upstreams = {"gh": {"transport": "stdio", "command": upstream_command("--governance")}}
    gw = GatewayProcess(tmp_path, root_key="unused-in-oauth-mode-0123456789abcdef", settings={
        "SATGATE_UPSTREAMS": json.dumps(upstreams), "SATGATE_POLICY_FILE": str(policy),
        "SATGATE_STATE_DIR": "memory"})
    audience = f"{gw.url}/mcp"
    idp.default_audience = audience
    gw.settings.update({"SATGATE_AUTH_MODE": "oauth", "SATGATE_OAUTH_ISSUER": idp.issuer,
                        "SATGATE_OAUTH_AUDIENCE": audience})
    gw.start()
    await gw.wait_ready()
    yield gw
    await gw.kill()


async def refusal(session: ClientSession, tool: str, arguments: dict[str, object]) -> object:
    with pytest.raises(MCPError) as refused:
        await asyncio.wait_for(session.call_tool(tool, arguments), TIMEOUT)
    assert refused.value.code == -32001
    return refused.value.data


async def refused_now(session: ClientSession, tool: str) -> object | None:
    """The refusal's data, or None when the call went through."""
    try:
        await asyncio.wait_for(session.call_tool(tool, {"text": "x"}), TIMEOUT)
    except MCPError as exc:
        data: object = exc.data
        return data
    return None


async def test_the_readme_policy_refuses_what_it_says_through_a_real_gateway(
        gateway: GatewayProcess, idp: AuthServer) -> None:
    token = idp.mint("alice", scope="mcp", extra={"org": "acme"})
    async with asyncio.timeout(60), sdk_session(gateway.url, token, timeout=TIMEOUT) as session:
        assert await call_text(session, "github_get_repo", {"repo": "acme/widgets"}, timeout=TIMEOUT) \
            == "github_get_repo called"
        assert await refusal(session, "github_get_repo", {"repo": "evil/widgets"}) == {
            "error": "policy_denied", "rule": "github-repo-outside-org",
            "reason": "GitHub calls may only name a repository of your organisation"}
        assert await refusal(session, "drop_table", {"table": "users"}) == {
            "error": "policy_denied", "rule": "destructive-needs-admin",
            "reason": "destructive tools need the admin scope"}
        listed = {t.name for t in (await asyncio.wait_for(session.list_tools(), TIMEOUT)).tools}
        assert "github_get_repo" in listed
        assert "drop_table" not in listed  # denied whatever the arguments: never offered
        assert "github_delete_repo" not in listed
    admin = idp.mint("root", scope="mcp admin", extra={"org": "acme"})
    async with asyncio.timeout(60), sdk_session(gateway.url, admin, timeout=TIMEOUT) as session:
        assert await call_text(session, "drop_table", {"table": "t"}, timeout=TIMEOUT) == "drop_table called"
    denied = gateway.events("policy_denied")
    assert [e["rule"] for e in denied] == ["github-repo-outside-org", "destructive-needs-admin"]
    calls = [e["tool"] for e in gateway.events("tool_call")]
    assert calls == ["github_get_repo", "drop_table"]  # nothing refused reached the upstream


async def test_a_token_without_the_org_claim_is_refused_with_policy_error(
        gateway: GatewayProcess, idp: AuthServer) -> None:
    token = idp.mint("mallory", scope="mcp")
    async with asyncio.timeout(60), sdk_session(gateway.url, token, timeout=TIMEOUT) as session:
        data = await refusal(session, "github_get_repo", {"repo": "acme/widgets"})
        assert isinstance(data, dict)
        assert (data["error"], data["rule"]) == ("policy_error", "github-repo-outside-org")


async def test_a_rewritten_file_is_in_force_within_a_second_and_a_bad_one_is_refused(
        gateway: GatewayProcess, idp: AuthServer, tmp_path: Path) -> None:
    token = idp.mint("alice", scope="mcp", extra={"org": "acme"})
    policy = tmp_path / "policy.yaml"
    async with asyncio.timeout(60), sdk_session(gateway.url, token, timeout=TIMEOUT) as session:
        assert await call_text(session, "echo", {"text": "a"}, timeout=TIMEOUT) == "a"
        staged = tmp_path / "next.yaml"
        staged.write_text(readme_policy() + "  - name: no-echo\n    tools: [echo]\n    effect: deny\n")
        staged.replace(policy)
        changed_at = time.monotonic()
        while (refused := await refused_now(session, "echo")) is None:  # the other process polls: nothing to await
            assert time.monotonic() - changed_at < 1.5, "the new policy was not in force within a second"
            await asyncio.sleep(0.05)
        assert refused == {"error": "policy_denied", "rule": "no-echo", "reason": ""}
        policy.write_text("rules: [")  # broken: the last good policy stays
        deadline = time.monotonic() + 5
        while not gateway.events("policy_rejected"):
            assert time.monotonic() < deadline, gateway.log_tail()
            await asyncio.sleep(0.05)
        assert (await refusal(session, "echo", {"text": "c"})) == {
            "error": "policy_denied", "rule": "no-echo", "reason": ""}
