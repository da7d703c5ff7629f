"""The settings of the gateway's own identity towards its upstreams: the key it signs callers' identities with, the
address browsers reach it at, and the key users' upstream grants are stored encrypted with.

A part of ``Settings`` (it inherits this class), beside the governance settings, so settings.py stays about the
daemon, its clients and its stores. The upstreams' ``"auth"`` specs themselves are upstream_auth_spec.py's.
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings

from satgate_mcp.addresses import is_loopback_host, secure_url_problem
from satgate_mcp.upstream.signing import SigningKey

#: One credential key: 32 bytes written as 64 hex characters.
_CREDENTIAL_KEY = re.compile(r"[0-9a-fA-F]{64}")


def credential_keys(value: str) -> list[bytes]:
    """The keys of a comma list, first (the one that encrypts) first; ValueError naming the bad entry's position."""
    keys = []
    for position, entry in enumerate((e.strip() for e in value.split(",")), start=1):
        if not _CREDENTIAL_KEY.fullmatch(entry):
            raise ValueError(f"entry {position} is not 32 bytes as 64 hex characters (make one with "
                             "`python3 -c 'import secrets; print(secrets.token_hex(32))'`)")
        keys.append(bytes.fromhex(entry))
    return keys


def url_origin(url: str) -> str | None:
    """``scheme://host[:port]`` of an absolute URL, None for anything else."""
    parts = urlsplit(url.strip())
    return f"{parts.scheme}://{parts.netloc}" if parts.scheme in ("http", "https") and parts.netloc else None


class IdentitySettings(BaseSettings):
    """What ``"forward_identity": true`` signs with (its public half at ``/.well-known/jwks.json``), and what
    ``"oauth_user"`` upstreams need: the gateway's public address and the key their grants are sealed with."""

    identity_key: SecretStr | None = Field(
        default=None,
        description="PEM private key (Ed25519 or RSA), inline or a path to a file, that signs the identity JWT an "
                    'upstream with `"forward_identity": true` gets in `X-Satgate-Identity`; its public half is '
                    "served at `/.well-known/jwks.json`.")
    public_url: str | None = Field(
        default=None,
        description="The address users' browsers reach this gateway at (scheme, host, port, optional path prefix): "
                    '`"oauth_user"` upstreams send them back to `/oauth/callback/<upstream>` under it. Default: '
                    "the origin of `SATGATE_OAUTH_AUDIENCE` in oauth mode, else the calling request's Host when "
                    "the gateway listens on loopback.")
    credential_key: SecretStr | None = Field(
        default=None,
        description='Encrypts the refresh tokens users grant `"oauth_user"` upstreams (AES-GCM): 32 random bytes '
                    "as 64 hex characters; a comma list rotates (the first encrypts, every one decrypts).")

    @field_validator("identity_key")
    @classmethod
    def _loads(cls, value: SecretStr | None) -> SecretStr | None:
        """Loaded once now, so a wrong key stops the start with one line instead of failing every call."""
        if value is not None and value.get_secret_value().strip():
            SigningKey.load(value.get_secret_value())
            return value
        return None

    @field_validator("public_url")
    @classmethod
    def _public_url(cls, value: str | None) -> str | None:
        if value is None or not value.strip():
            return None
        parts = urlsplit(value.strip())
        if parts.scheme not in ("http", "https") or not parts.hostname or parts.query or parts.fragment:
            raise ValueError("must be an absolute http(s) URL without query or fragment, e.g. "
                             "https://gateway.example.com")
        if problem := secure_url_problem(value):
            raise ValueError(f"{problem}: authorization codes travel to it")
        return value.strip().rstrip("/")

    @field_validator("credential_key")
    @classmethod
    def _credential_key(cls, value: SecretStr | None) -> SecretStr | None:
        if value is None or not value.get_secret_value().strip():
            return None
        credential_keys(value.get_secret_value())
        return value

    @property
    def identity_signing_key(self) -> SigningKey | None:
        return SigningKey.load(self.identity_key.get_secret_value()) if self.identity_key is not None else None

    @property
    def credential_key_list(self) -> list[bytes]:
        """The credential keys, the encrypting one first; empty when none is set."""
        return credential_keys(self.credential_key.get_secret_value()) if self.credential_key is not None else []

    def public_base(self, auth_mode: str, audiences: list[str]) -> str | None:
        """Where browsers come back to, when the settings say (None: the request's Host, on loopback only)."""
        if self.public_url:
            return self.public_url
        if auth_mode == "oauth" and audiences:
            return url_origin(audiences[0])
        return None

    def public_url_known(self, auth_mode: str, audiences: list[str], host: str) -> bool:
        return self.public_base(auth_mode, audiences) is not None or is_loopback_host(host)
