"""A small but real MCP server, built on the official ``mcp`` SDK, that the test suite runs as an upstream.

Run it as a stdio child (``python tests/upstream_server.py stdio``) or as a Streamable HTTP server
(``python tests/upstream_server.py http --port P``; it prints ``READY <url>`` on stdout once it
accepts connections). Its tools exist to exercise the gateway: progress (``slow``), timeouts and
cancellation (``hang``, ``cancelled_count``), crashes (``crash``), credential stripping
(``headers``, ``seen_meta``), ``notifications/tools/list_changed`` (``add_tool``) and
server-to-client requests (``ask_client``). ``--prefix`` renames the tools and the prompt so two
servers can advertise clashing or distinct names; ``--many-tools N`` adds N tools and makes
``tools/list`` paginate.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import anyio
import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.server.lowlevel.server import NotificationOptions
from mcp.server.models import InitializationOptions

JsonObj = dict[str, Any]


def _text(value: str) -> JsonObj:
    return {"content": [{"type": "text", "text": value}], "isError": False}


def _schema(**props: str) -> JsonObj:
    return {
        "type": "object",
        "properties": {name: {"type": kind} for name, kind in props.items()},
        "required": list(props),
    }


#: Base tool name -> input schema. ``--prefix`` is prepended to every name.
BASE_TOOLS: dict[str, JsonObj] = {
    "echo": _schema(text="string"),
    "add": _schema(a="number", b="number"),
    "slow": {"type": "object", "properties": {"steps": {"type": "integer"}, "delay": {"type": "number"}}},
    "hang": _schema(),
    "cancelled_count": _schema(),
    "crash": _schema(),
    "headers": _schema(),
    "seen_meta": _schema(),
    "whoami": _schema(),
    "add_tool": {"type": "object", "properties": {"name": {"type": "string"}, "standalone": {"type": "boolean"}}},
    "ask_client": _schema(method="string"),
}


# --- stream_: what reaches a client's standalone GET stream (list changes, resource updates) ----------

STREAM_TOOLS: dict[str, JsonObj] = {
    "stream_touch": _schema(uri="string"),
    "stream_add_resources": _schema(count="integer"),
    "stream_add_prompt": _schema(name="string"),
    "stream_subscribed": _schema(),
}
BASE_TOOLS.update(STREAM_TOOLS)


@dataclass
class StreamExtras:
    """Resources and prompts added at run time, and the URIs a client is subscribed to here."""

    resources: list[JsonObj] = field(default_factory=list)
    prompts: list[JsonObj] = field(default_factory=list)
    subscribed: list[str] = field(default_factory=list)


STREAM = StreamExtras()


async def run_stream_tool(name: str, ctx: ServerRequestContext[Any], tool: str, args: JsonObj) -> JsonObj:
    """Each sends its notification outside the call (over HTTP: on the GET stream), as a server on its own would."""
    if tool == "stream_touch":
        await ctx.session.send_resource_updated(str(args.get("uri", "")))
        return _text("touched")
    if tool == "stream_add_resources":
        start = len(STREAM.resources)
        STREAM.resources += [{"uri": f"memo://{name}/extra/{i}", "name": f"{name}-extra-{i}"}
                             for i in range(start, start + int(args.get("count", 1)))]
        await ctx.session.send_resource_list_changed()
        return _text(f"{len(STREAM.resources)} extra resources")
    if tool == "stream_add_prompt":
        STREAM.prompts.append({"name": str(args.get("name", "extra_prompt")), "description": f"added on {name}"})
        await ctx.session.send_prompt_list_changed()
        return _text("prompt added")
    return _text(json.dumps(sorted(STREAM.subscribed)))


@dataclass
class State:
    name: str
    prefix: str
    page_size: int
    tools: list[str] = field(default_factory=list)
    cancelled: list[Any] = field(default_factory=list)
    hang_interrupted: int = 0

    def tool_defs(self) -> list[JsonObj]:
        out = []
        for full in self.tools:
            base = full.removeprefix(self.prefix)
            schema = BASE_TOOLS.get(base, _schema())
            out.append({"name": full, "description": f"{base} on {self.name}", "inputSchema": schema})
        return out


def _page(items: list[JsonObj], cursor: str | None, size: int, key: str) -> JsonObj:
    """Pagination with the offset as the opaque cursor; size 0 means one page."""
    start = int(cursor) if cursor and cursor.isdigit() else 0
    if size <= 0:
        return {key: items}
    page: JsonObj = {key: items[start : start + size]}
    if start + size < len(items):
        page["nextCursor"] = str(start + size)
    return page


class _Server(Server[Any]):
    """Advertises ``listChanged`` for tools, resources and prompts on every transport (the HTTP manager passes
    no options)."""

    def create_initialization_options(
        self,
        notification_options: NotificationOptions | None = None,
        experimental_capabilities: dict[str, dict[str, Any]] | None = None,
        extensions: dict[str, dict[str, Any]] | None = None,
    ) -> InitializationOptions:
        return super().create_initialization_options(
            notification_options or NotificationOptions(tools_changed=True, resources_changed=True,
                                                        prompts_changed=True),
            experimental_capabilities, extensions
        )


def build_server(state: State) -> Server[Any]:
    async def list_tools(
        ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        page = _page(state.tool_defs(), params.cursor if params else None, state.page_size, "tools")
        return types.ListToolsResult.model_validate(page)

    async def call_tool(ctx: ServerRequestContext[Any], params: types.CallToolRequestParams) -> types.CallToolResult:
        return types.CallToolResult.model_validate(await run_tool(ctx, params))

    async def run_tool(ctx: ServerRequestContext[Any], params: types.CallToolRequestParams) -> JsonObj:
        if params.name not in state.tools:
            return {"content": [{"type": "text", "text": f"unknown tool {params.name}"}], "isError": True}
        tool = params.name.removeprefix(state.prefix)
        args = params.arguments or {}
        if tool == "echo":
            return _text(str(args.get("text", "")))
        if tool == "add":
            return _text(str(args.get("a", 0) + args.get("b", 0)))
        if tool == "slow":
            steps, delay = int(args.get("steps", 3)), float(args.get("delay", 0.01))
            for i in range(1, steps + 1):
                await anyio.sleep(delay)
                await ctx.session.report_progress(i, steps, f"step {i}")
            return _text(f"done {steps}")
        if tool == "hang":
            try:
                await anyio.sleep_forever()
            finally:
                state.hang_interrupted += 1
        if tool == "cancelled_count":
            return _text(json.dumps({"cancelled": len(state.cancelled), "request_ids": state.cancelled,
                                     "hang_interrupted": state.hang_interrupted}))
        if tool == "crash":
            os._exit(3)
        if tool == "headers":
            headers: Mapping[str, str] = getattr(ctx.request, "headers", None) or {}
            return _text(json.dumps({k.lower(): v for k, v in headers.items()}))
        if tool == "seen_meta":
            raw = dict(ctx.params or {})
            return _text(json.dumps(raw.get("_meta")))
        if tool == "whoami":
            return _text(state.name)
        if tool in STREAM_TOOLS:
            return await run_stream_tool(state.name, ctx, tool, args)
        if tool == "add_tool":
            new = str(args.get("name", "extra"))  # as given: a test may add a clashing name
            if new not in state.tools:
                state.tools.append(new)
            if args.get("standalone"):
                # Over Streamable HTTP this goes to the GET stream, not this call's response.
                await ctx.session.send_tool_list_changed()
            else:
                # Request-scoped, so over Streamable HTTP it rides this call's SSE response.
                await ctx.session.send_notification(types.ToolListChangedNotification(), ctx.request_id)
            return _text(f"added {new}")
        if tool == "ask_client":
            method = str(args.get("method", "ping"))
            try:
                if method == "ping":
                    await ctx.session.send_ping()
                    return _text("pong")
                await ctx.session.list_roots()
                return _text("roots answered")
            except Exception as exc:  # the client's JSON-RPC error is the answer we want to show
                return _text(f"error: {exc}")
        return _text(f"{tool} called")

    async def list_resources(
        ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListResourcesResult:
        res = [{"uri": f"memo://{state.name}/readme", "name": f"{state.name}-readme", "mimeType": "text/plain"}]
        res += STREAM.resources
        return types.ListResourcesResult.model_validate({"resources": res})

    async def list_templates(
        ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListResourceTemplatesResult:
        templates = [{"uriTemplate": f"memo://{state.name}/notes/{{id}}", "name": f"{state.name}-notes"}]
        return types.ListResourceTemplatesResult.model_validate({"resourceTemplates": templates})

    async def read_resource(
        ctx: ServerRequestContext[Any], params: types.ReadResourceRequestParams
    ) -> types.ReadResourceResult:
        uri = str(params.uri)
        if not uri.startswith(f"memo://{state.name}/"):
            raise ValueError(f"no resource {uri}")
        text = f"hello from {state.name}: {uri}"
        return types.ReadResourceResult.model_validate({"contents": [{"uri": uri, "text": text}]})

    async def subscribe(ctx: ServerRequestContext[Any], params: types.SubscribeRequestParams) -> types.EmptyResult:
        STREAM.subscribed.append(str(params.uri))
        return types.EmptyResult()

    async def unsubscribe(ctx: ServerRequestContext[Any], params: types.UnsubscribeRequestParams
                          ) -> types.EmptyResult:
        if str(params.uri) in STREAM.subscribed:
            STREAM.subscribed.remove(str(params.uri))
        return types.EmptyResult()

    async def list_prompts(
        ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListPromptsResult:
        prompt = {"name": f"{state.prefix}greet", "description": f"greeting from {state.name}",
                  "arguments": [{"name": "who", "required": True}]}
        return types.ListPromptsResult.model_validate({"prompts": [prompt, *STREAM.prompts]})

    async def get_prompt(ctx: ServerRequestContext[Any], params: types.GetPromptRequestParams) -> types.GetPromptResult:
        who = (params.arguments or {}).get("who", "world")
        message = {"role": "user", "content": {"type": "text", "text": f"{state.name} greets {who}"}}
        return types.GetPromptResult.model_validate({"messages": [message]})

    async def complete(ctx: ServerRequestContext[Any], params: types.CompleteRequestParams) -> types.CompleteResult:
        values = [f"{state.name}-{params.argument.value}"]
        return types.CompleteResult.model_validate({"completion": {"values": values, "hasMore": False}})

    async def on_cancelled(ctx: ServerRequestContext[Any], params: types.CancelledNotificationParams) -> None:
        state.cancelled.append(params.request_id)

    server = _Server(
        state.name,
        version="1.0.0",
        on_list_tools=list_tools,
        on_call_tool=call_tool,
        on_list_resources=list_resources,
        on_list_resource_templates=list_templates,
        on_read_resource=read_resource,
        on_subscribe_resource=subscribe,
        on_unsubscribe_resource=unsubscribe,
        instructions=f"Tools of the {state.name} test server.",
        on_list_prompts=list_prompts,
        on_get_prompt=get_prompt,
        on_completion=complete,
    )
    server.add_notification_handler("notifications/cancelled", types.CancelledNotificationParams, on_cancelled)
    return server


async def run_stdio(state: State) -> None:
    from mcp.server.stdio import stdio_server

    server = build_server(state)
    options = server.create_initialization_options()
    print(f"{state.name}: stdio server starting", file=sys.stderr, flush=True)
    async with stdio_server() as (read_stream, write_stream):
        await server.run(read_stream, write_stream, options)


async def run_http(state: State, host: str, port: int, json_response: bool) -> None:
    import uvicorn

    server = build_server(state)
    app = server.streamable_http_app(host=host, json_response=json_response)
    config = uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="on")
    web = uvicorn.Server(config)
    serving = asyncio.create_task(web.serve())
    while not web.started:
        if serving.done():
            await serving
            raise SystemExit(f"{state.name}: HTTP server failed to start")
        await asyncio.sleep(0.01)
    bound = web.servers[0].sockets[0].getsockname()[1]
    print(f"READY http://{host}:{bound}/mcp", flush=True)
    await serving


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("mode", choices=["stdio", "http"])
    parser.add_argument("--name", default="upstream")
    parser.add_argument("--prefix", default="", help="prepended to every tool and prompt name")
    parser.add_argument("--many-tools", type=int, default=0, help="add N tools extra_0..extra_N-1")
    parser.add_argument("--page-size", type=int, default=None, help="tools per tools/list page (0 = all)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--json-response", action="store_true", help="HTTP: answer with JSON, not SSE")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    page_size = args.page_size if args.page_size is not None else (10 if args.many_tools else 0)
    state = State(name=args.name, prefix=args.prefix, page_size=page_size)
    state.tools = [args.prefix + t for t in BASE_TOOLS] + [f"{args.prefix}extra_{i}" for i in range(args.many_tools)]
    if args.mode == "stdio":
        asyncio.run(run_stdio(state))
    else:
        asyncio.run(run_http(state, args.host, args.port, args.json_response))


if __name__ == "__main__":
    main()
