"""Listening sockets: where they come from (systemd or a bind), when a bind is refused, and the auth rule."""

from __future__ import annotations

import os
import socket
import sys

import pytest

from satgate_mcp.addresses import is_loopback_host
from satgate_mcp.daemon import sockets
from satgate_mcp.daemon.sockets import (
    BindAddress,
    ExposureRefused,
    InheritedFd,
    ListenError,
    bind_action,
    bind_address,
    bind_socket,
    someone_listens,
    systemd_fds,
    unauthenticated_exposure,
)
from satgate_mcp.settings import Settings
from tests.deploy.harness import tcp_states

PID = 4242


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        pytest.param({}, [], id="not-activated"),
        pytest.param({"LISTEN_PID": str(PID), "LISTEN_FDS": "1"}, [InheritedFd(3, "fd3")], id="one-fd"),
        pytest.param({"LISTEN_PID": str(PID), "LISTEN_FDS": "2", "LISTEN_FDNAMES": "web:admin"},
                     [InheritedFd(3, "web"), InheritedFd(4, "admin")], id="named-fds"),
        pytest.param({"LISTEN_PID": str(PID), "LISTEN_FDS": "2", "LISTEN_FDNAMES": "web"},
                     [InheritedFd(3, "web"), InheritedFd(4, "fd4")], id="fewer-names-than-fds"),
        pytest.param({"LISTEN_PID": "1", "LISTEN_FDS": "1"}, [], id="meant-for-another-process"),
        pytest.param({"LISTEN_FDS": "1"}, [], id="no-listen-pid"),
        pytest.param({"LISTEN_PID": str(PID), "LISTEN_FDS": "0"}, [], id="zero-fds"),
        pytest.param({"LISTEN_PID": str(PID), "LISTEN_FDS": "-1"}, [], id="negative-fds"),
        pytest.param({"LISTEN_PID": str(PID), "LISTEN_FDS": "x"}, [], id="garbage-fds"),
        pytest.param({"LISTEN_PID": str(PID), "LISTEN_FDS": "\u00b2"}, [], id="a-superscript-is-no-count"),
    ],
)
def test_systemd_fds_are_used_only_when_meant_for_this_process(
    environ: dict[str, str], expected: list[InheritedFd]
) -> None:
    assert systemd_fds(environ, PID) == expected


@pytest.mark.parametrize(
    ("host", "expected"),
    [
        pytest.param("127.0.0.1", BindAddress(socket.AF_INET, "127.0.0.1"), id="ipv4"),
        pytest.param("0.0.0.0", BindAddress(socket.AF_INET, "0.0.0.0"), id="ipv4-any"),
        pytest.param("", BindAddress(socket.AF_INET, "0.0.0.0"), id="empty-is-any"),
        pytest.param("::1", BindAddress(socket.AF_INET6, "::1"), id="ipv6"),
        pytest.param("[::1]", BindAddress(socket.AF_INET6, "::1"), id="bracketed-ipv6"),
        pytest.param("::", BindAddress(socket.AF_INET6, "::", dual_stack=True), id="ipv6-any-dual-stack"),
        pytest.param("localhost", BindAddress(None, "localhost"), id="name-resolved-later"),
    ],
)
def test_bind_address_family_follows_the_host_form(host: str, expected: BindAddress) -> None:
    assert bind_address(host) == expected


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        pytest.param("127.0.0.1", True, id="ipv4-loopback"),
        pytest.param("127.8.9.10", True, id="anywhere-in-127/8"),
        pytest.param("::1", True, id="ipv6-loopback"),
        pytest.param("[::1]", True, id="bracketed-ipv6-loopback"),
        pytest.param("::ffff:127.0.0.1", True, id="ipv4-mapped-loopback"),
        pytest.param("localhost", True, id="localhost"),
        pytest.param("LocalHost.", True, id="localhost-any-case-fqdn-dot"),
        pytest.param("0.0.0.0", False, id="ipv4-any"),
        pytest.param("", False, id="empty-is-any"),
        pytest.param("::", False, id="ipv6-any"),
        pytest.param("10.0.0.5", False, id="private-address"),
        pytest.param("::ffff:10.0.0.5", False, id="ipv4-mapped-public"),
        pytest.param("gw.internal", False, id="other-names-are-public"),
        pytest.param("localhost.example.com", False, id="not-really-localhost"),
    ],
)
def test_loopback_hosts(host: str, loopback: bool) -> None:
    assert is_loopback_host(host) is loopback


