"""The issuer's keys: fetched once, shared by concurrent tokens, refetched on rotation no faster than allowed.

A real authorization server (tests/oauth_server.py) serves the JWKS; the key source's clock is a FakeClock,
so "2 seconds later" is a line of the test, not a wait.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from satgate_mcp.auth.oauth_keys import KEYS_MAX_AGE, REFETCH_INTERVAL, KeySource, parse_jwks
from tests.fakes import FakeClock
from tests.oauth_server import AuthServer


@pytest.fixture
async def idp() -> AsyncIterator[AuthServer]:
    async with AuthServer() as server:
        yield server


@pytest.fixture
async def clock() -> FakeClock:
    return FakeClock(100.0)


@pytest.fixture
async def keys(idp: AuthServer, clock: FakeClock) -> AsyncIterator[KeySource]:
    source = KeySource(idp.issuer, clock=clock)
    yield source
    await source.aclose()


async def test_concurrent_first_tokens_share_one_fetch(idp: AuthServer, keys: KeySource) -> None:
    kid = idp.add_key("RS256")
    found = await asyncio.gather(*(keys.key_for(kid, "RS256") for _ in range(50)))
    assert all(k is not None for k in found)
    assert idp.jwks_fetches == 1


async def test_an_unknown_kid_refetches_at_once_then_not_again_within_the_interval(
        idp: AuthServer, keys: KeySource, clock: FakeClock) -> None:
    assert await keys.key_for(idp.add_key("RS256", kid="a"), "RS256") is not None
    assert await keys.key_for("b", "RS256") is None  # not published yet: one refetch
    assert idp.jwks_fetches == 2
    idp.add_key("RS256", kid="b")
    clock.now += REFETCH_INTERVAL / 2
    assert await keys.key_for("b", "RS256") is None  # published, but a refetch now would be too soon
    assert idp.jwks_fetches == 2
    clock.now += REFETCH_INTERVAL / 2
    assert await keys.key_for("b", "RS256") is not None  # "b" was never remembered as absent
    assert idp.jwks_fetches == 3


async def test_keys_past_their_age_are_refreshed_in_the_background_while_they_still_verify(
        idp: AuthServer, keys: KeySource, clock: FakeClock) -> None:
    kid = idp.add_key("ES256")
    assert await keys.key_for(kid, "ES256") is not None
    idp.jwks_delay = 0.2
    clock.now += KEYS_MAX_AGE
    assert await keys.key_for(kid, "ES256") is not None  # answered from the keys held, without waiting
    assert idp.jwks_fetches == 1
    await keys.aclose()  # cancels the refresh still waiting on the slow issuer


async def test_a_failed_fetch_keeps_the_keys_held_and_an_outage_is_not_hammered(
        idp: AuthServer, keys: KeySource, clock: FakeClock) -> None:
    kid = idp.add_key("RS256")
    assert await keys.key_for(kid, "RS256") is not None
    idp.jwks_status = 500
    clock.now += REFETCH_INTERVAL
    assert await keys.key_for("unknown", "RS256") is None
    assert await keys.key_for(kid, "RS256") is not None
    for _ in range(10):
        await keys.key_for("unknown", "RS256")
    assert idp.jwks_fetches == 2


async def test_without_a_kid_only_a_single_fitting_key_is_used(idp: AuthServer, keys: KeySource) -> None:
    idp.add_key("RS256")
    assert await keys.key_for(None, "RS256") is not None
    assert await keys.key_for(None, "ES256") is None  # no EC key: nothing fits
    idp.add_key("RS256")
    await keys.aclose()
    fresh = KeySource(idp.issuer)
    try:
        assert await fresh.key_for(None, "RS256") is None  # two RSA keys: ambiguous, refused
    finally:
        await fresh.aclose()


def test_a_key_set_keeps_only_asymmetric_signing_keys() -> None:
    document = {"keys": [
        {"kty": "oct", "k": "c2VjcmV0", "kid": "hmac"},
        {"kty": "RSA", "use": "enc", "kid": "enc", "n": "AQAB", "e": "AQAB"},
        {"kty": "RSA", "alg": "HS256", "kid": "lying", "n": "AQAB", "e": "AQAB"},
        {"kty": "EC", "kid": "broken", "crv": "P-256", "x": "AA", "y": "AA"},
        "not a key",
    ]}
    parsed = parse_jwks(document, 0.0)
    assert parsed.keys == {}
    assert parsed.anonymous == []
