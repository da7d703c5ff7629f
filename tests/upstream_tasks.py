"""The tasks extension (``io.modelcontextprotocol/tasks``, SEP-2663) as the test upstream serves it at 2026-07-28,
and the tasks of 2025-11-25 (v1) on a handshake session.

The SDK has the extension seam but no tasks implementation, so the conformance upstream keeps its tasks here:
server-directed creation (a task-supporting tool answers ``resultType: "task"`` when the request declares the
extension), ``tasks/get`` with the result or error inlined, ``tasks/cancel`` (an empty ack, idempotent), and
``-32021`` for a client that did not declare the extension. ``tasks/result`` and ``tasks/list`` are gone in v2
(the SDK answers ``-32601`` for them, as for any unknown method). The fixtures are the ones the conformance
runner's tasks scenarios name: ``greet`` (sync only), ``slow_compute``, ``failing_job`` (task support
required), ``protocol_error_job``, ``confirm_delete`` and ``multi_input`` (a task in ``input_required``, answered
by ``tasks/update``), ``test_tool_with_task`` (an MRTR round, then a task).

At 2025-11-25 the client asks for a task (``params.task`` on ``tools/call``) and gets ``{"task": ...}``;
``tasks/get``, ``tasks/result`` (waits for the end), ``tasks/list`` (every task of this server: scoping them to
their creators is the gateway's business) and ``tasks/cancel`` answer with v1 shapes, and each change of status
is announced to the creating session as ``notifications/tasks/status``. Only the fixtures without questions run
as v1 tasks (``slow_compute``, ``failing_job``, ``protocol_error_job``).
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from mcp import types
from mcp.shared.exceptions import MCPError
from mcp_types import RequestParams, SubscriptionsListenRequestParams
from mcp_types import methods as mcp_methods
from pydantic import BaseModel

TASKS_EXTENSION = "io.modelcontextprotocol/tasks"
CLIENT_CAPABILITIES_META = "io.modelcontextprotocol/clientCapabilities"
MISSING_CAPABILITY = -32021
INVALID_PARAMS = -32602
TTL_MS = 600_000
POLL_MS = 200
TERMINAL = frozenset({"completed", "failed", "cancelled"})
MODERN_REVISION = "2026-07-28"
METHOD_NOT_FOUND = -32601
RELATED_TASK = "io.modelcontextprotocol/related-task"
SUBSCRIPTION_ID = "io.modelcontextprotocol/subscriptionId"
#: The fixtures that run as 2025-11-25 tasks (the others ask questions, which v1 tasks relay differently).
V1_TASK_TOOLS = frozenset({"slow_compute", "failing_job", "protocol_error_job"})
#: What a 2025-11-25 server with tasks says in ``capabilities.tasks``.
V1_CAPABILITY: JsonObj = {"list": {}, "cancel": {}, "requests": {"tools": {"call": {}}}}

JsonObj = dict[str, Any]
#: Sends a v1 task's status to the session that created it.
Announce = Callable[[JsonObj], Coroutine[Any, Any, None]]


def _schema(**props: str) -> JsonObj:
    return {"type": "object", "properties": {k: {"type": v} for k, v in props.items()}}


#: Tool name -> (input schema, task support: "forbidden", "optional" or "required").
TASK_TOOLS: dict[str, tuple[JsonObj, str]] = {
    "greet": (_schema(name="string"), "forbidden"),
    "slow_compute": (_schema(seconds="number", label="string"), "optional"),
    "failing_job": (_schema(), "required"),
    "protocol_error_job": (_schema(), "optional"),
    "confirm_delete": (_schema(filename="string"), "optional"),
    "multi_input": (_schema(), "optional"),
    "test_tool_with_task": (_schema(), "required"),
}


def _elicit(message: str, **props: str) -> JsonObj:
    """An ``elicitation/create`` request as a task's (or an MRTR round's) input request."""
    return {"method": "elicitation/create", "params": {"mode": "form", "message": message,
                                                        "requestedSchema": _schema(**props)}}


def _answered(answer: object, field_name: str) -> str | None:
    """A field of an accepted elicitation answer, else None."""
    if hasattr(answer, "model_dump"):  # the SDK parses a call's inputResponses into result models
        answer = answer.model_dump(by_alias=True, exclude_none=True)
    if isinstance(answer, dict) and answer.get("action") == "accept" and isinstance(answer.get("content"), dict):
        value = answer["content"].get(field_name)
        return None if value is None else str(value)
    return None


def task_tool_defs() -> list[JsonObj]:
    return [{"name": name, "description": f"tasks fixture {name}", "inputSchema": schema}
            for name, (schema, _support) in TASK_TOOLS.items()]


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def declares_tasks(meta: object, session_capabilities: object) -> bool:
    """Whether the request (its ``_meta`` client capabilities) or the session declared the extension."""
    declared = meta.get(CLIENT_CAPABILITIES_META) if isinstance(meta, dict) else None
    for caps in (declared, session_capabilities):
        extensions = caps.get("extensions") if isinstance(caps, dict) else None
        if isinstance(extensions, dict) and TASKS_EXTENSION in extensions:
            return True
    return False


def missing_capability() -> MCPError:
    return MCPError(MISSING_CAPABILITY, "Missing required client capability: io.modelcontextprotocol/tasks",
                    {"requiredCapabilities": {"extensions": {TASKS_EXTENSION: {}}}})


@dataclass
class Task:
    task_id: str
    created: str
    updated: str
    status: str = "working"
    result: JsonObj | None = None
    error: JsonObj | None = None
    runner: asyncio.Task[None] | None = None
    #: Input requests still unanswered (key -> request), and the futures their answers resolve.
    asked: dict[str, JsonObj] = field(default_factory=dict)
    waiting: dict[str, asyncio.Future[object]] = field(default_factory=dict)
    #: A v1 task's announcer: sends ``notifications/tasks/status`` to the session that created it.
    announce: Announce | None = None
    ended: asyncio.Event = field(default_factory=asyncio.Event)
    #: Told of each change of status (the store's followers: listen streams that follow the task).
    on_change: Callable[[Task], None] | None = None

    def changed(self) -> None:
        if self.on_change is not None:
            self.on_change(self)

    async def ask(self, key: str, request: JsonObj) -> object:
        """Park the task in ``input_required`` until ``tasks/update`` answers ``key``."""
        future: asyncio.Future[object] = asyncio.get_running_loop().create_future()
        self.asked[key], self.waiting[key] = request, future
        self.status, self.updated = "input_required", _now()
        self.changed()
        return await future

    def answer(self, responses: object) -> None:
        for key, value in (responses.items() if isinstance(responses, dict) else []):
            future = self.waiting.pop(key, None)
            self.asked.pop(key, None)
            if future is not None and not future.done():
                future.set_result(value)
        if not self.asked and self.status == "input_required":
            self.status, self.updated = "working", _now()
            self.changed()

    def v1(self) -> JsonObj:
        """The task as 2025-11-25 shows it (``Task``)."""
        return {"taskId": self.task_id, "status": self.status, "createdAt": self.created,
                "lastUpdatedAt": self.updated, "ttl": TTL_MS, "pollInterval": POLL_MS}

    def envelope(self) -> JsonObj:
        return {"taskId": self.task_id, "status": self.status, "createdAt": self.created,
                "lastUpdatedAt": self.updated, "ttlMs": TTL_MS, "pollIntervalMs": POLL_MS}

    def detailed(self) -> JsonObj:
        out: JsonObj = {"resultType": "complete", **self.envelope()}
        if self.asked and self.status == "input_required":
            out["inputRequests"] = dict(self.asked)
        if self.result is not None:
            out["result"] = self.result
        if self.error is not None:
            out["error"] = self.error
        return out

    def settle(self, status: str, *, result: JsonObj | None = None, error: JsonObj | None = None) -> None:
        if self.status in TERMINAL:
            return
        self.status, self.result, self.error, self.updated = status, result, error, _now()
        self.ended.set()
        self.changed()
        if self.announce is not None:
            asyncio.get_running_loop().create_task(self.announce(self.v1()))


async def _run_fixture(name: str, args: JsonObj, task: Task | None, gathered: str | None = None) -> JsonObj:
    """A task-supporting fixture's work: the tool result, or MCPError for a protocol-level failure."""
    if name == "slow_compute":
        await asyncio.sleep(float(args.get("seconds", 1) or 0))
        return {"content": [{"type": "text", "text": f"computed {args.get('label', '')}".strip()}]}
    if name == "failing_job":
        await asyncio.sleep(0.5)
        return {"content": [{"type": "text", "text": "the job failed"}], "isError": True}
    if name == "confirm_delete" and task is not None:
        answer = await task.ask("confirm", _elicit(f"Delete {args.get('filename', '?')}?", confirm="boolean"))
        verdict = "deleted" if _answered(answer, "confirm") not in (None, "False") else "kept"
        return {"content": [{"type": "text", "text": f"{verdict} {args.get('filename', '?')}"}]}
    if name == "multi_input" and task is not None:
        first, second = await asyncio.gather(task.ask("first", _elicit("First name?", name="string")),
                                             task.ask("second", _elicit("Second name?", name="string")))
        return {"content": [{"type": "text", "text": f"{_answered(first, 'name')} {_answered(second, 'name')}"}]}
    if name == "test_tool_with_task":
        return {"content": [{"type": "text", "text": f"Hello, {gathered}!"}]}
    if name in ("confirm_delete", "multi_input"):
        return {"content": [{"type": "text", "text": f"{name} needs a task to ask its questions"}], "isError": True}
    await asyncio.sleep(0.2)
    raise MCPError(-32603, "protocol_error_job crashed")


