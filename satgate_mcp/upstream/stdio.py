"""An upstream MCP server run as a child process speaking newline-delimited JSON-RPC on stdio.

One child serves every client session (or, under ``"isolation"``, one token's or one session's:
``isolated.py`` keeps a child of this kind per owner). A supervisor task owns the child's life: spawn,
initialize, watch, and on death fail every call in flight at once, then restart with backoff.
The child runs in its own process group so that stopping it also stops anything it spawned.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import signal
from typing import Any

from satgate_mcp import jsonrpc
from satgate_mcp.errors import UpstreamTimeout, UpstreamUnavailable
from satgate_mcp.events import Publisher
from satgate_mcp.jsonrpc import JsonObj
from satgate_mcp.metrics import Metrics
from satgate_mcp.settings import StdioUpstreamSpec
from satgate_mcp.upstream.base import NotificationCallback, ProgressCallback, initialize_timeout
from satgate_mcp.upstream.child_output import LINE_LIMIT, Dropped, answered_id, parse_line, read_line, unreadable_reply
from satgate_mcp.upstream.child_process import ChildProcess
from satgate_mcp.upstream.inbox import RELIST_NOTIFICATION
from satgate_mcp.upstream.outgoing import encode_message
from satgate_mcp.upstream.stdio_handover import StdioHandover
from satgate_mcp.upstream.wire import (
    RestartPolicy,
    cancelled_params,
    check_initialize_result,
    child_env,
    clip,
    describe_exit,
    discover_params,
    discover_timeout,
    discovered_result,
    initialize_params,
    restart_plan,
)

#: The ids of the ``subscriptions/listen`` requests a modern child answers only when they end (never reused).
LISTEN_ID = "satgate-listen"

class StdioUpstream(StdioHandover):
    def __init__(
        self,
        name: str,
        spec: StdioUpstreamSpec,
        *,
        publisher: Publisher,
        metrics: Metrics,
        restart_policy: RestartPolicy | None = None,
        ready_grace: float = 2.0,
        stop_grace: float = 1.0,
        terminate_timeout: float = 3.0,
        instance: str | None = None,
    ) -> None:
        """``instance``: which of an isolated upstream's children this is (its owner, or "catalogue"), for logs."""
        super().__init__(name, spec, transport="stdio", send=self._write, publisher=publisher, metrics=metrics,
                         restart_policy=restart_policy)
        self._instance = instance
        if instance is not None:
            self._log = self._log.bind(instance=instance)
        self._ready_grace = ready_grace
        #: The running child's last stderr line: a child that dies at start usually says why there.
        self._last_stderr: str | None = None
        self._stop_grace = stop_grace
        self._terminate_timeout = terminate_timeout
        self._pending: dict[int, asyncio.Future[JsonObj]] = {}
        self._proc: ChildProcess | None = None
        self._write_lock = asyncio.Lock()
        self._supervisor: asyncio.Task[None] | None = None
        #: Set once a child showed it is a 2025 one by dying or staying silent on ``server/discover``.
        self._skip_discover = False
        self.restarts = 0
        #: The open listen request of a modern child: a new filter replaces it (new id, the old one cancelled).
        self._listens = itertools.count(1)
        self._listen_id: str | None = None

    @property
    def pid(self) -> int | None:
        """The running child's pid (also its process group id), for tests and diagnostics."""
        return self._proc.pid if self._proc is not None and self._proc.returncode is None else None

    async def start(self, on_notification: NotificationCallback) -> None:
        if self._supervisor is not None or self._closing.is_set():
            return
        self._inbox.on_notification = on_notification
        self._supervisor = asyncio.create_task(self._supervise(), name=f"upstream-{self.name}")

    async def _request(self, method: str, params: JsonObj | None, budget: float,
                       on_progress: ProgressCallback | None) -> JsonObj:
        if self._transit is not None:
            if (listed := self._transit.listed(method, params)) is not None:
                return listed
            await self._wait_transit()
        await self._await_ready(budget)
        return await self._roundtrip(method, params, budget, on_progress)

    async def notify(self, method: str, params: JsonObj | None) -> None:
        await self._await_ready(self._spec.timeout)
        await self._write(jsonrpc.notification_message(method, params))

    async def close(self) -> None:
        if not self._begin_close():
            return
        self._fail_pending(f"upstream {self.name!r} is shutting down")
        await self._close_twin()
        proc = self._proc
        if proc is not None:
            await self._stop_child(proc)
        if self._supervisor is not None:
            done, _ = await asyncio.wait({self._supervisor}, timeout=self._terminate_timeout + 1)
            if not done:
                self._supervisor.cancel()
                await asyncio.wait({self._supervisor})
        await self._inbox.aclose()

    # -- the child's life ------------------------------------------------------------------

    async def _supervise(self) -> None:
        loop = asyncio.get_running_loop()
        attempt = 0
        while not self._closing.is_set():
            started = loop.time()
            reason = await self._run_child()
            if self._closing.is_set():
                break
            delay, attempt = restart_plan(attempt, loop.time() - started, self._policy)
            self.restarts += 1
            self._count_restart(reason=reason, delay=delay, attempt=attempt)
            self._log.warning("upstream_restarting", reason=reason, delay=delay, attempt=attempt)
            await self._pause(delay)

    async def _run_child(self) -> str:
        """Run one child from spawn to death; return why it ended."""
        delivery = await self._take_delivery()
        try:
            proc = await (ChildProcess.spawn(self._spec.command, child_env(os.environ, self._spec.env), self._spec.cwd,
                                             limit=LINE_LIMIT) if delivery is None else
                          ChildProcess.wrap(delivery.record.pid, delivery.pidfd, delivery.fds, limit=LINE_LIMIT,
                                            own=False))
        except OSError as exc:
            self._log.error("upstream_spawn_failed", command=self._spec.command[0], error=str(exc))
            reason = f"could not start {self._spec.command[0]!r}: {exc.strerror or exc}"
            self._mark_down({"status": reason})
            return reason
        self._proc = proc
        self._log.info("upstream_spawned" if delivery is None else "upstream_adopting", pid=proc.pid)
        reader = asyncio.create_task(self._read_stdout(proc))
        self._last_stderr = None  # this child's own last line, not its predecessor's
        errors = asyncio.create_task(self._read_stderr(proc))
        exited = asyncio.create_task(proc.wait())
        init = asyncio.create_task(self._initialize() if delivery is None else self._resume(delivery))
        failure: str | None = None
        try:
            failure = await self._watch(proc, init, reader, exited)
        finally:
            self._ready.clear()
            self._fail_pending(f"upstream {self.name!r} went away ({self._exit_reason(proc)})")
            if not self._handed_over:
                await self._stop_child(proc)
            await asyncio.wait({reader, errors, exited, init}, timeout=1.0)
            for task in (reader, errors, exited, init):
                task.cancel()
                if task.done() and not task.cancelled():
                    task.exception()  # retrieved: a failure here is reported by _watch
            self._proc = None
            proc.close()
            if not self._handed_over:
                self._log.info("upstream_exited", pid=proc.pid, status=describe_exit(proc.returncode))
            if not self._closing.is_set():
                self._mark_down(down_report(failure or describe_exit(proc.returncode), self._last_stderr))
        return failure or describe_exit(proc.returncode)

    async def _watch(
        self,
        proc: ChildProcess,
        init: asyncio.Task[None],
        reader: asyncio.Task[None],
        exited: asyncio.Task[int],
    ) -> str | None:
        """Wait until initialize fails or the child goes away; the failure text, if it failed."""
        if self._closing.is_set():
            return None
        await asyncio.wait({init, reader, exited}, return_when=asyncio.FIRST_COMPLETED)
        if init.done() and init.exception() is not None:
            self._log.error("upstream_initialize_failed", error=str(init.exception()))
            return f"initialize failed: {init.exception()}"
        if init.done():
            self._mark_ready()
            self._log.info("upstream_ready", pid=proc.pid, server=(self._init_result or {}).get("serverInfo"))
            self._inbox.notify(RELIST_NOTIFICATION, None)
            await asyncio.wait({reader, exited}, return_when=asyncio.FIRST_COMPLETED)
        return None

    def _exit_reason(self, proc: ChildProcess) -> str:
        return "its output closed" if proc.returncode is None else describe_exit(proc.returncode)

    async def _initialize(self) -> None:
        """The era ``protocol`` asks for: the handshake first (``auto``), or ``server/discover`` first (``2026``)."""
        self._modern = False
        protocol = self._spec.protocol
        asks_first = protocol == "2026" and (self._discover_only or not self._skip_discover)
        discovered = await self._discover() if asks_first else None
        if discovered is None and self._discover_only:
            raise UpstreamUnavailable(f"upstream {self.name!r} does not answer server/discover")
        if discovered is None:
            reply = await self._roundtrip("initialize", initialize_params(), initialize_timeout(self._spec.timeout),
                                          None)
            if protocol != "2025" and "error" in reply:  # refused: perhaps a 2026-07-28-only child
                discovered = await self._discover()
                if discovered is None:
                    check_initialize_result(reply)  # raises, naming the handshake's refusal
        if discovered is not None:
            self._modern, self._init_result = True, discovered
            self._listen_id = f"{LISTEN_ID}-{next(self._listens)}"
            await self._write(self._listen_request(self._listen_id))
            return
        result = check_initialize_result(reply)
        await self._write(jsonrpc.notification_message("notifications/initialized"))
        self._init_result = result

    def _make_twin(self) -> StdioUpstream:
        """A second child: a stdio server serves the era of the first request on its pipe, and only that one."""
        twin = StdioUpstream(self.name, self._spec.model_copy(update={"protocol": "2026"}), publisher=self._publisher,
                             metrics=self._metrics, restart_policy=self._policy, instance="2026-07-28")
        twin._discover_only = True
        return twin

    async def _relisten(self) -> None:
        """The new filter's listen request first, then the old one cancelled: an update may come twice, never not
        at all. A child that is not up gets the current filter when it starts."""
        old = self._listen_id
        if not (self._modern and self._ready.is_set()) or old is None:
            return
        self._listen_id = f"{LISTEN_ID}-{next(self._listens)}"
        try:
            await self._write(self._listen_request(self._listen_id))
            await self._write(jsonrpc.notification_message("notifications/cancelled",
                                                           cancelled_params(old, "listen filter changed")))
        except UpstreamUnavailable as exc:
            self._log.info("upstream_relisten_failed", error=exc.message)

    async def _discover(self) -> JsonObj | None:
        """The modern result, or None for a 2025 child; a child that dies or stays silent is not asked again.

        Some 2025 servers exit on any request before ``initialize``: asking each restart would never get one up.
        A twin asks nothing else, so it asks again; a 2026-07-28 child killed meanwhile is found again when it
        refuses the handshake.
        """
        try:
            found = discovered_result(await self._roundtrip(
                "server/discover", discover_params(), discover_timeout(self._spec.timeout), None))
        except UpstreamTimeout:
            self._skip_discover = self.declined = True
            return None
        except UpstreamUnavailable:
            self._skip_discover = not self._discover_only
            raise
        self.declined = found is None
        return found

    async def _stop_child(self, proc: ChildProcess) -> None:
        """EOF on stdin, then SIGTERM, then SIGKILL to the whole group; always reaped."""
        if proc.returncode is None:
            if proc.stdin is not None and not proc.stdin.is_closing():
                proc.stdin.close()
            if not await _exited_within(proc, self._stop_grace):
                _signal_group(proc.pid, signal.SIGTERM)
                if not await _exited_within(proc, self._terminate_timeout):
                    _signal_group(proc.pid, signal.SIGKILL)
                    await proc.wait()
        # Anything the child left behind in its group goes with it.
        _signal_group(proc.pid, signal.SIGKILL)

    def _fail_pending(self, why: str) -> None:
        pending = list(self._pending.values())
        self._pending.clear()
        for fut in pending:
            if not fut.done():
                # in_flight: the upstream may have started (even finished) the work before it died.
                fut.set_exception(self._unavailable(f"{why}; the call was lost", in_flight=True))

    # -- wire --------------------------------------------------------------------------------

    async def _await_ready(self, budget: float) -> None:
        if self._closing.is_set():
            raise self._unavailable(f"upstream {self.name!r} is shut down", sent=False)
        if not await self.wait_ready(min(self._ready_grace, budget)):
            failure = self.last_failure  # its last child's end says more than "restarting"
            last = f"; last try: {failure['status']}" if failure is not None else ""
            raise self._unavailable(f"upstream {self.name!r} is not running (starting or restarting{last})",
                                    sent=False)

    async def _roundtrip(
        self, method: str, params: JsonObj | None, timeout: float, on_progress: ProgressCallback | None
    ) -> JsonObj:
        loop = asyncio.get_running_loop()
        upstream_id = next(self._ids)
        params, route = self._inbox.open_route(params, on_progress)
        reply: asyncio.Future[JsonObj] = loop.create_future()
        self._pending[upstream_id] = reply
        sent = False
        try:
            async with asyncio.timeout(timeout) as clock:
                self._inbox.time_route(route, clock, timeout)
                await self._write(jsonrpc.request_message(upstream_id, method, params))
                sent = True
                answer = await reply
                await self._inbox.close_route(route, drain=True)
            return answer
        except TimeoutError:
            raise await self._timed_out(upstream_id, method, timeout, sent=sent) from None
        except asyncio.CancelledError:
            if sent and (reply.cancelled() or not reply.done()):  # awaiting it cancelled it
                self._inbox.spawn(self._send_cancel(upstream_id, "cancelled by the client"))
            raise
        finally:
            self._pending.pop(upstream_id, None)
            await self._inbox.close_route(route, drain=False)

    async def _write(self, message: JsonObj) -> None:
        proc = self._proc
        stdin = proc.stdin if proc is not None else None
        if stdin is None or stdin.is_closing():
            raise self._unavailable(f"upstream {self.name!r} is not running", sent=False)
        line = encode_message(message) + b"\n"
        async with self._write_lock:
            try:
                stdin.write(line)
                await stdin.drain()
            except (BrokenPipeError, ConnectionResetError) as exc:
                raise self._unavailable(f"upstream {self.name!r} closed its input: {exc}") from None

    async def _read_stdout(self, proc: ChildProcess) -> None:
        assert proc.stdout is not None
        while (line := await read_line(proc.stdout)) is not None:
            value = parse_line(line) if isinstance(line, bytes) else line
            if isinstance(value, Dropped):
                self._dropped(value)
            elif value is not None:
                self._receive(value)

    def _receive(self, value: Any) -> None:
        for message, item in self._sort_incoming(value):
            waiter = self._pending.get(message.id) if isinstance(message.id, int) else None
            if waiter is None or waiter.done():
                self._log.debug("upstream_reply_unmatched", request_id=message.id)
            else:
                waiter.set_result(item)

    def _dropped(self, dropped: Dropped) -> None:
        """Logged; the call it answered (when its head names one) gets an error now, not at its timeout."""
        head = clip(dropped.head.decode("utf-8", errors="replace"), 200)
        if dropped.reason == "too_long":
            self._log.warning("upstream_line_too_long", limit=LINE_LIMIT, head=head)
        else:
            self._log.warning("upstream_output_not_json", line=head)
        request_id = answered_id(dropped.head)
        waiter = self._pending.get(request_id) if request_id is not None else None
        if request_id is not None and waiter is not None and not waiter.done():
            waiter.set_result(unreadable_reply(request_id, self.name, dropped))

    async def _read_stderr(self, proc: ChildProcess) -> None:
        assert proc.stderr is not None
        while True:
            try:
                line = await proc.stderr.readline()
            except ValueError:
                continue
            if not line:
                return
            text = line.decode("utf-8", errors="replace").rstrip()
            if text:
                self._last_stderr = clip(text)
                self._log.info("upstream_stderr", line=self._last_stderr)


def down_report(status: str, stderr: str | None) -> dict[str, str]:
    """What /readyz and the start-up warning say of a child that is down: how it ended, and its last words."""
    return {"status": status} if stderr is None else {"status": status, "stderr": stderr}


async def _exited_within(proc: ChildProcess, timeout: float) -> bool:
    try:
        async with asyncio.timeout(timeout):
            await proc.wait()
    except TimeoutError:
        return False
    return True


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)
