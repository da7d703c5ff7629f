"""Macaroon bearer tokens: identity in the signed identifier, restrictions in first-party caveats.

The identifier is versioned JSON (``{"v":1,"token_id":...}``) chosen by whoever holds the root key;
changing a byte of it breaks the signature, so no holder can re-point a token at another id,
budget or tenant. Caveats can only be appended, and each one only restricts:

- ``expires = <unix seconds>``: the earliest of several wins;
- ``tools = a,b,prefix*``: every ``tools`` caveat must allow a tool (they intersect);
- ``resources = uri,prefix*`` and ``prompts = name,prefix*``: the same for resource URIs (and resource
  template URIs) and prompt names; absent means allowed, like ``tools``;
- ``budget_limit = <credits>``: the lowest wins;
- ``depth <= N``: the token's own delegation depth must not exceed N, and the lowest N caps
  what may be delegated from it.

Anything else (an unknown predicate, a third-party caveat, a malformed value) fails
verification: fail closed, so an older gateway never ignores a restriction it does not know.

Anyone can mint a macaroon with a key of their own, so nothing a token says is interpreted before its
signature checks out, and what checking it may cost is bounded up front: token length, caveat count,
identifier and predicate sizes. Predicates are split with plain string methods (no regular expression
can backtrack on them).
"""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import structlog
from pymacaroons import Macaroon, Verifier
from pymacaroons.macaroon import MACAROON_V2

from satgate_mcp.auth.base import AuthOutcome, Identity
from satgate_mcp.auth.revocation import check_token_id, is_valid_token_id
from satgate_mcp.patterns import PatternKind, check_pattern
from satgate_mcp.settings import MIN_ROOT_KEY_LENGTH

LOCATION = "satgate-mcp"
IDENTIFIER_VERSION = 1
#: Longer bearers are refused before any parsing: a real token is a few hundred characters.
MAX_TOKEN_CHARS = 8192
MAX_CAVEATS = 64
MAX_CHAIN = 32
#: Patterns in one ``tools``, ``resources`` or ``prompts`` caveat (their grammar: satgate_mcp/patterns.py).
MAX_PATTERNS = 256
#: One caveat predicate, in bytes: a real one is a few dozen; a longer one is refused unread.
MAX_PREDICATE_BYTES = 2048
#: The signed identifier (a flat JSON object: ids, a chain of at most MAX_CHAIN ids, two integers).
MAX_IDENTIFIER_BYTES = 6144

_log = structlog.get_logger(__name__)

_NUMBER_RE = re.compile(r"\d{1,15}(?:\.\d{1,9})?")
_IDENTIFIER_FIELDS = frozenset({"v", "token_id", "budget_id", "tenant", "ancestors", "depth", "issued_at"})


class TokenError(Exception):
    """A token that cannot be used; ``outcome`` tells the authenticator which refusal it is."""

    outcome: AuthOutcome = AuthOutcome.INVALID

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class TokenInvalid(TokenError):
    """Malformed, wrong key, tampered, or carrying a caveat this gateway does not understand."""

    outcome = AuthOutcome.INVALID


class TokenExpired(TokenError):
    outcome = AuthOutcome.EXPIRED


# --- caveats -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ExpiresCaveat:
    at: float


@dataclass(frozen=True, slots=True)
class ToolsCaveat:
    patterns: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class BudgetLimitCaveat:
    limit: float


@dataclass(frozen=True, slots=True)
class DepthCaveat:
    max_depth: int


@dataclass(frozen=True, slots=True)
class ResourcesCaveat:
    patterns: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class PromptsCaveat:
    patterns: tuple[str, ...]


Caveat = ExpiresCaveat | ToolsCaveat | BudgetLimitCaveat | DepthCaveat | ResourcesCaveat | PromptsCaveat


@dataclass(frozen=True, slots=True)
class Restrictions:
    """All caveats of a token folded together; adding a caveat can only make each field narrower."""

    expires_at: float | None = None
    tool_filters: tuple[tuple[str, ...], ...] = ()
    budget_limit: float | None = None
    max_depth: int | None = None
    resource_filters: tuple[tuple[str, ...], ...] = ()
    prompt_filters: tuple[tuple[str, ...], ...] = ()


#: Caveat numbers are below this: 15 integer digits, what the caveat number parser reads back.
CAVEAT_NUMBER_LIMIT = 10**15


def _format_number(value: float) -> str:
    """The caveat text of ``value``; ValueError for anything the parser would not read back."""
    if not math.isfinite(value) or not 0 <= value < CAVEAT_NUMBER_LIMIT:
        raise ValueError(f"expected a finite number from 0 to below {CAVEAT_NUMBER_LIMIT:.0e}, got {value!r}")
    if float(value).is_integer():
        return str(int(value))
    return f"{value:.6f}".rstrip("0").rstrip(".")


