"""Resource subscriptions: per session, reference-counted upstream, released when a session ends."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from satgate_mcp import jsonrpc
from satgate_mcp.errors import GatewayError
from satgate_mcp.jsonrpc import JsonObj
from satgate_mcp.subscriptions import Subscriptions, SubscriptionTable
from satgate_mcp.upstream.base import CALLER, Caller, ProgressCallback


@pytest.mark.parametrize(
    ("steps", "upstream_calls", "left"),
    [
        pytest.param([("+", "a"), ("+", "b")], ["subscribe"], {"a", "b"}, id="second-session-shares-the-first"),
        pytest.param([("+", "a"), ("+", "b"), ("-", "a")], ["subscribe"], {"b"},
                     id="one-unsubscribing-keeps-the-others"),
        pytest.param([("+", "a"), ("+", "b"), ("-", "a"), ("-", "b")], ["subscribe", "unsubscribe"], set(),
                     id="the-last-one-out-unsubscribes-upstream"),
        pytest.param([("-", "a")], [], set(), id="never-subscribed-is-nothing-to-do"),
        pytest.param([("+", "a"), ("+", "a"), ("-", "a")], ["subscribe", "unsubscribe"], set(),
                     id="a-session-holds-a-uri-once"),
    ],
)
def test_the_table_decides_when_the_upstream_is_asked(steps: list[tuple[str, str]], upstream_calls: list[str],
                                                      left: set[str]) -> None:
    table = SubscriptionTable()
    calls = []
    for op, session in steps:
        if op == "+" and not table.has(session, "m://x"):
            if table.add(session, "m://x"):
                calls.append("subscribe")
        elif op == "-" and table.remove(session, "m://x"):
            calls.append("unsubscribe")
    assert calls == upstream_calls
    assert table.subscribers("m://x") == left


def test_an_ended_session_releases_only_what_nobody_else_holds() -> None:
    table = SubscriptionTable()
    for session, uri in (("a", "m://1"), ("a", "m://2"), ("b", "m://2")):
        table.add(session, uri)
    assert table.drop_session("a") == ["m://1"]
    assert (table.subscribers("m://1"), table.subscribers("m://2")) == (frozenset(), frozenset({"b"}))


class Upstream:
    def __init__(self, reply: JsonObj | None = None) -> None:
        self.calls: list[tuple[str, JsonObj | None]] = []
        self.reply = reply or jsonrpc.result_response(None, {})

    async def subscribe(self, params: JsonObj | None, *, on_progress: ProgressCallback | None = None) -> JsonObj:
        self.calls.append(("subscribe", params))
        return self.reply

    async def unsubscribe(self, params: JsonObj | None, *, on_progress: ProgressCallback | None = None) -> JsonObj:
        self.calls.append(("unsubscribe", params))
        return jsonrpc.result_response(None, {})


async def test_two_sessions_one_upstream_subscription_until_both_are_gone() -> None:
    upstream = Upstream()
    subs = Subscriptions(upstream.subscribe, upstream.unsubscribe)
    uri = {"uri": "memo://a"}
    await subs.subscribe("s1", uri)
    await subs.subscribe("s2", uri)
    await subs.unsubscribe("s1", uri)
    assert upstream.calls == [("subscribe", uri)]
    assert subs.table.subscribers("memo://a") == {"s2"}
    subs.end_session("s2")
    await subs.released()
    assert upstream.calls == [("subscribe", uri), ("unsubscribe", uri)]


async def test_a_refused_subscription_is_not_kept() -> None:
    upstream = Upstream(jsonrpc.error_response(None, -32601, "no subscriptions here"))
    subs = Subscriptions(upstream.subscribe, upstream.unsubscribe)
    reply = await subs.subscribe("s1", {"uri": "memo://a"})
    assert "error" in reply
    assert subs.table.subscribers("memo://a") == frozenset()


@pytest.mark.parametrize(
    ("session", "params", "error"),
    [
        pytest.param("s1", {}, "invalid_params", id="no-uri"),
        pytest.param("s1", {"uri": 7}, "invalid_params", id="uri-not-a-string"),
        pytest.param("", {"uri": "memo://a"}, "session_required", id="no-session"),
    ],
)
async def test_bad_subscriptions_are_refused_before_the_upstream(session: str, params: JsonObj, error: str) -> None:
    upstream = Upstream()
    subs = Subscriptions(upstream.subscribe, upstream.unsubscribe)
    with pytest.raises(GatewayError) as caught:
        await subs.subscribe(session, params)
    assert (caught.value.data or {}).get("error") == error
    assert upstream.calls == []


class SlowUpstream(Upstream):
    """Its subscribe answers only when released: the window in which a session may already unsubscribe."""

    def __init__(self, reply: JsonObj | None = None) -> None:
        super().__init__(reply)
        self.release = asyncio.Event()
        self.subscribing = asyncio.Event()

    async def subscribe(self, params: JsonObj | None, *, on_progress: ProgressCallback | None = None) -> JsonObj:
        self.calls.append(("subscribe", params))
        self.subscribing.set()
        await self.release.wait()
        return self.reply


async def test_an_unsubscribe_never_overtakes_the_subscribe_still_in_flight() -> None:
    upstream = SlowUpstream()
    subs = Subscriptions(upstream.subscribe, upstream.unsubscribe)
    subscribing = asyncio.create_task(subs.subscribe("a", {"uri": "m://x"}))
    await upstream.subscribing.wait()
    unsubscribing = asyncio.create_task(subs.unsubscribe("a", {"uri": "m://x"}))
    await asyncio.sleep(0)  # the unsubscribe runs up to its wait
    assert [c for c, _ in upstream.calls] == ["subscribe"]
    upstream.release.set()
    await asyncio.gather(subscribing, unsubscribing)
    assert [c for c, _ in upstream.calls] == ["subscribe", "unsubscribe"]  # in this order: nothing left upstream


async def test_a_session_subscribing_again_meanwhile_keeps_the_upstream_subscription() -> None:
    upstream = SlowUpstream()
    subs = Subscriptions(upstream.subscribe, upstream.unsubscribe)
    first = asyncio.create_task(subs.subscribe("a", {"uri": "m://x"}))
    await upstream.subscribing.wait()
    leaving = asyncio.create_task(subs.unsubscribe("a", {"uri": "m://x"}))
    await asyncio.sleep(0)
    joining = asyncio.create_task(subs.subscribe("b", {"uri": "m://x"}))
    upstream.release.set()
    await asyncio.gather(first, leaving, joining)
    assert "unsubscribe" not in [c for c, _ in upstream.calls]
    assert subs.table.subscribers("m://x") == frozenset({"b"})


async def test_a_failed_subscribe_is_not_followed_by_an_unsubscribe() -> None:
    upstream = SlowUpstream(jsonrpc.error_response(None, jsonrpc.INVALID_PARAMS, "no such resource"))
    subs = Subscriptions(upstream.subscribe, upstream.unsubscribe)
    subscribing = asyncio.create_task(subs.subscribe("a", {"uri": "m://x"}))
    await upstream.subscribing.wait()
    unsubscribing = asyncio.create_task(subs.unsubscribe("a", {"uri": "m://x"}))
    await asyncio.sleep(0)
    upstream.release.set()
    await asyncio.gather(subscribing, unsubscribing)
    assert [c for c, _ in upstream.calls] == ["subscribe"]

ANN_CHILD, BOB_CHILD = frozenset({("files", "ann")}), frozenset({("files", "bob")})


@pytest.mark.parametrize(
    ("steps", "upstream_calls"),
    [
        pytest.param([("+", "a", ANN_CHILD), ("+", "b", BOB_CHILD)], ["subscribe", "subscribe"],
                     id="each-child-is-subscribed-for-its-own-owner"),
        pytest.param([("+", "a", ANN_CHILD), ("+", "a2", ANN_CHILD)], ["subscribe"],
                     id="two-sessions-on-one-child-share-its-subscription"),
        pytest.param([("+", "a", ANN_CHILD), ("+", "b", BOB_CHILD), ("-", "a", ANN_CHILD)],
                     ["subscribe", "subscribe", "unsubscribe"], id="leaving-one-child-keeps-the-other"),
    ],
)
def test_an_isolated_upstream_counts_subscriptions_per_child(steps: list[tuple[str, str, frozenset[Any]]],
                                                             upstream_calls: list[str]) -> None:
    table = SubscriptionTable()
    calls = []
    for op, session, scope in steps:
        if op == "+" and table.add(session, "m://x", scope):
            calls.append("subscribe")
        elif op == "-" and table.remove(session, "m://x"):
            calls.append("unsubscribe")
    assert calls == upstream_calls


def test_an_update_from_one_child_reaches_only_the_sessions_subscribed_on_it() -> None:
    table = SubscriptionTable()
    table.add("a", "m://x", ANN_CHILD)
    table.add("b", "m://x", BOB_CHILD)
    table.add("s", "m://x")
    assert table.subscribers("m://x", ("files", "ann")) == {"a"}
    assert table.subscribers("m://x", ("files", "eve")) == frozenset()
    assert table.subscribers("m://x") == {"a", "b", "s"}


async def test_an_ended_sessions_release_goes_to_the_child_it_was_subscribed_on() -> None:
    seen: list[object] = []

    async def subscribe(params: JsonObj | None, *, on_progress: ProgressCallback | None = None) -> JsonObj:
        return jsonrpc.result_response(None, {})

    async def unsubscribe(params: JsonObj | None, *, on_progress: ProgressCallback | None = None) -> JsonObj:
        seen.append(CALLER.get())
        return jsonrpc.result_response(None, {})

    subs = Subscriptions(subscribe, unsubscribe, lambda uri: frozenset({("files", str(CALLER.get()))}))
    ann = Caller("alice", "s-ann")
    token = CALLER.set(ann)
    try:
        await subs.subscribe("s-ann", {"uri": "m://x"})
    finally:
        CALLER.reset(token)
    subs.end_session("s-ann")
    await subs.released()
    assert seen == [ann]
