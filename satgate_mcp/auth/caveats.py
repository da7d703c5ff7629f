"""Caveats: the restrictions a macaroon carries, their predicate text, and how several combine.

Each caveat only restricts, so appending one can only narrow a token:

- ``expires = <unix seconds>``: the earliest of several wins;
- ``tools = a,b,prefix*``: every ``tools`` caveat must allow a tool (they intersect);
- ``resources = uri,prefix*`` and ``prompts = name,prefix*``: the same for resource URIs (and resource
  template URIs) and prompt names; absent means allowed, like ``tools``;
- ``budget_limit = <credits>``: the lowest wins;
- ``depth <= N``: the token's own delegation depth must not exceed N, and the lowest N caps
  what may be delegated from it;
- ``controls = {json}``: tool controls (policy/controls.py); every such caveat applies, so one added by a
  holder keeps the rules already there and adds its own.

Anything else (an unknown predicate, a malformed value) is TokenInvalid: fail closed, so an older
gateway never ignores a restriction it does not know. Predicates are split with plain string methods
(no regular expression can backtrack on them); pattern grammar: satgate_mcp/patterns.py.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from satgate_mcp.auth.base import TokenInvalid
from satgate_mcp.patterns import PatternKind, check_pattern
from satgate_mcp.policy.controls import Controls, canonical_text, parse_controls

#: Patterns in one ``tools``, ``resources`` or ``prompts`` caveat.
MAX_PATTERNS = 256
#: One caveat predicate, in bytes: a real one is a few dozen; a longer one is refused unread.
MAX_PREDICATE_BYTES = 2048
#: One ``controls`` caveat: rules with host lists and allowed values need more room than a pattern list. The
#: token as a whole stays bounded (macaroons.MAX_TOKEN_CHARS, about what an HTTP header may carry), and what
#: reading one costs is bounded by the entry and list counts policy/controls.py enforces.
MAX_CONTROLS_PREDICATE_BYTES = 4096
CONTROLS_KEY = "controls"


def predicate_limit(predicate: str | bytes) -> int:
    """The size bound of one predicate, in bytes: larger for a ``controls`` caveat."""
    head = predicate[:len(CONTROLS_KEY)]
    return MAX_CONTROLS_PREDICATE_BYTES if head in (CONTROLS_KEY, CONTROLS_KEY.encode()) else MAX_PREDICATE_BYTES

_NUMBER_RE = re.compile(r"\d{1,15}(?:\.\d{1,9})?")


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


@dataclass(frozen=True, slots=True)
class ControlsCaveat:
    controls: Controls


Caveat = (ExpiresCaveat | ToolsCaveat | BudgetLimitCaveat | DepthCaveat | ResourcesCaveat | PromptsCaveat
          | ControlsCaveat)


@dataclass(frozen=True, slots=True)
class Restrictions:
    """All caveats of a token folded together; adding a caveat can only make each field narrower."""

    expires_at: float | None = None
    tool_filters: tuple[tuple[str, ...], ...] = ()
    budget_limit: float | None = None
    max_depth: int | None = None
    resource_filters: tuple[tuple[str, ...], ...] = ()
    prompt_filters: tuple[tuple[str, ...], ...] = ()
    #: One entry per ``controls`` caveat; all apply.
    controls: tuple[Controls, ...] = ()


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
        case ControlsCaveat(controls):
            return f"{CONTROLS_KEY} = {canonical_text(controls)}"
    raise TypeError(f"not a caveat: {caveat!r}")  # pragma: no cover


def format_caveat(caveat: Caveat) -> str:
    """The predicate for ``caveat``; ValueError for one no gateway would accept (so none is ever signed)."""
    predicate = _format_predicate(caveat)
    limit = predicate_limit(predicate)
    if len(predicate.encode("utf-8")) > limit:
        raise ValueError(f"caveat too long: at most {limit} bytes per caveat")
    return predicate


#: (key, operator) -> what the value must be.
_CAVEAT_KEYS = frozenset({("expires", "="), ("budget_limit", "="), ("depth", "<="), ("tools", "="),
                          ("resources", "="), ("prompts", "="), (CONTROLS_KEY, "=")})


def split_predicate(predicate: str) -> tuple[str, str, str]:
    """``key op value`` around the first operator, spaces stripped; linear, refuses control characters."""
    if len(predicate) > predicate_limit(predicate):
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
        if key == CONTROLS_KEY:
            return ControlsCaveat(parse_controls(value))
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
    controls: list[Controls] = []
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
            case ControlsCaveat(rules):
                if rules not in controls:
                    controls.append(rules)
    return Restrictions(expires, tuple(tools), budget, depth, tuple(resources), tuple(prompts), tuple(controls))


def restriction_caveats(
    *,
    expires_at: float | None = None,
    tools: Sequence[str] | None = None,
    budget_limit: float | None = None,
    max_depth: int | None = None,
    resources: Sequence[str] | None = None,
    prompts: Sequence[str] | None = None,
    controls: Controls | Sequence[Controls] | None = None,
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
    for rules in (controls,) if isinstance(controls, Controls) else controls or ():
        caveats.append(ControlsCaveat(rules))
    for caveat in caveats:
        format_caveat(caveat)  # validates numbers before anything is signed
    return caveats
