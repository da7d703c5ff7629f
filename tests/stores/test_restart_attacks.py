"""What a restart used to hand out, in process: each "process" is an app built from settings alone
(header auth, the policy and its stores, the registry) over one state folder in tmp_path, and a
restart is closing it (its cleanup runs) and building a new one with empty memory.

Only the gateway's public wiring is imported, so these run unchanged against the code before the
state folder existed, where each of them fails.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient
from pytest_aiohttp import AiohttpClient

from satgate_mcp.app import create_app
from satgate_mcp.auth.base import Identity
from satgate_mcp.auth.macaroons import mint_token
from satgate_mcp.events import RecordingPublisher
from satgate_mcp.metrics import Metrics
from satgate_mcp.policy.engine import CallPolicy
from satgate_mcp.settings import Settings
from satgate_mcp.stores import open_stores
from tests.answers import decode_answer
from tests.fakes import FakePool

ROOT_KEY = "state-restart-tests-root-key-0123456789abcdef"
LATEST = "2025-11-25"
ACCEPT = "application/json, text/event-stream"


@dataclass
class Process:
    client: TestClient[Any, Any]

    async def post(self, token: str, body: dict[str, Any], session_id: str | None = None) -> tuple[int, Any, str]:
        headers = {"Authorization": f"Bearer {token}", "Accept": ACCEPT, "Content-Type": "application/json",
                   "MCP-Protocol-Version": LATEST}
        if session_id is not None:
            headers["Mcp-Session-Id"] = session_id
        async with self.client.post("/mcp", headers=headers, data=json.dumps(body)) as resp:
            text = await resp.text()
            return resp.status, decode_answer(resp.content_type, text), resp.headers.get("Mcp-Session-Id", "")

    async def initialize(self, token: str) -> str:
        status, body, session_id = await self.post(token, {
            "jsonrpc": "2.0", "id": 0, "method": "initialize",
            "params": {"protocolVersion": LATEST, "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}})
        assert status == 200, body
        return session_id

    async def call(self, token: str, session_id: str, request_id: int) -> tuple[int, Any]:
        status, body, _ = await self.post(token, {"jsonrpc": "2.0", "id": request_id, "method": "tools/call",
                                                  "params": {"name": "echo", "arguments": {"text": "hi"}}},
                                          session_id)
        return status, body

    async def delete(self, token: str, session_id: str) -> int:
        headers = {"Authorization": f"Bearer {token}", "Mcp-Session-Id": session_id, "MCP-Protocol-Version": LATEST}
        async with self.client.delete("/mcp", headers=headers) as resp:
            return resp.status

    async def stop(self) -> None:
        await self.client.close()  # runs the app's cleanup: what a SIGTERM does


Start = Callable[..., Awaitable[Process]]


@pytest.fixture
def start(aiohttp_client: AiohttpClient, tmp_path: Path) -> Start:
    async def start_process(**overrides: Any) -> Process:
        values: dict[str, Any] = {"auth_mode": "header", "root_key": ROOT_KEY, "enforcement": "control",
                                  "state_dir": str(tmp_path / "state")}
        values.update(overrides)
        app = create_app(Settings(**values), pool=FakePool(), publisher=RecordingPublisher())
        return Process(await aiohttp_client(app))

    return start_process


def listing(folder: Path) -> list[str]:
    return sorted(entry.name for entry in folder.iterdir())


def budget_error(body: Any) -> str | None:
    error = body.get("error") if isinstance(body, dict) else None
    return (error.get("data") or {}).get("error") if isinstance(error, dict) else None


async def spend(process: Process, token: str, calls: int, first_id: int = 1) -> list[str | None]:
    """Each call's refusal (None: served), in a fresh session."""
    session_id = await process.initialize(token)
    out = []
    for request_id in range(first_id, first_id + calls):
        status, body = await process.call(token, session_id, request_id)
        assert status == 200, body
        out.append(budget_error(body))
    return out


async def test_attack_restart_hands_out_a_fresh_budget(start: Start) -> None:
    token = mint_token(ROOT_KEY, "agent-1", budget_limit=3)
    first = await start()
    assert await spend(first, token, 4) == [None, None, None, "budget_exhausted"]
    await first.stop()
    restarted = await start()  # a deploy: empty memory, the same state folder
    assert await spend(restarted, token, 2, first_id=10) == ["budget_exhausted"] * 2


