"""What an upstream sends besides the replies its callers await: progress, notifications, requests.

Both transports share it. Nothing the upstream sends may block the reader that received it, so
every delivery runs in its own task; progress for one request stays in order because each
delivery waits for the one before it.

Attribution is exact or refused: progress follows its token; anything else that belongs to a
call goes to the call whose response stream carried it (HTTP), or, on a pipe shared by several
clients (a stdio child with ``"isolation"`` ``shared`` or ``token``), to a session only when every
call in flight belongs to that one session. A child of one session's own (``session``) gives
everything to that session's calls. Otherwise requests are refused upstream and notifications
dropped, counted and logged once.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any

import structlog

from satgate_mcp import jsonrpc
from satgate_mcp.jsonrpc import JsonObj
from satgate_mcp.metrics import Metrics
from satgate_mcp.upstream.base import UPSTREAM_READY, NotificationCallback, Pausable, ProgressCallback, Relay, is_relay
from satgate_mcp.upstream.wire import (
    LISTEN_ACKNOWLEDGED,
    is_pool_notification,
    restore_progress_token,
    rewrite_progress_token,
    unattributed_refusal,
)

#: Sent to the pool (never to a client) after every successful (re-)initialization: a restarted upstream may
#: offer other lists, and has forgotten what it was told (log level, subscriptions).
RELIST_NOTIFICATION = UPSTREAM_READY


@dataclass(slots=True)
class _Route:
    caller_token: Any
    callback: ProgressCallback | None
    last: asyncio.Task[None] | None = None
    #: The call's upstream timeout (``time_route``), held while its client is being asked.
    clock: asyncio.Timeout | None = None
    budget: float = 0.0
    asking: int = 0

    @property
    def relay(self) -> Relay | None:
        return self.callback if is_relay(self.callback) else None

    def hold(self) -> None:
        """A question went to the call's client: the upstream's time stops until it is answered."""
        self.asking += 1
        if self.asking == 1:
            self._reschedule(None)

    def restart(self) -> None:
        """The client answered (or was given up on): the upstream has its whole budget again for this round."""
        self.asking -= 1
        if self.asking == 0:
            self._reschedule(asyncio.get_running_loop().time() + self.budget)

    def _reschedule(self, when: float | None) -> None:
        if self.clock is not None and not self.clock.expired():
            with contextlib.suppress(RuntimeError):  # the call already left its timeout block
                self.clock.reschedule(when)


def _id_key(request_id: object) -> object:
    """A JSON-RPC id as a dict key: 1 and "1" are different ids, and True is not 1."""
    return (type(request_id).__name__, request_id) if isinstance(request_id, str | int) else None


def owning_relay(relays: list[Relay | None], *, exclusive: bool) -> Relay | None:
    """Whom a message on a pipe belongs to, given the relay of every call in flight on it (None: no client).

    ``exclusive``: the child is one session's own, so any of its calls with a client will do (the newest).
    Otherwise only when every call in flight belongs to one session.
    """
    if exclusive:
        return next((r for r in reversed(relays) if r is not None), None)
    owner = sole_session(["" if r is None else r.session_key for r in relays])
    if owner is None:
        return None
    return next(r for r in reversed(relays) if r is not None)


def sole_session(session_keys: list[str]) -> str | None:
    """The one client session every call in flight belongs to, or None (several, or a call without one)."""
    distinct = set(session_keys)
    if len(distinct) != 1:
        return None
    (only,) = distinct
    return only or None


#: One sequence for every inbox: the side of a dual upstream whose list change came last has the higher number.
_LIST_CHANGES = itertools.count(1)

class Inbox:
    def __init__(self, name: str, reply: Callable[[JsonObj], Awaitable[object]], *, shared_pipe: bool = False,
                 metrics: Metrics | None = None, ask_timeout: float = 30.0, isolation: str = "shared") -> None:
        """``shared_pipe``: nothing says which call a message belongs to (stdio), so the one-session rule applies,
        unless ``isolation`` is ``session`` (the child is one session's own)."""
        self._name = name
        self._reply = reply
        self._shared_pipe = shared_pipe
        self._isolation = isolation
        self._metrics = metrics
        self._ask_timeout = ask_timeout
        self._log = structlog.get_logger("satgate_mcp.upstream").bind(upstream=name)
        self._routes: dict[str, _Route] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._tokens = itertools.count(1)
        self._warned: set[str] = set()
        #: The upstream's requests being relayed to a client, by the upstream's id: what its cancellation stops.
        self._asking: dict[object, asyncio.Task[None]] = {}
        self.on_notification: NotificationCallback | None = None
        #: Set when the upstream acknowledges the gateway's listen stream: its filter is in force from then on.
        self.acknowledged = asyncio.Event()
        #: How many list changes the upstream announced (which side of a dual stdio upstream changed last).
        self.list_changes = 0

    def open_route(self, params: JsonObj | None, on_progress: ProgressCallback | None) -> tuple[JsonObj | None, str]:
        """Give the request a gateway progress token when it carries one; returns (params, route key).

        Every call that came from a client is routed, with or without a token: attribution needs them all.
        """
        token = f"satgate-{self._name}-{next(self._tokens)}"
        new_params, caller = rewrite_progress_token(params, token)
        if caller is not None or is_relay(on_progress):
            self._routes[token] = _Route(caller, on_progress)
        return new_params, token

    def time_route(self, token: str, clock: asyncio.Timeout, budget: float) -> None:
        """The call's upstream timeout: it stops while the call's client is being asked and restarts with the whole
        ``budget`` once it answered, so each round of questions (multi round-trip requests) is bounded on its own
        and the client's time to answer is not the upstream's."""
        route = self._routes.get(token)
        if route is not None:
            route.clock, route.budget = clock, budget

    def _attribute(self, route_key: str | None) -> _Route | None:
        """The call something belongs to: the one whose response carried it, else (shared pipe) the sole session's."""
        if route_key is not None:
            route = self._routes.get(route_key)
            return route if route is not None and route.relay is not None else None
        if not self._shared_pipe:
            return None
        routes = list(self._routes.values())
        relay = owning_relay([r.relay for r in routes], exclusive=self._isolation == "session")
        return None if relay is None else next(r for r in routes if r.relay is relay)

    def _unattributed(self, kind: str, method: str) -> None:
        if self._metrics is not None:
            self._metrics.unattributed.labels(upstream=self._name, kind=kind).inc()
        if kind not in self._warned:
            self._warned.add(kind)
            self._log.warning("upstream_traffic_unattributable", kind=kind, method=method,
                              shared_pipe=self._shared_pipe, isolation=self._isolation,
                              fix="the message reached no client; later ones are only counted "
                                  "(satgate_upstream_unattributed_total)")

    async def close_route(self, token: str, *, drain: bool) -> None:
        """Forget the route; with ``drain``, first wait until its progress reached the caller."""
        route = self._routes.pop(token, None)
        if drain and route is not None and route.last is not None:
            await asyncio.wait({route.last})

    async def pause(self, route_key: str | None) -> None:
        """The upstream closed the stream of this call to be polled: its client's stream may close likewise."""
        route = self._routes.get(route_key) if route_key is not None else None
        relay = route.relay if route is not None else None
        if isinstance(relay, Pausable):
            await self._guard(relay.pause(), "pause of the client's stream")

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
            route = self._attribute(route_key)
            if route is None:
                self._unattributed("request", message.method)
                refusal = unattributed_refusal(message, self._name, shared_pipe=self._shared_pipe,
                                               isolation=self._isolation)
                self.spawn(self._guard(self._reply(refusal), f"refusal of {message.method}"))
                return
            key = _id_key(message.id)
            task = self._asking[key] = self.spawn(self._relay_request(message, route))
            task.add_done_callback(lambda done: self._asking.pop(key, None) if self._asking.get(key) is done else None)
        elif message.method == "notifications/progress":
            self._progress(message.params or {})
        elif message.method == "notifications/cancelled":
            # The upstream gives up on a request it sent us: the client is told, and no answer goes back.
            asking = self._asking.pop(_id_key((message.params or {}).get("requestId")), None)
            if asking is not None:
                asking.cancel()
        elif message.method == LISTEN_ACKNOWLEDGED:
            self.acknowledged.set()  # the gateway's own listen stream is in force: no client's business
        elif is_pool_notification(message.method):
            self.notify(message.method, message.params)
        else:
            route = self._attribute(route_key)
            if route is None or route.relay is None:
                self._unattributed("notification", message.method)
                return
            self.spawn(self._guard(route.relay.notify(message.method, message.params), f"relay of {message.method}"))

    def notify(self, method: str, params: JsonObj | None) -> None:
        if method.endswith("/list_changed"):
            self.list_changes = next(_LIST_CHANGES)
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

    async def _relay_request(self, request: jsonrpc.Request, route: _Route) -> None:
        """The client's answer goes back under the upstream's own id; a failure to relay is an error answer."""
        relay = route.relay
        assert relay is not None
        route.hold()
        try:
            answer = await relay.ask(request.method, request.params, self._ask_timeout)
        except asyncio.CancelledError:
            raise  # cancelled by the upstream (or the gateway closing): nothing is answered
        except Exception as exc:
            self._log.warning("upstream_request_relay_failed", method=request.method, error=repr(exc))
            answer = jsonrpc.error_response(None, jsonrpc.INTERNAL_ERROR,
                                            f"the gateway could not relay {request.method}")
        finally:
            route.restart()
        await self._guard(self._reply(jsonrpc.with_id(answer, request.id)), f"answer to {request.method}")

    async def _guard(self, awaitable: Awaitable[object], what: str) -> None:
        try:
            await awaitable
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self._log.warning("upstream_delivery_failed", what=what, error=repr(exc))
