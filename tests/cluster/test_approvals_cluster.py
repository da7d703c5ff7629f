"""Approval holds across processes (issue 27 §4), with the real ``satgate-mcp approvals`` command: a held call
approved once runs once, even when 20 identical copies race over two gateways on one Redis (the upstream's
ledger shows one payment); a copy with changed arguments is another call that the approval does not cover; a
second decision is refused and names the first; a call kept waiting (``wait``) goes through the moment the
operator approves it on another machine."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Callable
from pathlib import Path

import httpx2
import pytest

from satgate_mcp.policy.controls import parse_controls
from tests.cluster.cluster import Cluster, Mcp, shared_redis_url, unique
from tests.conftest import upstream_command
from tests.gateway_process import REPO, GatewayProcess

pytestmark = pytest.mark.process

TEST_TIMEOUT = 90.0
HELD = {"approvals": [{"tools": ["pay"], "field": "amount", "above": "50"}]}


def pay(amount: object, vendor: str = "acme") -> dict[str, object]:
    return {"name": "pay", "arguments": {"amount": amount, "vendor": vendor}}


async def approvals(gw: GatewayProcess, *args: str) -> tuple[int, str, str]:
    """``satgate-mcp approvals ...`` as the operator runs it: exit code, stdout, stderr."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "satgate_mcp", "approvals", *args, cwd=REPO, env=gw.cli_env,
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_an_approval_runs_the_identical_call_once_over_two_gateways(
        make_cluster: Callable[..., Cluster], http: httpx2.AsyncClient, tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.jsonl"
    upstreams = {"p": {"transport": "stdio", "command": upstream_command("--payments", "--ledger", str(ledger))}}
    cluster = make_cluster(await shared_redis_url(), SATGATE_UPSTREAMS=json.dumps(upstreams))
    async with asyncio.timeout(TEST_TIMEOUT):
        a, b = await cluster.started(2)
        client = Mcp.mint(http, unique("payer"), controls=parse_controls(json.dumps(HELD)))
        sessions = {a.port: await client.initialize(a), b.port: await client.initialize(b)}
        held = await client.rpc(a, sessions[a.port], 1, "tools/call", pay(60))
        assert held.outcome == "approval_required"
        approval_id = held.body["error"]["data"]["approval_id"]
        assert "repeat this identical call" in held.body["error"]["message"]
        # The repeat on the other machine finds the same pending approval.
        again = await client.rpc(b, sessions[b.port], 2, "tools/call", pay(60))
        assert again.body["error"]["data"]["approval_id"] == approval_id
        code, listed, _ = await approvals(a, "list", "--json")
        assert code == 0
        [row] = [json.loads(line) for line in listed.splitlines()]
        assert (row["id"], row["state"], row["tool"], row["reason"]) == (approval_id, "pending", "pay",
                                                                         "amount above 50")
        code, out, _ = await approvals(b, "approve", approval_id, "--by", "alice")
        assert code == 0, out
        assert approval_id in out
        # A copy with other arguments is another call: held, not run.
        changed = await client.rpc(a, sessions[a.port], 3, "tools/call", pay(60, "globex"))
        assert changed.outcome == "approval_required"
        assert changed.body["error"]["data"]["approval_id"] != approval_id
        copies = await asyncio.gather(*(client.rpc(gw, sessions[gw.port], 10 + i, "tools/call", pay(60))
                                        for i, gw in enumerate([a, b] * 10)))
        outcomes = [copy.outcome for copy in copies]
        assert outcomes.count("served") == 1, outcomes
        assert outcomes.count("approval_required") == 19, outcomes
        code, _, err = await approvals(a, "deny", approval_id, "--reason", "too late")
        assert code == 1
        assert "already approved by alice" in err
    assert [json.loads(line) for line in ledger.read_text().splitlines()] == [{"amount": 60, "vendor": "acme"}]


async def test_a_waiting_call_goes_through_when_approved_on_another_machine(
        make_cluster: Callable[..., Cluster], http: httpx2.AsyncClient, tmp_path: Path) -> None:
    upstreams = {"p": {"transport": "stdio", "command": upstream_command("--payments")}}
    cluster = make_cluster(await shared_redis_url(), SATGATE_UPSTREAMS=json.dumps(upstreams))
    waiting = {"approvals": [{"tools": ["pay"], "wait": 30}]}
    async with asyncio.timeout(TEST_TIMEOUT):
        a, b = await cluster.started(2)
        client = Mcp.mint(http, unique("waiter"), controls=parse_controls(json.dumps(waiting)))
        session = await client.initialize(a)
        call = asyncio.create_task(client.rpc(a, session, 1, "tools/call", pay(5)))
        while True:  # the held call is recorded before it waits: the operator finds it
            code, listed, _ = await approvals(b, "list", "--json")
            if listed.strip():
                break
        [row] = [json.loads(line) for line in listed.splitlines()]
        assert not call.done()
        code, _, err = await approvals(b, "approve", row["id"])
        assert code == 0, err
        answer = await call
    assert answer.outcome == "served", answer.body
    assert answer.body["result"]["content"][0]["text"] == "paid 5 to acme"
