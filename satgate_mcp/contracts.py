"""The interfaces the dispatcher is written against: the upstream pool and the call policy.

Kept apart from the dispatcher so the app factory, tests and deployment code can name them without
the dispatcher's machinery, and so the dispatcher stays about what it does with one request.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from satgate_mcp import jsonrpc
from satgate_mcp.auth.base import Identity
from satgate_mcp.errors import GatewayError
from satgate_mcp.jsonrpc import JsonObj, RequestId
from satgate_mcp.subscriptions import Scope
from satgate_mcp.upstream.base import Caller, Notice, ProgressCallback, TaskNotice
from satgate_mcp.upstream.catalog import Kind


def method_not_found(method: str) -> GatewayError:
    return GatewayError(f"Method not found: {method}", {"error": "method_not_found", "method": method[:100]},
                        code=jsonrpc.METHOD_NOT_FOUND)



class Pool(Protocol):
    """What the dispatcher asks of the upstreams: typed operations, each answered by the upstream that owns it.

    The first four are what the app (``create_app``) calls: the pool's lifecycle and its links to sessions.
    """

    async def start(self) -> None:
        """Once, as the app starts, before it listens: start the upstreams (bounded); raising aborts start-up."""
    async def close(self) -> None:
        """Once, as the app cleans up after a started pool: stop every upstream; a failure is logged, not raised."""
    def listen(self, listener: Notice) -> None:
        """Once, as the app is assembled: the one listener for merged list changes and resource updates."""
    def listen_tasks(self, listener: TaskNotice) -> None:
        """Once, as the app is assembled: the one listener for task status notifications."""
    def task_listers(self) -> list[str]:
        """The ready upstreams that list their tasks (2025-11-25), in order."""
    async def watch_tasks(self, upstream: str, task_ids: frozenset[str]) -> None:
        """The task ids clients' listen streams follow on ``upstream`` (2026-07-28 tasks extension)."""
    def session_ended(self, session_id: str) -> None:
        """The registry closed a session: what upstream state was that session's alone (a child of its own) goes."""
    async def listening(self, timeout: float) -> None: ...
    def expect_modern(self, timeout: float) -> None: ...
    def readiness(self) -> dict[str, bool]: ...
    def failures(self) -> dict[str, dict[str, str]]:
        """Upstreams down after a failed try: their last exit status and stderr line (for /readyz)."""
    def circuits(self) -> dict[str, dict[str, object]]:
        """HTTP upstreams' circuit breakers: ``{"state": "closed" | "open" | "half_open", ...}`` (for /readyz)."""
    def capabilities(self) -> JsonObj: ...
    def instructions(self) -> list[tuple[str, str]]:
        """(upstream, its instructions) for each upstream that gave some."""
    def tools(self) -> list[JsonObj]: ...
    @property
    def tools_version(self) -> int: ...
    def owner_of_tool(self, name: str) -> str | None: ...
    def tool(self, name: str) -> JsonObj | None:
        """One listed tool's definition (read only), or None."""
    def unknown_tool(self, name: str) -> GatewayError:
        """The error for a tool no upstream lists (it names a down upstream that may own it)."""
    async def set_log_level(self, level: str) -> None: ...
    def subscription_scope(self, uri: str) -> Scope:
        """The upstream children the current caller's subscription to ``uri`` lives on (empty: shared ones)."""
    async def set_caller_log_level(self, caller: Caller, level: str) -> None:
        """One session's level, for the upstream children that are its own (``"isolation"``)."""
    async def call_tool(self, params: JsonObj, *, on_progress: ProgressCallback | None = None) -> JsonObj: ...
    async def task_request(self, upstream: str, method: str, params: JsonObj, *,
                           on_progress: ProgressCallback | None = None, timeout: float | None = None
                           ) -> JsonObj | None:
        """A task method on the named upstream (``timeout``: instead of its own); None when it is not configured."""
    async def read_resource(self, params: JsonObj | None, *, on_progress: ProgressCallback | None = None
                            ) -> JsonObj: ...
    async def subscribe(self, params: JsonObj | None, *, on_progress: ProgressCallback | None = None) -> JsonObj: ...
    async def unsubscribe(self, params: JsonObj | None, *, on_progress: ProgressCallback | None = None
                          ) -> JsonObj: ...
    async def get_prompt(self, params: JsonObj | None, *, on_progress: ProgressCallback | None = None) -> JsonObj: ...
    async def complete(self, params: JsonObj | None, *, on_progress: ProgressCallback | None = None) -> JsonObj: ...
    async def listing(self, kind: Kind) -> JsonObj:
        """The list result (``{"resources": [...]}``): one page, merged across upstreams."""
        ...


class Operation(Protocol):
    """One of the pool's forwarding operations: the upstream's reply message to the client's params."""

    def __call__(self, params: JsonObj | None, *, on_progress: ProgressCallback | None = None
                 ) -> Awaitable[JsonObj]: ...


class Policy(Protocol):
    async def admit(self, identity: Identity, *, method: str, tool: str | None, session_id: str,
                    request_id: RequestId, params: JsonObj | None) -> Any: ...
    async def settle(self, admission: Any, *, ran: bool) -> None: ...
    async def run(self, admission: Any, call: Callable[[], Awaitable[JsonObj]]) -> JsonObj:
        """Forward an admitted ``tools/call`` (identical copies in flight share one run) and settle it."""
        ...
    async def budget_status(self, identity: Identity) -> JsonObj: ...
    async def delegate(self, identity: Identity, params: JsonObj | None) -> JsonObj: ...


class UnmeteredPolicy:
    """The policy of a gateway without limits or budgets: admits everything, settles nothing.

    It has no budgets to report or delegate, so those methods are not found, as on a gateway
    that does not offer them.
    """

    async def admit(self, identity: Identity, *, method: str, tool: str | None, session_id: str,
                    request_id: RequestId, params: JsonObj | None) -> Any:
        return None

    async def settle(self, admission: Any, *, ran: bool) -> None:
        return None

    async def run(self, admission: Any, call: Callable[[], Awaitable[JsonObj]]) -> JsonObj:
        return await call()

    async def budget_status(self, identity: Identity) -> JsonObj:
        raise method_not_found("satgate/budget")

    async def delegate(self, identity: Identity, params: JsonObj | None) -> JsonObj:
        raise method_not_found("satgate/delegate")
