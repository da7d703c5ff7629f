"""Macaroon tokens: identity is signed, caveats only narrow, anything unknown fails closed."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable

import pytest
from pymacaroons import Macaroon
from pymacaroons.macaroon import MACAROON_V2

from satgate_mcp.auth.base import AuthOutcome, Identity, TokenError, TokenExpired, TokenInvalid
from satgate_mcp.auth.caveats import (
    BudgetLimitCaveat,
    Caveat,
    DepthCaveat,
    ExpiresCaveat,
    Restrictions,
    ToolsCaveat,
    combine_caveats,
    format_caveat,
    parse_caveat,
)
from satgate_mcp.auth.macaroons import add_caveats, inspect_token, mint_token, verify_token

KEY = "k" * 40
OTHER_KEY = "o" * 40
NOW = 1_000_000.0


def mint(token_id: str = "tok-alice", **kwargs: object) -> str:
    return mint_token(KEY, token_id, now=NOW, **kwargs)  # type: ignore[arg-type]


def _b64decode(token: str) -> bytes:
    return base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))


def _b64encode(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def flip_last_byte(token: str) -> str:
    raw = bytearray(_b64decode(token))
    raw[-1] ^= 0x01  # the last byte belongs to the signature
    return _b64encode(bytes(raw))


def retarget_identifier(token: str) -> str:
    """Same signature, identifier re-pointed at another token id (what a forger would try)."""
    raw = _b64decode(token)
    assert b"tok-alice" in raw
    return _b64encode(raw.replace(b"tok-alice", b"tok-admin"))


def with_raw_caveat(token: str, predicate: str) -> str:
    """A holder can append any first-party caveat; this one the gateway does not know."""
    mac = Macaroon.deserialize(token)
    mac.add_first_party_caveat(predicate)
    return str(mac.serialize())


def foreign_identifier(identifier: str) -> str:
    """Correctly signed with the right key, but an identifier this gateway never mints."""
    return str(Macaroon(location="x", identifier=identifier, key=KEY.encode(), version=MACAROON_V2).serialize())


# --- the token table -----------------------------------------------------------------------------

TOKEN_CASES = [
    pytest.param(lambda: mint(), KEY, NOW + 1, AuthOutcome.OK, id="valid"),
    pytest.param(lambda: mint(ttl=60), KEY, NOW + 59.9, AuthOutcome.OK, id="valid-before-expiry"),
    pytest.param(lambda: mint(ttl=60), KEY, NOW + 60, AuthOutcome.EXPIRED, id="expired-at-the-instant"),
    pytest.param(lambda: mint(ttl=60), KEY, NOW + 3600, AuthOutcome.EXPIRED, id="expired"),
    pytest.param(lambda: mint(), OTHER_KEY, NOW, AuthOutcome.INVALID, id="wrong-key"),
    pytest.param(lambda: mint(ttl=1), OTHER_KEY, NOW + 10, AuthOutcome.INVALID, id="wrong-key-beats-expiry"),
    pytest.param(lambda: flip_last_byte(mint()), KEY, NOW, AuthOutcome.INVALID, id="tampered-signature"),
    pytest.param(lambda: retarget_identifier(mint()), KEY, NOW, AuthOutcome.INVALID, id="tampered-identifier"),
    pytest.param(lambda: add_caveats(mint(), tools=["a"]), KEY, NOW, AuthOutcome.OK, id="narrowed-still-valid"),
    pytest.param(lambda: add_caveats(mint(ttl=600), ttl=5, now=NOW), KEY, NOW + 6, AuthOutcome.EXPIRED,
                 id="narrowed-expiry-applies"),
    pytest.param(lambda: with_raw_caveat(mint(), "admin = true"), KEY, NOW, AuthOutcome.INVALID,
                 id="unknown-caveat"),
    pytest.param(lambda: with_raw_caveat(mint(), "expires = soon"), KEY, NOW, AuthOutcome.INVALID,
                 id="malformed-known-caveat"),
    pytest.param(lambda: with_raw_caveat(mint(), "tools = a b"), KEY, NOW, AuthOutcome.INVALID,
                 id="malformed-tools-caveat"),
    pytest.param(lambda: with_raw_caveat(mint(), "expires >= 1"), KEY, NOW, AuthOutcome.INVALID,
                 id="known-key-wrong-operator"),
    pytest.param(lambda: mint(parent_id="tok-root", depth=2, max_depth=1), KEY, NOW, AuthOutcome.INVALID,
                 id="depth-beyond-its-own-cap"),
    pytest.param(lambda: foreign_identifier("tok-alice"), KEY, NOW, AuthOutcome.INVALID, id="not-json-identifier"),
    pytest.param(lambda: foreign_identifier('{"v":2,"token_id":"a"}'), KEY, NOW, AuthOutcome.INVALID,
                 id="future-identifier-version"),
    pytest.param(lambda: foreign_identifier('{"v":1,"token_id":"a","role":"root"}'), KEY, NOW,
                 AuthOutcome.INVALID, id="unknown-identifier-field"),
    pytest.param(lambda: foreign_identifier('{"v":1,"token_id":"a","admin":true}'), KEY, NOW, AuthOutcome.OK,
                 id="admin-identifier"),
    pytest.param(lambda: foreign_identifier('{"v":1,"token_id":"a","admin":false}'), KEY, NOW, AuthOutcome.INVALID,
                 id="admin-false-is-no-spelling-we-sign"),
    pytest.param(lambda: foreign_identifier('{"v":1,"token_id":"a","admin":1}'), KEY, NOW, AuthOutcome.INVALID,
                 id="admin-one-is-not-true"),
    pytest.param(lambda: foreign_identifier('{"v":1,"token_id":"a\\nb"}'), KEY, NOW, AuthOutcome.INVALID,
                 id="newline-in-token-id"),
    pytest.param(lambda: "not-a-macaroon", KEY, NOW, AuthOutcome.INVALID, id="garbage"),
    pytest.param(lambda: "", KEY, NOW, AuthOutcome.INVALID, id="empty"),
    pytest.param(lambda: "é" * 10, KEY, NOW, AuthOutcome.INVALID, id="non-ascii"),
    pytest.param(lambda: mint() + "A" * 9000, KEY, NOW, AuthOutcome.INVALID, id="oversized"),
    pytest.param(lambda: mint()[:-10], KEY, NOW, AuthOutcome.INVALID, id="truncated"),
    pytest.param(lambda: mint() + "x", KEY, NOW, AuthOutcome.INVALID, id="trailing-junk-is-another-spelling"),
    pytest.param(lambda: mint() + "=", KEY, NOW, AuthOutcome.INVALID, id="trailing-padding-is-another-spelling"),
]


def outcome_of(token: str, key: str, now: float) -> AuthOutcome:
    try:
        verify_token(key, token, now=now)
    except TokenError as exc:
        return exc.outcome
    return AuthOutcome.OK


@pytest.mark.parametrize(("make", "key", "now", "expected"), TOKEN_CASES)
def test_token_table(make: Callable[[], str], key: str, now: float, expected: AuthOutcome) -> None:
    assert outcome_of(make(), key, now) is expected


def test_a_forged_identifier_parses_but_never_verifies() -> None:
    forged = retarget_identifier(mint())
    assert inspect_token(forged)["token_id"] == "tok-admin"
    with pytest.raises(TokenInvalid, match="signature"):
        verify_token(KEY, forged, now=NOW)


def test_errors_are_typed() -> None:
    with pytest.raises(TokenExpired):
        verify_token(KEY, mint(ttl=1), now=NOW + 2)
    with pytest.raises(TokenInvalid):
        verify_token(OTHER_KEY, mint(), now=NOW)


# --- what a verified token carries ---------------------------------------------------------------


def test_identity_carries_identifier_and_caveats() -> None:
    token = mint(ttl=60, tools=["search", "db_*"], budget_id="team-a", budget_limit=25, tenant="acme")
    ident = verify_token(KEY, token, now=NOW)
    assert ident == Identity(
        token_id="tok-alice", budget_id="team-a", tenant="acme", tool_filters=(("search", "db_*"),),
        expires_at=NOW + 60, budget_limit=25.0, parent_id=None, depth=0,
    )
    assert ident.budget_key == "team-a"
    assert ident.caveats == ("expires = 1000060", "tools = search,db_*", "budget_limit = 25")


def test_delegated_token_records_its_whole_chain() -> None:
    token = mint("tok-grandchild", parent_id="tok-child", ancestors=("tok-root", "tok-child"), depth=2)
    ident = verify_token(KEY, token, now=NOW)
    assert (ident.parent_id, ident.ancestors, ident.depth) == ("tok-child", ("tok-root", "tok-child"), 2)


@pytest.mark.parametrize(
    ("parent_id", "ancestors", "depth", "chain", "expected_depth"),
    [
        pytest.param(None, (), 0, (), 0, id="root-token"),
        pytest.param("p", (), 0, ("p",), 1, id="parent-only-depth-defaults-to-chain"),
        pytest.param("p", ("r",), 2, ("r", "p"), 2, id="ancestors-above-parent"),
        pytest.param("p", ("r", "p"), 2, ("r", "p"), 2, id="ancestors-ending-in-parent"),
    ],
)
def test_delegation_chain_forms(
    parent_id: str | None, ancestors: tuple[str, ...], depth: int, chain: tuple[str, ...], expected_depth: int
) -> None:
    ident = verify_token(KEY, mint(parent_id=parent_id, ancestors=ancestors, depth=depth), now=NOW)
    assert (ident.ancestors, ident.depth) == (chain, expected_depth)


@pytest.mark.parametrize(
    ("tools", "allowed", "refused"),
    [
        pytest.param(None, ["anything"], [], id="no-caveat-allows-all"),
        pytest.param(["search"], ["search"], ["search2", "other"], id="exact-name"),
        pytest.param(["db_*"], ["db_query", "db_"], ["dbx", "search"], id="prefix"),
        pytest.param(["*"], ["anything"], [], id="star"),
        pytest.param([], [], ["search"], id="empty-list-allows-nothing"),
    ],
)
def test_tools_caveat(tools: list[str] | None, allowed: list[str], refused: list[str]) -> None:
    ident = verify_token(KEY, mint(tools=tools), now=NOW)
    assert all(ident.allows_tool(t) for t in allowed)
    assert not any(ident.allows_tool(t) for t in refused)


def test_narrowing_intersects_tools_and_keeps_lowest_limit_and_earliest_expiry() -> None:
    token = mint(ttl=100, tools=["db_*", "search"], budget_limit=50)
    narrowed = add_caveats(add_caveats(token, tools=["db_read", "search*"], budget_limit=80, ttl=500, now=NOW),
                           budget_limit=10, expires_at=NOW + 30)
    ident = verify_token(KEY, narrowed, now=NOW)
    assert ident.allows_tool("db_read")
    assert ident.allows_tool("search")
    assert not ident.allows_tool("db_write")  # dropped by the second tools caveat
    assert not ident.allows_tool("search_all")  # dropped by the first
    assert (ident.budget_limit, ident.expires_at) == (10.0, NOW + 30)


def test_narrowing_cannot_widen() -> None:
    token = mint(ttl=10, tools=["search"], budget_limit=5)
    wider = add_caveats(token, tools=["*"], budget_limit=1000, expires_at=NOW + 10_000)
    ident = verify_token(KEY, wider, now=NOW)
    assert not ident.allows_tool("delete_everything")
    assert (ident.budget_limit, ident.expires_at) == (5.0, NOW + 10)
    assert outcome_of(wider, KEY, NOW + 11) is AuthOutcome.EXPIRED


# --- caveat grammar ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("predicate", "caveat"),
    [
        pytest.param("expires = 1700000000", ExpiresCaveat(1_700_000_000.0), id="expires"),
        pytest.param("expires=1700000000.5", ExpiresCaveat(1_700_000_000.5), id="expires-no-spaces"),
        pytest.param("tools = a,b_*", ToolsCaveat(("a", "b_*")), id="tools"),
        pytest.param("tools = a, b", ToolsCaveat(("a", "b")), id="tools-spaces"),
        pytest.param("tools = ", ToolsCaveat(()), id="tools-none"),
        pytest.param("budget_limit = 0", BudgetLimitCaveat(0.0), id="budget-zero"),
        pytest.param("depth <= 3", DepthCaveat(3), id="depth"),
    ],
)
def test_parse_caveat(predicate: str, caveat: Caveat) -> None:
    assert parse_caveat(predicate) == caveat


@pytest.mark.parametrize(
    "predicate",
    [
        pytest.param("admin = true", id="unknown-key"),
        pytest.param("expires = -5", id="negative"),
        pytest.param("expires = 1e9", id="exponent"),
        pytest.param("expires = nan", id="nan"),
        pytest.param("budget_limit = inf", id="inf"),
        pytest.param("budget_limit <= 5", id="wrong-operator"),
        pytest.param("depth = 3", id="depth-needs-le"),
        pytest.param("tools = a*b", id="star-in-the-middle"),
        pytest.param("tools = a,,b", id="empty-pattern"),
        pytest.param("time < 5", id="other-operator"),
        pytest.param("", id="empty"),
    ],
)
def test_unknown_or_malformed_caveats_are_invalid(predicate: str) -> None:
    with pytest.raises(TokenInvalid):
        parse_caveat(predicate)


@pytest.mark.parametrize(
    "caveat",
    [ExpiresCaveat(1_700_000_000.25), ToolsCaveat(("a", "b*")), BudgetLimitCaveat(12.5), DepthCaveat(2)],
)
def test_format_then_parse_round_trips(caveat: Caveat) -> None:
    assert parse_caveat(format_caveat(caveat)) == caveat


@pytest.mark.parametrize(
    ("caveats", "expected"),
    [
        pytest.param([], Restrictions(), id="none"),
        pytest.param([ExpiresCaveat(20), ExpiresCaveat(10), ExpiresCaveat(30)], Restrictions(expires_at=10),
                     id="earliest-expiry"),
        pytest.param([BudgetLimitCaveat(9), BudgetLimitCaveat(3)], Restrictions(budget_limit=3), id="lowest-limit"),
        pytest.param([ToolsCaveat(("a",)), ToolsCaveat(("b",))], Restrictions(tool_filters=(("a",), ("b",))),
                     id="tools-intersect"),
        pytest.param([ToolsCaveat(("a",)), ToolsCaveat(("a",))], Restrictions(tool_filters=(("a",),)),
                     id="same-tools-once"),
        pytest.param([DepthCaveat(4), DepthCaveat(1)], Restrictions(max_depth=1), id="lowest-depth-cap"),
    ],
)
def test_combine_caveats(caveats: list[Caveat], expected: Restrictions) -> None:
    assert combine_caveats(caveats) == expected


# --- minting refuses bad input before signing ----------------------------------------------------


@pytest.mark.parametrize(
    ("key", "token_id", "kwargs"),
    [
        pytest.param("", "tok", {}, id="empty-key"),
        pytest.param(KEY, "", {}, id="empty-id"),
        pytest.param(KEY, "tok\nother", {}, id="newline-in-id"),
        pytest.param(KEY, "tok other", {}, id="space-in-id"),
        pytest.param(KEY, "#tok", {}, id="comment-char"),
        pytest.param(KEY, "tok", {"ttl": 0}, id="zero-ttl"),
        pytest.param(KEY, "tok", {"ttl": float("inf")}, id="infinite-ttl"),
        pytest.param(KEY, "tok", {"budget_limit": -1}, id="negative-budget"),
        pytest.param(KEY, "tok", {"tools": ["a b"]}, id="bad-tool-pattern"),
        pytest.param(KEY, "tok", {"tools": "a,b"}, id="tools-as-one-string"),
        pytest.param(KEY, "tok", {"tenant": "a b"}, id="bad-tenant"),
    ],
)
def test_mint_refuses(key: str, token_id: str, kwargs: dict[str, object]) -> None:
    with pytest.raises((ValueError, TypeError)):
        mint_token(key, token_id, now=NOW, **kwargs)  # type: ignore[arg-type]


# --- inspect -------------------------------------------------------------------------------------


def test_inspect_needs_no_key_and_shows_everything() -> None:
    token = with_raw_caveat(mint(ttl=60, tools=["a"], budget_id="b", tenant="t", parent_id="p"), "color = red")
    info = inspect_token(token, now=NOW + 61)
    assert info["token_id"] == "tok-alice"
    assert (info["budget_id"], info["tenant"], info["parent_id"], info["ancestors"]) == ("b", "t", "p", ["p"])
    assert info["caveats"] == ["expires = 1000060", "tools = a", "color = red"]
    assert info["unknown_caveats"] == ["color = red"]
    assert info["restrictions"]["tools"] == [["a"]]
    assert info["expired"] is True
    json.dumps(info)  # plain data


def test_inspect_refuses_garbage() -> None:
    with pytest.raises(TokenInvalid):
        inspect_token("garbage")
