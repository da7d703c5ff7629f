"""Every gateway process at a glance: each publishes its figures every few seconds; the overview reads them all.

With Redis, each process writes one key that expires unless refreshed (stores/redis/console.py), so a process
that stops leaves the list within seconds; alone, the board holds just this process. The sampler that takes
the figures is one background task (a cleanup context), never work on a call's path.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Protocol

import structlog
from aiohttp import web

from satgate_mcp.console.figures import SAMPLE_SECONDS, Ring, session_mix, take_sample
from satgate_mcp.contracts import Pool
from satgate_mcp.metrics import Metrics
from satgate_mcp.sessions import SessionRegistry

log = structlog.get_logger(__name__)

#: A process's figures outlive it by this much: three missed publications and it is gone from the list.
FIGURES_TTL = 3 * SAMPLE_SECONDS


class Board(Protocol):
    """Where processes publish their figures and the overview reads everyone's."""

    async def publish(self, process: str, figures: dict[str, Any], ttl: float) -> None: ...

    async def read(self) -> list[dict[str, Any]]: ...


class LocalBoard:
    """One process alone: the board is its own latest figures."""

    def __init__(self) -> None:
        self._figures: dict[str, Any] | None = None

    async def publish(self, process: str, figures: dict[str, Any], ttl: float) -> None:
        self._figures = figures

    async def read(self) -> list[dict[str, Any]]:
        return [self._figures] if self._figures is not None else []


def process_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


class Sampler:
    """Samples this process's counters into the ring and publishes its figures, every ``SAMPLE_SECONDS``."""

    def __init__(self, metrics: Metrics, registry: SessionRegistry, pool: Pool, board: Board, *,
                 store_up: Callable[[], Awaitable[bool]] | None, clock: Callable[[], float] = time.time) -> None:
        self.ring = Ring()
        self.name = process_name()
        self.started = clock()
        self._metrics, self._registry, self._pool, self._board = metrics, registry, pool, board
        self._store_up = store_up
        self._clock = clock
        self.store_state = "none" if store_up is None else "unknown"

    async def tick(self) -> dict[str, Any]:
        """One sample and one publication; what was published."""
        now = self._clock()
        self.ring.add(take_sample(self._metrics, len(self._registry), now))
        if self._store_up is not None:
            self.store_state = "up" if await self._store_up() else "down"
        figures = self.figures(now)
        try:
            await self._board.publish(self.name, figures, FIGURES_TTL)
        except Exception as exc:  # a store outage costs the cluster view, never the daemon
            log.warning("console_figures_unpublished", error=type(exc).__name__)
        return figures

    def figures(self, now: float) -> dict[str, Any]:
        ready = self._pool.readiness()
        return {"process": self.name, "pid": os.getpid(), "started": round(self.started, 1), "t": round(now, 1),
                "sessions": len(self._registry), **session_mix(self._registry), **self.ring.recent_rates(),
                "upstreams_ready": sum(ready.values()), "upstreams": len(ready), "store": self.store_state}

    async def run(self) -> None:
        while True:
            try:
                await self.tick()
            except Exception as exc:  # pragma: no cover - a sampling bug must not end the loop
                log.error("console_sample_failed", error=repr(exc))
            await asyncio.sleep(SAMPLE_SECONDS)

    async def read_all(self) -> list[dict[str, Any]]:
        """Every live process's figures (this one's own, fresh, even when the board cannot be read)."""
        mine = self.figures(self._clock())
        try:
            found = [f for f in await self._board.read() if isinstance(f, dict) and f.get("process") != self.name]
        except Exception as exc:
            log.warning("console_figures_unread", error=type(exc).__name__)
            found = []
        return [mine, *sorted(found, key=lambda f: str(f.get("process")))]


def sampling(sampler: Sampler) -> Callable[[web.Application], AsyncIterator[None]]:
    """The sampler's cleanup context: its task started before ``yield``, cancelled after."""

    async def ctx(app: web.Application) -> AsyncIterator[None]:
        task = asyncio.create_task(sampler.run(), name="console-sampler")
        yield
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    return ctx
