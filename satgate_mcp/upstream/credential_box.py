"""Users' refresh tokens (and PKCE verifiers) sealed for the state store: AES-256-GCM under SATGATE_CREDENTIAL_KEY.

The associated data binds a sealed value to what it is for (its purpose, the owner and the upstream), so a
ciphertext copied onto another owner's row, or another upstream's, does not open, and neither does one changed by
a single bit. Keys rotate: the first of ``SATGATE_CREDENTIAL_KEY`` seals, every one opens (a sealed value names
its key by a short fingerprint, so opening tries one). Nothing here logs or echoes a value.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
from collections.abc import Sequence

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

VERSION = "v1"
NONCE_BYTES = 12


class Unreadable(Exception):
    """A sealed value that does not open: tampered, bound to another owner or upstream, or sealed with a key no
    longer configured."""


def key_id(key: bytes) -> str:
    """A key's public fingerprint: which key sealed a value, without saying anything about the key."""
    return hashlib.sha256(b"satgate-mcp credential key\0" + key).hexdigest()[:8]


def associated_data(purpose: str, owner: str, upstream: str) -> bytes:
    return json.dumps(["satgate-mcp", VERSION, purpose, owner, upstream], separators=(",", ":")).encode("utf-8")


class CredentialBox:
    """Seals and opens with the configured keys (the first seals)."""

    def __init__(self, keys: Sequence[bytes]) -> None:
        if not keys or any(len(k) != 32 for k in keys):
            raise ValueError("credential keys are 32 bytes each, at least one")
        self._sealing = keys[0]
        self._keys = {key_id(k): AESGCM(k) for k in reversed(keys)}  # the first wins a fingerprint clash

    def seal(self, plaintext: str, *, purpose: str, owner: str, upstream: str) -> str:
        nonce = os.urandom(NONCE_BYTES)
        sealed = AESGCM(self._sealing).encrypt(nonce, plaintext.encode("utf-8"),
                                               associated_data(purpose, owner, upstream))
        encoded = base64.urlsafe_b64encode(nonce + sealed).decode("ascii").rstrip("=")
        return f"{VERSION}.{key_id(self._sealing)}.{encoded}"

    def open(self, sealed: str, *, purpose: str, owner: str, upstream: str) -> str:
        parts = sealed.split(".")
        if len(parts) != 3 or parts[0] != VERSION:
            raise Unreadable("not a sealed credential")
        cipher = self._keys.get(parts[1])
        if cipher is None:
            raise Unreadable("sealed with a key SATGATE_CREDENTIAL_KEY no longer lists")
        try:
            raw = base64.urlsafe_b64decode(parts[2] + "=" * (-len(parts[2]) % 4))
            opened = cipher.decrypt(raw[:NONCE_BYTES], raw[NONCE_BYTES:], associated_data(purpose, owner, upstream))
        except (binascii.Error, ValueError, InvalidTag):
            raise Unreadable("does not open: changed, or bound to another owner or upstream") from None
        return opened.decode("utf-8")
