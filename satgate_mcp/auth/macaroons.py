"""Macaroon bearer tokens: identity in the signed identifier, restrictions in first-party caveats.

The identifier (token_identifier.py) is versioned JSON (``{"v":1,"token_id":...}``) chosen by whoever
holds the root key; changing a byte of it breaks the signature, so no holder can re-point a token at
another id, budget or tenant. Caveats (caveats.py) can only be appended, and each one only restricts; an
unknown or third-party caveat fails verification (fail closed).

Anyone can mint a macaroon with a key of their own, so nothing a token says is interpreted before its
signature checks out, and what checking it may cost is bounded up front: token length, caveat count,
identifier and predicate sizes. Predicates are split with plain string methods (no regular expression
can backtrack on them).
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from pymacaroons import Macaroon, Verifier
from pymacaroons.macaroon import MACAROON_V2

from satgate_mcp.auth.base import Identity, TokenExpired, TokenInvalid
from satgate_mcp.auth.caveats import (
    Caveat,
    Restrictions,
    combine_caveats,
    format_caveat,
    parse_caveat,
    predicate_limit,
    restriction_caveats,
)
from satgate_mcp.auth.revocation import check_token_id
from satgate_mcp.auth.token_identifier import (
    MAX_CHAIN,
    MAX_IDENTIFIER_BYTES,
    TokenIdentifier,
    decode_identifier,
    encode_identifier,
)
from satgate_mcp.policy.controls import Controls, controls_json

LOCATION = "satgate-mcp"
#: Longer bearers are refused before any parsing: a real token is a few hundred characters.
MAX_TOKEN_CHARS = 8192
MAX_CAVEATS = 64


# --- parsing, minting, verifying -----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RawToken:
    """A token's structure before anything in it is believed: bounded in size, not yet interpreted."""

    macaroon: Any
    identifier: bytes
    predicates: tuple[bytes, ...]


@dataclass(frozen=True, slots=True)
class ParsedToken:
    macaroon: Any
    identifier: TokenIdentifier
    predicates: tuple[str, ...]


def _deserialize(token: str) -> Any:
    if not token or len(token) > MAX_TOKEN_CHARS or not token.isascii():
        raise TokenInvalid("malformed token")
    try:
        mac = Macaroon.deserialize(token)
        canonical = mac.serialize()
    except Exception:  # pymacaroons raises anything from IndexError to binascii.Error on garbage
        raise TokenInvalid("malformed token") from None
    # Loose base64 decoding accepts trailing junk; one credential must have one spelling, since sessions
    # are bound to the exact bearer string.
    if canonical != token:
        raise TokenInvalid("malformed token")
    return mac


def raw_token(token: str) -> RawToken:
    """Structure only, bounded: the identifier and predicate bytes, none of them interpreted yet."""
    mac = _deserialize(token)
    identifier = bytes(mac.identifier_bytes)
    if len(identifier) > MAX_IDENTIFIER_BYTES:
        raise TokenInvalid("identifier too long")
    if len(mac.caveats) > MAX_CAVEATS:
        raise TokenInvalid("too many caveats")
    predicates = []
    for caveat in mac.caveats:
        if caveat.third_party():
            raise TokenInvalid("third-party caveats are not supported")
        predicate = bytes(caveat.caveat_id_bytes)
        if len(predicate) > predicate_limit(predicate):
            raise TokenInvalid("caveat too long")
        predicates.append(predicate)
    return RawToken(mac, identifier, tuple(predicates))


def _decode_predicates(raw: RawToken) -> tuple[str, ...]:
    try:
        return tuple(p.decode("utf-8") for p in raw.predicates)
    except UnicodeDecodeError:
        raise TokenInvalid("malformed caveat") from None


def parse_token(token: str) -> ParsedToken:
    """Structure only, no key: identifier and caveat predicates, without judging the caveats.

    Nothing here is verified: the gateway itself calls ``verify_signature``, which interprets a token
    only after its signature checks out; this is for holders (``narrow``) and operators (``inspect``).
    """
    raw = raw_token(token)
    return ParsedToken(raw.macaroon, decode_identifier(raw.identifier), _decode_predicates(raw))


def _root_key_bytes(root_key: str) -> bytes:
    if not root_key:
        raise ValueError("the root key must not be empty")
    return root_key.encode("utf-8")


