"""Resource subscriptions per session, reference-counted upstream.

An upstream sees one subscription per URI however many sessions asked: the first session's
``resources/subscribe`` goes upstream, the last one's ``resources/unsubscribe`` (or the end of
the last subscribed session) goes upstream, and everything in between is answered here. So one
session unsubscribing never cancels another's updates. Nothing here survives a restart: a
resumed session starts with no subscriptions.

An isolated upstream (``"isolation"``) has a child per token or session, and each child must be
subscribed for its own owner: the count is kept per scope (the children a subscription lives on),
and an update from one child reaches only the sessions subscribed in that child's scope.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Protocol

import structlog

from satgate_mcp import jsonrpc
from satgate_mcp.errors import GatewayError
from satgate_mcp.jsonrpc import JsonObj
from satgate_mcp.upstream.base import CALLER, SHARED, Caller, Origin, ProgressCallback, Scope

#: URIs one session may hold subscriptions to; each costs memory here and a subscription upstream.
MAX_PER_SESSION = 1000

__all__ = ["SHARED", "Origin", "Scope", "SubscriptionTable", "Subscriptions"]

log = structlog.get_logger("satgate_mcp.subscriptions")


class Forward(Protocol):
    def __call__(self, params: JsonObj | None, *, on_progress: ProgressCallback | None = None
                 ) -> Awaitable[JsonObj]: ...


class SubscriptionTable:
    """Who is subscribed to what, and in which scope: the decisions, with no I/O."""

    def __init__(self) -> None:
        self._by_uri: dict[str, set[str]] = {}
        self._by_session: dict[str, dict[str, Scope]] = {}
        #: (scope, uri) -> the sessions holding it there: the upstream's reference count.
        self._holders: dict[tuple[Scope, str], set[str]] = {}

    def has(self, session_id: str, uri: str) -> bool:
        return uri in self._by_session.get(session_id, ())

    def count(self, session_id: str) -> int:
        return len(self._by_session.get(session_id, ()))

    def add(self, session_id: str, uri: str, scope: Scope = SHARED) -> bool:
        """Record the subscription; True when it is the URI's first in its scope (so the upstream must be asked)."""
        holders = self._holders.setdefault((scope, uri), set())
        first = not holders
        holders.add(session_id)
        self._by_uri.setdefault(uri, set()).add(session_id)
        self._by_session.setdefault(session_id, {})[uri] = scope
        return first

    def remove(self, session_id: str, uri: str) -> bool:
        """Forget it; True when that was the URI's last subscription in its scope (so the upstream must be told)."""
        own = self._by_session.get(session_id)
        if own is None or uri not in own:
            return False
        scope = own.pop(uri)
        if not own:
            del self._by_session[session_id]
        subscribers = self._by_uri[uri]
        subscribers.discard(session_id)
        if not subscribers:
            del self._by_uri[uri]
        holders = self._holders[(scope, uri)]
        holders.discard(session_id)
        if holders:
            return False
        del self._holders[(scope, uri)]
        return True

    def holds(self, scope: Scope, uri: str) -> bool:
        """Whether some session holds the URI in that scope (the upstream subscription is still wanted)."""
        return bool(self._holders.get((scope, uri)))

    def scope_of(self, session_id: str, uri: str) -> Scope | None:
        return self._by_session.get(session_id, {}).get(uri)

    def drop_session(self, session_id: str) -> list[str]:
        """Forget every subscription of an ended session; the URIs nobody holds any more (in their scope)."""
        return [uri for uri, _scope in self.drop_session_scoped(session_id)]

    def drop_session_scoped(self, session_id: str) -> list[tuple[str, Scope]]:
        own = self._by_session.get(session_id, {})
        scoped = sorted(own.items(), key=lambda item: item[0])
        return [(uri, scope) for uri, scope in scoped if self.remove(session_id, uri)]

    def subscribers(self, uri: str, origin: Origin | None = None) -> frozenset[str]:
        """Who gets an update of ``uri``; from an isolated child (``origin``), only those subscribed on it."""
        found = self._by_uri.get(uri, ())
        if origin is None:
            return frozenset(found)
        return frozenset(s for s in found if origin in self._by_session.get(s, {}).get(uri, SHARED))


def _uri(params: JsonObj | None) -> str:
    uri = (params or {}).get("uri")
    if not isinstance(uri, str) or not uri:
        raise GatewayError("resources/subscribe and unsubscribe need a uri", {"error": "invalid_params"},
                           code=jsonrpc.INVALID_PARAMS)
    return uri


def _empty() -> JsonObj:
    return jsonrpc.result_response(None, {})