def _caveat_float(value: float) -> float:
    """``float(value)``, but ValueError (not OverflowError) for an integer too big for any caveat."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= CAVEAT_NUMBER_LIMIT:
        raise ValueError(f"expected a number below {CAVEAT_NUMBER_LIMIT:.0e}, got {str(value)[:20]}...")
    return float(value)


def _parse_number(text: str) -> float:
    if not _NUMBER_RE.fullmatch(text):
        raise TokenInvalid("malformed number in caveat")
    return float(text)


def check_patterns(patterns: Iterable[str], kind: PatternKind) -> tuple[str, ...]:
    """Patterns for a ``tools``, ``resources`` or ``prompts`` caveat, stripped; ValueError otherwise.

    An empty list is allowed: such a caveat allows nothing (a delegated child of disjoint filters).
    """
    cleaned = tuple(p.strip() for p in patterns)
    if len(cleaned) > MAX_PATTERNS:
        raise ValueError(f"at most {MAX_PATTERNS} {kind} patterns")
    for pattern in cleaned:
        check_pattern(pattern, kind)
    return cleaned


def _format_predicate(caveat: Caveat) -> str:
    match caveat:
        case ExpiresCaveat(at):
            return f"expires = {_format_number(at)}"
        case ToolsCaveat(patterns):
            return f"tools = {','.join(check_patterns(patterns, PatternKind.TOOL))}"
        case BudgetLimitCaveat(limit):
            return f"budget_limit = {_format_number(limit)}"
        case DepthCaveat(max_depth):
            return f"depth <= {int(max_depth)}"
        case ResourcesCaveat(patterns):
            return f"resources = {','.join(check_patterns(patterns, PatternKind.RESOURCE))}"
        case PromptsCaveat(patterns):
            return f"prompts = {','.join(check_patterns(patterns, PatternKind.PROMPT))}"
    raise TypeError(f"not a caveat: {caveat!r}")  # pragma: no cover


def format_caveat(caveat: Caveat) -> str:
    """The predicate for ``caveat``; ValueError for one no gateway would accept (so none is ever signed)."""
    predicate = _format_predicate(caveat)
    if len(predicate.encode("utf-8")) > MAX_PREDICATE_BYTES:
        raise ValueError(f"caveat too long: at most {MAX_PREDICATE_BYTES} bytes per caveat")
    return predicate


#: (key, operator) -> what the value must be.
_CAVEAT_KEYS = frozenset({("expires", "="), ("budget_limit", "="), ("depth", "<="), ("tools", "="),
                          ("resources", "="), ("prompts", "=")})


def split_predicate(predicate: str) -> tuple[str, str, str]:
    """``key op value`` around the first operator, spaces stripped; linear, refuses control characters."""
    if len(predicate) > MAX_PREDICATE_BYTES:
        raise TokenInvalid("caveat too long")
    if not predicate.isprintable():  # newlines, tabs, NUL, other control and separator characters
        raise TokenInvalid("control characters in caveat")
    at = predicate.find("=")
    if at < 0:
        raise TokenInvalid("unknown caveat")
    op_start = at - 1 if at > 0 and predicate[at - 1] == "<" else at
    key = predicate[:op_start].strip(" ")
    op = predicate[op_start:at + 1]
    return key, op, predicate[at + 1:].strip(" ")


def _patterns(value: str) -> tuple[str, ...]:
    return tuple(p.strip(" ") for p in value.split(",")) if value else ()


def parse_caveat(predicate: str) -> Caveat:
    """The caveat a predicate states, or TokenInvalid for anything this gateway does not know."""
    key, op, value = split_predicate(predicate)
    if (key, op) not in _CAVEAT_KEYS:
        raise TokenInvalid("unknown caveat")
    if key in ("expires", "budget_limit", "depth") and not value.isascii():
        # ASCII digits only: str.isdigit() also accepts superscripts such as "²", which int() refuses.
        raise TokenInvalid(f"malformed number in {key} caveat")
    if key == "expires":
        return ExpiresCaveat(_parse_number(value))
    if key == "budget_limit":
        return BudgetLimitCaveat(_parse_number(value))
    if key == "depth":
        if not (value.isdigit() and len(value) <= 6):
            raise TokenInvalid("malformed depth caveat")
        return DepthCaveat(int(value))
    try:
        if key == "tools":
            return ToolsCaveat(check_patterns(_patterns(value), PatternKind.TOOL))
        if key == "resources":
            return ResourcesCaveat(check_patterns(_patterns(value), PatternKind.RESOURCE))
        return PromptsCaveat(check_patterns(_patterns(value), PatternKind.PROMPT))
    except ValueError:
        raise TokenInvalid(f"malformed {key} caveat") from None


def combine_caveats(caveats: Iterable[Caveat]) -> Restrictions:
    """Narrowing: earliest expiry, intersected tool/resource/prompt filters, lowest budget limit and depth cap."""
    expires: float | None = None
    tools: list[tuple[str, ...]] = []
    resources: list[tuple[str, ...]] = []
    prompts: list[tuple[str, ...]] = []
    budget: float | None = None
    depth: int | None = None
    for caveat in caveats:
        match caveat:
            case ExpiresCaveat(at):
                expires = at if expires is None else min(expires, at)
            case ToolsCaveat(patterns):
                if patterns not in tools:
                    tools.append(patterns)
            case BudgetLimitCaveat(limit):
                budget = limit if budget is None else min(budget, limit)
            case DepthCaveat(max_depth):
                depth = max_depth if depth is None else min(depth, max_depth)
            case ResourcesCaveat(patterns):
                if patterns not in resources:
                    resources.append(patterns)
            case PromptsCaveat(patterns):
                if patterns not in prompts:
                    prompts.append(patterns)
    return Restrictions(expires, tuple(tools), budget, depth, tuple(resources), tuple(prompts))


def restriction_caveats(
    *,
    expires_at: float | None = None,
    tools: Sequence[str] | None = None,
    budget_limit: float | None = None,
    max_depth: int | None = None,
    resources: Sequence[str] | None = None,
    prompts: Sequence[str] | None = None,
) -> list[Caveat]:
    if isinstance(tools, str) or isinstance(resources, str) or isinstance(prompts, str):
        raise TypeError("tools, resources and prompts must be sequences of patterns, not one string")
    caveats: list[Caveat] = []
    if expires_at is not None:
        caveats.append(ExpiresCaveat(_caveat_float(expires_at)))
    if tools is not None:
        caveats.append(ToolsCaveat(check_patterns(tools, PatternKind.TOOL)))
    if budget_limit is not None:
        caveats.append(BudgetLimitCaveat(_caveat_float(budget_limit)))
    if max_depth is not None:
        if max_depth < 0:
            raise ValueError("max_depth must be >= 0")
        caveats.append(DepthCaveat(int(max_depth)))
    if resources is not None:
        caveats.append(ResourcesCaveat(check_patterns(resources, PatternKind.RESOURCE)))
    if prompts is not None:
        caveats.append(PromptsCaveat(check_patterns(prompts, PatternKind.PROMPT)))
    for caveat in caveats:
        format_caveat(caveat)  # validates numbers before anything is signed
    return caveats


# --- identifier ----------------------------------------------------------------------------------


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
    return TokenIdentifier(
        token_id=token_id,
        budget_id=_opt_id(body, "budget_id"),
        tenant=_opt_id(body, "tenant"),
        ancestors=tuple(ancestors),
        depth=depth,
        issued_at=issued_at,
    )


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
        if len(predicate) > MAX_PREDICATE_BYTES:
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


def _check_signature(root_key: str, raw: RawToken) -> None:
    verifier = Verifier()
    verifier.satisfy_general(lambda _predicate: True)  # the HMAC chain only: caveats are judged after it
    try:
        verifier.verify(raw.macaroon, _root_key_bytes(root_key))
    except Exception:
        raise TokenInvalid("signature does not verify") from None


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
) -> str:
    """A new bearer token signed with ``root_key``.

    For delegation pass the parent's chain so revoking any ancestor revokes the child:
    ``mint_token(key, child_id, parent_id=parent.token_id, ancestors=parent.ancestors,
    depth=parent.depth + 1, ...)``. Without ``ancestors`` only the direct parent is recorded.
    """
    if len(root_key) < MIN_ROOT_KEY_LENGTH:
        raise ValueError(f"the root key must be at least {MIN_ROOT_KEY_LENGTH} characters")
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
    identifier = TokenIdentifier(token_id, budget_id, tenant, chain, depth, int(issued))
    caveats = restriction_caveats(
        expires_at=None if ttl is None else issued + ttl, tools=tools, budget_limit=budget_limit,
        max_depth=max_depth, resources=resources, prompts=prompts,
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
                                  max_depth=max_depth, resources=resources, prompts=prompts)
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
        },
    }
    if now is not None:
        info["expired"] = limits.expires_at is not None and now >= limits.expires_at
    return info


__all__ = [
    "Restrictions",
    "TokenError",
    "TokenExpired",
    "TokenIdentifier",
    "TokenInvalid",
    "add_caveats",
    "check_patterns",
    "combine_caveats",
    "format_caveat",
    "inspect_token",
    "mint_token",
    "parse_caveat",
    "split_predicate",
    "verify_signature",
    "verify_token",
]
