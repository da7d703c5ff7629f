"""The direct baseline: the echo tool on the official SDK's low-level ``Server``, in its fastest honest shape.

Plain handlers, JSON answers, stateful sessions, uvicorn on uvloop with httptools: what a server author who
cared about speed would deploy. The gateway is measured against this, not against the test upstream (which
answers over SSE and carries every test tool), so a ratio says what the gateway costs a fast server.
Run as ``python -m bench.direct --port N``; prints ``READY <url>`` once it accepts connections.
"""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

import uvicorn
from mcp import types
from mcp.server.lowlevel import Server

HOST = "127.0.0.1"
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


async def serve(port: int) -> None:
    app = build_server().streamable_http_app(host=HOST, json_response=True)
    config = uvicorn.Config(app, host=HOST, port=port, loop="uvloop", http="httptools", lifespan="on",
                            log_level="warning", access_log=False)
    server = uvicorn.Server(config)
    serving = asyncio.create_task(server.serve())
    while not server.started:
        if serving.done():
            await serving
            raise SystemExit("direct: the HTTP server failed to start")
        await asyncio.sleep(0.01)
    print(f"READY http://{HOST}:{port}/mcp", flush=True)
    await serving


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    asyncio.run(serve(parser.parse_args().port))


if __name__ == "__main__":
    main()
