"""Delegation end to end: a real ``python -m satgate_mcp serve`` (header mode, ``control`` enforcement,
tool costs, a revocation file), the real stdio upstream (tests/upstream_server.py), the official ``mcp``
SDK client, and the ``satgate-mcp token`` commands an operator would run.

An agent holding a parent token with 10 credits asks the gateway for a child token holding 4 of them;
a second SDK session spends the child's credits until ``Budget exhausted``; the parent keeps
6 minus what it spent itself; revoking the parent's id refuses the child too.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import mcp_types as types
import pytest
from mcp.client.session import ClientSession
from mcp.shared.exceptions import MCPError

from tests.gateway_process import GatewayProcess, call_text, sdk_session

pytestmark = pytest.mark.process

ROOT_KEY = "e2e-delegation-root-key-0123456789abcdef"
TOOL_COSTS = {"echo": 1, "add": 1}
PARENT_ID = "parent-1"
PARENT_BUDGET = 10
CHILD_BUDGET = 4
CHILD_TTL = 600
#: Bound on one MCP call.
CALL_TIMEOUT = 10.0
POLL_INTERVAL = 0.05
#: The daemon's file revocation store stats the file at most every 0.25 s; allow generous slack.
REVOCATION_SEEN_WITHIN = 5.0


# --- the gateway's own methods, as typed SDK requests --------------------------------------------


class DelegateRequest(types.Request[dict[str, Any], Literal["satgate/delegate"]]):
    method: Literal["satgate/delegate"] = "satgate/delegate"


class BudgetRequest(types.Request[dict[str, Any] | None, Literal["satgate/budget"]]):
    method: Literal["satgate/budget"] = "satgate/budget"
    params: dict[str, Any] | None = None


class DelegateResult(types.Result):
    token: str
    token_id: str
    budget_id: str
    budget: float
    parent_id: str
    parent_remaining: float
    depth: int
    expires_at: float | None = None
    tools: list[str] | None = None
    label: str | None = None


class BudgetResult(types.Result):
    token_id: str
    budget_id: str
    remaining: float


async def delegate(session: ClientSession, **params: Any) -> DelegateResult:
    return await session.send_request(DelegateRequest(params=params), DelegateResult,
                                      request_read_timeout_seconds=CALL_TIMEOUT)


async def budget(session: ClientSession) -> BudgetResult:
    return await session.send_request(BudgetRequest(), BudgetResult, request_read_timeout_seconds=CALL_TIMEOUT)


async def echo(session: ClientSession, text: str) -> str:
    return await call_text(session, "echo", {"text": text}, timeout=CALL_TIMEOUT)


async def refusal(session: ClientSession, tool: str, arguments: dict[str, Any]) -> MCPError:
    with pytest.raises(MCPError) as info:
        await asyncio.wait_for(session.call_tool(tool, arguments), CALL_TIMEOUT)
    return info.value


# --- the processes ----------------------------------------------------------------------------------


@pytest.fixture
def deployment(tmp_path: Path) -> Iterator[GatewayProcess]:
    """One gateway with ``control`` enforcement and tool costs; the token commands share its revocation file."""
    gateway = GatewayProcess(tmp_path, root_key=ROOT_KEY, revocation_file=tmp_path / "revoked.txt",
                             settings={"SATGATE_ENFORCEMENT": "control", "SATGATE_TOOL_COSTS": json.dumps(TOOL_COSTS)})
    yield gateway
    gateway.terminate()


async def refused_once_revoked(session: ClientSession) -> MCPError:
    """The first refusal of a free request after a revocation; the daemon notices the file within a bound."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + REVOCATION_SEEN_WITHIN
    while True:
        try:
            await budget(session)
        except MCPError as exc:
            return exc
        if loop.time() >= deadline:
            raise AssertionError(f"still served {REVOCATION_SEEN_WITHIN}s after the revocation")
        await asyncio.sleep(POLL_INTERVAL)


# --- the test --------------------------------------------------------------------------------------


async def test_a_child_token_spends_credits_moved_from_its_parent_and_is_revoked_with_it(
        deployment: GatewayProcess) -> None:
    deployment.start()
    minted, _ = await asyncio.gather(
        deployment.cli("token", "mint", "--id", PARENT_ID, "--budget-limit", str(PARENT_BUDGET)),
        deployment.wait_ready())
    parent_token = minted.strip()

    async with sdk_session(deployment.url, parent_token, timeout=CALL_TIMEOUT) as parent:
        assert await echo(parent, "parent before") == "parent before"
        child = await delegate(parent, budget=CHILD_BUDGET, tools=["echo"], label="e2e child", ttl=CHILD_TTL)

        assert child.parent_id == PARENT_ID
        assert child.token_id != PARENT_ID
        assert child.budget_id not in (PARENT_ID, child.token_id)
        assert (child.budget, child.parent_remaining) == (CHILD_BUDGET, PARENT_BUDGET - 1 - CHILD_BUDGET)
        assert (child.depth, child.tools, child.label) == (1, ["echo"], "e2e child")
        assert child.expires_at is not None
        assert abs(child.expires_at - (time.time() + CHILD_TTL)) < 60
        inspected = json.loads(await deployment.cli("token", "inspect", child.token))
        assert (inspected["token_id"], inspected["parent_id"]) == (child.token_id, PARENT_ID)
        assert inspected["restrictions"]["budget_limit"] == CHILD_BUDGET

        async with sdk_session(deployment.url, child.token, timeout=CALL_TIMEOUT) as kid:
            assert [t.name for t in (await kid.list_tools()).tools] == ["echo"]
            for n in range(CHILD_BUDGET):
                assert await echo(kid, f"child {n}") == f"child {n}"
            exhausted = await refusal(kid, "echo", {"text": "one too many"})
            assert (exhausted.code, exhausted.message) == (-32000, "Budget exhausted")
            assert exhausted.data == {"error": "budget_exhausted", "tool": "echo", "cost_credits": 1,
                                      "remaining_credits": 0, "token_id": child.token_id,
                                      "budget_id": child.budget_id}
            assert (await refusal(kid, "add", {"a": 1, "b": 2})).data["error"] == "tool_not_allowed"
            kid_status = await budget(kid)
            assert (kid_status.token_id, kid_status.budget_id, kid_status.remaining) == (
                child.token_id, child.budget_id, 0)

            assert await echo(parent, "parent after") == "parent after"
            parent_status = await budget(parent)
            assert (parent_status.budget_id, parent_status.remaining) == (PARENT_ID, 6 - 2)

            assert (await deployment.cli("token", "revoke", PARENT_ID)).strip() == f"revoked {PARENT_ID}"
            kid_refused = await refused_once_revoked(kid)
            assert kid_refused.data["error"] == "token_revoked"
            assert (await refused_once_revoked(parent)).data["error"] == "token_revoked"

    delegations = [e for e in deployment.events() if e["event"] == "delegation"]
    assert [(e["ok"], e["token_id"], e["parent_id"], e["budget"]) for e in delegations] == [
        (True, child.token_id, PARENT_ID, CHILD_BUDGET)]
    text = deployment.events_file.read_text()
    assert parent_token not in text
    assert child.token not in text
