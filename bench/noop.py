"""The harness's ceiling: an HTTP server that answers every MCP request with a canned JSON-RPC answer.

No MCP library, no session kept, no work: what the load generator and the loopback can carry on this
machine. A server measured near this figure is limited by the harness, not by itself. uvicorn on uvloop
with httptools, as the direct baseline, so the two differ only by the MCP server's own work.
Run as ``python -m bench.noop --port N``; prints ``READY <url>`` once it accepts connections.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import orjson

from bench.asgi import run

SESSION = b"noop-session"
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


def answer(message: Any) -> bytes | None:
    """The canned answer to one request (None for a notification): initialize, echo, else an empty result."""
    if not isinstance(message, dict) or "id" not in message:
        return None
    params = message.get("params") or {}
    if message.get("method") == "initialize":
        result: dict[str, Any] = {"protocolVersion": params.get("protocolVersion", "2025-11-25"),
                                  "capabilities": {"tools": {}}, "serverInfo": {"name": "noop", "version": "1"}}
    elif message.get("method") == "tools/call":
        text = str((params.get("arguments") or {}).get("text", ""))
        result = {"content": [{"type": "text", "text": text}], "isError": False}
    else:
        result = {}
    return orjson.dumps({"jsonrpc": "2.0", "id": message["id"], "result": result})


async def app(scope: dict[str, Any], receive: Receive, send: Send) -> None:
    if scope["type"] != "http":
        return
    body = b""
    while True:
        event = await receive()
        body += event.get("body", b"")
        if not event.get("more_body"):
            break
    reply = answer(orjson.loads(body)) if scope["method"] == "POST" and body else None
    headers = [(b"mcp-session-id", SESSION)]
    if reply is None:
        await send({"type": "http.response.start", "status": 202, "headers": headers})
        await send({"type": "http.response.body", "body": b""})
        return
    headers.append((b"content-type", b"application/json"))
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": reply})


def main() -> None:
    run(app, name="noop", description=__doc__.splitlines()[0], lifespan="off")


if __name__ == "__main__":
    main()
