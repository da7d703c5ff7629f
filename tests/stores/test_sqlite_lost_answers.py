"""Exact accounting on the state database (issue 31): a store timeout never leaves a charge that landed reported as a
fault. A timeout before the job began (another process holds the write lock) drops it: it never runs, so the fault
is the truth; a timeout after it began waits for its commit and returns its answer, so the call goes on charged.
Either way a charge is on disk exactly when its caller was told it was made."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from pathlib import Path

import pytest

from satgate_mcp.stores.sqlite import DB_NAME, LocalState
from satgate_mcp.stores.sqlite.stores import SqliteBudgetStore


def spent(folder: Path, key: str) -> float:
    with sqlite3.connect(folder / DB_NAME) as conn:
        row = conn.execute("SELECT spent FROM budgets WHERE key = ?", (key,)).fetchone()
    return float(row[0]) if row is not None else 0.0


async def test_a_timeout_before_the_charge_began_drops_it(tmp_path: Path) -> None:
    state = LocalState.open(tmp_path)
    budgets = SqliteBudgetStore(state.db)
    other = sqlite3.connect(tmp_path / DB_NAME, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")  # another process on the folder holds the write lock
    try:
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.2):
                await budgets.charge("team", 5.0, limit=100.0, enforce=True)
    finally:
        other.execute("COMMIT")
        other.close()
    await budgets.charge("team", 1.0, limit=100.0, enforce=True)  # the worker has run everything queued by now
    await state.aclose()
    assert spent(tmp_path, "team") == 1.0  # the timed-out charge never landed


async def test_a_timeout_after_the_charge_began_returns_its_answer(tmp_path: Path) -> None:
    state = LocalState.open(tmp_path)
    begun, finish = threading.Event(), threading.Event()

    def slow_charge(conn: sqlite3.Connection) -> str:
        conn.execute("INSERT INTO budgets (key, lim, spent, expires) VALUES ('team', 100, 5, NULL)")
        begun.set()
        finish.wait(5)  # the transaction is open, the charge written, the commit not yet made
        return "charged"

    other = sqlite3.connect(tmp_path / DB_NAME, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")  # the loop's try meets the lock: jobs go to the worker thread
    with pytest.raises(TimeoutError):  # a first job waits there for the lock (and is dropped: it never began)
        async with asyncio.timeout(0.1):
            await state.db.run(lambda conn: None)
    job = asyncio.create_task(state.db.run(slow_charge))  # follows it to the worker, where it can be caught mid-way
    await asyncio.sleep(0)
    other.execute("COMMIT")
    other.close()
    await asyncio.to_thread(begun.wait, 5)
    started = time.monotonic()
    threading.Timer(0.3, finish.set).start()
    async with asyncio.timeout(0.05):  # expires while the job is mid-transaction
        answer = await job
    assert answer == "charged"  # not a fault: the charge landed, and its caller is told so
    assert time.monotonic() - started >= 0.25
    await state.aclose()
    assert spent(tmp_path, "team") == 5.0
