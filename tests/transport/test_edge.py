"""The shared HTTP edge without a transport in front: principal, sessions and calls, each with and without a session.

The stateless transport to come runs calls for a principal alone; these rules hold for it as for /mcp.
"""

from __future__ import annotations

import asyncio

from aiohttp.test_utils import make_mocked_request

from satgate_mcp import jsonrpc
from satgate_mcp.auth.base import Authenticator, Identity, NoAuthenticator, StaticTokenAuthenticator
from satgate_mcp.dispatch import Dispatcher
from satgate_mcp.events import RecordingPublisher
from satgate_mcp.inflight import InflightLimiter
from satgate_mcp.jsonrpc import JsonObj
from satgate_mcp.metrics import Metrics
from satgate_mcp.sessions import Session, SessionRegistry
from satgate_mcp.settings import Settings
from satgate_mcp.transport.edge import Edge, Principal
from satgate_mcp.transport.rules import Refusal
from tests.fakes import AllowAllPolicy, FakeClock, FakePool, until

ALICE = Principal("tok-alice", Identity(token_id="alice"))


def make_edge(pool: FakePool, *, per_token: int = 64, authenticator: Authenticator | None = None,
              metrics: Metrics | None = None) -> Edge:
    publisher = RecordingPublisher()
    metrics = metrics or Metrics()
    registry = SessionRegistry(cap=10, idle_ttl=60.0, publisher=publisher, clock=FakeClock())
    dispatcher = Dispatcher(pool, publisher=publisher, metrics=metrics, policy=AllowAllPolicy())
    return Edge(settings=Settings(), registry=registry, authenticator=authenticator or NoAuthenticator(),
                dispatcher=dispatcher, publisher=publisher, metrics=metrics,
                limiter=InflightLimiter(per_token=per_token, total=1024))


def call(request_id: int, name: str) -> jsonrpc.Request:
    return jsonrpc.Request(request_id, "tools/call", {"name": name, "arguments": {}})


def text_of(reply: JsonObj) -> str:
    return str(reply["result"]["content"][0]["text"])


async def test_a_principal_alone_runs_a_call() -> None:
    edge = make_edge(FakePool())
    reply = await edge.run(ALICE, call(1, "echo"))
    assert reply["id"] == 1
    assert text_of(reply) == "echo"


async def test_calls_without_a_session_are_bounded_by_their_tokens_in_flight_quota() -> None:
    pool = FakePool()
    edge = make_edge(pool, per_token=1)
    running = asyncio.ensure_future(edge.run(ALICE, call(1, "block")))
    await pool.started.wait()
    refused = await edge.run(ALICE, call(2, "echo"))
    assert refused["error"]["code"] == jsonrpc.RATE_LIMITED
    other = Principal("tok-bob", Identity(token_id="bob"))
    assert text_of(await edge.run(other, call(3, "echo"))) == "echo"  # another token has its own quota
    pool.release.set()
    assert text_of(await running) == "block"
    assert edge.limiter.in_flight == 0


async def test_a_batch_past_the_bound_is_answered_in_order_with_the_excess_refused() -> None:
    edge = make_edge(FakePool(), per_token=2)
    replies = await edge.run_batch(ALICE, [call(1, "echo"), call(2, "echo"), call(3, "echo")])
    assert [r["id"] for r in replies] == [1, 2, 3]
    assert [("error" in r) for r in replies] == [False, False, True]
    assert edge.limiter.in_flight == 0


def open_session(edge: Edge) -> Session:
    session = edge.open_session(ALICE, "2025-06-18")
    assert isinstance(session, Session)
    return session


async def test_a_session_is_owed_the_tools_changed_notice_once() -> None:
    pool = FakePool()
    edge = make_edge(pool)
    session = open_session(edge)
    assert edge.owed(session, call(1, "echo")) == []
    pool.tools_version += 1
    assert edge.owes(session, call(2, "echo"))
    assert edge.owed(session, call(2, "echo")) == [jsonrpc.notification_message("notifications/tools/list_changed")]
    assert edge.owed(session, call(3, "echo")) == []


