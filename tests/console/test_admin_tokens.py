"""``token mint --admin``: the grant lives in the signed identifier, so no holder can add it to a token."""

from __future__ import annotations

import pytest

from satgate_mcp.auth.base import TokenInvalid
from satgate_mcp.auth.macaroons import add_caveats, inspect_token, mint_token, verify_token
from satgate_mcp.cli import main
from tests.auth.test_macaroons import with_raw_caveat

KEY = "admin-token-root-key-0123456789-abcdefghijkl"


def test_an_admin_token_verifies_as_an_admin_and_as_an_ordinary_token() -> None:
    identity = verify_token(KEY, mint_token(KEY, "ops", admin=True), now=0)
    assert identity.admin
    assert identity.token_id == "ops"
    assert not verify_token(KEY, mint_token(KEY, "agent"), now=0).admin


def test_a_holder_cannot_make_a_token_admin_with_a_caveat() -> None:
    with pytest.raises(TokenInvalid):
        verify_token(KEY, with_raw_caveat(mint_token(KEY, "agent"), "admin = true"), now=0)


def test_narrowing_never_grants_admin_and_keeps_an_admins_grant() -> None:
    assert not verify_token(KEY, add_caveats(mint_token(KEY, "agent"), tools=["echo"]), now=0).admin
    assert verify_token(KEY, add_caveats(mint_token(KEY, "ops", admin=True), ttl=60, now=0), now=1).admin


def test_mint_admin_on_the_command_line(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("SATGATE_ROOT_KEY", KEY)
    assert main(["token", "mint", "--id", "ops", "--admin"]) == 0
    token = capsys.readouterr().out.strip()
    assert inspect_token(token)["admin"] is True
    assert verify_token(KEY, token, now=0).admin
