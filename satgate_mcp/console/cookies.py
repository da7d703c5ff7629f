"""The console's session cookie: the admin's credential sealed (AES-GCM) so any gateway process can open it.

Sealing the credential itself, rather than naming a session kept in one process's memory, lets a login on one
process serve a request that ``SO_REUSEPORT`` hands to another, and makes every request check the credential
again as ``/mcp`` would: a revoked or expired token ends its console session at once. The key is derived from
the secret every process shares (the root key, ``SATGATE_STATE_KEY``, the console secret); with none, from a
random one of this process (a login then holds on this process only).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import secrets
from collections.abc import Sequence
from dataclasses import dataclass

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

#: Bound before any decryption: a real cookie is a few hundred bytes (a long OAuth token a few thousand).
MAX_COOKIE_CHARS = 12_000
_CONTEXT = b"satgate-mcp console cookie v1\x00"


def cookie_keys(shared: Sequence[str]) -> list[bytes]:
    """One AES-256 key per shared secret (the first seals, all open: a rotation keeps logins); else a random one."""
    found = [hashlib.sha256(_CONTEXT + secret.encode("utf-8")).digest() for secret in shared if secret]
    return found or [secrets.token_bytes(32)]


@dataclass(frozen=True, slots=True)
class Sealed:
    """What a console cookie holds: the credential (empty in the open mode), its CSRF token, its expiry."""

    credential: str
    csrf: str
    expires: float


def seal(keys: Sequence[bytes], sealed: Sealed) -> str:
    nonce = secrets.token_bytes(12)
    body = json.dumps({"t": sealed.credential, "c": sealed.csrf, "e": sealed.expires}).encode()
    return base64.urlsafe_b64encode(nonce + AESGCM(keys[0]).encrypt(nonce, body, _CONTEXT)).decode().rstrip("=")


def open_cookie(keys: Sequence[bytes], value: str | None, *, now: float) -> Sealed | None:
    """The cookie's content; None when absent, malformed, forged, sealed under another key, or expired."""
    if not value or len(value) > MAX_COOKIE_CHARS or not value.isascii():
        return None
    try:
        raw = base64.urlsafe_b64decode(value + "=" * (-len(value) % 4))
    except (binascii.Error, ValueError):
        return None
    if len(raw) < 12 + 16:
        return None
    for key in keys:
        try:
            body = json.loads(AESGCM(key).decrypt(raw[:12], raw[12:], _CONTEXT))
        except (InvalidTag, ValueError):
            continue
        return _valid(body, now)
    return None


def _valid(body: object, now: float) -> Sealed | None:
    if not isinstance(body, dict):
        return None
    credential, csrf, expires = body.get("t"), body.get("c"), body.get("e")
    if not isinstance(credential, str) or not isinstance(csrf, str) or not isinstance(expires, int | float):
        return None
    if now >= expires:
        return None
    return Sealed(credential, csrf, float(expires))


def new_csrf() -> str:
    return secrets.token_urlsafe(24)

