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
    Relay,
    Upstream,
    declared_meta,
    event_within,
    is_input_carrier,
    is_relay,
)
from satgate_mcp.upstream.client_trace import client_attributes, traced_request
from satgate_mcp.upstream.eras import ModernTwin, wants_modern_twin
from satgate_mcp.upstream.inbox import Inbox
from satgate_mcp.upstream.wire import (
    MAX_INPUT_ROUNDS,
    SUBSCRIPTION_METHODS,
    RestartPolicy,
    cancelled_params,
    clip,
    is_input_required,
    retry_params,
    split_batch,
    with_modern_meta,
    without_input_fields,
)

SpecT = TypeVar("SpecT", StdioUpstreamSpec, HttpUpstreamSpec)


def strip_client_credentials(params: JsonObj | None) -> JsonObj | None:
    """Drop ``_meta.token`` so a client's bearer token never reaches an upstream."""
    if not params or not isinstance(params.get("_meta"), dict) or "token" not in params["_meta"]:
        return params
    meta = {k: v for k, v in params["_meta"].items() if k != "token"}
    out = dict(params)
    if meta:
        out["_meta"] = meta
    else:
        del out["_meta"]
    return out


def encode_message(message: JsonObj) -> bytes:
    """The bytes of one message to an upstream, without the client's credentials.

    Every request, notification and answer the gateway sends upstream, on either transport, is
    encoded here, so this is where the no-token-passthrough rule is kept, and nothing bypasses it.
    """
    params = message.get("params")
    if isinstance(params, dict):
        stripped = strip_client_credentials(params)
        if stripped is not params:
            message = {**message, "params": stripped}
    return jsonrpc.dumps(message)  # compact UTF-8, as json.dumps(ensure_ascii=False) wrote it


def moved_on_refusal(asked: str, here: str) -> JsonObj:
    """A retry whose sealed state names another upstream than the one the call now routes to."""
    return jsonrpc.error_response(None, jsonrpc.INVALID_PARAMS,
                                  f"Invalid params: this requestState continues a call on upstream {asked!r}, but "
                                  f"the request now goes to {here!r} (or that upstream no longer speaks 2026-07-28); "
                                  "issue the call again without inputResponses and requestState",
                                  {"error": "request_state_refused"})


def missing_capability_reply(upstream: str, required: JsonObj) -> JsonObj:
    """The call's error when a modern upstream asks for input the calling client did not declare it can give."""
    names = ", ".join(sorted(required))
    return jsonrpc.error_response(None, jsonrpc.MISSING_CLIENT_CAPABILITY,
                                  f"This call needs the client capability {names}, which the client did not declare "
                                  f"(upstream {upstream!r} asked for it)",
                                  {"error": "missing_client_capability", "requiredCapabilities": required})


def input_refusal(upstream: str, why: str) -> JsonObj:
    return jsonrpc.error_response(None, jsonrpc.INTERNAL_ERROR,
                                  f"upstream {upstream!r} asked for client input the gateway cannot give: {why}",
                                  {"error": "input_not_relayed", "upstream": upstream})


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
        #: What every client span to this upstream records (made on the first traced request).
        self._span_attributes: Attributes | None = None
        #: ``auto`` after the handshake: the upstream's 2026-07-28 side, looked for on the first 2026 request.
        self._twin: ModernTwin | None = None
        #: Set on a twin: an upstream that does not answer ``server/discover`` is not handshaken with instead.
        self._discover_only = False

    @property
    def modern(self) -> bool:
        return self._modern

    @property
    def ready(self) -> bool:
        return self._ready.is_set()

    @property
    def initialize_result(self) -> JsonObj | None:
        return self._init_result

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
        if resume is not None and (resume.upstream != self.name or not self._modern):
            return moved_on_refusal(resume.upstream, self.name)
        if self._modern and method in SUBSCRIPTION_METHODS:
            return await self._listen_for(params, subscribe=SUBSCRIPTION_METHODS[method])
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
            answers = await self._ask_client(on_progress, result)
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
            self._twin = ModernTwin(self._make_twin, self._spec.timeout)
            self._twin.on_notification = self._inbox.on_notification
        return await self._twin.get()

    def _make_twin(self) -> Upstream:
        """A connection of the same transport to the same upstream that speaks 2026-07-28 only."""
        raise NotImplementedError

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

    async def _ask_client(self, relay: Relay, result: JsonObj) -> JsonObj:
        """Put each of a modern upstream's ``inputRequests`` to the 2025 client as a real request.

        ``{"result": inputResponses}``, or the first refusal or error the client gave, as the call's error.
        """
        asked = result.get("inputRequests")
        requests: list[tuple[str, str, JsonObj | None]] = []
        for key, request in (asked.items() if isinstance(asked, dict) else ()):
            if not isinstance(request, dict) or not isinstance(request.get("method"), str):
                return input_refusal(self.name, f"its inputRequests[{key!r}] is not a request")
            params = request.get("params")
            requests.append((str(key), request["method"], params if isinstance(params, dict) else None))
        # Nothing is put to the client before it is known that it can answer every question.
        required: JsonObj = {}
        for _, method, params in requests:
            for capability, detail in (relay.lacks(method, params) or {}).items():
                required[capability] = {**required.get(capability, {}), **detail}
        if required:
            return missing_capability_reply(self.name, required)
        answers: JsonObj = {}
        for key, method, params in requests:
            answer = await relay.ask(method, params, self._spec.timeout)
            if "error" in answer:
                return jsonrpc.with_id({k: v for k, v in answer.items() if k != "result"}, None)
            if not isinstance(answer.get("result"), dict):
                return input_refusal(self.name, "the client's answer has no result")
            answers[key] = answer["result"]
        return {"result": answers}

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
