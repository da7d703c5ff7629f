"""What every upstream connection offers the pool.

An upstream is one long-lived MCP client connection (a stdio child or a Streamable HTTP server)
shared by all client sessions. It assigns its own JSON-RPC ids and progress tokens so many
clients can multiplex over it, and maps replies and progress back to the caller.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Protocol, TypeGuard, cast, runtime_checkable

from satgate_mcp.jsonrpc import JsonObj

#: Receives ``notifications/progress`` params with the caller's own progress token restored.
ProgressCallback = Callable[[JsonObj], Awaitable[None]]
#: Receives server-initiated notifications (method, params), e.g. ``notifications/tools/list_changed``.
NotificationCallback = Callable[[str, JsonObj | None], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class Caller:
    """Whom a request runs for, as an isolated upstream picks its child: the verified token id and the session."""

    token_id: str
    #: The dispatcher's session id: a 2025 session's id, ``token:<id>`` for a stateless (2026-07-28) caller.
    session_id: str


#: Set by the dispatcher around each client request. A context variable rather than one more argument on
#: every pool operation: only an isolated upstream reads it, deep below code that has no reason to know.
#: Unset (None) for the gateway's own requests (listings, log levels, releases at a session's end).
CALLER: ContextVar[Caller | None] = ContextVar("satgate_upstream_caller", default=None)


#: The upstream children a resource subscription lives on: (upstream, owner) pairs; empty for shared upstreams.
Scope = frozenset[tuple[str, str]]
SHARED: Scope = frozenset()
#: Where a resource update came from: (isolated upstream, the owner of the child that sent it).
Origin = tuple[str, str]


class Notice(Protocol):
    """What the pool tells its listener: a merged list changed, or a resource was updated.

    ``origin`` names the isolated upstream's child an update came from (upstream, owner): it is
    for the sessions subscribed on that child only. None: from a shared upstream.
    """

    def __call__(self, method: str, params: JsonObj | None, origin: Origin | None = None) -> None: ...


#: What the pool tells its task listener: (upstream, method, params) of a task status notification.
TaskNotice = Callable[[str, str, JsonObj | None], None]


@runtime_checkable
class Relay(Protocol):
    """A call's way back to the client that made it; calling it delivers progress like any ProgressCallback.

    Passed where an ``on_progress`` goes, so the dispatcher and the pool carry it unchanged; the
    upstream inbox uses the rest for what it attributes to this call.
    """

    #: The client session the call runs for ("" without one): what stdio attribution compares.
    session_key: str

    async def __call__(self, params: JsonObj) -> None: ...

    def admit(self) -> None:
        """Every check that can refuse the call has passed (the answer may now start as a stream)."""
        ...

    async def notify(self, method: str, params: JsonObj | None) -> None:
        """A call-related notification (``notifications/message`` ...) for this call's client."""
        ...

    async def ask(self, method: str, params: JsonObj | None, timeout: float) -> JsonObj:
        """Relay an upstream's request to the client; the client's response message (result or error), never raises."""
        ...

    def log_level(self) -> str | None:
        """The least severe log level the call's client wants, None for none set: a 2026-07-28 upstream gets it in
        the request's ``_meta`` (it sends log messages only when asked, at that level and above)."""
        ...

    def lacks(self, method: str, params: JsonObj | None) -> JsonObj | None:
        """The client capabilities this request needs that the call's client did not declare (None: it did, or
        they are not known), asked before anything is put to the client."""
        ...


@runtime_checkable
class Pausable(Protocol):
    """A relay whose client stream can end mid-call and be resumed: an upstream that paused its own says so."""

    async def pause(self) -> None: ...


@dataclass(frozen=True, slots=True)
class Resume:
    """A modern client's retry of a call a modern upstream answered ``input_required``: where it goes on."""

    upstream: str
    #: The upstream's own ``requestState`` (None when it gave none).
    state: object
    #: The client's ``inputResponses``, keyed as the upstream asked.
    responses: JsonObj


@runtime_checkable
class InputCarrier(Protocol):
    """The relay of a 2026 client: a modern upstream's ``input_required`` goes back to it, nothing waits here.

    ``carry`` hears which upstream asked (the transport seals that with the upstream's state);
    ``resume`` is set on the client's retry, so the upstream sees its own state and the answers.
    """

    resume: Resume | None

    def carry(self, upstream: str, result: JsonObj) -> None: ...


