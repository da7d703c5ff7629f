"""One process's part in handovers: taking the children of the process before it, giving its own to the next.

``runner`` calls it at three points: before the app starts (ask the old process what it runs, expect those
children), once listening (tell the old process to go, receive the children; offer its own channel), and
after its own drain (give its children to the process that asked).
"""

from __future__ import annotations

import asyncio
import contextlib
from functools import partial
from pathlib import Path

import structlog

from satgate_mcp.daemon.fdstore import split_inherited, stored_deliveries
from satgate_mcp.daemon.handover import HandoverClient, HandoverServer, socket_path
from satgate_mcp.daemon.sockets import InheritedFd
from satgate_mcp.upstream.pool import UpstreamPool
from satgate_mcp.upstream.pool_handover import deliver, describe_children, expect_children, give_children

log = structlog.get_logger("satgate_mcp.runner")


class HandoverRun:
    def __init__(self, pool: object, state_dir: Path | None, port: int, stop: asyncio.Event,
                 stored: list[InheritedFd] | None = None) -> None:
        self._pool = pool if isinstance(pool, UpstreamPool) else None
        self._path = socket_path(state_dir, port) if state_dir is not None else None
        self._stop = stop
        self._stored = stored or []
        self._client: HandoverClient | None = None
        self._server: HandoverServer | None = None
        self._expected: list[tuple[str, str | None]] = []
        self._receiving: asyncio.Task[None] | None = None
        #: Set when the next process asked this one to stop: a SIGTERM after that is not a second signal.
        self.requested = False

    async def before_start(self, handover: bool) -> None:
        """With ``--handover``: what the old process runs; its children are expected, not spawned. After a crash
        under systemd: the children kept in its fd store, adopted at once."""
        if self._stored and self._pool is not None:
            self._adopt_stored(self._pool)
        if not handover or self._pool is None or self._path is None:
            return
        self._client = await HandoverClient.connect(self._path)
        if self._client is None:
            return
        try:
            records = await asyncio.wait_for(self._client.describe(), 10.0)
        except (OSError, ValueError, TimeoutError) as exc:
            log.warning("handover_channel_failed", error=str(exc) or repr(exc))
            self._client.close()
            self._client = None
            return
        self._expected = expect_children(self._pool, records)
        log.info("handover_expecting", children=self._expected)

    def _adopt_stored(self, pool: UpstreamPool) -> None:
        deliveries = stored_deliveries(split_inherited(self._stored)[1])
        self._stored = []
        expected = set(expect_children(pool, [d.record for d in deliveries]))
        for delivery in deliveries:
            if (delivery.record.upstream, delivery.record.instance) in expected:
                deliver(pool, delivery.record.upstream, delivery.record.instance, delivery)
            else:
                delivery.refuse()
        log.info("fd_store_adopting", children=sorted(expected, key=str))

    async def after_listening(self) -> None:
        """Tell the old process to go and take its children as they come; open this process's own channel."""
        pool = self._pool
        if pool is None or self._path is None:
            return
        if self._client is not None:
            try:
                await self._client.go(self._expected)
            except OSError as exc:
                log.warning("handover_channel_failed", error=str(exc))
            self._receiving = asyncio.create_task(self._receive(self._client, pool), name="handover-receive")
        try:
            self._path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            self._server = HandoverServer(self._path, partial(describe_children, pool), self._requested)
            self._server.start()
        except OSError as exc:
            log.warning("handover_channel_unavailable", path=str(self._path), error=str(exc))
            self._server = None

    async def _receive(self, client: HandoverClient, pool: UpstreamPool) -> None:
        await client.receive(partial(deliver, pool))
        for name, instance in self._expected:  # any child that did not come starts fresh now
            deliver(pool, name, instance, None)

    def _requested(self) -> None:
        self.requested = True
        if not self._stop.is_set():
            log.info("stop_requested", signal="handover")
            self._stop.set()

    async def after_drain(self, wait: float) -> None:
        """Give every child to the process that asked (none asked: they stop with the app, as before)."""
        server = self._server
        if server is None:
            return
        if server.taker is not None and self._pool is not None:
            deliveries, refused = await give_children(self._pool, wait, server.expected)
            await server.send_children(deliveries, refused)
        await server.close()

    async def close(self) -> None:
        if self._receiving is not None:
            self._receiving.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._receiving
