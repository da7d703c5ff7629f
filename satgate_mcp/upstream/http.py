"""An upstream MCP server reached over Streamable HTTP.

One MCP session upstream serves every client session. Replies may come as one JSON object or
as a ``text/event-stream`` that first carries the request's progress and other notifications.
When the upstream forgets our session (404), we initialize a new one and retry once: many
servers drop sessions on restart, and a client that recovers by itself is what they expect.

This module keeps the session (handshake, renewal, reconnects, the long-lived listen streams);
how one exchange is sent and its answer read is http_channel.py's.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager

import aiohttp

from satgate_mcp import jsonrpc
from satgate_mcp.errors import UpstreamUnavailable
from satgate_mcp.events import Publisher
from satgate_mcp.jsonrpc import JsonObj
from satgate_mcp.metrics import Metrics
from satgate_mcp.settings import HttpUpstreamSpec
from satgate_mcp.upstream.base import NotificationCallback, ProgressCallback, initialize_timeout
from satgate_mcp.upstream.breaker import Breaker, call_outcome, circuit_open, upstream_breaker
from satgate_mcp.upstream.http_channel import HttpChannel
from satgate_mcp.upstream.http_rules import JSON_AND_SSE, request_headers, status_problem
from satgate_mcp.upstream.inbox import RELIST_NOTIFICATION
from satgate_mcp.upstream.outgoing import encode_message
from satgate_mcp.upstream.wire import (
    MODERN_PROTOCOL_VERSION,
    RestartPolicy,
    check_initialize_result,
    discover_params,
    discover_timeout,
    discovered_result,
    initialize_params,
    restart_plan,
)


class HttpUpstream(HttpChannel):
    def __init__(
        self,
        name: str,
        spec: HttpUpstreamSpec,
        *,
        publisher: Publisher,
        metrics: Metrics,
        client_session_factory: Callable[[], aiohttp.ClientSession] | None = None,
        restart_policy: RestartPolicy | None = None,
        listen: bool = True,
        breaker: Breaker | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``listen`` opens the optional GET stream that carries notifications outside any request. ``breaker``:
        the circuit of another connection to the same upstream (a twin shares its 2025 side's); ``clock`` times
        a new one."""
        super().__init__(name, spec, publisher=publisher, metrics=metrics, restart_policy=restart_policy)
        self.breaker = breaker or upstream_breaker(name, spec.breaker, metrics, clock)
        self._factory = client_session_factory
        self._listen_enabled = listen
        self._init_lock = asyncio.Lock()
        self._connector: asyncio.Task[None] | None = None
        self._listener: asyncio.Task[None] | None = None
        self.handshakes = 0

    @property
    def session_id(self) -> str | None:
        return self._session_id

    async def start(self, on_notification: NotificationCallback) -> None:
        if self._http is not None or self._closing.is_set():
            return
        self._inbox.on_notification = on_notification
        if self._factory is not None:
            self._http = self._factory()
        else:
            timeout = aiohttp.ClientTimeout(total=None, sock_connect=min(10.0, self._spec.timeout))
            self._http = aiohttp.ClientSession(timeout=timeout)
        self._reconnect()

    async def _request(self, method: str, params: JsonObj | None, budget: float,
                       on_progress: ProgressCallback | None) -> JsonObj:
        """Through the circuit breaker: refused at once, unsent, while it is open; what each call proved is
        told to it."""
        verdict = self.breaker.admit()
        if not verdict.go:
            self._metrics.circuit_fast_failures.labels(upstream=self.name).inc()
            raise circuit_open(self.name, verdict)
        status: int | None = None
        failure: BaseException | None = None
        try:
            status, reply = await self._forward(method, params, budget, on_progress)
            return reply
        except BaseException as exc:
            failure = exc
            raise
        finally:
            self.breaker.settle(call_outcome(status, failure), probe=verdict.probe)

    async def _forward(self, method: str, params: JsonObj | None, budget: float,
                       on_progress: ProgressCallback | None) -> tuple[int, JsonObj]:
        """One request and its answer: (the HTTP status that carried it, the reply)."""
        self._check_open()
        upstream_id = next(self._ids)
        params, route = self._inbox.open_route(params, on_progress)
        message = jsonrpc.request_message(upstream_id, method, params)
        sent = False
        try:
            async with asyncio.timeout(budget) as clock:
                self._inbox.time_route(route, clock, budget)
                try:
                    await self._ensure_ready()
                except UpstreamUnavailable as exc:
                    exc.sent = False  # the handshake failed: this request was never posted
                    raise
                sent = True
                answered = await self._exchange(message, route)
                await self._inbox.close_route(route, drain=True)
            return answered
        except TimeoutError:
            if not sent or not self._ready.is_set():
                raise self._unavailable(f"upstream {self.name!r} could not be reached within {budget:g}s",
                                        sent=sent) from None
            raise await self._timed_out(upstream_id, method, budget, sent=sent) from None
        except asyncio.CancelledError:
            if sent:
                self._inbox.spawn(self._send_cancel(upstream_id, "cancelled by the client"))
            raise
        finally:
            await self._inbox.close_route(route, drain=False)

    async def notify(self, method: str, params: JsonObj | None) -> None:
        self._check_open()
        await self._ensure_ready()
        message = jsonrpc.notification_message(method, params)
        stale = self._session_id
        if await self._post_message(message) == 404 and stale is not None:
            await self._renew(stale)
            await self._post_message(message)

    async def close(self) -> None:
        if not self._begin_close():
            return
        await self._close_twin()
        tasks = [t for t in (self._connector, self._listener) if t is not None]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)
        for task in tasks:
            if not task.cancelled() and task.exception() is not None:
                self._log.warning("upstream_task_failed", error=repr(task.exception()))
        if self._http is not None and self._session_id is not None:
            await self._delete_session()
        await self._inbox.aclose()
        if self._http is not None:
            await self._http.close()

    # -- session -----------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closing.is_set() or self._http is None:
            raise self._unavailable(f"upstream {self.name!r} is not running", sent=False)

    def _reconnect(self) -> None:
        """Keep trying to initialize in the background so readiness recovers without a call."""
        if self._closing.is_set() or (self._connector is not None and not self._connector.done()):
            return
        self._connector = asyncio.create_task(self._connect_loop(), name=f"upstream-{self.name}")

    async def _connect_loop(self) -> None:
        attempt = 0
        while not self._closing.is_set():
            try:
                await self._ensure_ready()
                return
            except UpstreamUnavailable as exc:
                delay, attempt = restart_plan(attempt, 0.0, self._policy)
                self._log.warning("upstream_connect_failed", error=exc.message, retry_in=delay)
                self._mark_down({"status": exc.message})  # known down: start-up stops waiting, /readyz says why
            await self._pause(delay)

    async def _ensure_ready(self) -> None:
        if self._ready.is_set():
            return
        async with self._init_lock:
            if not self._ready.is_set():
                await self._handshake("reconnect")

    async def _renew(self, stale_session: str) -> None:
        """Single flight: whoever sees the 404 first renews; the others reuse the new session."""
        async with self._init_lock:
            if self._ready.is_set() and self._session_id != stale_session:
                return
            self._ready.clear()
            await self._handshake("session expired (HTTP 404)")

    async def _handshake(self, reason: str) -> None:
        self._check_open()
        self._ready.clear()
        if self._listener is not None:
            self._listener.cancel()
        self._session_id = self._protocol_version = None
        self._modern = False
        protocol = self._spec.protocol
        if protocol == "2026" and await self._discover():
            self._became_ready(reason, None)
            return
        if self._discover_only:
            raise UpstreamUnavailable(f"upstream {self.name!r} does not answer server/discover")
        message = jsonrpc.request_message(next(self._ids), "initialize", initialize_params())
        try:
            async with asyncio.timeout(initialize_timeout(self._spec.timeout)):
                status, reply, session_id = await self._post(message)
                # Refused: perhaps a 2026-07-28-only server (it answers initialize with 404 -32601).
                if protocol == "auto" and (reply is None or "error" in reply) and await self._discover():
                    self._became_ready(reason, None)
                    return
                if reply is None:
                    raise UpstreamUnavailable(f"upstream {self.name!r} {status_problem(status, had_session=False)}")
                try:
                    result = check_initialize_result(reply)
                except ValueError as exc:
                    raise UpstreamUnavailable(f"upstream {self.name!r}: {exc}") from None
                self._session_id, self._protocol_version = session_id, str(result["protocolVersion"])
                status = await self._post_message(jsonrpc.notification_message("notifications/initialized"))
        except TimeoutError:
            raise self._unavailable(f"upstream {self.name!r} did not answer initialize in time") from None
        if status >= 400:
            self._log.warning("upstream_initialized_refused", status=status)
        self._init_result = result
        self._became_ready(reason, session_id)

    def _make_twin(self) -> HttpUpstream:
        """A sessionless connection to the same URL: 2026-07-28 requests beside the 2025 session."""
        twin = HttpUpstream(self.name, self._spec.model_copy(update={"protocol": "2026"}), publisher=self._publisher,
                            metrics=self._metrics, client_session_factory=self._factory,
                            restart_policy=self._policy, listen=self._listen_enabled, breaker=self.breaker)
        twin._discover_only = True
        return twin

    async def _discover(self) -> bool:
        """Whether the upstream speaks 2026-07-28 (then it is ready, with no session); any failure means 2025."""
        message = jsonrpc.request_message(next(self._ids), "server/discover", discover_params())
        try:
            async with asyncio.timeout(discover_timeout(self._spec.timeout)):
                _, reply, _ = await self._post(message)
        except (TimeoutError, UpstreamUnavailable) as exc:
            self._log.debug("upstream_discover_failed", error=str(exc) or type(exc).__name__)
            return False
        found = discovered_result(reply)
        self.declined = found is None
        if found is None:
            return False
        self._modern, self._init_result, self._protocol_version = True, found, MODERN_PROTOCOL_VERSION
        return True

    def _became_ready(self, reason: str, session_id: str | None) -> None:
        result = self._init_result or {}
        self._mark_ready()
        self.breaker.reachable()  # an open circuit need not wait out its backoff: the next call probes
        if self.handshakes:
            self._count_restart(reason=reason)
        self.handshakes += 1
        self._log.info("upstream_ready", server=result.get("serverInfo"), protocol=self._protocol_version,
                       reason=reason, has_session=session_id is not None)
        if self._listen_enabled:
            self._listener = asyncio.create_task(self._listen_modern() if self._modern else self._listen(session_id))
        self._inbox.notify(RELIST_NOTIFICATION, None)

    def _connection_lost(self, why: str) -> None:
        if self._ready.is_set():
            self._log.warning("upstream_connection_lost", error=why)
        self._ready.clear()
        self._reconnect()

    async def _delete_session(self) -> None:
        assert self._http is not None
        headers = request_headers(self._configured_headers(), accept=JSON_AND_SSE, session_id=self._session_id,
                                  protocol_version=self._protocol_version, json_body=False)
        try:
            async with asyncio.timeout(2.0), self._http.delete(self._spec.url, headers=headers) as resp:
                self._log.info("upstream_session_deleted", status=resp.status)
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            self._log.info("upstream_session_delete_failed", error=str(exc) or repr(exc))

    # -- exchanges ---------------------------------------------------------------------------

    async def _exchange(self, message: JsonObj, route: str | None = None) -> tuple[int, JsonObj]:
        """(the HTTP status, the reply); a 404 on our session renews it and tries once more."""
        renewed = False
        while True:
            used = self._session_id
            status, reply, _ = await self._post(message, route)
            if status == 404 and used is not None and not renewed:
                self._log.info("upstream_session_expired", method=message["method"])
                await self._renew(used)
                renewed = True
                continue
            if reply is not None and not (status == 404 and renewed):
                return status, reply
            raise self._unavailable(f"upstream {self.name!r} {status_problem(status, had_session=renewed)}",
                                    status=status)

    async def _listen(self, session_id: str | None) -> None:
        """The GET stream: notifications and requests the upstream sends outside any call."""
        assert self._http is not None
        http = self._http

        def open_stream() -> AbstractAsyncContextManager[aiohttp.ClientResponse]:
            headers = request_headers(self._configured_headers(), accept="text/event-stream", session_id=session_id,
                                      protocol_version=self._protocol_version, json_body=False)
            return http.get(self._spec.url, headers=headers)

        await self._follow_stream(open_stream, lambda: self._session_id == session_id, renew=session_id,
                                  missing_level="debug")

    async def _listen_modern(self) -> None:
        """A modern upstream's list changes come on a ``subscriptions/listen`` stream; reopened when it ends."""
        assert self._http is not None
        http = self._http

        def open_stream() -> AbstractAsyncContextManager[aiohttp.ClientResponse]:
            message = self._listen_request(next(self._ids))
            return http.post(self._spec.url, data=encode_message(message), headers=self._headers(message))

        await self._follow_stream(open_stream, lambda: self._modern, renew=None, missing_level="info")

    async def _relisten(self) -> None:
        """A new stream with the new filter, then the old one closed: an update may come twice, never not at all.

        Not ready yet: the stream opened when it is has the current filter."""
        if not (self._modern and self._listen_enabled and self._ready.is_set()):
            return
        old, self._listener = self._listener, asyncio.create_task(self._listen_modern())
        if old is not None:
            old.cancel()

    async def _follow_stream(self, open_stream: Callable[[], AbstractAsyncContextManager[aiohttp.ClientResponse]],
                             still_wanted: Callable[[], bool], *, renew: str | None, missing_level: str) -> None:
        """Read the upstream's long-lived stream, reopened when it ends, until it is not wanted any more.

        A 404 on a session's stream renews that session (``renew``); a stream that stayed open a while earns a
        quick reopen, one that keeps closing backs off.
        """
        loop = asyncio.get_running_loop()
        attempt = 0
        while not self._closing.is_set() and still_wanted() and self._ready.is_set():
            opened = loop.time()
            try:
                async with open_stream() as resp:
                    if resp.status == 404 and renew is not None:
                        self._inbox.spawn(self._renew_quietly(renew))
                        return
                    if resp.status != 200 or resp.content_type != "text/event-stream":
                        getattr(self._log, missing_level)("upstream_no_listen_stream", status=resp.status)
                        return
                    await self._read_stream(resp, None)
            except (aiohttp.ClientError, OSError) as exc:
                self._connection_lost(str(exc) or type(exc).__name__)
                return
            except UpstreamUnavailable as exc:
                self._log.warning("upstream_listen_failed", error=exc.message)
            delay, attempt = restart_plan(attempt, loop.time() - opened, self._policy)
            await self._pause(delay)

    async def _renew_quietly(self, stale_session: str) -> None:
        try:
            await self._renew(stale_session)
        except UpstreamUnavailable as exc:
            self._log.warning("upstream_renew_failed", error=exc.message)
            self._connection_lost(exc.message)