class Subscriptions:
    """The table plus the upstream calls its decisions call for."""

    def __init__(self, subscribe: Forward, unsubscribe: Forward,
                 scope: Callable[[str], Scope] | None = None) -> None:
        """``scope``: the upstream children a URI's subscription by the current caller lives on (the pool knows)."""
        self.table = SubscriptionTable()
        self._subscribe = subscribe
        self._unsubscribe = unsubscribe
        self._scope = scope or (lambda uri: SHARED)
        #: (scope, URI) -> the upstream subscribe still in flight: later sessions wait for its answer.
        self._pending: dict[tuple[Scope, str], asyncio.Future[JsonObj]] = {}
        #: (scope, URI) -> whom it was subscribed for: its release at a session's end goes to the same child.
        self._callers: dict[tuple[Scope, str], Caller | None] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    async def subscribe(self, session_id: str, params: JsonObj | None, *,
                        on_progress: ProgressCallback | None = None) -> JsonObj:
        uri = _uri(params)
        if not session_id:
            raise GatewayError("resources/subscribe needs a session: updates arrive on its stream",
                               {"error": "session_required"}, code=jsonrpc.INVALID_REQUEST)
        if self.table.has(session_id, uri):
            return _empty()
        if self.table.count(session_id) >= MAX_PER_SESSION:
            raise GatewayError(f"A session may subscribe to at most {MAX_PER_SESSION} resources",
                               {"error": "too_many_subscriptions", "limit": MAX_PER_SESSION},
                               code=jsonrpc.INVALID_REQUEST)
        scope = self._scope(uri)
        key = (scope, uri)
        if not self.table.add(session_id, uri, scope):
            pending = self._pending.get(key)
            if pending is None:
                return _empty()
            reply = await asyncio.shield(pending)
            if "error" in reply:
                self.table.remove(session_id, uri)
            return reply
        future: asyncio.Future[JsonObj] = asyncio.get_running_loop().create_future()
        self._pending[key] = future
        self._callers[key] = CALLER.get()
        try:
            reply = await self._subscribe(params, on_progress=on_progress)
        except BaseException as exc:
            self._forget(scope, uri)
            future.set_result(jsonrpc.error_response(None, jsonrpc.INTERNAL_ERROR, f"subscribe failed: {exc!r}"))
            raise
        finally:
            if self._pending.get(key) is future:  # a later subscribe may have started its own meanwhile
                del self._pending[key]
        if "error" in reply:
            self._forget(scope, uri)
        future.set_result(reply)
        return reply

    async def unsubscribe(self, session_id: str, params: JsonObj | None, *,
                          on_progress: ProgressCallback | None = None) -> JsonObj:
        uri = _uri(params)
        scope = self.table.scope_of(session_id, uri) or SHARED
        if self.table.remove(session_id, uri) and await self._still_unheld(scope, uri):
            self._callers.pop((scope, uri), None)
            return await self._unsubscribe(params, on_progress=on_progress)
        return _empty()  # another session still holds it, or this one never did

    async def _still_unheld(self, scope: Scope, uri: str) -> bool:
        """After the URI's last holder in its scope left: whether the upstream must be told, once its subscribe (if
        still in flight) has landed, so an unsubscribe never overtakes it; not if the subscribe failed or someone
        took the URI again meanwhile."""
        pending = self._pending.get((scope, uri))
        if pending is not None:
            reply = await asyncio.shield(pending)
            if "error" in reply:
                return False
        return not self.table.holds(scope, uri)

    def end_session(self, session_id: str) -> None:
        """A session ended: tell the upstreams about each URI nobody else is subscribed to (in its scope)."""
        for uri, scope in self.table.drop_session_scoped(session_id):
            task = asyncio.ensure_future(self._release(uri, scope, self._callers.pop((scope, uri), None)))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def released(self) -> None:
        """Wait until the upstream unsubscribes of ended sessions went out (tests await this)."""
        if self._tasks:
            await asyncio.wait(list(self._tasks))

    async def aclose(self) -> None:
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)

    def _forget(self, scope: Scope, uri: str) -> None:
        """The upstream refused (or never got) the subscription: nobody in its scope holds it."""
        self._callers.pop((scope, uri), None)
        for session_id in self.table.subscribers(uri):
            if self.table.scope_of(session_id, uri) == scope:
                self.table.remove(session_id, uri)

    async def _release(self, uri: str, scope: Scope, caller: Caller | None) -> None:
        """The upstream unsubscribe, for whom the subscription was made (an isolated upstream picks that child)."""
        CALLER.set(caller)  # this task's own context
        try:
            if await self._still_unheld(scope, uri):
                await self._unsubscribe({"uri": uri})
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.info("upstream_unsubscribe_failed", uri=uri[:200], error=str(exc) or repr(exc))