async def test_listing_the_tools_settles_what_is_owed() -> None:
    pool = FakePool()
    edge = make_edge(pool)
    session = open_session(edge)
    pool.tools_version += 1
    await edge.run(session, jsonrpc.Request(1, "tools/list", None))
    assert not edge.owes(session, call(2, "echo"))


async def test_cancelled_stops_the_named_call_of_that_session_only() -> None:
    pool = FakePool()
    edge = make_edge(pool)
    session = open_session(edge)
    running = asyncio.ensure_future(edge.run(session, call(7, "block")))
    await pool.started.wait()
    cancel = jsonrpc.Notification("notifications/cancelled", {"requestId": 7})
    edge.on_notification(ALICE, cancel)  # no session: nothing names a call to cancel
    await asyncio.sleep(0)
    assert not running.done()
    edge.on_notification(session, cancel)
    reply = await running
    assert reply["error"]["code"] == jsonrpc.REQUEST_CANCELLED
    await until(pool.cancelled.is_set)
    assert session.inflight == 0


async def test_a_cancelled_call_leaves_its_callers_task_free_to_go_on() -> None:
    """The call runs in the caller's own task: after the cancel answer, that task is not left cancelling."""
    pool = FakePool()
    edge = make_edge(pool)
    session = open_session(edge)

    async def handler() -> tuple[JsonObj, JsonObj]:
        cancelled = await edge.run(session, call(7, "block"))
        await asyncio.sleep(0)  # the answer is written after awaits like this one
        return cancelled, await edge.run(session, call(8, "echo"))

    running = asyncio.ensure_future(handler())
    await pool.started.wait()
    edge.on_notification(session, jsonrpc.Notification("notifications/cancelled", {"requestId": 7}))
    cancelled, after = await running
    assert cancelled["error"]["code"] == jsonrpc.REQUEST_CANCELLED
    assert text_of(after) == "echo"
    assert edge.limiter.in_flight == 0


async def test_a_cancel_from_outside_the_call_still_cancels_its_caller() -> None:
    """A handler cancelled from outside (its client went away) is not turned into an answer, even when the
    client's own cancel arrived too."""
    pool = FakePool()
    edge = make_edge(pool)
    session = open_session(edge)
    for also_by_client in (False, True):
        pool.started.clear()
        running = asyncio.ensure_future(edge.run(session, call(7, "block")))
        await pool.started.wait()
        if also_by_client:
            edge.on_notification(session, jsonrpc.Notification("notifications/cancelled", {"requestId": 7}))
        running.cancel()
        await asyncio.wait([running])
        assert running.cancelled()
        assert session.inflight == 0
        assert edge.limiter.in_flight == 0


async def test_a_refused_credential_is_counted_and_answered_401() -> None:
    metrics = Metrics()
    edge = make_edge(FakePool(), authenticator=StaticTokenAuthenticator("s3cret"), metrics=metrics)
    refused = await edge.principal(make_mocked_request("POST", "/mcp", headers={"Authorization": "Bearer wrong"}))
    assert isinstance(refused, Refusal)
    assert (refused.status, refused.error) == (401, "invalid_token")
    assert metrics.registry.get_sample_value("satgate_refusals_total", {"reason": "invalid"}) == 1
    accepted = await edge.principal(make_mocked_request("POST", "/mcp", headers={"Authorization": "Bearer s3cret"}))
    assert accepted == Principal("s3cret", Identity(token_id="static"))


async def test_the_host_and_origin_guard_decides_each_pair_of_values_on_its_own() -> None:
    """Verdicts are kept per (Host, Origin): a pair seen before never lets another pair through."""
    edge = make_edge(FakePool())

    def verdict(host: str, origin: str | None = None) -> str | None:
        headers = {"Host": host, **({"Origin": origin} if origin is not None else {})}
        refusal = edge.check_host_origin(make_mocked_request("POST", "/mcp", headers=headers))
        return None if refusal is None else refusal.error

    for _ in range(2):
        assert verdict("127.0.0.1:8080") is None
        assert verdict("127.0.0.1:8080", "http://localhost:3000") is None
        assert verdict("127.0.0.1:8080", "https://evil.example") == "origin_not_allowed"
        assert verdict("evil.example:8080") == "host_not_allowed"
        assert verdict("evil.example:8080", "http://localhost:3000") == "host_not_allowed"
