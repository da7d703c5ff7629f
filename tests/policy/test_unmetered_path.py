"""A call nothing meters makes no store round trip; anything a budget could be charged for still does.

"Nothing meters" is decided per call: no limit (no ``budget_limit`` caveat, no operator budget) and no budget
id another token could share. The store is then not asked at all (it would answer "unlimited" and record
nothing worth keeping); identical copies in flight still share one run.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from satgate_mcp import events
from satgate_mcp.auth.base import Identity
from satgate_mcp.events import RecordingPublisher
from satgate_mcp.metrics import Metrics
from satgate_mcp.policy.budget import Charge, kept_in_store
from satgate_mcp.policy.duplicates import Table
from satgate_mcp.policy.engine import CallPolicy
from satgate_mcp.stores.memory import MemoryBudgetStore, MemoryDuplicateStore
from tests.policy.helpers import admit_tool

UNLIMITED = Identity("free-agent")


class CountingBudgets(MemoryBudgetStore):
    def __init__(self) -> None:
        super().__init__()
        self.asked = 0

    async def charge(self, key: str, cost: float, *, limit: float | None, enforce: bool,
                     charge_id: str = "") -> Charge:
        self.asked += 1
        return await super().charge(key, cost, limit=limit, enforce=enforce)

    async def remaining(self, key: str, *, limit: float | None) -> float | None:
        self.asked += 1
        return await super().remaining(key, limit=limit)


class CountingRecords(MemoryDuplicateStore):
    def __init__(self) -> None:
        super().__init__()
        self.asked = 0

    async def apply(self, key: str, table: Table) -> str:
        self.asked += 1
        return await super().apply(key, table)

    def apply_behind(self, key: str, table: Table) -> None:
        self.asked += 1
        super().apply_behind(key, table)


def policy(**options: Any) -> tuple[CallPolicy, CountingBudgets, CountingRecords, RecordingPublisher]:
    budgets, records, publisher = CountingBudgets(), CountingRecords(), RecordingPublisher()
    made = CallPolicy(publisher=publisher, metrics=Metrics(), budgets=budgets, duplicates=records,
                      enforcement="control", **options)
    return made, budgets, records, publisher


@pytest.mark.parametrize(("limit", "budget_id", "kept"), [
    (None, None, False),
    (10.0, None, True),
    (None, "team", True),   # an account another token may have opened with a limit
    (0.0, None, True),
])
def test_which_budgets_the_store_keeps(limit: float | None, budget_id: str | None, kept: bool) -> None:
    assert kept_in_store(limit, budget_id) is kept


async def test_an_unlimited_call_asks_no_store_in_a_session_or_without_one() -> None:
    made, budgets, records, publisher = policy()
    for session in ("s1", ""):
        admission = await admit_tool(made, UNLIMITED, session=session)
        assert await made.run(admission, _answer) == {"content": []}
    assert (budgets.asked, records.asked) == (0, 0)
    spent = publisher.named(events.BUDGET_SPEND)
    assert [(e["cost"], e["remaining"]) for e in spent] == [(1.0, -1), (1.0, -1)]  # still reported for billing


async def test_identical_copies_in_flight_still_share_one_run_without_the_store() -> None:
    made, budgets, records, _ = policy()
    runs = 0

    async def upstream() -> dict[str, Any]:
        nonlocal runs
        runs += 1
        return {"content": []}

    first = await admit_tool(made, UNLIMITED, request_id=7)
    second = await admit_tool(made, UNLIMITED, request_id=7)  # the same call re-sent while the first is open
    answers = await asyncio.gather(made.run(first, upstream), made.run(second, upstream))
    assert list(answers) == [{"content": []}, {"content": []}]
    assert runs == 1
    assert (budgets.asked, records.asked) == (0, 0)


@pytest.mark.parametrize("identity", [Identity("limited", budget_limit=5), Identity("member", budget_id="team")])
async def test_a_call_a_budget_could_be_charged_for_still_goes_to_the_store(identity: Identity) -> None:
    made, budgets, records, _ = policy()
    admission = await admit_tool(made, identity)
    await made.run(admission, _answer)
    assert budgets.asked >= 1
    assert records.asked >= 1


async def test_an_unlimited_token_sharing_a_limited_budget_id_draws_from_it() -> None:
    made, budgets, _, _ = policy()
    await made.run(await admit_tool(made, Identity("owner", budget_id="team", budget_limit=2)), _answer)
    await made.run(await admit_tool(made, Identity("member", budget_id="team"), request_id=2), _answer)
    assert await budgets.remaining("team", limit=None) == 0


async def _answer() -> dict[str, Any]:
    return {"content": []}