@dataclass
class TaskStore:
    """One upstream process's tasks (in memory: a restarted upstream knows none)."""

    tasks: dict[str, Task] = field(default_factory=dict)
    #: Told of every task's changes of status (listen streams following tasks).
    followers: list[Callable[[Task], None]] = field(default_factory=list)

    def add(self, task: Task) -> Task:
        task.on_change = self._changed
        self.tasks[task.task_id] = task
        return task

    def _changed(self, task: Task) -> None:
        for follower in list(self.followers):
            follower(task)

    def follow(self, follower: Callable[[Task], None]) -> Callable[[], None]:
        self.followers.append(follower)
        return lambda: self.followers.remove(follower)

    async def call(self, name: str, args: JsonObj, meta: object, session_capabilities: object,
                   responses: object = None) -> JsonObj:
        """A fixture's ``tools/call``: a sync result, an MRTR round, a ``CreateTaskResult``, or ``-32021``."""
        if name == "greet":
            return {"content": [{"type": "text", "text": f"Hello, {args.get('name', 'World')}!"}]}
        support = TASK_TOOLS[name][1]
        if not declares_tasks(meta, session_capabilities):
            if support == "required":
                raise missing_capability()
            return await _run_fixture(name, args, None)
        gathered = None
        if name == "test_tool_with_task":  # an MRTR round first; the task only once the name is known
            gathered = _answered((responses if isinstance(responses, dict) else {}).get("user_name"), "name")
            if gathered is None:
                return {"resultType": "input_required",
                        "inputRequests": {"user_name": _elicit("What is your name?", name="string")}}
        stamp = _now()
        task = self.add(Task(f"task-{secrets.token_hex(8)}", stamp, stamp))
        task.runner = asyncio.get_running_loop().create_task(
            self._work(task, lambda: _run_fixture(name, args, task, gathered)))
        return {"resultType": "task", **task.envelope()}

    async def _work(self, task: Task, work: Callable[[], Awaitable[JsonObj]]) -> None:
        try:
            result = await work()
        except asyncio.CancelledError:
            task.settle("cancelled")
        except MCPError as exc:
            task.settle("failed", error={"code": exc.code, "message": str(exc.message)})
        else:
            task.settle("completed", result=result)

    def call_v1(self, name: str, args: JsonObj, announce: Announce) -> JsonObj:
        """A 2025-11-25 task-augmented ``tools/call``: ``CreateTaskResult`` at once, the work in the background."""
        stamp = _now()
        task = self.add(Task(f"task1-{secrets.token_hex(8)}", stamp, stamp, announce=announce))
        task.runner = asyncio.get_running_loop().create_task(self._work(task, lambda: _run_fixture(name, args, None)))
        return {"task": task.v1()}

    def _find_v1(self, params: RequestParams) -> Task:
        task_id = params.model_dump(by_alias=True).get("taskId")
        task = self.tasks.get(str(task_id))
        if task is None:
            raise MCPError(INVALID_PARAMS, f"Unknown task: {task_id}")
        return task

    def get_v1(self, params: RequestParams) -> JsonObj:
        return self._find_v1(params).v1()

    async def result_v1(self, params: RequestParams) -> JsonObj:
        """``tasks/result``: waits for the end, then the call's own result (or its protocol error)."""
        task = self._find_v1(params)
        await task.ended.wait()
        related = {RELATED_TASK: {"taskId": task.task_id}}
        if task.error is not None:
            raise MCPError(int(task.error["code"]), str(task.error["message"]), related)
        if task.result is None:
            raise MCPError(INVALID_PARAMS, f"Task {task.task_id} was cancelled", related)
        return {**task.result, "_meta": related}

    def list_v1(self) -> JsonObj:
        return {"tasks": [t.v1() for t in self.tasks.values()]}

    def cancel_v1(self, params: RequestParams) -> JsonObj:
        task = self._find_v1(params)
        if task.status in TERMINAL:
            raise MCPError(INVALID_PARAMS, f"Task {task.task_id} already ended ({task.status})")
        if task.runner is not None and not task.runner.done():
            task.runner.cancel()
        task.settle("cancelled")
        return task.v1()

    def _find(self, params: RequestParams, session_capabilities: object) -> Task:
        raw = params.model_dump(by_alias=True)
        if not declares_tasks(raw.get("_meta"), session_capabilities):
            raise missing_capability()
        task = self.tasks.get(str(raw.get("taskId")))
        if task is None:
            raise MCPError(INVALID_PARAMS, f"Unknown task: {raw.get('taskId')}")
        return task

    def get(self, params: RequestParams, session_capabilities: object) -> JsonObj:
        return self._find(params, session_capabilities).detailed()

    def cancel(self, params: RequestParams, session_capabilities: object) -> JsonObj:
        task = self._find(params, session_capabilities)
        if task.runner is not None and not task.runner.done():
            task.runner.cancel()
        task.settle("cancelled")
        return {"resultType": "complete"}

    def update(self, params: RequestParams, session_capabilities: object) -> JsonObj:
        self._find(params, session_capabilities).answer(params.model_dump(by_alias=True).get("inputResponses"))
        return {"resultType": "complete"}


