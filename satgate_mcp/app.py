"""The one place that assembles the gateway: ``create_app`` wires settings to parts.

Tests and embedding applications pass their own parts (authenticator, pool, policy, publisher, clock);
everything else is built from settings. Every long-lived resource has one cleanup context that starts
and stops it, appended in dependency order (the stores first, so they close last); the app closes only
what it built, parts handed in belong to the caller.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from aiohttp import web
from aiohttp.typedefs import Middleware

from satgate_mcp import tracing
from satgate_mcp.auth.base import Authenticator, per_token_quota
from satgate_mcp.auth.factory import authenticator_from_settings
from satgate_mcp.auth.revocation import RevocationStore
from satgate_mcp.console.approvals_view import ConsoleApprovals
from satgate_mcp.console.audit_view import ConsoleAudit
from satgate_mcp.console.features import Features
from satgate_mcp.console.spend_view import ConsoleSpendLimits
from satgate_mcp.console.wiring import Gateway, add_console
from satgate_mcp.contracts import Policy, Pool
from satgate_mcp.dispatch import Dispatcher
from satgate_mcp.events import FanoutPublisher, JsonlFilePublisher, LogPublisher, Publisher
from satgate_mcp.guards import Guard, Guards
from satgate_mcp.keys import (
    AUDIT,
    CONSOLE,
    HOLDS,
    INFLIGHT,
    METRICS,
    POLICY_FILE,
    POOL,
    REGISTRY,
    RESUMES_SESSIONS,
    SETTINGS,
    STORE_PROBE,
    STORES,
    TOMBSTONES,
    USER_GRANTS,
)
from satgate_mcp.metrics import Metrics
from satgate_mcp.policy.approval_webhook import ApprovalWebhook
from satgate_mcp.policy.audit_trail import AuditEvents, Auditor
from satgate_mcp.policy.control_guard import ControlsGuard, enforces
from satgate_mcp.policy.decide import Decider
from satgate_mcp.policy.engine import CallPolicy
from satgate_mcp.policy.holds import Holds
from satgate_mcp.policy.pin_guard import PinGuard
from satgate_mcp.policy.policy_file import PolicyFile, load_at_start
from satgate_mcp.policy.rule_guard import PolicyGuard
from satgate_mcp.policy.rules import Effect
from satgate_mcp.sessions import CloseReason, Session, SessionRegistry
from satgate_mcp.settings import HttpUpstreamSpec, Settings
from satgate_mcp.stores import Stores, open_stores
from satgate_mcp.stores.audit_file import AuditFile
from satgate_mcp.task_ids import derive_task_keys
from satgate_mcp.transport import health, jwks, oauth, oauth_callback
from satgate_mcp.transport.call_runner import CallRunner, inflight_limiter
from satgate_mcp.transport.checks import RequestChecks
from satgate_mcp.transport.listen import Listeners, fan_out, fan_out_tasks
from satgate_mcp.transport.middleware import request_logger
from satgate_mcp.transport.mrtr import Flows, derive_keys
from satgate_mcp.transport.reload_notices import ReloadNotices
from satgate_mcp.transport.replay import ReplayBook
from satgate_mcp.transport.session_endpoint import SessionEndpoint
from satgate_mcp.transport.session_gate import SessionGate
from satgate_mcp.transport.session_stream import StandaloneStream, StreamHub
from satgate_mcp.transport.sse import LegacySseTransport
from satgate_mcp.transport.stateless_endpoint import StatelessEndpoint
from satgate_mcp.transport.trace_middleware import tracing_middleware
from satgate_mcp.upstream.identity import UpstreamIdentity
from satgate_mcp.upstream.pool import UpstreamPool

CleanupCtx = Callable[[web.Application], AsyncIterator[None]]


def _default_publisher(settings: Settings) -> tuple[Publisher, JsonlFilePublisher | None]:
    if settings.events_file is None:
        return LogPublisher(), None
    sink = JsonlFilePublisher(settings.events_file)
    return FanoutPublisher([LogPublisher(), sink]), sink


def _guards(app: web.Application, publisher: Publisher, metrics: Metrics, pins: PinGuard | None) -> list[Guard]:
    """The configured guards (guards.py), outermost first: pinned definitions (``enforce``; ``warn`` is no guard,
    calls pay nothing for it), then policy rules, then the token's tool controls (header mode: only macaroons carry
    them)."""
    guards: list[Guard] = [pins] if pins is not None and pins.enforcing else []
    settings, stores = app[SETTINGS], app[STORES]
    holds = app[HOLDS] = Holds(stores.approvals, publisher=publisher, metrics=metrics, ttl=settings.approval_ttl,
                               per_family=settings.approvals_per_token, timeout=stores.timeout,
                               notify=_approval_webhook(app))
    if settings.policy_file is not None:  # a bad file stops the start here, in one line
        default = Effect(settings.policy_default)
        rules = load_at_start(settings.policy_file, default)
        policy = PolicyGuard(Decider(rules), publisher=publisher, metrics=metrics,
                             owner_of_tool=app[POOL].owner_of_tool, holds=holds)
        app[POLICY_FILE] = PolicyFile(settings.policy_file, default, policy, publisher=publisher, metrics=metrics)
        app.cleanup_ctx.append(_policy_watch)
        guards.append(policy)
    if settings.auth_mode == "header":
        enforce = enforces(settings.enforcement, "enforcement" in settings.model_fields_set)
        guards.append(ControlsGuard(enforce=enforce, publisher=publisher, metrics=metrics, spend=stores.spend,
                                    holds=holds, timeout=stores.timeout))
    return guards


def _approval_webhook(app: web.Application) -> Callable[[dict[str, Any]], None] | None:
    """``SATGATE_APPROVAL_WEBHOOK``'s sender (started and stopped with the app), or None."""
    settings, metrics = app[SETTINGS], app[METRICS]
    if not settings.approval_webhook:
        return None
    secret = settings.approval_webhook_secret
    hook = ApprovalWebhook(settings.approval_webhook, secret.get_secret_value() if secret is not None else None,
                           outcome=lambda outcome: metrics.approval_webhook.labels(outcome=outcome).inc())
    app.cleanup_ctx.append(_started(hook.start, hook.aclose))
    return hook.send


