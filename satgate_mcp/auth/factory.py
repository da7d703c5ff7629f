"""The authenticator for ``SATGATE_AUTH_MODE``: the one place that maps a mode to a class."""

from __future__ import annotations

import time
from collections.abc import Callable

from satgate_mcp.auth.base import NoAuthenticator, OwnedAuthenticator, StaticTokenAuthenticator
from satgate_mcp.auth.header import MacaroonAuthenticator
from satgate_mcp.auth.oauth import JwtAuthenticator, OAuthPolicy
from satgate_mcp.auth.revocation import RevocationStore
from satgate_mcp.errors import ConfigError
from satgate_mcp.settings import Settings
from satgate_mcp.stores import Stores, configured_revocations


def authenticator_from_settings(
    settings: Settings,
    *,
    clock: Callable[[], float] = time.time,
    revocations: RevocationStore | None = None,
    stores: Stores | None = None,
) -> OwnedAuthenticator:
    """The revocations checked are ``revocations`` if given (tests), else those of ``stores`` (the app's),
    else the file or Redis the settings name (in memory when neither)."""
    if settings.auth_mode == "none":
        return NoAuthenticator()
    if settings.auth_mode == "config":
        if settings.static_token is None or not settings.static_token.get_secret_value():
            raise ConfigError("SATGATE_STATIC_TOKEN is required when SATGATE_AUTH_MODE=config")
        return StaticTokenAuthenticator(settings.static_token.get_secret_value())
    fail_open = settings.store_fail_mode == "open"
    if revocations is None:
        revocations = stores.revocations if stores is not None else configured_revocations(settings)
    store = revocations
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
