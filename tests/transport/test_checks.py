"""What every request meets first, without a transport in front: the credential and the Host/Origin guard."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from aiohttp.test_utils import make_mocked_request
from pytest_aiohttp import AiohttpClient

from satgate_mcp.app import create_app
from satgate_mcp.auth.base import Identity, NoAuthenticator, StaticTokenAuthenticator
from satgate_mcp.events import RecordingPublisher
from satgate_mcp.metrics import Metrics
from satgate_mcp.settings import Settings
from satgate_mcp.transport.checks import Principal
from satgate_mcp.transport.rules import Refusal
from tests.fakes import FakePool
from tests.transport.pieces import make_pieces


async def test_a_refused_credential_is_counted_and_answered_401() -> None:
    metrics = Metrics()
    checks = make_pieces(FakePool(), authenticator=StaticTokenAuthenticator("s3cret"), metrics=metrics).checks
    refused = await checks.principal(make_mocked_request("POST", "/mcp", headers={"Authorization": "Bearer wrong"}))
    assert isinstance(refused, Refusal)
    assert (refused.status, refused.error) == (401, "invalid_token")
    assert metrics.registry.get_sample_value("satgate_refusals_total", {"reason": "invalid"}) == 1
    accepted = await checks.principal(make_mocked_request("POST", "/mcp", headers={"Authorization": "Bearer s3cret"}))
    assert accepted == Principal("s3cret", Identity(token_id="static"))


async def test_the_host_and_origin_guard_decides_each_pair_of_values_on_its_own() -> None:
    """Verdicts are kept per (Host, Origin): a pair seen before never lets another pair through."""
    checks = make_pieces(FakePool()).checks

    def verdict(host: str, origin: str | None = None) -> str | None:
        headers = {"Host": host, **({"Origin": origin} if origin is not None else {})}
        refusal = checks.check_host_origin(make_mocked_request("POST", "/mcp", headers=headers))
        return None if refusal is None else refusal.error

    for _ in range(2):
        assert verdict("127.0.0.1:8080") is None
        assert verdict("127.0.0.1:8080", "http://localhost:3000") is None
        assert verdict("127.0.0.1:8080", "https://evil.example") == "origin_not_allowed"
        assert verdict("evil.example:8080") == "host_not_allowed"
        assert verdict("evil.example:8080", "http://localhost:3000") == "host_not_allowed"


async def test_attack_a_body_trickled_slower_than_the_read_timeout_is_answered_408(
        aiohttp_client: AiohttpClient) -> None:
    app = create_app(Settings(state_dir="memory", read_timeout=0.2), authenticator=NoAuthenticator(),
                     pool=FakePool(), publisher=RecordingPublisher())
    client = await aiohttp_client(app)
    release = asyncio.Event()

    async def trickle() -> AsyncIterator[bytes]:
        yield b'{"jsonrpc":"2.0",'
        await release.wait()  # the rest never comes while the gateway waits
        yield b'"id":1,"method":"ping"}'

    answer = await client.post("/mcp", data=trickle(), headers={"Content-Type": "application/json",
                                                                 "Accept": "application/json, text/event-stream"})
    release.set()
    assert answer.status == 408
    assert (await answer.json())["error"]["data"]["error"] == "read_timeout"
    assert answer.headers.get("Connection") == "close"
