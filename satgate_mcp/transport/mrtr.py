"""Multi round-trip requests (2026-07-28) in front of 2025 upstreams.

A 2025 upstream asks its client things in the middle of a call (``elicitation/create``,
``sampling/createMessage``, ``roots/list``); a 2026 client cannot be asked, it must be answered. So
the gateway answers the modern call with ``resultType: "input_required"`` (the upstream's requests
as ``inputRequests``) and keeps the upstream call waiting; the client's retry, carrying
``inputResponses`` and the ``requestState`` it was given, is matched to that waiting call and the
answers go upstream.

``requestState`` is sealed (HMAC-SHA256): it names the waiting flow and binds it to the token that
started it, to a digest of the original request and to an expiry, so another token cannot continue
someone else's flow and a tampered state is refused. The keys come from ``SATGATE_ROOT_KEY`` (header
mode) or ``SATGATE_STATE_KEY`` (several, comma separated: the first seals, all open, so keys rotate),
else one per process. The waiting call itself lives in this process: a retry that reaches another one,
or comes after the flow expired, gets a clear error telling the client to issue the call again.

A 2026-07-28 upstream answers ``input_required`` itself, and nothing waits: its result goes to the client as
it is, the upstream's own ``requestState`` carried (with the upstream's name) inside the gateway's sealed
state instead of a flow id. Any process with the keys opens it on the retry and sends the call, with the
client's ``inputResponses`` and the upstream's state, to that upstream again. The payload is signed, not
encrypted: the client may read the upstream's state but not change it or use it for another token.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import hmac
import json
import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import structlog

from satgate_mcp import jsonrpc
from satgate_mcp.jsonrpc import JsonObj
from satgate_mcp.trace_spans import progress_event
from satgate_mcp.transport.offered import offered_answer
from satgate_mcp.transport.relay import Emit, log_message_passes, refused, required_capability
from satgate_mcp.upstream.base import Resume

if TYPE_CHECKING:
    from opentelemetry.trace import Span

#: How long a flow waits for its client's retry before the upstream call is given up.
FLOW_TTL_SECONDS = 300.0
#: Flows one process keeps waiting at once (each also holds its call's in-flight slot).
MAX_FLOWS = 10_000
#: Params of a retry that are not part of the original request.
RETRY_FIELDS = frozenset({"_meta", "inputResponses", "requestState"})
MRTR_METHODS = frozenset({"tools/call", "prompts/get", "resources/read"})
#: Longest requestState accepted: room for a modern upstream's own state inside the gateway's.
MAX_STATE_CHARS = 16 * 1024
_KEY_LABEL = b"satgate-mcp mrtr request state v1"

log = structlog.get_logger("satgate_mcp.transport.mrtr")


class StateRefused(Exception):
    """A ``requestState`` that does not open, is not this token's, not this request's, or is too old."""


class FlowEnded(Exception):
    """The flow was given up (expired, shut down) while its upstream still waited for an answer."""


# --- sealing: pure functions ------------------------------------------------------------------------


def derive_keys(secrets_in_order: Sequence[str]) -> list[bytes]:
    return [hmac.new(s.encode("utf-8"), _KEY_LABEL, hashlib.sha256).digest() for s in secrets_in_order if s]


def request_digest(method: str, params: JsonObj | None) -> str:
    """What identifies the original request: its method and params, without the retry's own fields."""
    kept = {k: v for k, v in (params or {}).items() if k not in RETRY_FIELDS}
    canonical = json.dumps([method, kept], sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode("utf-8", "surrogatepass")).hexdigest()


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode("ascii").rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _seal_fields(keys: Sequence[bytes], fields: dict[str, object]) -> str:
    payload = json.dumps({"v": 1, **fields}, separators=(",", ":")).encode("utf-8")
    mac = hmac.new(keys[0], payload, hashlib.sha256).digest()
    return f"{_b64(payload)}.{_b64(mac)}"


def seal(keys: Sequence[bytes], *, flow: str, holder: str, digest: str, expires: float) -> str:
    return _seal_fields(keys, {"f": flow, "h": holder, "d": digest, "e": round(expires, 3)})


