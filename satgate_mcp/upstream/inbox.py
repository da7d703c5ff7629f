"""What an upstream sends besides the replies its callers await: progress, notifications, requests.

Both transports share it. Nothing the upstream sends may block the reader that received it, so
every delivery runs in its own task; progress for one request stays in order because each
delivery waits for the one before it.

Attribution is exact or refused: progress follows its token; anything else that belongs to a
call goes to the call whose response stream carried it (HTTP), or, on a pipe shared by every
client (stdio), to a session only when every call in flight belongs to that one session.
Otherwise requests are refused upstream and notifications dropped, counted and logged once.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any

import structlog

from satgate_mcp import jsonrpc
from satgate_mcp.jsonrpc import JsonObj
from satgate_mcp.metrics import Metrics
from satgate_mcp.upstream.base import NotificationCallback, ProgressCallback, Relay, is_relay
from satgate_mcp.upstream.wire import (
    is_pool_notification,
    restore_progress_token,
    rewrite_progress_token,
    unattributed_refusal,
)

#: Sent to the pool after every successful (re-)initialization: a restarted upstream may offer other tools.
RELIST_NOTIFICATION = "notifications/tools/list_changed"


@dataclass(slots=True)
class _Route:
    caller_token: Any
    callback: ProgressCallback | None
    last: asyncio.Task[None] | None = None

    @property
    def relay(self) -> Relay | None:
        return self.callback if is_relay(self.callback) else None


def sole_session(session_keys: list[str]) -> str | None:
    """The one client session every call in flight belongs to, or None (several, or a call without one)."""
    distinct = set(session_keys)
    if len(distinct) != 1:
        return None
    (only,) = distinct
    return only or None


class Inbox:
    def __init__(self, name: str, reply: Callable[[JsonObj], Awaitable[object]], *, shared_pipe: bool = False,
                 metrics: Metrics | None = None, ask_timeout: float = 30.0) -> None:
        """``shared_pipe``: nothing says which call a message belongs to (stdio), so the one-session rule applies."""
        self._name = name
        self._reply = reply
        self._shared_pipe = shared_pipe
        self._metrics = metrics
        self._ask_timeout = ask_timeout
        self._log = structlog.get_logger("satgate_mcp.upstream").bind(upstream=name)
        self._routes: dict[str, _Route] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._tokens = itertools.count(1)
        self._warned: set[str] = set()
        self.on_notification: NotificationCallback | None = None

    def open_route(self, params: JsonObj | None, on_progress: ProgressCallback | None) -> tuple[JsonObj | None, str]:
        """Give the request a gateway progress token when it carries one; returns (params, route key).

        Every call that came from a client is routed, with or without a token: attribution needs them all.
        """
        token = f"satgate-{self._name}-{next(self._tokens)}"
        new_params, caller = rewrite_progress_token(params, token)
        if caller is not None or is_relay(on_progress):
            self._routes[token] = _Route(caller, on_progress)
        return new_params, token

    def _attribute(self, route_key: str | None) -> Relay | None:
        """The call something belongs to: the one whose response carried it, else (shared pipe) the sole session's."""
        if route_key is not None:
            route = self._routes.get(route_key)
            return route.relay if route is not None else None
        if not self._shared_pipe:
            return None
        relays = [r.relay for r in self._routes.values()]
        owner = sole_session(["" if r is None else r.session_key for r in relays])
        if owner is None:
            return None
        return next(r for r in reversed(relays) if r is not None)

    def _unattributed(self, kind: str, method: str) -> None:
        if self._metrics is not None:
            self._metrics.unattributed.labels(upstream=self._name, kind=kind).inc()
        if kind not in self._warned:
            self._warned.add(kind)
            self._log.warning("upstream_traffic_unattributable", kind=kind, method=method,
                              shared_pipe=self._shared_pipe,
                              fix="the message reached no client; later ones are only counted "
                                  "(satgate_upstream_unattributed_total)")

    async def close_route(self, token: str, *, drain: bool) -> None:
        """Forget the route; with ``drain``, first wait until its progress reached the caller."""
        route = self._routes.pop(token, None)
        if drain and route is not None and route.last is not None:
            await asyncio.wait({route.last})

    def spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def handle(self, message: jsonrpc.Notification | jsonrpc.Request, route_key: str | None = None) -> None:
        """``route_key``: the call whose response stream carried the message (None: a pipe or a GET stream)."""
        if isinstance(message, jsonrpc.Request):
            if message.method == "ping":
                self.spawn(self._guard(self._reply(jsonrpc.result_response(message.id, {})), "answer to ping"))
                return
            relay = self._attribute(route_key)
            if relay is None:
                self._unattributed("request", message.method)
                refusal = unattributed_refusal(message, self._name, shared_pipe=self._shared_pipe)
                self.spawn(self._guard(self._reply(refusal), f"refusal of {message.method}"))
                return
            self.spawn(self._relay_request(message, relay))
        elif message.method == "notifications/progress":
            self._progress(message.params or {})
        elif message.method == "notifications/cancelled":
            # The upstream gives up on a request it sent us; its answer then simply goes unread.
            return
        elif is_pool_notification(message.method):
            self.notify(message.method, message.params)
        else:
            relay = self._attribute(route_key)
            if relay is None:
                self._unattributed("notification", message.method)
                return
            self.spawn(self._guard(relay.notify(message.method, message.params), f"relay of {message.method}"))

    def notify(self, method: str, params: JsonObj | None) -> None:
        callback = self.on_notification
        if callback is not None:
            self.spawn(self._guard(callback(method, params), f"notification handler for {method}"))

    async def aclose(self) -> None:
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)
        self._routes.clear()

    def _progress(self, params: JsonObj) -> None:
        token = params.get("progressToken")
        route = self._routes.get(token) if isinstance(token, str) else None
        if route is None:
            self._log.debug("upstream_progress_dropped", progress_token=token)
            return
        if route.callback is None:
            return
        previous, callback = route.last, route.callback
        restored = restore_progress_token(params, route.caller_token)

        async def deliver() -> None:
            if previous is not None:
                await asyncio.wait({previous})
            await self._guard(callback(restored), "progress callback")

        route.last = self.spawn(deliver())

    async def _relay_request(self, request: jsonrpc.Request, relay: Relay) -> None:
        """The client's answer goes back under the upstream's own id; a failure to relay is an error answer."""
        try:
            answer = await relay.ask(request.method, request.params, self._ask_timeout)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self._log.warning("upstream_request_relay_failed", method=request.method, error=repr(exc))
            answer = jsonrpc.error_response(None, jsonrpc.INTERNAL_ERROR,
                                            f"the gateway could not relay {request.method}")
        await self._guard(self._reply(jsonrpc.with_id(answer, request.id)), f"answer to {request.method}")

    async def _guard(self, awaitable: Awaitable[object], what: str) -> None:
        try:
            await awaitable
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self._log.warning("upstream_delivery_failed", what=what, error=repr(exc))
