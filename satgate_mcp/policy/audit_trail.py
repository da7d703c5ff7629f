"""What the gateway records in its audit trail, and when it refuses a call it could not record.

The dispatcher hands every audited call (``tools/call``, ``resources/read``, ``prompts/get``) to ``Auditor.around``
before anything else judges it, so one line records each call whatever became of it: served, failed, or refused
by a caveat, a scope, a policy rule, a pin, a rate limit or a budget (the refusal's ``data.error`` and ``data.rule``
become ``decision`` and ``rule``). Refusals before any dispatch (a credential that does not verify, a scope the
transport challenges) reach it as events (``AuditEvents``). With ``SATGATE_AUDIT_FAIL_MODE=closed`` a call the
trail cannot take (its queue is full, or its disk fails) is refused 503 + ``Retry-After`` before it runs: an
unaudited call is what an operator who turns the trail on asked not to allow.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol

from satgate_mcp import events, jsonrpc
from satgate_mcp.auth.base import Identity
from satgate_mcp.guards import REMOTE_ADDR, ClientFacts
from satgate_mcp.jsonrpc import JsonObj
from satgate_mcp.policy.audit import AUDITED_METHODS, ArgsMode, args_digest, outcome_of, timestamp

#: Seconds a client is told to wait when the trail cannot take its call.
AUDIT_RETRY_AFTER_SECONDS = 1


class AuditSink(Protocol):
    """The writer (stores/audit_file.py)."""

    healthy: bool
    wall_clock: Callable[[], float]

    @property
    def full(self) -> bool: ...
    def submit(self, record: Mapping[str, Any]) -> bool: ...


def audit_unavailable(request_id: jsonrpc.RequestId) -> JsonObj:
    """The answer to a call the trail cannot record (closed fail mode): the transport sends it as 503 +
    Retry-After, like a store fault, so a client backs off and retries."""
    return jsonrpc.error_response(request_id, jsonrpc.SERVER_ERROR,
                                  "Service unavailable: the audit trail cannot record this call; retry shortly",
                                  {"error": "audit_unavailable", "retry_after_seconds": AUDIT_RETRY_AFTER_SECONDS})


class Auditor:
    def __init__(self, sink: AuditSink, *, args: ArgsMode = "digest", fail_closed: bool = True,
                 cost_of: Callable[[str], float] | None = None,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.sink = sink
        self._args: ArgsMode = args
        self._fail_closed = fail_closed
        self._cost_of = cost_of
        self._clock = clock

    def accepting(self) -> bool:
        return self.sink.healthy and not self.sink.full

    async def around(self, request: jsonrpc.Request, identity: Identity, session_id: str, client: ClientFacts | None,
                     upstream_of: Callable[[str, str], str | None], run: Callable[[], Awaitable[JsonObj]]) -> JsonObj:
        """Run one audited call (or refuse it, closed mode, when the trail cannot take it) and record it.

        On every audited call's path: one dict built in place, no helper dicts merged into it."""
        method = request.method
        event, field, param = AUDITED_METHODS[method]
        params = request.params or {}
        target = params.get(param)
        target = target[:1000] if isinstance(target, str) else None
        started = self._clock()
        if self._fail_closed and not self.accepting():
            reply = audit_unavailable(request.id)
        else:
            reply = await run()
        outcome = outcome_of(reply)
        sink = self.sink
        record: dict[str, Any] = {
            "ts": timestamp(sink.wall_clock()), "event": event, "token_id": identity.token_id,
            "tenant": identity.tenant, "subject": identity.subject, "session": session_id or None,
            "client": _client(client),
            "upstream": upstream_of(method, target) if target is not None else None, field: target}
        if method != "resources/read" and self._args != "none":
            arguments = params.get("arguments", {})
            if self._args == "full":
                record["args"] = arguments
            else:
                record["args_sha256"] = args_digest(arguments)
        record["decision"], record["rule"], record["outcome"] = outcome.decision, outcome.rule, outcome.outcome
        record["code"], record["reason"] = outcome.code, outcome.reason
        record["duration_ms"] = round((self._clock() - started) * 1000, 2)
        record["cost"] = self._cost(method, target, outcome.outcome)
        sink.submit(record)
        return reply

    def _cost(self, method: str, target: str | None, outcome: str) -> float | None:
        if self._cost_of is None or method != "tools/call" or target is None:
            return None
        return self._cost_of(target) if outcome != "refused" else 0.0

    def relayed(self, identity: Identity, session_id: str, method: str, answer: JsonObj, seconds: float) -> None:
        """A request an upstream relayed to the client mid-call (elicitation, sampling, roots) and its answer."""
        outcome = outcome_of(answer)
        refused = outcome.reason == "not_relayed"
        self.record("client_request", **_who(identity), session=session_id, method=method,
                    outcome="refused" if refused else outcome.outcome, code=outcome.code,
                    reason=outcome.reason, duration_ms=round(seconds * 1000, 2))

    def record(self, event: str, **fields: Any) -> None:
        """One line about something other than a call (an auth refusal, a console action)."""
        self.sink.submit({"ts": timestamp(self.sink.wall_clock()), "event": event, **fields})


def _who(identity: Identity) -> dict[str, Any]:
    return {"token_id": identity.token_id, "tenant": identity.tenant, "subject": identity.subject}


def _client(client: ClientFacts | None) -> dict[str, Any] | None:
    if client is None:
        return {"remote_addr": REMOTE_ADDR.get()}
    return {"name": client.name, "version": client.version, "protocol": client.protocol,
            "remote_addr": REMOTE_ADDR.get()}


class AuditEvents:
    """A publisher that turns the refusals made before dispatch into audit lines: a credential that did not verify
    (``auth_failure``), a scope the transport challenged (``not_allowed`` of kind ``scope`` without a session)."""

    def __init__(self, auditor: Auditor) -> None:
        self._auditor = auditor

    def publish(self, event: str, **fields: Any) -> None:
        if event == events.AUTH_FAILURE:
            self._auditor.record("auth_refused", token_id=fields.get("token_id"), decision="deny",
                                 outcome="refused", reason=fields.get("outcome"), path=fields.get("path"),
                                 client={"remote_addr": fields.get("remote")})
        elif event == events.NOT_ALLOWED and fields.get("kind") == "scope" and "session_id" not in fields:
            self._auditor.record("scope_refused", token_id=fields.get("token_id"), decision="deny",
                                 outcome="refused", reason="insufficient_scope", scope=fields.get("scope"),
                                 client={"remote_addr": REMOTE_ADDR.get()})
