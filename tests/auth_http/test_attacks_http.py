"""The unauthenticated attacks of issue 9 (holes 1 and 7) against the real app over real HTTP.

Each crafted credential or header used to block the event loop for seconds or answer 500 with a
traceback; each must now get a quick 4xx with a JSON-RPC error body, and /healthz keeps answering.
Requests go over a raw socket where the attack is bytes no HTTP client library would send.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient
from pydantic import SecretStr
from pymacaroons import Macaroon
from pymacaroons.macaroon import MACAROON_V2
from pytest_aiohttp import AiohttpClient

from satgate_mcp.app import create_app
from satgate_mcp.auth.macaroons import mint_token
from satgate_mcp.events import RecordingPublisher
from satgate_mcp.settings import Settings
from tests.fakes import AllowAllPolicy, FakePool
from tests.raw_http import raw_post

KEY = "http-attack-tests-root-key-0123456789abcdef"
ATTACKER_KEY = "an-attackers-own-root-key-0123456789abcdef"
STATIC = "static-token-for-the-attack-tests"
#: The audit's predicate; on the old code one request with it blocked the event loop for 3.4 s.
BACKTRACKING_PREDICATE = "tools =" + " " * 1600 + "\nx\ny"
#: Wall-clock guard for something that used to take seconds per request; generous on a busy machine.
QUICK = 1.5

Client = TestClient[web.Request, web.Application]


def macaroon(identifier: str | bytes, *predicates: str, key: str = ATTACKER_KEY) -> str:
    mac = Macaroon(location="x", identifier=identifier, key=key.encode(), version=MACAROON_V2)
    for predicate in predicates:
        mac.add_first_party_caveat(predicate)
    return str(mac.serialize())


def holder_narrowed(predicate: str) -> str:
    mac = Macaroon.deserialize(mint_token(KEY, "tok-holder"))
    mac.add_first_party_caveat(predicate)
    return str(mac.serialize())


MODES: dict[str, dict[str, Any]] = {
    "header": {"auth_mode": "header", "root_key": SecretStr(KEY)},
    "config": {"auth_mode": "config", "static_token": SecretStr(STATIC)},
    "none": {"auth_mode": "none"},
}

StartGateway = Callable[[str], Awaitable[Client]]


@pytest.fixture
def start(aiohttp_client: AiohttpClient) -> StartGateway:
    async def make(mode: str) -> Client:
        app = create_app(Settings(**MODES[mode]), pool=FakePool(), policy=AllowAllPolicy(),
                         publisher=RecordingPublisher())
        return await aiohttp_client(app)

    return make


def bearer(token: str) -> bytes:
    return b"Authorization: Bearer " + token.encode() + b"\r\n"


# --- hole 1 --------------------------------------------------------------------------------------


async def test_attack_backtracking_caveat_gets_401_fast_and_healthz_stays_responsive(start: StartGateway) -> None:
    client = await start("header")
    token = macaroon('{"v":1,"token_id":"x"}', BACKTRACKING_PREDICATE)
    started = time.monotonic()
    attacks = [asyncio.create_task(raw_post(client, bearer(token))) for _ in range(4)]
    health = await client.get("/healthz")
    health_seconds = time.monotonic() - started
    answers = await asyncio.gather(*attacks)
    assert health.status == 200
    assert health_seconds < QUICK
    assert time.monotonic() - started < QUICK
    for answer in answers:
        assert answer.status == 401
        assert answer.json_rpc_error() == "invalid_token"


async def test_attack_backtracking_caveat_on_a_genuine_token_gets_401_fast(start: StartGateway) -> None:
    """A holder may append any caveat without the key; this one is refused on its control characters."""
    client = await start("header")
    started = time.monotonic()
    answer = await raw_post(client, bearer(holder_narrowed(BACKTRACKING_PREDICATE)))
    assert time.monotonic() - started < QUICK
    assert answer.status == 401
    assert answer.json_rpc_error() == "invalid_token"


# --- hole 7 --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("mode", "headers", "status", "error"),
    [
        pytest.param("header", bearer(holder_narrowed("depth <= ²")), 401, "invalid_token", id="depth-superscript"),
        pytest.param("header", bearer(macaroon(b"[" * 3000)), 401, "invalid_token",
                     id="3000-brackets-attacker-key"),
        pytest.param("header", bearer(macaroon(b"[" * 3000, key=KEY)), 401, "invalid_token",
                     id="3000-brackets-gateway-key"),
        pytest.param("header", b"Authorization: Bearer \xff\xfe\r\n", 401, "invalid_token", id="raw-bytes-header"),
        pytest.param("config", b"Authorization: Bearer \xff\xfe\r\n", 401, "invalid_token", id="raw-bytes-config"),
        pytest.param("none", b"Authorization: Bearer \xff\xfe\r\n", 401, "invalid_token", id="raw-bytes-none"),
        pytest.param("header", b"Origin: http://[::1\r\n", 403, "origin_not_allowed", id="unclosed-ipv6-header"),
        pytest.param("config", b"Origin: http://[::1\r\n", 403, "origin_not_allowed", id="unclosed-ipv6-config"),
        pytest.param("none", b"Origin: http://[::1\r\n", 403, "origin_not_allowed", id="unclosed-ipv6-none"),
        pytest.param("none", b"Origin: http://[::1]:99999\r\n", 403, "origin_not_allowed", id="port-out-of-range"),
        pytest.param("none", b"Origin: http://\xff\xfe\r\n", 403, "origin_not_allowed", id="origin-raw-bytes"),
    ],
)
async def test_attack_crafted_credential_or_header_gets_4xx_not_500(
        start: StartGateway, mode: str, headers: bytes, status: int, error: str) -> None:
    client = await start(mode)
    answer = await raw_post(client, headers)
    assert answer.status == status, answer
    assert answer.json_rpc_error() == error
    assert (await client.get("/healthz")).status == 200


@pytest.mark.parametrize("host", [b"[::1", b"[::1]x", b"localhost:\xff", b"\xff\xfe"])
async def test_attack_malformed_host_gets_421_not_500(start: StartGateway, host: bytes) -> None:
    client = await start("none")
    answer = await raw_post(client, b"", host=host)
    assert answer.status == 421, answer
    assert answer.json_rpc_error() == "host_not_allowed"


async def test_a_loopback_ipv6_origin_still_passes(start: StartGateway) -> None:
    client = await start("none")
    answer = await raw_post(client, b"Origin: http://[::1]:9100\r\n")
    assert answer.status == 200, answer
