"""What an upstream sends besides the replies its callers await: progress, notifications, requests.

Both transports share it. Nothing the upstream sends may block the reader that received it, so
every delivery runs in its own task; progress for one request stays in order because each
delivery waits for the one before it.
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
from satgate_mcp.upstream.base import NotificationCallback, ProgressCallback
from satgate_mcp.upstream.wire import answer_server_request, restore_progress_token, rewrite_progress_token

#: Sent to the pool after every successful (re-)initialization: a restarted upstream may offer other tools.
RELIST_NOTIFICATION = "notifications/tools/list_changed"


@dataclass(slots=True)
class _Route:
    caller_token: Any
    callback: ProgressCallback | None
    last: asyncio.Task[None] | None = None


class Inbox:
    def __init__(self, name: str, reply: Callable[[JsonObj], Awaitable[object]]) -> None:
        self._name = name
        self._reply = reply
        self._log = structlog.get_logger("satgate_mcp.upstream").bind(upstream=name)
        self._routes: dict[str, _Route] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._tokens = itertools.count(1)
        self.on_notification: NotificationCallback | None = None

    def open_route(self, params: JsonObj | None, on_progress: ProgressCallback | None) -> tuple[JsonObj | None, str]:
        """Give the request a gateway progress token when it carries one; returns (params, route key)."""
        token = f"satgate-{self._name}-{next(self._tokens)}"
        new_params, caller = rewrite_progress_token(params, token)
        if caller is not None:
            self._routes[token] = _Route(caller, on_progress)
        return new_params, token

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

    def handle(self, message: jsonrpc.Notification | jsonrpc.Request) -> None:
        if isinstance(message, jsonrpc.Request):
            self.spawn(self._answer(message))
        elif message.method == "notifications/progress":
            self._progress(message.params or {})
        elif message.method == "notifications/cancelled":
            # The upstream gives up on a request it sent us; we answer those at once anyway.
            return
        else:
            self.notify(message.method, message.params)

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

    async def _answer(self, request: jsonrpc.Request) -> None:
        self._log.info("upstream_request_answered", method=request.method)
        await self._guard(self._reply(answer_server_request(request)), f"answer to {request.method}")

    async def _guard(self, awaitable: Awaitable[object], what: str) -> None:
        try:
            await awaitable
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self._log.warning("upstream_delivery_failed", what=what, error=repr(exc))
