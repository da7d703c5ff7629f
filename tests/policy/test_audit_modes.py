"""What one audited call's line keeps of its arguments, as the operator chose (``SATGATE_AUDIT_ARGS``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import pytest

from satgate_mcp import jsonrpc
from satgate_mcp.auth.base import Identity
from satgate_mcp.jsonrpc import JsonObj
from satgate_mcp.policy.audit import ArgsMode, args_digest
from satgate_mcp.policy.audit_trail import Auditor

ARGUMENTS = {"text": "secret-ish", "n": 2}


class Sink:
    healthy = True
    full = False

    def __init__(self) -> None:
        self.records: list[Mapping[str, Any]] = []
        self.wall_clock: Callable[[], float] = lambda: 1_700_000_000.25

    def submit(self, record: Mapping[str, Any]) -> bool:
        self.records.append(record)
        return True


@pytest.mark.parametrize(("mode", "method", "kept"), [
    ("digest", "tools/call", {"args_sha256": args_digest(ARGUMENTS)}),
    ("full", "tools/call", {"args": ARGUMENTS}),
    ("none", "tools/call", {}),
    ("digest", "prompts/get", {"args_sha256": args_digest(ARGUMENTS)}),
    ("full", "resources/read", {}),  # a read has no arguments to keep
])
async def test_a_lines_arguments_are_kept_as_the_operator_chose(mode: ArgsMode, method: str,
                                                                kept: dict[str, Any]) -> None:
    sink = Sink()
    auditor = Auditor(sink, args=mode, cost_of=lambda tool: 2.0)
    param = "uri" if method == "resources/read" else "name"
    request = jsonrpc.Request(id=7, method=method, params={param: "echo", "arguments": ARGUMENTS})

    async def run() -> JsonObj:
        return jsonrpc.result_response(7, {"content": []})

    await auditor.around(request, Identity(token_id="ada", tenant="t1"), "s-1", None, lambda m, t: "up", run)
    [record] = sink.records
    assert {k: v for k, v in record.items() if k.startswith("args")} == kept
    assert record["ts"] == "2023-11-14T22:13:20.250Z"
    assert (record["token_id"], record["tenant"], record["session"], record["outcome"]) == ("ada", "t1", "s-1", "ok")
    assert record["cost"] == (2.0 if method == "tools/call" else None)
    assert list(record)[-2:] == ["duration_ms", "cost"]
