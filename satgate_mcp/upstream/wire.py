"""Pure decisions shared by the upstream connections: ids, progress tokens, backoff, SSE framing.

Nothing here does I/O, so each rule is tested from a table.
"""

from __future__ import annotations

import codecs
import os
import re
import shutil
import signal
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from satgate_mcp import SERVER_NAME, __version__, jsonrpc
from satgate_mcp.jsonrpc import JsonObj, RequestId
from satgate_mcp.task_ids import TASK_NOTIFICATIONS
from satgate_mcp.upstream.base import UPSTREAM_PROTOCOL_VERSION

#: The stateless revision: no handshake, every request carries its version and capabilities in ``_meta``.
MODERN_PROTOCOL_VERSION = "2026-07-28"
#: Revisions an upstream may answer ``initialize`` with; anything else is refused.
KNOWN_PROTOCOL_VERSIONS = frozenset({"2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25", MODERN_PROTOCOL_VERSION})

META_VERSION = "io.modelcontextprotocol/protocolVersion"
META_CAPABILITIES = "io.modelcontextprotocol/clientCapabilities"
META_CLIENT_INFO = "io.modelcontextprotocol/clientInfo"
META_SERVER_INFO = "io.modelcontextprotocol/serverInfo"
META_LOG_LEVEL = "io.modelcontextprotocol/logLevel"
#: What a modern upstream may ask the gateway for (``inputRequests``): it bridges each to the caller's client.
MODERN_CLIENT_CAPABILITIES: JsonObj = {"elicitation": {}, "sampling": {}, "roots": {}}
#: Methods whose HTTP request names its target in ``Mcp-Name`` (the param that holds it).
NAMED_METHODS = {"tools/call": "name", "prompts/get": "name", "resources/read": "uri",
                 "tasks/get": "taskId", "tasks/update": "taskId", "tasks/cancel": "taskId"}
#: Rounds of ``input_required`` the gateway answers for one call of a 2025 client before giving up.
MAX_INPUT_ROUNDS = 10

#: Variables a child inherits from the gateway; everything else (secrets included) stays out.
INHERITED_ENV = ("PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR",
                 "TERM", "SYSTEMROOT")


#: What the gateway offers upstreams on behalf of its clients: it relays each such request to the
#: client whose call caused it (and relays that client's refusal when it lacks the feature).
CLIENT_CAPABILITIES: JsonObj = {"sampling": {}, "elicitation": {"form": {}, "url": {}}, "roots": {}}

#: Notifications about the upstream as a whole (the pool's business); any other belongs to a call.
POOL_NOTIFICATION_SUFFIXES = ("/list_changed",)
#: A task's status notifications go to the pool too, wherever they came: its creator alone is told (task_relay.py).
POOL_NOTIFICATIONS = frozenset({"notifications/resources/updated", *TASK_NOTIFICATIONS})


def is_pool_notification(method: str) -> bool:
    return method in POOL_NOTIFICATIONS or method.endswith(POOL_NOTIFICATION_SUFFIXES)


def initialize_params() -> JsonObj:
    """Sampling, elicitation (form and url) and roots are offered: the gateway relays them to the caller's client."""
    return {
        "protocolVersion": UPSTREAM_PROTOCOL_VERSION,
        "capabilities": CLIENT_CAPABILITIES,
        "clientInfo": {"name": SERVER_NAME, "version": __version__},
    }


def check_initialize_result(reply: JsonObj) -> JsonObj:
    """Return the ``initialize`` result or raise ValueError saying why the upstream cannot be used."""
    if "error" in reply:
        err = reply["error"] if isinstance(reply["error"], dict) else {}
        raise ValueError(f"initialize failed: {err.get('message', 'unknown error')} (code {err.get('code')})")
    result = reply.get("result")
    if not isinstance(result, dict):
        raise ValueError("initialize answered without a result object")
    version = result.get("protocolVersion")
    if version not in KNOWN_PROTOCOL_VERSIONS:
        raise ValueError(f"upstream speaks protocol {version!r}, which the gateway does not know")
    if not isinstance(result.get("capabilities", {}), dict):
        raise ValueError("initialize result has no capabilities object")
    return result


