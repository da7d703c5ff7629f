"""Rate limits: a token bucket per verified token id (and optionally per tool pattern).

Delegated children share their root token's buckets: the family is rate-limited as one, so
minting children never multiplies the rate, and a child's rate is at most its parent's.

We keep our own bucket instead of the ``limits`` package: ``limits`` has only window
strategies (no bucket with a burst separate from the rate), reads ``time.time()`` itself so
it cannot be driven by a fake clock, and wants whole amounts per whole window; the bucket is a
few lines here and one small Lua script for Redis (``stores/redis/policy.py``).

The default burst is one second's worth of the rate, at least 1 (``600/m`` -> 10): a rate
limit protects the upstreams from bursts; totals are what budgets are for.
``SATGATE_RATE_BURST`` raises it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from satgate_mcp.auth.base import Identity
from satgate_mcp.errors import ConfigError
from satgate_mcp.patterns import PatternKind, is_pattern, most_specific, pattern_error
from satgate_mcp.settings import parse_rate

#: Float slack so that refills landing a hair under a whole token still count.
_EPSILON = 1e-9


@dataclass(frozen=True, slots=True)
class RateSpec:
    per_second: float
    burst: int

    @property
    def full_after(self) -> float:
        """Seconds an empty bucket needs to refill; an idle bucket older than this is a new one."""
        return self.burst / self.per_second


def default_burst(per_second: float) -> int:
    return max(1, math.ceil(per_second - _EPSILON))


def rate_spec(text: str, burst: int | None = None) -> RateSpec:
    """``"10/s"`` -> 10 per second, burst 10; raises ValueError on bad text."""
    per_second = parse_rate(text)
    if burst is not None and burst < 1:
        raise ValueError(f"burst must be at least 1, got {burst}")
    return RateSpec(per_second, burst if burst is not None else default_burst(per_second))


@dataclass(frozen=True, slots=True)
class ToolRate:
    """A per-token rate for the tools a pattern (exact, ``prefix*`` or ``*``) names."""

    pattern: str
    spec: RateSpec


def parse_tool_rates(raw: Mapping[str, str]) -> tuple[ToolRate, ...]:
    """``{"search_*": "1/s"}`` -> rules; a bad entry raises ConfigError naming it."""
    rules = []
    for pattern, text in raw.items():
        if not isinstance(pattern, str) or not is_pattern(pattern, PatternKind.TOOL):
            raise ConfigError(f"tool rate limit: {pattern_error(str(pattern), PatternKind.TOOL)}")
        if not isinstance(text, str):
            raise ConfigError(f"tool rate limit for {pattern!r}: expected a rate like '10/s', got {text!r}")
        try:
            rules.append(ToolRate(pattern, rate_spec(text)))
        except ValueError as exc:
            raise ConfigError(f"tool rate limit for {pattern!r}: {exc}") from None
    return tuple(rules)


@dataclass(frozen=True, slots=True)
class Bucket:
    """One bucket to draw from: its store key and its rate."""

    key: str
    spec: RateSpec


def rate_family(identity: Identity) -> str:
    """Whose allowance a token draws on: its delegation root's (a child is never a fresh bucket)."""
    return identity.family_id


def buckets_for(
    token_id: str, tool: str | None, *, overall: RateSpec | None, tool_rates: Sequence[ToolRate]
) -> tuple[Bucket, ...]:
    """Every bucket a call draws one token from; keyed by token id (a family's root), never by session."""
    out = []
    if overall is not None:
        out.append(Bucket(f"rate:{token_id}", overall))
    if tool is not None and tool_rates:
        by_pattern = {r.pattern: r for r in tool_rates}
        chosen = most_specific(by_pattern.keys(), tool)
        if chosen is not None:
            out.append(Bucket(f"rate:{token_id}:tool:{chosen}", by_pattern[chosen].spec))
    return tuple(out)


@dataclass(frozen=True, slots=True)
class BucketState:
    tokens: float
    updated: float


def refill(state: BucketState | None, spec: RateSpec, now: float) -> BucketState:
    """The bucket as it stands at ``now``; a new bucket starts full."""
    if state is None:
        return BucketState(float(spec.burst), now)
    elapsed = max(0.0, now - state.updated)
    return BucketState(min(float(spec.burst), state.tokens + elapsed * spec.per_second), max(now, state.updated))


def wait_for_token(state: BucketState, spec: RateSpec) -> float:
    """Seconds until the (refilled) bucket holds one whole token; 0 when it does now."""
    missing = 1.0 - state.tokens
    return 0.0 if missing <= _EPSILON else missing / spec.per_second


def retry_after_seconds(wait: float) -> int:
    """What the client is told: whole seconds, rounded up, at least 1."""
    return max(1, math.ceil(wait - _EPSILON))


class RateLimiter(Protocol):
    async def acquire(self, buckets: Sequence[Bucket]) -> float:
        """Take one token from every bucket, or from none: 0.0 when allowed, else seconds to wait."""
        ...

    async def close(self) -> None: ...
