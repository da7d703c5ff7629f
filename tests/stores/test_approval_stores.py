"""Held calls in every store: a repeat of the identical call is pending until decided, an approval runs the call
once (two handles racing on one folder or one Redis, as two machines would), a decision is taken once (two
operators at once: exactly one wins), expiry and the per-family queue bound hold, and a record survives a
reopened database."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace
from pathlib import Path
from typing import cast

import pytest

from satgate_mcp.policy.approvals import ApprovalStore, HeldCall, HoldOutcome, fingerprint, new_id
from satgate_mcp.stores.memory_approvals import MemoryApprovalStore
from satgate_mcp.stores.redis.approvals import RedisApprovalStore
from satgate_mcp.stores.sqlite.approvals import SqliteApprovalStore
from tests.stores.conftest import handles

#: Opens another handle on the same records (another process on the folder, another machine on the Redis).
Opener = Callable[[], Awaitable[ApprovalStore]]
NOW = time.time()
TTL = 900.0


@pytest.fixture(params=["memory", "sqlite", "redis"])
async def opener(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Opener]:
    async with handles(request.param, tmp_path, memory=MemoryApprovalStore, sqlite=SqliteApprovalStore,
                       on_redis=lambda client, prefix: RedisApprovalStore(client, prefix=prefix)) as open_handle:
        yield cast(Opener, open_handle)  # each backend makes the one store type


def held(amount: int = 60, token: str = "tok-a", family: str = "fam-a", now: float = NOW) -> HeldCall:
    arguments = {"amount": amount, "to": "acct-1"}
    return HeldCall(new_id(), fingerprint(token, "pay", arguments), token, family, "pay", '{"amount": 60}',
                    "amount above 50", now, now + TTL)


async def test_a_repeat_is_pending_under_the_same_id_until_decided(opener: Opener) -> None:
    store = await opener()
    first = await store.hold(held(), NOW, 20)
    assert first.found == "requested"
    assert first.record is not None
    again = await store.hold(held(), NOW + 1, 20)
    assert again.found == "pending"
    assert again.record is not None
    assert again.record.id == first.record.id


async def test_an_approval_runs_the_identical_call_once_and_a_second_copy_needs_a_new_one(opener: Opener) -> None:
    store = await opener()
    first = (await store.hold(held(), NOW, 20)).record
    assert first is not None
    assert (await store.decide(first.id, True, "ops", None, NOW + 1)).outcome == "decided"
    ran = await store.hold(held(), NOW + 2, 20)
    assert ran.found == "approved"
    assert ran.record is not None
    assert ran.record.state == "consumed"
    again = await store.hold(held(), NOW + 3, 20)
    assert again.found == "requested"
    assert again.record is not None
    assert again.record.id != first.id


async def test_changed_arguments_are_another_call_that_the_approval_does_not_cover(opener: Opener) -> None:
    store = await opener()
    first = (await store.hold(held(60), NOW, 20)).record
    assert first is not None
    await store.decide(first.id, True, "ops", None, NOW + 1)
    other = await store.hold(held(5000), NOW + 2, 20)
    assert other.found == "requested"
    assert (await store.hold(held(60), NOW + 3, 20)).found == "approved"


async def test_two_machines_racing_on_one_approval_run_the_call_once(opener: Opener) -> None:
    one, two = await opener(), await opener()
    first = (await one.hold(held(), NOW, 20)).record
    assert first is not None
    await one.decide(first.id, True, "ops", None, NOW + 1)
    repeats = await asyncio.gather(*[(one if i % 2 else two).hold(held(), NOW + 2, 50) for i in range(20)],
                                   *[(two if i % 2 else one).consume(first.id, NOW + 2) for i in range(10)])
    found = [r.found for r in repeats[:20] if isinstance(r, HoldOutcome)]
    consumed = [c for c in repeats[20:] if isinstance(c, HeldCall)]
    assert found.count("approved") + len(consumed) == 1


async def test_two_operators_at_once_exactly_one_wins_and_the_other_hears_what_happened(opener: Opener) -> None:
    one, two = await opener(), await opener()
    first = (await one.hold(held(), NOW, 20)).record
    assert first is not None
    decisions = await asyncio.gather(one.decide(first.id, True, "alice", None, NOW + 1),
                                     two.decide(first.id, False, "bob", "too much", NOW + 1),
                                     one.decide(first.id, False, "carol", None, NOW + 1))
    assert sorted(d.outcome for d in decisions) == ["already", "already", "decided"]
    winner = next(d for d in decisions if d.outcome == "decided").record
    assert winner is not None
    for late in (d for d in decisions if d.outcome == "already"):
        assert late.record is not None
        assert late.record.decided_by == winner.decided_by


async def test_a_denial_is_heard_by_the_repeat_and_an_expiry_refuses_a_late_decision(opener: Opener) -> None:
    store = await opener()
    first = (await store.hold(held(), NOW, 20)).record
    assert first is not None
    await store.decide(first.id, False, "ops", "no", NOW + 1)
    denied = await store.hold(held(), NOW + 2, 20)
    assert denied.found == "denied"
    assert denied.record is not None
    assert denied.record.note == "no"
    late = (await store.hold(held(61), NOW, 20)).record
    assert late is not None
    assert (await store.decide(late.id, True, "ops", None, NOW + TTL + 1)).outcome == "expired"
    assert (await store.hold(held(61), NOW + TTL + 2, 20)).found == "expired"
    assert (await store.decide("apr_unknown", True, "ops", None, NOW)).outcome == "unknown"


async def test_an_approval_past_its_expiry_is_not_used(opener: Opener) -> None:
    store = await opener()
    first = (await store.hold(held(), NOW, 20)).record
    assert first is not None
    await store.decide(first.id, True, "ops", None, NOW + 1)
    assert await store.consume(first.id, NOW + TTL + 1) is None
    assert (await store.hold(held(), NOW + TTL + 1, 20)).found == "expired"


async def test_a_family_with_too_many_pending_is_refused_a_new_one(opener: Opener) -> None:
    store = await opener()
    for amount in range(3):
        assert (await store.hold(held(100 + amount), NOW, 3)).found == "requested"
    assert (await store.hold(held(200), NOW, 3)).found == "full"
    child = replace(held(201, token="tok-child"), family_id="fam-a")
    assert (await store.hold(child, NOW, 3)).found == "full"
    assert (await store.hold(held(202, family="fam-b"), NOW, 3)).found == "requested"
    listed = await store.listing(NOW)
    assert [r.state for r in listed] == ["pending"] * 4


async def test_the_listing_shows_newest_first_and_a_reopened_database_keeps_them(opener: Opener) -> None:
    store = await opener()
    for i in range(3):
        await store.hold(held(300 + i, now=NOW + i), NOW + i, 20)
    again = await opener()
    listed = await again.listing(NOW + 5)
    assert [r.created_at for r in listed] == [NOW + 2, NOW + 1, NOW]
    assert await again.get(listed[0].id) == listed[0]
