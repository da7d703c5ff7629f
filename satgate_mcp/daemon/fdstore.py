"""Stdio children kept in systemd's file-descriptor store, so that even a crash does not lose them.

With ``FileDescriptorStoreMax=`` (systemd sets ``$FDSTORE``) the daemon gives systemd, per child, its
stdin, stdout, stderr and pidfd and a memfd holding its record (``handover_state``), each under its own
name (``sd_notify`` ``FDSTORE=1`` with ``FDNAME=``; a newer copy replaces one with ``FDSTOREREMOVE=1``
first). When the daemon dies and systemd starts it again, they come back in ``LISTEN_FDS`` /
``LISTEN_FDNAMES`` beside any listening socket: sorted by name and grouped per child here, each child is
adopted, and one whose record cannot be read is stopped (through its pidfd) and started fresh.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import signal
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import structlog

from satgate_mcp.daemon.notify import Notifier
from satgate_mcp.daemon.sockets import STORED_PREFIX, InheritedFd
from satgate_mcp.upstream.child_process import close_fds
from satgate_mcp.upstream.handover_state import MAX_RECORD_BYTES, BadRecord, ChildRecord, from_json
from satgate_mcp.upstream.stdio_handover import Delivery

log = structlog.get_logger("satgate_mcp.runner")

PREFIX = STORED_PREFIX
ROLES = ("stdin", "stdout", "stderr", "pidfd", "state")


def child_key(upstream: str, instance: str | None) -> str:
    """A name-safe key per child (upstream names may hold anything; FDNAME may not hold ':')."""
    return hashlib.sha256(f"{upstream}\0{instance or ''}".encode()).hexdigest()[:16]


def fd_names(key: str) -> dict[str, str]:
    return {role: f"{PREFIX}{key}-{role}" for role in ROLES}


def parse_name(name: str) -> tuple[str, str] | None:
    """(key, role) of one of our stored descriptors; None for anything else (a listening socket)."""
    if not name.startswith(PREFIX):
        return None
    key, _, role = name[len(PREFIX):].rpartition("-")
    return (key, role) if key and role in ROLES else None


@dataclass(frozen=True)
class Stored:
    """One child's descriptors from the store, by role; ``complete`` when every role came."""

    key: str
    fds: dict[str, int]

    @property
    def complete(self) -> bool:
        return set(self.fds) == set(ROLES)


def split_inherited(inherited: Sequence[InheritedFd]) -> tuple[list[InheritedFd], list[Stored]]:
    """Listening sockets apart from stored children (sorted by name, as systemd's order is not ours)."""
    sockets: list[InheritedFd] = []
    children: dict[str, dict[str, int]] = {}
    for item in sorted(inherited, key=lambda i: i.name):
        parsed = parse_name(item.name)
        if parsed is None:
            sockets.append(item)
        else:
            children.setdefault(parsed[0], {})[parsed[1]] = item.fd
    return sockets, [Stored(key, fds) for key, fds in children.items()]


def fd_store_enabled(environ: Mapping[str, str]) -> bool:
    """systemd says how many descriptors it keeps for the unit in ``$FDSTORE`` (none: no store)."""
    value = environ.get("FDSTORE", "").strip()
    return value.isdigit() and int(value) > 0


class FdStore:
    """``ChildStore`` on systemd's fd store."""

    def __init__(self, notifier: Notifier) -> None:
        self._notifier = notifier

    def keep(self, record: ChildRecord, fds: list[int], pidfd: int) -> None:
        names = fd_names(child_key(record.upstream, record.instance))
        state = os.memfd_create("satgate-child-state", os.MFD_CLOEXEC)
        try:
            os.write(state, record.to_json())
            for role, fd in zip(ROLES, [*fds, pidfd, state], strict=True):
                self._notifier.send(f"FDSTOREREMOVE=1\nFDNAME={names[role]}")
                self._notifier.send_fds(f"FDSTORE=1\nFDNAME={names[role]}", [fd])
        finally:
            close_fds([*fds, pidfd, state])

    def forget(self, upstream: str, instance: str | None) -> None:
        for name in fd_names(child_key(upstream, instance)).values():
            self._notifier.send(f"FDSTOREREMOVE=1\nFDNAME={name}")


def read_record(fd: int) -> ChildRecord:
    """The record in a state memfd; ``BadRecord`` for anything unreadable."""
    try:
        data = os.pread(fd, MAX_RECORD_BYTES + 1, 0)
    except OSError as exc:
        raise BadRecord(f"state descriptor unreadable: {exc}") from None
    return from_json(data)


def stored_deliveries(stored: Sequence[Stored]) -> list[Delivery]:
    """Each stored child ready to adopt; the others (incomplete, unreadable) are stopped and logged, never fatal."""
    deliveries = []
    for child in stored:
        record: ChildRecord | None = None
        reason = "not every descriptor came back" if not child.complete else None
        if reason is None:
            try:
                record = read_record(child.fds["state"])
            except BadRecord as exc:
                reason = str(exc)
        state = child.fds.pop("state", None)
        close_fds([] if state is None else [state])
        if record is None:
            log.warning("upstream_handover_refused", source="fd_store", key=child.key, reason=reason)
            if "pidfd" in child.fds:
                with contextlib.suppress(OSError):
                    signal.pidfd_send_signal(child.fds["pidfd"], signal.SIGTERM)
            close_fds(list(child.fds.values()))
            continue
        fds = child.fds
        deliveries.append(Delivery(record, [fds["stdin"], fds["stdout"], fds["stderr"]], fds["pidfd"], crashed=True))
    return deliveries


