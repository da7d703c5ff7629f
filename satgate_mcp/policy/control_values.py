"""The values tool controls hold: argument names, decimals, time zones, URL specs and host names, checked strictly.

Decimals are text (``"200"``, ``"10.5"``) read as ``Decimal`` with bounded digits, so they compare and sum
exactly and fit the stores' integer micro-units (``MICROS``). Host names are compared in one normal form: IDNA
A-labels, lower case, no trailing dot; a non-ASCII label that IDNA maps to plain ASCII (full-width letters)
is a disguise and is refused, and so is anything but letters, digits and hyphens.
"""

from __future__ import annotations

import encodings.idna
import re
import string
from dataclasses import dataclass
from decimal import Decimal
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

#: Values in ``one_of``, hosts, ports, path prefixes, confirm fields: at most this many in one entry.
MAX_LIST = 64
MAX_FIELD_CHARS = 128
MAX_VALUE_CHARS = 256
MAX_MESSAGE_CHARS = 500
#: Amounts: at most 12 digits before the point and 6 after, so any total fits a signed 64-bit count of micro-units.
INTEGER_DIGITS, FRACTION_DIGITS = 12, 6
MICROS = 10**FRACTION_DIGITS
_DECIMAL_RE = re.compile(rf"-?[0-9]{{1,{INTEGER_DIGITS}}}(?:\.[0-9]{{1,{FRACTION_DIGITS}}})?")
_ZONE_CHARS = string.ascii_letters + string.digits + "_+-/"
_LABEL_RE = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?")
#: Characters IDNA reads as a label separator besides ``.``: a host spelled with them is refused outright.
_OTHER_DOTS = ("\u3002", "\uff0e", "\uff61")
SCHEMES = ("https", "http")
DEFAULT_PORTS = {"https": 443, "http": 80}


def check_field(value: object, where: str) -> str:
    """A top-level argument name: a non-empty printable string of bounded length."""
    if not isinstance(value, str) or not 0 < len(value) <= MAX_FIELD_CHARS or not value.isprintable():
        raise ValueError(f"{where}: 'field' must be an argument name (1 to {MAX_FIELD_CHARS} printable characters)")
    return value


def check_message(value: object, where: str) -> str:
    if not isinstance(value, str) or not 0 < len(value) <= MAX_MESSAGE_CHARS or not value.isprintable():
        raise ValueError(f"{where}: 'message' must be 1 to {MAX_MESSAGE_CHARS} printable characters")
    return value


def check_zone(value: object, where: str) -> str:
    """An IANA time zone name this machine knows (``America/New_York``, ``UTC``)."""
    ok = (isinstance(value, str) and 0 < len(value) <= 64 and not value.strip(_ZONE_CHARS)
          and not value.startswith("/") and ".." not in value)
    if ok:
        assert isinstance(value, str)
        try:
            ZoneInfo(value)
            return value
        except (ZoneInfoNotFoundError, ValueError, OSError):
            pass
    raise ValueError(f"{where}: 'tz' must be a known IANA time zone such as 'America/New_York'")


def parse_decimal(text: str) -> Decimal | None:
    """``text`` as a bounded decimal, or None when it is not one (no exponent, no spaces, no ``NaN``)."""
    return Decimal(text) if _DECIMAL_RE.fullmatch(text) else None


def parse_amount_spec(value: object, where: str, *, signed: bool = False) -> Decimal:
    """A decimal string of a control (``"200"``, ``"10.5"``); a JSON number is refused: amounts are text."""
    number = parse_decimal(value) if isinstance(value, str) else None
    if number is None or (number < 0 and not signed):
        rule = "" if signed else "non-negative "
        raise ValueError(f"{where}: expected a {rule}decimal string such as \"200\" or \"10.5\" "
                         f"(at most {INTEGER_DIGITS} digits before the point and {FRACTION_DIGITS} after)")
    return number


def decimal_text(number: Decimal) -> str:
    """The one spelling of ``number``: no exponent, no trailing zeros (``10.50`` -> ``10.5``)."""
    if number == 0:
        return "0"
    return format(number.normalize(), "f")


