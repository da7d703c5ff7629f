"""A small but real MCP server, built on the official ``mcp`` SDK, that the test suite runs as an upstream.

Run it as a stdio child (``python tests/upstream_server.py stdio``) or as a Streamable HTTP server
(``python tests/upstream_server.py http --port P``; it prints ``READY <url>`` on stdout once it
accepts connections). Its tools exist to exercise the gateway: progress (``slow``), timeouts and
cancellation (``hang``, ``cancelled_count``), crashes (``crash``), credential stripping
(``headers``, ``seen_meta``), ``notifications/tools/list_changed`` (``add_tool``; ``rug_pull`` rewrites another
tool's definition, as an upstream that changes what a pinned tool does would) and
server-to-client requests (``ask_client``). ``--prefix`` renames the tools and the prompt so two
servers can advertise clashing or distinct names; ``--many-tools N`` adds N tools and makes
``tools/list`` paginate. ``--conformance`` adds the tools, resources, prompts, logging and resumable
streams the official MCP conformance suite's server scenarios call (scripts/conformance.py). ``--era``
chooses the revisions it serves: ``2025`` (the handshake only, the default), ``2026`` (2026-07-28 only, also
``--modern-only``) or ``both`` (the SDK's default: the era the client opens with; the default of
``--conformance``); ``seen_era`` answers which era a call came in and which client capabilities it carried.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import io
import json
import os
import re
import struct
import sys
import wave
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, cast

import anyio
import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.server.lowlevel.server import NotificationOptions
from mcp.server.models import InitializationOptions
from mcp.server.streamable_http import EventCallback, EventMessage, EventStore
from mcp.server.subscriptions import (
    InMemorySubscriptionBus,
    ListenHandler,
    PromptsListChanged,
    ResourcesListChanged,
    ResourceUpdated,
    ServerEvent,
    ToolsListChanged,
)
from mcp.shared.message import ServerMessageMetadata

try:  # run as a script (tests/ on the path) or imported as tests.upstream_server
    from upstream_tasks import (  # type: ignore[import-not-found]
        TASK_TOOLS,
        V1_CAPABILITY,
        V1_TASK_TOOLS,
        TaskStore,
        announcer,
        install,
        session_capabilities,
        task_tool_defs,
    )
except ImportError:  # pragma: no cover - the import path depends on how the module is loaded
    from tests.upstream_tasks import (
        TASK_TOOLS,
        V1_CAPABILITY,
        V1_TASK_TOOLS,
        TaskStore,
        announcer,
        install,
        session_capabilities,
        task_tool_defs,
    )

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
    # Process state a restart loses and a handover keeps: the next number, and this process's pid.
    "counter": _schema(),
    "seen_era": _schema(),
    "add_tool": {"type": "object", "properties": {"name": {"type": "string"}, "standalone": {"type": "boolean"}}},
    # Rewrites another tool's definition (a rug pull): the fields given replace that tool's, then list_changed.
    "rug_pull": {"type": "object", "properties": {"tool": {"type": "string"}, "title": {"type": "string"},
                                                  "description": {"type": "string"}, "inputSchema": {"type": "object"},
                                                  "annotations": {"type": "object"}}},
    "ask_client": _schema(method="string"),
}

# --- relay_* tools: an upstream that asks its client things and logs during a call (issue 11) -------------
#: Each asks or tells the client something on the call's own stream (request-scoped), then answers.
RELAY_TOOLS: dict[str, JsonObj] = {
    "relay_elicit": {"type": "object", "properties": {"question": {"type": "string"}}},
    "relay_elicit_url": {"type": "object", "properties": {"url": {"type": "string"}}},
    "relay_sample": {"type": "object", "properties": {"prompt": {"type": "string"}}},
    "relay_roots": _schema(),
    "relay_log": {"type": "object", "properties": {"tag": {"type": "string"}}},
    "relay_log_level": _schema(),
}
RELAY_LOG_LEVELS = ("debug", "info", "warning", "error")

# --- --modern-only: a 2026-07-28 server that knows no handshake (issue 12, upstream side) ----------------------
#: ``mrtr_ask`` answers its first call input_required (an elicitation and a requestState), its retry with the answer.
#: With --governance: tools whose definitions carry annotations (policy rules read them), a GitHub-like family.
GOVERNANCE_TOOLS: dict[str, tuple[JsonObj, JsonObj]] = {
    "github_get_repo": (_schema(repo="string"), {"readOnlyHint": True}),
    "github_delete_repo": (_schema(repo="string"), {"destructiveHint": True, "readOnlyHint": False}),
    "drop_table": (_schema(table="string"), {"destructiveHint": True}),
}
#: With --payments: tools that move money or reach a URL (tool controls, issue 27). ``pay`` appends its arguments to
#: the --ledger file, if given, so a test can count the calls that reached the upstream; ``pay_slow`` waits until
#: ``release_payments`` is called (``waiting_payments`` says how many wait), so a call can be held mid-flight.
PAYMENT_TOOLS: dict[str, JsonObj] = {
    "pay": {"type": "object", "properties": {"amount": {}, "vendor": {"type": "string"}}},
    "pay_slow": {"type": "object", "properties": {"amount": {}}},
    "release_payments": _schema(),
    "waiting_payments": _schema(),
    "fetch": _schema(url="string"),
}
MODERN_TOOLS: dict[str, JsonObj] = {"mrtr_ask": {"type": "object", "properties": {"question": {"type": "string"}}}}


def mrtr_ask(question: str, responses: Mapping[str, Any] | None, request_state: str | None) -> JsonObj:
    """The round's result: input_required until the retry echoes this server's state with an answer."""
    expected = f"upstream-state:{question}"
    answer = (responses or {}).get("ask")
    if answer is None or request_state != expected:
        schema = {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}
        return {"resultType": "input_required", "requestState": expected, "inputRequests": {"ask": {
            "method": "elicitation/create", "params": {"mode": "form", "message": question,
                                                       "requestedSchema": schema}}}}
    dumped = answer.model_dump(by_alias=True, exclude_none=True) if hasattr(answer, "model_dump") else answer
    return _text(json.dumps({"action": dumped.get("action"), "content": dumped.get("content")}, sort_keys=True))
BASE_TOOLS.update(RELAY_TOOLS)


async def run_relay_tool(ctx: ServerRequestContext[Any], tool: str, args: JsonObj, state: State) -> JsonObj:
    """What each relay_* tool does; the client's answer (or its error) is the tool's text."""
    from mcp.shared.exceptions import MCPError
    from mcp.shared.message import ServerMessageMetadata

    related = ctx.request_id
    try:
        if tool == "relay_elicit":
            schema = {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}
            elicited = await ctx.session.elicit_form(str(args.get("question", "why?")), schema, related)
            return _text(json.dumps({"action": elicited.action, "content": elicited.content}))
        if tool == "relay_elicit_url":
            url = str(args.get("url", "https://example.com/consent"))
            elicited = await ctx.session.elicit_url("open this", url, "relay-elicitation-1", related)
            return _text(json.dumps({"action": elicited.action}))
        if tool == "relay_sample":
            message = types.SamplingMessage(role="user",
                                            content=types.TextContent(type="text", text=str(args.get("prompt", ""))))
            sampled = await ctx.session.create_message([message], max_tokens=16, related_request_id=related)
            content = sampled.content
            return _text(content.text if isinstance(content, types.TextContent) else str(content))
        if tool == "relay_roots":
            roots = await ctx.session.send_request(types.ListRootsRequest(), types.ListRootsResult,
                                                   metadata=ServerMessageMetadata(related_request_id=related))
            return _text(json.dumps([str(r.uri) for r in roots.roots]))
        if tool == "relay_log":
            tag = str(args.get("tag", ""))
            for level in RELAY_LOG_LEVELS:
                await ctx.session.send_log_message(level, f"{level} {tag}", "relay", related)  # type: ignore[arg-type]
            return _text("logged")
        if tool == "relay_log_level":
            return _text(str(state.log_level))
    except MCPError as exc:  # the client's (or the gateway's) JSON-RPC error is the answer a test checks
        return _text(f"error: {exc.error.code} {exc.error.message}")
    return _text(f"{tool} called")


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
#: 2026-07-28 has no standing stream: ``--modern-only`` serves ``subscriptions/listen`` from this bus.
BUS = InMemorySubscriptionBus()


async def announce(ctx: ServerRequestContext[Any], event: ServerEvent) -> None:
    """A change in the era of the call that made it, as the SDK's MCPServer announces one: at 2026-07-28 on the
    listen streams (the bus) only, before that to the calling session only (over HTTP on its GET stream)."""
    if ctx.protocol_version == "2026-07-28":
        await BUS.publish(event)
    elif isinstance(event, ToolsListChanged):
        await ctx.session.send_tool_list_changed()
    elif isinstance(event, PromptsListChanged):
        await ctx.session.send_prompt_list_changed()
    elif isinstance(event, ResourcesListChanged):
        await ctx.session.send_resource_list_changed()
    else:
        await ctx.session.send_resource_updated(event.uri)


async def run_stream_tool(name: str, ctx: ServerRequestContext[Any], tool: str, args: JsonObj) -> JsonObj:
    """Each announces its change outside the call (``announce``), as a server on its own would."""
    if tool == "stream_touch":
        await announce(ctx, ResourceUpdated(str(args.get("uri", ""))))
        return _text("touched")
    if tool == "stream_add_resources":
        start = len(STREAM.resources)
        STREAM.resources += [{"uri": f"memo://{name}/extra/{i}", "name": f"{name}-extra-{i}"}
                             for i in range(start, start + int(args.get("count", 1)))]
        await announce(ctx, ResourcesListChanged())
        return _text(f"{len(STREAM.resources)} extra resources")
    if tool == "stream_add_prompt":
        STREAM.prompts.append({"name": str(args.get("name", "extra_prompt")), "description": f"added on {name}"})
        await announce(ctx, PromptsListChanged())
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
    counter: int = 0
    log_level: str | None = None
    conformance: ConformanceState | None = None  # set by --conformance
    era: str = "2025"  # set by --era (or --modern-only, --conformance): "2025", "2026" or "both"
    tasks: TaskStore | None = None  # the tasks extension (tests/upstream_tasks.py): --conformance at 2026-07-28
    trace_file: str | None = None  # set by --trace-file: each tool call's trace context, as received, appended
    ledger: str | None = None  # set by --ledger: each ``pay`` call's arguments, appended as a JSON line
    paying: list[Any] = field(default_factory=list)  # the pay_slow calls waiting: their release events
    #: Tool name -> the definition fields ``rug_pull`` replaced.
    rewritten: dict[str, JsonObj] = field(default_factory=dict)

    @property
    def modern_only(self) -> bool:
        return self.era == "2026"

    def tool_defs(self) -> list[JsonObj]:
        out = []
        for full in self.tools:
            base = full.removeprefix(self.prefix)
            governed = GOVERNANCE_TOOLS.get(base)
            schema = (BASE_TOOLS.get(base) or MODERN_TOOLS.get(base) or PAYMENT_TOOLS.get(base)
                      or (governed[0] if governed else _schema()))
            out.append({"name": full, "description": f"{base} on {self.name}", "inputSchema": schema,
                        **({"annotations": governed[1]} if governed else {}), **self.rewritten.get(full, {})})
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


# --------------------------------------------------------------------------------------------------
# Conformance scenario block (``--conformance``): the tools, resources and prompts the official MCP
# conformance suite's server scenarios call, written from each scenario's stated expectations. Off by
# default so the suite's own tests see the server exactly as before; scripts/conformance.py turns it on.
# --------------------------------------------------------------------------------------------------


def _tiny_png() -> str:
    """A 1x1 red PNG, built here so no binary blob lives in the source."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0)
    pixels = zlib.compress(b"\x00\xff\x00\x00")
    png = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", pixels) + chunk(b"IEND", b"")
    return base64.b64encode(png).decode()


