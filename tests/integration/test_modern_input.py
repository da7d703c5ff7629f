"""A 2026 client's ``inputResponses`` that continue nothing (no ``requestState``), through a real gateway.

The spec lets a client send answers with a call the server never asked (it should use what it recognises and
ignore the rest) and lets a server without state ask without a ``requestState``. So answers without a state are
a new call, never a refused retry: a 2026-era upstream gets them as they are and may complete at once; a
2025-era upstream has no use for them (they are not sent) and asks its question, which the gateway puts to
the client as usual. Malformed answers are the gateway's -32602. A client may take longer to answer than the
upstream's whole timeout: each round is bounded by it, not the flow.

The upstream is tests/upstream_server.py ``--conformance`` over stdio, which serves both eras: the gateway is
told which one to speak (``"protocol"``), so both paths run against the same tool
(``test_input_required_result_elicitation``: "What is your name?" under the key ``user_name``).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx2
import pytest

from tests.conftest import upstream_command
from tests.gateway_process import GatewayProcess
from tests.integration.test_mrtr_sdk import mint

pytestmark = pytest.mark.process

ROOT_KEY = "e2e-modern-input-root-key-0123456789abcdefghij"
MODERN = "2026-07-28"
TOOL = "test_input_required_result_elicitation"
META = {"io.modelcontextprotocol/protocolVersion": MODERN,
        "io.modelcontextprotocol/clientCapabilities": {"elicitation": {}}}
ALICE = {"action": "accept", "content": {"name": "Alice"}}
UNASKED = {"user_name": ALICE, "unknown_extra_key": {"action": "accept", "content": {"foo": "bar"}}}


@pytest.fixture(params=["2026", "2025"])
async def gateway(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[GatewayProcess]:
    spec = {"transport": "stdio", "command": upstream_command("--conformance"), "protocol": request.param}
    gw = GatewayProcess(tmp_path, root_key=ROOT_KEY, settings={"SATGATE_UPSTREAMS": json.dumps({"c": spec})})
    gw.start()
    await gw.wait_ready()
    yield gw
    await gw.kill()


async def call(gw: GatewayProcess, token: str, request_id: int, **extra: Any) -> tuple[int, Any]:
    body = {"jsonrpc": "2.0", "id": request_id, "method": "tools/call",
            "params": {"_meta": META, "name": TOOL, "arguments": {}, **extra}}
    headers = {"Authorization": f"Bearer {token}", "Accept": "application/json",
               "MCP-Protocol-Version": MODERN, "Mcp-Method": "tools/call", "Mcp-Name": TOOL}
    async with httpx2.AsyncClient(trust_env=False, timeout=15.0) as http:
        answer = await http.post(f"{gw.url}/mcp", json=body, headers=headers)
    return answer.status_code, answer.json()


async def test_answers_without_a_state_are_a_new_call_never_a_refused_retry(gateway: GatewayProcess) -> None:
    """A 2026 upstream reads its own key and ignores the other; a 2025 upstream's question takes the one answer
    that fits it (the other does not satisfy its form): either way the call completes in one round."""
    token = await mint(gateway, "unasked")
    status, first = await call(gateway, token, 1, inputResponses=UNASKED)
    assert status == 200
    result = first["result"]
    assert result.get("resultType", "complete") == "complete", result
    assert result["content"][0]["text"] == "Hello, Alice!"


async def test_answers_that_do_not_answer_are_asked_for_again(gateway: GatewayProcess) -> None:
    """Under a key the 2026 upstream does not know, or not fitting the 2025 upstream's form: asked again."""
    token = await mint(gateway, "wrong")
    status, again = await call(gateway, token, 1,
                               inputResponses={"wrong_key": {"action": "accept", "content": {"nickname": "Al"}}})
    assert status == 200
    assert again["result"]["resultType"] == "input_required"
    [(key, asked)] = again["result"]["inputRequests"].items()
    assert asked["method"] == "elicitation/create"
    assert asked["params"]["message"] == "What is your name?"
    status, done = await call(gateway, token, 2, inputResponses={key: ALICE},
                              requestState=again["result"]["requestState"])
    assert status == 200
    assert done["result"]["content"][0]["text"] == "Hello, Alice!"


@pytest.mark.parametrize("responses", [None, 12345, ["user_name"]], ids=["null", "number", "list"])
async def test_input_responses_that_are_not_an_object_are_minus_32602(
        gateway: GatewayProcess, responses: object) -> None:
    token = await mint(gateway, "malformed")
    status, refused = await call(gateway, token, 7, inputResponses=responses)
    assert status == 400
    assert refused["id"] == 7
    assert refused["error"]["code"] == -32602
    assert "inputResponses" in refused["error"]["message"]


async def test_a_2026_client_may_answer_later_than_the_upstreams_timeout(tmp_path: Path) -> None:
    """The 2025 upstream's call waits for the answer; its 1 s timeout counts only its own time in each round."""
    spec = {"transport": "stdio", "command": upstream_command("--conformance"), "protocol": "2025", "timeout": 1.0}
    gw = GatewayProcess(tmp_path, root_key=ROOT_KEY, settings={"SATGATE_UPSTREAMS": json.dumps({"c": spec})})
    gw.start()
    try:
        await gw.wait_ready()
        token = await mint(gw, "slow-thinker")
        status, first = await call(gw, token, 1)
        assert (status, first["result"]["resultType"]) == (200, "input_required")
        [key] = first["result"]["inputRequests"]
        await asyncio.sleep(1.5)  # the person takes longer than the upstream's timeout to fill the form
        state = first["result"]["requestState"]
        status, done = await call(gw, token, 2, inputResponses={key: ALICE}, requestState=state)
        assert status == 200
        assert done["result"]["content"][0]["text"] == "Hello, Alice!"
    finally:
        await gw.kill()


async def test_a_shutdown_with_a_flow_waiting_ends_its_call_before_the_state_store_closes(tmp_path: Path) -> None:
    """The given-up call settles its charge in the state store: the store must still be open when it does."""
    spec = {"transport": "stdio", "command": upstream_command("--conformance"), "protocol": "2025"}
    gw = GatewayProcess(tmp_path, root_key=ROOT_KEY, settings={"SATGATE_UPSTREAMS": json.dumps({"c": spec}),
                                                               "SATGATE_STATE_DIR": str(tmp_path / "state")})
    gw.start()
    try:
        await gw.wait_ready()
        status, first = await call(gw, await mint(gw, "left-waiting"), 1)
        assert (status, first["result"]["resultType"]) == (200, "input_required")
        assert gw.proc is not None
        os.kill(gw.proc.pid, signal.SIGTERM)
        assert await asyncio.to_thread(gw.proc.wait, 20) == 0
        log = gw.log_file.read_text()
        assert "never retrieved" not in log
        assert "is closed" not in log
    finally:
        await gw.kill()
