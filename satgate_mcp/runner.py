"""The process runner: listen, serve, and hand over to the next process without dropping a connection.

This is the entry layer, so it is the one module besides ``cli`` that imports ``app``.

A restart is invisible to a client only if its connection is never refused and its request in
flight is never cut (the official Python SDK client drops its whole session on either). So:

- the listening socket comes from systemd (``LISTEN_FDS``: systemd holds the port and queues
  connections while no process accepts) or is bound with ``SO_REUSEPORT`` (the next process, started
  with ``--handover``, binds the same port and the kernel shares new connections between both until
  the old one leaves; a start without it refuses a port someone listens on);
- the listener is opened only once the app is set up and its upstreams are ready, so the kernel
  never hands a connection to a process that would fail its calls;
- on SIGTERM/SIGINT the listener closes first (connections already queued on a bound socket are
  adopted and served, never reset), then every request in flight finishes, every response is sent
  with ``Connection: close`` so the client reconnects to the next process, and an idle keep-alive
  connection is closed only after it stayed idle for ``IDLE_GRACE_SECONDS`` (closing one the
  client is about to reuse would lose that request). ``SATGATE_DRAIN_SECONDS`` or a second
  signal cuts what is left. Then the app's cleanup stops the upstream children.

aiohttp's own ``runner.cleanup()`` closes every idle connection at once and drops bytes that
arrive on it afterwards; that is the race the drain loop avoids. It reads two private fields of
``aiohttp.web_protocol.RequestHandler`` (``_waiter``, ``_messages``), the same test aiohttp uses
for "idle" in its keep-alive timer.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import ipaddress
import os
import select
import signal
import socket
import time
from collections.abc import Callable, Iterable, Mapping, MutableMapping
from dataclasses import dataclass, field
from typing import Literal

import structlog
from aiohttp import hdrs, web
from aiohttp.web_protocol import RequestHandler

from satgate_mcp.app import create_app
from satgate_mcp.errors import ConfigError
from satgate_mcp.exits import ExitCode
from satgate_mcp.keys import POOL
from satgate_mcp.settings import Settings

log = structlog.get_logger("satgate_mcp.runner")

#: First inherited fd in the systemd socket-activation protocol (sd_listen_fds(3)).
SD_LISTEN_FDS_START = 3
LISTEN_ENV = ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES")
BACKLOG = 1024
#: An idle keep-alive connection is closed during a drain only after this long without a request.
IDLE_GRACE_SECONDS = 1.0
#: How often the drain loop looks at connections (aiohttp offers no event for "request finished").
DRAIN_POLL_SECONDS = 0.05
#: Once cut, a handler gets this long to notice its cancellation before its connection is closed.
CUT_GRACE_SECONDS = 0.5
#: The longest the runner waits for upstreams before it listens anyway (``/readyz`` then says 503).
READY_WAIT_SECONDS = 30.0
READY_POLL_SECONDS = 0.05
CHILD_EXIT_WAIT_SECONDS = 3.0
#: App cleanup (upstream children) gets this long; the orphan guard then kills what is left.
CLEANUP_TIMEOUT_SECONDS = 10.0

SocketSource = Literal["systemd", "bind"]
DrainReason = Literal["clean", "deadline", "signal"]


class ListenError(Exception):
    """The runner cannot get a listening socket; the message says what to fix."""


# ---------------------------------------------------------------- socket acquisition (decisions)


@dataclass(frozen=True)
class InheritedFd:
    fd: int
    name: str


def systemd_fds(environ: Mapping[str, str], pid: int) -> list[InheritedFd]:
    """The listening fds systemd passed to *this* process, per sd_listen_fds(3); [] when not activated.

    ``LISTEN_PID`` must name us: variables inherited from a socket-activated parent are not ours.
    """
    listen_pid, listen_fds = environ.get("LISTEN_PID", "").strip(), environ.get("LISTEN_FDS", "").strip()
    if not (listen_pid.isdigit() and listen_fds.isdigit()) or int(listen_pid) != pid:
        return []
    count = int(listen_fds)
    names = environ["LISTEN_FDNAMES"].split(":") if "LISTEN_FDNAMES" in environ else []
    fds = []
    for i in range(count):
        fd = SD_LISTEN_FDS_START + i
        name = names[i] if i < len(names) and names[i] else f"fd{fd}"
        fds.append(InheritedFd(fd, name))
    return fds


@dataclass(frozen=True)
class BindAddress:
    family: socket.AddressFamily | None  # None: a name to resolve
    host: str
    dual_stack: bool = False


def is_loopback_host(host: str) -> bool:
    """``127.0.0.0/8``, ``::1`` (also IPv4-mapped) or ``localhost``: reachable from this machine only.

    Any other name counts as public: what it resolves to is not this check's to trust.
    """
    text = host.strip().removeprefix("[").removesuffix("]").split("%", 1)[0].rstrip(".").lower()
    if text == "localhost":
        return True
    try:
        ip = ipaddress.ip_address(text)
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped.is_loopback
    return ip.is_loopback


def unauthenticated_exposure(auth_mode: str, allow_unauthenticated: bool, hosts: Iterable[str]) -> str | None:
    """Why ``none`` auth must not serve these addresses, or None when it may (or auth is on)."""
    if auth_mode != "none" or allow_unauthenticated:
        return None
    public = [host for host in hosts if not is_loopback_host(host)]
    if not public:
        return None
    return (f"refusing to serve SATGATE_AUTH_MODE=none on {public[0] or '0.0.0.0'} (not loopback): anyone who "
            "reaches the port may call every tool. Set SATGATE_AUTH_MODE=header with SATGATE_ROOT_KEY (32+ random "
            "characters) and give each agent a token from `satgate-mcp token mint --id ID`, or set "
            "SATGATE_ALLOW_UNAUTHENTICATED=true to accept that")


BindAction = Literal["bind", "take_over", "refuse"]


def bind_action(*, listener_found: bool, handover: bool) -> BindAction:
    """A port someone already listens on is shared (SO_REUSEPORT) only by a start that says it takes over."""
    if not listener_found:
        return "bind"
    return "take_over" if handover else "refuse"


def bind_address(host: str) -> BindAddress:
    """Which address family ``SATGATE_HOST`` asks for; ``::`` also takes IPv4 (dual stack)."""
    text = host.strip()
    if text.startswith("[") and text.endswith("]"):
        text = text[1:-1]
    if text in ("", "*"):
        return BindAddress(socket.AF_INET, "0.0.0.0")
    try:
        ip = ipaddress.ip_address(text.split("%", 1)[0])
    except ValueError:
        return BindAddress(None, text)
    if ip.version == 6:
        return BindAddress(socket.AF_INET6, text, dual_stack=ip == ipaddress.IPv6Address("::"))
    return BindAddress(socket.AF_INET, text)


# ---------------------------------------------------------------- socket acquisition (I/O edge)


@dataclass(frozen=True)
class Listener:
    sock: socket.socket
    source: SocketSource
    name: str
    host: str
    port: int | None


def _describe(sock: socket.socket) -> tuple[str, int | None]:
    addr = sock.getsockname()
    if isinstance(addr, tuple):
        return str(addr[0]), int(addr[1])
    return str(addr), None


def adopt_fd(inherited: InheritedFd) -> Listener:
    """Wrap an inherited fd; it must be a listening stream socket (``Accept=no`` in the .socket unit)."""
    try:
        sock = socket.socket(fileno=inherited.fd)
    except OSError as exc:
        raise ListenError(f"LISTEN_FDS: fd {inherited.fd} is not a socket ({exc.strerror})") from None
    if sock.type != socket.SOCK_STREAM or not sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
        sock.detach()
        raise ListenError(f"LISTEN_FDS: fd {inherited.fd} ({inherited.name}) is not a listening stream socket; "
                          "use ListenStream= with Accept=no")
    # Upstream children must not hold the listener: the port would outlive us in them.
    os.set_inheritable(inherited.fd, False)
    host, port = _describe(sock)
    return Listener(sock, "systemd", inherited.name, host, port)


def _new_socket(family: socket.AddressFamily, *, reuse_port: bool, dual_stack: bool) -> socket.socket:
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0 if dual_stack else 1)
    except OSError:
        sock.close()
        raise
    return sock


def someone_listens(family: socket.AddressFamily, sockaddr: tuple[str, int], *, dual_stack: bool) -> bool:
    """Whether a socket already *listens* on this address and port (any process, with or without SO_REUSEPORT).

    A probe binds without SO_REUSEPORT but with SO_REUSEADDR: Linux then refuses the bind (EADDRINUSE)
    only because of a socket in LISTEN state on an overlapping address, never because of connections
    left in TIME_WAIT (or still open) after the previous process died.
    """
    if sockaddr[1] == 0:
        return False  # an ephemeral port is never taken
    probe = _new_socket(family, reuse_port=False, dual_stack=dual_stack)
    try:
        probe.bind(sockaddr)
    except OSError as exc:
        return exc.errno == errno.EADDRINUSE  # anything else: the real bind reports it
    finally:
        probe.close()
    return False


def bind_socket(host: str, port: int, *, reuse_port: bool, handover: bool = False) -> Listener:
    """Bind without listening: the kernel routes nothing to us until ``listen()`` after the app is ready.

    With SO_REUSEPORT a second process could silently share a port a running gateway listens on
    (requests would alternate between two configurations), so that is refused unless ``handover``.
    """
    where = bind_address(host)
    family, sockaddr = where.family, (where.host, port)
    if family is None:
        try:
            infos = socket.getaddrinfo(where.host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        except socket.gaierror as exc:
            raise ListenError(f"SATGATE_HOST={host!r} does not resolve ({exc.strerror})") from None
        family, sockaddr = infos[0][0], (str(infos[0][4][0]), int(infos[0][4][1]))
    if reuse_port:
        found = someone_listens(family, sockaddr, dual_stack=where.dual_stack)
        action = bind_action(listener_found=found, handover=handover)
        if action == "refuse":
            raise ListenError(
                f"refusing to bind {host}:{port}: another process already listens there (a running satgate-mcp?) "
                "and sharing it would split requests between two gateways; to take it over, start with "
                "SATGATE_HANDOVER=true or `satgate-mcp serve --handover`, then stop the old process")
        if handover:
            log.info("handover", host=host, port=port, listener_found=found)
    try:
        sock = _new_socket(family, reuse_port=reuse_port, dual_stack=where.dual_stack)
        try:
            sock.bind(sockaddr)
        except OSError:
            sock.close()
            raise
    except OSError as exc:
        hint = " (another process holds it without SO_REUSEPORT?)" if exc.errno == errno.EADDRINUSE else ""
        raise ListenError(f"cannot bind {host}:{port}: {exc.strerror}{hint}") from None
    sock.setblocking(False)
    bound_host, bound_port = _describe(sock)
    return Listener(sock, "bind", f"{host}:{port}", bound_host, bound_port)


def clear_listen_env(environ: MutableMapping[str, str]) -> None:
    for key in LISTEN_ENV:
        environ.pop(key, None)


class ExposureRefused(ConfigError):
    """``none`` auth on a public address without the opt-in: the CLI prints the one line and exits 2."""


def acquire_listeners(settings: Settings, environ: MutableMapping[str, str], pid: int) -> list[Listener]:
    """Inherited sockets when systemd passed some, else one socket bound to ``SATGATE_HOST:SATGATE_PORT``.

    Inherited sockets are never refused as taken (systemd owns them, and the previous process may
    still accept on them), but their real addresses, not ``SATGATE_HOST``, decide the auth rule.
    """
    inherited = systemd_fds(environ, pid)
    clear_listen_env(environ)
    if inherited:
        listeners = [adopt_fd(fd) for fd in inherited]
        hosts = [lst.host for lst in listeners if lst.port is not None]  # AF_UNIX: local by nature
    else:
        listeners, hosts = [], [settings.host]
    if problem := unauthenticated_exposure(settings.auth_mode, settings.allow_unauthenticated, hosts):
        for lst in listeners:
            lst.sock.close()
        raise ExposureRefused(problem)
    if inherited:
        return listeners
    return [bind_socket(settings.host, settings.port, reuse_port=settings.reuse_port, handover=settings.handover)]


# ---------------------------------------------------------------- systemd notify


@dataclass
class Notifier:
    """sd_notify(3) for ``Type=notify``: READY once listening, STOPPING when the drain starts."""

    address: str | None

    @classmethod
    def from_environ(cls, environ: MutableMapping[str, str]) -> Notifier:
        # Popped so upstream children cannot speak for us.
        address = environ.pop("NOTIFY_SOCKET", None)
        if address and address[0] not in "/@":
            address = None  # vsock and other forms: not for a gateway
        return cls(address)

    def send(self, message: str) -> None:
        if not self.address:
            return
        target = "\0" + self.address[1:] if self.address.startswith("@") else self.address
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
                sock.connect(target)
                sock.sendall(message.encode())
        except OSError as exc:
            log.warning("sd_notify_failed", message=message, error=exc.strerror)


# ---------------------------------------------------------------- drain


def connection_idle(conn: RequestHandler) -> bool:
    """aiohttp's own idle test: waiting for the next request with nothing buffered."""
    waiter = conn._waiter
    return waiter is not None and not waiter.done() and not conn._messages


