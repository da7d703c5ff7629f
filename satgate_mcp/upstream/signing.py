"""The gateway's signing keys: the caller's identity for upstreams, and its own client assertions.

One PEM private key, Ed25519 or RSA, given inline or as a path (the way an operator holds a key either in a
secret manager's variable or in a file). Ed25519 signs EdDSA, RSA signs RS256: what every JWT library verifies.
The public half is served as a JWK Set at ``/.well-known/jwks.json`` so an upstream verifies the identity JWT
with any JWT library, and keys rotate by ``kid`` (a digest of the public key, RFC 7638).
"""

from __future__ import annotations

import base64
import hashlib
import json
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519, rsa
from jwt.algorithms import OKPAlgorithm, RSAAlgorithm

from satgate_mcp.jsonrpc import JsonObj

JWKS_PATH = "/.well-known/jwks.json"
#: The header an upstream with ``"forward_identity": true`` finds the caller's identity JWT in.
IDENTITY_HEADER = "X-Satgate-Identity"
#: Seconds an identity JWT is valid: long enough for one call's request to arrive, too short to be worth stealing.
IDENTITY_LIFETIME = 60
#: Who signs identity JWTs: their ``iss``.
IDENTITY_ISSUER = "satgate-mcp"
MIN_RSA_BITS = 2048


def _pem_text(value: str) -> bytes:
    """The PEM itself, or read from the path ``value`` names."""
    text = value.strip()
    if "-----BEGIN" in text:
        return text.encode("ascii", "replace")
    try:
        return Path(text).expanduser().read_bytes()
    except OSError as exc:
        raise ValueError(f"is neither a PEM private key nor a readable file ({exc.strerror or exc})") from None


def _thumbprint(jwk: JsonObj) -> str:
    """RFC 7638: SHA-256 of the required members in lexical order, no whitespace."""
    required = ("crv", "kty", "x") if jwk["kty"] == "OKP" else ("e", "kty", "n")
    canonical = json.dumps({k: jwk[k] for k in required}, separators=(",", ":"), sort_keys=True)
    return base64.urlsafe_b64encode(hashlib.sha256(canonical.encode()).digest()).rstrip(b"=").decode()


@dataclass(frozen=True)
class SigningKey:
    """A private key, its algorithm and its public JWK (with ``kid``)."""

    private: ed25519.Ed25519PrivateKey | rsa.RSAPrivateKey
    algorithm: str
    kid: str

    @classmethod
    def load(cls, value: str, kid: str | None = None) -> SigningKey:
        """A key from PEM text or a path; ValueError (one line, never the key) for anything else."""
        try:
            private = serialization.load_pem_private_key(_pem_text(value), password=None)
        except (ValueError, TypeError) as exc:
            raise ValueError(f"is not an unencrypted PEM private key ({str(exc).split('.')[0][:80]})") from None
        if isinstance(private, ed25519.Ed25519PrivateKey):
            algorithm = "EdDSA"
        elif isinstance(private, rsa.RSAPrivateKey):
            if private.key_size < MIN_RSA_BITS:
                raise ValueError(f"is an RSA key of {private.key_size} bits; use at least {MIN_RSA_BITS}")
            algorithm = "RS256"
        else:
            raise ValueError(f"is a {type(private).__name__.removeprefix('_')} key; use Ed25519 or RSA")
        key = cls(private, algorithm, "")
        return cls(private, algorithm, kid or _thumbprint(key._bare_jwk()))

    def _bare_jwk(self) -> JsonObj:
        public = self.private.public_key()
        if isinstance(public, ed25519.Ed25519PublicKey):
            return dict(OKPAlgorithm.to_jwk(public, as_dict=True))
        return dict(RSAAlgorithm.to_jwk(public, as_dict=True))

    def public_jwk(self) -> JsonObj:
        return {**self._bare_jwk(), "kid": self.kid, "alg": self.algorithm, "use": "sig"}

    def sign(self, claims: JsonObj, *, typ: str = "JWT") -> str:
        return jwt.encode(claims, self.private, algorithm=self.algorithm, headers={"kid": self.kid, "typ": typ})


def jwks(keys: list[SigningKey]) -> JsonObj:
    return {"keys": [key.public_jwk() for key in keys]}


def identity_claims(*, subject: str, tenant: str | None, token_id: str, audience: str, now: float) -> JsonObj:
    """What an upstream learns about the caller: who, for which tenant, by which token, for whom it is meant."""
    issued = int(now)
    claims: dict[str, Any] = {"iss": IDENTITY_ISSUER, "sub": subject, "token_id": token_id, "aud": audience,
                              "iat": issued, "nbf": issued, "exp": issued + IDENTITY_LIFETIME,
                              "jti": secrets.token_hex(12)}
    if tenant is not None:
        claims["tenant"] = tenant
    return claims


def client_assertion_claims(client_id: str, token_endpoint: str, now: float) -> JsonObj:
    """RFC 7523 section 3 (``private_key_jwt``): the client asserts itself to the token endpoint, once."""
    issued = int(now)
    return {"iss": client_id, "sub": client_id, "aud": token_endpoint, "iat": issued, "exp": issued + 60,
            "jti": secrets.token_hex(16)}
