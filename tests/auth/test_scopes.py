"""The ``resources`` and ``prompts`` caveats in tokens: grammar, minting, narrowing, inspecting, delegating."""

from __future__ import annotations

import pytest
from pydantic import SecretStr

from satgate_mcp.auth.base import Identity, TokenInvalid
from satgate_mcp.auth.caveats import (
    Caveat,
    PromptsCaveat,
    ResourcesCaveat,
    Restrictions,
    check_patterns,
    combine_caveats,
    format_caveat,
    parse_caveat,
)
from satgate_mcp.auth.macaroons import add_caveats, inspect_token, mint_token, verify_token
from satgate_mcp.events import RecordingPublisher
from satgate_mcp.metrics import Metrics
from satgate_mcp.patterns import PatternKind
from satgate_mcp.policy.delegation import plan_child
from satgate_mcp.policy.engine import CallPolicy
from satgate_mcp.settings import Settings

KEY = "scopes-tests-root-key-0123456789abcdef"
NOW = 1_700_000_000.0


@pytest.mark.parametrize(
    ("predicate", "caveat"),
    [
        pytest.param("resources = file:///docs/*,memo://a/readme", ResourcesCaveat(("file:///docs/*", "memo://a/readme")),
                     id="resources"),
        pytest.param("resources = https://h/p?q=a%20b&x=1#f", ResourcesCaveat(("https://h/p?q=a%20b&x=1#f",)),
                     id="uri-characters-tools-do-not-have"),
        pytest.param("resources = *", ResourcesCaveat(("*",)), id="every-resource"),
        pytest.param("resources = ", ResourcesCaveat(()), id="no-resource"),
        pytest.param("prompts = greet, public_*", PromptsCaveat(("greet", "public_*")), id="prompts"),
        pytest.param("prompts = grüße", PromptsCaveat(("grüße",)), id="non-ascii-name"),
    ],
)
def test_parse_scope_caveat(predicate: str, caveat: Caveat) -> None:
    assert parse_caveat(predicate) == caveat
    assert parse_caveat(format_caveat(caveat)) == caveat


@pytest.mark.parametrize(
    "predicate",
    [
        pytest.param("resources = a b", id="whitespace"),
        pytest.param("resources = a,,b", id="empty-pattern"),
        pytest.param("resources = file:///*/x", id="star-in-the-middle"),
        pytest.param("resources = a\x1bb", id="control-character"),
        pytest.param("prompts = a\u00a0b", id="non-breaking-space"),
        pytest.param("resources <= a", id="wrong-operator"),
        pytest.param("resources = " + "a" * 1025, id="pattern-too-long"),
    ],
)
def test_malformed_scope_caveats_are_invalid(predicate: str) -> None:
    with pytest.raises(TokenInvalid):
        parse_caveat(predicate)


@pytest.mark.parametrize("patterns", [["a,b"], ["a b"], [""], ["x*y"], ["a\nb"], "a,b"])
def test_minting_refuses_bad_scope_patterns(patterns: list[str]) -> None:
    with pytest.raises((ValueError, TypeError)):
        mint_token(KEY, "tok", resources=patterns)
    with pytest.raises((ValueError, TypeError)):
        mint_token(KEY, "tok", prompts=patterns)


def test_check_patterns_names_what_is_wrong() -> None:
    with pytest.raises(ValueError, match="invalid prompt pattern"):
        check_patterns(["a b"], PatternKind.PROMPT)


def test_scope_caveats_intersect_and_repeat_once() -> None:
    limits = combine_caveats([ResourcesCaveat(("a*",)), ResourcesCaveat(("ab",)), ResourcesCaveat(("a*",)),
                              PromptsCaveat(("p",))])
    assert limits == Restrictions(resource_filters=(("a*",), ("ab",)), prompt_filters=(("p",),))


def test_minted_and_narrowed_scopes_verify_and_only_narrow() -> None:
    token = mint_token(KEY, "tok", resources=["file:///docs/*"], prompts=["public_*"], now=NOW)
    narrowed = add_caveats(token, resources=["file:///docs/public/*", "file:///etc/*"], prompts=["*"])
    ident = verify_token(KEY, narrowed, now=NOW)
    assert ident.resource_filters == (("file:///docs/*",), ("file:///docs/public/*", "file:///etc/*"))
    assert ident.allows_resource("file:///docs/public/a")
    assert not ident.allows_resource("file:///docs/private/a")
    assert not ident.allows_resource("file:///etc/passwd"), "narrowing never widens"
    assert ident.allows_prompt("public_greet")
    assert not ident.allows_prompt("admin_reset")


def test_a_token_without_scope_caveats_allows_every_resource_and_prompt() -> None:
    ident = verify_token(KEY, mint_token(KEY, "tok", tools=["echo"], now=NOW), now=NOW)
    assert ident.allows_resource("anything://at/all")
    assert ident.allows_prompt("anything")


def test_inspect_shows_the_scopes() -> None:
    info = inspect_token(mint_token(KEY, "tok", resources=["memo://*"], prompts=["greet"], now=NOW))
    assert info["restrictions"]["resources"] == [["memo://*"]]
    assert info["restrictions"]["prompts"] == [["greet"]]
    assert info["unknown_caveats"] == []


# --- delegation inherits the parent's scopes ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("resource_filters", "expected"),
    [
        pytest.param((), None, id="unrestricted-parent"),
        pytest.param((("file:///docs/*", "memo://a"),), ("file:///docs/*", "memo://a"), id="one-caveat"),
        pytest.param((("file:///*",), ("file:///docs/*", "memo://*")), ("file:///docs/*",), id="intersected"),
        pytest.param((("a",), ("b",)), (), id="disjoint-allows-none"),
    ],
)
def test_a_delegated_child_inherits_the_parents_resources(resource_filters: tuple[tuple[str, ...], ...],
                                                          expected: tuple[str, ...] | None) -> None:
    parent = Identity("parent", resource_filters=resource_filters, prompt_filters=resource_filters)
    plan = plan_child(parent, {"budget": 1}, now=NOW)
    assert (plan.resources, plan.prompts) == (expected, expected)


async def test_attack_delegated_child_widens_resources() -> None:
    """A child minted by the real policy with the root key carries its parent's resources and prompts caveats."""
    policy = CallPolicy.from_settings(Settings(auth_mode="header", root_key=SecretStr(KEY)),
                                      publisher=RecordingPublisher(), metrics=Metrics(), wall_clock=lambda: NOW)
    parent = verify_token(KEY, mint_token(KEY, "parent", resources=["file:///docs/*"], prompts=["public_*"],
                                          now=NOW), now=NOW)
    child = verify_token(KEY, (await policy.delegate(parent, {"budget": 1}))["token"], now=NOW)
    assert child.allows_resource("file:///docs/a")
    assert not child.allows_resource("file:///etc/passwd")
    assert child.allows_prompt("public_greet")
    assert not child.allows_prompt("admin_reset")