def idle_expired(now: float, idle_since: float, grace: float) -> bool:
    """Whether a connection idle since ``idle_since`` may be closed without racing its next request."""
    return now - idle_since >= grace


def drain_reason(*, connections: int, now: float, deadline: float, cut_requested: bool) -> DrainReason | None:
    """Why the drain ends now, or None while it goes on. A finished drain beats a late cut."""
    if connections == 0:
        return "clean"
    if cut_requested:
        return "signal"
    if now >= deadline:
        return "deadline"
    return None


def exit_code(reason: DrainReason) -> ExitCode:
    return ExitCode.OK if reason == "clean" else ExitCode.FAILED


@dataclass
class DrainReport:
    reason: DrainReason
    in_flight_at_start: int
    idle_at_start: int
    adopted: int = 0
    started_during: int = 0
    closed_idle: int = 0
    cut: int = 0
    seconds: float = 0.0

    @property
    def drained(self) -> int:
        """Requests that finished during the drain."""
        return self.in_flight_at_start + self.started_during - self.cut


@dataclass
class DrainState:
    """Shared by the response hook and the drain loop."""

    draining: bool = False
    busy_seen: dict[RequestHandler, float] = field(default_factory=dict)

    async def on_response_prepare(self, request: web.Request, response: web.StreamResponse) -> None:
        # The client then opens its next connection, which only the next process accepts. aiohttp
        # computes its Connection header before this hook runs, so the header is set here too.
        if self.draining:
            response.force_close()
            response.headers[hdrs.CONNECTION] = "close"