def _tiny_wav() -> str:
    """A tenth of a second of 8 kHz silence as WAV."""
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(1)
        out.setframerate(8000)
        out.writeframes(b"\x80" * 800)
    return base64.b64encode(buffer.getvalue()).decode()


CONF_PNG = _tiny_png()
CONF_WAV = _tiny_wav()
CONF_LOG_LEVELS = ["debug", "info", "notice", "warning", "error", "critical", "alert", "emergency"]

CONF_SCHEMA_2020_12: JsonObj = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "$defs": {"address": {"$anchor": "addressDef", "type": "object",
                          "properties": {"street": {"type": "string"}, "city": {"type": "string"}}}},
    "properties": {"name": {"type": "string"}, "address": {"$ref": "#/$defs/address"},
                   "contactMethod": {"type": "string", "enum": ["phone", "email"]},
                   "phone": {"type": "string"}, "email": {"type": "string"}},
    "allOf": [{"anyOf": [{"required": ["phone"]}, {"required": ["email"]}]}],
    "if": {"properties": {"contactMethod": {"const": "phone"}}, "required": ["contactMethod"]},
    "then": {"required": ["phone"]},
    "else": {"required": ["email"]},
    "additionalProperties": False,
}

#: Conformance tool name -> input schema.
CONF_TOOLS: dict[str, JsonObj] = {
    "test_simple_text": _schema(),
    "test_image_content": _schema(),
    "test_audio_content": _schema(),
    "test_embedded_resource": _schema(),
    "test_multiple_content_types": _schema(),
    "test_tool_with_logging": _schema(),
    "test_error_handling": _schema(),
    "test_tool_with_progress": _schema(),
    "test_sampling": _schema(prompt="string"),
    "test_elicitation": _schema(message="string"),
    "test_elicitation_sep1034_defaults": _schema(),
    "test_elicitation_sep1330_enums": _schema(),
    "test_reconnection": _schema(),
    "json_schema_2020_12_tool": CONF_SCHEMA_2020_12,
    # The 2026-07-28 scenarios' diagnostic tools (server-stateless, input-required-result-*).
    "test_logging_tool": _schema(),
    "test_streaming_elicitation": _schema(),
    "test_input_required_result_elicitation": _schema(),
    # server-stateless's listen checks: each changes its list and announces it in the era of the call.
    "test_trigger_tool_change": _schema(),
    "test_trigger_prompt_change": _schema(),
}