async def _policy_watch(app: web.Application) -> AsyncIterator[None]:
    """The policy file's poller: every process sees a change within a second."""
    task = asyncio.create_task(app[POLICY_FILE].watch(), name="policy-file")
    yield
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


def _pinned_upstreams(app: web.Application, stores: Stores, publisher: Publisher, metrics: Metrics
                      ) -> PinGuard | None:
    """The upstreams' cleanup context, after that of their pinned tool definitions (``SATGATE_TOOL_PINNING``, on the
    pool that lists the upstreams), so the pins are read before the upstreams are listed; off: no pinning at all.

    ``warn`` pins as the pool learns definitions and judges no call (it is no guard: calls pay nothing for it).
    """
    settings, pool = app[SETTINGS], app[POOL]
    if settings.tool_pinning == "off" or not isinstance(pool, UpstreamPool):
        app.cleanup_ctx.append(_upstreams)
        return None
    pins = PinGuard(stores.pins, mode=settings.tool_pinning, publisher=publisher, metrics=metrics,
                    prefixes={name: spec.tool_prefix for name, spec in settings.upstreams.items()},
                    timeout=settings.redis_timeout)
    pins.attach(pool.owner_of_tool, pool.announce_tools)
    pool.learn_tools(pins.learn)
    app.cleanup_ctx.append(_started(pins.start, pins.aclose))
    app.cleanup_ctx.append(_upstreams)
    return pins


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
    traces = tracing.plan(settings.tracing, os.environ)  # checked now: a wrong OTEL_* variable stops start-up
    # Bodies are read and size-checked by the transport itself, so it can answer 413 as JSON-RPC.
    app = web.Application(middlewares=_middlewares(settings, metrics, traced=traces is not None),
                          client_max_size=settings.max_body_bytes + 1)
    app[SETTINGS], app[METRICS] = settings, metrics
    if traces is not None:
        app.cleanup_ctx.append(_tracing(traces, metrics))  # first started, last stopped: every span is exported
    stores = app[STORES] = open_stores(settings, on_error=lambda op: metrics.store_errors.labels(op=op).inc())
    app.cleanup_ctx.append(_stores)
    if stores.probe is not None:
        app[STORE_PROBE] = stores.probe  # Redis, or the state database: locked, unwritable or corrupt is "down"
    if publisher is None:
        publisher, sink = _default_publisher(settings)
        if sink is not None:
            app.cleanup_ctx.append(_closing(sink.aclose))
    auditor, publisher = _audit(app, publisher)
    if authenticator is None:
        authenticator = authenticator_from_settings(settings, stores=stores)
        app.cleanup_ctx.append(_closing(authenticator.aclose))
    metrics.watch_revocation_files(stores.revocation_files)
    if policy is None:
        built = CallPolicy.from_settings(settings, publisher=publisher, metrics=metrics, stores=stores)
        app.cleanup_ctx.append(_closing(built.close))
        policy = built
    app[POOL] = pool or _pool(app, publisher, clock, getattr(authenticator, "revocations", stores.revocations))
    pins = _pinned_upstreams(app, stores, publisher, metrics)
    registry = app[REGISTRY] = SessionRegistry(
        cap=settings.session_cap, idle_ttl=settings.session_idle_ttl,
        per_token=per_token_quota(authenticator.mode, settings.sessions_per_token), publisher=publisher,
        clock=clock, tombstones=stores.tombstones)
    metrics.active_sessions.set_function(lambda: len(registry))
    metrics.tombstones.set_function(lambda: registry.tombstone_count)
    dispatcher = Dispatcher(app[POOL], publisher=publisher, metrics=metrics, policy=policy,
                            guards=Guards(_guards(app, publisher, metrics, pins)), audit=auditor,
                            task_keys=derive_task_keys(settings.state_keys), task_owners=stores.task_owners)
    app.cleanup_ctx.append(_closing(dispatcher.subscriptions.aclose))
    app.cleanup_ctx.append(_sweeper)
    checks = RequestChecks(settings=settings, authenticator=authenticator, publisher=publisher, metrics=metrics)
    runner = CallRunner(dispatcher=dispatcher, registry=registry, metrics=metrics,
                        limiter=inflight_limiter(settings, authenticator.mode))
    gate = SessionGate(settings=settings, registry=registry, checks=checks, dispatcher=dispatcher, publisher=publisher,
                       metrics=metrics, stop_calls=runner.stop_session, tombstones=stores.shared_tombstones)
    if stores.shared_tombstones is not None:
        stores.shared_tombstones.on_remote_delete = gate.end_remote
        app[TOMBSTONES] = stores.shared_tombstones
    app[INFLIGHT], app[RESUMES_SESSIONS] = runner.limiter, gate.resumes_sessions
    _console(app, authenticator, publisher, gate, pins, clock, auditor)
    _add_transports(app, checks, gate, runner, dispatcher)
    return app