#: ``reason`` of a well-formed token whose HMAC chain does not verify under this gateway's root key.
SIGNATURE_MISMATCH = "signature_mismatch"
#: Logged with it: the usual cause is a deployment whose processes (or whose minting host) hold different keys.
SIGNATURE_MISMATCH_HINT = ("the token's signature does not verify under this gateway's SATGATE_ROOT_KEY: it was "
                           "minted with another root key, or altered; every gateway process (and `satgate-mcp "
                           "token mint`) must share one SATGATE_ROOT_KEY")


def _check_signature(root_key: str, raw: RawToken) -> None:
    verifier = Verifier()
    verifier.satisfy_general(lambda _predicate: True)  # the HMAC chain only: caveats are judged after it
    try:
        verifier.verify(raw.macaroon, _root_key_bytes(root_key))
    except Exception:
        raise TokenInvalid(SIGNATURE_MISMATCH, hint=SIGNATURE_MISMATCH_HINT) from None


def identity_from(identifier: TokenIdentifier, predicates: Sequence[str], limits: Restrictions) -> Identity:
    return Identity(
        token_id=identifier.token_id,
        budget_id=identifier.budget_id,
        tenant=identifier.tenant,
        tool_filters=limits.tool_filters,
        expires_at=limits.expires_at,
        budget_limit=limits.budget_limit,
        parent_id=identifier.parent_id,
        depth=identifier.depth,
        caveats=tuple(predicates),
        ancestors=identifier.ancestors,
        max_depth=limits.max_depth,
        resource_filters=limits.resource_filters,
        prompt_filters=limits.prompt_filters,
        admin=identifier.admin,
        controls=limits.controls,
    )


def verify_signature(root_key: str, token: str) -> Identity:
    """Everything that does not depend on time: structure, known caveats, signature, depth cap.

    Its result may be cached; ``check_expiry`` must still run against the clock on every use. The
    signature is checked before the identifier or any caveat is interpreted: a stranger's token costs
    one bounded HMAC chain, whatever it says.
    """
    raw = raw_token(token)
    _check_signature(root_key, raw)
    identifier = decode_identifier(raw.identifier)
    predicates = _decode_predicates(raw)
    limits = combine_caveats(parse_caveat(p) for p in predicates)
    if limits.max_depth is not None and identifier.depth > limits.max_depth:
        raise TokenInvalid("delegation depth exceeds the token's depth caveat")
    return identity_from(identifier, predicates, limits)


def is_expired(identity: Identity, now: float) -> bool:
    return identity.expires_at is not None and now >= identity.expires_at


def verify_token(root_key: str, token: str, *, now: float) -> Identity:
    """The verified identity, or TokenInvalid / TokenExpired (a bad signature wins over expiry)."""
    identity = verify_signature(root_key, token)
    if is_expired(identity, now):
        raise TokenExpired("token expired")
    return identity


def _delegation_chain(parent_id: str | None, ancestors: Sequence[str]) -> tuple[str, ...]:
    """Root first, direct parent last; ``ancestors`` may or may not already end with ``parent_id``."""
    chain = tuple(ancestors)
    if parent_id is not None and (not chain or chain[-1] != parent_id):
        chain += (parent_id,)
    return chain


def mint_token(
    root_key: str,
    token_id: str,
    *,
    ttl: float | None = None,
    tools: Sequence[str] | None = None,
    budget_id: str | None = None,
    budget_limit: float | None = None,
    tenant: str | None = None,
    parent_id: str | None = None,
    depth: int = 0,
    now: float | None = None,
    ancestors: Sequence[str] = (),
    max_depth: int | None = None,
    resources: Sequence[str] | None = None,
    prompts: Sequence[str] | None = None,
    admin: bool = False,
    controls: Controls | Sequence[Controls] | None = None,
) -> str:
    """A new bearer token signed with ``root_key``; ``admin`` also opens the operator console.

    For delegation pass the parent's chain so revoking any ancestor revokes the child:
    ``mint_token(key, child_id, parent_id=parent.token_id, ancestors=parent.ancestors,
    depth=parent.depth + 1, controls=parent.controls, ...)``. Without ``ancestors`` only the direct parent is
    recorded; ``controls`` takes one set or several (a child keeps every one of its parent's).
    The key's length is checked where it is read (``Settings``; the CLI for ``token mint``).
    """
    if ttl is not None and not (math.isfinite(ttl) and ttl > 0):
        raise ValueError("ttl must be a positive number of seconds")
    check_token_id(token_id)
    for value in (budget_id, tenant, parent_id, *ancestors):
        if value is not None:
            check_token_id(value)
    chain = _delegation_chain(parent_id, ancestors)
    if depth == 0 and chain:
        depth = len(chain)
    if not 0 <= depth <= MAX_CHAIN or len(chain) > MAX_CHAIN:
        raise ValueError(f"delegation depth must be between 0 and {MAX_CHAIN}")
    issued = time.time() if now is None else now
    identifier = TokenIdentifier(token_id, budget_id, tenant, chain, depth, int(issued), admin)
    caveats = restriction_caveats(
        expires_at=None if ttl is None else issued + ttl, tools=tools, budget_limit=budget_limit,
        max_depth=max_depth, resources=resources, prompts=prompts, controls=controls,
    )
    mac = Macaroon(
        location=LOCATION, identifier=encode_identifier(identifier), key=_root_key_bytes(root_key),
        version=MACAROON_V2,
    )
    for caveat in caveats:
        mac.add_first_party_caveat(format_caveat(caveat))
    return str(mac.serialize())


