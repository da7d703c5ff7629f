"""A verified access token is reused for a second, as a macaroon is: the signature is checked once, while
expiry and revocation are still checked on every request (a real authorization server signs the tokens)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from satgate_mcp.auth.base import AuthOutcome
from satgate_mcp.auth.oauth import CLOCK_SKEW_SECONDS, VERIFIED_SECONDS, JwtAuthenticator, OAuthPolicy
from satgate_mcp.stores.memory import MemoryRevocationStore
from tests.fakes import FakeClock
from tests.oauth_server import AuthServer

AUDIENCE = "http://127.0.0.1:9100/mcp"


@pytest.fixture
async def idp() -> AsyncIterator[AuthServer]:
    async with AuthServer() as server:
        server.default_audience = AUDIENCE
        yield server


class Counting(JwtAuthenticator):
    verifications = 0

    async def _verified_claims(self, token: str) -> dict[str, Any]:
        self.verifications += 1
        return await super()._verified_claims(token)


def authenticator(idp: AuthServer, clock: FakeClock) -> Counting:
    return Counting(OAuthPolicy(issuer=idp.issuer, audiences=(AUDIENCE,)), MemoryRevocationStore(), clock=clock)


async def test_a_token_is_verified_once_a_second_however_often_it_is_presented(idp: AuthServer) -> None:
    clock = FakeClock(time.time())
    auth = authenticator(idp, clock)
    token = f"Bearer {idp.mint('alice')}"
    outcomes = [(await auth.authenticate(token)).outcome for _ in range(5)]
    assert outcomes == [AuthOutcome.OK] * 5
    assert auth.verifications == 1
    clock.advance(VERIFIED_SECONDS)
    assert (await auth.authenticate(token)).outcome is AuthOutcome.OK
    assert auth.verifications == 2
    await auth.aclose()


async def test_attack_a_cached_token_is_refused_the_moment_it_expires(idp: AuthServer) -> None:
    now = time.time()
    token = f"Bearer {idp.mint('alice', ttl=40, now=now)}"
    # Verified a moment before its expiry (exp + the clock skew allowance), then presented again just after.
    clock = FakeClock(now + 40 + CLOCK_SKEW_SECONDS - 0.5)
    auth = authenticator(idp, clock)
    assert (await auth.authenticate(token)).outcome is AuthOutcome.OK
    clock.advance(0.6)
    assert (await auth.authenticate(token)).outcome is AuthOutcome.EXPIRED
    assert auth.verifications == 1  # refused from the cache, not by verifying again
    await auth.aclose()


async def test_attack_a_cached_token_is_refused_the_moment_it_is_revoked(idp: AuthServer) -> None:
    auth = authenticator(idp, FakeClock(time.time()))
    token = f"Bearer {idp.mint('mallory')}"
    assert (await auth.authenticate(token)).outcome is AuthOutcome.OK
    await auth.revocations.revoke("mallory")
    assert (await auth.authenticate(token)).outcome is AuthOutcome.REVOKED
    await auth.aclose()


async def test_attack_a_token_differing_by_one_character_is_not_served_from_the_cache(idp: AuthServer) -> None:
    auth = authenticator(idp, FakeClock(time.time()))
    token = idp.mint("alice")
    assert (await auth.authenticate(f"Bearer {token}")).outcome is AuthOutcome.OK
    forged = token[:-2] + ("A" if token[-2] != "A" else "B") + token[-1]
    assert (await auth.authenticate(f"Bearer {forged}")).outcome is AuthOutcome.INVALID
    await auth.aclose()
