"""The handover channel: the new process asks the old one, over a Unix socket, for its stdio children.

The socket lives in the state folder, one per listening port (``handover-<port>.sock``), owner-only (0600),
and each side checks the other's uid (``SO_PEERCRED``): a child's pipes go only to a process of the same user.
The exchange, one frame each (a 4-byte length, the number of descriptors attached, JSON; descriptors ride on
the header, ``SCM_RIGHTS``):

1. new -> old ``{"op": "describe"}``; old -> new ``{"records": [...]}``: the new process plans its start
   with them (lists known, calls for those children wait for them), and listens;
2. new -> old ``{"op": "go", "expect": [[upstream, instance], ...]}`` once it listens: the old one stops as on
   SIGTERM (stops listening, drains); the children the new one does not expect (it refused their records)
   are stopped by the old one as on any stop;
3. old -> new, after the drain, per child ``{"record": {...}}`` with its stdin, stdout, stderr and pidfd,
   or ``{"missing": name, "reason": ...}``; then ``{"done": true}``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import structlog

from satgate_mcp.upstream.child_process import close_fds
from satgate_mcp.upstream.handover_state import BadRecord, ChildRecord, from_json
from satgate_mcp.upstream.stdio_handover import Delivery

log = structlog.get_logger("satgate_mcp.runner")

#: One channel per listening port: daemons sharing a state folder on other ports keep channels of their own, and
#: a ``--handover`` start (which takes over the port) asks the process on that port.
SOCKET_NAME = "handover-{port}.sock"
HEADER = struct.Struct(">IB")
MAX_FRAME = 16 * 1024 * 1024
#: Descriptors one child brings: stdin, stdout, stderr, pidfd.
CHILD_FDS = 4
CONNECT_TIMEOUT = 5.0


class HandoverError(OSError):
    """The channel broke or carried something unreadable."""


def peer_allowed(peer_uid: int, own_uid: int) -> bool:
    """Only a process of the same user may take (or give) a child: its pipes carry that user's work."""
    return peer_uid == own_uid


def peer_uid(sock: socket.socket) -> int:
    _pid, uid, _gid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                          struct.calcsize("3i")))
    return int(uid)


def socket_path(state_dir: Path, port: int) -> Path:
    return state_dir / SOCKET_NAME.format(port=port)


def send_frame(sock: socket.socket, message: dict[str, Any], fds: list[int] | None = None) -> None:
    body = json.dumps(message, separators=(",", ":")).encode()
    header = HEADER.pack(len(body), len(fds or []))
    try:
        if fds:
            socket.send_fds(sock, [header], fds)
        else:
            sock.sendall(header)
        sock.sendall(body)
    except OSError as exc:
        raise HandoverError(f"the handover channel broke: {exc}") from None