def add_caveats(
    token: str,
    *,
    ttl: float | None = None,
    expires_at: float | None = None,
    tools: Sequence[str] | None = None,
    budget_limit: float | None = None,
    max_depth: int | None = None,
    now: float | None = None,
    resources: Sequence[str] | None = None,
    prompts: Sequence[str] | None = None,
    controls: Controls | None = None,
) -> str:
    """Holder-side narrowing, no root key needed: the returned token is the old one plus caveats.

    A new caveat can only restrict (earliest expiry, intersected tools, lowest limit), so
    narrowing never widens what the original token may do.
    """
    if ttl is not None:
        if not (math.isfinite(ttl) and ttl > 0):
            raise ValueError("ttl must be a positive number of seconds")
        ttl_expiry = (time.time() if now is None else now) + ttl
        expires_at = ttl_expiry if expires_at is None else min(expires_at, ttl_expiry)
    caveats = restriction_caveats(expires_at=expires_at, tools=tools, budget_limit=budget_limit,
                                  max_depth=max_depth, resources=resources, prompts=prompts, controls=controls)
    mac = parse_token(token).macaroon
    for caveat in caveats:
        mac.add_first_party_caveat(format_caveat(caveat))
    return str(mac.serialize())


def _utc(ts: float) -> str:
    try:
        return datetime.fromtimestamp(ts, tz=UTC).isoformat(timespec="seconds")
    except (OverflowError, OSError, ValueError):
        return "out of range"


def inspect_token(token: str, *, now: float | None = None) -> dict[str, Any]:
    """Identity and caveats as plain data, without the key (so nothing here is verified).

    Raises TokenInvalid only when the token cannot be parsed at all; unknown caveats are
    listed under ``unknown_caveats`` (such a token will never verify).
    """
    parsed = parse_token(token)
    known: list[Caveat] = []
    unknown: list[str] = []
    for predicate in parsed.predicates:
        try:
            known.append(parse_caveat(predicate))
        except TokenInvalid:
            unknown.append(predicate)
    limits = combine_caveats(known)
    ident = parsed.identifier
    info: dict[str, Any] = {
        "token_id": ident.token_id,
        "budget_id": ident.budget_id,
        "tenant": ident.tenant,
        "parent_id": ident.parent_id,
        "ancestors": list(ident.ancestors),
        "depth": ident.depth,
        "issued_at": ident.issued_at,
        "admin": ident.admin,
        "location": str(parsed.macaroon.location),
        "caveats": list(parsed.predicates),
        "unknown_caveats": unknown,
        "restrictions": {
            "expires_at": limits.expires_at,
            "expires_at_utc": None if limits.expires_at is None else _utc(limits.expires_at),
            "tools": [list(f) for f in limits.tool_filters],
            "resources": [list(f) for f in limits.resource_filters],
            "prompts": [list(f) for f in limits.prompt_filters],
            "budget_limit": limits.budget_limit,
            "max_depth": limits.max_depth,
            "controls": [controls_json(c) for c in limits.controls],
        },
    }
    if now is not None:
        info["expired"] = limits.expires_at is not None and now >= limits.expires_at
    return info


__all__ = [
    "SIGNATURE_MISMATCH",
    "SIGNATURE_MISMATCH_HINT",
    "add_caveats",
    "inspect_token",
    "mint_token",
    "parse_token",
    "verify_signature",
    "verify_token",
]
