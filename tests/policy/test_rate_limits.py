"""Token buckets: parsing, refill arithmetic, all-or-nothing draws, bounded memory."""

from __future__ import annotations

import pytest

from satgate_mcp.errors import ConfigError
from satgate_mcp.policy.limits import (
    Bucket,
    BucketState,
    RateSpec,
    ToolRate,
    buckets_for,
    parse_tool_rates,
    rate_spec,
    refill,
    retry_after_seconds,
    wait_for_token,
)
from satgate_mcp.stores.memory import MemoryRateLimiter
from tests.fakes import FakeClock


@pytest.mark.parametrize(
    ("text", "burst", "expected"),
    [
        pytest.param("10/s", None, RateSpec(10.0, 10), id="per-second-burst-is-one-second"),
        pytest.param("600/m", None, RateSpec(10.0, 10), id="per-minute-same-rate"),
        pytest.param("1/m", None, RateSpec(1 / 60, 1), id="slow-rate-burst-at-least-one"),
        pytest.param("2.5/s", None, RateSpec(2.5, 3), id="fractional-rounds-burst-up"),
        pytest.param("3600/h", None, RateSpec(1.0, 1), id="per-hour"),
        pytest.param("10/s", 50, RateSpec(10.0, 50), id="explicit-burst"),
        pytest.param(" 5 / sec ", None, RateSpec(5.0, 5), id="spaces-and-long-unit"),
    ],
)
def test_rate_spec(text: str, burst: int | None, expected: RateSpec) -> None:
    assert rate_spec(text, burst) == expected


@pytest.mark.parametrize(
    ("text", "burst"),
    [
        pytest.param("10", None, id="no-unit"),
        pytest.param("0/s", None, id="zero"),
        pytest.param("-1/s", None, id="negative"),
        pytest.param("ten/s", None, id="not-a-number"),
        pytest.param("10/d", None, id="unknown-unit"),
        pytest.param("10/s", 0, id="zero-burst"),
    ],
)
def test_rate_spec_rejects(text: str, burst: int | None) -> None:
    with pytest.raises(ValueError):  # noqa: PT011 - every bad input is a plain ValueError
        rate_spec(text, burst)


def test_tool_rates_parse_and_reject() -> None:
    assert parse_tool_rates({"search_*": "1/s", "*": "100/m"}) == (
        ToolRate("search_*", RateSpec(1.0, 1)), ToolRate("*", RateSpec(100 / 60, 2)))
    with pytest.raises(ConfigError, match="search_\\*"):
        parse_tool_rates({"search_*": "fast"})
    with pytest.raises(ConfigError, match="pattern"):
        parse_tool_rates({"a*b": "1/s"})
    with pytest.raises(ConfigError, match="invalid tool pattern"):
        parse_tool_rates({"my tool": "1/s"})  # the grammar of tokens: no token could name such a tool


def test_buckets_are_keyed_by_token_never_session() -> None:
    overall = RateSpec(1.0, 1)
    tool_rates = (ToolRate("db_*", RateSpec(2.0, 2)),)
    assert buckets_for("tok-a", "db_read", overall=overall, tool_rates=tool_rates) == (
        Bucket("rate:tok-a", overall), Bucket("rate:tok-a:tool:db_*", RateSpec(2.0, 2)))
    assert buckets_for("tok-a", None, overall=overall, tool_rates=tool_rates) == (Bucket("rate:tok-a", overall),)
    assert buckets_for("tok-a", "other", overall=None, tool_rates=tool_rates) == ()


@pytest.mark.parametrize(
    ("state", "now", "tokens"),
    [
        pytest.param(None, 5.0, 4.0, id="new-bucket-is-full"),
        pytest.param(BucketState(0.0, 0.0), 1.0, 2.0, id="refills-at-rate"),
        pytest.param(BucketState(0.0, 0.0), 100.0, 4.0, id="capped-at-burst"),
        pytest.param(BucketState(1.0, 10.0), 9.0, 1.0, id="clock-going-back-adds-nothing"),
    ],
)
def test_refill(state: BucketState | None, now: float, tokens: float) -> None:
    assert refill(state, RateSpec(2.0, 4), now).tokens == pytest.approx(tokens)


@pytest.mark.parametrize(
    ("tokens", "wait", "retry_after"),
    [
        pytest.param(1.0, 0.0, 1, id="has-a-token"),
        pytest.param(0.5, 0.25, 1, id="short-wait-still-one-second"),
        pytest.param(0.0, 0.5, 1, id="empty"),
        pytest.param(-3.0, 2.0, 2, id="whole-seconds"),
        pytest.param(-3.2, 2.1, 3, id="rounds-up"),
    ],
)
def test_wait_and_retry_after(tokens: float, wait: float, retry_after: int) -> None:
    got = wait_for_token(BucketState(tokens, 0.0), RateSpec(2.0, 4))
    assert got == pytest.approx(wait)
    assert retry_after_seconds(got) == retry_after


async def test_bucket_allows_burst_then_refills_with_fake_clock() -> None:
    clock = FakeClock()
    limiter = MemoryRateLimiter(clock=clock)
    bucket = Bucket("rate:t", RateSpec(2.0, 3))
    assert [await limiter.acquire([bucket]) for _ in range(3)] == [0.0, 0.0, 0.0]
    assert await limiter.acquire([bucket]) == pytest.approx(0.5)
    clock.advance(0.5)
    assert await limiter.acquire([bucket]) == 0.0
    assert await limiter.acquire([bucket]) == pytest.approx(0.5)


async def test_draw_is_all_or_nothing() -> None:
    limiter = MemoryRateLimiter(clock=FakeClock())
    wide, narrow = Bucket("rate:t", RateSpec(10.0, 10)), Bucket("rate:t:tool:x", RateSpec(1.0, 1))
    assert await limiter.acquire([wide, narrow]) == 0.0
    assert await limiter.acquire([wide, narrow]) == pytest.approx(1.0)
    # The refusal above took nothing from the wide bucket: nine calls remain.
    assert [await limiter.acquire([wide]) for _ in range(10)].count(0.0) == 9


async def test_idle_full_buckets_are_dropped_past_the_cap() -> None:
    clock = FakeClock()
    limiter = MemoryRateLimiter(clock=clock, cap=10)
    for i in range(10):
        await limiter.acquire([Bucket(f"rate:{i}", RateSpec(1.0, 1))])
    clock.advance(5)
    await limiter.acquire([Bucket("rate:new", RateSpec(1.0, 1))])
    assert len(limiter) == 1
