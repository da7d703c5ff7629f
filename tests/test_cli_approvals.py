"""``satgate-mcp approvals list|approve|deny`` on the state folder a daemon made, as an operator runs them: the
pending call is listed, a decision is taken once (the second names the first, exit 1), an unknown id fails, and
without a shared store the command says why instead of deciding where no daemon reads."""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path

import pytest

from satgate_mcp import cli
from satgate_mcp.policy.approvals import HeldCall, fingerprint, new_id
from satgate_mcp.stores.sqlite import LocalState
from satgate_mcp.stores.sqlite.approvals import SqliteApprovalStore


@pytest.fixture
def held(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A state folder where a daemon held one call of token ``agent-7``; its approval id."""
    for key in list(os.environ):
        if key.startswith("SATGATE_"):
            monkeypatch.delenv(key)
    monkeypatch.setenv("SATGATE_STATE_DIR", str(tmp_path))
    now = time.time()
    record = HeldCall(new_id(), fingerprint("agent-7", "pay", {"amount": 60}), "agent-7", "agent-7", "pay",
                      '{"amount": 60}', "amount above 50", now, now + 900)

    async def hold() -> None:
        state = LocalState.open(tmp_path)
        await SqliteApprovalStore(state.db).hold(record, now, 20)
        await state.aclose()

    asyncio.run(hold())
    return record.id


def test_an_operator_lists_approves_once_and_hears_what_happened_first(
        held: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["approvals", "list", "--json"]) == 0
    [row] = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert (row["id"], row["state"], row["token_id"], row["reason"]) == (held, "pending", "agent-7", "amount above 50")
    assert cli.main(["approvals", "approve", held, "--by", "alice"]) == 0
    out = capsys.readouterr()
    assert f"approved {held}" in out.out
    assert json.loads(out.err.splitlines()[-1])["event"] == "approval_decided"
    assert cli.main(["approvals", "deny", held, "--reason", "no"]) == 1
    assert "already approved by alice" in capsys.readouterr().err
    assert cli.main(["approvals", "list"]) == 0
    assert "no held calls pending" in capsys.readouterr().err
    assert cli.main(["approvals", "approve", "apr_nothing"]) == 1
    assert "no held call apr_nothing" in capsys.readouterr().err


def test_without_a_shared_store_the_command_says_why(monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    for key in list(os.environ):
        if key.startswith("SATGATE_"):
            monkeypatch.delenv(key)
    monkeypatch.setenv("SATGATE_STATE_DIR", "memory")
    assert cli.main(["approvals", "list"]) == 2
    assert "no approval store: SATGATE_STATE_DIR=memory keeps held calls in each daemon's memory" in \
        capsys.readouterr().err