@pytest.mark.parametrize(
    ("auth_mode", "allow", "hosts", "refused"),
    [
        pytest.param("none", False, ["0.0.0.0"], True, id="none-on-any-address-refused"),
        pytest.param("none", False, ["gw.internal"], True, id="none-on-a-name-refused"),
        pytest.param("none", False, ["127.0.0.1", "10.0.0.5"], True, id="one-public-socket-is-enough"),
        pytest.param("none", True, ["0.0.0.0"], False, id="none-on-any-address-with-the-opt-in"),
        pytest.param("none", False, ["127.0.0.1"], False, id="none-on-loopback"),
        pytest.param("none", False, ["localhost"], False, id="none-on-localhost"),
        pytest.param("none", False, [], False, id="only-unix-sockets"),
        pytest.param("header", False, ["0.0.0.0"], False, id="header-anywhere"),
        pytest.param("config", False, ["::"], False, id="config-anywhere"),
    ],
)
def test_unauthenticated_exposure(auth_mode: str, allow: bool, hosts: list[str], refused: bool) -> None:
    message = unauthenticated_exposure(auth_mode, allow, hosts)
    assert (message is not None) is refused
    if message is not None:
        assert "\n" not in message
        for needed in ("SATGATE_ALLOW_UNAUTHENTICATED=true", "SATGATE_AUTH_MODE=header", "SATGATE_ROOT_KEY",
                       "satgate-mcp token mint"):
            assert needed in message


@pytest.mark.parametrize(
    ("listener_found", "handover", "action"),
    [
        pytest.param(False, False, "bind", id="free-port-binds"),
        pytest.param(False, True, "bind", id="handover-with-nothing-to-take-over-binds"),
        pytest.param(True, True, "take_over", id="handover-shares-until-the-old-one-leaves"),
        pytest.param(True, False, "refuse", id="plain-start-on-a-listened-port-refused"),
    ],
)
def test_bind_action(listener_found: bool, handover: bool, action: str) -> None:
    assert bind_action(listener_found=listener_found, handover=handover) == action



# ---------------------------------------------------------------- sockets


def test_a_handover_binds_the_port_a_listener_holds_with_reuse_port() -> None:
    first = bind_socket("127.0.0.1", 0, reuse_port=True)
    first.sock.listen()
    try:
        second = bind_socket("127.0.0.1", first.port or 0, reuse_port=True, handover=True)
        second.sock.close()
        assert (first.source, second.port) == ("bind", first.port)
    finally:
        first.sock.close()


def test_attack_second_start_on_a_listened_port_is_refused_not_shared() -> None:
    first = bind_socket("127.0.0.1", 0, reuse_port=True)
    first.sock.listen()
    try:
        with pytest.raises(ListenError, match=r"refusing to bind 127\.0\.0\.1:\d+: another process already listens") \
                as refused:
            bind_socket("127.0.0.1", first.port or 0, reuse_port=True)
        assert "SATGATE_HANDOVER=true" in str(refused.value)
        assert "--handover" in str(refused.value)
    finally:
        first.sock.close()


def _listening(host: str = "127.0.0.1", *, reuse_port: bool = True) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, 0))
    sock.listen()
    return sock