async def _adopt_queued(listeners: Iterable[Listener], server: web.Server) -> int:
    """Serve connections the kernel queued on our bound socket before we closed it, instead of resetting them.

    Only for sockets we bound: an inherited socket stays open in systemd (or the next process),
    so its queue is simply accepted by whoever comes next.
    """
    loop = asyncio.get_running_loop()
    accepted: list[socket.socket] = []
    for listener in listeners:
        with contextlib.suppress(OSError):
            while True:
                conn, _ = listener.sock.accept()
                accepted.append(conn)
        listener.sock.close()
    for conn in accepted:
        try:
            await loop.connect_accepted_socket(server, conn)
        except OSError:
            conn.close()
    return len(accepted)


async def stop_listening(sites: list[web.SockSite], listeners: list[Listener], server: web.Server) -> int:
    """Close every listener first; return how many already-queued connections were adopted."""
    # asyncio closes the socket it serves on; a duplicate keeps a bound socket's accept queue alive.
    bound = [Listener(lst.sock.dup(), lst.source, lst.name, lst.host, lst.port)
             for lst in listeners if lst.source == "bind"]
    for site in sites:
        await site.stop()
    for lst in bound:
        lst.sock.setblocking(False)
    return await _adopt_queued(bound, server)


async def drain(server: web.Server, state: DrainState, *, deadline: float, cut: asyncio.Event,
                clock: Callable[[], float], adopted: int = 0) -> DrainReport:
    """Let requests finish; close idle connections once they stayed idle; stop at the deadline or on ``cut``."""
    started = clock()
    conns = server.connections
    report = DrainReport("clean", in_flight_at_start=sum(not connection_idle(c) for c in conns),
                         idle_at_start=sum(connection_idle(c) for c in conns), adopted=adopted)
    requests_before = server.requests_count
    closed: set[RequestHandler] = set()
    while True:
        now = clock()
        live = [c for c in server.connections if c not in closed]
        reason = drain_reason(connections=len(live), now=now, deadline=deadline, cut_requested=cut.is_set())
        if reason is not None:
            break
        for conn in live:
            if not connection_idle(conn):
                state.busy_seen[conn] = now
            elif idle_expired(now, state.busy_seen.get(conn, started), IDLE_GRACE_SECONDS):
                conn.force_close()
                closed.add(conn)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(cut.wait(), timeout=max(0.0, min(DRAIN_POLL_SECONDS, deadline - now)))
    report.reason = reason
    report.started_during = server.requests_count - requests_before
    report.closed_idle = len(closed)
    report.cut = sum(not connection_idle(c) for c in live) if reason != "clean" else 0
    report.seconds = round(clock() - started, 3)
    return report


