"""One call's answer over HTTP: an SSE stream for a client that reads one, else JSON.

Shared by the 2025 revisions and 2026-07-28. A 2025 session that accepts ``text/event-stream``
gets every answer as a stream (on 2025-11-25: a priming event with an id and a ``retry`` field
first, an id on every event, the stream resumable with ``Last-Event-ID``); 2026-07-28 streams only
once something must reach the client before the answer. Either way a call that is refused before
anything was written keeps its own HTTP status as a JSON answer: never a 200 stream carrying an
error.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from aiohttp import web

from satgate_mcp.jsonrpc import JsonObj
from satgate_mcp.transport.answers import json_answer, sse_event
from satgate_mcp.transport.replay import RETRY_MS, CallLog, ReplayBook, new_stream_id
from satgate_mcp.transport.rules import reply_status

SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache, no-transform",
               "X-Accel-Buffering": "no"}
_WRITE_ERRORS = (ConnectionError, RuntimeError)
#: A call that takes longer than this opens its stream (quick calls answer in one write).
OPEN_AFTER = 0.05


class CallStream:
    """The answer to one call.

    The stream is prepared only by an event the upstream sent or by a keep-alive once the call is
    admitted (so after every check that can refuse it), or at the end for an answer that is not a
    refusal. With a ``replay`` book every event is kept there too, so a client that lost the stream
    can resume it; ``pause`` ends the client's stream mid-call (the upstream did the same) while the
    events go on being kept for the client's reconnection.
    """

    def __init__(self, request: web.Request, headers: dict[str, str], *, event_ids: bool,
                 stream_quiet: bool = False, replay: ReplayBook | None = None, session_id: str = "", poll: float = 0.0,
                 owed: Callable[[], list[JsonObj]] = list, owes: Callable[[], bool] = lambda: False) -> None:
        self._request = request
        self._headers = headers
        self._owed = owed
        self._owes = owes
        self._event_ids = event_ids
        self._stream_quiet = stream_quiet
        self._poll = poll
        self._quiet_since = 0.0
        self._log: CallLog | None = replay.open(session_id) if (replay is not None and event_ids) else None
        self._replay = replay
        self._stream_id = self._log.stream_id if self._log is not None else new_stream_id()
        self._events = 0
        self._response: web.StreamResponse | None = None
        self._lock = asyncio.Lock()
        #: The client stopped reading (its connection broke, or the stream was paused).
        self.gone = False

    def _frame(self, message: JsonObj) -> bytes:
        """One event; on 2025-11-25 with an id, and kept for a resumption."""
        body = sse_event(message)
        if not self._event_ids:
            return body
        self._events += 1
        frame = f"id: {self._stream_id}-{self._events}\n".encode() + body
        if self._log is not None:
            self._log.add(self._events, frame)
        return frame

    def _priming(self) -> bytes:
        """An id with no data, and how long to wait before reconnecting: what a resumption starts from."""
        return f"id: {self._stream_id}-0\nretry: {RETRY_MS}\ndata: \n\n".encode()

    async def _open(self, first: JsonObj | None = None) -> web.StreamResponse:
        """Prepare the stream; its opening (priming event, owed notices, ``first``) goes out in one write.
        Frames are kept before any I/O."""
        if self._response is None:
            head = self._head(first)
            response = web.StreamResponse(headers={**self._headers, **SSE_HEADERS})
            await response.prepare(self._request)
            self._response = response
            self._quiet_since = asyncio.get_running_loop().time()
            if head:
                await response.write(head)
        return self._response

    def _head(self, first: JsonObj | None) -> bytes:
        """A stream's opening: the priming event, the notices owed, then ``first`` (kept for a resumption)."""
        head = self._priming() if self._event_ids else b""
        head += b"".join(self._frame(note) for note in self._owed())
        return head + self._frame(first) if first is not None else head

    async def _write(self, frame: bytes, *, event: bool = True) -> None:
        """Write to the client unless it is gone; the frame is already kept for a resumption.

        A keep-alive comment is no ``event``: it does not end the stream's quiet time.
        """
        if self.gone:
            return
        if event:
            self._quiet_since = asyncio.get_running_loop().time()
        try:
            assert self._response is not None
            await self._response.write(frame)
        except _WRITE_ERRORS:
            self.gone = True

    async def emit(self, message: JsonObj) -> bool:
        """Write one message; False once nobody can receive it (no client, and no resumption possible)."""
        async with self._lock:
            if self.gone and self._log is None:
                return False
            if self._response is None and not self.gone:
                try:
                    await self._open(message)
                except _WRITE_ERRORS:
                    self.gone = True
            else:
                await self._write(self._frame(message))
            return not self.gone or self._log is not None

    async def pause(self) -> None:
        """End the client's stream now; it reconnects with ``Last-Event-ID`` and gets the rest (2025-11-25 only)."""
        async with self._lock:
            if self._log is None or self.gone:
                return
            try:
                await self._open()
                assert self._response is not None
                await self._response.write_eof()
            except _WRITE_ERRORS:
                pass
            self.gone = True

    def keep_alive_later(self, admitted: asyncio.Event, every: float) -> Callable[[], None]:
        """``keep_alive`` for a call still running once its first wait has passed; what stops it is returned.

        Most calls end sooner: they cost one timer, not a task that waits and sleeps.
        """
        loop = asyncio.get_running_loop()
        first = self._first_wait(every)
        task: asyncio.Task[None] | None = None

        def start() -> None:
            nonlocal task
            task = loop.create_task(self.keep_alive(admitted, every, waited=first))

        timer = loop.call_later(first, start)

        def stop() -> None:
            timer.cancel()
            if task is not None:
                task.cancel()

        return stop

    def _first_wait(self, every: float) -> float:
        return min(every, OPEN_AFTER) if self._stream_quiet else every

    async def keep_alive(self, admitted: asyncio.Event, every: float, *, waited: float = 0.0) -> None:
        """Once admitted, a call still running after ``OPEN_AFTER`` opens its stream (on 2025-11-25 its priming
        event gives the client an id to resume from), then a comment every ``every`` seconds keeps it open.
        ``waited``: time the call already ran, counted off the first wait (admission comes first either way)."""
        await admitted.wait()
        loop = asyncio.get_running_loop()
        polls = self._poll > 0 and self._log is not None
        wait = max(0.0, self._first_wait(every) - waited)
        while not self.gone:
            await asyncio.sleep(wait)
            wait = min(every, self._poll) if polls else every
            if polls and self._response is not None and loop.time() - self._quiet_since >= self._poll:
                await self.pause()  # quiet long enough: the client polls for the rest
                return
            async with self._lock:
                opening = self._response is None and self._stream_quiet
                try:
                    await self._open()
                except _WRITE_ERRORS:
                    self.gone = True
                    continue
                if not opening:
                    await self._write(b": keepalive\n\n", event=False)

    async def finish(self, reply: JsonObj, *, admitted: bool = True) -> web.StreamResponse:
        """The answer: the stream's last event, or JSON for a refusal (or a quiet call where streams are lazy).

        A refusal is an error answer of a call that was never ``admitted``, or one with its own HTTP status.
        """
        async with self._lock:
            delivered = False
            try:
                status, extra = reply_status(reply)
                refused = status != 200 or (not admitted and "error" in reply)
                if self._response is None and not self.gone and (
                        refused or not (self._stream_quiet or self._owes())):
                    delivered = True
                    return json_answer(reply, status, headers={**self._headers, **extra})
                if self._response is None and not self.gone:
                    # Nothing written yet: the whole stream is known, so it goes as one plain response (no chunks).
                    delivered = True
                    return web.Response(body=self._head(reply), headers={**self._headers, **SSE_HEADERS})
                else:
                    frame = self._frame(reply)  # kept for a resumption even when the client is gone
                    transport = self._request.transport
                    if transport is None or transport.is_closing():  # write_eof would not say so
                        self.gone = True
                    if not self.gone:
                        try:
                            assert self._response is not None
                            await self._response.write_eof(frame)
                            delivered = True
                        except _WRITE_ERRORS:
                            self.gone = True
                if self._response is None:  # the client was gone before anything was written
                    return web.Response(status=status, headers=self._headers)
                return self._response
            finally:
                self.end(delivered=delivered)

    def end(self, *, delivered: bool = False) -> None:
        """The call is over (answered, or cut): a resumption gets what was kept, then the stream's end."""
        if self._log is not None and self._replay is not None:
            log, self._log = self._log, None
            self._replay.close(log, delivered=delivered)
