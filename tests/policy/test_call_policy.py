"""The CallPolicy facade: what the transports see when they admit, settle, ask and delegate."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from satgate_mcp import events
from satgate_mcp.auth.base import Identity
from satgate_mcp.auth.macaroons import verify_token
from satgate_mcp.errors import GatewayError, UnknownTarget, UpstreamTimeout, UpstreamUnavailable
from satgate_mcp.events import RecordingPublisher
from satgate_mcp.jsonrpc import JsonObj
from satgate_mcp.metrics import Metrics
from satgate_mcp.policy import CallPolicy, FailureKind, failure_kind, refundable, upstream_certainly_did_not_run
from satgate_mcp.policy.limits import rate_spec
from tests.fakes import FakeClock
from tests.policy.helpers import ROOT_KEY, make_policy, refusals, settings, sharing_stores

ALICE = Identity("alice", budget_limit=10)
WALL = 1_700_000_000.0


def call(name: str = "echo", **arguments: Any) -> JsonObj:
    return {"name": name, "arguments": arguments}


async def admit_tool(policy: CallPolicy, identity: Identity = ALICE, tool: str = "echo", *, session: str = "s1",
                     request_id: int | str = 1, params: JsonObj | None = None) -> Any:
    return await policy.admit(identity, method="tools/call", tool=tool, session_id=session, request_id=request_id,
                              params=params if params is not None else call(tool))


async def refusal(coro: Any) -> GatewayError:
    with pytest.raises(GatewayError) as info:
        await coro
    return info.value


# -- rate limits ---------------------------------------------------------------------------------------


async def test_rate_limit_refusal_shape_and_no_charge() -> None:
    clock = FakeClock()
    policy, publisher, metrics, _ = make_policy(clock, rate_limit="2/s")
    await admit_tool(policy, request_id=1)
    await admit_tool(policy, request_id=2)
    err = await refusal(admit_tool(policy, request_id=3))
    assert (err.code, err.message, err.data) == (-32004, "rate limit exceeded",
                                                 {"error": "rate_limited", "retry_after_seconds": 1})
    assert refusals(metrics, "rate_limited") == 1
    assert publisher.named(events.RATE_LIMITED) == [
        {"token_id": "alice", "method": "tools/call", "tool": "echo", "retry_after_seconds": 1}]
    assert (await policy.budget_status(ALICE))["remaining"] == 8  # the refused call paid nothing
    clock.advance(0.5)
    await admit_tool(policy, request_id=4)


async def test_retry_after_rounds_up_for_slow_rates() -> None:
    policy, *_ = make_policy(rate_limit="6/m")
    await admit_tool(policy)
    err = await refusal(admit_tool(policy, request_id=2))
    assert err.data == {"error": "rate_limited", "retry_after_seconds": 10}


async def test_gateway_methods_share_the_bucket_other_methods_pass() -> None:
    policy, *_ = make_policy(rate_limit="1/s")
    for _ in range(3):
        await policy.admit(ALICE, method="tools/list", tool=None, session_id="s", request_id=1, params=None)
    await policy.admit(ALICE, method="satgate/budget", tool=None, session_id="s", request_id=2, params=None)
    err = await refusal(admit_tool(policy, request_id=3))
    assert err.code == -32004


async def test_rate_limit_is_per_token() -> None:
    policy, *_ = make_policy(rate_limit="1/s")
    await admit_tool(policy, ALICE)
    await admit_tool(policy, Identity("bob"))
    with pytest.raises(GatewayError):
        await admit_tool(policy, ALICE, request_id=2)


async def test_no_rate_limit_when_unset() -> None:
    policy, publisher, metrics, _ = make_policy()
    admitted = [await admit_tool(policy, Identity("free"), request_id=i) for i in range(50)]  # all at one instant
    assert len(admitted) == 50
    assert publisher.named(events.RATE_LIMITED) == []
    assert refusals(metrics, "rate_limited") == 0


async def test_per_tool_rate_limits() -> None:
    policy, *_ = make_policy(tool_rate_limits={"db_*": "1/s"}, rate_limit="100/s")
    await admit_tool(policy, tool="db_query")
    assert (await refusal(admit_tool(policy, tool="db_write", request_id=2))).code == -32004
    await admit_tool(policy, tool="echo", request_id=3)


# -- budgets ---------------------------------------------------------------------------------------------


async def test_budget_exhausted_refusal_shape() -> None:
    policy, publisher, metrics, _ = make_policy(tool_costs={"expensive": 4})
    identity = Identity("alice", budget_id="team", budget_limit=10)
    await admit_tool(policy, identity, "expensive", request_id=1)
    await admit_tool(policy, identity, "expensive", request_id=2)
    err = await refusal(admit_tool(policy, identity, "expensive", request_id=3))
    assert (err.code, err.message) == (-32000, "Budget exhausted")
    assert err.data == {"error": "budget_exhausted", "tool": "expensive", "cost_credits": 4,
                        "remaining_credits": 2, "token_id": "alice", "budget_id": "team"}
    assert refusals(metrics, "budget_exhausted") == 1
    assert publisher.named(events.BUDGET_EXHAUSTED) == [
        {"token_id": "alice", "budget_id": "team", "tool": "expensive", "cost": 4, "remaining": 2, "enforced": True}]
    assert [e["remaining"] for e in publisher.named(events.BUDGET_SPEND)] == [6, 2]


async def test_observe_charges_and_logs_but_never_refuses() -> None:
    policy, publisher, metrics, _ = make_policy(enforcement="shadow", tool_costs={"*": 4})
    for i in range(5):
        await admit_tool(policy, request_id=i)
    assert (await policy.budget_status(ALICE))["remaining"] == 0
    assert [e["enforced"] for e in publisher.named(events.BUDGET_EXHAUSTED)] == [False, False, False]
    assert refusals(metrics, "budget_exhausted") == 0


async def test_budget_status_and_unlimited() -> None:
    policy, *_ = make_policy(budgets={"team": 3})
    assert await policy.budget_status(Identity("bob")) == {"tokenId": "bob", "budgetId": "bob", "remaining": -1,
                                                         "enforcement": "control"}
    shared = Identity("carol", budget_id="team", budget_limit=100)
    await admit_tool(policy, shared)
    status = await policy.budget_status(shared)
    assert (status["budgetId"], status["remaining"]) == ("team", 2)  # the operator's 3 beat the caveat's 100


async def test_tokens_sharing_a_budget_id_share_its_credits() -> None:
    policy, *_ = make_policy(budgets={"team": 2})
    a, b = Identity("a", budget_id="team"), Identity("b", budget_id="team")
    await admit_tool(policy, a)
    await admit_tool(policy, b)
    assert (await refusal(admit_tool(policy, a, request_id=2))).data["budget_id"] == "team"  # type: ignore[index]


async def test_free_tools_stay_callable_when_exhausted() -> None:
    policy, publisher, *_ = make_policy(tool_costs={"free": 0}, default_cost=10)
    await admit_tool(policy, tool="paid")
    assert (await refusal(admit_tool(policy, tool="paid", request_id=2))).data["error"] == "budget_exhausted"  # type: ignore[index]
    free = await admit_tool(policy, tool="free", request_id=3)
    assert (free.duplicate, free.charged) == (False, 0)
    assert (await policy.budget_status(ALICE))["remaining"] == 0
    assert [(e["tool"], e["cost"]) for e in publisher.named(events.BUDGET_SPEND)] == [("paid", 10), ("free", 0)]


async def test_hundred_concurrent_admits_never_overspend() -> None:
    policy, *_ = make_policy()
    small = Identity("busy", budget_limit=7)
    results = await asyncio.gather(*(admit_tool(policy, small, request_id=i) for i in range(100)),
                                   return_exceptions=True)
    assert sum(not isinstance(r, BaseException) for r in results) == 7
    assert all(isinstance(r, GatewayError) and r.data and r.data["error"] == "budget_exhausted"
               for r in results if isinstance(r, BaseException))
    assert (await policy.budget_status(small))["remaining"] == 0


async def test_the_policy_takes_its_limits_explicitly_without_settings() -> None:
    policy = CallPolicy(publisher=RecordingPublisher(), metrics=Metrics(), clock=FakeClock(), rate=rate_spec("2/s"),
                        costs={"big": 2}, default_cost=0.5, operator_budgets={"team": 3}, enforcement="control")
    team = Identity("a", budget_id="team")
    await admit_tool(policy, team, "big", request_id=1)
    await admit_tool(policy, team, "small", request_id=2)
    assert await policy.budget_status(team) == {"tokenId": "a", "budgetId": "team", "remaining": 0.5,
                                                "enforcement": "control"}
    assert (await refusal(admit_tool(policy, team, "small", request_id=3))).code == -32004
    assert (await refusal(policy.delegate(team, {"budget": 0.5}))).data == {
        "error": "delegation_failed", "reason": "delegation needs header auth"}  # no root key given


# -- refunds ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("kind", "refunded"), [
    pytest.param(FailureKind.NOT_SENT, True, id="nothing-sent"),
    pytest.param(FailureKind.REFUSED_UNRUN, True, id="answered-32600-32601-32602"),
    pytest.param(FailureKind.ANSWERED, False, id="answered"),
    pytest.param(FailureKind.LOST_AFTER_SENDING, False, id="lost-after-sending"),
    pytest.param(FailureKind.TIMEOUT, False, id="timeout"),
    pytest.param(FailureKind.CANCELLED, False, id="cancelled"),
    pytest.param(FailureKind.OTHER, False, id="other-exception"),
])
def test_refund_only_what_certainly_never_ran(kind: FailureKind, refunded: bool) -> None:
    assert refundable(kind) is refunded


@pytest.mark.parametrize(
    ("reply", "exc", "kind"),
    [
        pytest.param(None, UpstreamUnavailable("down", sent=False), FailureKind.NOT_SENT, id="unreachable"),
        pytest.param(None, UpstreamUnavailable("died"), FailureKind.LOST_AFTER_SENDING,
                     id="unavailable-is-sent-unless-said-otherwise"),
        pytest.param({"error": {"code": -32600, "message": "bad"}}, None, FailureKind.REFUSED_UNRUN,
                     id="invalid-request"),
        pytest.param({"error": {"code": -32601, "message": "no"}}, None, FailureKind.REFUSED_UNRUN,
                     id="method-not-found"),
        pytest.param({"error": {"code": -32602, "message": "no"}}, None, FailureKind.REFUSED_UNRUN,
                     id="invalid-params"),
        pytest.param(None, UnknownTarget("no such tool"), FailureKind.REFUSED_UNRUN, id="gateway-unknown-tool"),
        pytest.param(None, UpstreamTimeout("slow"), FailureKind.TIMEOUT, id="timeout"),
        pytest.param(None, asyncio.CancelledError(), FailureKind.CANCELLED, id="cancelled"),
        pytest.param(None, RuntimeError("boom"), FailureKind.OTHER, id="other-exception"),
        pytest.param({"error": {"code": -32603, "message": "x"}}, None, FailureKind.ANSWERED, id="internal-error"),
        pytest.param({"error": {"code": "-32601"}}, None, FailureKind.ANSWERED, id="malformed-code"),
        pytest.param({"result": {"isError": True}}, None, FailureKind.ANSWERED, id="tool-error-result-ran"),
        pytest.param({"result": {}}, None, FailureKind.ANSWERED, id="result"),
    ],
)
def test_failure_kind(reply: JsonObj | None, exc: BaseException | None, kind: FailureKind) -> None:
    assert failure_kind(reply, exc) is kind
    assert upstream_certainly_did_not_run(reply, exc) is refundable(kind)


async def test_refund_when_the_call_never_ran() -> None:
    policy, publisher, *_ = make_policy()
    admission = await admit_tool(policy)
    await policy.settle(admission, ran=False)
    await policy.settle(admission, ran=False)  # settling twice refunds once
    assert (await policy.budget_status(ALICE))["remaining"] == 10
    assert publisher.named(events.BUDGET_SPEND) == [
        {"token_id": "alice", "budget_id": "alice", "tool": "echo", "cost": 1, "remaining": 9},
        {"token_id": "alice", "budget_id": "alice", "tool": "echo", "cost": -1, "refund": True, "remaining": 10}]
    # Refunded, so the re-sent call is charged as a first attempt.
    again = await admit_tool(policy)
    assert (again.duplicate, again.charged) == (False, 1)


async def test_no_refund_when_it_ran() -> None:
    policy, *_ = make_policy()
    await policy.settle(await admit_tool(policy), ran=True)
    assert (await policy.budget_status(ALICE))["remaining"] == 9


async def test_run_refunds_a_call_that_was_never_sent_and_keeps_one_lost_after_sending() -> None:
    policy, *_ = make_policy()

    async def never_sent() -> JsonObj:
        raise UpstreamUnavailable("refused", sent=False)

    async def lost() -> JsonObj:
        raise UpstreamUnavailable("reset after the request went out")

    for n, call_upstream in enumerate((never_sent, lost)):
        with pytest.raises(UpstreamUnavailable):
            await policy.run(await admit_tool(policy, request_id=n), call_upstream)
    assert (await policy.budget_status(ALICE))["remaining"] == 9


# -- duplicate guard -------------------------------------------------------------------------------------


class CountingUpstream:
    """An upstream call that counts its runs and blocks until released."""

    def __init__(self) -> None:
        self.runs = 0
        self.started = asyncio.Event()
        self.release = asyncio.Event()
        self.cancelled = asyncio.Event()

    async def __call__(self) -> JsonObj:
        self.runs += 1
        self.started.set()
        try:
            await self.release.wait()
        except asyncio.CancelledError:
            self.cancelled.set()
            raise
        return {"jsonrpc": "2.0", "id": None, "result": {"content": [], "run": self.runs}}


async def call_once(policy: CallPolicy, upstream: CountingUpstream, identity: Identity = ALICE,
                    params: JsonObj | None = None, session: str = "s1") -> JsonObj:
    return await policy.run(await admit_tool(policy, identity, session=session, params=params), upstream)


async def test_attack_identical_copies_in_flight_run_once_and_pay_once() -> None:
    policy, *_ = make_policy()
    upstream = CountingUpstream()
    copies = [asyncio.create_task(call_once(policy, upstream, params=call("echo", text="hi"))) for _ in range(20)]
    await asyncio.wait_for(upstream.started.wait(), 5)
    upstream.release.set()
    answers = await asyncio.wait_for(asyncio.gather(*copies), 5)
    assert upstream.runs == 1
    assert all(a["result"]["run"] == 1 for a in answers)
    assert (await policy.budget_status(ALICE))["remaining"] == 9


async def test_attack_a_re_send_after_settlement_is_a_new_call_and_is_refused_when_exhausted() -> None:
    policy, *_ = make_policy()
    poor = Identity("poor", budget_limit=1)
    upstream = CountingUpstream()
    upstream.release.set()
    await call_once(policy, upstream, poor)
    err = await refusal(admit_tool(policy, poor))
    assert err.data["error"] == "budget_exhausted"  # type: ignore[index]
    assert upstream.runs == 1


async def test_attack_only_one_free_re_send_of_a_call_whose_process_died() -> None:
    first, *_ = make_policy()
    await admit_tool(first, params=call("echo", text="hi"))  # charged; then its process dies in flight
    upstream = CountingUpstream()
    upstream.release.set()
    restarted = sharing_stores(first)
    await call_once(restarted, upstream, params=call("echo", text="hi"))  # the one free re-send
    assert (await restarted.budget_status(ALICE))["remaining"] == 9
    again = sharing_stores(first)  # and once more, in yet another process
    await call_once(again, upstream, params=call("echo", text="hi"))
    assert (await again.budget_status(ALICE))["remaining"] == 8
    assert upstream.runs == 2


async def test_copies_share_the_first_copys_refusal() -> None:
    policy, *_ = make_policy()
    poor = Identity("poor", budget_limit=0.5)
    upstream = CountingUpstream()
    results = await asyncio.gather(*(call_once(policy, upstream, poor) for _ in range(5)), return_exceptions=True)
    assert all(isinstance(r, GatewayError) and r.data and r.data["error"] == "budget_exhausted" for r in results)
    assert upstream.runs == 0


async def test_cancelling_one_copy_leaves_the_shared_call_running_for_the_others() -> None:
    policy, *_ = make_policy()
    upstream = CountingUpstream()
    leader = asyncio.create_task(call_once(policy, upstream))
    await asyncio.wait_for(upstream.started.wait(), 5)
    follower = asyncio.create_task(call_once(policy, upstream))
    await asyncio.sleep(0)  # one turn of the loop: the follower is admitted and joins (memory stores never wait)
    [shared] = policy._in_flight
    assert shared.waiters == 2
    leader.cancel()
    with pytest.raises(asyncio.CancelledError):
        await leader
    upstream.release.set()
    assert (await asyncio.wait_for(follower, 5))["result"]["run"] == 1
    assert not upstream.cancelled.is_set()
    assert upstream.runs == 1


async def test_when_every_copy_goes_away_the_call_is_cancelled_and_stays_charged() -> None:
    policy, *_ = make_policy()
    upstream = CountingUpstream()
    copies = [asyncio.create_task(call_once(policy, upstream)) for _ in range(3)]
    await asyncio.wait_for(upstream.started.wait(), 5)
    for task in copies:
        task.cancel()
    await asyncio.gather(*copies, return_exceptions=True)
    assert upstream.cancelled.is_set()
    assert not policy._in_flight
    assert (await policy.budget_status(ALICE))["remaining"] == 9  # it may have run


@pytest.mark.parametrize(
    ("first_settled", "original_ran", "resend_ran", "remaining"),
    [
        pytest.param("resend", False, True, 9, id="re-send-ran-then-original-refunded"),
        pytest.param("original", False, True, 9, id="original-refunded-then-re-send-ran"),
        pytest.param("original", True, True, 9, id="both-ran"),
        pytest.param("original", False, False, 10, id="neither-ran"),
        pytest.param("resend", False, False, 10, id="neither-ran-re-send-first"),
    ],
)
async def test_a_call_that_ran_is_paid_exactly_once_whichever_copy_settles_first(
        first_settled: str, original_ran: bool, resend_ran: bool, remaining: int) -> None:
    first, *_ = make_policy()
    original = await admit_tool(first, params=call("echo", text="hi"))
    other = sharing_stores(first)  # the client re-sends to another process while the original is in flight
    resend = await admit_tool(other, params=call("echo", text="hi"))
    assert resend.duplicate
    order = [(first, original, original_ran), (other, resend, resend_ran)]
    for policy, admission, ran in (order if first_settled == "original" else order[::-1]):
        await policy.settle(admission, ran=ran)
    assert (await first.budget_status(ALICE))["remaining"] == remaining


async def test_different_params_or_id_are_charged_again() -> None:
    policy, *_ = make_policy()
    await admit_tool(policy, params=call("echo", text="hi"))
    await admit_tool(policy, params=call("echo", text="bye"))
    await admit_tool(policy, request_id=2, params=call("echo", text="hi"))
    assert (await policy.budget_status(ALICE))["remaining"] == 7


async def test_no_session_id_means_no_duplicate_guard() -> None:
    policy, *_ = make_policy()
    await admit_tool(policy, session="")
    assert not (await admit_tool(policy, session="")).duplicate
    assert (await policy.budget_status(ALICE))["remaining"] == 8


async def test_an_in_flight_record_expires_after_24_hours() -> None:
    clock = FakeClock()
    first, *_ = make_policy(clock)
    await admit_tool(first)  # its process dies in flight
    clock.advance(24 * 3600)
    late = sharing_stores(first)
    assert not (await admit_tool(late)).duplicate
    assert (await late.budget_status(ALICE))["remaining"] == 8


async def test_refused_call_leaves_no_duplicate_record() -> None:
    policy, *_ = make_policy()
    poor = Identity("poor", budget_limit=0.5)
    with pytest.raises(GatewayError):
        await admit_tool(policy, poor)
    with pytest.raises(GatewayError):  # refused again, not waved through as a re-send
        await admit_tool(sharing_stores(policy), poor)


async def test_a_new_session_resets_nothing() -> None:
    """Rate buckets and budgets follow the token; only the duplicate guard looks at the session id,
    by design (it recognises one client re-sending one call, and a resumed session keeps its id)."""
    clock = FakeClock()
    policy, *_ = make_policy(clock, rate_limit="2/s")
    await admit_tool(policy, session="old", request_id=1)
    # DELETE + initialize: a new session id, the same token: same bucket, same budget.
    second = await admit_tool(policy, session="new", request_id=1)
    assert not second.duplicate
    assert (await refusal(admit_tool(policy, session="newer", request_id=1))).code == -32004
    assert (await policy.budget_status(ALICE))["remaining"] == 8
    # A resumed session keeps its id, so the call it re-sends while the first is in flight joins it.
    clock.advance(1)
    assert (await admit_tool(policy, session="old", request_id=1)).duplicate
    assert (await policy.budget_status(ALICE))["remaining"] == 8


# -- delegation ------------------------------------------------------------------------------------------

PARENT = Identity("parent-1", budget_id="team", budget_limit=10, tool_filters=(("db_*", "search"),),
                  expires_at=WALL + 3600, tenant="acme")


async def test_delegate_moves_credits_and_mints_a_narrower_child() -> None:
    policy, publisher, _, minter = make_policy(new_id=lambda: "abc")
    out = await policy.delegate(PARENT, {"budget": 4, "tools": ["db_read"], "ttl": 60, "label": "crawler"})
    assert out == {"token": "fake-token-for-dlg-abc", "tokenId": "dlg-abc", "budgetId": "dlg-budget-abc",
                   "budget": 4, "expiresAt": WALL + 60, "parentId": "parent-1", "depth": 1, "tools": ["db_read"],
                   "label": "crawler", "parentRemaining": 6}
    assert minter.calls == [{"token_id": "dlg-abc", "ttl": 60, "tools": ["db_read"], "budget_id": "dlg-budget-abc",
                             "budget_limit": 4, "tenant": "acme", "parent_id": "parent-1", "depth": 1, "now": WALL,
                             "ancestors": ("parent-1",), "max_depth": None, "resources": None, "prompts": None}]
    assert (await policy.budget_status(PARENT))["remaining"] == 6
    child = Identity("dlg-abc", budget_id="dlg-budget-abc", budget_limit=4)
    assert (await policy.budget_status(child))["remaining"] == 4
    [event] = publisher.named(events.DELEGATION)
    assert (event["ok"], event["token_id"], event["parent_id"], event["budget"], event["parent_remaining"]) == (
        True, "dlg-abc", "parent-1", 4, 6)
    assert all("fake-token" not in str(fields) for _, fields in publisher.events)


async def test_delegation_refusal_shape() -> None:
    policy, publisher, metrics, _ = make_policy()
    err = await refusal(policy.delegate(PARENT, {"budget": 11}))
    assert err.code == -32000
    assert err.data == {"error": "delegation_failed",
                        "reason": "parent budget holds 10 credits, less than the 11 requested"}
    assert refusals(metrics, "delegation_failed") == 1
    assert publisher.named(events.DELEGATION)[0]["ok"] is False
    assert (await policy.budget_status(PARENT))["remaining"] == 10


@pytest.mark.parametrize("mode", ["none", "config"])
async def test_delegation_needs_header_auth(mode: str) -> None:
    policy, *_ = make_policy(auth_mode=mode, root_key=None, static_token="s" * 8)
    err = await refusal(policy.delegate(PARENT, {"budget": 1}))
    assert err.data == {"error": "delegation_failed", "reason": "delegation needs header auth"}


async def test_delegation_depth_limit() -> None:
    policy, *_ = make_policy(max_delegation_depth=2)
    deep = Identity("deep", depth=2, budget_limit=10)
    err = await refusal(policy.delegate(deep, {"budget": 1}))
    assert err.data == {"error": "delegation_failed", "reason": "delegation depth limit (2) reached"}


async def test_unlimited_parent_gives_without_being_charged() -> None:
    policy, *_ = make_policy()
    out = await policy.delegate(Identity("rich"), {"budget": 1000})
    assert out["parentRemaining"] == -1
    assert (await policy.budget_status(Identity("rich")))["remaining"] == -1


async def test_concurrent_delegations_never_overdraw() -> None:
    ids = iter(range(1000))
    policy, *_ = make_policy(new_id=lambda: f"n{next(ids)}")
    results = await asyncio.gather(*(policy.delegate(PARENT, {"budget": 3}) for _ in range(20)),
                                   return_exceptions=True)
    assert sum(isinstance(r, dict) for r in results) == 3
    assert (await policy.budget_status(PARENT))["remaining"] == 1


async def test_child_spends_only_what_it_was_given() -> None:
    policy, *_ = make_policy(new_id=lambda: "kid")
    out = await policy.delegate(PARENT, {"budget": 2})
    child = Identity(out["tokenId"], budget_id=out["budgetId"], budget_limit=out["budget"], parent_id="parent-1",
                     depth=1)
    await admit_tool(policy, child, request_id=1)
    await admit_tool(policy, child, request_id=2)
    assert (await refusal(admit_tool(policy, child, request_id=3))).data["budget_id"] == "dlg-budget-kid"  # type: ignore[index]
    assert (await policy.budget_status(PARENT))["remaining"] == 8


async def test_minter_errors_become_delegation_failed() -> None:
    def broken(*args: Any, **kwargs: Any) -> str:
        raise ValueError("invalid tool pattern")

    policy = CallPolicy.from_settings(settings(), publisher=RecordingPublisher(), metrics=Metrics(), minter=broken,
                                      wall_clock=FakeClock(WALL))
    err = await refusal(policy.delegate(PARENT, {"budget": 1}))
    assert err.data == {"error": "delegation_failed", "reason": "could not mint the child token: invalid tool pattern"}
    assert (await policy.budget_status(PARENT))["remaining"] == 10


async def test_delegation_with_the_real_minter_verifies() -> None:
    wall = FakeClock(WALL)
    policy = CallPolicy.from_settings(settings(), publisher=RecordingPublisher(), metrics=Metrics(), wall_clock=wall)
    root = Identity("root-tok", budget_limit=100, tool_filters=(("db_*",),), expires_at=WALL + 600)
    first = await policy.delegate(root, {"budget": 30, "tools": "db_read,db_list", "ttl": 300})
    child = verify_token(ROOT_KEY, first["token"], now=WALL + 1)
    assert (child.token_id, child.budget_id, child.budget_limit, child.parent_id, child.depth, child.ancestors) == (
        first["tokenId"], first["budgetId"], 30, "root-tok", 1, ("root-tok",))
    assert child.expires_at == pytest.approx(WALL + 300)
    assert child.allows_tool("db_read")
    assert not child.allows_tool("db_write")
    grandchild = verify_token(ROOT_KEY, (await policy.delegate(child, {"budget": 5}))["token"], now=WALL + 1)
    assert (grandchild.ancestors, grandchild.depth, grandchild.budget_limit) == (
        ("root-tok", first["tokenId"]), 2, 5)
    assert grandchild.allows_tool("db_list")
    assert not grandchild.allows_tool("db_write")
    assert (await policy.budget_status(child))["remaining"] == 25


# -- delegation: rate family and numbers -----------------------------------------------------------------


async def test_attack_children_share_their_roots_rate_bucket() -> None:
    policy, *_ = make_policy(rate_limit="2/s")
    root = Identity("root")
    children = [Identity(f"dlg-{n}", parent_id="root", depth=1, ancestors=("root",)) for n in range(10)]
    await admit_tool(policy, root, request_id=1)
    await admit_tool(policy, children[0], request_id=2)
    for n, child in enumerate(children):
        assert (await refusal(admit_tool(policy, child, request_id=10 + n))).code == -32004
    grandchild = Identity("dlg-deep", parent_id="dlg-0", depth=2, ancestors=("root", "dlg-0"))
    assert (await refusal(admit_tool(policy, grandchild, request_id=99))).code == -32004


async def test_attack_a_delegate_loop_is_refused_once_the_family_bucket_is_empty() -> None:
    """A parent with unlimited credits mints children in a loop: the loop and every child draw from one bucket."""
    clock = FakeClock()
    policy = CallPolicy.from_settings(settings(rate_limit="5/s"), publisher=RecordingPublisher(), metrics=Metrics(),
                                      clock=clock, wall_clock=FakeClock(WALL))
    root = Identity("root")

    async def delegate_once(n: int) -> Identity:
        await policy.admit(root, method="satgate/delegate", tool=None, session_id="s", request_id=n, params=None)
        return verify_token(ROOT_KEY, (await policy.delegate(root, {"budget": 1}))["token"], now=WALL)

    children = [await delegate_once(n) for n in range(5)]
    assert (await refusal(delegate_once(5))).code == -32004
    admitted = len(children)
    for n, child in enumerate(children):
        assert (await refusal(admit_tool(policy, child, request_id=100 + n))).code == -32004
    assert admitted == 5  # the bucket's burst, shared by the root, its loop and all its children


@pytest.mark.parametrize("params", [
    pytest.param({"budget": 1e15}, id="budget-1e15"),
    pytest.param({"budget": 1e300}, id="budget-1e300"),
    pytest.param({"budget": float("inf")}, id="budget-inf"),
    pytest.param({"budget": float("nan")}, id="budget-nan"),
    pytest.param({"budget": 10**400}, id="budget-400-digits"),
    pytest.param({"budget": -1}, id="budget-negative"),
    pytest.param({"budget": 1, "ttl": 1e15}, id="ttl-1e15"),
    pytest.param({"budget": 1, "ttl": 1e300}, id="ttl-1e300"),
    pytest.param({"budget": 1, "ttl": float("inf")}, id="ttl-inf"),
    pytest.param({"budget": 1, "ttl": 10**400}, id="ttl-400-digits"),
    pytest.param({"budget": 1, "ttl": -5}, id="ttl-negative"),
    pytest.param({"budget": 1, "ttl": 1e15 - 1_000_000}, id="expiry-beyond-what-a-caveat-carries"),
])
async def test_attack_out_of_range_numbers_are_refused_before_any_credit_moves(params: JsonObj) -> None:
    policy = CallPolicy.from_settings(settings(), publisher=RecordingPublisher(), metrics=Metrics(),
                                      wall_clock=FakeClock(WALL))
    parent = Identity("parent", budget_limit=10)
    err = await refusal(policy.delegate(parent, params))
    assert err.data is not None
    assert err.data["error"] == "delegation_failed"
    assert (await policy.budget_status(parent))["remaining"] == 10


async def test_a_minted_child_that_does_not_verify_moves_no_credits() -> None:
    def unverifiable(root_key: str, token: str) -> Identity:
        raise ValueError("signature does not verify")

    policy = CallPolicy.from_settings(settings(), publisher=RecordingPublisher(), metrics=Metrics(),
                                      wall_clock=FakeClock(WALL), verifier=unverifiable)
    err = await refusal(policy.delegate(PARENT, {"budget": 4}))
    assert err.data == {"error": "delegation_failed", "reason": "the minted child token does not verify"}
    assert (await policy.budget_status(PARENT))["remaining"] == 10


async def test_an_unlimited_parents_children_accounts_expire_with_them() -> None:
    clock = FakeClock()
    ids = iter(range(1000))
    policy = CallPolicy.from_settings(settings(), publisher=RecordingPublisher(), metrics=Metrics(), clock=clock,
                                      wall_clock=FakeClock(WALL), new_id=lambda: f"n{next(ids)}")
    for _ in range(50):
        await policy.delegate(Identity("rich"), {"budget": 1, "ttl": 30})
    assert len(policy._budgets) == 50  # type: ignore[arg-type]
    clock.advance(30 + 300)
    assert len(policy._budgets) == 0  # type: ignore[arg-type]
