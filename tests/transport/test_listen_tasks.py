"""The tasks extension's ``taskIds`` on listen streams, without HTTP: what a request may ask, what the gateway
tells each upstream it follows, and who hears a task's status."""

from __future__ import annotations

import asyncio

import pytest

from satgate_mcp import jsonrpc
from satgate_mcp.contracts import UnmeteredPolicy
from satgate_mcp.task_ids import TaskRef, derive_task_keys, seal_task_id
from satgate_mcp.task_relay import TaskRelay
from satgate_mcp.transport.listen import MAX_TASK_IDS, Asked, Listeners, ListenFilter, requested_filter
from satgate_mcp.upstream.wire import listen_params
from tests.fakes import FakePool

KEYS = derive_task_keys(["listen-tasks-key"])
ALICE = ("tok-alice", "token:tok-alice")


def sealed(ref: TaskRef, owner: tuple[str, str] = ALICE) -> str:
    return seal_task_id(KEYS, ref, token_id=owner[0], session_id=owner[1])


@pytest.mark.parametrize(("notifications", "expected"), [
    ({"taskIds": ["a", "b", "a"]}, Asked(set(), [], ["a", "b"])),
    ({"toolsListChanged": True}, Asked({"toolsListChanged"}, [], [])),
    ({"taskIds": "a"}, "notifications.taskIds must be a list of task ids"),
    ({"taskIds": ["a", 3]}, "notifications.taskIds must be a list of task ids"),
    ({"taskIds": [""]}, "notifications.taskIds must be a list of task ids"),
    ({"taskIds": [str(n) for n in range(MAX_TASK_IDS + 1)]}, f"at most {MAX_TASK_IDS} task ids per stream"),
    ({"resourceSubscriptions": [1]}, "notifications.resourceSubscriptions must be a list of URIs"),
])
def test_requested_filter(notifications: dict[str, object], expected: Asked | str) -> None:
    assert requested_filter({"notifications": notifications}) == expected


def test_the_acknowledgement_names_the_followed_tasks() -> None:
    assert ListenFilter(tasks=frozenset({"s2", "s1"})).as_wire() == {"taskIds": ["s1", "s2"]}


def test_an_upstream_listen_filter_carries_the_followed_task_ids() -> None:
    notifications = listen_params(["u"], ["t2", "t1"])["notifications"]
    assert notifications["taskIds"] == ["t1", "t2"]
    assert "taskIds" not in listen_params(["u"])["notifications"]


def test_only_the_callers_own_ids_are_followed() -> None:
    relay = TaskRelay(FakePool(), UnmeteredPolicy(), KEYS)
    mine, bobs = TaskRef("up", "t1"), TaskRef("up", "t2")
    asked = [sealed(mine), sealed(bobs, ("tok-bob", "token:tok-bob")), "sgt1.forged.id", "raw-upstream-id"]
    assert relay.listened(asked, token_id=ALICE[0], session_id=ALICE[1]) == {mine: sealed(mine)}


async def test_each_upstream_is_told_the_union_of_what_its_listeners_follow() -> None:
    pool = FakePool()
    relay = TaskRelay(pool, UnmeteredPolicy(), KEYS)
    a1, a2, b1 = TaskRef("a", "1"), TaskRef("a", "2"), TaskRef("b", "1")
    await relay.watch("listen:1", frozenset({a1, b1}))
    await relay.watch("listen:2", frozenset({a1, a2}))
    assert pool.watched_tasks == {"a": frozenset({"1", "2"}), "b": frozenset({"1"})}
    told = dict(pool.watched_tasks)
    await relay.watch("listen:1", frozenset())  # a1 is still followed by listen:2: "a" is told nothing new
    assert pool.watched_tasks == {**told, "b": frozenset()}
    await relay.watch("listen:2", frozenset())
    assert pool.watched_tasks == {"a": frozenset(), "b": frozenset()}


async def test_a_status_reaches_the_streams_that_follow_that_task_only() -> None:
    listeners = Listeners()
    ref = TaskRef("up", "t1")
    following = listeners.open(7, ListenFilter(tasks=frozenset({sealed(ref)})))
    following.task_refs = {ref: sealed(ref)}
    other = listeners.open(8, ListenFilter())
    elsewhere = listeners.open(9, ListenFilter())
    elsewhere.task_refs = {TaskRef("other-upstream", "t1"): "x"}  # the same id on another upstream
    listeners.task_notice("up", "notifications/tasks", {"taskId": "t1", "status": "completed"})
    listeners.task_notice("up", "notifications/tasks/status", {"taskId": "t1", "status": "completed"})  # 2025's
    message = await asyncio.wait_for(following.queue.get(), 1)
    assert message == jsonrpc.notification_message("notifications/tasks", {
        "taskId": sealed(ref), "status": "completed", "_meta": {"io.modelcontextprotocol/subscriptionId": 7}})
    assert [following.queue.qsize(), other.queue.qsize(), elsewhere.queue.qsize()] == [0, 0, 0]
