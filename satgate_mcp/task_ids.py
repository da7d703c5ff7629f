"""Task ids the gateway hands out (the tasks extension, ``io.modelcontextprotocol/tasks``): pure functions.

An upstream's task id means something only on that upstream, and only to whoever created the task. So the id a
client gets is sealed (HMAC-SHA256 over a small JSON payload, like the 2026 ``requestState``): it names the
upstream and the upstream's own task id, and binds them to the token (and session: a 2025 session's id, a
stateless caller's ``token:<id>``) that created the task. Any gateway process with the same keys
(``SATGATE_STATE_KEY`` / ``SATGATE_ROOT_KEY``) opens it, so a ``tasks/get`` after a restart, or on another machine,
reaches the right upstream without any shared memory. An id that does not open, or opens for another holder,
gets exactly the unknown-task answer: a caller cannot tell someone else's task from one that never existed.
The payload is signed, not encrypted: a client may read its own task's upstream name and id, never change them.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
from collections.abc import Sequence
from dataclasses import dataclass

from satgate_mcp import jsonrpc
from satgate_mcp.errors import GatewayError
from satgate_mcp.jsonrpc import JsonObj

TASKS_EXTENSION = "io.modelcontextprotocol/tasks"
CLIENT_CAPABILITIES_META = "io.modelcontextprotocol/clientCapabilities"
#: Where 2025-11-25 names the task a message belongs to (``_meta``).
RELATED_TASK = "io.modelcontextprotocol/related-task"
#: A task's change of status: 2025-11-25's notification, and the extension's (2026-07-28, on listen streams).
TASK_STATUS = "notifications/tasks/status"
TASK_NOTICE = "notifications/tasks"
TASK_NOTIFICATIONS = frozenset({TASK_STATUS, TASK_NOTICE})
#: SEP-2575's "Missing Required Client Capability".
MISSING_CAPABILITY = -32021
#: The methods that name a task by its ``taskId`` (2026-07-28: get, update, cancel; 2025-11-25 also result).
TASK_METHODS = frozenset({"tasks/get", "tasks/update", "tasks/cancel", "tasks/result"})
#: Longest task id accepted from a client: room for an upstream's own id and name inside ours.
MAX_TASK_ID_CHARS = 4096
_KEY_LABEL = b"satgate-mcp task id v1"
_PREFIX = "sgt1."


@dataclass(frozen=True, slots=True)
class TaskRef:
    """Where a sealed task lives: the upstream's name and that upstream's own task id."""

    upstream: str
    task_id: str


def derive_task_keys(secrets_in_order: Sequence[str]) -> list[bytes]:
    """The first seals, all open (keys rotate), each derived apart from the other uses of the same secret."""
    return [hmac.new(s.encode("utf-8"), _KEY_LABEL, hashlib.sha256).digest() for s in secrets_in_order if s]


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode("ascii").rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _holder(token_id: str, session_id: str) -> str:
    """Who may name the task: a digest, so the token id itself never travels inside the id."""
    return hashlib.sha256(f"{token_id}\x00{session_id}".encode()).hexdigest()[:32]


def seal_task_id(keys: Sequence[bytes], ref: TaskRef, *, token_id: str, session_id: str) -> str:
    payload = json.dumps({"u": ref.upstream, "t": ref.task_id, "h": _holder(token_id, session_id)},
                         separators=(",", ":")).encode("utf-8")
    mac = hmac.new(keys[0], payload, hashlib.sha256).digest()
    return f"{_PREFIX}{_b64(payload)}.{_b64(mac)}"


def open_task_id(keys: Sequence[bytes], task_id: object, *, token_id: str, session_id: str) -> TaskRef | None:
    """The task a sealed id names, when it is this holder's; None for anything else (forged, foreign, garbled)."""
    if not isinstance(task_id, str) or len(task_id) > MAX_TASK_ID_CHARS or not task_id.startswith(_PREFIX):
        return None
    parts = task_id[len(_PREFIX):].split(".")
    if len(parts) != 2:
        return None
    try:
        payload, mac = _unb64(parts[0]), _unb64(parts[1])
    except (binascii.Error, ValueError):
        return None
    if not any(hmac.compare_digest(hmac.new(k, payload, hashlib.sha256).digest(), mac) for k in keys):
        return None
    fields = json.loads(payload)
    if not isinstance(fields, dict) or not all(isinstance(fields.get(k), str) for k in ("u", "t", "h")):
        return None
    if not hmac.compare_digest(fields["h"], _holder(token_id, session_id)):
        return None
    return TaskRef(fields["u"], fields["t"])


