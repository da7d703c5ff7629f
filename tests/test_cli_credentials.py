"""``satgate-mcp credentials list|revoke``, and ``token revoke`` forgetting the revoked id's upstream grants, on the
state folder a daemon made, as an operator runs them."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

import pytest

from satgate_mcp import cli
from satgate_mcp.cli_authorize import authorization_problem
from satgate_mcp.oauth_grants import StoredGrant
from satgate_mcp.settings import Settings
from satgate_mcp.stores.sqlite import LocalState
from satgate_mcp.stores.sqlite.grants import SqliteGrantStore

NOW = 1_700_000_000.0
KEPT = [("alice", "files"), ("alice", "tickets"), ("bob", "files")]


@pytest.fixture
def folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A state folder where a daemon kept three users' grants."""
    for key in list(os.environ):
        if key.startswith("SATGATE_"):
            monkeypatch.delenv(key)
    monkeypatch.setenv("SATGATE_STATE_DIR", str(tmp_path))

    async def keep() -> None:
        state = LocalState.open(tmp_path)
        store = SqliteGrantStore(state.db)
        for owner, upstream in KEPT:
            await store.put(StoredGrant(owner, upstream, f"g-{owner}-{upstream}", "v1.k.sealed-refresh-token", NOW,
                                        NOW + 60, "files:read"))
        await state.aclose()

    asyncio.run(keep())
    return tmp_path


def kept(folder: Path) -> list[tuple[str, str]]:
    async def read() -> list[StoredGrant]:
        state = LocalState.open(folder)
        try:
            return await SqliteGrantStore(state.db).listing()
        finally:
            await state.aclose()

    return [(g.owner, g.upstream) for g in asyncio.run(read())]


def test_list_shows_whose_grant_for_which_upstream_never_the_token(folder: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["credentials", "list"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0] == ("alice  files  scope files:read  given 2023-11-14T22:13:20Z  "
                                   "refreshed 2023-11-14T22:14:20Z")
    assert len(out.splitlines()) == 3
    assert "sealed" not in out
    assert cli.main(["credentials", "list", "--json", "--subject", "bob"]) == 0
    shown = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert shown == [{"subject": "bob", "upstream": "files", "grant_id": "g-bob-files", "scope": "files:read",
                      "created_at": NOW, "refreshed_at": NOW + 60}]


def test_revoke_one_upstream_then_all_and_a_revoke_of_nothing_fails(folder: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["credentials", "revoke", "alice", "tickets"]) == 0
    assert kept(folder) == [("alice", "files"), ("bob", "files")]
    assert cli.main(["credentials", "revoke", "alice"]) == 0
    assert kept(folder) == [("bob", "files")]
    capsys.readouterr()
    assert cli.main(["credentials", "revoke", "alice"]) == 1
    assert "has no grant" in capsys.readouterr().err


def test_revoking_a_gateway_token_forgets_its_upstream_grants(folder: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["token", "revoke", "alice"]) == 0
    assert "forgot its 2 upstream grant(s)" in capsys.readouterr().out
    assert kept(folder) == [("bob", "files")]


def test_memory_state_has_no_grants_to_list(monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    for key in list(os.environ):
        if key.startswith("SATGATE_"):
            monkeypatch.delenv(key)
    monkeypatch.setenv("SATGATE_STATE_DIR", "memory")
    assert cli.main(["credentials", "list"]) == 2
    assert "no credential store" in capsys.readouterr().err


@pytest.mark.parametrize(("change", "subject", "why"), [
    ({}, None, None),
    ({}, "someone", None),
    ({"auth": {"type": "client_credentials", "token_endpoint": "https://as.example.com/token", "client_id": "c",
               "client_secret_env": "S"}}, None, "oauth_user"),
    ({"catalogue_subject": None}, None, "--subject"),
    ({"public_url": None}, None, "SATGATE_PUBLIC_URL"),
])
def test_credentials_authorize_says_why_it_cannot_start(change: dict[str, Any], subject: str | None,
                                                         why: str | None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("S", "client-secret")
    auth: dict[str, Any] = {"type": "oauth_user", "client_id": "c", "client_secret_env": "S",
                            "authorization_endpoint": "https://as.example.com/authorize",
                            "token_endpoint": "https://as.example.com/token", "catalogue_subject": "bot"}
    if "catalogue_subject" in change:
        del auth["catalogue_subject"]
    upstream: dict[str, Any] = {"transport": "http", "url": "https://up.example.com/mcp",
                                "auth": change.get("auth", auth)}
    values: dict[str, Any] = {"auth_mode": "header", "root_key": "r" * 40, "state_dir": "memory",
                              "upstreams": {"codehost": upstream}, "credential_key": "ab" * 32,
                              "public_url": "https://gw.example.com"}
    values.update({k: v for k, v in change.items() if k in ("credential_key", "public_url")})
    problem = authorization_problem(Settings(**{k: v for k, v in values.items() if v is not None}), "codehost",
                                    subject)
    assert (problem is None) if why is None else (problem is not None and why in problem)
