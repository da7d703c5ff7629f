"""sd_notify(3) for ``Type=notify`` units: READY once listening, STOPPING when the drain starts."""

from __future__ import annotations

import array
import socket
from collections.abc import MutableMapping
from dataclasses import dataclass

import structlog

log = structlog.get_logger("satgate_mcp.runner")


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

    def send_fds(self, message: str, fds: list[int]) -> bool:
        """A message with descriptors (``FDSTORE=1``): True once sent."""
        if not self.address:
            return False
        target = "\0" + self.address[1:] if self.address.startswith("@") else self.address
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
                sock.sendmsg([message.encode()], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))],
                               0, target)
        except OSError as exc:
            log.warning("sd_notify_failed", message=message, error=exc.strerror)
            return False
        return True

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

