"""The ``controls`` caveat: minted and narrowed into a token, read back onto the identity, every one applying;
a malformed or unknown control makes the whole token invalid, and the caveat is bounded."""

from __future__ import annotations

import json

import pytest
from pymacaroons import Macaroon
from pymacaroons.macaroon import MACAROON_V2

from satgate_mcp.auth.base import TokenInvalid
from satgate_mcp.auth.caveats import MAX_CONTROLS_PREDICATE_BYTES, MAX_PREDICATE_BYTES, ControlsCaveat, format_caveat
from satgate_mcp.auth.macaroons import add_caveats, inspect_token, mint_token, verify_token
from satgate_mcp.auth.token_identifier import TokenIdentifier, encode_identifier
from satgate_mcp.policy.controls import Controls, parse_controls

KEY = "k" * 40
NOW = 1_000_000.0
PARENT = parse_controls('{"args": [{"tools": ["pay"], "field": "vendor", "one_of": ["acme"]}]}')
CHILD = parse_controls('{"args": [{"tools": ["pay"], "field": "vendor", "one_of": ["acme", "evil"]}], '
                       '"spend_limits": [{"tools": ["pay"], "field": "amount", "max": "50", "window": "day"}]}')


def raw_token(*predicates: str) -> str:
    """A token signed with the right key whose caveats are exactly ``predicates``, unchecked."""
    mac = Macaroon(location="satgate-mcp", identifier=encode_identifier(TokenIdentifier("tok", None, None, (), 0,
                                                                                          int(NOW))),
                   key=KEY.encode(), version=MACAROON_V2)
    for predicate in predicates:
        mac.add_first_party_caveat(predicate)
    return str(mac.serialize())


def test_minted_controls_ride_on_the_identity() -> None:
    identity = verify_token(KEY, mint_token(KEY, "tok", now=NOW, controls=PARENT), now=NOW)
    assert identity.controls == (PARENT,)


def test_a_narrowed_token_keeps_its_parents_rules_and_adds_its_own() -> None:
    parent = mint_token(KEY, "tok", now=NOW, controls=PARENT)
    child = add_caveats(parent, controls=CHILD)
    identity = verify_token(KEY, child, now=NOW)
    # The child's wider one_of is a second rule, not a replacement: "evil" still breaks the parent's.
    assert identity.controls == (PARENT, CHILD)
    assert identity.token_id == "tok"


def test_a_token_minted_for_a_delegated_child_carries_every_controls_caveat_given() -> None:
    identity = verify_token(KEY, mint_token(KEY, "child", now=NOW, controls=(PARENT, CHILD)), now=NOW)
    assert identity.controls == (PARENT, CHILD)


def test_inspect_shows_every_controls_caveat() -> None:
    info = inspect_token(add_caveats(mint_token(KEY, "tok", now=NOW, controls=PARENT), controls=CHILD))
    assert info["restrictions"]["controls"] == [
        {"args": [{"tools": ["pay"], "field": "vendor", "one_of": ["acme"]}]},
        {"args": [{"tools": ["pay"], "field": "vendor", "one_of": ["acme", "evil"]}],
         "spend_limits": [{"tools": ["pay"], "field": "amount", "max": "50", "window": "day", "tz": "UTC"}]}]
    assert info["unknown_caveats"] == []


@pytest.mark.parametrize("predicate", [
    pytest.param('controls = {"args": [{"tools": ["pay"], "field": "v", "one_of": ["a"], "extra": 1}]}',
                 id="unknown-entry-key"),
    pytest.param('controls = {"limits": []}', id="unknown-control"),
    pytest.param('controls = {"spend_limits": [{"tools": ["pay"], "field": "a", "max": "ten", "window": "day"}]}',
                 id="bad-decimal"),
    pytest.param('controls = {"spend_limits": [{"tools": ["pay"], "field": "a", "max": "1", "window": "day", '
                 '"tz": "Nowhere/City"}]}', id="unknown-tz"),
    pytest.param('controls = {"args": [{"tools": ["pay"], "field": "u", "url": {"hosts": ["@evil"]}}]}',
                 id="bad-url-spec"),
    pytest.param("controls = {not json", id="not-json"),
    pytest.param("controls <= {}", id="wrong-operator"),
])
def test_a_malformed_controls_caveat_makes_the_token_invalid(predicate: str) -> None:
    with pytest.raises(TokenInvalid):
        verify_token(KEY, raw_token(predicate), now=NOW)


def test_a_controls_caveat_is_bounded_and_only_it_gets_the_larger_bound() -> None:
    assert MAX_CONTROLS_PREDICATE_BYTES > MAX_PREDICATE_BYTES
    values = [f"vendor-{i:04d}-" + "x" * 60 for i in range(64)]
    big = parse_controls(json.dumps({"args": [{"tools": ["pay"], "field": "v", "one_of": values}]}))
    with pytest.raises(ValueError, match="too long"):
        format_caveat(ControlsCaveat(big))  # never signed
    huge = "controls = " + json.dumps({"args": [{"tools": ["pay"], "field": "v", "one_of": values}]})
    with pytest.raises(TokenInvalid):
        verify_token(KEY, raw_token(huge), now=NOW)
    # A predicate of another kind stays within the smaller bound even if it claims a long value.
    with pytest.raises(TokenInvalid):
        verify_token(KEY, raw_token("tools = " + ",".join(f"t{i}" for i in range(600))), now=NOW)


def test_a_mid_size_controls_caveat_between_the_two_bounds_verifies() -> None:
    values = [f"vendor-{i:03d}-" + "y" * 12 for i in range(64)]
    controls = parse_controls(json.dumps({"args": [{"tools": ["pay"], "field": "v", "one_of": values}],
                                          "confirm": [{"tools": ["delete_*"], "message": "m" * 500}]}))
    size = len(format_caveat(ControlsCaveat(controls)))
    assert MAX_PREDICATE_BYTES < size <= MAX_CONTROLS_PREDICATE_BYTES
    assert verify_token(KEY, mint_token(KEY, "tok", now=NOW, controls=controls), now=NOW).controls == (controls,)


def test_no_controls_no_field() -> None:
    assert verify_token(KEY, mint_token(KEY, "tok", now=NOW), now=NOW).controls == ()
    assert not Controls()
