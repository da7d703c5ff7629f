"""A dual-revision upstream (the official SDK's default shape) behind a real gateway (issue 25).

With the default ``"protocol": "auto"`` each client meets the upstream in its own era: a 2025 SDK session on the
upstream's 2025 session, a 2026-07-28 SDK client statelessly, with its own capabilities in ``_meta`` and the
upstream's ``input_required`` as the upstream wrote it (its keys kept, its state sealed in the gateway's).
The upstream over stdio and over Streamable HTTP.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import mcp_types as types
import pytest

from tests.gateway_process import GatewayProcess
from tests.integration.front import gateway_in_front
from tests.integration.test_modern_upstream import META, _call, _json_of, _post, legacy_client
from tests.integration.test_mrtr_sdk import mint, modern_client, text_of

pytestmark = pytest.mark.process

ROOT_KEY = "e2e-dual-upstream-root-key-0123456789abcdef"


@pytest.fixture(params=["stdio", "http"])
async def gateway(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[GatewayProcess]:
    async with gateway_in_front(tmp_path, root_key=ROOT_KEY, name="m", transport=request.param,
                                args=("--name", "m", "--era", "both")) as gw:
        yield gw


async def test_each_client_reaches_the_upstream_in_its_own_era(gateway: GatewayProcess) -> None:
    token = await mint(gateway, "both-eras")

    async def elicit(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        return types.ElicitResult(action="accept", content={"answer": "blue"})

    async with modern_client(gateway, token, elicitation_callback=elicit) as client:
        modern = json.loads(await text_of(client.call_tool("seen_era", {})))
        asked = json.loads(await text_of(client.call_tool("mrtr_ask", {"question": "colour?"})))
    async with legacy_client(gateway, token) as session:
        legacy = json.loads(await text_of(session.call_tool("seen_era", {})))
    assert modern["protocolVersion"] == "2026-07-28"
    assert "elicitation" in modern["capabilities"]  # the client's own declaration, not the gateway's
    assert "sampling" not in modern["capabilities"]
    assert asked == {"action": "accept", "content": {"answer": "blue"}}
    assert legacy["protocolVersion"] == "2025-11-25"


async def test_the_upstreams_input_required_reaches_a_2026_client_as_written(gateway: GatewayProcess) -> None:
    token = await mint(gateway, "raw-modern")
    first = _json_of(await _post(gateway, token, _call(1)))["result"]
    assert list(first["inputRequests"]) == ["ask"]
    assert "upstream-state" not in first["requestState"]  # sealed in the gateway's
    answer = {"ask": {"action": "accept", "content": {"answer": "mine"}}}
    done = _json_of(await _post(gateway, token, _call(2, inputResponses=answer, requestState=first["requestState"])))
    assert json.loads(done["result"]["content"][0]["text"]) == answer["ask"]
    seen = {"jsonrpc": "2.0", "id": 3, "method": "tools/call",
            "params": {"_meta": {**META, "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"},
                       "name": "seen_meta", "arguments": {}}}
    meta = json.loads(_json_of(await _post(gateway, token, seen))["result"]["content"][0]["text"])
    assert meta["traceparent"].startswith("00-0af7")  # trace context passes through
    assert meta["io.modelcontextprotocol/clientCapabilities"] == {"elicitation": {}}