CONF_ELICIT_USER: JsonObj = {
    "type": "object",
    "properties": {"username": {"type": "string", "description": "User's response"},
                   "email": {"type": "string", "description": "User's email address"}},
    "required": ["username", "email"],
}

CONF_ELICIT_DEFAULTS: JsonObj = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "default": "John Doe"},
        "age": {"type": "integer", "default": 30},
        "score": {"type": "number", "default": 95.5},
        "status": {"type": "string", "enum": ["active", "inactive", "pending"], "default": "active"},
        "verified": {"type": "boolean", "default": True},
    },
}


def _titled(prefix: str, *titles: str) -> list[JsonObj]:
    return [{"const": f"value{i}", "title": f"{title} {prefix}"} for i, title in enumerate(titles, 1)]


CONF_ELICIT_ENUMS: JsonObj = {
    "type": "object",
    "properties": {
        "untitledSingle": {"type": "string", "enum": ["option1", "option2", "option3"]},
        "titledSingle": {"type": "string", "oneOf": _titled("Option", "First", "Second", "Third")},
        "legacyEnum": {"type": "string", "enum": ["opt1", "opt2", "opt3"],
                       "enumNames": ["Option One", "Option Two", "Option Three"]},
        "untitledMulti": {"type": "array", "items": {"type": "string", "enum": ["option1", "option2", "option3"]}},
        "titledMulti": {"type": "array", "items": {"anyOf": _titled("Choice", "First", "Second", "Third")}},
    },
}

