"""Argument rules (``args`` controls): whether one call's top-level argument passes a rule, and what would.

Pure functions. A URL is parsed (``urllib.parse``, IDNA for the host), never matched as text: userinfo is
refused outright, the host must equal a listed one in normal form (control_values.normal_host), a port must be
the scheme's default or listed, and the path may hold no backslash, no dot segment and no percent-encoded dot,
slash or backslash, however often encoded. What a refusal says is ``allowed``: the rule's side, never the value.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import unquote, urlsplit

from satgate_mcp.policy.control_values import DEFAULT_PORTS, UrlSpec, decimal_text, normal_host, number_of
from satgate_mcp.policy.controls import ArgRule

#: Longer URL arguments are refused unread.
MAX_URL_CHARS = 4096
#: Percent-decoding passes before a path must be stable (``%252e`` is ``%2e`` after one, ``.`` after two).
DECODE_PASSES = 3
_ENCODED_SEPARATORS = ("%2e", "%2f", "%5c")


def passes(rule: ArgRule, arguments: Mapping[str, Any]) -> bool:
    """Whether the call's ``arguments`` satisfy ``rule``; a missing field passes only ``absent``."""
    if rule.absent:
        return rule.field not in arguments
    if rule.field not in arguments:
        return False
    value = arguments[rule.field]
    if rule.one_of is not None:
        return any(type(allowed) is type(value) and allowed == value for allowed in rule.one_of)
    if rule.url is not None:
        return url_passes(rule.url, value)
    number = number_of(value)
    if number is None:
        return False
    return (rule.min is None or number >= rule.min) and (rule.max is None or number <= rule.max)


def allowed(rule: ArgRule) -> object:
    """What would pass ``rule``, for the refusal (the rule's own terms)."""
    if rule.absent:
        return "absent"
    if rule.one_of is not None:
        return list(rule.one_of)
    if rule.url is not None:
        return rule.url.to_json()
    bounds: dict[str, str] = {}
    if rule.min is not None:
        bounds["min"] = decimal_text(rule.min)
    if rule.max is not None:
        bounds["max"] = decimal_text(rule.max)
    return bounds


def _decoded(path: str) -> str | None:
    """``path`` percent-decoded until it no longer changes; None if it still changes after ``DECODE_PASSES``."""
    for _ in range(DECODE_PASSES):
        once = unquote(path)
        if once == path:
            return path
        path = once
    return None


def path_is_plain(path: str) -> bool:
    """No backslash, no ``.``/``..`` segment and no encoded separator, in the path as sent or fully decoded."""
    decoded = _decoded(path)
    if decoded is None or "\\" in decoded:
        return False
    lowered = path.lower()
    if any(encoded in lowered for encoded in _ENCODED_SEPARATORS):
        return False
    segments = decoded.split("/")
    return "." not in segments and ".." not in segments


def under(path: str, prefix: str) -> bool:
    """``path`` is ``prefix`` or below it; a prefix without a trailing ``/`` ends at a segment boundary."""
    if prefix.endswith("/"):
        return path.startswith(prefix)
    return path == prefix or path.startswith(prefix + "/")


def url_passes(spec: UrlSpec, value: object) -> bool:
    """Whether the URL ``value`` points where ``spec`` allows (see the module docstring)."""
    if not isinstance(value, str) or not 0 < len(value) <= MAX_URL_CHARS or "\\" in value:
        return False
    if not value.isprintable() or any(c.isspace() for c in value):
        return False
    try:
        parts = urlsplit(value)
    except ValueError:
        return False
    scheme, netloc = parts.scheme.lower(), parts.netloc
    if scheme not in spec.schemes or not netloc or "@" in netloc or netloc.startswith("["):
        return False
    host_text, _, port_text = netloc.partition(":")
    host = normal_host(host_text)
    if host is None or host not in spec.hosts or not value.replace(host_text, "", 1).isascii():
        return False
    if port_text:
        if not (port_text.isascii() and port_text.isdigit() and len(port_text) <= 5):
            return False
        port = int(port_text)
        if port != DEFAULT_PORTS[scheme] and port not in spec.ports:
            return False
    path = parts.path or "/"
    if not path_is_plain(path):
        return False
    if spec.path_prefixes:
        decoded = _decoded(path) or ""
        return any(under(path, prefix) and under(decoded, prefix) for prefix in spec.path_prefixes)
    return True
