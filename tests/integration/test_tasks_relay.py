"""The tasks extension through a real gateway (header mode) to a real upstream over stdio and HTTP, as 2026-07-28
clients speak it on the wire: a task-augmented call is charged once, its task id is sealed and works for its
token alone (another token hears exactly what an unknown id gets), and after a restart of the gateway (a new
process with empty memory) the sealed id still reaches the task on its upstream."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx2
import pytest

from satgate_mcp.auth.macaroons import mint_token
from tests.answers import decode_answer
from tests.gateway_process import GatewayProcess
from tests.integration.front import gateway_in_front

pytestmark = pytest.mark.process

ROOT_KEY = "tasks-relay-root-key-0123456789abcdef0123"
VERSION = "2026-07-28"
TASKS = "io.modelcontextprotocol/tasks"
UPSTREAM_ARGS = ("--name", "alpha", "--era", "2026", "--tasks")
POLL_BOUND = 20  # polls of 0.1 s (the task's own pollIntervalMs is 0.2 s) before a test gives up


class Client:
    """One token's 2026-07-28 requests: the protocol ``_meta`` and routing headers a conforming client sends."""

    def __init__(self, http: httpx2.AsyncClient, token_id: str, *, declares_tasks: bool = True) -> None:
        self.http = http
        self.token = mint_token(ROOT_KEY, token_id, budget_limit=10)
        self.declares = declares_tasks
        self.ids = 0

    async def rpc(self, gw: GatewayProcess, method: str, params: dict[str, Any]) -> dict[str, Any]:
        self.ids += 1
        caps: dict[str, Any] = {"extensions": {TASKS: {}}} if self.declares else {}
        meta = {"io.modelcontextprotocol/protocolVersion": VERSION,
                "io.modelcontextprotocol/clientInfo": {"name": "tasks-test", "version": "1"},
                "io.modelcontextprotocol/clientCapabilities": caps}
        body = {"jsonrpc": "2.0", "id": self.ids, "method": method, "params": {**params, "_meta": meta}}
        headers = {"Authorization": f"Bearer {self.token}", "Content-Type": "application/json",
                   "Accept": "application/json, text/event-stream", "MCP-Protocol-Version": VERSION,
                   "Mcp-Method": method}
        name = params.get("name") or params.get("taskId")
        if isinstance(name, str):
            headers["Mcp-Name"] = name
        resp = await self.http.post(f"{gw.url}/mcp", content=json.dumps(body), headers=headers)
        answer = decode_answer(resp.headers.get("content-type", "").partition(";")[0], resp.content)
        assert isinstance(answer, dict), (resp.status_code, resp.text)
        return answer

    async def remaining(self, gw: GatewayProcess) -> int:
        answer = await self.rpc(gw, "satgate/budget", {})
        return int(answer["result"]["remaining"])

    async def settled(self, gw: GatewayProcess, task_id: str) -> dict[str, Any]:
        """``tasks/get`` as a client polls it, until the task is in a terminal state."""
        for _ in range(POLL_BOUND):
            result = (await self.rpc(gw, "tasks/get", {"taskId": task_id}))["result"]
            if result["status"] in ("completed", "failed", "cancelled"):
                return dict(result)
            await asyncio.sleep(0.1)  # the protocol's own polling (pollIntervalMs): nothing to await instead
        raise AssertionError(f"task {task_id} did not settle")


def unknown(answer: dict[str, Any]) -> tuple[int, str, object]:
    error = answer["error"]
    return error["code"], error["message"], error.get("data")


@pytest.mark.parametrize("transport", ["stdio", "http"])
async def test_a_task_through_the_gateway(tmp_path: Path, transport: str) -> None:
    async with (gateway_in_front(tmp_path, root_key=ROOT_KEY, name="alpha", transport=transport,
                                 args=UPSTREAM_ARGS) as gw,
                httpx2.AsyncClient(trust_env=False, timeout=httpx2.Timeout(20.0)) as http):
        alice, mallory = Client(http, "tok-alice"), Client(http, "tok-mallory")
        created = (await alice.rpc(gw, "tools/call", {"name": "slow_compute",
                                                       "arguments": {"seconds": 0.5, "label": "x"}}))["result"]
        assert created["resultType"] == "task"
        task_id = created["taskId"]
        assert task_id.startswith("sgt1.")  # sealed: not the upstream's own id
        assert await alice.remaining(gw) == 9  # charged once, at creation

        never = await alice.rpc(gw, "tasks/get", {"taskId": "sgt1.never.made"})
        for method in ("tasks/get", "tasks/cancel", "tasks/update"):  # another token: exactly the unknown answer
            assert unknown(await mallory.rpc(gw, method, {"taskId": task_id})) == unknown(never)
        assert unknown(never) == (-32602, "Unknown task", {"error": "unknown_task"})

        done = await alice.settled(gw, task_id)
        assert done["status"] == "completed"
        assert done["taskId"] == task_id
        assert done["result"]["content"][0]["text"] == "computed x"
        assert await alice.remaining(gw) == 9  # polling and the result cost nothing more

        undeclared = Client(http, "tok-alice", declares_tasks=False)
        assert (await undeclared.rpc(gw, "tasks/get", {"taskId": task_id}))["error"]["code"] == -32021
        for removed in ("tasks/result", "tasks/list"):  # v1 methods: gone at 2026-07-28
            assert (await alice.rpc(gw, removed, {"taskId": task_id}))["error"]["code"] == -32601

        running = (await alice.rpc(gw, "tools/call", {"name": "slow_compute", "arguments": {"seconds": 60}}))
        running_id = running["result"]["taskId"]
        ack = (await alice.rpc(gw, "tasks/cancel", {"taskId": running_id}))["result"]
        assert ack["resultType"] == "complete"
        assert "taskId" not in ack
        assert (await alice.settled(gw, running_id))["status"] == "cancelled"


async def test_a_sealed_task_id_outlives_a_gateway_restart(tmp_path: Path) -> None:
    """A new gateway process (empty memory, same keys) routes the sealed id to the HTTP upstream holding the task."""
    async with (gateway_in_front(tmp_path, root_key=ROOT_KEY, name="alpha", transport="http",
                                 args=UPSTREAM_ARGS) as gw,
                httpx2.AsyncClient(trust_env=False, timeout=httpx2.Timeout(20.0)) as http):
        alice = Client(http, "tok-alice")
        created = await alice.rpc(gw, "tools/call", {"name": "slow_compute", "arguments": {"seconds": 0.5}})
        task_id = created["result"]["taskId"]
        await gw.kill()
        gw.start()
        await gw.wait_ready()
        done = await alice.settled(gw, task_id)
        assert done["status"] == "completed"
        assert done["taskId"] == task_id
        assert unknown(await Client(http, "tok-bob").rpc(gw, "tasks/get", {"taskId": task_id}))[0] == -32602
