"""In-process stand-ins for the upstream pool and the policy, for transport tests that need no child process.

Tests of the upstream layer itself use real MCP servers (tests/upstream_server.py); these fakes only let
HTTP-level rules be checked quickly and deterministically.
"""

from __future__ import annotations

import asyncio
import sys
import types
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from satgate_mcp import jsonrpc
from satgate_mcp.auth.base import Identity
from satgate_mcp.contracts import UnmeteredPolicy
from satgate_mcp.errors import GatewayError, UnknownTarget
from satgate_mcp.events import RecordingPublisher
from satgate_mcp.exits import ExitCode
from satgate_mcp.jsonrpc import JsonObj
from satgate_mcp.policy.refunds import upstream_certainly_did_not_run
from satgate_mcp.settings import Settings
from satgate_mcp.subscriptions import SHARED, Scope
from satgate_mcp.upstream.base import Caller, ProgressCallback
from satgate_mcp.upstream.catalog import LISTINGS, Kind
from satgate_mcp.upstream.surface import unlisted_tool


async def until(condition: Callable[[], bool]) -> None:
    """Yield to the event loop until the gateway reached a state no event announces (bounded, no timing)."""
    for _ in range(10_000):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError("condition never became true")


class QuietLifecycle:
    """The app's part of the ``Pool`` protocol, for fakes without upstreams: nothing to start, close or reap."""

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        return None

    def session_ended(self, session_id: str) -> None:
        return None


class FakePool(QuietLifecycle):
    """Tools ``echo`` (returns its text), ``progress`` (one progress step first) and ``block`` (waits on an event)."""

    def __init__(self, tools: list[str] | None = None) -> None:
        self.tool_names = tools or ["echo", "progress", "block", "secret_tool"]
        self.calls: list[tuple[str, JsonObj | None]] = []
        self.release = asyncio.Event()
        self.started = asyncio.Event()
        self.cancelled = asyncio.Event()
        self.tools_version = 0
        self.log_levels: list[str] = []
        self.listener: Callable[[str, JsonObj | None], None] | None = None
        self.task_listener: Callable[[str, str, JsonObj | None], None] | None = None
        #: The upstreams that list their tasks (2025-11-25 ``tasks/list``): none unless a test says so.
        self.tasks_listed_by: list[str] = []
        #: upstream -> the task ids clients' listen streams follow there, as last told.
        self.watched_tasks: dict[str, frozenset[str]] = {}
        #: (upstream, instructions) as a real pool reports them.
        self.upstream_instructions: list[tuple[str, str]] = []

    def readiness(self) -> dict[str, bool]:
        return {"fake": True}

    def failures(self) -> dict[str, dict[str, str]]:
        return {}

    def circuits(self) -> dict[str, dict[str, object]]:
        return {}

    def capabilities(self) -> JsonObj:
        return {"tools": {"listChanged": True}}

    def instructions(self) -> list[tuple[str, str]]:
        return list(self.upstream_instructions)

    def listen(self, listener: Callable[[str, JsonObj | None], None]) -> None:
        self.listener = listener

    def listen_tasks(self, listener: Callable[[str, str, JsonObj | None], None]) -> None:
        self.task_listener = listener

    def task_listers(self) -> list[str]:
        return list(self.tasks_listed_by)

    async def watch_tasks(self, upstream: str, task_ids: frozenset[str]) -> None:
        self.watched_tasks[upstream] = task_ids

    async def listening(self, timeout: float) -> None:
        return None  # its notices are the test's own: nothing upstream to wait for

    def expect_modern(self, timeout: float) -> None:
        return None

    def tools(self) -> list[JsonObj]:
        return [{"name": n, "inputSchema": {"type": "object"}} for n in self.tool_names]

    def tool(self, name: str) -> JsonObj | None:
        return next((t for t in self.tools() if t.get("name") == name), None)

    def owner_of_tool(self, name: str) -> str | None:
        return "fake" if name in self.tool_names else None

    def unknown_tool(self, name: str) -> GatewayError:
        return unlisted_tool(name, self.failures(), {})

    async def set_log_level(self, level: str) -> None:
        self.log_levels.append(level)

    async def set_caller_log_level(self, caller: Caller, level: str) -> None:
        return None  # no isolated upstreams here

    def subscription_scope(self, uri: str) -> Scope:
        return SHARED

    async def call(self, method: str, params: JsonObj | None, *, on_progress: ProgressCallback | None = None
                   ) -> JsonObj:
        """What the fake upstream answers to one request: every pool operation records and asks this."""
        self.calls.append((method, params))
        args = (params or {}).get("arguments") or {}
        name = (params or {}).get("name")
        if method != "tools/call" or name not in self.tool_names:
            raise UnknownTarget(f"unknown: {name}")
        if name == "progress" and on_progress is not None:
            token = ((params or {}).get("_meta") or {}).get("progressToken")
            await on_progress({"progressToken": token, "progress": 1, "total": 2})
        if name == "block":
            self.started.set()
            try:
                await self.release.wait()
            except asyncio.CancelledError:
                self.cancelled.set()
                raise
        text = str(args.get("text", name))
        return jsonrpc.result_response(0, {"content": [{"type": "text", "text": text}], "isError": False})

    async def call_tool(self, params: JsonObj, *, on_progress: ProgressCallback | None = None) -> JsonObj:
        return await self.call("tools/call", params, on_progress=on_progress)

    async def task_request(self, upstream: str, method: str, params: JsonObj, *,
                           on_progress: ProgressCallback | None = None, timeout: float | None = None
                           ) -> JsonObj | None:
        return await self.call(method, params, on_progress=on_progress)

    async def read_resource(self, params: JsonObj | None, *, on_progress: ProgressCallback | None = None) -> JsonObj:
        return await self.call("resources/read", params, on_progress=on_progress)

    async def subscribe(self, params: JsonObj | None, *, on_progress: ProgressCallback | None = None) -> JsonObj:
        return await self.call("resources/subscribe", params, on_progress=on_progress)

    async def unsubscribe(self, params: JsonObj | None, *, on_progress: ProgressCallback | None = None) -> JsonObj:
        return await self.call("resources/unsubscribe", params, on_progress=on_progress)

    async def get_prompt(self, params: JsonObj | None, *, on_progress: ProgressCallback | None = None) -> JsonObj:
        return await self.call("prompts/get", params, on_progress=on_progress)

    async def complete(self, params: JsonObj | None, *, on_progress: ProgressCallback | None = None) -> JsonObj:
        return await self.call("completion/complete", params, on_progress=on_progress)

    async def listing(self, kind: Kind) -> JsonObj:
        result: JsonObj = (await self.call(LISTINGS[kind].method, None))["result"]
        return result


