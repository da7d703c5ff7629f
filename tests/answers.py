"""Reading a JSON-RPC answer the way a client does: a JSON body, or the answer event of an SSE stream.

A 2025 session that accepts ``text/event-stream`` gets every answer as a stream; tests that care
about the answer, not its framing, read both through here.
"""

from __future__ import annotations

import json
from typing import Any

from aiohttp import ClientResponse

from satgate_mcp.upstream.wire import SseDecoder


def stream_messages(body: str | bytes) -> list[Any]:
    """Every JSON message an SSE body carries, in order (priming events and comments carry none)."""
    raw = body.encode() if isinstance(body, str) else body
    return [json.loads(event.data) for event in SseDecoder().feed(raw + b"\n\n") if event.data.strip()]


def is_answer(message: Any) -> bool:
    """A JSON-RPC response (result or error), not a notification or a request to the client."""
    return isinstance(message, dict) and "method" not in message and ("result" in message or "error" in message)


def decode_answer(content_type: str, body: str | bytes) -> Any:
    """The answer in a body: the JSON value itself, or a stream's answer event (None for an empty body)."""
    if content_type == "text/event-stream":
        answers = [m for m in stream_messages(body) if is_answer(m)]
        assert len(answers) <= 1, f"a call's stream carries one answer, got {answers}"
        return answers[0] if answers else None
    return json.loads(body) if body else None


async def read_answer(resp: ClientResponse) -> Any:
    return decode_answer(resp.content_type, await resp.read())
