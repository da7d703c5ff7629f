"""The process runner: listen, serve, and hand over to the next process without dropping a connection.

This is the entry layer, so it is the one package besides ``cli`` that imports ``app``.

A restart is invisible to a client only if its connection is never refused and its request in
flight is never cut (the official Python SDK client drops its whole session on either). So:

- the listening socket comes from systemd (``LISTEN_FDS``: systemd holds the port and queues
  connections while no process accepts) or is bound with ``SO_REUSEPORT`` (the next process, started
  with ``--handover``, binds the same port and the kernel shares new connections between both until
  the old one leaves; a start without it refuses a port someone listens on): ``sockets``;
- the listener is opened only once the app is set up and its upstreams are ready, so the kernel
  never hands a connection to a process that would fail its calls;
- on SIGTERM/SIGINT the listener closes first (connections already queued on a bound socket are
  adopted and served, never reset), then every request in flight finishes, every response is sent
  with ``Connection: close`` so the client reconnects to the next process, and an idle keep-alive
  connection is closed only after it stayed idle for a grace (``drain``). ``SATGATE_DRAIN_SECONDS``
  or a second signal cuts what is left. Then the app's cleanup stops the upstream children, and
  ``children`` stops any it left behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import signal
from collections.abc import Callable, MutableMapping

import structlog
from aiohttp import web

from satgate_mcp.app import create_app
from satgate_mcp.daemon.children import terminate_leftover_children
from satgate_mcp.daemon.drain import ConnectionTracker, Sleep, drain, exit_code, first_of
from satgate_mcp.daemon.fdstore import FdStore, fd_store_enabled
from satgate_mcp.daemon.handover_run import HandoverRun
from satgate_mcp.daemon.notify import Notifier
from satgate_mcp.daemon.sockets import InheritedFd, Listener, ListenError, acquire_listeners, stop_listening
from satgate_mcp.errors import ConfigError, StartFailed
from satgate_mcp.exits import ExitCode
from satgate_mcp.keys import POOL
from satgate_mcp.settings import Settings
from satgate_mcp.stores.folder import resolve_state_dir
from satgate_mcp.upstream.child_process import HANDED_OVER
from satgate_mcp.upstream.stdio_handover import set_store

log = structlog.get_logger("satgate_mcp.runner")

BACKLOG = 1024
#: Once cut, a handler gets this long to notice its cancellation before its connection is closed.
CUT_GRACE_SECONDS = 0.5
#: The longest the runner waits for upstreams before it listens anyway (``/readyz`` then says 503).
READY_WAIT_SECONDS = 30.0
READY_POLL_SECONDS = 0.05
#: App cleanup (upstream children) gets this long; the orphan guard then kills what is left.
CLEANUP_TIMEOUT_SECONDS = 10.0


#: The cyclic collector's thresholds once serving: CPython's 700 allocations for the young generation ran a
#: collection every few calls; a call's objects die by reference count, so waiting longer costs little memory.
GC_THRESHOLDS = (5000, 10, 10)


def settle_heap() -> None:
    """Once set up: collect start-up's garbage, then move everything alive into the permanent generation
    (modules, settings, the app: objects that live as long as the process), so the collector's full passes
    under load look only at what serving made. One such pass over the whole start-up heap cost ~80 ms here."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


class _GatewayRunner(web.AppRunner):
    """An AppRunner that sends ``on_shutdown`` once, when the drain begins (aiohttp's order), not again."""

    __slots__ = ("_shutdown_sent",)

    def __init__(self, app: web.Application, *, read_timeout: float) -> None:
        # The request middleware writes the canonical line; aiohttp's access log would repeat it. A connection
        # that sends no request for ``read_timeout`` (its first one too, headers unfinished) is closed, and the
        # rest of a body refused unread is waited for no longer than that either.
        super().__init__(app, shutdown_timeout=CUT_GRACE_SECONDS, access_log=None,
                         keepalive_timeout=read_timeout, lingering_time=read_timeout)
        self._shutdown_sent = False

    async def shutdown(self) -> None:
        if not self._shutdown_sent:
            self._shutdown_sent = True
            await self.app.shutdown()