def _upstream_identity(settings: Settings, stores: Stores, revocations: RevocationStore) -> UpstreamIdentity:
    """What upstreams with ``"auth"`` need; the revocations the authenticator checks also drop a revoked caller's
    upstream tokens."""
    return UpstreamIdentity(identity_key=settings.identity_signing_key, is_revoked=revocations.is_revoked,
                            grants=stores.grants, credential_keys=tuple(settings.credential_key_list),
                            public_base=settings.public_base(settings.auth_mode, settings.oauth_audience),
                            store_timeout=stores.timeout)


def _pool(app: web.Application, publisher: Publisher, clock: Callable[[], float],
          revocations: RevocationStore) -> UpstreamPool:
    """The upstreams from settings; each "oauth_user" upstream's grants are kept for the callback route."""
    settings = app[SETTINGS]
    identity = _upstream_identity(settings, app[STORES], revocations)
    app[USER_GRANTS] = identity.user_grants
    return UpstreamPool(settings.upstreams, publisher=publisher, metrics=app[METRICS],
                        idle_ttl=settings.session_idle_ttl, sweep_interval=settings.sweep_interval, clock=clock,
                        identity=identity)


def _audit(app: web.Application, publisher: Publisher) -> tuple[Auditor | None, Publisher]:
    """The audit trail (``SATGATE_AUDIT_FILE``): its writer, opened early so it closes last (after the server has
    drained, every answered call's line is written), and a publisher that also records refusals made before
    dispatch. Off: nothing, and calls pay nothing for it."""
    settings, metrics = app[SETTINGS], app[METRICS]
    if not settings.audit_file:
        return None, publisher
    trail = AuditFile(settings.audit_file, on_drop=metrics.audit_dropped.inc)
    app.cleanup_ctx.append(_started(trail.start, trail.close))
    costs, default = settings.tool_costs, settings.default_cost
    auditor = Auditor(trail, args=settings.audit_args, fail_closed=settings.audit_fail_mode == "closed",
                      cost_of=lambda tool: costs.get(tool, default))
    app[AUDIT] = trail
    return auditor, FanoutPublisher([publisher, AuditEvents(auditor)])


class _Circuits:
    """The pool's circuit breakers as the console reads them."""

    def __init__(self, pool: UpstreamPool) -> None:
        self._pool = pool

    def states(self) -> dict[str, dict[str, object]]:
        return self._pool.circuits()


def _console(app: web.Application, authenticator: Authenticator, publisher: Publisher, gate: SessionGate,
             pins: PinGuard | None, clock: Callable[[], float], auditor: Auditor | None) -> None:
    """The operator console (console/), on the parts above; off: not a route. Features built elsewhere (held
    calls, the audit trail, circuit breakers) are connected through ``Features`` (console/features.py)."""
    stores = app[STORES]
    gateway = Gateway(app[SETTINGS], authenticator, app[REGISTRY], app[POOL], app[METRICS], stores, publisher,
                      gate.delete_session, clock, app.get(POLICY_FILE), stores.pins if pins is not None else None)
    pool = app[POOL]
    http = [u for u in app[SETTINGS].upstreams.values() if isinstance(u, HttpUpstreamSpec) and u.breaker.failures]
    breakers = _Circuits(pool) if isinstance(pool, UpstreamPool) and http else None
    audit = ConsoleAudit(auditor, app[SETTINGS].audit_file or "-") if auditor is not None else None
    approvals = ConsoleApprovals(stores.approvals, app[HOLDS], publisher, time.time)
    spend = (ConsoleSpendLimits(app[REGISTRY], stores.spend, time.time, stores.timeout)
             if app[SETTINGS].auth_mode == "header" else None)
    parts = add_console(app, gateway, Features(approvals=approvals, spend_limits=spend, breakers=breakers,
                                               audit=audit))
    if parts is not None:
        app[CONSOLE] = parts