def unknown_task(task_id: object) -> GatewayError:
    """The one answer for a task id this caller cannot use, whatever the reason (SEP-2663: -32602)."""
    return GatewayError("Unknown task", {"error": "unknown_task"}, code=jsonrpc.INVALID_PARAMS)


def missing_tasks_capability() -> GatewayError:
    return GatewayError(f"Missing required client capability: {TASKS_EXTENSION}",
                        {"requiredCapabilities": {"extensions": {TASKS_EXTENSION: {}}}}, code=MISSING_CAPABILITY)


def undeclared_modern_client(era: str | None, declared: JsonObj | None) -> bool:
    """A 2026-07-28 client (``era``) whose request did not declare the tasks extension in its ``_meta`` client
    capabilities (``declared``: the client's own protocol fields, as the relay keeps them).

    A 2025 session's requests carry no such fields: the upstream judges those itself."""
    if era != "2026":
        return False
    caps = (declared or {}).get(CLIENT_CAPABILITIES_META)
    extensions = caps.get("extensions") if isinstance(caps, dict) else None
    return not (isinstance(extensions, dict) and TASKS_EXTENSION in extensions)


def created_task_id(reply: JsonObj) -> str | None:
    """The upstream's task id when a reply is a ``CreateTaskResult`` (2026: ``resultType: "task"``; 2025-11-25:
    ``result.task.taskId``), else None."""
    result = reply.get("result")
    if not isinstance(result, dict):
        return None
    if result.get("resultType") == "task" and isinstance(result.get("taskId"), str):
        return str(result["taskId"])
    task = result.get("task")
    if isinstance(task, dict) and isinstance(task.get("taskId"), str):
        return str(task["taskId"])
    return None


def _related(meta: JsonObj, task_id: str) -> JsonObj:
    """A ``_meta`` (or error data) with its related-task id replaced, and the same ``_meta`` inside it."""
    out = dict(meta)
    if isinstance(out.get(RELATED_TASK), dict):
        out[RELATED_TASK] = {**out[RELATED_TASK], "taskId": task_id}
    if isinstance(out.get("_meta"), dict):
        out["_meta"] = _related(out["_meta"], task_id)
    return out


def with_task_id(reply: JsonObj, task_id: str) -> JsonObj:
    """``reply`` with the task's id replaced wherever it carries it: a task envelope (top level, or ``task``), a
    2025-11-25 ``tasks/result``'s related-task ``_meta``, or an error's data naming the task."""
    error = reply.get("error")
    if isinstance(error, dict) and isinstance(error.get("data"), dict):
        return {**reply, "error": {**error, "data": _related(error["data"], task_id)}}
    result = reply.get("result")
    if not isinstance(result, dict):
        return reply
    changed = dict(result)
    if isinstance(changed.get("taskId"), str):
        changed["taskId"] = task_id
    task = changed.get("task")
    if isinstance(task, dict) and isinstance(task.get("taskId"), str):
        changed["task"] = {**task, "taskId": task_id}
    if isinstance(changed.get("_meta"), dict):
        changed["_meta"] = _related(changed["_meta"], task_id)
    return {**reply, "result": changed}


def notice_with_task_id(params: JsonObj, task_id: str) -> JsonObj:
    """A status notification's params with the task's id replaced (``taskId``, and a related-task ``_meta``)."""
    return {**_related(params, task_id), "taskId": task_id}


def notified_task_id(params: JsonObj | None) -> str | None:
    """The task a status notification (2025-11-25 ``notifications/tasks/status``, 2026 ``notifications/tasks``)
    is about."""
    task_id = (params or {}).get("taskId")
    return task_id if isinstance(task_id, str) else None


def listed_tasks(result: JsonObj) -> list[JsonObj]:
    """The tasks of a 2025-11-25 ``tasks/list`` result that carry an id (anything else is dropped)."""
    tasks = result.get("tasks")
    return [t for t in tasks if isinstance(t, dict) and isinstance(t.get("taskId"), str)] if isinstance(
        tasks, list) else []
