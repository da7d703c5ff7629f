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


async def listen_for(client: Client, gw: GatewayProcess, task_ids: list[str],
                     heard: asyncio.Queue[dict[str, Any]]) -> None:
    """A ``subscriptions/listen`` stream following ``task_ids``; every message it carries is queued."""
    client.ids += 1
    caps: dict[str, Any] = {"extensions": {TASKS: {}}} if client.declares else {}
    meta = {"io.modelcontextprotocol/protocolVersion": VERSION, "io.modelcontextprotocol/clientCapabilities": caps,
            "io.modelcontextprotocol/clientInfo": {"name": "tasks-test", "version": "1"}}
    body = {"jsonrpc": "2.0", "id": client.ids, "method": "subscriptions/listen",
            "params": {"notifications": {"taskIds": task_ids}, "_meta": meta}}
    headers = {"Authorization": f"Bearer {client.token}", "Content-Type": "application/json",
               "Accept": "application/json, text/event-stream", "MCP-Protocol-Version": VERSION,
               "Mcp-Method": "subscriptions/listen"}
    async with client.http.stream("POST", f"{gw.url}/mcp", content=json.dumps(body), headers=headers) as resp:
        assert resp.status_code == 200
        async for line in resp.aiter_lines():
            if line.startswith("data:") and line[5:].strip():
                await heard.put(json.loads(line[5:]))


async def next_of(heard: asyncio.Queue[dict[str, Any]], method: str) -> dict[str, Any]:
    while True:
        message = await asyncio.wait_for(heard.get(), 10)
        if message.get("method") == method:
            return dict(message["params"])


async def answer_parked(client: Client, gw: GatewayProcess, task_id: str) -> None:
    """Once ``confirm_delete``'s task asks its question (polled, as a client polls), answer it: the task ends."""
    for _ in range(POLL_BOUND):
        result = (await client.rpc(gw, "tasks/get", {"taskId": task_id}))["result"]
        if result["status"] == "input_required":
            key = next(iter(result["inputRequests"]))
            await client.rpc(gw, "tasks/update", {"taskId": task_id, "inputResponses": {
                key: {"action": "accept", "content": {"confirm": True}}}})
            return
        await asyncio.sleep(0.1)  # the protocol's own polling (pollIntervalMs): nothing to await instead
    raise AssertionError(f"task {task_id} never asked")


async def task_ids_heard_until_done(heard: asyncio.Queue[dict[str, Any]], task_id: str) -> list[dict[str, Any]]:
    """Every ``notifications/tasks`` a stream carries until ``task_id`` is announced ended."""
    seen = []
    while True:
        params = await next_of(heard, "notifications/tasks")
        seen.append(params)
        if params["taskId"] == task_id and params["status"] in ("completed", "failed", "cancelled"):
            return seen


@pytest.mark.parametrize(("era", "transport"), [("2026", "stdio"), ("2026", "http"), ("both", "http")])
async def test_a_listen_stream_hears_its_own_tasks_status(tmp_path: Path, era: str, transport: str) -> None:
    """``taskIds`` on ``subscriptions/listen``: the caller's own tasks' ``notifications/tasks`` arrive under their
    sealed ids; another token naming the same id is honoured nothing for it and hears nothing of it."""
    async with (gateway_in_front(tmp_path, root_key=ROOT_KEY, name="alpha", transport=transport,
                                 args=("--name", "alpha", "--era", era, "--tasks")) as gw,
                httpx2.AsyncClient(trust_env=False, timeout=httpx2.Timeout(20.0)) as http):
        alice, mallory = Client(http, "tok-alice"), Client(http, "tok-mallory")
        undeclared = Client(http, "tok-alice", declares_tasks=False)
        # confirm_delete's tasks wait in input_required until tasks/update answers: each ends when its owner says
        mine = (await alice.rpc(gw, "tools/call", {"name": "confirm_delete", "arguments": {"filename": "a"}}))
        theirs = (await mallory.rpc(gw, "tools/call", {"name": "confirm_delete", "arguments": {"filename": "m"}}))
        mine_id, theirs_id = mine["result"]["taskId"], theirs["result"]["taskId"]
        streams = {who: asyncio.Queue[dict[str, Any]]() for who in ("alice", "mallory", "undeclared")}
        readers = [asyncio.create_task(listen_for(alice, gw, [mine_id], streams["alice"])),
                   asyncio.create_task(listen_for(mallory, gw, [mine_id, theirs_id], streams["mallory"])),
                   asyncio.create_task(listen_for(undeclared, gw, [mine_id], streams["undeclared"]))]
        try:
            acks = {who: await next_of(q, "notifications/subscriptions/acknowledged") for who, q in streams.items()}
            assert acks["alice"]["notifications"]["taskIds"] == [mine_id]
            assert acks["mallory"]["notifications"]["taskIds"] == [theirs_id]  # Alice's: honoured as unknown is
            assert "taskIds" not in acks["undeclared"]["notifications"]  # no extension declared
            await answer_parked(alice, gw, mine_id)
            heard = await task_ids_heard_until_done(streams["alice"], mine_id)
            assert {h["taskId"] for h in heard} == {mine_id}
            assert heard[-1]["status"] == "completed"
            assert heard[-1]["result"]["content"][0]["text"] == "deleted a"
            # Mallory's own task ends after Alice's: anything of Alice's routed to her would have come first.
            await answer_parked(mallory, gw, theirs_id)
            assert {h["taskId"] for h in await task_ids_heard_until_done(streams["mallory"], theirs_id)} == {
                theirs_id}
        finally:
            for reader in readers:
                reader.cancel()
            await asyncio.gather(*readers, return_exceptions=True)
