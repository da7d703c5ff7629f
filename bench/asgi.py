"""How the benchmark's own servers run: an ASGI app on uvicorn with uvloop and httptools (its fastest shape),
a ``READY <url>`` line once it accepts connections, and ``--port`` from the command line."""

from __future__ import annotations

import argparse
import asyncio
from typing import Any, Literal

import uvicorn

HOST = "127.0.0.1"


async def serve(app: Any, port: int, *, name: str, lifespan: Literal["on", "off"]) -> None:
    config = uvicorn.Config(app, host=HOST, port=port, loop="uvloop", http="httptools", lifespan=lifespan,
                            log_level="warning", access_log=False)
    server = uvicorn.Server(config)
    serving = asyncio.create_task(server.serve())
    while not server.started:  # uvicorn offers no event to await for this
        if serving.done():
            await serving
            raise SystemExit(f"{name}: the HTTP server failed to start")
        await asyncio.sleep(0.01)
    print(f"READY http://{HOST}:{port}/mcp", flush=True)
    await serving


def run(app: Any, *, name: str, description: str, lifespan: Literal["on", "off"]) -> None:
    """The command line of one such server: ``python -m bench.<name> --port N``."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--port", type=int, required=True)
    asyncio.run(serve(app, parser.parse_args().port, name=name, lifespan=lifespan))