def seal_carried(keys: Sequence[bytes], *, upstream: str, state: object, holder: str, digest: str,
                 expires: float) -> str:
    """A modern upstream's own ``requestState`` wrapped in the gateway's: any process with the keys continues it."""
    return _seal_fields(keys, {"u": upstream, "s": state, "h": holder, "d": digest, "e": round(expires, 3)})


def open_state(keys: Sequence[bytes], state: object, *, holder: str, digest: str, now: float) -> dict[str, object]:
    """The fields of a valid state (a flow's ``f``, a carried upstream state's ``u`` and ``s``), else StateRefused."""
    if not isinstance(state, str) or len(state) > MAX_STATE_CHARS or state.count(".") != 1:
        raise StateRefused("requestState is not one this gateway issued")
    encoded, mac_text = state.split(".")
    try:
        payload, mac = _unb64(encoded), _unb64(mac_text)
    except (binascii.Error, ValueError):
        raise StateRefused("requestState is not one this gateway issued") from None
    if not any(hmac.compare_digest(hmac.new(k, payload, hashlib.sha256).digest(), mac) for k in keys):
        raise StateRefused("requestState does not verify")
    fields = json.loads(payload)
    if not isinstance(fields, dict):
        raise StateRefused("requestState is not one this gateway issued")
    if not hmac.compare_digest(str(fields.get("h")), holder):
        raise StateRefused("requestState belongs to another token")
    if fields.get("d") != digest:
        raise StateRefused("requestState belongs to another request (method or params differ)")
    if not isinstance(fields.get("e"), (int, float)) or now > fields["e"]:
        raise StateRefused("requestState has expired")
    return fields


def unseal(keys: Sequence[bytes], state: object, *, holder: str, digest: str, now: float) -> str:
    """The flow id a valid state names; StateRefused for anything else."""
    fields = open_state(keys, state, holder=holder, digest=digest, now=now)
    if "f" not in fields:
        raise StateRefused("requestState does not name a waiting call")
    return str(fields["f"])


def carried_resume(fields: dict[str, object], responses: object) -> Resume | None:
    """The retry of a modern upstream's call, when the opened state carries one (else it names a flow)."""
    if not isinstance(fields.get("u"), str):
        return None
    return Resume(str(fields["u"]), fields.get("s"), dict(responses) if isinstance(responses, dict) else {})


# --- flows: the waiting calls of this process -----------------------------------------------------------


@dataclass
class Ask:
    key: str
    method: str
    params: JsonObj | None
    answer: asyncio.Future[JsonObj] = field(default_factory=lambda: asyncio.get_running_loop().create_future())

    def as_input_request(self) -> JsonObj:
        request: JsonObj = {"method": self.method}
        if self.params is not None:
            request["params"] = self.params
        return request


@dataclass
class Outcome:
    """What a round ends with: the call's reply, or the client's input to ask for."""

    reply: JsonObj | None = None
    asks: list[Ask] = field(default_factory=list)