def modern_meta() -> JsonObj:
    """The per-request fields a modern upstream needs on every request (it keeps no session to remember them)."""
    return {META_VERSION: MODERN_PROTOCOL_VERSION, META_CAPABILITIES: MODERN_CLIENT_CAPABILITIES,
            META_CLIENT_INFO: {"name": SERVER_NAME, "version": __version__}}


def with_modern_meta(params: JsonObj | None, log_level: str | None = None, client: JsonObj | None = None) -> JsonObj:
    """``params`` with the modern ``_meta`` fields added (a caller's ``progressToken`` and the like kept), and the
    caller's log level when it wants log messages (a modern upstream sends none otherwise).

    ``client``: a 2026-07-28 client's own protocol fields (its capabilities, its clientInfo), which replace the
    gateway's: the upstream decides for the client that asked, not for the gateway."""
    params = params or {}
    meta = params.get("_meta")
    added = {**modern_meta(), **(client or {})}
    if log_level is not None:
        added[META_LOG_LEVEL] = log_level
    return {**params, "_meta": {**(meta if isinstance(meta, dict) else {}), **added}}


def discover_params() -> JsonObj:
    return {"_meta": modern_meta()}


#: How long ``server/discover`` may take before the upstream is taken for a 2025 one (which may never answer it).
DISCOVER_TIMEOUT = 5.0


def discover_timeout(call_timeout: float) -> float:
    return min(call_timeout, DISCOVER_TIMEOUT) if call_timeout > 0 else DISCOVER_TIMEOUT


#: The first message on a ``subscriptions/listen`` stream: for the gateway that opened it, no client's business.
LISTEN_ACKNOWLEDGED = "notifications/subscriptions/acknowledged"
#: What 2026-07-28 removed: a modern upstream's resource subscriptions are the URIs of its listen stream instead.
#: The lists a pool fetches: a dual stdio upstream is asked them on the side whose lists changed last.
LIST_METHODS = frozenset({"tools/list", "prompts/list", "resources/list", "resources/templates/list"})
SUBSCRIPTION_METHODS = {"resources/subscribe": True, "resources/unsubscribe": False}


def listen_params(uris: Iterable[str] = (), task_ids: Iterable[str] = ()) -> JsonObj:
    """Every list change a modern upstream can announce (the pool re-lists on each, as on 2025 notifications), the
    updates of ``uris`` (the resources some client of the gateway is subscribed to on that upstream) and the status
    of ``task_ids`` (the tasks extension's ``taskIds``: tasks some client's listen stream follows)."""
    notifications: JsonObj = {"toolsListChanged": True, "promptsListChanged": True, "resourcesListChanged": True}
    subscribed = sorted(set(uris))
    if subscribed:
        notifications["resourceSubscriptions"] = subscribed
    watched = sorted(set(task_ids))
    if watched:
        notifications["taskIds"] = watched
    return with_modern_meta({"notifications": notifications})


def modern_headers(message: JsonObj) -> dict[str, str]:
    """The routing headers of a modern HTTP request: version, method, and the target's name where it has one."""
    method = str(message.get("method", ""))
    headers = {"MCP-Protocol-Version": MODERN_PROTOCOL_VERSION, "Mcp-Method": method}
    params = message.get("params")
    key = NAMED_METHODS.get(method)
    if key is not None and isinstance(params, dict) and isinstance(params.get(key), str):
        headers["Mcp-Name"] = params[key]
    return headers


def discovered_result(reply: JsonObj | None) -> JsonObj | None:
    """An ``initialize``-shaped result from a ``server/discover`` reply naming 2026-07-28, else None (use 2025).

    The pool and catalog read capabilities, serverInfo and instructions from ``initialize_result``
    whatever the era, so a modern upstream's are put in the same shape.
    """
    result = (reply or {}).get("result")
    if not isinstance(result, dict):
        return None
    versions = result.get("supportedVersions")
    if not isinstance(versions, list) or MODERN_PROTOCOL_VERSION not in versions:
        return None
    capabilities = result.get("capabilities")
    meta = result.get("_meta")
    server_info = result.get("serverInfo")
    if not isinstance(server_info, dict) and isinstance(meta, dict):
        server_info = meta.get(META_SERVER_INFO)
    found: JsonObj = {"protocolVersion": MODERN_PROTOCOL_VERSION,
                      "capabilities": capabilities if isinstance(capabilities, dict) else {},
                      "serverInfo": server_info if isinstance(server_info, dict) else {}}
    if isinstance(result.get("instructions"), str):
        found["instructions"] = result["instructions"]
    return found


