"""A guarded call's arrival and charge in one operation: the same table run against the state database's job
and against Redis's script (real SQLite under tmp_path, the real Redis at 127.0.0.1:6379).

Each row starts from a record and a budget, asks for one arrival, and checks what it got, what the record says
after and what was spent: the Lua copy and the SQLite job must agree on every row.
"""

from __future__ import annotations

import sqlite3
import uuid
from pathlib import Path

import pytest
import redis.asyncio as redis

from satgate_mcp.policy.admissions import Arrived, ChargeAsk, refused_record
from satgate_mcp.policy.budget import Charge
from satgate_mcp.policy.duplicates import Arrival, Record, State
from satgate_mcp.stores.redis.admissions import RedisAdmissions
from satgate_mcp.stores.redis.policy import text
from satgate_mcp.stores.sqlite import LocalState

Budget = tuple[float, float] | None  # limit, spent (None: no account yet)

#: record before, budget before, (cost, limit, enforce) -> arrived, record after, spent after (None: no account)
TABLE: list[tuple[str, State, Budget, tuple[float, float | None, bool], Arrived, State, float | None]] = [
    ("first-charged", None, None, (1.0, 10.0, True),
     Arrived(Arrival.FIRST, Charge(True, 9.0), None), Record.RUNNING, 1.0),
    ("first-refused-takes-its-record-back", None, (10.0, 9.5), (1.0, 10.0, True),
     Arrived(Arrival.FIRST, Charge(False, 0.5, exceeded=True), None), None, 9.5),
    ("first-observed-overspends", None, (10.0, 9.5), (1.0, 10.0, False),
     Arrived(Arrival.FIRST, Charge(True, -0.5, exceeded=True), None), Record.RUNNING, 10.5),
    ("first-unlimited", None, None, (1.0, None, True),
     Arrived(Arrival.FIRST, Charge(True, None), None), Record.RUNNING, None),
    ("replay-is-free", Record.RUNNING, (10.0, 1.0), (1.0, 10.0, True),
     Arrived(Arrival.REPLAY, None, 9.0), Record.REPLAYING, 1.0),
    ("replay-unlimited", Record.RUNNING, None, (1.0, None, True),
     Arrived(Arrival.REPLAY, None, None), Record.REPLAYING, None),
    ("again-is-charged", Record.REPLAYING, (10.0, 1.0), (1.0, 10.0, True),
     Arrived(Arrival.AGAIN, Charge(True, 8.0), None), Record.REPLAYING, 2.0),
    ("again-refused-leaves-the-record", Record.HANDED, (10.0, 9.5), (1.0, 10.0, True),
     Arrived(Arrival.AGAIN, Charge(False, 0.5, exceeded=True), None), Record.HANDED, 9.5),
]
IDS = [row[0] for row in TABLE]


def test_only_a_first_copy_has_a_record_to_take_back() -> None:
    """The script undoes a refused first copy only: the row of any other arrival must have nothing to undo."""
    assert refused_record(Arrival.FIRST) is not None
    assert refused_record(Arrival.AGAIN) is None


@pytest.fixture
def client(redis_client: redis.Redis) -> redis.Redis:
    return redis_client


@pytest.mark.parametrize(("name", "record", "budget", "ask", "arrived", "record_after", "spent_after"), TABLE, ids=IDS)
async def test_redis(client: redis.Redis, name: str, record: State, budget: Budget,
                     ask: tuple[float, float | None, bool], arrived: Arrived, record_after: State,
                     spent_after: float | None) -> None:
    prefix = f"satgate-test:{uuid.uuid4().hex}:"
    record_key, budget_key = prefix + "dup:call", prefix + "budget:b"
    if record is not None:
        await client.set(record_key, record.value, px=60_000)
    if budget is not None:
        await client.hset(budget_key, mapping={"limit": repr(budget[0]), "spent": repr(budget[1])})
    try:
        got = await RedisAdmissions(client, prefix=prefix).arrive("call", ChargeAsk("b", *ask))
        assert got == arrived
        stored = await client.get(record_key)
        assert (None if stored is None else Record(text(stored))) == record_after
        spent = await client.hget(budget_key, "spent")
        assert (None if spent is None else float(spent)) == spent_after
    finally:
        await client.delete(record_key, budget_key)


@pytest.mark.parametrize(("name", "record", "budget", "ask", "arrived", "record_after", "spent_after"), TABLE, ids=IDS)
async def test_sqlite(tmp_path: Path, name: str, record: State, budget: Budget, ask: tuple[float, float | None, bool],
                      arrived: Arrived, record_after: State, spent_after: float | None) -> None:
    state = LocalState.open(tmp_path / "state")
    try:
        def seed(conn: sqlite3.Connection) -> None:
            if record is not None:
                conn.execute("INSERT INTO duplicates VALUES ('call', ?, 1e12)", (record.value,))
            if budget is not None:
                conn.execute("INSERT INTO budgets VALUES ('b', ?, ?, NULL)", budget)

        await state.db.run(seed)
        assert await state.admissions.arrive("call", ChargeAsk("b", *ask)) == arrived
        rows = state.db.read_now("SELECT state FROM duplicates WHERE key = 'call'", ())
        assert (Record(rows[0][0]) if rows else None) == record_after
        spent = state.db.read_now("SELECT spent FROM budgets WHERE key = 'b'", ())
        assert (float(spent[0][0]) if spent else None) == spent_after
    finally:
        await state.aclose()