class Flow:
    """One modern call that may need several rounds: its running upstream call and what it asks."""

    def __init__(self, holder: str, digest: str, capabilities: dict[str, object], log_level: str | None,
                 emit: Emit) -> None:
        self.id = secrets.token_hex(16)
        self.holder = holder
        self.digest = digest
        self.capabilities = capabilities
        self.log_level = log_level
        #: The client's own capabilities and clientInfo, as a 2026 upstream gets them in ``_meta``.
        self.client_meta: JsonObj = {}
        self.emit = emit
        self.task: asyncio.Task[JsonObj] | None = None
        self.pending: dict[str, Ask] = {}
        self._outcomes: asyncio.Queue[Outcome] = asyncio.Queue()
        self._keys = 0
        self.expiry: asyncio.TimerHandle | None = None
        #: Whether the round now being answered streams (progress and log messages reach it only then).
        self.streaming = False
        #: Set once every check that can refuse the call passed: only then may a round's answer stream.
        self.admitted = asyncio.Event()
        #: The modern upstream whose ``input_required`` this call answers with (its state is sealed for the retry).
        self.carried_from: str | None = None
        #: (holder, request digest, JSON-RPC id): what a copy of the request (the same one sent again) shares.
        self.copy_key: tuple[str, str, str] | None = None
        #: ``inputResponses`` a new call brought unasked: each answers at most one question it fits (offered.py).
        self.offered: JsonObj = {}

    def start(self, task: asyncio.Task[JsonObj]) -> None:
        self.task = task
        task.add_done_callback(self._finished)

    def _finished(self, task: asyncio.Task[JsonObj]) -> None:
        if task.cancelled():
            reply = jsonrpc.error_response(None, jsonrpc.REQUEST_CANCELLED, "Request cancelled", {"error": "cancelled"})
        elif task.exception() is not None:
            reply = jsonrpc.error_response(None, jsonrpc.INTERNAL_ERROR, "Internal error", {"error": "internal_error"})
        else:
            reply = task.result()
        self._outcomes.put_nowait(Outcome(reply=reply))

    async def next_outcome(self) -> Outcome:
        return await self._outcomes.get()

    def ask(self, method: str, params: JsonObj | None) -> Ask | None:
        """An upstream request for this call's client: queued for the client, or None when it lacks the capability.

        None is refused back to the upstream, as the client itself would refuse it: the upstream decides what
        the call becomes for a client without it (its own degraded answer), not the gateway (-32021)."""
        if required_capability(method, params, self.capabilities) is not None:
            return None
        self._keys += 1
        ask = Ask(f"{method.split('/')[0]}-{self._keys}", method, params)
        if (key := offered_answer(method, params, self.offered)) is not None:  # answered already: asked no more
            ask.answer.set_result(self.offered.pop(key))
            return ask
        self.pending[ask.key] = ask
        self._outcomes.put_nowait(Outcome(asks=[ask]))
        return ask

    def answer(self, responses: object) -> list[Ask]:
        """Hand the client's ``inputResponses`` to the waiting asks; return the asks still unanswered."""
        given = responses if isinstance(responses, dict) else {}
        for key, ask in list(self.pending.items()):
            if key in given and isinstance(given[key], dict) and not ask.answer.done():
                ask.answer.set_result(given[key])
                del self.pending[key]
        return list(self.pending.values())

    def cancel(self, why: str) -> None:
        for ask in self.pending.values():
            if not ask.answer.done():
                ask.answer.set_exception(FlowEnded(why))
        self.pending.clear()
        if self.task is not None and not self.task.done():
            self.task.cancel()


class Flows:
    """The flows of this process waiting for a client's retry, each bounded by ``FLOW_TTL_SECONDS``."""

    def __init__(self, keys: Sequence[bytes], *, clock: Callable[[], float] = time.time,
                 ttl: float = FLOW_TTL_SECONDS) -> None:
        self._keys = list(keys) or [secrets.token_bytes(32)]  # no configured key: this process only
        self._clock = clock
        self._ttl = ttl
        self._waiting: dict[str, Flow] = {}
        self._copies: dict[tuple[str, str, str], Flow] = {}

    def __len__(self) -> int:
        return len(self._waiting)

    def state_for(self, flow: Flow) -> str:
        """Keep ``flow`` waiting for its retry and return the sealed state naming it."""
        if flow.id not in self._waiting and len(self._waiting) >= MAX_FLOWS:
            raise StateRefused("too many calls are waiting for client input on this process")
        self._waiting[flow.id] = flow
        if flow.copy_key is not None:
            self._copies[flow.copy_key] = flow
        if flow.expiry is not None:
            flow.expiry.cancel()
        flow.expiry = asyncio.get_running_loop().call_later(self._ttl, self._expire, flow.id)
        return seal(self._keys, flow=flow.id, holder=flow.holder, digest=flow.digest,
                    expires=self._clock() + self._ttl)

    def resume(self, state: object, *, holder: str, digest: str) -> Flow:
        flow_id = unseal(self._keys, state, holder=holder, digest=digest, now=self._clock())
        flow = self._waiting.get(flow_id)
        if flow is None:
            raise StateRefused("the call this requestState continues is not waiting on this gateway process "
                               "(it ended, expired, or ran on another process); issue the call again "
                               "without inputResponses and requestState")
        return flow

    def seal_carried(self, flow: Flow, upstream: str, state: object) -> str:
        """The sealed state of a modern upstream's ``input_required``: nothing is kept in this process."""
        return seal_carried(self._keys, upstream=upstream, state=state, holder=flow.holder, digest=flow.digest,
                            expires=self._clock() + self._ttl)

    def carried(self, state: object, responses: object, *, holder: str, digest: str) -> Resume | None:
        """The retry of a modern upstream's call this state carries, None when it names a flow; StateRefused."""
        return carried_resume(open_state(self._keys, state, holder=holder, digest=digest, now=self._clock()),
                              responses)

    def parked(self, copy_key: tuple[str, str, str]) -> Flow | None:
        """The waiting flow a request sent again (same token, request and id: its answer was lost) belongs to."""
        return self._copies.get(copy_key)

    def _forget(self, flow_id: str) -> Flow | None:
        flow = self._waiting.pop(flow_id, None)
        if flow is not None and flow.copy_key is not None and self._copies.get(flow.copy_key) is flow:
            del self._copies[flow.copy_key]
        return flow

    def done(self, flow: Flow) -> None:
        if self._forget(flow.id) is not None and flow.expiry is not None:
            flow.expiry.cancel()

    def _expire(self, flow_id: str) -> None:
        flow = self._forget(flow_id)
        if flow is not None:
            log.info("mrtr_flow_expired", flow=flow_id)
            flow.cancel("the client did not retry in time")

    def close(self) -> list[asyncio.Task[JsonObj]]:
        """Give up every waiting flow; returns their calls, cancelled, for the caller to await."""
        calls = []
        for flow_id in list(self._waiting):
            flow = self._waiting.pop(flow_id)
            flow.cancel("the gateway is shutting down")
            if flow.task is not None:
                calls.append(flow.task)
        self._copies.clear()
        return calls


