"""A tiny stdio MCP server for trying the gateway: ``python -m satgate_mcp.demo``.

It has no dependencies beyond the standard library, so a fresh install can show tools at once.
Real deployments point SATGATE_UPSTREAMS at real MCP servers instead.
"""

from __future__ import annotations

import datetime
import json
import sys
from typing import Any

PROTOCOL_VERSION = "2025-06-18"
TOOLS: list[dict[str, Any]] = [
    {"name": "echo", "description": "Returns the text it is given.",
     "inputSchema": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}},
    {"name": "add", "description": "Adds two numbers.",
     "inputSchema": {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
                     "required": ["a", "b"]}},
    {"name": "utc_now", "description": "The current UTC time, ISO 8601.",
     "inputSchema": {"type": "object", "properties": {}}},
]


def _text(value: object) -> dict[str, Any]:
    return {"content": [{"type": "text", "text": str(value)}], "isError": False}


def call_tool(name: str, args: dict[str, Any]) -> dict[str, Any]:
    if name == "echo":
        return _text(args.get("text", ""))
    if name == "add":
        return _text(float(args.get("a", 0)) + float(args.get("b", 0)))
    if name == "utc_now":
        return _text(datetime.datetime.now(datetime.UTC).isoformat())
    raise KeyError(name)


def handle(message: dict[str, Any]) -> dict[str, Any] | None:
    method, msg_id, params = message.get("method"), message.get("id"), message.get("params") or {}
    if msg_id is None or method is None:
        return None  # notifications and responses need no answer
    result: dict[str, Any]
    if method == "initialize":
        result = {"protocolVersion": PROTOCOL_VERSION, "capabilities": {"tools": {}},
                  "serverInfo": {"name": "satgate-demo", "version": "1.0"}}
    elif method == "ping":
        result = {}
    elif method == "tools/list":
        result = {"tools": TOOLS}
    elif method == "tools/call":
        try:
            result = call_tool(str(params.get("name")), params.get("arguments") or {})
        except (KeyError, TypeError, ValueError) as exc:
            return {"jsonrpc": "2.0", "id": msg_id, "error": {"code": -32602, "message": f"bad call: {exc}"}}
    else:
        return {"jsonrpc": "2.0", "id": msg_id, "error": {"code": -32601, "message": f"no method {method}"}}
    return {"jsonrpc": "2.0", "id": msg_id, "result": result}


def main() -> None:
    for line in sys.stdin:
        try:
            message = json.loads(line)
        except ValueError:
            continue
        reply = handle(message) if isinstance(message, dict) else None
        if reply is not None:
            sys.stdout.write(json.dumps(reply) + "\n")
            sys.stdout.flush()


if __name__ == "__main__":
    main()
