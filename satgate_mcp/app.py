"""The one place that assembles the gateway: ``create_app`` wires settings to parts.

Tests and embedding applications pass their own parts (authenticator, pool, policy, publisher, clock);
everything else is built from settings. Long-lived resources start and stop in ``cleanup_ctx``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable

from aiohttp import web

from satgate_mcp.auth.base import Authenticator, per_token_quota
from satgate_mcp.auth.factory import authenticator_from_settings
from satgate_mcp.auth.revocation import revocation_files, start_revocations
from satgate_mcp.dispatch import Dispatcher, Policy, Pool
from satgate_mcp.events import FanoutPublisher, JsonlFilePublisher, LogPublisher, Publisher
from satgate_mcp.keys import (
    INFLIGHT,
    METRICS,
    POOL,
    REGISTRY,
    RESUMES_SESSIONS,
    SETTINGS,
    STORE_PROBE,
    TOMBSTONES,
)
from satgate_mcp.metrics import Metrics
from satgate_mcp.policy.engine import CallPolicy
from satgate_mcp.sessions import CloseReason, Session, SessionRegistry
from satgate_mcp.settings import Settings
from satgate_mcp.shared_tombstones import RedisTombstones
from satgate_mcp.state import open_state
from satgate_mcp.transport import health, oauth
from satgate_mcp.transport.call_runner import CallRunner, inflight_limiter
from satgate_mcp.transport.checks import RequestChecks
from satgate_mcp.transport.listen import Listeners, fan_out
from satgate_mcp.transport.middleware import request_logger
from satgate_mcp.transport.mrtr import Flows, derive_keys
from satgate_mcp.transport.replay import ReplayBook
from satgate_mcp.transport.session_endpoint import SessionEndpoint
from satgate_mcp.transport.session_gate import SessionGate
from satgate_mcp.transport.session_stream import StandaloneStream, StreamHub
from satgate_mcp.transport.sse import LegacySseTransport
from satgate_mcp.transport.stateless_endpoint import StatelessEndpoint
from satgate_mcp.upstream.pool import UpstreamPool


def _default_publisher(settings: Settings) -> tuple[Publisher, JsonlFilePublisher | None]:
    if settings.events_file is None:
        return LogPublisher(), None
    sink = JsonlFilePublisher(settings.events_file)
    return FanoutPublisher([LogPublisher(), sink]), sink


def create_app(
    settings: Settings,
    *,
    authenticator: Authenticator | None = None,
    pool: Pool | None = None,
    policy: Policy | None = None,
    publisher: Publisher | None = None,
    metrics: Metrics | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> web.Application:
    metrics = metrics or Metrics()
    # The app closes only what it built; parts handed in belong to the caller.
    owned: list[Callable[[], Awaitable[None]]] = []
    state = open_state(settings)  # SQLite in SATGATE_STATE_DIR; None for memory or Redis
    if publisher is None:
        publisher, file_sink = _default_publisher(settings)
        if file_sink is not None:
            owned.append(file_sink.aclose)
    if authenticator is None:
        authenticator = authenticator_from_settings(settings, state=state)
        aclose = getattr(authenticator, "aclose", None)
        if aclose is not None:
            owned.append(aclose)
    metrics.watch_revocation_files(revocation_files(getattr(authenticator, "revocations", None)))
    if pool is None:
        pool = UpstreamPool(settings.upstreams, publisher=publisher, metrics=metrics,
                            idle_ttl=settings.session_idle_ttl, sweep_interval=settings.sweep_interval, clock=clock)
    if policy is None:
        built_policy = CallPolicy.from_settings(settings, publisher=publisher, metrics=metrics, state=state)
        owned.append(built_policy.close)
        policy = built_policy

    registry = SessionRegistry(cap=settings.session_cap, idle_ttl=settings.session_idle_ttl,
                               per_token=per_token_quota(authenticator.mode, settings.sessions_per_token),
                               publisher=publisher, clock=clock,
                               tombstones=None if state is None else state.tombstones)
    if state is not None:
        owned.append(state.aclose)  # last: after the authenticator and the policy that use it
    metrics.active_sessions.set_function(lambda: len(registry))
    metrics.tombstones.set_function(lambda: registry.tombstone_count)
    dispatcher = Dispatcher(pool, publisher=publisher, metrics=metrics, policy=policy)
    tombstones: RedisTombstones | None = None
    if settings.redis_url:
        tombstones = RedisTombstones(settings.redis_url, timeout=settings.redis_timeout,
                                     on_error=lambda op: metrics.store_errors.labels(op=op).inc())
        owned.append(tombstones.aclose)
    checks = RequestChecks(settings=settings, authenticator=authenticator, publisher=publisher, metrics=metrics)
    runner = CallRunner(dispatcher=dispatcher, registry=registry, metrics=metrics,
                        limiter=inflight_limiter(settings, authenticator.mode))
    gate = SessionGate(settings=settings, registry=registry, checks=checks, dispatcher=dispatcher, publisher=publisher,
                       metrics=metrics, stop_calls=runner.stop_session, tombstones=tombstones)
    if tombstones is not None:
        tombstones.on_remote_delete = gate.end_remote

    # Bodies are read and size-checked by the transport itself, so it can answer 413 as JSON-RPC.
    app = web.Application(middlewares=[request_logger(metrics, log_health=settings.access_log_health)],
                          client_max_size=settings.max_body_bytes + 1)
    app[SETTINGS] = settings
    app[REGISTRY] = registry
    app[POOL] = pool
    app[METRICS] = metrics
    app[INFLIGHT] = runner.limiter
    app[RESUMES_SESSIONS] = gate.resumes_sessions
    if settings.redis_url:
        from satgate_mcp.policy.redis_stores import RedisProbe

        probe = RedisProbe(settings.redis_url, settings.redis_timeout)
        app[STORE_PROBE] = probe
        owned.append(probe.aclose)
    elif state is not None:
        app[STORE_PROBE] = state.probe  # the state database: locked, unwritable or corrupt is "down"

    subscriptions = dispatcher.subscriptions
    hub = StreamHub(subscriptions.table, lambda: dispatcher.tools_version)
    listeners = Listeners()
    listen = getattr(pool, "listen", None)
    if listen is not None:
        listen(fan_out(hub.notice, listeners.notice))

    pool_session_ended = getattr(pool, "session_ended", None)  # an isolated upstream reaps the session's child

    def session_ended(session: Session, reason: CloseReason) -> None:
        hub.end(session.id)
        subscriptions.end_session(session.id)
        if pool_session_ended is not None:
            pool_session_ended(session.id)

    registry.on_close.append(session_ended)
    owned.append(subscriptions.aclose)

    modern = StatelessEndpoint(checks, runner, dispatcher, listeners=listeners,
                               flows=Flows(derive_keys(settings.state_keys)))
    owned.insert(0, modern.aclose)  # first: the calls of the flows it gives up settle in the state store
    replay = ReplayBook()
    SessionEndpoint(checks, gate, runner, dispatcher, StandaloneStream(checks, gate, hub, replay), modern=modern,
                    replay=replay, poll_seconds=settings.sse_poll_seconds).add_routes(app)

    async def end_listen_streams(app: web.Application) -> None:
        await listeners.end_all()

    app.on_shutdown.append(end_listen_streams)
    LegacySseTransport(checks, gate, runner, dispatcher, hub).add_routes(app)
    health.add_routes(app)
    if settings.oauth_resource_metadata_url:
        oauth.add_routes(app, settings.oauth_resource_metadata_url, settings.oauth_authorization_servers,
                         scopes=settings.oauth_tool_scopes.values())

    revocations = getattr(authenticator, "revocations", None)
    if revocations is not None:

        async def load_revocations(app: web.Application) -> None:
            start_revocations(revocations)  # the Redis mirror loads now, not on the first request

        app.on_startup.append(load_revocations)
    if tombstones is not None:
        shared = app[TOMBSTONES] = tombstones

        async def follow_remote_deletes(app: web.Application) -> None:
            shared.start()

        app.on_startup.append(follow_remote_deletes)
    app.cleanup_ctx.append(_upstreams)
    app.cleanup_ctx.append(_sweeper)
    app.cleanup_ctx.append(_closers(owned))
    return app


async def _upstreams(app: web.Application) -> AsyncIterator[None]:
    pool = app[POOL]
    start = getattr(pool, "start", None)
    if start is not None:
        await start()
    try:
        yield
    finally:
        close = getattr(pool, "close", None)
        if close is not None:
            await close()


async def _sweeper(app: web.Application) -> AsyncIterator[None]:
    """A thin loop: the registry decides what is idle, this only calls it now and then."""
    registry, interval = app[REGISTRY], app[SETTINGS].sweep_interval

    async def loop() -> None:
        while True:
            await asyncio.sleep(interval)
            registry.sweep()

    task = asyncio.create_task(loop(), name="session-sweeper")
    yield
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


def _closers(owned: list[Callable[[], Awaitable[None]]]) -> Callable[[web.Application], AsyncIterator[None]]:
    async def ctx(app: web.Application) -> AsyncIterator[None]:
        yield
        for close in owned:
            await close()

    return ctx
