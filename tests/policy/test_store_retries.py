"""The retries of work done around a call's answer (policy/store_time.py): bounded tries, bounded waits."""

from __future__ import annotations

import asyncio

import pytest

from satgate_mcp.policy.store_time import BACKGROUND_ATTEMPTS, in_background, resolve, retry_delays

ERRORS = (ConnectionError, TimeoutError)


class Store:
    """Fails its first ``failures`` answers (or hangs, ``hang``), then answers "landed"."""

    def __init__(self, failures: int, *, hang: bool = False) -> None:
        self.failures, self.hang, self.asked = failures, hang, 0

    async def __call__(self) -> str:
        self.asked += 1
        if self.asked <= self.failures:
            if self.hang:
                await asyncio.Event().wait()
            raise ConnectionError("store went away")
        return "landed"


@pytest.mark.parametrize(("failures", "answer", "asked"), [
    pytest.param(0, "landed", 1, id="answered-at-once"),
    pytest.param(1, "landed", 2, id="answered-on-the-retry"),
    pytest.param(2, None, 2, id="silent-twice-gives-up"),
])
async def test_resolve_tries_twice_then_gives_the_store_error(failures: int, answer: str | None, asked: int) -> None:
    store = Store(failures)
    if answer is None:
        with pytest.raises(ConnectionError):
            await resolve(store, allowance=1.0, errors=ERRORS)
    else:
        assert await resolve(store, allowance=1.0, errors=ERRORS) == answer
    assert store.asked == asked


async def test_resolve_shares_one_allowance_between_its_tries() -> None:
    """A store that hangs costs the resolution its allowance in all, not once per try."""
    store = Store(2, hang=True)
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(TimeoutError):
        await resolve(store, allowance=0.2, errors=ERRORS)
    assert store.asked == 2
    assert loop.time() - started < 0.2 + 0.15


@pytest.mark.parametrize(("first", "cap", "attempts", "delays"), [
    pytest.param(0.5, 30.0, 4, [0.0, 0.5, 1.0, 2.0], id="at-once-then-doubling"),
    pytest.param(0.5, 1.5, 5, [0.0, 0.5, 1.0, 1.5, 1.5], id="capped"),
    pytest.param(0.5, 30.0, 1, [0.0], id="one-try"),
])
def test_background_waits(first: float, cap: float, attempts: int, delays: list[float]) -> None:
    assert retry_delays(first, cap, attempts) == delays


def test_the_default_background_retries_last_about_the_ledgers_ten_minutes() -> None:
    waits = retry_delays()
    assert len(waits) == BACKGROUND_ATTEMPTS
    assert 8 * 60 <= sum(waits) <= 12 * 60
    assert max(waits) == 30.0


async def test_in_background_goes_on_until_the_store_answers_and_stops_at_its_last_try() -> None:
    store = Store(3)
    assert await in_background(store, allowance=1.0, errors=ERRORS, delays=[0.0] * 4) == "landed"
    assert store.asked == 4
    silent = Store(10)
    with pytest.raises(ConnectionError):
        await in_background(silent, allowance=1.0, errors=ERRORS, delays=[0.0] * 3)
    assert silent.asked == 3
