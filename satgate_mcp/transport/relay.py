"""A call's channel back to its client: progress, log messages and upstream requests, then the answer.

The upstream inbox hands each call what it attributed to it (``Relay``); this side decides what the
client may receive (its capabilities, its log level, whether it reads a stream at all) and keeps the
requests waiting for the client's answer under ids the gateway assigns, so only the session that
was asked can answer, and an upstream's own ids never reach a client.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import structlog

from satgate_mcp import jsonrpc
from satgate_mcp.jsonrpc import JsonObj
from satgate_mcp.trace_spans import progress_event, relay_event

if TYPE_CHECKING:
    from opentelemetry.trace import Span
from satgate_mcp.upstream.wire import META_CAPABILITIES

log = structlog.get_logger("satgate_mcp.transport.relay")

#: RFC 5424 severities as MCP names them, most verbose first.
LOG_LEVELS = ("debug", "info", "notice", "warning", "error", "critical", "alert", "emergency")
_RANK = {level: rank for rank, level in enumerate(LOG_LEVELS)}

#: Which client capability each upstream request needs.
NEEDS_CAPABILITY = {"sampling/createMessage": "sampling", "elicitation/create": "elicitation", "roots/list": "roots"}

#: An id the gateway gives a request it relays to a client: unguessable, so no other client can answer it.
ASK_ID_PREFIX = "satgate-"


def is_log_level(value: object) -> bool:
    return isinstance(value, str) and value in _RANK


def most_verbose(levels: list[str]) -> str | None:
    """The level upstreams are set to: the most verbose any session asked for."""
    known = [level for level in levels if level in _RANK]
    return min(known, key=_RANK.__getitem__) if known else None


def log_message_passes(params: JsonObj | None, wanted: str | None) -> bool:
    """A session receives messages at or above its own level; with none set, everything."""
    if wanted is None:
        return True
    level = (params or {}).get("level")
    return isinstance(level, str) and _RANK.get(level, -1) >= _RANK.get(wanted, 0)


def ask_refusal(method: str, params: JsonObj | None, *, streaming: bool,
                capabilities: dict[str, object] | None) -> str | None:
    """Why this upstream request cannot be put to this client, or None to relay it.

    Unknown capabilities (a resumed session) relay: the client's own refusal then goes back.
    """
    if not streaming:
        return (f"the client reads answers as JSON only (its Accept has no text/event-stream), so the gateway "
                f"cannot relay {method!r} to it")
    needed = NEEDS_CAPABILITY.get(method)
    if capabilities is None or needed is None:
        return None
    offered = capabilities.get(needed)
    if not isinstance(offered, dict):
        return f"the client did not declare the {needed!r} capability"
    if method == "elicitation/create":
        mode = (params or {}).get("mode", "form")
        # A client that declares plain ``elicitation: {}`` supports form mode only.
        modes = {m for m in ("form", "url") if m in offered} or {"form"}
        if mode not in modes:
            return f"the client does not support elicitation mode {mode!r}"
    return None


def required_capability(method: str, params: JsonObj | None,
                        capabilities: dict[str, object] | None) -> JsonObj | None:
    """The client capabilities (``ClientCapabilities`` shape) ``method`` needs and ``capabilities`` lack, or None.

    None too when the capabilities are unknown (a resumed session): the client's own answer then decides.
    """
    needed = NEEDS_CAPABILITY.get(method)
    if capabilities is None or needed is None:
        return None
    offered = capabilities.get(needed)
    if not isinstance(offered, dict):
        mode = (params or {}).get("mode") if method == "elicitation/create" else None
        return {needed: {mode: {}} if mode == "url" else {}}
    if method == "elicitation/create":
        mode = (params or {}).get("mode", "form")
        modes = {m for m in ("form", "url") if m in offered} or {"form"}  # plain ``elicitation: {}`` is form only
        if mode not in modes and isinstance(mode, str):
            return {needed: {mode: {}}}
    return None


@dataclass(slots=True)
class _Ask:
    session_id: str
    answer: asyncio.Future[JsonObj]


class PendingAsks:
    """Requests relayed to clients, waiting for their answers; one per process, keyed by gateway id."""

    def __init__(self) -> None:
        self._asks: dict[str, _Ask] = {}

    def __len__(self) -> int:
        return len(self._asks)

    def open(self, session_id: str) -> tuple[str, asyncio.Future[JsonObj]]:
        ask_id = ASK_ID_PREFIX + secrets.token_urlsafe(18)
        future: asyncio.Future[JsonObj] = asyncio.get_running_loop().create_future()
        self._asks[ask_id] = _Ask(session_id, future)
        return ask_id, future

    def close(self, ask_id: str) -> None:
        self._asks.pop(ask_id, None)

    def end(self, ask_id: str, answer: JsonObj) -> None:
        """Answer a question on the client's behalf (its call ended first)."""
        ask = self._asks.get(ask_id)
        if ask is not None and not ask.answer.done():
            ask.answer.set_result(answer)

    def answer(self, session_id: str, response: jsonrpc.Response) -> bool:
        """Take a client's answer; only the session that was asked may answer (anything else is ignored)."""
        ask = self._asks.get(response.id) if isinstance(response.id, str) else None
        if ask is None or ask.session_id != session_id or ask.answer.done():
            log.info("client_answer_unmatched", session_id=session_id, request_id=str(response.id)[:80])
            return False
        message: JsonObj = ({"jsonrpc": "2.0", "id": None, "error": response.error} if response.error is not None
                            else {"jsonrpc": "2.0", "id": None, "result": response.result})
        ask.answer.set_result(message)
        return True


