"""The hold and confirmation machinery (policy/holds.py) on its own: which answers let a call go, what each held
outcome tells the agent, and a waiting call: approved from elsewhere it runs once (with progress while it
waits), denied or expired it is refused, a store that cannot answer refuses (a hold is never waived)."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

import pytest

from satgate_mcp import jsonrpc
from satgate_mcp.auth.base import Identity
from satgate_mcp.errors import GatewayError
from satgate_mcp.events import RecordingPublisher
from satgate_mcp.guards import Asked
from satgate_mcp.jsonrpc import JsonObj
from satgate_mcp.metrics import Metrics
from satgate_mcp.policy.approvals import HeldCall, HoldOutcome
from satgate_mcp.policy.holds import Holds, confirm_request, confirmation_answer, held_refusal
from satgate_mcp.stores.memory_approvals import MemoryApprovalStore

NOW = 1_800_000_000.0


@pytest.mark.parametrize(("answer", "outcome"), [
    ({"result": {"action": "accept", "content": {"confirm": True}}}, "accepted"),
    ({"result": {"action": "accept", "content": {"confirm": False}}}, "declined"),
    ({"result": {"action": "accept", "content": {"confirm": "true"}}}, "declined"),
    ({"result": {"action": "accept"}}, "declined"),
    ({"result": {"action": "decline"}}, "declined"),
    ({"result": {"action": "cancel"}}, "declined"),
    ({"result": "yes"}, "declined"),
    ({"error": {"code": -32600, "message": "no answer within 60s", "data": {"error": "not_relayed"}}}, "declined"),
    ({"error": {"code": -32600, "message": "no elicitation", "data": {"error": "not_relayed", "cannot_ask": True}}},
     "unavailable"),
    ({"error": {"code": -32601, "message": "Method not found"}}, "declined"),
])
def test_only_an_explicit_yes_lets_the_call_go(answer: JsonObj, outcome: str) -> None:
    assert confirmation_answer(answer) == outcome


def test_the_question_names_the_tool_and_the_listed_arguments_only() -> None:
    params = confirm_request("Really?", "delete_file", ("path", "force"), {"path": "/tmp/x", "token": "secret"})
    assert params["message"] == "Really?\n\nTool: delete_file\npath: /tmp/x\nforce: (not given)"
    assert params["requestedSchema"]["required"] == ["confirm"]


def record(**changes: Any) -> HeldCall:
    base = HeldCall("apr_1", "fp", "agent", "agent", "pay", "{}", "amount above 50", NOW, NOW + 900)
    return replace(base, **changes)


@pytest.mark.parametrize(("outcome", "error", "extra"), [
    (HoldOutcome("requested", record()), "approval_required", {"approval_id": "apr_1"}),
    (HoldOutcome("pending", record()), "approval_required", {"approval_id": "apr_1"}),
    (HoldOutcome("denied", record(state="denied", note="no")), "approval_denied", {"reason": "no"}),
    (HoldOutcome("expired", record()), "approval_expired", {"approval_id": "apr_1"}),
    (HoldOutcome("full"), "approval_queue_full", {"pending_limit": 20}),
])
def test_each_held_outcome_tells_the_agent_what_to_do(outcome: HoldOutcome, error: str, extra: dict[str, Any]
                                                      ) -> None:
    refusal = held_refusal(outcome, "pay", 20)
    assert refusal.code == jsonrpc.TOOL_NOT_ALLOWED
    data = refusal.data or {}
    assert data["error"] == error
    assert extra.items() <= data.items()


class Clock:
    """Seconds that move only when told to."""

    def __init__(self) -> None:
        self.now = NOW

    def __call__(self) -> float:
        return self.now


class ToldStore(MemoryApprovalStore):
    """Says when a call was recorded (the waiting call then waits)."""

    def __init__(self) -> None:
        super().__init__()
        self.recorded = asyncio.Event()

    async def hold(self, request: HeldCall, now: float, per_family: int) -> HoldOutcome:
        outcome = await super().hold(request, now, per_family)
        self.recorded.set()
        return outcome


class Progress(list[JsonObj]):
    """The progress a waiting call sent, and an event for the first."""

    def __init__(self) -> None:
        super().__init__()
        self.first = asyncio.Event()

    async def __call__(self, params: JsonObj) -> None:
        self.append(params)
        self.first.set()


def waiting(progress: Progress) -> Asked:
    async def relay(params: JsonObj) -> None:
        await progress(params)

    identity = Identity("agent")
    return Asked("tools/call", identity, "s1", "tool", "pay",
                 {"name": "pay", "arguments": {"amount": 60}, "_meta": {"progressToken": "p1"}}, on_progress=relay)


async def test_a_waiting_call_runs_once_when_approved_elsewhere_and_reports_progress() -> None:
    store, clock, progress, ran = ToldStore(), Clock(), Progress(), []
    holds = Holds(store, publisher=RecordingPublisher(), metrics=Metrics(), ttl=900, per_family=20, clock=clock)

    async def proceed() -> JsonObj:
        ran.append(True)
        return jsonrpc.result_response(1, {"content": []})

    call = asyncio.create_task(holds.hold(waiting(progress), "amount above 50", 30, proceed))
    await store.recorded.wait()
    [held] = await store.listing(clock())
    clock.now += 6  # past one progress interval: the next look tells the client it still waits
    holds.decided(held.id)  # wakes the waiting call without a decision: it only looks
    await progress.first.wait()
    assert progress[0]["progressToken"] == "p1"
    assert held.id in progress[0]["message"]
    await store.decide(held.id, True, "ops", None, clock())  # another process: found within half a second
    assert "result" in await call
    assert ran == [True]
    assert (await store.get(held.id)).state == "consumed"  # type: ignore[union-attr]


@pytest.mark.parametrize("ending", ["denied", "expired", "wait-over"])
async def test_a_waiting_call_not_approved_is_refused(ending: str) -> None:
    store, clock = ToldStore(), Clock()
    holds = Holds(store, publisher=RecordingPublisher(), metrics=Metrics(), ttl=20, per_family=20, clock=clock)

    async def proceed() -> JsonObj:
        raise AssertionError("a refused call never runs")

    call = asyncio.create_task(holds.hold(waiting(Progress()), "every call", 10, proceed))
    await store.recorded.wait()
    [held] = await store.listing(clock())
    if ending == "denied":
        await store.decide(held.id, False, "ops", "not today", clock())
    else:
        clock.now += 25 if ending == "expired" else 11
    holds.decided(held.id)
    with pytest.raises(GatewayError) as refused:
        await call
    expected = {"denied": "approval_denied", "expired": "approval_expired", "wait-over": "approval_required"}
    assert (refused.value.data or {})["error"] == expected[ending]


class DownStore(MemoryApprovalStore):
    async def hold(self, request: HeldCall, now: float, per_family: int) -> HoldOutcome:
        raise ConnectionError("store down")


async def test_a_store_that_cannot_answer_refuses_the_call() -> None:
    holds = Holds(DownStore(), publisher=RecordingPublisher(), metrics=Metrics(), ttl=900, per_family=20)

    async def proceed() -> JsonObj:
        raise AssertionError("never run unheld")

    with pytest.raises(GatewayError) as refused:
        await holds.hold(waiting(Progress()), "every call", None, proceed)
    assert (refused.value.data or {})["error"] == "store_unavailable"
