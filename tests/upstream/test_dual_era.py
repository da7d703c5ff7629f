"""A dual-revision upstream gets each client's request in the client's own era (issue 25).

``"protocol": "auto"`` keeps the handshake for 2025 sessions and, on the first 2026-07-28 request, looks once
for the upstream's 2026 side (over stdio a second child: the SDK locks a pipe to one era; over HTTP a sessionless
connection). Real upstreams (tests/upstream_server.py ``--era``) over stdio and Streamable HTTP.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable

import pytest

from satgate_mcp.events import RecordingPublisher
from satgate_mcp.jsonrpc import JsonObj
from satgate_mcp.metrics import Metrics
from satgate_mcp.settings import HttpUpstreamSpec, StdioUpstreamSpec
from satgate_mcp.upstream.base import Resume, Upstream
from satgate_mcp.upstream.eras import client_era, resource_error_in_era, wants_modern_twin
from satgate_mcp.upstream.http import HttpUpstream
from satgate_mcp.upstream.stdio import StdioUpstream
from tests.conftest import HttpUpstreamProcess, upstream_command
from tests.upstream.test_era import FakeCarrier

MODERN = "2026-07-28"


@pytest.mark.parametrize(("protocol", "primary_modern", "client", "wanted"), [
    pytest.param("auto", False, "2026", True, id="auto-2025-session-2026-client"),
    pytest.param("auto", False, "2025", False, id="auto-2025-client-keeps-the-session"),
    pytest.param("auto", False, None, False, id="the-gateways-own-requests"),
    pytest.param("auto", True, "2026", False, id="auto-already-2026"),
    pytest.param("2025", False, "2026", False, id="pinned-2025-bridges"),
    pytest.param("2026", False, "2026", False, id="2026-that-fell-back-bridges"),
])
def test_who_looks_for_the_2026_side(protocol: str, primary_modern: bool, client: str | None, wanted: bool) -> None:
    assert wants_modern_twin(protocol, primary_modern, client) is wanted  # type: ignore[arg-type]


async def _noop(method: str, params: JsonObj | None) -> None:
    return None


@pytest.fixture(params=["stdio", "http"])
def make_upstream(request: pytest.FixtureRequest,
                  http_upstream_factory: Callable[..., HttpUpstreamProcess]) -> Callable[..., Upstream]:
    def make(*args: str) -> Upstream:
        if request.param == "stdio":
            spec = StdioUpstreamSpec(transport="stdio", command=upstream_command(*args), timeout=10.0)
            return StdioUpstream("dual", spec, publisher=RecordingPublisher(), metrics=Metrics())
        server = http_upstream_factory(*args)
        http_spec = HttpUpstreamSpec(transport="http", url=server.url, timeout=10.0)
        return HttpUpstream("dual", http_spec, publisher=RecordingPublisher(), metrics=Metrics())

    return make


@pytest.fixture
async def dual(make_upstream: Callable[..., Upstream]) -> AsyncIterator[Upstream]:
    upstream = make_upstream("--name", "dual", "--era", "both")
    await upstream.start(_noop)
    try:
        assert await upstream.wait_ready(20)
        yield upstream
    finally:
        await upstream.close()


def _seen(reply: JsonObj) -> JsonObj:
    seen: JsonObj = json.loads(reply["result"]["content"][0]["text"])
    return seen


@pytest.mark.process
async def test_each_client_meets_the_dual_upstream_in_its_own_era(dual: Upstream) -> None:
    call = {"name": "seen_era", "arguments": {}}
    modern = _seen(await dual.request("tools/call", call, on_progress=FakeCarrier(capabilities={"sampling": {}})))
    legacy = _seen(await dual.request("tools/call", call))
    assert dual.modern is False  # the 2025 session stays the gateway's own
    assert modern == {"protocolVersion": MODERN, "capabilities": {"sampling": {}}}
    assert legacy["protocolVersion"] == "2025-11-25"


@pytest.mark.process
async def test_a_dual_upstreams_input_required_reaches_the_2026_client_untouched(dual: Upstream) -> None:
    call = {"name": "mrtr_ask", "arguments": {"question": "q"}}
    carrier = FakeCarrier()
    reply = await dual.request("tools/call", call, on_progress=carrier)
    result = reply["result"]
    assert result["resultType"] == "input_required"
    assert list(result["inputRequests"]) == ["ask"]  # the upstream's own key, not a gateway's
    assert carrier.carried == [("dual", result)]
    answer = {"action": "accept", "content": {"answer": "a"}}
    done = await dual.request("tools/call", call, on_progress=FakeCarrier(Resume("dual", result["requestState"],
                                                                                  {"ask": answer})))
    assert json.loads(done["result"]["content"][0]["text"]) == answer


@pytest.mark.parametrize(("era", "seen"), [
    pytest.param("2025", "2025-11-25", id="2025-only-is-bridged"),
    pytest.param("2026", MODERN, id="2026-only-as-before"),
])
@pytest.mark.process
async def test_a_single_era_upstream_gets_a_2026_client_in_the_era_it_has(
        make_upstream: Callable[..., Upstream], era: str, seen: str) -> None:
    upstream = make_upstream("--name", "single", "--era", era)
    await upstream.start(_noop)
    call = {"name": "seen_era", "arguments": {}}
    try:
        assert await upstream.wait_ready(20)
        first = _seen(await upstream.request("tools/call", call, on_progress=FakeCarrier()))
        again = _seen(await upstream.request("tools/call", call, on_progress=FakeCarrier()))
    finally:
        await upstream.close()
    assert first["protocolVersion"] == again["protocolVersion"] == seen


NOT_FOUND_2025 = {"error": {"code": -32002, "message": "Resource not found", "data": {"uri": "memo://x"}}}
NOT_FOUND_2026 = {"error": {"code": -32602, "message": "Resource not found", "data": {"uri": "memo://x"}}}
BARE_2026 = {"error": {"code": -32602, "message": "Resource not found"}}
OTHER = {"error": {"code": -32603, "message": "boom"}}
FOUND: JsonObj = {"result": {"contents": []}}


@pytest.mark.parametrize(("reply", "client", "code", "uri"), [
    pytest.param(NOT_FOUND_2025, "2026", -32602, "memo://x", id="2025-upstream-to-2026-client"),
    pytest.param(BARE_2026, "2026", -32602, "memo://x", id="lost-uri-restored"),
    pytest.param(NOT_FOUND_2026, "2026", -32602, "memo://x", id="2026-as-it-is"),
    pytest.param(NOT_FOUND_2026, "2025", -32002, "memo://x", id="2026-upstream-to-2025-session"),
    pytest.param(NOT_FOUND_2025, "2025", -32002, "memo://x", id="2025-as-it-is"),
    pytest.param(BARE_2026, "2025", -32602, None, id="an-invalid-params-not-naming-the-uri-stays"),
    pytest.param(NOT_FOUND_2025, None, -32002, "memo://x", id="the-gateways-own-request"),
    pytest.param(OTHER, "2026", -32603, None, id="other-errors-stay"),
])
def test_an_unknown_resource_is_worded_in_the_clients_era(reply: JsonObj, client: str | None, code: int,
                                                           uri: str | None) -> None:
    worded = resource_error_in_era(reply, "memo://x", client)  # type: ignore[arg-type]
    assert worded["error"]["code"] == code
    assert worded["error"].get("data", {}).get("uri") == uri
    assert resource_error_in_era(FOUND, "memo://x", client) is FOUND  # type: ignore[arg-type]


@pytest.mark.parametrize(("relay", "era"), [
    pytest.param(FakeCarrier(), "2026", id="a-2026-clients-relay"),
    pytest.param(None, None, id="the-gateway-itself"),
])
def test_whose_era_a_request_is(relay: object, era: str | None) -> None:
    assert client_era(relay) == era
