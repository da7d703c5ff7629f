"""Session ids bound to the token that opened them (DESIGN.md section 3).

Kept apart from the registry because they are pure functions of a token and random bytes: the
transport checks a header's syntax with them, and any process can tell whether an id it never
made was made for the presented token (the basis of resume).
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets

_ID_RE = re.compile(r"^mcp-([0-9a-f]{32})-([0-9a-f]{32})$")


def session_tag(token: str, random_hex: str) -> str:
    """First 16 bytes of HMAC-SHA256(key=SHA-256(token), msg=random part), as hex (DESIGN.md section 3)."""
    key = hashlib.sha256(token.encode("utf-8")).digest()
    return hmac.new(key, random_hex.encode("ascii"), hashlib.sha256).digest()[:16].hex()


def make_session_id(token: str, random_hex: str | None = None) -> str:
    rnd = random_hex if random_hex is not None else secrets.token_bytes(16).hex()
    return f"mcp-{rnd}-{session_tag(token, rnd)}"


def session_id_matches_token(session_id: str, token: str) -> bool:
    """True only for a well-formed id whose tag was made with this token; untagged ids never match."""
    m = _ID_RE.fullmatch(session_id)
    if m is None:
        return False
    return hmac.compare_digest(session_tag(token, m.group(1)), m.group(2))


def is_valid_session_id_syntax(value: str) -> bool:
    """The spec allows visible ASCII only; anything else is a malformed header (400), not an unknown id."""
    # 0x21-0x7E: printable ASCII without the space, checked in C (a per-character loop cost microseconds).
    return 0 < len(value) <= 256 and value.isascii() and value.isprintable() and " " not in value
