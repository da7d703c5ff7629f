"""Identical copies of a call in flight in this process share one execution.

The execution runs in its own task, so one copy going away (its client disconnected or cancelled)
leaves it running for the others; only when no copy waits any more is it cancelled. What a copy
*is* (the duplicate key) and who pays for it is duplicates.py's; this is only the in-memory half.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator

from satgate_mcp.errors import GatewayError
from satgate_mcp.jsonrpc import JsonObj

UpstreamCall = Callable[[], Awaitable[JsonObj]]
#: Settles the call from how it ended (its reply, or what it raised) before any copy sees the answer.
Finish = Callable[[JsonObj | None, BaseException | None], Awaitable[None]]


def cancelled() -> GatewayError:
    """What a copy that joined a call gets when that call was cancelled (or never started) under it."""
    return GatewayError("Request cancelled", {"error": "cancelled"})


class SharedCall:
    """The one execution that identical copies of a call in flight all await."""

    def __init__(self) -> None:
        self.answer: asyncio.Future[JsonObj] = asyncio.get_running_loop().create_future()
        self.task: asyncio.Task[None] | None = None
        self.waiters = 0

    def fail(self, exc: BaseException) -> None:
        if not self.answer.done():
            self.answer.set_exception(exc)
            self.answer.exception()  # retrieved here: copies that join re-raise it, none need to

    def start(self, call: UpstreamCall, finish: Finish) -> None:
        """Run ``call`` once, in its own task; later starts are no-ops."""
        if self.task is None:
            self.task = asyncio.create_task(self._execute(call, finish))

    async def _execute(self, call: UpstreamCall, finish: Finish) -> None:
        reply: JsonObj | None = None
        failure: BaseException | None = None
        try:
            reply = await call()
        except BaseException as exc:
            failure = exc
        try:
            await finish(reply, failure)
        finally:
            if reply is not None:
                self.answer.set_result(reply)
            elif isinstance(failure, asyncio.CancelledError):
                self.fail(cancelled())
            else:
                self.fail(failure or RuntimeError("no reply"))

    async def join(self) -> JsonObj:
        self.waiters += 1
        try:
            return await asyncio.shield(self.answer)
        finally:
            self.waiters -= 1
            if self.waiters == 0 and self.task is not None and not self.task.done():
                self.task.cancel()  # nobody wants the answer any more: let the upstream know
                await asyncio.wait({self.task})


class InFlight:
    """The calls in flight in this process, by duplicate key: what identical copies join."""

    def __init__(self) -> None:
        self._calls: dict[str, SharedCall] = {}

    def __len__(self) -> int:
        return len(self._calls)

    def __iter__(self) -> Iterator[SharedCall]:
        return iter(self._calls.values())

    def get(self, key: str) -> SharedCall | None:
        return self._calls.get(key)

    def open(self, key: str) -> SharedCall:
        """Register a new execution; call it before any await, so a copy arriving meanwhile joins it."""
        call = self._calls[key] = SharedCall()
        return call

    def release(self, key: str, call: SharedCall) -> None:
        """Forget ``call``: a copy arriving later is a new call. Copies waiting on it get a cancellation
        if it never started (it settled without running)."""
        if self._calls.get(key) is call:
            del self._calls[key]
        if call.task is None:
            call.fail(cancelled())
