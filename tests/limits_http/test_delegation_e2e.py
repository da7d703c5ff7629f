"""Delegation end to end: a real ``python -m satgate_mcp serve`` (header mode, ``control`` enforcement,
tool costs, a revocation file), the real stdio upstream (tests/upstream_server.py), the official ``mcp``
SDK client, and the ``satgate-mcp token`` commands an operator would run.

An agent holding a parent token with 10 credits asks the gateway for a child token holding 4 of them;
a second SDK session spends the child's credits until ``Budget exhausted``; the parent keeps
6 minus what it spent itself; revoking the parent's id refuses the child too.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any, Literal

import httpx2
import mcp_types as types
import pytest
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from tests.resume.test_resume_e2e import base_env, child_pids, free_port

REPO = Path(__file__).resolve().parents[2]
UPSTREAM_SERVER = REPO / "tests" / "upstream_server.py"
ROOT_KEY = "e2e-delegation-root-key-0123456789abcdef"
TOOL_COSTS = {"echo": 1, "add": 1}
PARENT_ID = "parent-1"
PARENT_BUDGET = 10
CHILD_BUDGET = 4
CHILD_TTL = 600
#: Bounds: a gateway start (its upstream child imports the mcp SDK), one MCP call, a CLI run, an exit.
START_TIMEOUT = 20.0
CALL_TIMEOUT = 10.0
CLI_TIMEOUT = 20.0
EXIT_TIMEOUT = 5.0
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
    result = await asyncio.wait_for(session.call_tool("echo", {"text": text}), CALL_TIMEOUT)
    assert not result.is_error, result
    [content] = result.content
    assert isinstance(content, types.TextContent)
    return content.text


async def refusal(session: ClientSession, tool: str, arguments: dict[str, Any]) -> MCPError:
    with pytest.raises(MCPError) as info:
        await asyncio.wait_for(session.call_tool(tool, arguments), CALL_TIMEOUT)
    return info.value


# --- the processes ----------------------------------------------------------------------------------


class Deployment:
    """One gateway process in its own process group, and the environment the token commands share with it."""

    def __init__(self, workdir: Path) -> None:
        self.port = free_port()
        self.workdir = workdir
        self.events_file = workdir / "events.jsonl"
        self.log_file = workdir / "serve.log"
        self.env = {**base_env(), "SATGATE_ROOT_KEY": ROOT_KEY,
                    "SATGATE_REVOCATION_FILE": str(workdir / "revoked.txt")}
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        upstreams = {"t": {"transport": "stdio", "command": [sys.executable, str(UPSTREAM_SERVER), "stdio"]}}
        env = {**self.env, "SATGATE_HOST": "127.0.0.1", "SATGATE_PORT": str(self.port),
               "SATGATE_AUTH_MODE": "header", "SATGATE_ENFORCEMENT": "control",
               "SATGATE_TOOL_COSTS": json.dumps(TOOL_COSTS), "SATGATE_UPSTREAMS": json.dumps(upstreams),
               "SATGATE_EVENTS_FILE": str(self.events_file), "SATGATE_LOG_FORMAT": "json",
               "SATGATE_DRAIN_SECONDS": "1"}
        with self.log_file.open("wb") as log:
            self.proc = subprocess.Popen([sys.executable, "-m", "satgate_mcp", "serve"], cwd=REPO, env=env,
                                         stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True)

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        children = child_pids(proc.pid)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(EXIT_TIMEOUT)
        for pid in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def log_tail(self, lines: int = 30) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log_file.read_text(errors="replace").splitlines()[-lines:])
        return ""

    async def wait_ready(self) -> None:
        """Bounded poll of /readyz: a process that is not listening yet has nothing to await."""
        assert self.proc is not None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + START_TIMEOUT
        async with httpx2.AsyncClient(trust_env=False, timeout=2.0) as http:
            while True:
                if self.proc.poll() is not None:
                    raise AssertionError(f"gateway exited with {self.proc.returncode}:\n{self.log_tail()}")
                with contextlib.suppress(httpx2.TransportError):
                    if (await http.get(f"{self.url}/readyz")).status_code == 200:
                        return
                if loop.time() >= deadline:
                    raise AssertionError(f"gateway not ready within {START_TIMEOUT}s:\n{self.log_tail()}")
                await asyncio.sleep(POLL_INTERVAL)

    async def cli(self, *args: str) -> str:
        """``satgate-mcp <args>`` as an operator runs it, off the event loop so the SDK sessions stay live."""
        done = await asyncio.to_thread(
            subprocess.run, [sys.executable, "-m", "satgate_mcp", *args], cwd=REPO, env=self.env,
            capture_output=True, text=True, timeout=CLI_TIMEOUT)
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    def events(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.events_file.read_text().splitlines() if line.strip()]


@pytest.fixture
def deployment(tmp_path: Path) -> Iterator[Deployment]:
    gateway = Deployment(tmp_path)
    yield gateway
    gateway.stop()


@contextlib.asynccontextmanager
async def sdk_session(url: str, token: str) -> AsyncIterator[ClientSession]:
    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, trust_env=False,
                              timeout=httpx2.Timeout(CALL_TIMEOUT))
    async with (http, streamable_http_client(f"{url}/mcp", http_client=http) as (read, write),
                ClientSession(read, write, read_timeout_seconds=CALL_TIMEOUT) as session):
        await asyncio.wait_for(session.initialize(), CALL_TIMEOUT)
        yield session


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
        deployment: Deployment) -> None:
    deployment.start()
    parent_token, _ = await asyncio.gather(
        deployment.cli("token", "mint", "--id", PARENT_ID, "--budget-limit", str(PARENT_BUDGET)),
        deployment.wait_ready())

    async with sdk_session(deployment.url, parent_token) as parent:
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

        async with sdk_session(deployment.url, child.token) as kid:
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

            assert await deployment.cli("token", "revoke", PARENT_ID) == f"revoked {PARENT_ID}"
            kid_refused = await refused_once_revoked(kid)
            assert kid_refused.data["error"] == "token_revoked"
            assert (await refused_once_revoked(parent)).data["error"] == "token_revoked"

    delegations = [e for e in deployment.events() if e["event"] == "delegation"]
    assert [(e["ok"], e["token_id"], e["parent_id"], e["budget"]) for e in delegations] == [
        (True, child.token_id, PARENT_ID, CHILD_BUDGET)]
    text = deployment.events_file.read_text()
    assert parent_token not in text
    assert child.token not in text
