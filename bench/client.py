"""The one raw client: Streamable HTTP by hand over aiohttp keep-alive connections.

Written by hand rather than taken from the SDK so that what is measured is the server's cost, not a client's.
Both modes use it: the default mode with one connection per client, ``--compare`` with a shared pool. It reads
an answer whether the server sends it as JSON or on an SSE stream.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass
from typing import Any

import aiohttp

PROTOCOL_VERSION = "2025-11-25"
ACCEPT_BOTH = "application/json, text/event-stream"
ACCEPT_JSON = "application/json"
REQUEST_TIMEOUT = 30.0
#: JSON-RPC ids, unique across every client of the run, so an answer is never taken for another call's.
_ids = itertools.count(1)


def next_id() -> int:
    return next(_ids)


def jsonrpc_request(request_id: int, method: str, params: dict[str, Any]) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}


def initialize_params() -> dict[str, Any]:
    """What every client of the bench initializes with, over HTTP or over pipes."""
    return {"protocolVersion": PROTOCOL_VERSION, "capabilities": {},
            "clientInfo": {"name": "satgate-bench", "version": "1"}}


#: The notification that completes a session's opening (no id: nothing answers it).
INITIALIZED = {"jsonrpc": "2.0", "method": "notifications/initialized"}


def sse_data(text: str) -> list[str]:
    """The ``data`` of each event in a ``text/event-stream`` body (multi-line data joined by newlines)."""
    events: list[str] = []
    data: list[str] | None = None
    for line in text.replace("\r\n", "\n").replace("\r", "\n").split("\n"):
        if line == "":
            if data is not None:
                events.append("\n".join(data))
            data = None
        elif line.startswith("data:"):
            value = line[5:]
            (data := data if data is not None else []).append(value[1:] if value.startswith(" ") else value)
    if data is not None:
        events.append("\n".join(data))
    return events


def jsonrpc_answer(content_type: str, body: bytes, request_id: object) -> dict[str, Any] | None:
    """The JSON-RPC answer to ``request_id`` in a JSON or SSE body, or None when it holds none."""
    texts = sse_data(body.decode(errors="replace")) if content_type == "text/event-stream" else [body.decode()]
    for text in texts:
        try:
            decoded: Any = json.loads(text)
        except ValueError:
            continue  # an SSE priming event, a keep-alive, an empty body
        for message in decoded if isinstance(decoded, list) else [decoded]:
            if (isinstance(message, dict) and message.get("id") == request_id
                    and ("result" in message or "error" in message)):
                return message
    return None


def call_succeeded(message: dict[str, Any] | None) -> bool:
    """A tools/call answered with a result that is not a tool error."""
    result = None if message is None else message.get("result")
    return isinstance(result, dict) and result.get("isError") is not True


@dataclass(frozen=True)
class ToolCall:
    """What a load phase calls instead of ``echo``; ``progress`` asks for progress (a progressToken)."""

    name: str
    arguments: dict[str, Any]
    progress: bool = False


#: One progress notification before the answer: the gateway must answer it on an SSE stream when the client
#: reads one (Accept: both), and can only answer JSON (the progress dropped) when it does not.
PROGRESS_CALL = ToolCall("slow", {"steps": 1, "delay": 0}, progress=True)


@dataclass(frozen=True)
class McpSession:
    id: str
    headers: dict[str, str]


@dataclass(frozen=True)
class Answer:
    status: int
    content_type: str
    message: dict[str, Any] | None
    session_id: str | None


def tool_call_request(request_id: int, tool: ToolCall | None) -> dict[str, Any]:
    """``echo`` with a distinct text per call, or ``tool`` (with a progress token when it asks for progress)."""
    params: dict[str, Any] = ({"name": "echo", "arguments": {"text": f"call {request_id}"}} if tool is None
                              else {"name": tool.name, "arguments": dict(tool.arguments)})
    if tool is not None and tool.progress:
        params["_meta"] = {"progressToken": f"p{request_id}"}
    return jsonrpc_request(request_id, "tools/call", params)


class Client:
    """initialize, initialized, tools/call and DELETE against one MCP endpoint, over ``http``'s connections."""

    def __init__(self, http: aiohttp.ClientSession, mcp_url: str) -> None:
        self.http = http
        self.url = mcp_url

    async def post(self, payload: dict[str, Any], headers: dict[str, str]) -> Answer:
        async with self.http.post(self.url, data=json.dumps(payload).encode(), headers=headers) as resp:
            body = await resp.read()
            return Answer(resp.status, resp.content_type, jsonrpc_answer(resp.content_type, body, payload.get("id")),
                          resp.headers.get("Mcp-Session-Id"))

    async def open(self, token: str | None) -> McpSession:
        """A new session (initialize, then initialized); RuntimeError when the server refuses either."""
        headers = {"Accept": ACCEPT_BOTH, "Content-Type": "application/json"}
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        answer = await self.post(jsonrpc_request(next_id(), "initialize", initialize_params()), headers)
        result = None if answer.message is None else answer.message.get("result")
        if answer.status != 200 or answer.session_id is None or not isinstance(result, dict):
            raise RuntimeError(f"initialize at {self.url} answered {answer.status}: {answer.message}")
        session = McpSession(answer.session_id, {
            **headers, "Mcp-Session-Id": answer.session_id,
            "MCP-Protocol-Version": str(result.get("protocolVersion", PROTOCOL_VERSION))})
        async with self.http.post(self.url, data=json.dumps(INITIALIZED).encode(), headers=session.headers) as resp:
            await resp.read()
            if resp.status >= 300:
                raise RuntimeError(f"notifications/initialized at {self.url} answered {resp.status}")
        return session

    async def call(self, session: McpSession, accept: str | None = None, tool: ToolCall | None = None
                   ) -> tuple[bool, str]:
        """One ``echo`` (or ``tool``); (succeeded, the answer's content type). A failure is counted, not raised."""
        headers = session.headers if accept is None else {**session.headers, "Accept": accept}
        try:
            answer = await self.post(tool_call_request(next_id(), tool), headers)
        except (aiohttp.ClientError, TimeoutError, ValueError):
            return False, "error"
        return answer.status == 200 and call_succeeded(answer.message), answer.content_type

    async def close(self, session: McpSession) -> None:
        """End the session (DELETE), so the server frees it now rather than at its idle timeout."""
        async with self.http.delete(self.url, headers=session.headers) as resp:
            await resp.read()


def client_session(connections: int) -> aiohttp.ClientSession:
    """A pool of ``connections`` keep-alive connections (plus a few spare) with every request bounded in time."""
    return aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT),
                                 connector=aiohttp.TCPConnector(limit=connections + 4))