@pytest.mark.parametrize(
    ("listener_host", "reuse_port", "probe_host"),
    [
        pytest.param("127.0.0.1", True, "127.0.0.1", id="reuse-port-listener-same-address"),
        pytest.param("127.0.0.1", False, "127.0.0.1", id="plain-listener"),
        pytest.param("0.0.0.0", True, "127.0.0.1", id="any-address-listener-covers-loopback"),
        pytest.param("127.0.0.1", True, "0.0.0.0", id="loopback-listener-overlaps-any-address"),
    ],
)
def test_someone_listens_sees_a_listener_with_or_without_reuse_port(
    listener_host: str, reuse_port: bool, probe_host: str
) -> None:
    with _listening(listener_host, reuse_port=reuse_port) as sock:
        assert someone_listens(socket.AF_INET, (probe_host, sock.getsockname()[1]), dual_stack=False)


def test_someone_listens_ignores_a_bound_socket_that_does_not_listen_and_time_wait_leftovers() -> None:
    server = _listening()
    port = server.getsockname()[1]
    client = socket.create_connection(("127.0.0.1", port))
    accepted, _ = server.accept()
    accepted.close()  # the server side closes first: its end of the connection stays in TIME_WAIT
    client.close()
    server.close()
    assert tcp_states(port) - {"LISTEN"}, "premise: a connection on the port outlives its listener"
    assert not someone_listens(socket.AF_INET, ("127.0.0.1", port), dual_stack=False)
    with socket.socket() as bound:
        bound.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        bound.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        bound.bind(("127.0.0.1", port))  # a starting gateway binds before it listens
        assert not someone_listens(socket.AF_INET, ("127.0.0.1", port), dual_stack=False)




def test_without_reuse_port_a_taken_port_fails_with_one_clear_line() -> None:
    taken = bind_socket("127.0.0.1", 0, reuse_port=False)
    taken.sock.listen()
    try:
        with pytest.raises(ListenError, match=r"cannot bind 127\.0\.0\.1:\d+: Address already in use"):
            bind_socket("127.0.0.1", taken.port or 0, reuse_port=False)
    finally:
        taken.sock.close()


def test_ipv6_loopback_binds_an_ipv6_socket() -> None:
    if not socket.has_ipv6:
        pytest.skip("no IPv6")
    try:
        listener = bind_socket("::1", 0, reuse_port=True)
    except ListenError as exc:
        pytest.skip(f"IPv6 loopback unavailable: {exc}")
    with listener.sock:
        assert listener.sock.family == socket.AF_INET6
        assert listener.host == "::1"


def test_inherited_listening_socket_is_adopted_and_environment_cleared() -> None:
    sock = socket.create_server(("127.0.0.1", 0))
    fd = os.dup(sock.fileno())
    sock.close()
    environ = {"LISTEN_PID": str(PID), "LISTEN_FDS": "1", "LISTEN_FDNAMES": "web", "KEEP": "1"}
    listener = sockets.adopt_fd(InheritedFd(fd, "web"))
    with listener.sock:
        assert (listener.source, listener.name, listener.host) == ("systemd", "web", "127.0.0.1")
        assert not os.get_inheritable(fd)
    sockets.clear_listen_env(environ)
    assert environ == {"KEEP": "1"}


def test_acquire_prefers_systemd_sockets_over_host_and_port() -> None:
    sock = socket.create_server(("127.0.0.1", 0))
    environ = {"LISTEN_PID": str(PID), "LISTEN_FDS": "1"}
    original = sockets.SD_LISTEN_FDS_START
    try:
        sockets.SD_LISTEN_FDS_START = sock.fileno()
        listeners = sockets.acquire_listeners(Settings(port=1), environ, PID)
        assert [(lst.source, lst.port) for lst in listeners] == [("systemd", sock.getsockname()[1])]
        assert environ == {}
        listeners[0].sock.detach()
    finally:
        sockets.SD_LISTEN_FDS_START = original
        sock.close()


def test_an_inherited_socket_is_never_refused_as_taken() -> None:
    """systemd's socket is listened on by the previous process too during a restart: that is the point."""
    sock = _listening()
    environ = {"LISTEN_PID": str(PID), "LISTEN_FDS": "1"}
    original = sockets.SD_LISTEN_FDS_START
    try:
        sockets.SD_LISTEN_FDS_START = sock.fileno()
        listeners = sockets.acquire_listeners(Settings(port=sock.getsockname()[1]), environ, PID)
        assert [lst.source for lst in listeners] == ["systemd"]
        listeners[0].sock.detach()
    finally:
        sockets.SD_LISTEN_FDS_START = original
        sock.close()