def is_input_required(reply: JsonObj) -> bool:
    result = reply.get("result")
    return isinstance(result, dict) and result.get("resultType") == "input_required"


#: The params of a 2026-07-28 retry that are not part of the request itself.
INPUT_FIELDS = ("inputResponses", "requestState")


def without_input_fields(params: JsonObj | None) -> JsonObj | None:
    if params is None or not any(k in params for k in INPUT_FIELDS):
        return params
    return {k: v for k, v in params.items() if k not in INPUT_FIELDS}


def retry_params(params: JsonObj | None, responses: JsonObj, state: object) -> JsonObj:
    """The params of an ``input_required`` retry: the original ones, the answers, the state echoed."""
    out = dict(without_input_fields(params) or {})
    if responses:
        out["inputResponses"] = responses
    if state is not None:
        out["requestState"] = state
    return out


def rewrite_progress_token(params: JsonObj | None, token: str) -> tuple[JsonObj | None, Any]:
    """Swap the caller's progress token for a gateway token; return (new params, caller's token or None).

    Callers pick tokens independently, so two clients may use the same one; upstream, only the
    gateway's token is seen and the caller's is restored on the way back.
    """
    if not params or not isinstance(params.get("_meta"), dict) or "progressToken" not in params["_meta"]:
        return params, None
    caller = params["_meta"]["progressToken"]
    if not isinstance(caller, (str, int)) or isinstance(caller, bool):
        return params, None
    return {**params, "_meta": {**params["_meta"], "progressToken": token}}, caller


def restore_progress_token(params: JsonObj, caller_token: Any) -> JsonObj:
    return {**params, "progressToken": caller_token}


def cancelled_params(request_id: RequestId, reason: str) -> JsonObj:
    return {"requestId": request_id, "reason": reason}


def unattributed_refusal(request: jsonrpc.Request, upstream: str, *, shared_pipe: bool,
                         isolation: str = "shared") -> JsonObj:
    """The answer to an upstream request no single client can be named for: refused, never guessed.

    ``isolation`` is the child's: ``shared`` (one child for everyone), or ``token`` (one per token id,
    shared by that token's sessions), so the message names the setting that would make it exact.
    """
    if shared_pipe and isolation == "token":
        why = (f'upstream {upstream!r} runs one child per token ("isolation": "token") and calls from several '
               "client sessions of this token (or none) are in flight on it, so the gateway cannot tell which "
               f'client {request.method!r} is for; "isolation": "session" gives every session its own child')
    elif shared_pipe:
        why = (f'upstream {upstream!r} is one child shared by every client ("isolation": "shared") and calls from '
               "several client sessions (or none) are in flight, so the gateway cannot tell which client "
               f'{request.method!r} is for; "isolation": "token" or "session" gives clients children of their own')
    else:
        why = (f"upstream {upstream!r} sent {request.method!r} outside the response stream of any call, so the "
               "gateway cannot tell which client it is for")
    return jsonrpc.error_response(request.id, jsonrpc.INVALID_REQUEST, why,
                                  {"error": "unattributable", "upstream": upstream, "isolation": isolation})


def backoff_delay(attempt: int, *, base: float = 0.1, cap: float = 10.0) -> float:
    """Delay before restart number ``attempt`` (0-based): base doubling, capped."""
    return float(min(cap, base * (2 ** min(attempt, 30))))


@dataclass(frozen=True, slots=True)
class RestartPolicy:
    """Exponential backoff between restarts; a child that stayed up ``stable_after`` seconds starts over."""

    base: float = 0.1
    cap: float = 10.0
    stable_after: float = 30.0


