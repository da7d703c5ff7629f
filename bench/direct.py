"""The direct baseline: the echo tool on the official SDK's low-level ``Server``, in its fastest honest shape.

Plain handlers, JSON answers, stateful sessions, uvicorn on uvloop with httptools: what a server author who
cared about speed would deploy. The gateway is measured against this, not against the test upstream (which
answers over SSE and carries every test tool), so a ratio says what the gateway costs a fast server.
Run as ``python -m bench.direct --port N``; prints ``READY <url>`` once it accepts connections.
"""

from __future__ import annotations

from typing import Any

from mcp import types
from mcp.server.lowlevel import Server

from bench.asgi import HOST, run

ECHO_TOOL = {"name": "echo", "inputSchema": {"type": "object", "properties": {"text": {"type": "string"}},
                                              "required": ["text"]}}
TOOLS = types.ListToolsResult.model_validate({"tools": [ECHO_TOOL]})


def build_server() -> Server[Any]:
    async def list_tools(ctx: Any, params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
        return TOOLS

    async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        text = str((params.arguments or {}).get("text", ""))
        return types.CallToolResult(content=[types.TextContent(type="text", text=text)], is_error=False)

    return Server("direct", version="1.0.0", on_list_tools=list_tools, on_call_tool=call_tool)


def main() -> None:
    app = build_server().streamable_http_app(host=HOST, json_response=True)
    run(app, name="direct", description=__doc__.splitlines()[0], lifespan="on")


if __name__ == "__main__":
    main()
