"""Listening sockets: inherited from systemd, or bound here (``SO_REUSEPORT``, refused when taken unless handing over).

The socket is bound before the app starts but listened on only once it is ready, so the kernel never
hands a connection to a process that would fail its calls. At a stop the listener closes first and
the connections already queued on a socket we bound are adopted and served, never reset.

Closing one socket of a ``SO_REUSEPORT`` group resets the handshakes the kernel had just hashed to it
(Linux without ``net.ipv4.tcp_migrate_req``), so a stopping process that shares its port first steers
new connections to the newest socket of the group and accepts for a moment before it closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import errno
import ipaddress
import os
import socket
import struct
import sys
from collections.abc import Iterable, Mapping, MutableMapping
from dataclasses import dataclass
from typing import Literal

import structlog
from aiohttp import web

from satgate_mcp.addresses import is_loopback_host
from satgate_mcp.errors import ConfigError
from satgate_mcp.settings import Settings

log = structlog.get_logger("satgate_mcp.runner")

#: First inherited fd in the systemd socket-activation protocol (sd_listen_fds(3)).
SD_LISTEN_FDS_START = 3
LISTEN_ENV = ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES")

SocketSource = Literal["systemd", "bind"]


class ListenError(Exception):
    """The runner cannot get a listening socket; the message says what to fix."""


# ---------------------------------------------------------------- decisions


@dataclass(frozen=True)
class InheritedFd:
    fd: int
    name: str


def systemd_fds(environ: Mapping[str, str], pid: int) -> list[InheritedFd]:
    """The listening fds systemd passed to *this* process, per sd_listen_fds(3); [] when not activated.

    ``LISTEN_PID`` must name us: variables inherited from a socket-activated parent are not ours.
    """
    listen_pid, listen_fds = environ.get("LISTEN_PID", "").strip(), environ.get("LISTEN_FDS", "").strip()
    if not all(v.isascii() and v.isdigit() for v in (listen_pid, listen_fds)) or int(listen_pid) != pid:
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


# ---------------------------------------------------------------- I/O edge


@dataclass(frozen=True)
class Listener:
    sock: socket.socket
    source: SocketSource
    name: str
    host: str
    port: int | None
    reuse_port: bool = False


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
    return Listener(sock, "bind", f"{host}:{port}", bound_host, bound_port, reuse_port=reuse_port)


def clear_listen_env(environ: MutableMapping[str, str]) -> None:
    for key in LISTEN_ENV:
        environ.pop(key, None)


class ExposureRefused(ConfigError):
    """``none`` auth on a public address without the opt-in: the CLI prints the one line and exits 2."""


#: Names of the descriptors the daemon keeps in systemd's fd store for its stdio children (``fdstore``).
STORED_PREFIX = "satgate-child-"


def acquire_listeners(settings: Settings, environ: MutableMapping[str, str], pid: int,
                      stored: list[InheritedFd] | None = None) -> list[Listener]:
    """Inherited sockets when systemd passed some, else one socket bound to ``SATGATE_HOST:SATGATE_PORT``.

    Inherited sockets are never refused as taken (systemd owns them, and the previous process may
    still accept on them), but their real addresses, not ``SATGATE_HOST``, decide the auth rule.
    """
    inherited = systemd_fds(environ, pid)
    clear_listen_env(environ)
    if stored is not None:  # the children's pipes come back beside the sockets: not ours to listen on
        stored += [item for item in inherited if item.name.startswith(STORED_PREFIX)]
        inherited = [item for item in inherited if not item.name.startswith(STORED_PREFIX)]
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



#: ``SO_ATTACH_REUSEPORT_CBPF`` from <asm-generic/socket.h>; Python's socket module does not name it.
SO_ATTACH_REUSEPORT_CBPF = 51
#: Classic BPF ``ret #1``: the group's socket at index 1. A handover group holds the old socket at 0
#: (it was alone before) and the new one at 1; with one socket left, 1 is out of range and the
#: kernel falls back to its hash, so the program is harmless after the old socket is gone.
_BPF_RET_K = 0x06
STEER_TO_INDEX = 1
#: How long a steered listener keeps accepting: handshakes hashed to it just before finish within this.
STEER_GRACE_SECONDS = 0.25
#: State column of a listening socket in /proc/net/tcp{,6}.
_TCP_LISTEN = "0A"


def listeners_on_port(proc_net_tcp: str, port: int) -> int:
    """How many sockets of a /proc/net/tcp table listen on *port* (any address)."""
    count = 0
    for line in proc_net_tcp.splitlines()[1:]:
        fields = line.split()
        if len(fields) > 3 and fields[3] == _TCP_LISTEN and fields[1].rpartition(":")[2].upper() == f"{port:04X}":
            count += 1
    return count


def shares_port(port: int | None) -> bool:
    """Whether another socket listens on our port too (a handover under way); unknown counts as yes."""
    if port is None or not sys.platform.startswith("linux"):
        return False
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table, encoding="ascii") as fh:
                count += listeners_on_port(fh.read(), port)
        except OSError:
            return True
    return count > 1


def steer_to_newest(sock: socket.socket) -> bool:
    """Ask the kernel to hash no new connection of this port's group to *sock*; False where it cannot."""
    if not sys.platform.startswith("linux"):
        return False
    instruction = ctypes.create_string_buffer(struct.pack("=HBBI", _BPF_RET_K, 0, 0, STEER_TO_INDEX))
    program = struct.pack("@HP", 1, ctypes.addressof(instruction))
    try:
        sock.setsockopt(socket.SOL_SOCKET, SO_ATTACH_REUSEPORT_CBPF, program)
    except OSError as exc:
        log.warning("steer_failed", error=exc.strerror)
        return False
    return True


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
    shared = [lst for lst in listeners if lst.source == "bind" and lst.reuse_port and shares_port(lst.port)]
    if [lst for lst in shared if steer_to_newest(lst.sock)]:
        # The sites still accept meanwhile: whatever was hashed here before the steer is served.
        log.info("steered_to_new_listener", grace_seconds=STEER_GRACE_SECONDS)
        await asyncio.sleep(STEER_GRACE_SECONDS)
    # asyncio closes the socket it serves on; a duplicate keeps a bound socket's accept queue alive.
    bound = [Listener(lst.sock.dup(), lst.source, lst.name, lst.host, lst.port, lst.reuse_port)
             for lst in listeners if lst.source == "bind"]
    for site in sites:
        await site.stop()
    for lst in bound:
        lst.sock.setblocking(False)
    return await _adopt_queued(bound, server)
