"""The DNS-rebinding guard's decisions: which ``Host`` and ``Origin`` a browser-reachable endpoint accepts.

Pure functions over the two headers and the settings (``checks.py`` caches the verdict per pair of values);
a refusal is 403 (421 for a ``Host`` this server is not) with a JSON-RPC body like every other refusal.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence

from satgate_mcp.transport.rules import Refusal


def _is_port(text: str) -> bool:
    return 0 < len(text) <= 5 and text.isascii() and text.isdigit() and int(text) <= 65535


def host_of_authority(authority: str) -> str | None:
    """The host of ``host[:port]`` or ``[v6][:port]``, lower-cased; None when it is malformed.

    Plain string methods, no URL library: those raise on inputs such as an unclosed ``[::1``.
    """
    authority = authority.strip().lower()
    if authority.startswith("["):
        end = authority.find("]")
        if end < 0:
            return None
        host, rest = authority[1:end], authority[end + 1:]
        if rest and not (rest[0] == ":" and _is_port(rest[1:])):
            return None
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            return None
        return host
    if authority.count(":") == 1:
        host, _, port = authority.partition(":")
        return host if host and _is_port(port) else None
    return authority  # no port, or a bare IPv6 address


def origin_host(origin: str) -> str | None:
    """The host of an ``http(s)://host[:port]`` origin; None for anything else (``null``, paths, userinfo)."""
    scheme, sep, authority = origin.strip().lower().partition("://")
    if not sep or scheme not in ("http", "https") or not authority:
        return None
    if any(c in authority for c in "/?#@\\"):
        return None
    return host_of_authority(authority)


def is_loopback_host(host: str) -> bool:
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_host(host_header: str | None, allowed_hosts: Sequence[str], bind_host: str) -> Refusal | None:
    """DNS-rebinding guard: loopback Host values always pass; others must be listed.

    When the daemon listens on a public address and no list is configured, any Host passes:
    the operator exposed it on purpose and a proxy in front sets Host.
    """
    host = host_of_authority(host_header or "")
    if host is not None and is_loopback_host(host):
        return None
    allowed = {h.strip().lower() for h in allowed_hosts}
    if host in allowed or (host_header or "").strip().lower() in allowed or "*" in allowed:
        return None
    if not allowed and not is_loopback_host(host_of_authority(bind_host) or bind_host):
        return None
    return Refusal(421, "host_not_allowed", f"Host {host_header!r} is not allowed (set SATGATE_ALLOWED_HOSTS)")


def check_origin(origin: str | None, allowed_origins: Sequence[str]) -> Refusal | None:
    """Browsers send Origin; a page from a site we do not know must not drive the gateway."""
    if origin is None:
        return None
    normalized = origin.strip().rstrip("/").lower()
    if normalized in {o.strip().rstrip("/").lower() for o in allowed_origins} or "*" in allowed_origins:
        return None
    host = origin_host(normalized)
    if host is not None and is_loopback_host(host):
        return None
    return Refusal(403, "origin_not_allowed", f"Origin {origin!r} is not allowed (set SATGATE_ALLOWED_ORIGINS)")