class AllowAllPolicy(UnmeteredPolicy):
    """Admits everything, records what it settled, and reports an unlimited budget."""

    def __init__(self) -> None:
        self.settled: list[bool] = []

    async def settle(self, admission: Any, *, ran: bool) -> None:
        self.settled.append(ran)

    async def run(self, admission: Any, call: Callable[[], Awaitable[JsonObj]]) -> JsonObj:
        reply: JsonObj | None = None
        failure: BaseException | None = None
        try:
            reply = await call()
            return reply
        except BaseException as exc:
            failure = exc
            raise
        finally:
            await self.settle(admission, ran=not upstream_certainly_did_not_run(reply, failure))

    async def budget_status(self, identity: Identity) -> JsonObj:
        return {"tokenId": identity.token_id, "budgetId": identity.budget_key, "remaining": -1}

    async def delegate(self, identity: Identity, params: JsonObj | None) -> JsonObj:
        return {}


class FakeClock:
    """A clock tests move by hand: what the code under test reads instead of waiting."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class AwaitablePublisher(RecordingPublisher):
    """A RecordingPublisher a test can await: ``await publisher.first(events.SESSION_CLOSE)``."""

    def __init__(self) -> None:
        super().__init__()
        self._published = asyncio.Event()

    def publish(self, event: str, **fields: Any) -> None:
        super().publish(event, **fields)
        self._published.set()

    async def first(self, event: str, timeout: float = 5.0) -> dict[str, Any]:
        async with asyncio.timeout(timeout):
            while not self.named(event):
                self._published.clear()
                await self._published.wait()
        return self.named(event)[0]

    async def at_least(self, event: str, count: int, timeout: float = 5.0) -> list[dict[str, Any]]:
        """Every ``event`` published, once there are ``count`` of them."""
        async with asyncio.timeout(timeout):
            while len(self.named(event)) < count:
                self._published.clear()
                await self._published.wait()
        return self.named(event)


def stub_daemon(monkeypatch: pytest.MonkeyPatch, serve: Callable[[Settings], ExitCode],
                configure_logging: Callable[[Settings], object] = lambda s: None) -> None:
    """``cli.main(["serve", ...])`` with no daemon: the runner module and the logging set-up are this test's."""
    runner = types.ModuleType("satgate_mcp.daemon.runner")
    runner.serve = serve  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "satgate_mcp.daemon.runner", runner)
    import satgate_mcp.logs

    monkeypatch.setattr(satgate_mcp.logs, "configure_logging", configure_logging)
