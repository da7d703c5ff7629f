"""A macaroon's signed identifier: who the token is, as strict, versioned JSON (``{"v":1,"token_id":...}``).

Apart from the token's structure and signature (macaroons.py) because this is the format the root key
holder signs: changing a byte of it breaks every token, and decoding refuses anything unexpected rather
than half-understand it. Only ever decoded after the signature checks out.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from satgate_mcp.auth.base import TokenInvalid
from satgate_mcp.auth.revocation import is_valid_token_id

IDENTIFIER_VERSION = 1
MAX_CHAIN = 32
#: The signed identifier (a flat JSON object: ids, a chain of at most MAX_CHAIN ids, two integers).
MAX_IDENTIFIER_BYTES = 6144

_IDENTIFIER_FIELDS = frozenset({"v", "token_id", "budget_id", "tenant", "ancestors", "depth", "issued_at", "admin"})


@dataclass(frozen=True, slots=True)
class TokenIdentifier:
    """What the root key holder said about the token; signed, never changed by a holder."""

    token_id: str
    budget_id: str | None = None
    tenant: str | None = None
    #: Root of the delegation chain first, the direct parent last.
    ancestors: tuple[str, ...] = ()
    depth: int = 0
    issued_at: int | None = None
    #: The operator console's credential (``token mint --admin``). Here, never a caveat: a holder can append a
    #: caveat to any token, only the root key holder can write the identifier.
    admin: bool = False

    @property
    def parent_id(self) -> str | None:
        return self.ancestors[-1] if self.ancestors else None


def encode_identifier(ident: TokenIdentifier) -> bytes:
    body: dict[str, Any] = {"v": IDENTIFIER_VERSION, "token_id": ident.token_id}
    if ident.budget_id is not None:
        body["budget_id"] = ident.budget_id
    if ident.tenant is not None:
        body["tenant"] = ident.tenant
    if ident.ancestors:
        body["ancestors"] = list(ident.ancestors)
    if ident.depth:
        body["depth"] = ident.depth
    if ident.issued_at is not None:
        body["issued_at"] = ident.issued_at
    if ident.admin:
        body["admin"] = True
    return json.dumps(body, separators=(",", ":")).encode("utf-8")


def _opt_id(body: dict[str, Any], key: str) -> str | None:
    value = body.get(key)
    if value is None:
        return None
    if not isinstance(value, str) or not is_valid_token_id(value):
        raise TokenInvalid(f"malformed identifier field {key}")
    return value


def decode_identifier(raw: bytes) -> TokenIdentifier:
    """Strict: an unknown version or field is refused rather than half-understood."""
    # A valid identifier is one flat object with at most one list (ids hold no brackets): anything nested
    # deeper is refused before the JSON parser could recurse on it.
    if len(raw) > MAX_IDENTIFIER_BYTES or raw.count(b"{") > 1 or raw.count(b"[") > 1:
        raise TokenInvalid("malformed identifier")
    try:
        body = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise TokenInvalid("malformed identifier") from None
    if not isinstance(body, dict) or body.get("v") != IDENTIFIER_VERSION or not body.keys() <= _IDENTIFIER_FIELDS:
        raise TokenInvalid("unsupported identifier")
    token_id = _opt_id(body, "token_id")
    if token_id is None:
        raise TokenInvalid("identifier has no token id")
    ancestors = body.get("ancestors", [])
    if (
        not isinstance(ancestors, list)
        or len(ancestors) > MAX_CHAIN
        or not all(isinstance(a, str) and is_valid_token_id(a) for a in ancestors)
    ):
        raise TokenInvalid("malformed identifier field ancestors")
    depth = body.get("depth", 0)
    if type(depth) is not int or not 0 <= depth <= MAX_CHAIN:
        raise TokenInvalid("malformed identifier field depth")
    issued_at = body.get("issued_at")
    if issued_at is not None and type(issued_at) is not int:
        raise TokenInvalid("malformed identifier field issued_at")
    if body.get("admin", True) is not True:  # present means true: no other spelling is signed, none is accepted
        raise TokenInvalid("malformed identifier field admin")
    return TokenIdentifier(
        token_id=token_id,
        budget_id=_opt_id(body, "budget_id"),
        tenant=_opt_id(body, "tenant"),
        ancestors=tuple(ancestors),
        depth=depth,
        issued_at=issued_at,
        admin="admin" in body,
    )