@runtime_checkable
class Declares(Protocol):
    """A relay that knows what its client declared: a 2026 upstream gets that in ``_meta`` in place of the
    gateway's (capabilities, clientInfo), so it decides for the client that asked. ``{}``: unknown."""

    def client_meta(self) -> JsonObj: ...


#: Verdicts of the structural checks by type: ``isinstance`` against a runtime-checkable Protocol walks
#: every member on each call (several microseconds), and a call's path asks it several times.
_RELAY_TYPES: dict[type, bool] = {}
_CARRIER_TYPES: dict[type, bool] = {}
_DECLARES_TYPES: dict[type, bool] = {}


def is_relay(value: object) -> TypeGuard[Relay]:
    """``isinstance(value, Relay)``, decided once per type (relays set their attributes in ``__init__``)."""
    return _verdict(_RELAY_TYPES, Relay, value)


def is_input_carrier(value: object) -> TypeGuard[InputCarrier]:
    """``isinstance(value, InputCarrier)``, decided once per type, like ``is_relay``."""
    return _verdict(_CARRIER_TYPES, InputCarrier, value)


def declared_meta(value: object) -> JsonObj | None:
    """The client's own protocol ``_meta`` fields when the relay knows them, else None (the gateway's are sent)."""
    if not _verdict(_DECLARES_TYPES, Declares, value):
        return None
    return cast(Declares, value).client_meta() or None


def _verdict(cache: dict[type, bool], protocol: Any, value: object) -> bool:
    kind = type(value)
    verdict = cache.get(kind)
    if verdict is None:
        verdict = cache[kind] = isinstance(value, protocol)
    return verdict


#: The handshake may take longer than a tool call's timeout: a cold child (node, python) needs seconds to start.
MIN_INITIALIZE_TIMEOUT = 10.0


def initialize_timeout(call_timeout: float) -> float:
    return max(call_timeout, MIN_INITIALIZE_TIMEOUT)


#: The pool hears this (never a client) when an upstream became ready, first or after a restart.
UPSTREAM_READY = "satgate/upstream_ready"

#: The protocol revision the gateway speaks to its upstreams.
UPSTREAM_PROTOCOL_VERSION = "2025-11-25"


class Upstream(Protocol):
    name: str

    @property
    def ready(self) -> bool:
        """True once initialized and connected; False while starting or restarting."""
        ...

    @property
    def initialize_result(self) -> JsonObj | None:
        """The upstream's ``initialize`` result (capabilities, serverInfo), once initialized."""
        ...

    @property
    def modern(self) -> bool:
        """Whether it speaks 2026-07-28 (no session; ``_meta`` on every request, no ``logging/setLevel``)."""
        ...

    async def start(self, on_notification: NotificationCallback) -> None:
        """Begin connecting in the background; never raises because the upstream is down."""
        ...

    async def wait_ready(self, timeout: float) -> bool: ...

    async def wait_settled(self, timeout: float) -> bool:
        """Until ready or known to be down (its last try failed), bounded; whether it is ready. Start-up waits for
        this, so a child that already exited never holds up listening."""
        ...

    @property
    def last_failure(self) -> dict[str, str] | None:
        """While down after a failed try: why (``status``, and the child's last ``stderr`` line when it had one)."""
        ...

    async def request(
        self,
        method: str,
        params: JsonObj | None,
        *,
        on_progress: ProgressCallback | None = None,
        timeout: float | None = None,
    ) -> JsonObj:
        """Send one request and return the upstream's reply message (``result`` or ``error`` key).

        Raises ``UpstreamUnavailable`` when the connection is down or dies in flight and
        ``UpstreamTimeout`` after the timeout (having sent ``notifications/cancelled``).
        Cancelling the awaiting task also sends ``notifications/cancelled`` upstream.
        """
        ...

    async def notify(self, method: str, params: JsonObj | None) -> None: ...

    async def listening(self, timeout: float) -> bool:
        """Until every stream the upstream announces changes on is in force (bounded): a 2026-07-28 connection's
        listen stream acknowledged, a dual-revision upstream's 2026-07-28 side found and listened to. Whether
        they are. A 2026 client's ``subscriptions/listen`` waits for this before it is acknowledged, so no change
        made after the acknowledgement can go unheard."""
        ...

    async def close(self) -> None:
        """Stop for good: fail calls in flight, terminate a child and reap it."""
        ...


async def event_within(event: asyncio.Event, timeout: float) -> bool:
    """Whether ``event`` is set within ``timeout`` seconds: readiness waits without raising."""
    if event.is_set():
        return True
    try:
        async with asyncio.timeout(timeout):
            await event.wait()
    except TimeoutError:
        return False
    return True
