"""Approval holds and user confirmations, run around a call: the machinery a token's ``controls`` and a policy
rule's ``hold`` / ``confirm`` effects share.

A held call is not forwarded: it is recorded in the state store (policy/approvals.py) and refused with -32001
``approval_required`` (its id, its expiry, and what to do: repeat the identical call once approved), or, with a
``wait``, kept open until approved (progress notifications while it waits, when the client sent a token). The
identical call repeated after an approval runs once, on whichever machine it reaches. A confirmation asks the
client's user through elicitation (form mode, one boolean) on the call's own stream, or as an
``input_required`` round for a 2026-07-28 client; anything but an explicit yes within 60 s is
``confirmation_declined``, and a client that cannot be asked gets ``confirmation_unavailable`` (fail closed).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Literal, TypeVar

import structlog

from satgate_mcp import events, jsonrpc
from satgate_mcp.errors import GatewayError
from satgate_mcp.events import Publisher
from satgate_mcp.guards import Asked, Proceed
from satgate_mcp.jsonrpc import JsonObj
from satgate_mcp.metrics import Metrics
from satgate_mcp.policy.approvals import (
    ApprovalStore,
    HeldCall,
    HoldOutcome,
    fingerprint,
    iso,
    new_id,
    shown_arguments,
)
from satgate_mcp.policy.store_time import never_waived
from satgate_mcp.upstream.base import is_relay

log = structlog.get_logger("satgate_mcp.holds")
T = TypeVar("T")

APPROVAL_REQUIRED = "approval_required"
APPROVAL_DENIED = "approval_denied"
APPROVAL_EXPIRED = "approval_expired"
APPROVAL_QUEUE_FULL = "approval_queue_full"
CONFIRMATION_DECLINED = "confirmation_declined"
CONFIRMATION_UNAVAILABLE = "confirmation_unavailable"
#: How long the client's user has to answer a confirmation.
CONFIRM_TIMEOUT_SECONDS = 60.0
#: How often a waiting held call looks at the store for a decision made elsewhere (another process, the CLI).
POLL_SECONDS = 0.5
#: How often a waiting held call tells a client that sent a progress token that it is still waiting.
PROGRESS_EVERY_SECONDS = 5.0
#: What a confirmation shows of one argument's value.
MAX_SHOWN_VALUE_CHARS = 200

Answer = Literal["accepted", "declined", "unavailable"]


def held_refusal(outcome: HoldOutcome, tool: str, per_family: int) -> GatewayError:
    """The -32001 a held call gets for what its repeat found (anything but ``approved``)."""
    record = outcome.record
    data: dict[str, Any] = {"tool": tool}
    if record is not None:
        data |= {"approval_id": record.id, "expires_at": iso(record.expires_at)}
    if outcome.found in ("requested", "pending") and record is not None:
        message = (f"Tool {tool!r} needs an operator's approval ({record.reason}). Approval {record.id} is pending "
                   f"until {iso(record.expires_at)}: repeat this identical call once it is approved")
        return GatewayError(message, {"error": APPROVAL_REQUIRED, **data}, code=jsonrpc.TOOL_NOT_ALLOWED)
    if outcome.found == "denied" and record is not None:
        note = f": {record.note}" if record.note else ""
        return GatewayError(f"Tool {tool!r}: approval {record.id} was denied{note}",
                            {"error": APPROVAL_DENIED, **data, "reason": record.note}, code=jsonrpc.TOOL_NOT_ALLOWED)
    if outcome.found == "expired" and record is not None:
        return GatewayError(f"Tool {tool!r}: approval {record.id} expired undecided at {iso(record.expires_at)}; "
                            "repeat the call to ask again", {"error": APPROVAL_EXPIRED, **data},
                            code=jsonrpc.TOOL_NOT_ALLOWED)
    return GatewayError(f"Tool {tool!r} needs an operator's approval, and this token already has {per_family} calls "
                        "waiting for one: try again once some are decided",
                        {"error": APPROVAL_QUEUE_FULL, **data, "pending_limit": per_family},
                        code=jsonrpc.TOOL_NOT_ALLOWED)


def shown_value(value: object) -> str:
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= MAX_SHOWN_VALUE_CHARS else text[:MAX_SHOWN_VALUE_CHARS] + "..."


def confirm_request(message: str, tool: str, fields: tuple[str, ...], arguments: Mapping[str, Any]) -> JsonObj:
    """The ``elicitation/create`` params of a confirmation: the message, the tool, the listed arguments."""
    lines = [message, "", f"Tool: {tool}"]
    lines += [f"{name}: {shown_value(arguments[name]) if name in arguments else '(not given)'}" for name in fields]
    schema = {"type": "object", "required": ["confirm"],
              "properties": {"confirm": {"type": "boolean", "title": f"Allow {tool[:100]}",
                                         "description": "Yes lets this call go ahead; anything else stops it",
                                         "default": False}}}
    return {"message": "\n".join(lines), "requestedSchema": schema}


def confirmation_answer(answer: JsonObj) -> Answer:
    """What the client's answer to a confirmation says: only ``accept`` with ``confirm: true`` lets the call go."""
    error = answer.get("error")
    if isinstance(error, dict):
        data = error.get("data")
        return "unavailable" if isinstance(data, dict) and data.get("cannot_ask") is True else "declined"
    result = answer.get("result")
    if not isinstance(result, dict) or result.get("action") != "accept":
        return "declined"
    content = result.get("content")
    return "accepted" if isinstance(content, dict) and content.get("confirm") is True else "declined"


