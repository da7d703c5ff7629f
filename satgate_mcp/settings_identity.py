"""The settings of the gateway's own identity towards its upstreams: the key it signs callers' identities with.

A part of ``Settings`` (it inherits this class), beside the governance settings, so settings.py stays about the
daemon, its clients and its stores. The upstreams' ``"auth"`` specs themselves are upstream_auth_spec.py's.
"""

from __future__ import annotations

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings

from satgate_mcp.upstream.signing import SigningKey


class IdentitySettings(BaseSettings):
    """What ``"forward_identity": true`` signs with, and ``/.well-known/jwks.json`` publishes the public half of."""

    identity_key: SecretStr | None = Field(
        default=None,
        description="PEM private key (Ed25519 or RSA), inline or a path to a file, that signs the identity JWT an "
                    'upstream with `"forward_identity": true` gets in `X-Satgate-Identity`; its public half is '
                    "served at `/.well-known/jwks.json`.")

    @field_validator("identity_key")
    @classmethod
    def _loads(cls, value: SecretStr | None) -> SecretStr | None:
        """Loaded once now, so a wrong key stops the start with one line instead of failing every call."""
        if value is not None and value.get_secret_value().strip():
            SigningKey.load(value.get_secret_value())
            return value
        return None

    @property
    def identity_signing_key(self) -> SigningKey | None:
        return SigningKey.load(self.identity_key.get_secret_value()) if self.identity_key is not None else None