# ---------------------------------------------------------------- children


def child_pids(pid: int) -> list[int]:
    """Direct children of ``pid`` (Linux ``/proc/<pid>/task/*/children``); [] where unavailable."""
    pids: set[int] = set()
    with contextlib.suppress(OSError):
        for tid in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError), open(f"/proc/{pid}/task/{tid}/children") as fh:
                pids.update(int(p) for p in fh.read().split())
    return sorted(pids)


def _wait_exit(pid: int, timeout: float) -> bool:
    """Reap ``pid`` within ``timeout``; True when it is gone."""
    try:
        pidfd = os.pidfd_open(pid)
    except OSError:
        return True  # already gone
    try:
        poller = select.poll()
        poller.register(pidfd, select.POLLIN)
        exited = bool(poller.poll(timeout * 1000))
    finally:
        os.close(pidfd)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)
    return exited


def terminate_leftover_children(pid: int) -> int:
    """Last guard against orphans: upstream cleanup should have stopped every child already."""
    leftovers = child_pids(pid)
    for child in leftovers:
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signal.SIGTERM)
    for child in leftovers:
        if not _wait_exit(child, CHILD_EXIT_WAIT_SECONDS):
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signal.SIGKILL)
            _wait_exit(child, CHILD_EXIT_WAIT_SECONDS)
    if leftovers:
        log.warning("orphan_guard", children=leftovers)
    return len(leftovers)