CONF_RESOURCES: list[JsonObj] = [
    {"uri": "test://static-text", "name": "static-text", "description": "A static text resource",
     "mimeType": "text/plain"},
    {"uri": "test://static-binary", "name": "static-binary", "description": "A static PNG resource",
     "mimeType": "image/png"},
    {"uri": "test://watched-resource", "name": "watched-resource", "description": "A resource to subscribe to",
     "mimeType": "text/plain"},
]
CONF_TEMPLATE: JsonObj = {"uriTemplate": "test://template/{id}/data", "name": "template-data",
                          "description": "Data for an id", "mimeType": "application/json"}

CONF_PROMPTS: list[JsonObj] = [
    {"name": "test_simple_prompt", "description": "A prompt without arguments"},
    {"name": "test_prompt_with_arguments", "description": "A prompt with two arguments",
     "arguments": [{"name": "arg1", "description": "First test argument", "required": True},
                   {"name": "arg2", "description": "Second test argument", "required": True}]},
    {"name": "test_prompt_with_embedded_resource", "description": "A prompt embedding a resource",
     "arguments": [{"name": "resourceUri", "description": "URI of the resource to embed", "required": True}]},
    {"name": "test_prompt_with_image", "description": "A prompt with an image"},
]


@dataclass
class ConformanceState:
    """Per-session log levels (keyed by session object id) and subscribed URIs."""

    log_levels: dict[int, str] = field(default_factory=dict)
    subscribed: set[str] = field(default_factory=set)
    #: Tools test_trigger_tool_change added.
    added_tools: list[str] = field(default_factory=list)


def conf_tool_defs(conf: ConformanceState) -> list[JsonObj]:
    tools = {**CONF_TOOLS, **dict.fromkeys(conf.added_tools, _schema())}
    return [{"name": name, "description": f"conformance tool {name}", "inputSchema": schema}
            for name, schema in tools.items()]


def _user_text(text: str) -> JsonObj:
    return {"role": "user", "content": {"type": "text", "text": text}}


def conf_read(uri: str) -> JsonObj | None:
    """The contents of a conformance resource, or None when the URI is not one."""
    if uri == "test://static-text":
        return {"uri": uri, "mimeType": "text/plain", "text": "This is the content of the static text resource."}
    if uri == "test://static-binary":
        return {"uri": uri, "mimeType": "image/png", "blob": CONF_PNG}
    if uri == "test://watched-resource":
        return {"uri": uri, "mimeType": "text/plain", "text": "Watched resource content."}
    match = re.fullmatch(r"test://template/([^/]+)/data", uri)
    if match:
        ident = match.group(1)
        body = {"id": ident, "templateTest": True, "data": f"Data for ID: {ident}"}
        return {"uri": uri, "mimeType": "application/json", "text": json.dumps(body, separators=(",", ":"))}
    return None


def conf_prompt(name: str, args: Mapping[str, str]) -> JsonObj | None:
    """The messages of a conformance prompt, or None when the name is not one."""
    if name == "test_simple_prompt":
        return {"messages": [_user_text("This is a simple prompt for testing.")]}
    if name == "test_prompt_with_arguments":
        text = f"Prompt with arguments: arg1='{args.get('arg1', '')}', arg2='{args.get('arg2', '')}'"
        return {"messages": [_user_text(text)]}
    if name == "test_prompt_with_embedded_resource":
        resource = {"uri": args.get("resourceUri", "test://example-resource"), "mimeType": "text/plain",
                    "text": "Embedded resource content for testing."}
        return {"messages": [{"role": "user", "content": {"type": "resource", "resource": resource}},
                             _user_text("Please process the embedded resource above.")]}
    if name == "test_prompt_with_image":
        image = {"type": "image", "data": CONF_PNG, "mimeType": "image/png"}
        return {"messages": [{"role": "user", "content": image}, _user_text("Please analyze the image above.")]}
    return None


def conf_log_allowed(level: str, threshold: str) -> bool:
    return CONF_LOG_LEVELS.index(level) >= CONF_LOG_LEVELS.index(threshold)


MODERN_REVISION = "2026-07-28"
CONF_NAME_QUESTION: JsonObj = {
    "message": "What is your name?",
    "requestedSchema": {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]},
}


def _as_dict(value: Any) -> Any:
    return value.model_dump(by_alias=True, exclude_none=True) if hasattr(value, "model_dump") else value


def conf_named(responses: Mapping[str, Any] | None, key: str) -> str | None:
    """The name an accepted elicitation answer under ``key`` gives, else None (missing, declined, malformed)."""
    answer = _as_dict((responses or {}).get(key))
    if not isinstance(answer, dict) or answer.get("action") != "accept":
        return None
    content = answer.get("content")
    name = content.get("name") if isinstance(content, dict) else None
    return name if isinstance(name, str) else None


