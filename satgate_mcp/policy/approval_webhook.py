"""``SATGATE_APPROVAL_WEBHOOK``: each approval request (and decision) POSTed as JSON to the operator's URL, off the
call path.

``send`` never blocks and never raises: the payload joins a bounded queue (full: the oldest is dropped, counted and
logged once per drop), and a delivery task POSTs it, up to ``CONCURRENT`` at once so one slow receiver does not
hold up the rest. A 2xx is delivered; a 4xx other than 408 and 429 is given up at once (the receiver refuses the
payload: asking again will not help); anything else (408, 429, 5xx, a refused connection, a timeout) is retried
with exponential backoff and full jitter, honouring ``Retry-After`` (capped), up to ``attempts`` tries.

What is signed, when a secret is set: ``X-Satgate-Signature: sha256=<hex HMAC-SHA256(secret, T + "." + body)>``
where ``T`` is the ``X-Satgate-Timestamp`` header (Unix seconds, as sent on this attempt) and ``body`` the exact
bytes of the request body (compact JSON, keys sorted). A receiver recomputes it (``verify``) and refuses a
timestamp too old, so a captured request cannot be replayed later. ``X-Satgate-Delivery`` is the same on every
attempt of one payload: a receiver that saw it already can answer 2xx and do nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import random
import secrets
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import aiohttp
import orjson
import structlog

from satgate_mcp.settings_governance import check_webhook_url

log = structlog.get_logger("satgate_mcp.approval_webhook")

#: Deliveries in flight at once.
CONCURRENT = 4
#: What ``aclose`` gives pending deliveries before it cancels them.
CLOSE_GRACE_SECONDS = 2.0

Outcome = Callable[[str], None]


def signature(secret: str, timestamp: str, body: bytes) -> str:
    """The ``X-Satgate-Signature`` value of one attempt."""
    digest = hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256).hexdigest()
    return f"sha256={digest}"


def verify(secret: str, timestamp: str, body: bytes, header: str) -> bool:
    """Whether ``header`` signs this timestamp and body under ``secret`` (constant-time)."""
    return hmac.compare_digest(signature(secret, timestamp, body), header)


def retry_after(value: str | None, cap: float) -> float | None:
    """A ``Retry-After`` of whole seconds, capped; None for anything else (an HTTP date is not worth parsing)."""
    if value is None or not value.strip().isdigit():
        return None
    return min(float(value.strip()), cap)


def retried(status: int) -> bool:
    """Whether an answer with this status is worth another try."""
    return status in (408, 429) or status >= 500


class ApprovalWebhook:
    """The sender: ``send`` from the call path, ``start``/``aclose`` with the app."""

    def __init__(self, url: str, secret: str | None, *, outcome: Outcome | None = None, max_queue: int = 1000,
                 attempts: int = 6, first_backoff: float = 0.5, max_backoff: float = 30.0, timeout: float = 10.0,
                 clock: Callable[[], float] = time.time) -> None:
        self.url = check_webhook_url(url)
        self._secret = secret
        self._outcome = outcome or (lambda name: None)
        self._queue: deque[tuple[str, str, bytes]] = deque()
        self._max_queue = max_queue
        self._attempts, self._first, self._max = attempts, first_backoff, max_backoff
        self._timeout = timeout
        self._clock = clock
        self._ready = asyncio.Event()
        #: Set while nothing is queued or in flight.
        self._idle = asyncio.Event()
        self._idle.set()
        self._session: aiohttp.ClientSession | None = None
        self._runner: asyncio.Task[None] | None = None
        self._deliveries: set[asyncio.Task[None]] = set()
        self._slots = asyncio.Semaphore(CONCURRENT)

    def send(self, payload: dict[str, Any]) -> None:
        """Queue one payload; never blocks, never raises."""
        try:
            body = orjson.dumps(payload, option=orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS, default=str)
        except (TypeError, orjson.JSONEncodeError):
            log.warning("approval_webhook_unencodable", event=str(payload.get("event"))[:100])
            return
        if len(self._queue) >= self._max_queue:
            self._queue.popleft()
            self._outcome("dropped")
            log.warning("approval_webhook_dropped", reason="queue full", queued=self._max_queue)
        self._queue.append((secrets.token_hex(16), str(payload.get("event", "approval"))[:100], body))
        self._idle.clear()
        self._ready.set()

    async def start(self) -> None:
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self._timeout))
        self._runner = asyncio.create_task(self._run(), name="approval-webhook")

    async def aclose(self) -> None:
        """Give what is queued or in flight a short grace, then stop."""
        if self._runner is not None:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(CLOSE_GRACE_SECONDS):
                    await self._idle.wait()
            self._runner.cancel()
            for task in [self._runner, *self._deliveries]:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            self._runner = None
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _run(self) -> None:
        while True:
            await self._ready.wait()
            self._ready.clear()
            while self._queue:
                await self._slots.acquire()
                if not self._queue:
                    self._slots.release()
                    break
                delivery, event, body = self._queue.popleft()
                task = asyncio.create_task(self._deliver(delivery, event, body))
                self._deliveries.add(task)
                task.add_done_callback(self._finished)

    def _finished(self, task: asyncio.Task[None]) -> None:
        self._deliveries.discard(task)
        self._slots.release()
        if not self._queue and not self._deliveries:
            self._idle.set()

    async def _deliver(self, delivery: str, event: str, body: bytes) -> None:
        """Every attempt of one payload, until delivered, refused, or out of tries."""
        for attempt in range(self._attempts):
            wait = await self._attempt(delivery, event, body)
            if wait is None:
                return
            if attempt + 1 < self._attempts:
                await asyncio.sleep(wait if wait > 0 else random.uniform(0, min(self._max, self._first * 2**attempt)))
        self._outcome("given_up")
        log.warning("approval_webhook_given_up", delivery=delivery, attempts=self._attempts)

    async def _attempt(self, delivery: str, event: str, body: bytes) -> float | None:
        """One POST: None when done (delivered or refused for good), else how long to wait (0: backoff's choice)."""
        assert self._session is not None
        stamp = str(int(self._clock()))
        headers = {"Content-Type": "application/json", "X-Satgate-Delivery": delivery, "X-Satgate-Timestamp": stamp,
                   "X-Satgate-Event": event}
        if self._secret:
            headers["X-Satgate-Signature"] = signature(self._secret, stamp, body)
        try:
            async with self._session.post(self.url, data=body, headers=headers, allow_redirects=False) as resp:
                status, after = resp.status, resp.headers.get("Retry-After")
        except (aiohttp.ClientError, TimeoutError) as exc:
            log.info("approval_webhook_retry", delivery=delivery, error=type(exc).__name__)
            return 0.0
        if 200 <= status < 300:
            self._outcome("delivered")
            return None
        if not retried(status):
            self._outcome("given_up")
            log.warning("approval_webhook_refused", delivery=delivery, status=status)
            return None
        log.info("approval_webhook_retry", delivery=delivery, status=status)
        return retry_after(after, self._max) or 0.0
