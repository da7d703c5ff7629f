"""The pieces every transport shares (checks, session gate, call runner), built as create_app wires them."""

from __future__ import annotations

from typing import NamedTuple

from satgate_mcp import jsonrpc
from satgate_mcp.auth.base import Authenticator, Identity, NoAuthenticator
from satgate_mcp.dispatch import Dispatcher
from satgate_mcp.events import RecordingPublisher
from satgate_mcp.inflight import InflightLimiter
from satgate_mcp.jsonrpc import JsonObj
from satgate_mcp.metrics import Metrics
from satgate_mcp.sessions import Session, SessionRegistry
from satgate_mcp.settings import Settings
from satgate_mcp.transport.call_runner import CallRunner
from satgate_mcp.transport.checks import Principal, RequestChecks
from satgate_mcp.transport.session_gate import SessionGate
from tests.fakes import AllowAllPolicy, FakeClock, FakePool

ALICE = Principal("tok-alice", Identity(token_id="alice"))


class Pieces(NamedTuple):
    checks: RequestChecks
    gate: SessionGate
    runner: CallRunner


def make_pieces(pool: FakePool, *, per_token: int = 64, authenticator: Authenticator | None = None,
                metrics: Metrics | None = None) -> Pieces:
    publisher = RecordingPublisher()
    metrics = metrics or Metrics()
    settings = Settings()
    registry = SessionRegistry(cap=10, idle_ttl=60.0, publisher=publisher, clock=FakeClock())
    dispatcher = Dispatcher(pool, publisher=publisher, metrics=metrics, policy=AllowAllPolicy())
    checks = RequestChecks(settings=settings, authenticator=authenticator or NoAuthenticator(), publisher=publisher,
                           metrics=metrics)
    runner = CallRunner(dispatcher=dispatcher, registry=registry, metrics=metrics,
                        limiter=InflightLimiter(per_token=per_token, total=1024))
    gate = SessionGate(settings=settings, registry=registry, checks=checks, dispatcher=dispatcher,
                       publisher=publisher, metrics=metrics, stop_calls=runner.stop_session)
    return Pieces(checks, gate, runner)


def open_session(gate: SessionGate) -> Session:
    session = gate.open_session(ALICE, "2025-06-18")
    assert isinstance(session, Session)
    return session


def call(request_id: int, name: str) -> jsonrpc.Request:
    return jsonrpc.Request(request_id, "tools/call", {"name": name, "arguments": {}})


def text_of(reply: JsonObj) -> str:
    return str(reply["result"]["content"][0]["text"])