def conf_elicit_round(key: str, responses: Mapping[str, Any] | None) -> JsonObj:
    """A 2026-07-28 round of the name question: ``input_required`` until ``responses[key]`` answers it.

    Keys it did not ask for are ignored; a missing or wrong answer is asked for again (never an error).
    """
    name = conf_named(responses, key)
    if name is None:
        return {"resultType": "input_required",
                "inputRequests": {key: {"method": "elicitation/create", "params": CONF_NAME_QUESTION}}}
    return _text(f"Hello, {name}!")


async def conf_elicit_name(ctx: ServerRequestContext[Any], key: str, params: types.CallToolRequestParams) -> JsonObj:
    """The name question in the era of the call: a round of MRTR at 2026-07-28, a request to the client before."""
    if ctx.protocol_version == MODERN_REVISION:
        return conf_elicit_round(key, params.input_responses)
    request = types.ElicitRequest.model_validate({"method": "elicitation/create", "params": CONF_NAME_QUESTION})
    elicited = await ctx.session.send_request(request, types.ElicitResult,
                                              metadata=ServerMessageMetadata(related_request_id=ctx.request_id))
    name = conf_named({key: elicited}, key)
    return _text(f"Hello, {name}!" if name is not None else f"No name given ({elicited.action})")


async def conf_run_tool(ctx: ServerRequestContext[Any], conf: ConformanceState,
                        params: types.CallToolRequestParams) -> JsonObj:
    """One conformance tool call; the result dict is what the scenario expects."""
    name, args = params.name, params.arguments or {}
    related = ServerMessageMetadata(related_request_id=ctx.request_id)
    if name == "test_simple_text":
        return _text("This is a simple text response for testing.")
    if name == "test_image_content":
        return {"content": [{"type": "image", "data": CONF_PNG, "mimeType": "image/png"}]}
    if name == "test_audio_content":
        return {"content": [{"type": "audio", "data": CONF_WAV, "mimeType": "audio/wav"}]}
    if name == "test_embedded_resource":
        resource = {"uri": "test://embedded-resource", "mimeType": "text/plain",
                    "text": "This is an embedded resource content."}
        return {"content": [{"type": "resource", "resource": resource}]}
    if name == "test_multiple_content_types":
        resource = {"uri": "test://mixed-content-resource", "mimeType": "application/json",
                    "text": json.dumps({"test": "data", "value": 123})}
        return {"content": [{"type": "text", "text": "Multiple content types test:"},
                            {"type": "image", "data": CONF_PNG, "mimeType": "image/png"},
                            {"type": "resource", "resource": resource}]}
    if name == "test_tool_with_logging":
        threshold = conf.log_levels.get(id(ctx.session), "debug")
        for i, message in enumerate(["Tool execution started", "Tool processing data", "Tool execution completed"]):
            if i:
                await anyio.sleep(0.05)
            if conf_log_allowed("info", threshold):
                await ctx.session.send_log_message("info", message, "conformance", ctx.request_id)
        return _text("Logging tool finished")
    if name == "test_error_handling":
        return {"content": [{"type": "text", "text": "This tool intentionally returns an error for testing"}],
                "isError": True}
    if name == "test_tool_with_progress":
        for i, value in enumerate([0, 50, 100]):
            if i:
                await anyio.sleep(0.05)
            await ctx.session.report_progress(value, 100)  # a no-op without a progress token
        return _text("Progress tool finished")
    if name == "test_sampling":
        request = types.CreateMessageRequest.model_validate({"method": "sampling/createMessage", "params": {
            "messages": [_user_text(str(args.get("prompt", "")))], "maxTokens": 100}})
        sampled = await ctx.session.send_request(request, types.CreateMessageResult, metadata=related)
        answer = sampled.content.text if isinstance(sampled.content, types.TextContent) else str(sampled.content)
        return _text(f"LLM response: {answer}")
    if name in ("test_elicitation", "test_elicitation_sep1034_defaults", "test_elicitation_sep1330_enums"):
        schema = {"test_elicitation": CONF_ELICIT_USER, "test_elicitation_sep1034_defaults": CONF_ELICIT_DEFAULTS,
                  "test_elicitation_sep1330_enums": CONF_ELICIT_ENUMS}[name]
        message = str(args.get("message", f"Please answer {name}"))
        request_e = types.ElicitRequest.model_validate({"method": "elicitation/create", "params": {
            "message": message, "requestedSchema": schema}})
        elicited = await ctx.session.send_request(request_e, types.ElicitResult, metadata=related)
        content = json.dumps(elicited.content)
        if name == "test_elicitation":
            return _text(f"User response: action={elicited.action}, content={content}")
        return _text(f"Elicitation completed: action={elicited.action}, content={content}")
    if name == "test_reconnection":
        await anyio.sleep(0.05)
        if ctx.close_sse_stream is not None:  # only with an event store: the client resumes with Last-Event-ID
            await ctx.close_sse_stream()
        await anyio.sleep(0.2)
        return _text("Reconnection test finished")
    if name == "json_schema_2020_12_tool":
        return _text(json.dumps(args))
    if name == "test_trigger_tool_change":
        conf.added_tools.append(f"test_added_tool_{len(conf.added_tools) + 1}")
        await announce(ctx, ToolsListChanged())
        return _text(f"added {conf.added_tools[-1]}")
    if name == "test_trigger_prompt_change":
        STREAM.prompts.append({"name": f"test_added_prompt_{len(STREAM.prompts) + 1}", "description": "added"})
        await announce(ctx, PromptsListChanged())
        return _text(f"added {STREAM.prompts[-1]['name']}")
    if name == "test_logging_tool":
        # At 2026-07-28 the SDK sends these only when the request's _meta asked for a logLevel; a gateway must
        # not send them either (it may have asked the upstream for every level on behalf of other clients).
        for level in ("info", "warning"):
            await ctx.session.send_log_message(level, f"test_logging_tool {level}", "conformance", ctx.request_id)
        return _text("Logging tool finished")
    if name == "test_streaming_elicitation":
        return await conf_elicit_name(ctx, "confirm_name", params)
    if name == "test_input_required_result_elicitation":
        return await conf_elicit_name(ctx, "user_name", params)
    return {"content": [{"type": "text", "text": f"unknown tool {name}"}], "isError": True}


