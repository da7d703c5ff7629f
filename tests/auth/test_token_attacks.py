"""What a stranger's token may cost: nothing is interpreted before the signature verifies, caveats parse in
linear time, and every malformed credential is a refusal, never an exception (issue 9, holes 1 and 7).

Timing bounds here are guards against the attacks (each used to take seconds or crash), kept generous;
they measure CPU time, so other work on the machine does not make them flaky.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any

import pytest
from pymacaroons import Macaroon
from pymacaroons.macaroon import MACAROON_V2

from satgate_mcp.auth.base import AuthOutcome, NoAuthenticator, StaticTokenAuthenticator, TokenInvalid
from satgate_mcp.auth.caveats import MAX_PREDICATE_BYTES, DepthCaveat, parse_caveat, split_predicate
from satgate_mcp.auth.header import MacaroonAuthenticator
from satgate_mcp.auth.macaroons import SIGNATURE_MISMATCH, mint_token, verify_signature
from satgate_mcp.auth.token_identifier import decode_identifier
from satgate_mcp.stores.memory import MemoryRevocationStore

KEY = "the-gateways-own-root-key-0123456789abcdef"
ATTACKER_KEY = "an-attackers-own-root-key-0123456789abcdef"
NOW = 1_700_000_000.0
#: The audit's crafted predicate: the old regex took cubic time on it (n=1,600: 3.4 s per request).
BACKTRACKING_PREDICATE = "tools =" + " " * 1600 + "\nx\ny"
#: CPU seconds one authentication may take at most, however it is crafted (a real one takes ~0.1 ms).
AUTH_CPU_BOUND = 0.05


def cpu_seconds(action: Callable[[], Any]) -> float:
    started = time.process_time()
    with contextlib.suppress(TokenInvalid):
        action()
    return time.process_time() - started


def macaroon(identifier: str | bytes, *predicates: str, key: str = ATTACKER_KEY) -> str:
    """What anyone can build with a key of their own: any identifier, any first-party caveats."""
    mac = Macaroon(location="x", identifier=identifier, key=key.encode(), version=MACAROON_V2)
    for predicate in predicates:
        mac.add_first_party_caveat(predicate)
    return str(mac.serialize())


def holder_narrowed(*predicates: str) -> str:
    """A genuine token whose holder appended caveats (no key needed for that)."""
    mac = Macaroon.deserialize(mint_token(KEY, "tok-holder", now=NOW))
    for predicate in predicates:
        mac.add_first_party_caveat(predicate)
    return str(mac.serialize())


def header_auth() -> MacaroonAuthenticator:
    return MacaroonAuthenticator(KEY, MemoryRevocationStore(), clock=lambda: NOW)


# --- hole 1: backtracking caveats -----------------------------------------------------------------


def test_attack_backtracking_caveat_parses_fast() -> None:
    assert cpu_seconds(lambda: parse_caveat(BACKTRACKING_PREDICATE)) < AUTH_CPU_BOUND
    with pytest.raises(TokenInvalid):
        parse_caveat(BACKTRACKING_PREDICATE)


@pytest.mark.parametrize("n", [MAX_PREDICATE_BYTES, 100_000, 1_000_000])
def test_attack_huge_crafted_predicate_is_refused_fast(n: int) -> None:
    for predicate in ("tools =" + " " * n + "\nx\ny", "tools = " + "a," * n, "expires =" + " " * n + "1"):
        assert cpu_seconds(lambda p=predicate: parse_caveat(p)) < AUTH_CPU_BOUND  # type: ignore[misc]
        with pytest.raises(TokenInvalid):
            parse_caveat(predicate)


async def test_attack_backtracking_caveat_gets_401_fast() -> None:
    """Minted with the attacker's own key: refused on its signature, before any caveat is read."""
    token = macaroon('{"v":1,"token_id":"x"}', BACKTRACKING_PREDICATE)
    auth = header_auth()
    started = time.process_time()
    result = await auth.authenticate(f"Bearer {token}")
    assert time.process_time() - started < AUTH_CPU_BOUND
    assert result.outcome is AuthOutcome.INVALID
    assert result.reason == SIGNATURE_MISMATCH


def test_signature_is_checked_before_any_caveat_or_identifier_is_interpreted(monkeypatch: pytest.MonkeyPatch
                                                                              ) -> None:
    from satgate_mcp.auth import macaroons

    def must_not_run(*_args: object) -> None:
        raise AssertionError("interpreted an unverified token")

    monkeypatch.setattr(macaroons, "parse_caveat", must_not_run)
    monkeypatch.setattr(macaroons, "decode_identifier", must_not_run)
    with pytest.raises(TokenInvalid, match="signature"):
        verify_signature(KEY, macaroon('{"v":1,"token_id":"x"}', "tools = a"))


