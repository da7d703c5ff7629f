"""``SATGATE_AUTH_MODE`` picks the authenticator; header mode brings the configured revocation store."""

from __future__ import annotations

from pathlib import Path

import pytest

from satgate_mcp.auth.base import NoAuthenticator, StaticTokenAuthenticator
from satgate_mcp.auth.factory import authenticator_from_settings
from satgate_mcp.auth.header import MacaroonAuthenticator
from satgate_mcp.auth.macaroons import mint_token
from satgate_mcp.errors import ConfigError
from satgate_mcp.settings import Settings
from satgate_mcp.stores.files import FileRevocationStore
from satgate_mcp.stores.memory import MemoryRevocationStore

KEY = "k" * 40


@pytest.mark.parametrize(
    ("values", "kind"),
    [
        pytest.param({"auth_mode": "none"}, NoAuthenticator, id="none"),
        pytest.param({"auth_mode": "config", "static_token": "s3cret"}, StaticTokenAuthenticator, id="config"),
        pytest.param({"auth_mode": "header", "root_key": KEY}, MacaroonAuthenticator, id="header"),
    ],
)
def test_mode_picks_the_authenticator(values: dict[str, str], kind: type) -> None:
    auth = authenticator_from_settings(Settings(**values))  # type: ignore[arg-type]
    assert isinstance(auth, kind)
    assert auth.mode == values["auth_mode"]


async def test_header_mode_uses_the_revocation_file(tmp_path: Path) -> None:
    path = tmp_path / "revoked"
    path.write_text("tok-gone\n")
    auth = authenticator_from_settings(
        Settings(auth_mode="header", root_key=KEY, revocation_file=path),  # type: ignore[arg-type]
        clock=lambda: 1000.0,
    )
    assert isinstance(auth, MacaroonAuthenticator)
    assert isinstance(auth.revocations, FileRevocationStore)
    result = await auth.authenticate("Bearer " + mint_token(KEY, "tok-gone", now=1000.0))
    assert result.outcome == "revoked"


def test_an_injected_store_wins() -> None:
    store = MemoryRevocationStore()
    auth = authenticator_from_settings(Settings(auth_mode="header", root_key=KEY),  # type: ignore[arg-type]
                                       revocations=store)
    assert isinstance(auth, MacaroonAuthenticator)
    assert auth.revocations is store


def test_a_settings_object_that_skipped_validation_still_cannot_start_without_a_root_key() -> None:
    settings = Settings.model_construct(auth_mode="header", root_key=None)
    with pytest.raises(ConfigError, match="SATGATE_ROOT_KEY"):
        authenticator_from_settings(settings)