class TaskParams(RequestParams):
    """``tasks/get``, ``tasks/update``, ``tasks/cancel``: a ``taskId`` (kept as given, extra fields allowed)."""

    model_config = {**RequestParams.model_config, "extra": "allow"}


def install(server: Any, store: TaskStore, listen: Any | None = None) -> None:
    """The extension's methods on a low-level SDK server, and its advertisement; v1 shapes on a 2025 session.
    ``listen``: the server's ``subscriptions/listen`` handler, which then also follows ``taskIds``."""

    def handler(modern: Callable[[RequestParams, object], JsonObj],
                legacy: Callable[[RequestParams], Any] | None) -> Any:
        async def handle(ctx: Any, params: TaskParams) -> JsonObj:
            if ctx.protocol_version == MODERN_REVISION:
                return modern(params, session_capabilities(ctx))
            if legacy is None:
                raise MCPError(METHOD_NOT_FOUND, "Method not found")
            found = legacy(params)
            return dict(await found) if asyncio.iscoroutine(found) else dict(found)

        return handle

    def removed(params: RequestParams, _caps: object) -> JsonObj:  # v1 methods: gone at 2026-07-28
        raise MCPError(METHOD_NOT_FOUND, "Method not found")

    server.add_request_handler("tasks/get", TaskParams, handler(store.get, store.get_v1))
    server.add_request_handler("tasks/cancel", TaskParams, handler(store.cancel, store.cancel_v1))
    server.add_request_handler("tasks/update", TaskParams, handler(store.update, None))
    server.add_request_handler("tasks/result", TaskParams, handler(removed, store.result_v1))
    server.add_request_handler("tasks/list", TaskParams, handler(removed, lambda _params: store.list_v1()))
    server.extensions[TASKS_EXTENSION] = {}
    server.tasks_v1 = True
    if listen is not None:
        server.add_request_handler("subscriptions/listen", TaskParams, following_tasks(listen, store))
    _admit_v1_created_tasks()