def progress_token(params: Mapping[str, Any]) -> object | None:
    meta = params.get("_meta")
    return meta.get("progressToken") if isinstance(meta, dict) else None


class Holds:
    """Held calls over the ``store`` (bounded by ``timeout``), and confirmations over each call's relay."""

    def __init__(self, store: ApprovalStore, *, publisher: Publisher, metrics: Metrics, ttl: float, per_family: int,
                 timeout: float | None = None, clock: Callable[[], float] = time.time,
                 notify: Callable[[dict[str, Any]], None] | None = None) -> None:
        self._store = store
        self._publisher = publisher
        self._metrics = metrics
        self._ttl = ttl
        self._per_family = per_family
        self._timeout = timeout
        self._clock = clock
        self._notify = notify
        #: Waiting held calls of this process, woken at once by a decision taken here (the console).
        self._waiting: dict[str, asyncio.Event] = {}

    async def hold(self, asked: Asked, reason: str, wait: int | None, proceed: Proceed, *,
                   shown: tuple[str, ...] = ()) -> JsonObj:
        """Run the call if its identical copy was approved (once); else record it and refuse, or wait. The record
        keeps of the arguments only those ``shown`` (the ones the rule names: the rest may be secrets); the
        fingerprint covers them all."""
        arguments = asked.params.get("arguments")
        arguments = arguments if isinstance(arguments, dict) else {}
        now = self._clock()
        identity = asked.identity
        named = {name: arguments[name] for name in shown if name in arguments}
        request = HeldCall(new_id(), fingerprint(identity.token_id, asked.name, arguments), identity.token_id,
                           identity.family_id, asked.name[:200], shown_arguments(named), reason[:500], now,
                           now + self._ttl)
        outcome = await self._bounded(lambda: self._store.hold(request, now, self._per_family))
        self._metrics.approvals.labels(outcome=outcome.found).inc()
        if outcome.found == "requested" and outcome.record is not None:
            self._requested(outcome.record, asked)
        if outcome.found == "approved":
            self._used(outcome.record, asked)
            return await proceed()
        if wait is None or outcome.found not in ("requested", "pending") or outcome.record is None:
            raise held_refusal(outcome, asked.name, self._per_family)
        return await self._wait(outcome.record, asked, min(float(wait), outcome.record.expires_at - now), proceed)

    async def _wait(self, record: HeldCall, asked: Asked, seconds: float, proceed: Proceed) -> JsonObj:
        """Keep the call open until its approval is decided or ``seconds`` pass; approved: consume it, run once."""
        deadline = self._clock() + seconds
        woken = self._waiting.setdefault(record.id, asyncio.Event())
        token = progress_token(asked.params)
        told = self._clock()
        try:
            while True:
                current = await self._bounded(lambda: self._store.get(record.id)) or record
                if current.state == "approved":
                    consumed = await self._bounded(lambda: self._store.consume(record.id, self._clock()))
                    if consumed is not None:
                        self._used(consumed, asked)
                        return await proceed()
                if current.state != "pending" or self._clock() >= min(deadline, current.expires_at):
                    raise held_refusal(self._waited(current), asked.name, self._per_family)
                if token is not None and asked.on_progress is not None and \
                        self._clock() - told >= PROGRESS_EVERY_SECONDS:
                    told = self._clock()
                    await asked.on_progress({"progressToken": token, "progress": round(told - record.created_at, 1),
                                             "message": f"waiting for approval {record.id}"})
                woken.clear()
                try:
                    async with asyncio.timeout(min(POLL_SECONDS, max(0.0, deadline - self._clock()))):
                        await woken.wait()
                except TimeoutError:
                    pass
        finally:
            self._waiting.pop(record.id, None)

    def _waited(self, current: HeldCall) -> HoldOutcome:
        """What a wait that ends without running the call tells the client."""
        if current.state == "denied":
            return HoldOutcome("denied", current)
        if current.state in ("pending", "approved") and self._clock() >= current.expires_at:
            return HoldOutcome("expired", current)
        return HoldOutcome("pending", current)  # still undecided (or its approval used by another copy)

    def decided(self, approval_id: str) -> None:
        """A decision taken in this process: the call waiting for it (if here) looks now."""
        if (event := self._waiting.get(approval_id)) is not None:
            event.set()

    def _requested(self, record: HeldCall, asked: Asked) -> None:
        fields = {"approval_id": record.id, "token_id": record.token_id, "session_id": asked.session_id,
                  "tool": record.tool, "reason": record.reason, "expires_at": iso(record.expires_at)}
        self._publisher.publish(events.APPROVAL_REQUESTED, **fields)
        if self._notify is not None:
            self._notify({"event": events.APPROVAL_REQUESTED, **fields, "arguments": record.arguments,
                          "created_at": iso(record.created_at)})

    def _used(self, record: HeldCall | None, asked: Asked) -> None:
        if record is not None:
            self._publisher.publish(events.APPROVAL_USED, approval_id=record.id, token_id=record.token_id,
                                    session_id=asked.session_id, tool=record.tool, decided_by=record.decided_by)

    async def confirm(self, asked: Asked, message: str, fields: tuple[str, ...], proceed: Proceed) -> JsonObj:
        """Ask the call's user; go on only on an explicit yes."""
        arguments = asked.params.get("arguments")
        params = confirm_request(message, asked.name, fields, arguments if isinstance(arguments, dict) else {})
        relay = asked.on_progress
        if not is_relay(relay) or relay.lacks("elicitation/create", params) is not None:
            answer: Answer = "unavailable"
        else:
            try:
                async with asyncio.timeout(CONFIRM_TIMEOUT_SECONDS + 1):
                    answer = confirmation_answer(await relay.ask("elicitation/create", params,
                                                                 CONFIRM_TIMEOUT_SECONDS))
            except TimeoutError:
                answer = "declined"
        self._metrics.confirmations.labels(answer=answer).inc()
        self._publisher.publish(events.CONFIRMATION, token_id=asked.identity.token_id, session_id=asked.session_id,
                                tool=asked.name[:200], answer=answer)
        if answer == "accepted":
            return await proceed()
        if answer == "unavailable":
            raise GatewayError(f"Tool {asked.name!r} needs the user's confirmation, and this client cannot be asked "
                               "(it declared no elicitation, or reads no stream): the call is refused",
                               {"error": CONFIRMATION_UNAVAILABLE, "tool": asked.name[:200]},
                               code=jsonrpc.TOOL_NOT_ALLOWED)
        raise GatewayError(f"Tool {asked.name!r}: the user did not confirm the call", {
            "error": CONFIRMATION_DECLINED, "tool": asked.name[:200]}, code=jsonrpc.TOOL_NOT_ALLOWED)

    async def _bounded(self, operation: Callable[[], Awaitable[T]]) -> T:
        """A store operation, bounded; a fault refuses the call (a hold is never waived)."""
        return await never_waived(operation, self._timeout, self._fault)

    def _fault(self, error: str) -> None:
        self._metrics.store_errors.labels(op="approvals").inc()
        log.warning("approval_store_failed", error=error)
