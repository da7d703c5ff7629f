"""The session gate without a transport in front: what a session is owed, and what ending it stops."""

from __future__ import annotations

import asyncio

from satgate_mcp import jsonrpc
from tests.fakes import FakePool, until
from tests.transport.pieces import call, make_pieces, open_session, text_of


async def test_a_session_is_owed_the_tools_changed_notice_once() -> None:
    pool = FakePool()
    gate = make_pieces(pool).gate
    session = open_session(gate)
    assert gate.owed(session, call(1, "echo")) == []
    pool.tools_version += 1
    assert gate.owes(session, call(2, "echo"))
    assert gate.owed(session, call(2, "echo")) == [jsonrpc.notification_message("notifications/tools/list_changed")]
    assert gate.owed(session, call(3, "echo")) == []


async def test_listing_the_tools_settles_what_is_owed() -> None:
    pool = FakePool()
    _, gate, runner = make_pieces(pool)
    session = open_session(gate)
    pool.tools_version += 1
    await runner.run(session, jsonrpc.Request(1, "tools/list", None))
    assert not gate.owes(session, call(2, "echo"))


async def test_ending_a_session_cancels_its_calls_in_flight_and_no_others() -> None:
    pool = FakePool()
    _, gate, runner = make_pieces(pool)
    ending, other = open_session(gate), open_session(gate)
    running = asyncio.ensure_future(runner.run(ending, call(7, "block")))
    await pool.started.wait()
    pool.started.clear()
    elsewhere = asyncio.ensure_future(runner.run(other, call(7, "block")))
    await pool.started.wait()
    gate.end_session(ending)
    assert (await running)["error"]["code"] == jsonrpc.REQUEST_CANCELLED
    assert not elsewhere.done()
    pool.release.set()
    assert text_of(await elsewhere) == "block"
    await until(lambda: ending.inflight == 0 and runner.limiter.in_flight == 0)