# ---------------------------------------------------------------- serve


class _GatewayRunner(web.AppRunner):
    """An AppRunner that sends ``on_shutdown`` once, when the drain begins (aiohttp's order), not again."""

    __slots__ = ("_shutdown_sent",)

    def __init__(self, app: web.Application) -> None:
        # The request middleware writes the canonical line; aiohttp's access log would repeat it.
        super().__init__(app, shutdown_timeout=CUT_GRACE_SECONDS, access_log=None)
        self._shutdown_sent = False

    async def shutdown(self) -> None:
        if not self._shutdown_sent:
            self._shutdown_sent = True
            await self.app.shutdown()


async def _wait_ready(app: web.Application, stop: asyncio.Event, timeout: float) -> bool:
    """Until every upstream is initialized (what ``/readyz`` reports), bounded; False if not in time."""
    pool, deadline = app[POOL], time.monotonic() + timeout
    while not all(pool.readiness().values()):
        if stop.is_set() or time.monotonic() >= deadline:
            return False
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), READY_POLL_SECONDS)
    return True


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


async def _serve_until_stopped(runner: _GatewayRunner, state: DrainState, listeners: list[Listener],
                               settings: Settings, stop: asyncio.Event, cut: asyncio.Event,
                               notifier: Notifier) -> ExitCode:
    loop = asyncio.get_running_loop()
    if not await _setup_unless_cut(runner, cut):
        log.warning("startup_abandoned")
        return ExitCode.FAILED
    ready = await _wait_ready(runner.app, stop, READY_WAIT_SECONDS)
    if stop.is_set():
        log.info("stopped_during_startup")
        return ExitCode.OK
    sites = [web.SockSite(runner, lst.sock, backlog=BACKLOG) for lst in listeners]
    for site in sites:
        await site.start()
    if not ready:
        log.warning("upstreams_not_ready", waited_seconds=READY_WAIT_SECONDS, readiness=runner.app[POOL].readiness())
    for lst in listeners:
        log.info("listening", host=lst.host, port=lst.port, source=lst.source, name=lst.name,
                 reuse_port=settings.reuse_port if lst.source == "bind" else None, ready=ready)
    notifier.send("READY=1")

    await stop.wait()
    deadline = loop.time() + settings.drain_seconds
    notifier.send("STOPPING=1")
    server = runner.server
    assert server is not None
    adopted = await stop_listening(sites, listeners, server)
    state.draining = True
    conns = server.connections
    log.info("drain_started", connections=len(conns), in_flight=sum(not connection_idle(c) for c in conns),
             adopted=adopted)
    # on_shutdown ends long-lived streams, before the wait, as aiohttp orders it; within the deadline.
    try:
        await asyncio.wait_for(runner.shutdown(), max(0.0, deadline - loop.time()))
    except TimeoutError:
        log.warning("on_shutdown_timeout")
    report = await drain(server, state, deadline=deadline, cut=cut, clock=loop.time, adopted=adopted)
    fields = {"reason": report.reason, "drained": report.drained, "cut": report.cut,
              "closed_idle": report.closed_idle, "adopted": report.adopted, "seconds": report.seconds}
    if report.reason == "clean":
        log.info("drain_finished", **fields)
    else:
        log.warning("drain_cut", **fields)
    return exit_code(report.reason)