def _admit_v1_created_tasks() -> None:
    """Let a 2025-11-25 ``tools/call`` answer ``CreateTaskResult``: the SDK checks a handshake-era ``tools/call``
    result against ``CallToolResult`` alone (it implements no v1 tasks), so that one check is widened here."""
    check = mcp_methods.serialize_server_result
    if getattr(check, "admits_v1_tasks", False):
        return

    def widened(method: str, version: str, data: Any, **kwargs: Any) -> dict[str, Any]:
        if method == "tools/call" and version != MODERN_REVISION and isinstance(data.get("task"), dict):
            return dict(data)
        return check(method, version, data, **kwargs)

    widened.admits_v1_tasks = True  # type: ignore[attr-defined]
    mcp_methods.serialize_server_result = widened


class RawNotification(BaseModel):
    """A notification the SDK has no model for (the extension's ``notifications/tasks``), sent as it is."""

    method: str
    params: JsonObj


def following_tasks(listen: Any, store: TaskStore) -> Any:
    """``subscriptions/listen`` with the extension's ``taskIds``: the SDK's own stream (list changes, resource
    updates), and on it each change of a followed task as ``notifications/tasks`` (what ``tasks/get`` would say)."""

    async def handle(ctx: Any, params: TaskParams) -> Any:
        raw = params.model_dump(by_alias=True, exclude_none=True)
        asked = (raw.get("notifications") or {}).get("taskIds") or []
        followed = {t for t in asked if isinstance(t, str)}
        own = SubscriptionsListenRequestParams.model_validate(raw)
        if not followed:
            return await listen(ctx, own)
        changes: asyncio.Queue[Task] = asyncio.Queue()
        unfollow = store.follow(lambda task: changes.put_nowait(task) if task.task_id in followed else None)

        async def forward() -> None:
            while True:
                task = await changes.get()
                detail = {k: v for k, v in task.detailed().items() if k != "resultType"}
                await ctx.session.send_notification(RawNotification(
                    method="notifications/tasks", params={**detail, "_meta": {SUBSCRIPTION_ID: ctx.request_id}}),
                    related_request_id=ctx.request_id)

        sender = asyncio.get_running_loop().create_task(forward())
        try:
            return await listen(ctx, own)
        finally:
            sender.cancel()
            unfollow()

    return handle


def announcer(ctx: Any) -> Announce:
    """Sends a v1 task's changes of status to the session that created it (outside any request: its GET stream)."""
    session = ctx.session

    async def announce(task: JsonObj) -> None:
        with contextlib.suppress(Exception):  # the session may be gone; the task's state still answers tasks/get
            await session.send_notification(types.TaskStatusNotification(
                params=types.TaskStatusNotificationParams.model_validate(task)))

    return announce


def session_capabilities(ctx: Any) -> object:
    declared = ctx.session.client_capabilities
    return declared.model_dump(by_alias=True, exclude_none=True) if declared is not None else None