def refused(message: str, *, cannot_ask: bool = False) -> JsonObj:
    """A relayed request's answer made by the gateway; ``cannot_ask``: this client can never be asked it (no stream,
    no capability), so a question of the gateway's own (a confirmation) is unavailable rather than declined."""
    data: JsonObj = {"error": "not_relayed", "cannot_ask": True} if cannot_ask else {"error": "not_relayed"}
    return jsonrpc.error_response(None, jsonrpc.INVALID_REQUEST, message, data)


#: Writes one message to the call's client; False when the client is gone.
Emit = Callable[[JsonObj], Awaitable[bool]]
#: Told of each request relayed to the client, once answered: (method, the answer, seconds) (the audit trail).
OnAsk = Callable[[str, JsonObj, float], None]
#: Ends the client's stream mid-call so it reconnects and resumes (the upstream did the same).
Pause = Callable[[], Awaitable[None]]


class CallRelay:
    """One call's ``Relay``: what the upstream attributed to it, filtered for its client and written by ``emit``."""

    def __init__(self, *, session_key: str, emit: Emit, asks: PendingAsks, streaming: bool,
                 capabilities: Callable[[], dict[str, object] | None], log_level: Callable[[], str | None],
                 pause: Pause | None = None, on_ask: OnAsk | None = None) -> None:
        self.session_key = session_key
        self._on_ask = on_ask
        self._emit = emit
        self._pause = pause
        self._asks = asks
        self._streaming = streaming
        self._capabilities = capabilities
        self._log_level = log_level
        self._open: set[str] = set()
        #: Set once every check that can refuse the call has passed: only then may its answer start streaming.
        self.admitted = asyncio.Event()
        #: The call's span while tracing is on: what it relays becomes its events.
        self.span: Span | None = None

    def admit(self) -> None:
        self.admitted.set()

    async def __call__(self, params: JsonObj) -> None:
        """Progress for this call; without the client's token it answers nothing the client asked for."""
        if self._streaming and params.get("progressToken") is not None:
            if self.span is not None:
                self.span.add_event(*progress_event(params))
            await self._emit(jsonrpc.notification_message("notifications/progress", params))

    async def pause(self) -> None:
        """The upstream closed this call's stream to be polled: the client's closes likewise (when it can resume)."""
        if self._pause is not None:
            await self._pause()

    async def notify(self, method: str, params: JsonObj | None) -> None:
        if not self._streaming:
            return
        if method == "notifications/message" and not log_message_passes(params, self._log_level()):
            return
        await self._emit(jsonrpc.notification_message(method, params))

    def log_level(self) -> str | None:
        return self._log_level()

    def lacks(self, method: str, params: JsonObj | None) -> JsonObj | None:
        return required_capability(method, params, self._capabilities())

    def client_meta(self) -> JsonObj:
        """The session's declared capabilities, for a 2026 upstream's ``_meta`` (unknown for a resumed session)."""
        declared = self._capabilities()
        return {META_CAPABILITIES: declared} if declared is not None else {}

    async def ask(self, method: str, params: JsonObj | None, timeout: float) -> JsonObj:
        if self.span is None and self._on_ask is None:
            return await self._ask(method, params, timeout)
        started = time.monotonic()
        answer = await self._ask(method, params, timeout)
        if self.span is not None:
            self.span.add_event(*relay_event(method, answer, time.monotonic() - started))
        if self._on_ask is not None:
            self._on_ask(method, answer, time.monotonic() - started)
        return answer

    async def _ask(self, method: str, params: JsonObj | None, timeout: float) -> JsonObj:
        why = ask_refusal(method, params, streaming=self._streaming, capabilities=self._capabilities())
        if why is not None:
            return refused(why, cannot_ask=True)
        ask_id, answer = self._asks.open(self.session_key)
        self._open.add(ask_id)
        try:
            if not await self._emit(jsonrpc.request_message(ask_id, method, params)):
                return refused(f"the client that made this call has left; {method!r} was not relayed")
            async with asyncio.timeout(timeout):
                return await answer
        except TimeoutError:
            return refused(f"the client did not answer {method!r} within {timeout:g}s")
        except asyncio.CancelledError:
            # The upstream withdrew its question: the client stops working on it too.
            await self._emit(jsonrpc.notification_message(
                "notifications/cancelled", {"requestId": ask_id, "reason": "the upstream cancelled its request"}))
            raise
        finally:
            self._open.discard(ask_id)
            self._asks.close(ask_id)

    def close(self) -> None:
        """The call is over: questions its client has not answered are answered upstream as refused."""
        for ask_id in list(self._open):
            self._asks.end(ask_id, refused("the call ended before the client answered"))
