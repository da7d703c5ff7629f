"""The authenticator for ``SATGATE_AUTH_MODE``: the one place that maps a mode to a class."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from satgate_mcp.auth.base import Authenticator, NoAuthenticator, StaticTokenAuthenticator
from satgate_mcp.auth.header import MacaroonAuthenticator
from satgate_mcp.auth.oauth import JwtAuthenticator, OAuthPolicy
from satgate_mcp.auth.revocation import RevocationStore, revocation_store_from_settings
from satgate_mcp.errors import ConfigError
from satgate_mcp.settings import Settings

if TYPE_CHECKING:
    from satgate_mcp.state import LocalState


def authenticator_from_settings(
    settings: Settings,
    *,
    clock: Callable[[], float] = time.time,
    revocations: RevocationStore | None = None,
    state: LocalState | None = None,
) -> Authenticator:
    """``revocations`` overrides the store the settings name (tests, or a store the app already owns);
    ``state`` adds the state folder's revocations (what ``token revoke`` writes with nothing configured)."""
    if settings.auth_mode == "none":
        return NoAuthenticator()
    if settings.auth_mode == "config":
        if settings.static_token is None or not settings.static_token.get_secret_value():
            raise ConfigError("SATGATE_STATIC_TOKEN is required when SATGATE_AUTH_MODE=config")
        return StaticTokenAuthenticator(settings.static_token.get_secret_value())
    fail_open = settings.store_fail_mode == "open"
    store = revocations if revocations is not None else _revocations(settings, state)
    if settings.auth_mode == "header":
        if settings.root_key is None:  # Settings refuses a missing or short key; model_construct skips that
            raise ConfigError("SATGATE_ROOT_KEY is required when SATGATE_AUTH_MODE=header")
        key = settings.root_key.get_secret_value()
        return MacaroonAuthenticator(key, store, clock=clock, fail_open=fail_open)
    if settings.auth_mode == "oauth":
        if not settings.oauth_issuer or not settings.oauth_audience:  # Settings refuses these; model_construct not
            raise ConfigError("SATGATE_OAUTH_ISSUER and SATGATE_OAUTH_AUDIENCE are required when "
                              "SATGATE_AUTH_MODE=oauth")
        policy = OAuthPolicy(issuer=settings.oauth_issuer, audiences=tuple(settings.oauth_audience),
                             jwks_url=settings.oauth_jwks_url, id_claim=settings.oauth_id_claim,
                             budget_claim=settings.oauth_budget_claim,
                             tool_scopes=dict(settings.oauth_tool_scopes) or None)
        return JwtAuthenticator(policy, store, fail_open=fail_open, clock=clock)
    raise ConfigError(f"unknown SATGATE_AUTH_MODE {settings.auth_mode!r}")  # pragma: no cover


def _revocations(settings: Settings, state: LocalState | None) -> RevocationStore:
    try:
        revocations = revocation_store_from_settings(settings)
    except ValueError as exc:  # a directory for a file, a malformed SATGATE_REDIS_URL
        raise ConfigError(str(exc)) from None
    return state.revocations_with(revocations) if state is not None else revocations