def _recv_exact(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        try:
            chunk = sock.recv(size - len(data))
        except OSError as exc:
            raise HandoverError(f"the handover channel broke: {exc}") from None
        if not chunk:
            raise HandoverError("the other process closed the handover channel")
        data += chunk
    return data


def recv_frame(sock: socket.socket) -> tuple[dict[str, Any], list[int]]:
    """One message and the descriptors that came with it (closed here when the message is unreadable)."""
    try:
        head, fds, _flags, _addr = socket.recv_fds(sock, HEADER.size, 8)
    except OSError as exc:
        raise HandoverError(f"the handover channel broke: {exc}") from None
    if not head:
        raise HandoverError("the other process closed the handover channel")
    try:
        size, count = HEADER.unpack(head + _recv_exact(sock, HEADER.size - len(head)))
        if size > MAX_FRAME or count != len(fds):
            raise HandoverError(f"bad frame: {size} bytes, {len(fds)} of {count} descriptors")
        message = json.loads(_recv_exact(sock, size))
        if not isinstance(message, dict):
            raise HandoverError("a frame that is not a JSON object")
    except (HandoverError, ValueError):
        close_fds(fds)
        raise
    return message, fds




def _stop_unadopted(fds: list[int]) -> None:
    """A child whose record cannot be read is asked to stop (through its pidfd), never left running."""
    if len(fds) == CHILD_FDS:
        with contextlib.suppress(OSError):
            signal.pidfd_send_signal(fds[CHILD_FDS - 1], signal.SIGTERM)
    close_fds(fds)


def listen_socket(path: Path) -> socket.socket:
    """Bound under a temporary name, made owner-only, then renamed into place: never connectable more widely."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    temporary = path.with_name(f".{path.name}.{os.getpid()}")
    with contextlib.suppress(FileNotFoundError):
        temporary.unlink()
    sock.bind(str(temporary))
    os.chmod(temporary, 0o600)
    os.replace(temporary, path)
    sock.listen(2)
    sock.setblocking(False)
    return sock


class HandoverServer:
    """The old process's side: answers one taker at a time, then hands the children over after its drain."""

    def __init__(self, path: Path, describe: Callable[[], list[ChildRecord]], on_go: Callable[[], None], *,
                 uid: int | None = None) -> None:
        self._path = path
        self._describe = describe
        self._on_go = on_go
        self._uid = os.getuid() if uid is None else uid
        self._sock: socket.socket | None = None
        self._task: asyncio.Task[None] | None = None
        #: The connection of the process that said "go": it gets the children.
        #: The children it expects, as (upstream, instance).
        self.expected: set[tuple[str, str | None]] = set()
        self.taker: socket.socket | None = None

    def start(self) -> None:
        self._sock = listen_socket(self._path)
        self._task = asyncio.create_task(self._accept_loop(), name="handover-server")

    async def _accept_loop(self) -> None:
        assert self._sock is not None
        loop = asyncio.get_running_loop()
        while self.taker is None:
            conn, _ = await loop.sock_accept(self._sock)
            conn.setblocking(True)
            uid = peer_uid(conn)
            if not peer_allowed(uid, self._uid):
                log.warning("handover_refused", peer_uid=uid, reason="another user")
                conn.close()
                continue
            try:
                await self._converse(conn)
            except (OSError, ValueError) as exc:
                log.warning("handover_channel_failed", error=str(exc))
                conn.close()

    async def _converse(self, conn: socket.socket) -> None:
        message, fds = await asyncio.to_thread(recv_frame, conn)
        close_fds(fds)
        if message.get("op") != "describe":
            raise HandoverError(f"unexpected request {message.get('op')!r}")
        records = [json.loads(record.to_json()) for record in self._describe()]
        await asyncio.to_thread(send_frame, conn, {"records": records})
        message, fds = await asyncio.to_thread(recv_frame, conn)
        close_fds(fds)
        if message.get("op") != "go":
            raise HandoverError(f"unexpected request {message.get('op')!r}")
        self.taker = conn
        self.expected = {(str(pair[0]), pair[1] if isinstance(pair[1], str) else None)
                         for pair in message.get("expect") or [] if isinstance(pair, list) and len(pair) == 2}
        log.info("handover_requested", children=len(records))
        self._on_go()

    async def send_children(self, deliveries: list[Delivery], refused: list[tuple[str, str | None, str]]) -> None:
        """To the taker: each child's record and descriptors (ours closed once sent), the refusals, the end."""
        conn = self.taker
        try:
            for delivery in deliveries:
                if conn is not None:
                    with contextlib.suppress(OSError):
                        record = json.loads(delivery.record.to_json())
                        await asyncio.to_thread(send_frame, conn, {"record": record},
                                                [*delivery.fds, delivery.pidfd])
                delivery.discard()
            if conn is not None:
                for name, instance, reason in refused:
                    await asyncio.to_thread(send_frame, conn, {"missing": name, "instance": instance, "reason": reason})
                await asyncio.to_thread(send_frame, conn, {"done": True})
        except OSError as exc:
            log.warning("handover_channel_failed", error=str(exc))

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        for sock in (self._sock, self.taker):
            if sock is not None:
                sock.close()


class HandoverClient:
    """The new process's side."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock

    @classmethod
    async def connect(cls, path: Path, *, uid: int | None = None) -> HandoverClient | None:
        """The old process's channel, or None when there is none (a plain start) or it is not ours."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(CONNECT_TIMEOUT)
        try:
            await asyncio.to_thread(sock.connect, str(path))
        except OSError as exc:
            sock.close()
            if not isinstance(exc, FileNotFoundError | ConnectionRefusedError):
                log.warning("handover_unavailable", path=str(path), error=str(exc))
            return None
        if not peer_allowed(peer_uid(sock), os.getuid() if uid is None else uid):
            log.warning("handover_refused", reason="the handover socket belongs to another user")
            sock.close()
            return None
        return cls(sock)

    def close(self) -> None:
        self._sock.close()

    async def describe(self) -> list[ChildRecord]:
        """The old process's children; a record that cannot be read is left out (that child starts fresh)."""
        await asyncio.to_thread(send_frame, self._sock, {"op": "describe"})
        message, fds = await asyncio.to_thread(recv_frame, self._sock)
        close_fds(fds)
        records = []
        for raw in message.get("records") or []:
            try:
                records.append(from_json(json.dumps(raw).encode()))
            except BadRecord as exc:
                log.warning("upstream_handover_refused", reason=str(exc))
        return records

    async def go(self, expected: list[tuple[str, str | None]]) -> None:
        self._sock.settimeout(None)  # the children come after the old process's drain
        await asyncio.to_thread(send_frame, self._sock, {"op": "go", "expect": [list(pair) for pair in expected]})

    async def receive(self, on_child: Callable[[str, str | None, Delivery | None], None]) -> None:
        """Every child the old process sends, until it is done or gone; each as it comes."""
        try:
            while True:
                message, fds = await asyncio.to_thread(recv_frame, self._sock)
                if message.get("done"):
                    return
                if "missing" in message:
                    instance = message.get("instance")
                    log.warning("upstream_handover_missed", upstream=message.get("missing"), instance=instance,
                                reason=message.get("reason"))
                    on_child(str(message.get("missing")), instance if isinstance(instance, str) else None, None)
                    close_fds(fds)
                    continue
                try:
                    record = from_json(json.dumps(message.get("record")).encode())
                except BadRecord as exc:
                    log.warning("upstream_handover_refused", reason=str(exc))
                    _stop_unadopted(fds)
                    continue
                if len(fds) != CHILD_FDS:
                    _stop_unadopted(fds)
                    on_child(record.upstream, record.instance, None)
                    continue
                on_child(record.upstream, record.instance, Delivery(record, fds[:3], fds[3]))
        except (OSError, ValueError) as exc:
            log.warning("handover_channel_failed", error=str(exc))
        finally:
            self._sock.close()