def test_none_auth_on_an_inherited_public_socket_is_refused_whatever_satgate_host_says() -> None:
    sock = _listening("0.0.0.0")
    fd = os.dup(sock.fileno())
    environ = {"LISTEN_PID": str(PID), "LISTEN_FDS": "1"}
    original = sockets.SD_LISTEN_FDS_START
    try:
        sockets.SD_LISTEN_FDS_START = fd
        with pytest.raises(ExposureRefused, match="SATGATE_ALLOW_UNAUTHENTICATED=true"):
            sockets.acquire_listeners(Settings(host="127.0.0.1", port=1), environ, PID)
        with pytest.raises(OSError, match="Bad file descriptor"):
            os.fstat(fd)  # the refused socket was closed (systemd keeps its own copy)
    finally:
        sockets.SD_LISTEN_FDS_START = original
        sock.close()


def test_none_auth_on_a_public_host_is_refused_before_binding() -> None:
    with _listening("0.0.0.0") as taken:  # even a taken port: the configuration problem comes first
        settings = Settings(host="0.0.0.0", port=taken.getsockname()[1])
        with pytest.raises(ExposureRefused, match=r"SATGATE_AUTH_MODE=none on 0\.0\.0\.0"):
            sockets.acquire_listeners(settings, {}, PID)


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(lambda: socket.socket(socket.AF_INET, socket.SOCK_STREAM), id="not-listening"),
        pytest.param(lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM), id="datagram"),
    ],
)
def test_an_inherited_fd_that_is_not_a_listening_stream_socket_is_refused(make: object) -> None:
    sock = make()  # type: ignore[operator]
    with sock:
        with pytest.raises(ListenError, match="not a listening stream socket"):
            sockets.adopt_fd(InheritedFd(sock.fileno(), "web"))
        sock.getsockname()  # still open: a refused fd is not closed under its owner


PROC_NET_TCP = """\
  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1 1 0 100 0 0 10 0
   1: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 2 1 0 100 0 0 10 0
   2: 0100007F:1F90 0100007F:C350 01 00000000:00000000 00:00000000 00000000     0        0 3 1 0 100 0 0 10 0
   3: 00000000:1F91 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 4 1 0 100 0 0 10 0
"""


@pytest.mark.parametrize(
    ("port", "expected"),
    [
        pytest.param(8080, 2, id="two-listeners-one-connection-not-counted"),
        pytest.param(8081, 1, id="alone"),
        pytest.param(8082, 0, id="nobody"),
    ],
)
def test_listeners_on_port_counts_only_listening_sockets(port: int, expected: int) -> None:
    assert sockets.listeners_on_port(PROC_NET_TCP, port) == expected


def _reuse_port_listener(port: int) -> socket.socket:
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind(("127.0.0.1", port))
    sock.listen(64)
    return sock


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="SO_ATTACH_REUSEPORT_CBPF is Linux's")
def test_a_steered_old_listener_gets_no_new_connection_so_closing_it_resets_none() -> None:
    """The handover race: the kernel hashes new connections over the group, and closing resets those it hashed."""
    old = _reuse_port_listener(0)
    port = old.getsockname()[1]
    new = _reuse_port_listener(port)
    clients = []
    try:
        assert sockets.shares_port(port)
        assert sockets.steer_to_newest(old)
        for _ in range(32):
            client = socket.create_connection(("127.0.0.1", port), timeout=5)
            clients.append(client)
        old.setblocking(False)
        with pytest.raises(BlockingIOError):
            old.accept()
        new.settimeout(5)
        for _ in clients:
            new.accept()[0].close()
    finally:
        for client in clients:
            client.close()
        old.close()
        new.close()
    alone = _reuse_port_listener(0)
    try:
        assert not sockets.shares_port(alone.getsockname()[1])
    finally:
        alone.close()