def settled(readiness: dict[str, bool], failures: dict[str, dict[str, str]]) -> bool:
    """Every upstream ready or known to be down: nothing left that a short wait could bring up before listening."""
    return all(ready or name in failures for name, ready in readiness.items())


async def _wait_ready(app: web.Application, stop: asyncio.Event, timeout: float, *,
                      clock: Callable[[], float], sleep: Sleep = asyncio.sleep) -> bool:
    """Until every upstream is initialized (what ``/readyz`` reports), bounded; False if not in time.

    Readiness has no event of its own, so it is looked at every ``READY_POLL_SECONDS`` of ``clock``.
    """
    pool, deadline = app[POOL], clock() + timeout
    while not settled(pool.readiness(), pool.failures()):
        if stop.is_set() or clock() >= deadline:
            return False
        await first_of(stop.wait(), sleep(READY_POLL_SECONDS))
    return True


async def _grace_after(event: asyncio.Event, seconds: float) -> None:
    await event.wait()
    await asyncio.sleep(seconds)


async def _setup_unless_cut(runner: web.AppRunner, cut: asyncio.Event) -> bool:
    """Run app startup (upstreams, sweeper) to the end, so its cleanup can stop what it started.

    A first signal meanwhile waits for it (startup is bounded by the upstreams' own timeouts);
    only a second one abandons it, and then the orphan guard stops any child it left.
    """
    setup = asyncio.ensure_future(runner.setup())
    cutter = asyncio.ensure_future(cut.wait())
    try:
        await asyncio.wait({setup, cutter}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        cutter.cancel()
    if not setup.done():
        setup.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await setup
        return False
    setup.result()
    return True


async def _serve_until_stopped(runner: _GatewayRunner, tracker: ConnectionTracker, listeners: list[Listener],
                               settings: Settings, stop: asyncio.Event, cut: asyncio.Event,
                               notifier: Notifier, clock: Callable[[], float], handover: HandoverRun) -> ExitCode:
    await handover.before_start(settings.handover)
    if not await _setup_unless_cut(runner, cut):
        log.warning("startup_abandoned")
        return ExitCode.FAILED
    ready = await _wait_ready(runner.app, stop, READY_WAIT_SECONDS, clock=clock)  # settled: ready or known down
    if stop.is_set():
        log.info("stopped_during_startup")
        return ExitCode.OK
    settle_heap()  # before listening: its full collection would hold up the first connections
    sites = [web.SockSite(runner, lst.sock, backlog=BACKLOG) for lst in listeners]
    for site in sites:
        await site.start()
    pool = runner.app[POOL]
    if failures := pool.failures():
        log.warning("upstreams_down", upstreams=failures,
                    hint="serving the other upstreams; these restart with backoff and /readyz names them")
    if not ready:
        log.warning("upstreams_not_ready", waited_seconds=READY_WAIT_SECONDS, readiness=pool.readiness())
    ready = all(pool.readiness().values())
    for lst in listeners:
        log.info("listening", host=lst.host, port=lst.port, source=lst.source, name=lst.name,
                 reuse_port=settings.reuse_port if lst.source == "bind" else None, ready=ready)
    notifier.send("READY=1")
    await handover.after_listening()

    await stop.wait()
    deadline = clock() + settings.drain_seconds
    notifier.send("STOPPING=1")
    server = runner.server
    assert server is not None
    adopted = await stop_listening(sites, listeners, server)
    tracker.draining = True
    conns = server.connections
    log.info("drain_started", connections=len(conns), in_flight=sum(tracker.busy(c) for c in conns),
             adopted=adopted)
    # on_shutdown ends long-lived streams, before the wait, as aiohttp orders it; within the deadline,
    # and a forced stop gives the streams CUT_GRACE_SECONDS more to write their end, not the whole deadline.
    shutdown = asyncio.ensure_future(runner.shutdown())
    await first_of(asyncio.shield(shutdown), _grace_after(cut, CUT_GRACE_SECONDS),
                   asyncio.sleep(max(0.0, deadline - clock())))
    if not shutdown.done():
        shutdown.cancel()
        log.warning("on_shutdown_timeout")
    report = await drain(server, tracker, deadline=deadline, cut=cut, clock=clock, adopted=adopted)
    fields = {"reason": report.reason, "drained": report.drained, "cut": report.cut,
              "closed_idle": report.closed_idle, "adopted": report.adopted, "seconds": report.seconds}
    if report.reason == "clean":
        log.info("drain_finished", **fields)
    else:
        log.warning("drain_cut", **fields)
    await handover.after_drain(max(0.0, deadline - clock()))
    return exit_code(report.reason)


def _acquire(settings: Settings, environ: MutableMapping[str, str], pid: int,
             ) -> tuple[list[Listener], list[InheritedFd], Notifier]:
    """The listening sockets, the stdio children systemd kept for us (``fdstore``), and sd_notify."""
    stored: list[InheritedFd] = []
    try:
        # Before startup: a taken port fails fast. ExposureRefused (none auth on a public address) is a
        # configuration error: it propagates to the CLI, which prints its one line and exits 2.
        listeners = acquire_listeners(settings, environ, pid, stored)
    except ListenError as exc:
        log.error("listen_failed", error=str(exc))
        raise StartFailed(str(exc)) from None
    notifier = Notifier.from_environ(environ)
    set_store(FdStore(notifier) if fd_store_enabled(environ) and notifier.address else None)
    return listeners, stored, notifier


async def run(settings: Settings, *, environ: MutableMapping[str, str], pid: int) -> ExitCode:
    """Serve until a signal, drain, clean up; return the process exit code."""
    loop = asyncio.get_running_loop()
    clock = loop.time  # what asyncio's own timeouts count in
    listeners, stored, notifier = _acquire(settings, environ, pid)
    stop, cut = asyncio.Event(), asyncio.Event()
    handover = HandoverRun(None, resolve_state_dir(settings.state_dir, environ), settings.port, stop)

    def on_signal(signame: str) -> None:
        if not stop.is_set() or handover.requested:
            handover.requested = False  # the operator's own stop after the next process asked: not a second one
            log.info("stop_requested", signal=signame, drain_seconds=settings.drain_seconds)
            stop.set()
        elif not cut.is_set():
            log.warning("stop_forced", signal=signame)
            cut.set()

    signums = (signal.SIGTERM, signal.SIGINT)
    for signum in signums:
        loop.add_signal_handler(signum, on_signal, signum.name)
    runner: _GatewayRunner | None = None
    failure: ConfigError | None = None
    try:
        tracker = ConnectionTracker(clock, max_connections=settings.max_connections)
        app = create_app(settings)
        handover = HandoverRun(app[POOL], resolve_state_dir(settings.state_dir, environ), settings.port, stop, stored)
        # Outermost, so a request counts as busy until every other middleware is done with its response.
        app.middlewares.insert(0, tracker.middleware)
        app.on_response_prepare.append(tracker.on_response_prepare)
        runner = _GatewayRunner(app, read_timeout=settings.read_timeout)
        code = await _serve_until_stopped(runner, tracker, listeners, settings, stop, cut, notifier, clock, handover)
    except ConfigError as exc:
        failure = exc  # raised once cleanup is done: the CLI logs it and prints its one line
        code = ExitCode.CONFIG
    except Exception:
        log.exception("runner_failed")
        code = ExitCode.FAILED
    finally:
        await handover.close()
        if runner is not None:
            # Remaining connections, then cleanup_ctx: the upstream children stop here.
            try:
                await asyncio.wait_for(runner.cleanup(), CLEANUP_TIMEOUT_SECONDS)
            except TimeoutError:
                log.error("cleanup_timeout", seconds=CLEANUP_TIMEOUT_SECONDS)
        for lst in listeners:
            lst.sock.close()
        for signum in signums:
            loop.remove_signal_handler(signum)
    log.info("stopped", exit_code=int(code))
    if failure is not None:
        raise failure
    return code


def event_loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's event loop when it is installed (a dependency except on Windows), else asyncio's own (None)."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def serve(settings: Settings) -> ExitCode:
    """Run the daemon until SIGTERM/SIGINT; not OK when something was cut or it could not start."""
    try:
        with asyncio.Runner(loop_factory=event_loop_factory()) as loop:
            return loop.run(run(settings, environ=os.environ, pid=os.getpid()))
    finally:
        terminate_leftover_children(os.getpid(), keep=HANDED_OVER)