def _middlewares(settings: Settings, metrics: Metrics, *, traced: bool) -> list[Middleware]:
    """The request line; with tracing on, the request's span around it (off: no middleware, nothing to pay)."""
    logger = request_logger(metrics, log_health=settings.access_log_health)
    return [tracing_middleware(), logger] if traced else [logger]


def _add_transports(app: web.Application, checks: RequestChecks, gate: SessionGate, runner: CallRunner,
                    dispatcher: Dispatcher) -> None:
    """Every endpoint: /mcp (both eras), the legacy /sse, health and OAuth metadata."""
    settings, pool, registry = app[SETTINGS], app[POOL], app[REGISTRY]
    subscriptions = dispatcher.subscriptions
    hub = StreamHub(subscriptions.table, lambda: dispatcher.tools_version)
    listeners = Listeners()
    notice = fan_out(hub.notice, listeners.notice)
    pool.listen(notice)
    pool.listen_tasks(fan_out_tasks(hub.task_notice(dispatcher.tasks), listeners.task_notice))
    if POLICY_FILE in app:  # a reload that changes what sessions may see tells them, and only them
        app[POLICY_FILE].on_lists_changed = ReloadNotices(pool, registry, hub, listeners, dispatcher)

    def session_ended(session: Session, reason: CloseReason) -> None:
        hub.end(session.id)
        subscriptions.end_session(session.id)
        pool.session_ended(session.id)  # an isolated upstream reaps the session's child

    registry.on_close.append(session_ended)
    modern = StatelessEndpoint(checks, runner, dispatcher, listeners=listeners,
                               flows=Flows(derive_keys(settings.state_keys)))
    # Last appended, first closed: the calls of the flows it gives up settle while the stores are open.
    app.cleanup_ctx.append(_closing(modern.aclose))
    replay = ReplayBook()
    SessionEndpoint(checks, gate, runner, dispatcher, StandaloneStream(checks, gate, hub, replay), modern=modern,
                    replay=replay, poll_seconds=settings.sse_poll_seconds).add_routes(app)

    async def end_listen_streams(app: web.Application) -> None:
        await listeners.end_all()

    app.on_shutdown.append(end_listen_streams)
    LegacySseTransport(checks, gate, runner, dispatcher, hub).add_routes(app)
    health.add_routes(app)
    if (identity_key := settings.identity_signing_key) is not None:
        jwks.add_routes(app, identity_key)  # upstreams verify the identity the gateway forwards with it
    if user_grants := app.get(USER_GRANTS):
        oauth_callback.add_routes(app, user_grants)  # users come back here from authorizing an upstream
    if settings.oauth_resource_metadata_url:
        oauth.add_routes(app, settings.oauth_resource_metadata_url, settings.oauth_authorization_servers,
                         scopes=settings.oauth_tool_scopes.values())


async def _stores(app: web.Application) -> AsyncIterator[None]:
    """Opened first and closed last: every other part may use a store until it is closed itself."""
    stores = app[STORES]
    stores.start()  # the Redis mirrors load now, not on the first request
    try:
        yield
    finally:
        await stores.aclose()


async def _upstreams(app: web.Application) -> AsyncIterator[None]:
    pool = app[POOL]
    await pool.start()
    try:
        yield
    finally:
        await pool.close()


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


def _tracing(traces: tracing.Plan, metrics: Metrics) -> CleanupCtx:
    async def ctx(app: web.Application) -> AsyncIterator[None]:
        provider = tracing.start(traces, metrics.trace_export_failures)
        yield
        await asyncio.to_thread(tracing.stop, provider)  # the last export may wait on the collector

    return ctx


def _started(start: Callable[[], Awaitable[None]], close: Callable[[], Awaitable[None]]) -> CleanupCtx:
    async def ctx(app: web.Application) -> AsyncIterator[None]:
        await start()
        yield
        await close()

    return ctx


def _closing(close: Callable[[], Awaitable[None]]) -> CleanupCtx:
    """The cleanup context of a part made ready by its constructor: nothing to start, one thing to close."""

    async def ctx(app: web.Application) -> AsyncIterator[None]:
        yield
        await close()

    return ctx
