"""HTTP requests with header bytes exactly as given, for attacks no HTTP client library would send.

aiohttp hands such bytes to the app surrogate-escaped; the answer is read until the server closes.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass

from aiohttp import web
from aiohttp.test_utils import TestClient

#: Bound on one raw exchange: a guard against a gateway that never answers, not a speed target.
RAW_TIMEOUT = 10.0


@dataclass(frozen=True)
class RawAnswer:
    status: int
    headers: dict[str, str]
    body: bytes

    @property
    def is_json(self) -> bool:
        return self.headers.get("content-type", "").startswith("application/json")

    def json_rpc_error(self) -> str:
        """``error.data.error`` of the JSON-RPC error body (fails the test when there is none)."""
        assert self.is_json, self
        answer = json.loads(self.body)
        assert answer["jsonrpc"] == "2.0"
        assert isinstance(answer["error"]["code"], int)
        error = answer["error"]["data"]["error"]
        assert isinstance(error, str)
        return error


INITIALIZE = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize",
                         "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                                    "clientInfo": {"name": "raw", "version": "1"}}}).encode()


async def raw_post(client: TestClient[web.Request, web.Application], extra_headers: bytes, body: bytes = INITIALIZE,
                   *, path: bytes = b"/mcp", host: bytes = b"127.0.0.1") -> RawAnswer:
    """One ``POST`` over a fresh connection; ``extra_headers`` are whole ``Name: value\\r\\n`` lines."""
    async with asyncio.timeout(RAW_TIMEOUT):
        reader, writer = await asyncio.open_connection(client.host, client.port)
        try:
            writer.write(b"POST " + path + b" HTTP/1.1\r\nHost: " + host + b"\r\n"
                         b"Content-Type: application/json\r\nAccept: application/json\r\nConnection: close\r\n"
                         + extra_headers + b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
            await writer.drain()
            data = await reader.read()
        finally:
            writer.close()
    head, _, payload = data.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines)}
    return RawAnswer(int(status_line.split()[1]), headers, payload)
