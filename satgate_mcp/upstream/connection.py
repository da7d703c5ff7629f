"""What the stdio and HTTP upstream connections share: identity, readiness, the inbox, message routing.

Only what means the same on both transports lives here; how a transport connects, sends,
matches replies and restarts stays with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
from collections.abc import Awaitable, Callable
from typing import Any, Generic, TypeVar

import structlog
from opentelemetry import trace

from satgate_mcp import events, jsonrpc, tracing
from satgate_mcp.errors import UpstreamTimeout, UpstreamUnavailable
from satgate_mcp.events import Publisher
from satgate_mcp.jsonrpc import JsonObj, RequestId
from satgate_mcp.metrics import Metrics
from satgate_mcp.settings import HttpUpstreamSpec, StdioUpstreamSpec
from satgate_mcp.trace_spans import Attributes, upstream_attributes
from satgate_mcp.upstream.base import (
    ProgressCallback,
    Upstream,
    declared_meta,
    event_within,
    is_input_carrier,
    is_relay,
)
from satgate_mcp.upstream.bridge import ask_client, input_refusal, moved_on_refusal
from satgate_mcp.upstream.client_trace import client_attributes, traced_request
from satgate_mcp.upstream.eras import ModernTwin, Probe, wants_modern_twin
from satgate_mcp.upstream.inbox import Inbox
from satgate_mcp.upstream.restore import note_subscription
from satgate_mcp.upstream.wire import (
    LIST_METHODS,
    MAX_INPUT_ROUNDS,
    SUBSCRIPTION_METHODS,
    RestartPolicy,
    cancelled_params,
    clip,
    is_input_required,
    listen_params,
    retry_params,
    split_batch,
    with_modern_meta,
    without_input_fields,
)

SpecT = TypeVar("SpecT", StdioUpstreamSpec, HttpUpstreamSpec)


class UpstreamConnection(Generic[SpecT]):
    def __init__(
        self,
        name: str,
        spec: SpecT,
        *,
        transport: str,
        send: Callable[[JsonObj], Awaitable[object]],
        publisher: Publisher,
        metrics: Metrics,
        restart_policy: RestartPolicy | None,
    ) -> None:
        """``send`` delivers one message the gateway did not await a reply to: answers and notifications."""
        self.name = name
        self._spec: SpecT = spec
        self._transport = transport
        self._send = send
        self._publisher = publisher
        self._metrics = metrics
        self._policy = restart_policy or RestartPolicy()
        self._log = structlog.get_logger("satgate_mcp.upstream").bind(upstream=name, transport=transport)
        shared_pipe = transport == "stdio"
        self._inbox = Inbox(name, send, shared_pipe=shared_pipe, metrics=metrics, ask_timeout=spec.timeout,
                            isolation=spec.isolation if shared_pipe else "shared")
        self._ids = itertools.count(1)
        self._ready = asyncio.Event()
        #: Set while down after a failed try (cleared when ready): what start-up and /readyz stop waiting on.
        self._down = asyncio.Event()
        self._last_failure: dict[str, str] | None = None
        self._closing = asyncio.Event()
        self._init_result: JsonObj | None = None
        #: Whether the upstream speaks 2026-07-28 (found by ``server/discover``): no session, ``_meta`` on each request.
        self._modern = False
        #: A modern upstream's subscribed URIs (the pool's subscriptions, reference-counted there): its listen filter.
        self._resource_subscriptions: set[str] = set()
        #: The extension's task ids some client's listen stream follows here (task_relay.py): also in that filter.
        self._watched_tasks: frozenset[str] = frozenset()
        #: What every client span to this upstream records (made on the first traced request).
        self._span_attributes: Attributes | None = None
        #: ``auto`` after the handshake: the upstream's 2026-07-28 side, looked for on the first 2026 request.
        self._twin: ModernTwin | None = None
        #: Set on a twin: an upstream that does not answer ``server/discover`` is not handshaken with instead.
        self._discover_only = False
        #: Whether a modern connection keeps a listen stream open (HTTP tests may turn it off).
        self._listen_enabled = True
        #: A modern connection whose listen stream was waited for in vain is not waited for again.
        self._never_acknowledged = False
        #: The upstream answered ``server/discover`` without 2026-07-28 (dying or being down is no answer).
        self.declined = False

    @property
    def modern(self) -> bool:
        return self._modern

    @property
    def ready(self) -> bool:
        return self._ready.is_set()

    @property
    def initialize_result(self) -> JsonObj | None:
        return self._init_result

    @property
    def modern_result(self) -> JsonObj | None:
        """A dual upstream's 2026-07-28 side's ``server/discover`` result, once found (what only that era offers)."""
        twin = self._twin.current if self._twin is not None else None
        return twin.initialize_result if isinstance(twin, UpstreamConnection) else None

    async def wait_ready(self, timeout: float) -> bool:
        return await event_within(self._ready, timeout)

    async def wait_settled(self, timeout: float) -> bool:
        waits = [asyncio.ensure_future(self._ready.wait()), asyncio.ensure_future(self._down.wait())]
        try:
            await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for wait in waits:
                wait.cancel()
        return self.ready

    @property
    def last_failure(self) -> dict[str, str] | None:
        return None if self.ready else self._last_failure

    def _mark_ready(self) -> None:
        self._down.clear()
        self._last_failure = None
        self._ready.set()

    def _mark_down(self, failure: dict[str, str]) -> None:
        self._ready.clear()
        self._last_failure = failure
        self._down.set()

    async def request(
        self,
        method: str,
        params: JsonObj | None,
        *,
        on_progress: ProgressCallback | None = None,
        timeout: float | None = None,
    ) -> JsonObj:
        """``Upstream.request``: within the caller's timeout, else the one configured for this upstream."""
        budget = self._spec.timeout if timeout is None else timeout
        carrier = on_progress if is_input_carrier(on_progress) else None
        resume = carrier.resume if carrier is not None else None
        if wants_modern_twin(self._spec.protocol, self._modern, "2026" if carrier is not None else None):
            twin = await self._modern_side()
            if twin is not None:  # the client's own era: the dual upstream answers it as the client asked
                return await twin.request(method, params, on_progress=on_progress, timeout=timeout)
        if method in LIST_METHODS and (twin := self._changed_last()) is not None:
            return await twin.request(method, params, on_progress=on_progress, timeout=timeout)
        if resume is not None and (resume.upstream != self.name or not self._modern):
            return moved_on_refusal(resume.upstream, self.name)
        if method in SUBSCRIPTION_METHODS:
            if self._modern:
                return await self._listen_for(params, subscribe=SUBSCRIPTION_METHODS[method])
            return await self._subscribe_dual(method, params, budget, on_progress)
        if not self._modern:
            if carrier is not None:  # a 2026 client's answers mean nothing to a 2025 upstream: it asks anew
                params = without_input_fields(params)
            return await self._call(method, params, budget, on_progress)
        params = with_modern_meta(params, on_progress.log_level() if is_relay(on_progress) else None,
                                  declared_meta(on_progress))
        if resume is not None:
            params = retry_params(params, resume.responses, resume.state)
        reply = await self._call(method, params, budget, on_progress)
        for _ in range(MAX_INPUT_ROUNDS):
            if not is_input_required(reply):
                return reply
            result: JsonObj = reply["result"]
            if carrier is not None:
                carrier.carry(self.name, result)
                return reply
            if not is_relay(on_progress):
                return input_refusal(self.name, "the call has no client that could be asked")
            answers = await ask_client(self.name, on_progress, result, self._spec.timeout)
            if "error" in answers:
                return answers
            params = retry_params(params, answers["result"], result.get("requestState"))
            reply = await self._call(method, params, budget, on_progress)
        return reply if not is_input_required(reply) else input_refusal(
            self.name, f"it still asked for input after {MAX_INPUT_ROUNDS} rounds")

    async def _modern_side(self) -> Upstream | None:
        """The upstream's 2026-07-28 connection next to this 2025 one, None when it has none (probed once)."""
        if self._twin is None:
            if self._closing.is_set():
                return None
            self._twin = ModernTwin(self._seeded_twin, self._spec.timeout)
            self._twin.on_notification = self._inbox.on_notification
        twin = await self._twin.get()
        if isinstance(twin, UpstreamConnection) and not self._resource_subscriptions <= twin._resource_subscriptions:
            # subscribed here while the twin was being found (seeded before): its filter catches up
            twin._resource_subscriptions |= self._resource_subscriptions
            await twin._relisten()
        return twin

    def _changed_last(self) -> Upstream | None:
        """The 2026-07-28 side when its list change is the newest: a stdio twin is a second child, whose lists
        may differ from this one's; the gateway's lists follow the side that changed last."""
        twin = self._twin.current if self._twin is not None else None
        if isinstance(twin, UpstreamConnection) and twin._inbox.list_changes > self._inbox.list_changes:
            return twin
        return None

    def _seeded_twin(self) -> Probe:
        """The 2026-07-28 side, its listen filter starting with every URI subscribed on this 2025 session."""
        twin = self._make_twin()
        if isinstance(twin, UpstreamConnection):
            twin._resource_subscriptions |= self._resource_subscriptions
            twin._watched_tasks = self._watched_tasks
        return twin

    def _make_twin(self) -> Probe:
        """A connection of the same transport to the same upstream that speaks 2026-07-28 only."""
        raise NotImplementedError

    async def listening(self, timeout: float) -> bool:
        """``Upstream.listening``: a dual-revision upstream's 2026-07-28 side is looked for here (the first 2026
        client that listens finds it, as its first request would) and listened to, since such an upstream
        announces a change made in that era only on listen streams."""
        if not self._ready.is_set():
            return False
        if self._modern:
            return await self._acknowledged(timeout)
        if not wants_modern_twin(self._spec.protocol, False, "2026"):
            return True
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        try:  # shielded: a probe cut short would leave a second child or connection behind, unrecorded
            twin = await asyncio.wait_for(asyncio.shield(self._modern_side()), timeout)
        except TimeoutError:
            return False
        return twin is None or await twin.listening(max(0.0, deadline - loop.time()))

    async def _acknowledged(self, timeout: float) -> bool:
        if not self._listen_enabled or self._inbox.acknowledged.is_set():
            return True
        if self._never_acknowledged:  # it did not acknowledge before: a client's listen is not held up again
            return False
        found = await event_within(self._inbox.acknowledged, timeout)
        self._never_acknowledged = not found
        return found

    def _listen_request(self, request_id: RequestId) -> JsonObj:
        """The gateway's ``subscriptions/listen`` with the current filter: in force once acknowledged (again)."""
        self._inbox.acknowledged.clear()
        return jsonrpc.request_message(request_id, "subscriptions/listen",
                                       listen_params(self._resource_subscriptions, self._watched_tasks))

    async def _subscribe_dual(self, method: str, params: JsonObj | None, budget: float,
                              on_progress: ProgressCallback | None) -> JsonObj:
        """``resources/(un)subscribe`` on a 2025 session. A dual-revision upstream announces an update in the era of
        the change, so the URI also joins (or leaves) the listen filter of its 2026-07-28 side when it has one; a
        side found later starts with every URI held here."""
        reply = await self._call(method, params, budget, on_progress)
        uri = note_subscription(self._resource_subscriptions, method, params, reply)
        twin = self._twin.current if self._twin is not None else None
        if uri is not None and twin is not None:
            await twin.request(method, {"uri": uri})
        return reply

    async def watch_tasks(self, task_ids: frozenset[str]) -> None:
        """The task ids clients follow on this upstream: its (or a dual upstream's 2026-07-28 side's) listen filter."""
        self._watched_tasks = task_ids
        twin = self._twin.current if self._twin is not None else None
        if self._modern:
            await self._relisten()
        elif isinstance(twin, UpstreamConnection):
            await twin.watch_tasks(task_ids)

    async def _close_twin(self) -> None:
        if self._twin is not None:
            await self._twin.close()

    @property
    def resource_subscriptions(self) -> list[str]:
        return sorted(self._resource_subscriptions)

    async def _listen_for(self, params: JsonObj | None, *, subscribe: bool) -> JsonObj:
        """``resources/(un)subscribe`` for a 2026-07-28 upstream, which has neither: the URI joins (or leaves) the
        filter of its ``subscriptions/listen`` stream, reopened with the new filter."""
        uri = (params or {}).get("uri")
        if not isinstance(uri, str) or not uri:
            return jsonrpc.error_response(None, jsonrpc.INVALID_PARAMS, "Invalid params: a uri is required",
                                          {"error": "invalid_params"})
        resources = ((self._init_result or {}).get("capabilities") or {}).get("resources")
        if subscribe and not (isinstance(resources, dict) and resources.get("subscribe")):
            return jsonrpc.error_response(None, jsonrpc.METHOD_NOT_FOUND,
                                          f"upstream {self.name!r} offers no resource subscriptions",
                                          {"error": "not_offered", "upstream": self.name})
        if (uri in self._resource_subscriptions) != subscribe:
            if subscribe:
                self._resource_subscriptions.add(uri)
            else:
                self._resource_subscriptions.discard(uri)
            await self._relisten()
        return jsonrpc.result_response(None, {})

    async def _relisten(self) -> None:
        """Open the modern upstream's listen stream again with the current filter (its filter is fixed per stream)."""
        return None

    async def _call(self, method: str, params: JsonObj | None, budget: float,
                    on_progress: ProgressCallback | None) -> JsonObj:
        """``_request``, under a client span when it is part of a traced request (the gateway's own requests,
        listings and handshakes, start no trace of their own)."""
        tracer = tracing.TRACER
        if tracer is None or not trace.get_current_span().get_span_context().is_valid:
            return await self._request(method, params, budget, on_progress)
        if self._span_attributes is None:
            self._span_attributes = upstream_attributes(self.name, self._transport, getattr(self._spec, "url", None))
        return await traced_request(tracer, method, params,
                                    client_attributes(self._span_attributes, method, params, self._modern),
                                    lambda sent: self._request(method, sent, budget, on_progress))

    async def _request(self, method: str, params: JsonObj | None, budget: float,
                       on_progress: ProgressCallback | None) -> JsonObj:
        raise NotImplementedError

    def _begin_close(self) -> bool:
        """Mark the connection closing and not ready; False when it already was, so close() runs once."""
        if self._closing.is_set():
            return False
        self._closing.set()
        self._ready.clear()
        return True

    async def _pause(self, delay: float) -> None:
        """Back off before the next attempt; close() cuts the wait short."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(delay):
                await self._closing.wait()

    def _unavailable(self, message: str, *, sent: bool = True, **data: Any) -> UpstreamUnavailable:
        """``sent=False`` only where the request certainly never left: that alone earns a refund."""
        return UpstreamUnavailable(message, {"error": "upstream_unavailable", "upstream": self.name, **data},
                                   sent=sent)

    async def _timed_out(self, upstream_id: RequestId, method: str, budget: float, *, sent: bool) -> UpstreamTimeout:
        """The caller's error for a request that ran out of time, after telling the upstream to stop it."""
        if sent:
            await self._send_cancel(upstream_id, f"timed out after {budget:g}s")
        return UpstreamTimeout(f"upstream {self.name!r} did not answer {method} within {budget:g}s",
                               {"error": "upstream_timeout", "upstream": self.name})

    def _count_restart(self, **fields: Any) -> None:
        self._metrics.upstream_restarts.labels(upstream=self.name).inc()
        self._publisher.publish(events.UPSTREAM_RESTART, upstream=self.name, transport=self._transport, **fields)

    async def _send_cancel(self, upstream_id: RequestId, reason: str) -> None:
        message = jsonrpc.notification_message("notifications/cancelled", cancelled_params(upstream_id, reason))
        try:
            async with asyncio.timeout(2.0):
                await self._send(message)
        except (UpstreamUnavailable, TimeoutError) as exc:
            self._log.info("upstream_cancel_not_sent", request_id=upstream_id, error=str(exc) or repr(exc))

    def _sort_incoming(self, value: Any, route_key: str | None = None) -> list[tuple[jsonrpc.Response, Any]]:
        """Hand the upstream's notifications and requests to the inbox; return its replies for the caller to match.

        ``route_key`` names the call whose response stream carried ``value``: what it holds belongs to that call.

        Invalid messages are logged and skipped: one bad item must not lose the rest of a batch.
        """
        replies = []
        for item in split_batch(value):
            try:
                message = jsonrpc.parse_message(item)
            except jsonrpc.InvalidMessage as exc:
                self._log.warning("upstream_message_invalid", reason=str(exc), message=clip(json.dumps(item), 500))
                continue
            if isinstance(message, jsonrpc.Response):
                replies.append((message, item))
            else:
                self._inbox.handle(message, route_key)
        return replies
