"""``subscriptions/listen`` (2026-07-28): a modern client's long-lived stream of change notifications.

It replaces the 2025 GET stream and ``resources/subscribe``: the request names what it wants
(``toolsListChanged``, ``promptsListChanged``, ``resourcesListChanged``, ``resourceSubscriptions``, and the tasks
extension's ``taskIds``: the caller's own tasks, whose ``notifications/tasks`` it then gets),
the gateway acknowledges the subset it will honour first, then sends only those, each stamped with
the subscription id (the request's JSON-RPC id). Every merged list change reaches the streams that
asked for it, whichever upstream and era caused it: the acknowledgement waits until each upstream's
own change streams are in force (a 2026-07-28 upstream's listen stream, a dual-revision upstream's
2026-07-28 side), so a change made after it is never missed. The stream ends with an empty result on shutdown;
its resource subscriptions are released upstream when it ends in any way.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Protocol

import structlog

from satgate_mcp import jsonrpc
from satgate_mcp.auth.base import Identity
from satgate_mcp.jsonrpc import JsonObj, RequestId
from satgate_mcp.subscriptions import Origin, Subscriptions
from satgate_mcp.task_ids import TASK_NOTICE, TaskRef, notice_with_task_id, notified_task_id
from satgate_mcp.transport.stateless_rules import META_SUBSCRIPTION_ID
from satgate_mcp.upstream.base import TaskNotice

ACKNOWLEDGED = "notifications/subscriptions/acknowledged"
#: Flag in the filter -> the notification it opts in to.
LIST_FLAGS = {"toolsListChanged": "notifications/tools/list_changed",
              "promptsListChanged": "notifications/prompts/list_changed",
              "resourcesListChanged": "notifications/resources/list_changed"}
#: Which server capability each flag needs ("tools" is always there).
FLAG_CAPABILITY = {"toolsListChanged": "tools", "promptsListChanged": "prompts", "resourcesListChanged": "resources"}
RESOURCE_UPDATED = "notifications/resources/updated"
MAX_QUEUED = 1000
MAX_RESOURCE_SUBSCRIPTIONS = 100
MAX_TASK_IDS = 100
#: How long an acknowledgement waits for the upstreams' own change streams (a dual-revision upstream's 2026-07-28
#: side is found the first time: over stdio that starts a child).
SETTLE_SECONDS = 10.0

log = structlog.get_logger("satgate_mcp.transport")


@dataclass(frozen=True, slots=True)
class ListenFilter:
    lists: frozenset[str] = frozenset()  # notification methods
    uris: frozenset[str] = frozenset()
    #: The caller's own task ids it follows (as the caller knows them: sealed); delivered by ``task_notice``.
    tasks: frozenset[str] = frozenset()

    def wants(self, method: str, params: JsonObj | None) -> bool:
        if method == RESOURCE_UPDATED:
            return (params or {}).get("uri") in self.uris
        return method in self.lists

    def as_wire(self) -> JsonObj:
        wire: JsonObj = {flag: True for flag, method in LIST_FLAGS.items() if method in self.lists}
        if self.uris:
            wire["resourceSubscriptions"] = sorted(self.uris)
        if self.tasks:
            wire["taskIds"] = sorted(self.tasks)
        return wire


@dataclass(frozen=True, slots=True)
class Asked:
    """What a listen request asks for, well-formed."""

    flags: set[str]
    uris: list[str]
    task_ids: list[str]


def _strings(notifications: JsonObj, key: str, limit: int, what: str) -> list[str] | str:
    values = notifications.get(key, [])
    if not isinstance(values, list) or not all(isinstance(v, str) and v for v in values):
        return f"notifications.{key} must be a list of {what}"
    if len(values) > limit:
        return f"at most {limit} {what} per stream"
    return list(dict.fromkeys(values))


def requested_filter(params: JsonObj | None) -> Asked | str:
    """What the request asks for, or why it is malformed."""
    notifications = (params or {}).get("notifications")
    if not isinstance(notifications, dict):
        return "subscriptions/listen needs params.notifications (an object)"
    flags = {flag for flag in LIST_FLAGS if notifications.get(flag) is True}
    uris = _strings(notifications, "resourceSubscriptions", MAX_RESOURCE_SUBSCRIPTIONS, "URIs")
    task_ids = _strings(notifications, "taskIds", MAX_TASK_IDS, "task ids")
    if isinstance(uris, str) or isinstance(task_ids, str):
        return uris if isinstance(uris, str) else str(task_ids)
    return Asked(flags, uris, task_ids)


def honoured_lists(flags: Iterable[str], capabilities: JsonObj) -> frozenset[str]:
    """The list notifications the gateway can send: an upstream must offer that kind at all."""
    return frozenset(LIST_FLAGS[f] for f in flags if f == "toolsListChanged" or FLAG_CAPABILITY[f] in capabilities)


async def subscribe_uri(subscriptions: Subscriptions, key: str, uri: str) -> bool:
    """One URI of a listen stream, subscribed upstream (reference-counted with the 2025 sessions')."""
    try:
        reply = await subscriptions.subscribe(key, {"uri": uri})
    except Exception as exc:  # an upstream that cannot subscribe: the URI is left out of the acknowledgement
        log.info("listen_subscribe_failed", uri=uri[:200], error=type(exc).__name__)
        return False
    return "error" not in reply


def stamped(message: JsonObj, subscription_id: RequestId) -> JsonObj:
    """A notification carrying its subscription id in ``params._meta``."""
    params = dict(message.get("params") or {})
    meta = params.get("_meta")
    params["_meta"] = {**(meta if isinstance(meta, dict) else {}), META_SUBSCRIPTION_ID: subscription_id}
    return {**message, "params": params}


def acknowledgement(agreed: ListenFilter, subscription_id: RequestId) -> JsonObj:
    return stamped(jsonrpc.notification_message(ACKNOWLEDGED, {"notifications": agreed.as_wire()}), subscription_id)


def ended(subscription_id: RequestId) -> JsonObj:
    """The graceful end: an empty result carrying the subscription id."""
    return jsonrpc.result_response(subscription_id, {"resultType": "complete",
                                                     "_meta": {META_SUBSCRIPTION_ID: subscription_id}})


@dataclass
class Listener:
    key: str
    subscription_id: RequestId
    filter: ListenFilter
    #: Who listens: a policy reload tells only those whose lists it changed.
    identity: Identity | None = None
    #: The tasks it follows: (upstream, the upstream's id) -> the id the caller knows (the sealed one).
    task_refs: dict[TaskRef, str] = field(default_factory=dict)
    #: One slot beyond MAX_QUEUED for the None that ends a stream whose reader fell behind.
    queue: asyncio.Queue[JsonObj | None] = field(default_factory=lambda: asyncio.Queue(MAX_QUEUED + 1))

    def deliver(self, message: JsonObj) -> None:
        if self.queue.qsize() < MAX_QUEUED:
            self.queue.put_nowait(message)
        elif not self.queue.full():
            self.queue.put_nowait(None)

    def end(self) -> None:
        if not self.queue.full():
            self.queue.put_nowait(None)


class Listeners:
    """Every open listen stream of this process, and the pool's notices routed to them."""

    def __init__(self) -> None:
        self._open: dict[str, Listener] = {}
        self._keys = itertools.count(1)
        self._none_open = asyncio.Event()
        self._none_open.set()
        self.closing = False

    def __len__(self) -> int:
        return len(self._open)

    def open(self, subscription_id: RequestId, agreed: ListenFilter, identity: Identity | None = None) -> Listener:
        listener = Listener(f"listen:{next(self._keys)}", subscription_id, agreed, identity)
        self._open[listener.key] = listener
        self._none_open.clear()
        return listener

    def release(self, listener: Listener) -> None:
        self._open.pop(listener.key, None)
        if not self._open:
            self._none_open.set()

    def tell(self, method: str, only: Callable[[Identity], bool]) -> None:
        """A list change for some callers only (a policy reload changed what they, and no others, are shown)."""
        message = jsonrpc.notification_message(method, None)
        for listener in self._open.values():
            if listener.filter.wants(method, None) and (listener.identity is None or only(listener.identity)):
                listener.deliver(stamped(message, listener.subscription_id))

    def notice(self, method: str, params: JsonObj | None, origin: Origin | None = None) -> None:
        if origin is not None:  # from one client's own upstream child: a listen stream never subscribes there
            return
        message = jsonrpc.notification_message(method, params)
        for listener in self._open.values():
            if listener.filter.wants(method, params):
                listener.deliver(stamped(message, listener.subscription_id))

    def task_notice(self, upstream: str, method: str, params: JsonObj | None) -> None:
        """The pool's task listener: a task's ``notifications/tasks`` reaches each stream that follows it, under the
        id its caller knows."""
        task_id = notified_task_id(params)
        if method != TASK_NOTICE or task_id is None or params is None:
            return
        ref = TaskRef(upstream, task_id)
        for listener in self._open.values():
            sealed = listener.task_refs.get(ref)
            if sealed is not None:
                message = jsonrpc.notification_message(method, notice_with_task_id(params, sealed))
                listener.deliver(stamped(message, listener.subscription_id))

    async def end_all(self) -> None:
        """On shutdown: each stream ends with its result, and this returns once all have written it."""
        self.closing = True
        for listener in self._open.values():
            listener.end()
        await self._none_open.wait()


class Notice(Protocol):
    def __call__(self, method: str, params: JsonObj | None, origin: Origin | None = None) -> None: ...


def fan_out(*listeners: Notice) -> Notice:
    """One pool listener feeding several: the 2025 stream hub and the 2026 listen streams."""
    def notice(method: str, params: JsonObj | None, origin: Origin | None = None) -> None:
        for listener in listeners:
            listener(method, params, origin)
    return notice


def fan_out_tasks(*listeners: TaskNotice) -> TaskNotice:
    """One task listener feeding several: 2025 sessions' streams and 2026 listen streams."""
    def notice(upstream: str, method: str, params: JsonObj | None) -> None:
        for listener in listeners:
            listener(upstream, method, params)
    return notice