async def test_attack_restart_resumes_a_deleted_session(start: Start) -> None:
    token = mint_token(ROOT_KEY, "agent-1")
    first = await start()
    session_id = await first.initialize(token)
    assert await first.delete(token, session_id) == 200
    await first.stop()
    restarted = await start()
    status, body = await restarted.call(token, session_id, 1)
    assert status == 404, body
    assert body["error"]["data"]["error"] == "session_not_found"
    assert (await restarted.call(token, await restarted.initialize(token), 2))[0] == 200  # a new one is fine


async def test_a_session_that_was_not_deleted_still_resumes_after_a_restart(start: Start) -> None:
    token = mint_token(ROOT_KEY, "agent-1")
    first = await start()
    session_id = await first.initialize(token)
    await first.stop()
    restarted = await start()
    status, body = await restarted.call(token, session_id, 1)
    assert status == 200, body


async def test_memory_keeps_todays_behaviour_a_restart_starts_afresh(
        start: Start, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    token = mint_token(ROOT_KEY, "agent-1", budget_limit=1)
    first = await start(state_dir="memory")
    session_id = await first.initialize(token)
    assert [budget_error((await first.call(token, session_id, i))[1]) for i in (1, 2)] == [None, "budget_exhausted"]
    assert await first.delete(token, session_id) == 200
    await first.stop()
    restarted = await start(state_dir="memory")
    status, body = await restarted.call(token, session_id, 3)  # resumed: the DELETE was that process's only
    assert (status, budget_error(body)) == (200, None)  # and served from a fresh budget, as before
    assert listing(tmp_path) == []  # nothing written to the working directory


async def test_the_default_state_folder_is_satgate_state_in_the_working_directory(
        start: Start, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("SATGATE_STATE_DIR", raising=False)
    monkeypatch.delenv("STATE_DIRECTORY", raising=False)
    token = mint_token(ROOT_KEY, "agent-1", budget_limit=1)
    first = await start(state_dir=None)
    assert await spend(first, token, 1) == [None]
    await first.stop()
    assert "satgate.db" in listing(tmp_path / "satgate-state")
    restarted = await start(state_dir=None)
    assert await spend(restarted, token, 1, first_id=2) == ["budget_exhausted"]


# --- the duplicate guard's record, across a restart ------------------------------------------------


@pytest.fixture
async def policies(tmp_path: Path) -> AsyncIterator[Callable[[], CallPolicy]]:
    """Each call: a new process's policy over the state folder (closed at the end of the test)."""
    made: list[CallPolicy] = []
    closers: list[Callable[[], Awaitable[None]]] = []

    def make() -> CallPolicy:
        values: dict[str, Any] = {"auth_mode": "header", "root_key": ROOT_KEY, "enforcement": "control",
                                  "state_dir": str(tmp_path / "state")}
        settings = Settings(**values)
        stores = open_stores(settings)
        closers.append(stores.aclose)
        policy = CallPolicy.from_settings(settings, publisher=RecordingPublisher(), metrics=Metrics(), stores=stores)
        made.append(policy)
        return policy

    yield make
    for policy in made:
        await policy.close()
    for close in closers:
        await close()


async def test_attack_a_call_whose_process_died_gets_one_free_re_send_after_a_restart_no_more(
        policies: Callable[[], CallPolicy]) -> None:
    alice = Identity("alice", budget_limit=10)
    call = {"name": "echo", "arguments": {"text": "hi"}}

    async def admit(policy: CallPolicy) -> Any:
        return await policy.admit(alice, method="tools/call", tool="echo", session_id="mcp-s1", request_id=7,
                                  params=call)

    await admit(policies())  # charged and recorded; its process dies before it settles
    restarted = policies()
    replay = await admit(restarted)  # the client re-sends to the restarted gateway: free, once
    assert (replay.charged, (await restarted.budget_status(alice))["remaining"]) == (0, 9)
    again = await admit(policies())  # once more, in yet another process: a new call, charged
    assert again.charged == 1
    assert (await restarted.budget_status(alice))["remaining"] == 8