class ConformanceEventStore(EventStore):
    """Keeps every event in memory so a client that lost a stream can resume it (test_reconnection)."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str, types.JSONRPCMessage | None]] = []

    async def store_event(self, stream_id: str, message: types.JSONRPCMessage | None) -> str:
        event_id = str(len(self.events) + 1)
        self.events.append((event_id, stream_id, message))
        return event_id

    async def replay_events_after(self, last_event_id: str, send_callback: EventCallback) -> str | None:
        found = [i for i, (event_id, _, _) in enumerate(self.events) if event_id == last_event_id]
        if not found:
            return None
        stream_id = self.events[found[0]][1]
        for event_id, stream, message in self.events[found[0] + 1 :]:
            if stream == stream_id and message is not None:
                await send_callback(EventMessage(message, event_id))
        return stream_id


# --------------------------------------------------------------------------------------------------
# End of the conformance scenario block.
# --------------------------------------------------------------------------------------------------


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

    def get_capabilities(self, notification_options: NotificationOptions | None = None,
                         experimental_capabilities: dict[str, dict[str, Any]] | None = None,
                         extensions: dict[str, dict[str, Any]] | None = None, *,
                         protocol_version: str | None = None) -> types.ServerCapabilities:
        """With tasks installed (``--tasks``), a handshake session is also told of 2025-11-25's ``tasks``."""
        caps = super().get_capabilities(notification_options, experimental_capabilities, extensions,
                                        protocol_version=protocol_version)
        if getattr(self, "tasks_v1", False) and protocol_version != MODERN_REVISION:
            caps.tasks = types.ServerTasksCapability.model_validate(V1_CAPABILITY)
        return caps


def record_trace_context(path: str, ctx: ServerRequestContext[Any], tool: str) -> None:
    """One JSON line: the tool, and the ``traceparent`` / ``tracestate`` it came with in ``params._meta`` and (over
    HTTP) in the headers, as an instrumented server would continue them."""
    meta = dict(ctx.params or {}).get("_meta") or {}
    headers: Mapping[str, str] = getattr(ctx.request, "headers", None) or {}
    line = {"tool": tool, "meta": {k: meta.get(k) for k in ("traceparent", "tracestate") if k in meta},
            "headers": {k: headers.get(k) for k in ("traceparent", "tracestate") if headers.get(k) is not None}}
    with open(path, "a", encoding="utf-8") as out:
        out.write(json.dumps(line) + "\n")


def append_line(path: str, line: str) -> None:
    with open(path, "a", encoding="utf-8") as out:
        out.write(line + "\n")


async def run_payment_tool(tool: str, args: JsonObj, state: State) -> JsonObj:
    if tool == "pay_slow":
        released = anyio.Event()
        state.paying.append(released)
        await released.wait()
    if tool == "release_payments":
        for released in state.paying:
            released.set()
        return _text(f"released {len(state.paying)}")
    if tool == "waiting_payments":
        return _text(str(sum(1 for released in state.paying if not released.is_set())))
    if tool == "fetch":
        return _text(f"fetched {args.get('url')}")
    if state.ledger is not None:
        append_line(state.ledger, json.dumps(args))
    return _text(f"paid {args.get('amount')} to {args.get('vendor')}")


