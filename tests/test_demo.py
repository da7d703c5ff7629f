"""The demo upstream the README's quick start runs: a real stdio MCP server with no dependencies."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from satgate_mcp import demo


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        pytest.param({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                      "params": {"name": "add", "arguments": {"a": 2, "b": 3}}}, "5.0", id="add"),
        pytest.param({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
                      "params": {"name": "echo", "arguments": {"text": "hi"}}}, "hi", id="echo"),
    ],
)
def test_tools_answer(message: dict[str, object], expected: str) -> None:
    reply = demo.handle(message)
    assert reply is not None
    assert reply["result"]["content"][0]["text"] == expected


@pytest.mark.parametrize(
    ("message", "code"),
    [
        pytest.param({"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": "nope"}}, -32602,
                     id="unknown-tool"),
        pytest.param({"jsonrpc": "2.0", "id": 4, "method": "resources/list"}, -32601, id="unknown-method"),
    ],
)
def test_errors_are_json_rpc(message: dict[str, object], code: int) -> None:
    reply = demo.handle(message)
    assert reply is not None
    assert reply["error"]["code"] == code


def test_notifications_get_no_answer() -> None:
    assert demo.handle({"jsonrpc": "2.0", "method": "notifications/initialized"}) is None


@pytest.mark.process
def test_runs_as_a_stdio_child() -> None:
    lines = [json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}}), "not json",
             json.dumps({"jsonrpc": "2.0", "id": 2, "method": "tools/list"})]
    out = subprocess.run([sys.executable, "-m", "satgate_mcp.demo"], input="\n".join(lines) + "\n",
                         capture_output=True, text=True, timeout=30, check=True).stdout.splitlines()
    replies = [json.loads(line) for line in out]
    assert [r["id"] for r in replies] == [1, 2]
    assert replies[0]["result"]["serverInfo"]["name"] == "satgate-demo"
    assert {t["name"] for t in replies[1]["result"]["tools"]} == {"echo", "add", "utc_now"}