@pytest.mark.parametrize(
    ("predicate", "expected"),
    [
        pytest.param("tools = a,b", ("tools", "=", "a,b"), id="spaces"),
        pytest.param("tools=a", ("tools", "=", "a"), id="no-spaces"),
        pytest.param("  depth   <=   3  ", ("depth", "<=", "3"), id="le-with-padding"),
        pytest.param("tools = a=b", ("tools", "=", "a=b"), id="first-operator-wins"),
        pytest.param("resources = https://h/p?q=1", ("resources", "=", "https://h/p?q=1"), id="uri-with-equals"),
        pytest.param("=", ("", "=", ""), id="operator-only"),
    ],
)
def test_split_predicate(predicate: str, expected: tuple[str, str, str]) -> None:
    assert split_predicate(predicate) == expected


@pytest.mark.parametrize(
    "predicate",
    [
        pytest.param("tools = a\nb", id="newline"),
        pytest.param("tools =\ta", id="tab"),
        pytest.param("tools = a\x00", id="nul"),
        pytest.param("tools = a\u2028", id="line-separator"),
        pytest.param("tools = " + "a" * MAX_PREDICATE_BYTES, id="over-the-size-bound"),
        pytest.param("tools a", id="no-operator"),
    ],
)
def test_split_predicate_refuses(predicate: str) -> None:
    with pytest.raises(TokenInvalid):
        split_predicate(predicate)


def test_minting_never_signs_a_caveat_no_gateway_accepts() -> None:
    with pytest.raises(ValueError, match="too long"):
        mint_token(KEY, "tok", tools=[f"tool_{i:04d}" for i in range(250)])


# --- hole 7: crafted values that used to raise ----------------------------------------------------


@pytest.mark.parametrize(
    "predicate",
    [
        pytest.param("depth <= ²", id="superscript-two"),
        pytest.param("depth <= \u0663", id="arabic-indic-three"),
        pytest.param("expires = " + "\u0661\u0667" + "\u0660" * 8, id="arabic-indic-expiry"),
        pytest.param("budget_limit = \uff15", id="fullwidth-five"),
    ],
)
def test_attack_non_ascii_digits_in_a_caveat_are_invalid_not_a_crash(predicate: str) -> None:
    with pytest.raises(TokenInvalid):
        parse_caveat(predicate)
    with pytest.raises(TokenInvalid):
        verify_signature(KEY, holder_narrowed(predicate))


def test_ascii_depth_still_parses() -> None:
    assert parse_caveat("depth <= 12") == DepthCaveat(12)


@pytest.mark.parametrize(
    "identifier",
    [
        pytest.param(b"[" * 3000, id="3000-brackets"),
        pytest.param(b"{" * 3000, id="3000-braces"),
        pytest.param(b'{"v":1,"token_id":"a","ancestors":[[["a"]]]}', id="nested-list"),
        pytest.param(b'{"v":1,"token_id":"' + b"a" * 7000 + b'"}', id="oversized"),
    ],
)
def test_attack_deep_or_huge_identifier_is_invalid_not_a_crash(identifier: bytes) -> None:
    with pytest.raises(TokenInvalid):
        decode_identifier(identifier)
    # Signed with the gateway's own key, so it gets past the signature to the identifier parser.
    assert cpu_seconds(lambda: verify_signature(KEY, macaroon(identifier, key=KEY))) < AUTH_CPU_BOUND
    with pytest.raises(TokenInvalid):
        verify_signature(KEY, macaroon(identifier, key=KEY))


async def test_attack_identifier_of_3000_brackets_gets_401() -> None:
    for key in (ATTACKER_KEY, KEY):
        result = await header_auth().authenticate(f"Bearer {macaroon(b'[' * 3000, key=key)}")
        assert result.outcome is AuthOutcome.INVALID


RAW_BYTES_BEARER = b"Bearer \xff\xfe".decode("utf-8", errors="surrogateescape")  # how aiohttp hands raw bytes over


@pytest.mark.parametrize(
    "authenticator",
    [
        pytest.param(lambda: NoAuthenticator(), id="none-mode"),
        pytest.param(lambda: StaticTokenAuthenticator("s3cret-static-token"), id="config-mode"),
        pytest.param(header_auth, id="header-mode"),
    ],
)
@pytest.mark.parametrize(
    "header",
    [
        pytest.param(RAW_BYTES_BEARER, id="raw-ff-fe"),
        pytest.param("Bearer tok\x7f", id="del"),
        pytest.param("Bearer tök", id="non-ascii"),
        pytest.param("Bearer a\x00b", id="nul"),
    ],
)
async def test_attack_raw_bytes_bearer_is_invalid_not_a_crash(authenticator: Callable[[], Any], header: str
                                                             ) -> None:
    result = await authenticator().authenticate(header)
    assert result.outcome is AuthOutcome.INVALID
    assert not result.ok
