"""Which addresses are this machine's own: shared by the listener guard and the OAuth URL rules."""

from __future__ import annotations

import functools
import ipaddress
from urllib.parse import urlsplit


@functools.lru_cache(maxsize=256)
def is_loopback_host(host: str) -> bool:
    """``127.0.0.0/8``, ``::1`` (also IPv4-mapped) or ``localhost``: reachable from this machine only.

    Any other name counts as public: what it resolves to is not this check's to trust. Asked of every request's
    Host, so remembered (a few hundred names at most: a flood of made-up hosts only cycles the cache).
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


def secure_url_problem(url: str) -> str | None:
    """Why ``url`` may not name an issuer, a key set or a metadata document: https, or http on loopback only.

    Keys fetched over plain HTTP from another machine could be swapped on the way, and then any token verifies.
    """
    parts = urlsplit(url.strip())
    if parts.scheme == "https" and parts.hostname:
        return None
    if parts.scheme == "http" and parts.hostname and is_loopback_host(parts.hostname):
        return None
    return "must be an https:// URL (http:// only on a loopback address)"
