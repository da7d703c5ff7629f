"""The gateway's own pages over a merged list: offset cursors it made, anything else refused.

The merged lists have no upstream cursor to pass on, so the gateway pages them itself; kept apart
from the dispatcher so the cursor format lives in one place.
"""

from __future__ import annotations

import base64
import binascii

from satgate_mcp import jsonrpc
from satgate_mcp.errors import GatewayError
from satgate_mcp.jsonrpc import JsonObj

TOOLS_PAGE_SIZE = 500
#: Merged resources, templates and prompts are paged like tools, by the gateway's own cursors.
LIST_PAGE_SIZE = TOOLS_PAGE_SIZE


def invalid_cursor() -> GatewayError:
    return GatewayError("Invalid cursor", {"error": "invalid_cursor"}, code=jsonrpc.INVALID_PARAMS)


def encode_cursor(offset: int) -> str:
    return base64.urlsafe_b64encode(f"o:{offset}".encode()).decode()


def decode_cursor(cursor: object) -> int:
    """Our own opaque cursors only; anything else is invalid params."""
    if cursor is None:
        return 0
    try:
        text = base64.urlsafe_b64decode(str(cursor).encode()).decode()
        if text.startswith("o:") and int(text[2:]) >= 0:
            return int(text[2:])
    except (ValueError, binascii.Error, UnicodeDecodeError):
        pass
    raise invalid_cursor()


def page(items: list[JsonObj], cursor: object, size: int = TOOLS_PAGE_SIZE) -> tuple[list[JsonObj], str | None]:
    start = decode_cursor(cursor)
    end = start + size
    return items[start:end], (encode_cursor(end) if end < len(items) else None)