def restart_plan(attempt: int, uptime: float, policy: RestartPolicy) -> tuple[float, int]:
    """(delay before the next start, the attempt number after it)."""
    if uptime >= policy.stable_after:
        attempt = 0
    return backoff_delay(attempt, base=policy.base, cap=policy.cap), attempt + 1


def child_env(inherited: Mapping[str, str], overrides: Mapping[str, str]) -> dict[str, str]:
    env = {k: inherited[k] for k in INHERITED_ENV if k in inherited}
    env.update(overrides)
    return env


def command_problem(name: str, command: str, cwd: str | None, env: Mapping[str, str]) -> str | None:
    """Why a stdio upstream cannot start at all, or None.

    A missing program never starts however often it is retried, so it is a configuration error at
    start; a program that exists but crashes keeps the restart backoff. ``command`` is found as the
    child's exec would: a name on the child's PATH, a path relative to ``cwd``.
    """
    if cwd is not None and not os.path.isdir(cwd):
        return f"upstream {name!r}: its cwd {cwd!r} is not a directory"
    if os.sep in command:
        path = command if os.path.isabs(command) else os.path.join(cwd or os.curdir, command)
        if not (os.path.isfile(path) and os.access(path, os.X_OK)):
            return f"upstream {name!r}: command {command!r} is not an executable file"
        return None
    if shutil.which(command, path=env.get("PATH", os.defpath)) is None:
        return f"upstream {name!r}: command {command!r} is not found on PATH"
    return None


def describe_exit(returncode: int | None) -> str:
    if returncode is None:
        return "still running"
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exited with status {returncode}"


def split_batch(value: Any) -> list[Any]:
    """A JSON-RPC payload may be one message or a batch; callers handle messages one by one."""
    return list(value) if isinstance(value, list) else [value]


def clip(text: str, limit: int = 2000) -> str:
    return text if len(text) <= limit else text[:limit] + f"... ({len(text) - limit} more characters)"


@dataclass(frozen=True, slots=True)
class SseEvent:
    event: str
    data: str
    id: str | None = None


_LINE_BREAK = re.compile(r"\r\n|\r|\n")


class SseDecoder:
    """Incremental ``text/event-stream`` parser: feed bytes as they arrive, get complete events.

    Follows the WHATWG rules that matter for MCP: any line ending, ``data`` lines joined by
    newlines, comments ignored, the event dispatched on a blank line.
    """

    def __init__(self, max_buffer: int = 64 * 1024 * 1024) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._buffer = ""
        self._max_buffer = max_buffer
        self._data: list[str] = []
        self._event = ""
        self._last_id: str | None = None
        #: The server's ``retry`` field (milliseconds): how long to wait before resuming its stream.
        self.retry_ms: int | None = None
        self._started = False

    @property
    def last_id(self) -> str | None:
        """The last event id seen: what a resumption sends as ``Last-Event-ID``."""
        return self._last_id

    def feed(self, chunk: bytes) -> list[SseEvent]:
        self._buffer += self._decoder.decode(chunk)
        if not self._started and self._buffer:
            self._buffer = self._buffer.removeprefix("\ufeff")
            self._started = True
        # A trailing CR may be the first half of CRLF: keep it until the next chunk says.
        held = "\r" if self._buffer.endswith("\r") else ""
        body = self._buffer[: len(self._buffer) - len(held)]
        lines = _LINE_BREAK.split(body)
        self._buffer = lines.pop() + held
        if len(self._buffer) > self._max_buffer:
            raise ValueError(f"server-sent event larger than {self._max_buffer} bytes")
        events = []
        for line in lines:
            event = self._line(line)
            if event is not None:
                events.append(event)
        return events

    def _line(self, line: str) -> SseEvent | None:
        if not line:
            if not self._data:
                self._event = ""
                return None
            event = SseEvent(self._event or "message", "\n".join(self._data), self._last_id)
            self._data, self._event = [], ""
            return event
        if line.startswith(":"):
            return None
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._event = value
        elif name == "id" and "\0" not in value:
            self._last_id = value
        elif name == "retry" and value.isascii() and value.isdigit():
            self.retry_ms = int(value)
        return None