async def run(settings: Settings, *, environ: MutableMapping[str, str], pid: int) -> ExitCode:
    """Serve until a signal, drain, clean up; return the process exit code."""
    loop = asyncio.get_running_loop()
    try:
        # Before startup: a taken port fails fast. ExposureRefused (none auth on a public address) is a
        # configuration error: it propagates to the CLI, which prints its one line and exits 2.
        listeners = acquire_listeners(settings, environ, pid)
    except ListenError as exc:
        log.error("listen_failed", error=str(exc))
        return ExitCode.FAILED
    notifier = Notifier.from_environ(environ)
    stop, cut = asyncio.Event(), asyncio.Event()

    def on_signal(signame: str) -> None:
        if not stop.is_set():
            log.info("stop_requested", signal=signame, drain_seconds=settings.drain_seconds)
            stop.set()
        elif not cut.is_set():
            log.warning("stop_forced", signal=signame)
            cut.set()

    signums = (signal.SIGTERM, signal.SIGINT)
    for signum in signums:
        loop.add_signal_handler(signum, on_signal, signum.name)
    runner: _GatewayRunner | None = None
    try:
        state = DrainState()
        app = create_app(settings)
        app.on_response_prepare.append(state.on_response_prepare)
        runner = _GatewayRunner(app)
        code = await _serve_until_stopped(runner, state, listeners, settings, stop, cut, notifier)
    except ConfigError as exc:
        log.error("startup_failed", error=str(exc))
        code = ExitCode.CONFIG
    except Exception:
        log.exception("runner_failed")
        code = ExitCode.FAILED
    finally:
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
    log.info("stopped", exit_code=code)
    return code


def serve(settings: Settings) -> ExitCode:
    """Run the daemon until SIGTERM/SIGINT; not OK when something was cut or it could not start."""
    code = asyncio.run(run(settings, environ=os.environ, pid=os.getpid()))
    terminate_leftover_children(os.getpid())
    return code
