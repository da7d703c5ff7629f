"""Checks a request passes before it reaches an upstream, beyond what the token's own caveats name.

Policy rules, pinned tool definitions and tool controls each plug in here as a ``Guard``. The dispatcher
runs a ``tools/call`` (and a ``resources/read`` or ``prompts/get``) through every guard, in order, after
the token's caveats and scopes and before the rate limit and the charge: a refused call costs nothing and
reaches no upstream. A guard wraps the rest of the call (``proceed``), so one that reserves something
(a spend limit) can give it back when the call certainly did not run, and one that asks a person can wait.
A guard also says which list items a caller is not to be shown, so an agent is never offered what it would
be refused. With no guard configured the dispatcher calls straight through: nothing is paid for them.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from functools import partial
from typing import Literal, Protocol

from satgate_mcp.auth.base import Identity
from satgate_mcp.jsonrpc import JsonObj, RequestId
from satgate_mcp.upstream.base import ProgressCallback
from satgate_mcp.upstream.catalog import Kind

#: The address of the client whose HTTP request is being answered (set by the transport's middleware).
REMOTE_ADDR: ContextVar[str | None] = ContextVar("satgate_remote_addr", default=None)

#: What a guarded request names: a tool (``tools/call``), a resource (``resources/read``), a prompt.
Target = Literal["tool", "resource", "prompt"]

Proceed = Callable[[], Awaitable[JsonObj]]


@dataclass(frozen=True, slots=True)
class ClientFacts:
    """Who the caller says it is: the session's protocol revision and the client's own name and version."""

    protocol: str
    name: str | None = None
    version: str | None = None

    @staticmethod
    def of(protocol: str, client_info: object) -> ClientFacts:
        """From a declared ``clientInfo`` (anything: only string fields are kept, bounded)."""
        info = client_info if isinstance(client_info, dict) else {}
        name, version = info.get("name"), info.get("version")
        return ClientFacts(protocol, name[:200] if isinstance(name, str) else None,
                           version[:100] if isinstance(version, str) else None)


@dataclass(frozen=True, slots=True)
class Asked:
    """One guarded request as a guard sees it: what was asked, of which upstream, by whom, from where."""

    method: str
    identity: Identity
    session_id: str
    target: Target
    name: str
    params: JsonObj
    upstream: str | None = None
    #: The upstream's definition of the named tool (``tools/call``), as the gateway lists it.
    definition: JsonObj | None = None
    client: ClientFacts | None = None
    remote_addr: str | None = None
    #: The call's channel back to its client (progress, and requests relayed to it such as elicitation).
    on_progress: ProgressCallback | None = None
    #: The client's JSON-RPC id: with the session id and params it tells copies of one call apart (duplicates.py).
    request_id: RequestId | None = None


class Guard(Protocol):
    async def guard(self, asked: Asked, proceed: Proceed) -> JsonObj:
        """Refuse (raise ``GatewayError``) or go on with ``await proceed()``, doing what it must around it."""
        ...

    def hides(self, identity: Identity, kind: Kind, item: JsonObj, client: ClientFacts | None) -> bool:
        """True: ``item`` of a ``kind`` listing is left out of what this caller is shown."""
        ...


class Guards:
    """The configured guards, outermost first."""

    __slots__ = ("_guards", "version")

    def __init__(self, guards: Sequence[Guard] = ()) -> None:
        self._guards = tuple(guards)
        #: Goes up whenever a guard may hide other tools than before (a reloaded policy): with the pool's own
        #: tools version it tells a session without a stream that it is owed ``notifications/tools/list_changed``.
        self.version = 0

    def tools_changed(self) -> None:
        self.version += 1

    def __bool__(self) -> bool:
        return bool(self._guards)

    async def run(self, asked: Asked, proceed: Proceed) -> JsonObj:
        """``proceed`` (the admitted call) through every guard, the first one outermost."""
        for guard in reversed(self._guards):
            proceed = partial(guard.guard, asked, proceed)
        return await proceed()

    def visible(self, identity: Identity, kind: Kind, items: list[JsonObj], client: ClientFacts | None
                ) -> list[JsonObj]:
        """The items no guard hides from this caller (the list itself when there is no guard)."""
        if not self._guards:
            return items
        return [item for item in items
                if not any(g.hides(identity, kind, item, client) for g in self._guards)]