class ModernRelay:
    """The ``Relay`` of a modern call: progress and (when asked for) log messages on its stream, and every
    upstream request turned into a round of the flow instead of a request to the client."""

    def __init__(self, flow: Flow, session_key: str, resume: Resume | None = None) -> None:
        self.session_key = session_key
        self._flow = flow
        self.admitted = flow.admitted
        #: Set on the retry of a modern upstream's call: it goes to that upstream with its own state.
        self.resume = resume
        #: The call's span while tracing is on: its progress becomes the span's events.
        self.span: Span | None = None

    def carry(self, upstream: str, result: JsonObj) -> None:
        """A modern upstream answered ``input_required``: it goes to the client as it is (state sealed)."""
        self._flow.carried_from = upstream

    def client_meta(self) -> JsonObj:
        return self._flow.client_meta

    def admit(self) -> None:
        self.admitted.set()

    async def __call__(self, params: JsonObj) -> None:
        if self._flow.streaming and params.get("progressToken") is not None:
            if self.span is not None:
                self.span.add_event(*progress_event(params))
            await self._flow.emit(jsonrpc.notification_message("notifications/progress", params))

    async def notify(self, method: str, params: JsonObj | None) -> None:
        if not self._flow.streaming:
            return
        if method == "notifications/message" and (
                self._flow.log_level is None or not log_message_passes(params, self._flow.log_level)):
            return  # a modern request gets log messages only when its _meta asks for a level
        await self._flow.emit(jsonrpc.notification_message(method, params))

    def log_level(self) -> str | None:
        return self._flow.log_level

    def lacks(self, method: str, params: JsonObj | None) -> JsonObj | None:
        return required_capability(method, params, self._flow.capabilities)

    async def ask(self, method: str, params: JsonObj | None, timeout: float) -> JsonObj:
        ask = self._flow.ask(method, params)
        if ask is None:
            return refused(f"the client did not declare the capability {method!r} needs", cannot_ask=True)
        try:
            answer = await ask.answer
        except FlowEnded as ended:
            return refused(f"{method!r} was not answered: {ended}")
        return jsonrpc.result_response(ask.key, answer)

    def close(self) -> None:
        return None


def carried_result(result: JsonObj, state: str) -> JsonObj:
    """The upstream's ``input_required`` for the client: its requests as they are, the state the gateway's."""
    return {**result, "requestState": state}


def input_required(asks: Sequence[Ask], state: str) -> JsonObj:
    return {"resultType": "input_required", "inputRequests": {a.key: a.as_input_request() for a in asks},
            "requestState": state}