def build_server(state: State) -> Server[Any]:
    listen = ListenHandler(BUS) if state.era != "2025" else None
    async def list_tools(
        ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        defs = state.tool_defs() + (conf_tool_defs(state.conformance) if state.conformance else [])
        if state.tasks is not None:
            defs += task_tool_defs()
        page = _page(defs, params.cursor if params else None, state.page_size, "tools")
        return types.ListToolsResult.model_validate(page)

    async def call_tool(ctx: ServerRequestContext[Any],
                        params: types.CallToolRequestParams) -> types.CallToolResult | types.InputRequiredResult:
        if params.name == f"{state.prefix}mrtr_ask" and ctx.protocol_version == MODERN_REVISION:
            question = str((params.arguments or {}).get("question", "?"))
            found = mrtr_ask(question, params.input_responses, params.request_state)
            if found.get("resultType") == "input_required":
                return types.InputRequiredResult.model_validate(found)
            return types.CallToolResult.model_validate(found)
        if state.trace_file is not None:
            record_trace_context(state.trace_file, ctx, params.name)
        found = await run_tool(ctx, params)
        if (found.get("resultType") in ("task", "input_required") or "task" in found) and params.name in TASK_TOOLS:
            # A CreateTaskResult (tests/upstream_tasks.py) has no SDK model: the runner sends a handler's dict as is.
            return cast(types.CallToolResult, found)
        if found.get("resultType") == "input_required":
            return types.InputRequiredResult.model_validate(found)
        return types.CallToolResult.model_validate(found)

    async def run_tool(ctx: ServerRequestContext[Any], params: types.CallToolRequestParams) -> JsonObj:
        if (state.tasks is not None and params.task is not None and params.name in V1_TASK_TOOLS
                and ctx.protocol_version != MODERN_REVISION):  # 2025-11-25: the client asked for a task
            created_v1: JsonObj = state.tasks.call_v1(params.name, params.arguments or {}, announcer(ctx))
            return created_v1
        if state.tasks is not None and params.name in TASK_TOOLS:
            created: JsonObj = await state.tasks.call(params.name, params.arguments or {}, params.meta,
                                                      session_capabilities(ctx), params.input_responses)
            return created
        if state.conformance is not None and params.name in CONF_TOOLS:
            return await conf_run_tool(ctx, state.conformance, params)
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
        if tool == "counter":
            state.counter += 1
            return _text(json.dumps({"count": state.counter, "pid": os.getpid()}))
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
        if tool == "seen_era":
            declared = ctx.session.client_capabilities
            seen = declared.model_dump(by_alias=True, exclude_none=True) if declared is not None else None
            return _text(json.dumps({"protocolVersion": ctx.protocol_version, "capabilities": seen}))
        if tool in STREAM_TOOLS:
            return await run_stream_tool(state.name, ctx, tool, args)
        if tool == "rug_pull":
            target = str(args.get("tool", ""))
            fields = {k: v for k, v in args.items() if k in ("title", "description", "inputSchema", "annotations")}
            state.rewritten[target] = {**state.rewritten.get(target, {}), **fields}
            if ctx.protocol_version == MODERN_REVISION:
                await announce(ctx, ToolsListChanged())
            else:
                await ctx.session.send_notification(types.ToolListChangedNotification(), ctx.request_id)
            return _text(f"rewrote {target}")
        if tool == "add_tool":
            new = str(args.get("name", "extra"))  # as given: a test may add a clashing name
            if new not in state.tools:
                state.tools.append(new)
            if args.get("standalone") or ctx.protocol_version == MODERN_REVISION:
                # Over Streamable HTTP this goes to the GET stream (2025) or the listen streams, not this call's
                # response.
                await announce(ctx, ToolsListChanged())
            else:
                # Request-scoped, so over Streamable HTTP it rides this call's SSE response.
                await ctx.session.send_notification(types.ToolListChangedNotification(), ctx.request_id)
            return _text(f"added {new}")
        if tool in RELAY_TOOLS:
            return await run_relay_tool(ctx, tool, args, state)
        if tool in PAYMENT_TOOLS:
            return await run_payment_tool(tool, args, state)
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
        res += CONF_RESOURCES if state.conformance else []
        res += STREAM.resources
        return types.ListResourcesResult.model_validate({"resources": res})

    async def list_templates(
        ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListResourceTemplatesResult:
        templates = [{"uriTemplate": f"memo://{state.name}/notes/{{id}}", "name": f"{state.name}-notes"}]
        templates += [CONF_TEMPLATE] if state.conformance else []
        return types.ListResourceTemplatesResult.model_validate({"resourceTemplates": templates})

    async def read_resource(
        ctx: ServerRequestContext[Any], params: types.ReadResourceRequestParams
    ) -> types.ReadResourceResult:
        uri = str(params.uri)
        found = conf_read(uri) if state.conformance else None
        if found is not None:
            return types.ReadResourceResult.model_validate({"contents": [found]})
        if not uri.startswith(f"memo://{state.name}/"):
            raise ValueError(f"no resource {uri}")
        text = f"hello from {state.name}: {uri}"
        return types.ReadResourceResult.model_validate({"contents": [{"uri": uri, "text": text}]})

    async def subscribe(ctx: ServerRequestContext[Any], params: types.SubscribeRequestParams) -> types.EmptyResult:
        STREAM.subscribed.append(str(params.uri))
        if state.conformance is not None:
            state.conformance.subscribed.add(str(params.uri))
        return types.EmptyResult()

    async def unsubscribe(
        ctx: ServerRequestContext[Any], params: types.UnsubscribeRequestParams
    ) -> types.EmptyResult:
        if str(params.uri) in STREAM.subscribed:
            STREAM.subscribed.remove(str(params.uri))
        if state.conformance is not None:
            state.conformance.subscribed.discard(str(params.uri))
        return types.EmptyResult()

    async def set_level(ctx: ServerRequestContext[Any], params: types.SetLevelRequestParams) -> types.EmptyResult:
        state.log_level = params.level
        if state.conformance is not None:
            state.conformance.log_levels[id(ctx.session)] = params.level
        return types.EmptyResult()

    async def list_prompts(
        ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListPromptsResult:
        prompt = {"name": f"{state.prefix}greet", "description": f"greeting from {state.name}",
                  "arguments": [{"name": "who", "required": True}]}
        extra = CONF_PROMPTS if state.conformance else []
        return types.ListPromptsResult.model_validate({"prompts": [prompt, *extra, *STREAM.prompts]})

    async def get_prompt(ctx: ServerRequestContext[Any], params: types.GetPromptRequestParams) -> types.GetPromptResult:
        found = conf_prompt(params.name, params.arguments or {}) if state.conformance else None
        if found is not None:
            return types.GetPromptResult.model_validate(found)
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
        on_set_logging_level=set_level,
        on_subscriptions_listen=listen,
    )
    server.add_notification_handler("notifications/cancelled", types.CancelledNotificationParams, on_cancelled)
    if state.tasks is not None:
        install(server, state.tasks, listen)
    return server


async def run_stdio(state: State) -> None:
    """One era only, as most deployed servers: 2025 (the handshake) unless ``--modern-only`` (2026-07-28).

    The SDK's own loop would serve whichever era the client opens with; the gateway opens with
    ``server/discover``, so the tests of 2025 upstreams pin this server to the handshake. ``--conformance``
    keeps the SDK's loop: the suite runs both revisions straight at this server.
    """
    from mcp.server.runner import _serve_legacy_stream, _serve_modern_stream
    from mcp.server.stdio import stdio_server

    server = build_server(state)
    options = server.create_initialization_options()
    print(f"{state.name}: stdio server starting", file=sys.stderr, flush=True)
    if state.era == "both":  # both revisions, as the SDK serves them (the era the client opens with)
        async with stdio_server() as (read_stream, write_stream):
            await server.run(read_stream, write_stream, options)
        return
    async with stdio_server() as (read_stream, write_stream), server.lifespan(server) as lifespan_state:
        try:
            if state.modern_only:
                await _serve_modern_stream(server, read_stream, write_stream, lifespan_state=lifespan_state,
                                           raise_exceptions=False)
            else:
                await _serve_legacy_stream(server, read_stream, write_stream, lifespan_state=lifespan_state,
                                           session_id=None, init_options=options, raise_exceptions=False)
        finally:
            await write_stream.aclose()


def era_gate(app: Any, modern_only: bool) -> Any:
    """The ASGI app serving one era only: the other era's requests are answered 404 as by a server that lacks it."""

    async def gated(scope: Any, receive: Any, send: Any) -> None:
        if scope.get("type") == "http":
            version = dict(scope.get("headers") or []).get(b"mcp-protocol-version", b"").decode("latin-1")
            if (version == "2026-07-28") != modern_only:
                await send({"type": "http.response.start", "status": 404, "headers": []})
                await send({"type": "http.response.body", "body": b""})
                return
        await app(scope, receive, send)

    return gated


async def run_http(state: State, host: str, port: int, json_response: bool) -> None:
    import uvicorn

    server = build_server(state)
    # The conformance block resumes streams (test_reconnection), which needs an event store.
    resumable: JsonObj = {"event_store": ConformanceEventStore(), "retry_interval": 100} if state.conformance else {}
    app = server.streamable_http_app(host=host, json_response=json_response, **resumable)
    if state.era != "both":
        app = era_gate(app, state.modern_only)
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
    parser.add_argument("--conformance", action="store_true", help="add the conformance suite's scenario tools")
    parser.add_argument("--governance", action="store_true",
                        help="add tools with annotations (github_get_repo, github_delete_repo, drop_table)")
    parser.add_argument("--payments", action="store_true", help="add the tools pay, pay_slow and fetch")
    parser.add_argument("--ledger", help="append each pay call's arguments here (one JSON line)")
    parser.add_argument("--trace-file", help="append each tool call's trace context (_meta and headers) here")
    parser.add_argument("--modern-only", action="store_true", help="the same as --era 2026")
    parser.add_argument("--tasks", action="store_true",
                        help="serve tasks (tests/upstream_tasks.py): the extension at 2026-07-28 (also with "
                             "--conformance), and 2025-11-25's tasks on a handshake session")
    parser.add_argument("--era", choices=["2025", "2026", "both"], default=None,
                        help="the revisions served: 2025 (default; with --conformance: both), 2026-07-28 only "
                             "(no initialize; subscriptions/listen and the mrtr_ask tool), or both")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    page_size = args.page_size if args.page_size is not None else (10 if args.many_tools else 0)
    era = args.era or ("2026" if args.modern_only else "both" if args.conformance else "2025")
    state = State(name=args.name, prefix=args.prefix, page_size=page_size,
                  conformance=ConformanceState() if args.conformance else None, era=era,
                  trace_file=args.trace_file, ledger=args.ledger)
    if args.tasks or (args.conformance and era != "2025"):
        state.tasks = TaskStore()
    state.tools = [args.prefix + t for t in BASE_TOOLS] + [f"{args.prefix}extra_{i}" for i in range(args.many_tools)]
    state.tools += [args.prefix + t for t in MODERN_TOOLS] if era != "2025" else []
    state.tools += [args.prefix + t for t in GOVERNANCE_TOOLS] if args.governance else []
    state.tools += [args.prefix + t for t in PAYMENT_TOOLS] if args.payments else []
    if args.mode == "stdio":
        asyncio.run(run_stdio(state))
    else:
        asyncio.run(run_http(state, args.host, args.port, args.json_response))


if __name__ == "__main__":
    main()
