"""One call's answer over HTTP: JSON, or an SSE stream once something must reach the client before it.

Shared by the 2025 revisions (events with ids and a priming event on 2025-11-25, notices owed to the
session first) and 2026-07-28 (a stream scoped to the one request, nothing owed).
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import Callable

from aiohttp import web

from satgate_mcp.jsonrpc import JsonObj
from satgate_mcp.transport.edge import json_answer, sse_event
from satgate_mcp.transport.rules import reply_status

SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache, no-transform",
               "X-Accel-Buffering": "no"}


class CallStream:
    """The answer to one call: JSON unless something must reach the client first, then SSE from that moment.

    The stream is prepared only by an event the upstream sent (so after every check that can refuse
    the call), or by a keep-alive once the call is admitted: a refused call keeps its own answer.
    """

    def __init__(self, request: web.Request, headers: dict[str, str], *, event_ids: bool,
                 owed: Callable[[], list[JsonObj]] = list, owes: Callable[[], bool] = lambda: False) -> None:
        self._request = request
        self._headers = headers
        self._owed = owed
        self._owes = owes
        self._event_ids = event_ids
        self._stream_id = secrets.token_hex(8)
        self._events = 0
        self._response: web.StreamResponse | None = None
        self._lock = asyncio.Lock()
        self.gone = False

    def _frame(self, message: JsonObj | None) -> bytes:
        """One event; on 2025-11-25 with an id (the priming event has no data)."""
        body = sse_event(message) if message is not None else b"data: \n\n"
        if not self._event_ids:
            return body
        self._events += 1
        return f"id: {self._stream_id}-{self._events}\n".encode() + body

    async def _open(self) -> web.StreamResponse:
        if self._response is None:
            response = web.StreamResponse(headers={**self._headers, **SSE_HEADERS})
            await response.prepare(self._request)
            self._response = response
            if self._event_ids:
                await response.write(self._frame(None))
            for note in self._owed():
                await response.write(self._frame(note))
        return self._response

    async def emit(self, message: JsonObj) -> bool:
        """Write one message; False (and nothing more is tried) once the client is gone."""
        async with self._lock:
            if self.gone:
                return False
            try:
                await (await self._open()).write(self._frame(message))
            except (ConnectionError, RuntimeError):
                self.gone = True
                return False
            return True

    async def keep_alive(self, admitted: asyncio.Event, every: float) -> None:
        await admitted.wait()
        while not self.gone:
            await asyncio.sleep(every)
            async with self._lock:
                try:
                    await (await self._open()).write(b": keepalive\n\n")
                except (ConnectionError, RuntimeError):
                    self.gone = True

    async def finish(self, reply: JsonObj) -> web.StreamResponse:
        """The answer: plain JSON when nothing was streamed and nothing is owed, else the stream's last event."""
        async with self._lock:
            if self._response is None and not self._owes():
                status, extra = reply_status(reply)
                return json_answer(reply, status, headers={**self._headers, **extra})
            with contextlib.suppress(ConnectionError, RuntimeError):
                response = await self._open()
                await response.write(self._frame(reply))
                await response.write_eof()
            assert self._response is not None
            return self._response