def number_of(value: object) -> Decimal | None:
    """An argument as an exact decimal: an integer, a finite float (by its shortest spelling) or a decimal string;
    None for anything else (a boolean, an exponent, more than 6 decimals, more than 12 digits before the point)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return parse_decimal(str(value)) if abs(value) < 10**13 else None
    if isinstance(value, float):
        return parse_decimal(repr(value)) if value == value and abs(value) < 1e13 else None
    if isinstance(value, str) and len(value) <= 32:
        return parse_decimal(value)
    return None


def micros(number: Decimal) -> int:
    """``number`` in micro-units, exactly (a bounded decimal has at most 6 fraction digits)."""
    return int(number * MICROS)


def parse_one_of(value: object, where: str) -> tuple[str | int | bool | None, ...]:
    """Allowed values: strings, integers, booleans or null, compared by type and value."""
    if not isinstance(value, list) or not value or len(value) > MAX_LIST:
        raise ValueError(f"{where}: 'one_of' must be a list of 1 to {MAX_LIST} values")
    for item in value:
        if isinstance(item, str) and len(item) > MAX_VALUE_CHARS:
            raise ValueError(f"{where}: a 'one_of' string is longer than {MAX_VALUE_CHARS} characters")
        if not (item is None or isinstance(item, str | bool) or (type(item) is int and abs(item) < 10**15)):
            raise ValueError(f"{where}: 'one_of' holds strings, integers, booleans or null")
    return tuple(value)


# --- host names and URL specs -------------------------------------------------------------------


def normal_host(text: str) -> str | None:
    """The host name ``text`` in normal form, or None when it is not a plain DNS name (or IPv4 address).

    A non-ASCII label becomes its IDNA A-label; one that IDNA maps to plain ASCII is refused (full-width
    letters spelling an allowed name). Only letters, digits and inner hyphens pass: no ``%``, ``@``, ``\\``,
    ``_``, spaces, brackets or dots other than ``.``.
    """
    if not text or len(text) > 253 or any(dot in text for dot in _OTHER_DOTS):
        return None
    host = text[:-1] if text.endswith(".") else text
    labels = []
    for label in host.split("."):
        if not label.isascii():
            try:
                label = encodings.idna.ToASCII(label).decode("ascii")
            except UnicodeError:
                return None
            if not label.startswith("xn--"):
                return None
        label = label.lower()
        if not _LABEL_RE.fullmatch(label):
            return None
        labels.append(label)
    return ".".join(labels)


@dataclass(frozen=True, slots=True)
class UrlSpec:
    """Where a URL argument may point: one of ``hosts`` (exact names), a ``ports`` entry or the scheme's
    default port, a path under one of ``path_prefixes`` (none: any path), a scheme of ``schemes``."""

    hosts: tuple[str, ...]
    ports: tuple[int, ...] = ()
    path_prefixes: tuple[str, ...] = ()
    schemes: tuple[str, ...] = ("https",)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"hosts": list(self.hosts), "schemes": list(self.schemes)}
        if self.ports:
            out["ports"] = list(self.ports)
        if self.path_prefixes:
            out["path_prefixes"] = list(self.path_prefixes)
        return out


def _strings(spec: dict[str, Any], key: str, where: str) -> list[str]:
    items = spec.get(key, [])
    if not isinstance(items, list) or len(items) > MAX_LIST or not all(isinstance(i, str) for i in items):
        raise ValueError(f"{where}: 'url.{key}' must be a list of at most {MAX_LIST} strings")
    return items


def _path_prefix(prefix: str, where: str) -> str:
    ok = (prefix.startswith("/") and len(prefix) <= MAX_VALUE_CHARS and prefix.isascii() and prefix.isprintable()
          and not any(c in prefix for c in "%\\?# ") and not {".", ".."} & set(prefix.split("/")))
    if not ok:
        raise ValueError(f"{where}: a path prefix starts with '/' and has no '%', '\\', '?', '#', spaces or dot "
                         "segments")
    return prefix


def parse_url_spec(value: object, where: str) -> UrlSpec:
    if not isinstance(value, dict):
        raise ValueError(f"{where}: 'url' must be an object with 'hosts' (and 'ports', 'path_prefixes', 'schemes')")
    unknown = sorted(set(value) - {"hosts", "ports", "path_prefixes", "schemes"})
    if unknown:
        raise ValueError(f"{where}: unknown key 'url.{unknown[0][:40]}'")
    hosts = []
    for host in _strings(value, "hosts", where):
        normal = normal_host(host)
        if normal is None:
            raise ValueError(f"{where}: {host[:100]!r} is not a host name (letters, digits, hyphens; IDNA allowed)")
        hosts.append(normal)
    if not hosts:
        raise ValueError(f"{where}: 'url.hosts' must name at least one host")
    ports = value.get("ports", [])
    if not isinstance(ports, list) or len(ports) > MAX_LIST or not all(
            type(p) is int and 0 < p < 65536 for p in ports):
        raise ValueError(f"{where}: 'url.ports' must be a list of port numbers")
    schemes = _strings(value, "schemes", where) or ["https"]
    if not set(schemes) <= set(SCHEMES):
        raise ValueError(f"{where}: 'url.schemes' may hold 'https' and 'http' only")
    prefixes = tuple(_path_prefix(p, where) for p in _strings(value, "path_prefixes", where))
    return UrlSpec(tuple(dict.fromkeys(hosts)), tuple(dict.fromkeys(ports)), prefixes, tuple(dict.fromkeys(schemes)))
