"""The tool-controls guard in a header-mode gateway: argument rules refuse before the upstream (a narrowed token
cannot widen them), approvals and confirmations hold the call before the upstream, a token without controls is
not judged, a malformed control is a 401, and observe mode counts without refusing only when the operator chose
it."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Coroutine
from typing import Any

import pytest
from aiohttp import web
from pydantic import SecretStr
from pytest_aiohttp import AiohttpClient

from satgate_mcp import events
from satgate_mcp.app import create_app
from satgate_mcp.auth.macaroons import add_caveats
from satgate_mcp.events import RecordingPublisher
from satgate_mcp.keys import METRICS
from satgate_mcp.policy.approval_webhook import verify
from satgate_mcp.policy.control_guard import enforces
from satgate_mcp.policy.controls import parse_controls
from satgate_mcp.settings import Settings
from tests.auth.test_controls_caveat import raw_token
from tests.fakes import AllowAllPolicy, FakePool
from tests.policy.control_gateway import KEY, TOOLS, ControlGateway, refusal, token

Factory = Callable[..., Coroutine[Any, Any, ControlGateway]]


@pytest.fixture
def make_gateway(aiohttp_client: AiohttpClient) -> Factory:
    async def make(**settings: Any) -> ControlGateway:
        pool, publisher = FakePool(TOOLS), RecordingPublisher()
        configured = Settings(auth_mode="header", root_key=SecretStr(KEY), state_dir="memory", **settings)
        app = create_app(configured, pool=pool, policy=AllowAllPolicy(), publisher=publisher)
        return ControlGateway(await aiohttp_client(app), pool, publisher)

    return make


@pytest.mark.parametrize(("enforcement", "explicit", "refuses"), [
    pytest.param("observe", False, True, id="default-observe-still-enforces-controls"),
    pytest.param("observe", True, False, id="operator-chose-observe"),
    pytest.param("control", False, True, id="control-default"),
    pytest.param("control", True, True, id="operator-chose-control"),
])
def test_controls_are_enforced_unless_the_operator_chose_observe(enforcement: str, explicit: bool,
                                                                 refuses: bool) -> None:
    assert enforces(enforcement, explicit) is refuses


APPROVE_AND_CONFIRM = {"approvals": [{"tools": ["pay*"], "field": "amount", "above": "50"}, {"tools": ["deploy"]}],
                       "confirm": [{"tools": ["delete_*"], "message": "Really delete?", "fields": ["path"]}]}


async def test_approval_and_confirmation_hold_the_call_before_the_upstream(make_gateway: Factory) -> None:
    gw = await make_gateway()
    bearer = token(APPROVE_AND_CONFIRM)
    session = await gw.session(bearer)
    held = refusal(await gw.call(bearer, session, "pay", {"amount": 51}))
    assert held["error"] == "approval_required"
    assert held["approval_id"].startswith("apr_")
    assert refusal(await gw.call(bearer, session, "deploy", {}))["error"] == "approval_required"
    # A missing or non-numeric amount cannot be shown to be small: held too.
    assert refusal(await gw.call(bearer, session, "pay", {"amount": "lots"}))["error"] == "approval_required"
    assert refusal(await gw.call(bearer, session, "pay", {}))["error"] == "approval_required"
    # This client declared no elicitation: its user cannot be asked, so the call is refused (fail closed).
    assert refusal(await gw.call(bearer, session, "delete_file", {"path": "/x"})) == {
        "error": "confirmation_unavailable", "tool": "delete_file"}
    assert gw.forwarded("pay") == gw.forwarded("deploy") == gw.forwarded("delete_file") == 0
    assert "result" in await gw.call(bearer, session, "pay", {"amount": "50"})
    assert "result" in await gw.call(bearer, session, "echo", {"text": "hi"})
    assert gw.forwarded("pay") == 1
    assert len(gw.publisher.named(events.APPROVAL_REQUESTED)) == 4
    assert [c["answer"] for c in gw.publisher.named(events.CONFIRMATION)] == ["unavailable"]


async def test_observe_chosen_by_the_operator_counts_and_lets_through(make_gateway: Factory) -> None:
    gw = await make_gateway(enforcement="observe")
    bearer = token(APPROVE_AND_CONFIRM)
    session = await gw.session(bearer)
    assert "result" in await gw.call(bearer, session, "pay", {"amount": 500})
    assert "result" in await gw.call(bearer, session, "delete_file", {"path": "/x"})
    assert gw.forwarded("pay") == gw.forwarded("delete_file") == 1
    observed = gw.publisher.named(events.CONTROL_BREACH)
    assert [(b["error"], b["enforced"]) for b in observed] == [("approval_required", False),
                                                               ("confirmation_required", False)]
    assert gw.publisher.named(events.APPROVAL_REQUESTED) == gw.publisher.named(events.CONFIRMATION) == []
    app = gw.client.app
    assert app is not None
    rendered = app[METRICS].render().decode()
    assert 'satgate_control_breaches_total{error="approval_required",mode="observed"} 1.0' in rendered


async def test_a_token_without_controls_is_not_judged(make_gateway: Factory) -> None:
    gw = await make_gateway()
    bearer = token()
    session = await gw.session(bearer)
    assert "result" in await gw.call(bearer, session, "deploy", {})
    assert gw.publisher.named(events.CONTROL_BREACH) == []


@pytest.mark.parametrize("predicate", [
    pytest.param('controls = {"approvals": [{"tools": ["pay"], "wait": 600}]}', id="wait-too-long"),
    pytest.param('controls = {"holds": [{"tools": ["pay"]}]}', id="unknown-control"),
])
async def test_a_token_with_a_malformed_control_is_refused_401(make_gateway: Factory, predicate: str) -> None:
    gw = await make_gateway()
    status, _ = await gw.post(raw_token(predicate), {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}})
    assert status == 401


async def test_argument_rules_refuse_before_the_upstream_and_a_narrowed_token_cannot_widen(
        make_gateway: Factory) -> None:
    gw = await make_gateway()
    parent = token({"args": [{"tools": ["pay*"], "field": "vendor", "one_of": ["acme"]},
                             {"tools": ["fetch"], "field": "url", "url": {"hosts": ["api.example.com"]}}]})
    child = add_caveats(parent, controls=parse_controls(json.dumps(
        {"args": [{"tools": ["pay*"], "field": "vendor", "one_of": ["acme", "evil"]}]})))
    for bearer in (parent, child):
        session = await gw.session(bearer)
        assert refusal(await gw.call(bearer, session, "pay", {"vendor": "evil", "amount": 1})) == {
            "error": "argument_denied", "tool": "pay", "field": "vendor", "allowed": ["acme"]}
        assert refusal(await gw.call(bearer, session, "pay_later", {}))["field"] == "vendor"
        answer = await gw.call(bearer, session, "fetch", {"url": "https://api.example.com@evil.com/"})
        assert refusal(answer)["allowed"] == {"hosts": ["api.example.com"], "schemes": ["https"]}
        assert "evil.com" not in json.dumps(answer)
        assert "result" in await gw.call(bearer, session, "pay", {"vendor": "acme", "amount": 1})
        assert "result" in await gw.call(bearer, session, "fetch", {"url": "https://api.example.com/x"})
    assert gw.forwarded("pay") == gw.forwarded("fetch") == 2
    assert gw.forwarded("pay_later") == 0


@pytest.mark.parametrize(("environment", "explicit"), [
    pytest.param({"SATGATE_ENFORCEMENT": "observe"}, True, id="set-in-the-environment"),
    pytest.param({"SATGATE_ENFORCEMENT": "shadow"}, True, id="older-name"),
    pytest.param({}, False, id="unset"),
])
def test_the_settings_tell_an_operators_observe_from_the_default(monkeypatch: pytest.MonkeyPatch,
                                                                 environment: dict[str, str], explicit: bool) -> None:
    monkeypatch.delenv("SATGATE_ENFORCEMENT", raising=False)
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    settings = Settings()
    assert settings.enforcement == "observe"
    assert enforces(settings.enforcement, "enforcement" in settings.model_fields_set) is not explicit


async def test_each_approval_request_reaches_the_webhook_signed(make_gateway: Factory, aiohttp_server: Any) -> None:
    got: list[tuple[dict[str, str], bytes]] = []
    arrived = asyncio.Event()

    async def receive(request: web.Request) -> web.Response:
        got.append((dict(request.headers), await request.read()))
        arrived.set()
        return web.Response()

    receiver = web.Application()
    receiver.router.add_post("/hook", receive)
    server = await aiohttp_server(receiver)
    secret = "hook-secret-0123456789abcdef"
    gw = await make_gateway(approval_webhook=str(server.make_url("/hook")), approval_webhook_secret=SecretStr(secret))
    bearer = token(APPROVE_AND_CONFIRM)
    session = await gw.session(bearer)
    held = refusal(await gw.call(bearer, session, "pay", {"amount": 51, "card": "4111-secret"}))
    await arrived.wait()
    [(headers, body)] = got
    assert verify(secret, headers["X-Satgate-Timestamp"], body, headers["X-Satgate-Signature"])
    payload = json.loads(body)
    assert (payload["event"], payload["approval_id"], payload["tool"], payload["arguments"]) == (
        "approval_requested", held["approval_id"], "pay", '{"amount": 51}')
    assert "4111-secret" not in body.decode()
