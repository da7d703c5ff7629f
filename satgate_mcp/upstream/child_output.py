"""What a stdio child writes on stdout, read within a bound: a line is a message, or it is dropped and said so.

A line longer than ``LINE_LIMIT`` is read to its end and discarded, keeping only its first bytes: memory stays
bounded whatever the child writes. A line that is not JSON is dropped too. Either way, when the first bytes name
the id of a call waiting for its answer (JSON-RPC writers put ``"id"`` right after ``"jsonrpc"``), that call gets
an error at once instead of waiting for its timeout.
"""

from __future__ import annotations

import asyncio
import json
import re
from dataclasses import dataclass
from typing import Any

from satgate_mcp import jsonrpc
from satgate_mcp.jsonrpc import JsonObj

#: The longest line a child may write (the StreamReader's buffer bound as well).
LINE_LIMIT = 32 * 1024 * 1024
#: The first bytes of a dropped line that are kept: enough to hold a reply's id.
HEAD_BYTES = 256
_REPLY_ID = re.compile(rb'\A\s*\{\s*(?:"jsonrpc"\s*:\s*"2\.0"\s*,\s*)?"id"\s*:\s*(-?[0-9]{1,18})\s*[,}]')


@dataclass(frozen=True, slots=True)
class Dropped:
    """A line that could not be taken: why (``too_long`` or ``not_json``) and its first bytes."""

    reason: str
    head: bytes


async def read_line(reader: asyncio.StreamReader) -> bytes | Dropped | None:
    """The next line (None at the end of the output); an over-long one is discarded to its end, its head kept."""
    try:
        return await reader.readuntil(b"\n")
    except asyncio.IncompleteReadError as end:
        return end.partial or None  # the last line, without its newline
    except asyncio.LimitOverrunError as over:
        head = await reader.read(min(over.consumed, HEAD_BYTES))
        await _discard_line(reader, over.consumed - len(head))
        return Dropped("too_long", head)


async def _discard_line(reader: asyncio.StreamReader, buffered: int) -> None:
    """Read past the rest of an over-long line without holding it: what is buffered, then up to its newline."""
    while True:
        if buffered > 0:
            await reader.readexactly(buffered)
        try:
            await reader.readuntil(b"\n")
            return
        except asyncio.IncompleteReadError:
            return
        except asyncio.LimitOverrunError as over:
            buffered = over.consumed


def parse_line(line: bytes) -> Any | Dropped | None:
    """The JSON value of a line (None for a blank one); invalid UTF-8 is read with replacement characters."""
    raw = line.strip()
    if not raw:
        return None
    try:
        return jsonrpc.loads(raw)  # orjson on the bytes as read; exact for what it would round
    except ValueError:
        try:
            return json.loads(line.decode("utf-8", errors="replace"))
        except ValueError:
            return Dropped("not_json", raw[:HEAD_BYTES])


def answered_id(head: bytes) -> int | None:
    """The id a dropped reply answers, when its first bytes say it plainly; None otherwise."""
    found = _REPLY_ID.match(head)
    return int(found.group(1)) if found is not None else None


def unreadable_reply(request_id: int, upstream: str, dropped: Dropped) -> JsonObj:
    """What the call a dropped reply answered gets: an error naming the upstream and why."""
    why = "longer than the gateway reads" if dropped.reason == "too_long" else "not JSON"
    return jsonrpc.error_response(request_id, jsonrpc.INTERNAL_ERROR, f"upstream {upstream!r} answered with a line "
                                  f"{why}", {"error": "upstream_answer_unreadable", "upstream": upstream,
                                             "reason": dropped.reason})
