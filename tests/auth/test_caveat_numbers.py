"""What ``_format_number`` writes, the caveat number parser reads back: one range, refused at mint time."""

from __future__ import annotations

from typing import Any

import pytest

from satgate_mcp.auth.caveats import CAVEAT_NUMBER_LIMIT, _format_number, _parse_number
from satgate_mcp.auth.macaroons import mint_token, verify_signature

ROOT_KEY = "caveat-numbers-root-key-0123456789"


@pytest.mark.parametrize("value", [
    pytest.param(0.0, id="zero"),
    pytest.param(1.5, id="fraction"),
    pytest.param(1_700_000_000.25, id="a-timestamp"),
    pytest.param(float(CAVEAT_NUMBER_LIMIT - 1), id="largest-integer"),
    pytest.param(CAVEAT_NUMBER_LIMIT - 0.125, id="largest-float-below-the-limit"),
])
def test_every_number_formatted_is_read_back(value: float) -> None:
    assert _parse_number(_format_number(value)) == pytest.approx(value, abs=1e-6)


@pytest.mark.parametrize("value", [
    pytest.param(float(CAVEAT_NUMBER_LIMIT), id="1e15"),
    pytest.param(1e300, id="1e300"),
    pytest.param(float("inf"), id="inf"),
    pytest.param(float("nan"), id="nan"),
    pytest.param(-1.0, id="negative"),
])
def test_numbers_the_parser_would_refuse_are_refused_when_formatted(value: float) -> None:
    with pytest.raises(ValueError, match="expected a finite number"):
        _format_number(value)


@pytest.mark.parametrize("caveats", [
    pytest.param({"budget_limit": 1e15}, id="budget-1e15"),
    pytest.param({"budget_limit": 10**400}, id="budget-400-digits"),
    pytest.param({"budget_limit": float("nan")}, id="budget-nan"),
    pytest.param({"ttl": 1e15}, id="ttl-1e15"),
])
def test_attack_minting_a_token_that_could_never_verify_is_a_value_error(caveats: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="expected a"):  # never OverflowError, never an unverifiable token
        mint_token(ROOT_KEY, "t", now=1_700_000_000.0, **caveats)


def test_a_token_at_the_edge_of_the_range_verifies() -> None:
    token = mint_token(ROOT_KEY, "t", budget_limit=CAVEAT_NUMBER_LIMIT - 1, now=1_700_000_000.0)
    assert verify_signature(ROOT_KEY, token).budget_limit == CAVEAT_NUMBER_LIMIT - 1
