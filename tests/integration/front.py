"""A real ``serve`` process in front of one test upstream, reached over stdio or over Streamable HTTP."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path

from tests.conftest import HttpUpstreamProcess, upstream_command
from tests.gateway_process import GatewayProcess


@contextlib.asynccontextmanager
async def gateway_in_front(tmp_path: Path, *, root_key: str, name: str, transport: str,
                           args: tuple[str, ...], settings: dict[str, str] | None = None
                           ) -> AsyncIterator[GatewayProcess]:
    """The gateway, ready, with ``tests/upstream_server.py *args`` as its upstream ``name``; both stopped after.
    ``settings``: more of the gateway's environment (a state folder, Redis)."""
    server = HttpUpstreamProcess(*args).start() if transport == "http" else None
    spec = ({"transport": "http", "url": server.url} if server is not None
            else {"transport": "stdio", "command": upstream_command(*args)})
    gw = GatewayProcess(tmp_path, root_key=root_key,
                        settings={"SATGATE_UPSTREAMS": json.dumps({name: spec}), **(settings or {})})
    try:
        gw.start()
        await gw.wait_ready()
        yield gw
        await gw.kill()
    finally:
        if server is not None:
            server.stop()
