"""The audit trail through the real app (SATGATE_AUDIT_FILE): every call and refusal is one chained line, the chain
survives a restart and a rotation under load, no secret is ever written, and a trail that cannot record refuses
the call (closed) or counts the loss (open)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient
from pydantic import SecretStr
from pytest_aiohttp import AiohttpClient

from satgate_mcp import jsonrpc
from satgate_mcp.app import create_app
from satgate_mcp.auth.base import Identity
from satgate_mcp.auth.macaroons import mint_token
from satgate_mcp.cli import main
from satgate_mcp.keys import AUDIT
from satgate_mcp.metrics import Metrics
from satgate_mcp.policy.audit import line_hash, seal, verify
from satgate_mcp.policy.audit_trail import Auditor
from satgate_mcp.settings import Settings
from tests.answers import decode_answer
from tests.fakes import FakePool

ROOT_KEY = "audit-trail-tests-root-key-0123456789abcdef"
VERSION = "2025-11-25"
Client = TestClient[web.Request, web.Application]


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


async def gateway(aiohttp_client: AiohttpClient, trail: Path | str, pool: FakePool | None = None,
                  metrics: Metrics | None = None, **settings: Any) -> Client:
    chosen = Settings(auth_mode="header", root_key=SecretStr(ROOT_KEY), audit_file=str(trail), **settings)
    return await aiohttp_client(create_app(chosen, pool=pool or FakePool(), metrics=metrics))


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}", "Content-Type": "application/json",
            "Accept": "application/json, text/event-stream", "MCP-Protocol-Version": VERSION}


async def session(client: Client, token: str) -> str:
    resp = await client.post("/mcp", headers=bearer(token), data=json.dumps(jsonrpc.request_message(
        0, "initialize", {"protocolVersion": VERSION, "capabilities": {}, "clientInfo": {"name": "auditor-test",
                                                                                         "version": "7"}})))
    assert resp.status == 200
    return resp.headers["Mcp-Session-Id"]


async def call(client: Client, token: str, sid: str, request_id: int, tool: str, **args: Any) -> tuple[int, Any]:
    resp = await client.post("/mcp", headers={**bearer(token), "Mcp-Session-Id": sid}, data=json.dumps(
        jsonrpc.request_message(request_id, "tools/call", {"name": tool, "arguments": args})))
    return resp.status, decode_answer(resp.content_type, await resp.read())


async def written(client: Client) -> None:
    """Everything submitted so far is written (the scheduled write, done now; nothing to poll)."""
    client.app[AUDIT].flush()


async def test_every_call_and_refusal_is_one_chained_line_and_no_secret_is_written(
        aiohttp_client: AiohttpClient, tmp_path: Path) -> None:
    trail = tmp_path / "audit.jsonl"
    client = await gateway(aiohttp_client, trail)
    token = mint_token(ROOT_KEY, "alice", tools=["echo"])
    sid = await session(client, token)
    assert (await call(client, token, sid, 1, "echo", text="hello"))[0] == 200
    refused = await call(client, token, sid, 2, "secret_tool")
    assert refused[1]["error"]["data"]["error"] == "tool_not_allowed"
    forged = token[:-4] + ("AAAA" if not token.endswith("AAAA") else "BBBB")
    assert (await client.post("/mcp", headers={**bearer(forged), "Mcp-Session-Id": sid}, data=json.dumps(
        jsonrpc.request_message(3, "tools/call", {"name": "echo", "arguments": {}})))).status == 401
    await written(client)
    served, denied, auth = lines(trail)
    assert served["event"] == "tool_call"
    assert (served["token_id"], served["tool"], served["upstream"]) == ("alice", "echo", "fake")
    assert served["outcome"] == "ok"
    assert served["client"]["name"] == "auditor-test"
    assert served["session"] == sid
    assert len(served["args_sha256"]) == 64
    assert (denied["decision"], denied["outcome"], denied["reason"], denied["code"]) == (
        "deny", "refused", "tool_not_allowed", jsonrpc.TOOL_NOT_ALLOWED)
    assert (auth["event"], auth["outcome"]) == ("auth_refused", "refused")
    assert verify([(str(trail), trail.read_text().splitlines())]) == (3, None)
    text = trail.read_text()
    assert token not in text
    assert forged not in text
    assert ROOT_KEY not in text


async def test_the_chain_continues_across_a_restart(aiohttp_client: AiohttpClient, tmp_path: Path) -> None:
    trail = tmp_path / "audit.jsonl"
    token = mint_token(ROOT_KEY, "bob")
    for round_ in range(2):  # a new app with empty memory each time, on the same file
        client = await gateway(aiohttp_client, trail)
        sid = await session(client, token)
        for n in range(3):
            await call(client, token, sid, n, "echo", text=f"{round_}-{n}")
        await written(client)
        await client.close()
    assert verify([(str(trail), trail.read_text().splitlines())]) == (6, None)
    assert [line["seq"] for line in lines(trail)] == [1, 2, 3, 4, 5, 6]


async def test_attack_a_rotation_under_load_loses_no_line_and_the_chain_spans_both_files(
        aiohttp_client: AiohttpClient, tmp_path: Path) -> None:
    trail, rotated = tmp_path / "audit.jsonl", tmp_path / "audit.jsonl.1"
    client = await gateway(aiohttp_client, trail)
    token = mint_token(ROOT_KEY, "carol")
    sid = await session(client, token)
    first = [call(client, token, sid, n, "echo", text=str(n)) for n in range(40)]
    await asyncio.gather(*first)
    await written(client)
    trail.rename(rotated)  # logrotate's way: the writer notices at its next batch and opens a new file
    await asyncio.gather(*(call(client, token, sid, 100 + n, "echo", text=str(n)) for n in range(40)))
    await written(client)
    old, new = rotated.read_text().splitlines(), trail.read_text().splitlines()
    assert len(old) + len(new) == 80
    assert new
    assert verify([(str(rotated), old), (str(trail), new)]) == (80, None)


async def test_a_disk_that_fails_refuses_calls_in_closed_mode_before_they_reach_the_upstream(
        aiohttp_client: AiohttpClient, tmp_path: Path) -> None:
    trail = tmp_path / "not-a-file"
    trail.mkdir()  # every write fails
    pool = FakePool()
    client = await gateway(aiohttp_client, trail, pool=pool)
    token = mint_token(ROOT_KEY, "dave")
    sid = await session(client, token)
    await call(client, token, sid, 1, "echo", text="first")  # the trail is not known to fail yet
    await written(client)
    reached = len(pool.calls)
    resp = await client.post("/mcp", headers={**bearer(token), "Mcp-Session-Id": sid}, data=json.dumps(
        jsonrpc.request_message(2, "tools/call", {"name": "echo", "arguments": {"text": "second"}})))
    assert resp.status == 503
    assert resp.headers["Retry-After"] == "1"
    assert (await resp.json())["error"]["data"]["error"] == "audit_unavailable"
    assert len(pool.calls) == reached


async def test_a_disk_that_fails_serves_calls_in_open_mode_and_counts_the_lost_lines(
        aiohttp_client: AiohttpClient, tmp_path: Path) -> None:
    trail = tmp_path / "not-a-file"
    trail.mkdir()
    metrics = Metrics()
    client = await gateway(aiohttp_client, trail, metrics=metrics, audit_fail_mode="open")
    token = mint_token(ROOT_KEY, "erin")
    sid = await session(client, token)
    for n in range(3):
        assert (await call(client, token, sid, n, "echo", text=str(n)))[0] == 200
        await written(client)
    assert metrics.audit_dropped._value.get() >= 3


class FullSink:
    """A writer whose queue is full: what a trail that cannot keep up looks like to the auditor."""

    healthy = True
    full = True

    def __init__(self) -> None:
        self.wall_clock: Callable[[], float] = lambda: 0.0
        self.records: list[Mapping[str, Any]] = []

    def submit(self, record: Mapping[str, Any]) -> bool:
        self.records.append(record)
        return False


async def test_a_full_queue_refuses_in_closed_mode_and_serves_in_open_mode() -> None:
    request = jsonrpc.Request(9, "tools/call", {"name": "pay", "arguments": {"amount": "5"}})
    ran: list[int] = []

    async def run() -> dict[str, Any]:
        ran.append(1)
        return jsonrpc.result_response(9, {"content": []})

    answer = await Auditor(FullSink(), fail_closed=True).around(request, Identity("frank"), "s", None,
                                                               lambda m, n: None, run)
    assert answer["error"]["data"] == {"error": "audit_unavailable", "retry_after_seconds": 1}
    assert ran == []
    answer = await Auditor(FullSink(), fail_closed=False).around(request, Identity("frank"), "s", None,
                                                                lambda m, n: None, run)
    assert "result" in answer
    assert ran == [1]


async def test_dash_writes_the_lines_to_stdout_marked_as_audit(aiohttp_client: AiohttpClient,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    client = await gateway(aiohttp_client, "-")
    token = mint_token(ROOT_KEY, "grace")
    sid = await session(client, token)
    await call(client, token, sid, 1, "echo", text="to the SIEM")
    await written(client)
    audit = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith('{"ts"')]
    assert [(line["log"], line["event"], line["token_id"]) for line in audit] == [("audit", "tool_call", "grace")]


def test_audit_verify_exits_0_on_a_whole_trail_and_1_naming_the_first_break(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trail = tmp_path / "audit.jsonl"
    prev, text = "0" * 64, []
    for n in range(5):
        line = seal({"event": "tool_call", "n": n}, n + 1, prev).decode()
        text.append(line)
        prev = line_hash(line)
    trail.write_text("\n".join(text) + "\n")
    assert main(["audit", "verify", str(trail)]) == 0
    del text[2]
    trail.write_text("\n".join(text) + "\n")
    assert main(["audit", "verify", str(trail)]) == 1
    assert f"{trail}:3:" in capsys.readouterr().err
    assert main(["audit", "verify", str(tmp_path / "missing.jsonl")]) == 2


async def test_the_console_reads_the_trail_back_and_records_its_own_actions(aiohttp_client: AiohttpClient,
                                                                             tmp_path: Path) -> None:
    trail = tmp_path / "audit.jsonl"
    client = await gateway(aiohttp_client, trail)
    admin = mint_token(ROOT_KEY, "ops-admin", admin=True)
    token = mint_token(ROOT_KEY, "heidi")
    sid = await session(client, token)
    await call(client, token, sid, 1, "echo", text="x")
    resp = await client.post("/console/api/tokens/revoke", json={"token_id": "heidi"},
                             headers={"Authorization": f"Bearer {admin}"})
    assert resp.status == 200, await resp.text()
    await written(client)
    events = [line["event"] for line in lines(trail)]
    assert events[:1] == ["tool_call"]
    assert "console_action" in events
    audit = await (await client.get("/console/api/policy", headers={"Authorization": f"Bearer {admin}"})).json()
    assert audit["audit"]["chain"]["ok"] is True
    assert audit["audit"]["lines"][0]["event"] == "console_action"
