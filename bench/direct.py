"""The direct baseline: the echo tool on the official SDK's low-level ``Server``, in its fastest honest shape.

Plain handlers, JSON answers, stateful sessions, uvicorn on uvloop with httptools: what a server author who
cared about speed would deploy. The gateway is measured against this, not against the test upstream (which
answers over SSE and carries every test tool), so a ratio says what the gateway costs a fast server.
Run as ``python -m bench.direct --port N``; prints ``READY <url>`` once it accepts connections. ``--stdio`` serves the
same server over stdin and stdout instead: the upstream the gateway fronts in ``--compare``, so both sides of the
comparison run the same program.
"""

from __future__ import annotations

import sys
from typing import Any

import anyio
from mcp import types
from mcp.server.lowlevel import Server

from bench.asgi import HOST, run

ECHO_TOOL = {"name": "echo", "inputSchema": {"type": "object", "properties": {"text": {"type": "string"}},
                                              "required": ["text"]}}
#: The answer path with a progress notification (``--compare``'s SSE phase): ``steps`` notifications, then done.
SLOW_TOOL = {"name": "slow", "inputSchema": {"type": "object", "properties": {"steps": {"type": "integer"},
                                                                              "delay": {"type": "number"}}}}
TOOLS = types.ListToolsResult.model_validate({"tools": [ECHO_TOOL, SLOW_TOOL]})


def build_server() -> Server[Any]:
    async def list_tools(ctx: Any, params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
        return TOOLS

    async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        arguments = params.arguments or {}
        if params.name == "slow":
            steps = int(arguments.get("steps", 1))
            for step in range(1, steps + 1):
                await anyio.sleep(float(arguments.get("delay", 0)))
                await ctx.session.report_progress(step, steps, f"step {step}")
            text = f"done {steps}"
            return types.CallToolResult(content=[types.TextContent(type="text", text=text)], is_error=False)
        text = str(arguments.get("text", ""))
        return types.CallToolResult(content=[types.TextContent(type="text", text=text)], is_error=False)

    return Server("direct", version="1.0.0", on_list_tools=list_tools, on_call_tool=call_tool)


async def serve_stdio() -> None:
    from mcp.server.stdio import stdio_server

    server = build_server()
    async with stdio_server() as (read_stream, write_stream):
        await server.run(read_stream, write_stream, server.create_initialization_options())


def main() -> None:
    if sys.argv[1:] == ["--stdio"]:
        anyio.run(serve_stdio)
        return
    app = build_server().streamable_http_app(host=HOST, json_response=True)
    run(app, name="direct", description=__doc__.splitlines()[0], lifespan="on")


if __name__ == "__main__":
    main()
