"""2025-11-25's tasks through a real gateway (header mode) to a real upstream, as a handshake client speaks them on
the wire: a task-augmented call is charged once and its task id is sealed to the token and session that created
it; ``tasks/get``, ``tasks/result`` and ``tasks/cancel`` reach the task with that id and nobody else's does;
``tasks/list`` shows each session its own tasks only; and the upstream's ``notifications/tasks/status`` reaches the
creating session's stream alone, with the sealed id."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx2
import pytest

from satgate_mcp.auth.macaroons import mint_token
from tests.answers import decode_answer
from tests.gateway_process import GatewayProcess
from tests.integration.front import gateway_in_front

pytestmark = pytest.mark.process

ROOT_KEY = "tasks-relay-2025-root-key-0123456789abcdef"
VERSION = "2025-11-25"
TERMINAL = ("completed", "failed", "cancelled")
UNKNOWN = (-32602, "Unknown task", {"error": "unknown_task"})


class Session:
    """One token's 2025-11-25 session: the handshake, then requests under its ``Mcp-Session-Id``."""

    def __init__(self, http: httpx2.AsyncClient, gw: GatewayProcess, token_id: str) -> None:
        self.http, self.gw = http, gw
        self.token = mint_token(ROOT_KEY, token_id, budget_limit=10)
        self.session_id = ""
        self.ids = 0
        self.capabilities: dict[str, Any] = {}

    def headers(self) -> dict[str, str]:
        headers = {"Authorization": f"Bearer {self.token}", "Content-Type": "application/json",
                   "Accept": "application/json, text/event-stream", "MCP-Protocol-Version": VERSION}
        if self.session_id:
            headers["Mcp-Session-Id"] = self.session_id
        return headers

    async def open(self) -> Session:
        body = {"jsonrpc": "2.0", "id": 0, "method": "initialize",
                "params": {"protocolVersion": VERSION, "capabilities": {},
                           "clientInfo": {"name": "tasks-2025-test", "version": "1"}}}
        resp = await self.http.post(f"{self.gw.url}/mcp", content=json.dumps(body), headers=self.headers())
        self.session_id = resp.headers["mcp-session-id"]
        answer = decode_answer(resp.headers.get("content-type", "").partition(";")[0], resp.content)
        self.capabilities = answer["result"]["capabilities"]
        note = {"jsonrpc": "2.0", "method": "notifications/initialized"}
        await self.http.post(f"{self.gw.url}/mcp", content=json.dumps(note), headers=self.headers())
        return self

    async def rpc(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        self.ids += 1
        body = {"jsonrpc": "2.0", "id": self.ids, "method": method, "params": params}
        resp = await self.http.post(f"{self.gw.url}/mcp", content=json.dumps(body), headers=self.headers())
        answer = decode_answer(resp.headers.get("content-type", "").partition(";")[0], resp.content)
        assert isinstance(answer, dict), (resp.status_code, resp.text)
        return answer

    async def create(self, seconds: float, label: str) -> str:
        created = await self.rpc("tools/call", {"name": "slow_compute", "task": {"ttl": 60_000},
                                                "arguments": {"seconds": seconds, "label": label}})
        task_id = created["result"]["task"]["taskId"]
        assert isinstance(task_id, str)
        return task_id

    async def remaining(self) -> int:
        return int((await self.rpc("satgate/budget", {}))["result"]["remaining"])

    @contextlib.asynccontextmanager
    async def stream(self) -> AsyncIterator[asyncio.Queue[dict[str, Any]]]:
        """The session's GET stream, its messages queued as they arrive (open once the first event came)."""
        messages: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        opened = asyncio.Event()

        async def read() -> None:
            headers = {**self.headers(), "Accept": "text/event-stream"}
            async with self.http.stream("GET", f"{self.gw.url}/mcp", headers=headers) as resp:
                assert resp.status_code == 200
                opened.set()
                async for line in resp.aiter_lines():
                    if line.startswith("data:") and line[5:].strip():
                        await messages.put(json.loads(line[5:]))

        reader = asyncio.create_task(read())
        await asyncio.wait_for(opened.wait(), 10)
        try:
            yield messages
        finally:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader


async def statuses_until_done(messages: asyncio.Queue[dict[str, Any]], task_id: str) -> list[dict[str, Any]]:
    """Every ``notifications/tasks/status`` a stream carries until ``task_id`` is announced ended."""
    seen = []
    while True:
        message = await asyncio.wait_for(messages.get(), 10)
        if message.get("method") == "notifications/tasks/status":
            seen.append(message["params"])
            if message["params"]["taskId"] == task_id and message["params"]["status"] in TERMINAL:
                return seen


def error_of(answer: dict[str, Any]) -> tuple[int, str, object]:
    return answer["error"]["code"], answer["error"]["message"], answer["error"].get("data")


@pytest.mark.parametrize(("era", "transport"), [("2025", "stdio"), ("2025", "http"), ("both", "stdio")])
async def test_2025_tasks_through_the_gateway(tmp_path: Path, era: str, transport: str) -> None:
    """``both``: a dual-revision upstream keeps a 2025 client on its 2025 session, tasks included."""
    async with (gateway_in_front(tmp_path, root_key=ROOT_KEY, name="alpha", transport=transport,
                                 args=("--name", "alpha", "--era", era, "--tasks")) as gw,
                httpx2.AsyncClient(trust_env=False, timeout=httpx2.Timeout(20.0)) as http):
        alice = await Session(http, gw, "tok-alice").open()
        bob = await Session(http, gw, "tok-bob").open()
        assert alice.capabilities["tasks"] == {"list": {}, "cancel": {}, "requests": {"tools": {"call": {}}}}

        async with alice.stream() as alice_hears, bob.stream() as bob_hears:
            mine = await alice.create(0.2, "alice")
            assert mine.startswith("sgt1.")  # sealed: not the upstream's own id
            theirs = await bob.create(0.8, "bob")
            assert await alice.remaining() == 9  # charged once, at creation
            # Each creator hears its own task's end under the sealed id, and nobody else's (Alice's ended first).
            assert {s["taskId"] for s in await statuses_until_done(alice_hears, mine)} == {mine}
            assert {s["taskId"] for s in await statuses_until_done(bob_hears, theirs)} == {theirs}

        got = (await alice.rpc("tasks/get", {"taskId": mine}))["result"]
        assert (got["taskId"], got["status"]) == (mine, "completed")
        result = (await alice.rpc("tasks/result", {"taskId": mine}))["result"]
        assert result["content"][0]["text"] == "computed alice"
        assert result["_meta"]["io.modelcontextprotocol/related-task"]["taskId"] == mine

        listed = (await alice.rpc("tasks/list", {}))["result"]["tasks"]
        assert [t["taskId"] for t in listed] == [mine]
        assert [t["taskId"] for t in (await bob.rpc("tasks/list", {}))["result"]["tasks"]] == [theirs]
        other_session = await Session(http, gw, "tok-alice").open()  # a 2025 task is its session's alone
        assert (await other_session.rpc("tasks/list", {}))["result"]["tasks"] == []
        assert await alice.remaining() == 9  # polling, the result and listing cost nothing more

        for method in ("tasks/get", "tasks/result", "tasks/cancel"):  # the same answer as for a made-up id
            assert error_of(await bob.rpc(method, {"taskId": mine})) == UNKNOWN
            assert error_of(await other_session.rpc(method, {"taskId": mine})) == UNKNOWN
        assert error_of(await alice.rpc("tasks/get", {"taskId": "task1-0011223344556677"})) == UNKNOWN

        running = await alice.create(60, "long")
        cancelled = (await alice.rpc("tasks/cancel", {"taskId": running}))["result"]
        assert (cancelled["taskId"], cancelled["status"]) == (running, "cancelled")
        assert error_of(await alice.rpc("tasks/list", {"cursor": "not-ours"}))[0] == -32602


@pytest.mark.parametrize("state", ["memory", "folder", "redis"])
async def test_a_2025_sealed_task_id_outlives_a_gateway_restart(tmp_path: Path, state: str) -> None:
    """A new gateway process (empty memory, same keys) resumes the session and routes its sealed id to the HTTP
    upstream holding the task. Who created which task is kept where the gateway keeps its state: with a state
    folder or Redis the new process lists the task to its creator (and nobody else); in memory it lists none."""
    settings = ({"SATGATE_STATE_DIR": str(tmp_path / "state")} if state == "folder" else
                {"SATGATE_REDIS_URL": "redis://127.0.0.1:6379/0"} if state == "redis" else {})
    async with (gateway_in_front(tmp_path, root_key=ROOT_KEY, name="alpha", transport="http",
                                 args=("--name", "alpha", "--era", "2025", "--tasks"), settings=settings) as gw,
                httpx2.AsyncClient(trust_env=False, timeout=httpx2.Timeout(20.0)) as http):
        alice = await Session(http, gw, "tok-alice").open()
        mine = await alice.create(0.3, "before")
        await gw.kill()
        gw.start()
        await gw.wait_ready()
        result = (await alice.rpc("tasks/result", {"taskId": mine}))["result"]  # the same Mcp-Session-Id
        assert result["content"][0]["text"] == "computed before"
        assert result["_meta"]["io.modelcontextprotocol/related-task"]["taskId"] == mine
        listed = [t["taskId"] for t in (await alice.rpc("tasks/list", {}))["result"]["tasks"]]
        assert listed == ([] if state == "memory" else [mine])
        bob = await Session(http, gw, "tok-bob").open()
        assert (await bob.rpc("tasks/list", {}))["result"]["tasks"] == []
        assert error_of(await bob.rpc("tasks/result", {"taskId": mine})) == UNKNOWN
