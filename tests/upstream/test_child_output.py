"""What a stdio child writes is read within a bound: an over-long or non-JSON line is dropped and said so, and the
call it answered gets an error at once rather than at its timeout."""

from __future__ import annotations

import asyncio
import sys
import time

import pytest

from satgate_mcp.events import RecordingPublisher
from satgate_mcp.jsonrpc import JsonObj
from satgate_mcp.metrics import Metrics
from satgate_mcp.settings import StdioUpstreamSpec
from satgate_mcp.upstream.child_output import HEAD_BYTES, Dropped, answered_id, parse_line, read_line
from satgate_mcp.upstream.stdio import StdioUpstream


async def lines_of(data: bytes, limit: int) -> list[bytes | Dropped]:
    reader = asyncio.StreamReader(limit=limit)
    reader.feed_data(data)
    reader.feed_eof()
    found: list[bytes | Dropped] = []
    while (line := await read_line(reader)) is not None:
        found.append(line)
    return found


def dropped_head_of(found: bytes | Dropped, line: bytes) -> bool:
    """A line dropped as too long, keeping a head of it: its start, at most HEAD_BYTES."""
    return (isinstance(found, Dropped) and found.reason == "too_long" and line.startswith(found.head)
            and 0 < len(found.head) <= HEAD_BYTES)


async def test_an_over_long_line_is_dropped_with_its_head_and_the_next_line_is_read() -> None:
    long_line = b'{"jsonrpc":"2.0","id":7,"result":"' + b"x" * 500 + b'"}\n'
    found = await lines_of(b'{"a":1}\n' + long_line + b'{"b":2}\n' + b'{"c":3}', limit=64)
    assert [found[0], *found[2:]] == [b'{"a":1}\n', b'{"b":2}\n', b'{"c":3}']
    assert dropped_head_of(found[1], long_line)
    assert isinstance(found[1], Dropped)
    assert answered_id(found[1].head) == 7


async def test_an_over_long_last_line_without_its_newline_is_dropped_too() -> None:
    found = await lines_of(b"y" * 3000, limit=64)
    assert len(found) == 1
    assert dropped_head_of(found[0], b"y" * 3000)


@pytest.mark.parametrize(("line", "parsed"), [
    (b'{"jsonrpc":"2.0","id":1,"result":{}}\n', {"jsonrpc": "2.0", "id": 1, "result": {}}),
    (b"   \n", None),
    (b'{"jsonrpc":"2.0","id":3,"result":{"text":"cut off\n', Dropped("not_json", b'{"jsonrpc":"2.0","id":3,'
                                                                              b'"result":{"text":"cut off')),
    (b'{"jsonrpc":"2.0","id":4,"result":"\xff"}\n', {"jsonrpc": "2.0", "id": 4, "result": "\ufffd"}),
])
def test_parse_line(line: bytes, parsed: object) -> None:
    assert parse_line(line) == parsed


@pytest.mark.parametrize(("head", "request_id"), [
    (b'{"jsonrpc":"2.0","id":12,"result":', 12),
    (b'{"id": 5, "jsonrpc": "2.0"', 5),
    (b' { "jsonrpc" : "2.0" , "id" : -1 }', -1),
    (b'{"jsonrpc":"2.0","result":{"id":9}', None),  # an id inside the result is not the reply's
    (b'{"jsonrpc":"2.0","id":"abc"', None),  # the gateway's ids to a child are integers
    (b"garbage", None),
])
def test_answered_id(head: bytes, request_id: int | None) -> None:
    assert answered_id(head) == request_id


CUT_OFF_CHILD = """
import json, sys
for line in sys.stdin:
    msg = json.loads(line)
    if msg.get("method") == "initialize":
        print(json.dumps({"jsonrpc": "2.0", "id": msg["id"], "result": {"protocolVersion": "2025-06-18",
              "capabilities": {"tools": {}}, "serverInfo": {"name": "cut", "version": "1"}}}), flush=True)
    elif "id" in msg and msg.get("method") == "tools/call":
        print('{"jsonrpc":"2.0","id":%d,"result":{"content":[{"type":"text","text":"cut' % msg["id"], flush=True)
    elif "id" in msg:
        print(json.dumps({"jsonrpc": "2.0", "id": msg["id"], "result": {"tools": []}}), flush=True)
"""


async def _noop(method: str, params: JsonObj | None) -> None:
    return None


@pytest.mark.process
async def test_a_call_answered_with_a_broken_line_gets_an_error_at_once() -> None:
    spec = StdioUpstreamSpec(transport="stdio", command=[sys.executable, "-c", CUT_OFF_CHILD], timeout=30.0,
                             protocol="2025")
    upstream = StdioUpstream("cut", spec, publisher=RecordingPublisher(), metrics=Metrics())
    await upstream.start(_noop)
    try:
        assert await upstream.wait_ready(20)
        started = time.monotonic()
        reply = await upstream.request("tools/call", {"name": "echo", "arguments": {}})
        assert time.monotonic() - started < 10  # not the 30 s timeout
        assert reply["error"]["data"] == {"error": "upstream_answer_unreadable", "upstream": "cut",
                                          "reason": "not_json"}
        assert (await upstream.request("tools/list", None))["result"] == {"tools": []}  # the child serves on
    finally:
        await upstream.close()


async def test_a_long_line_arriving_in_pieces_is_discarded_without_being_held() -> None:
    reader = asyncio.StreamReader(limit=64)
    long_line = b'{"jsonrpc":"2.0","id":3,"result":"' + b"z" * 5000 + b'"}\n'

    async def feed() -> None:
        for start in range(0, len(long_line), 100):
            reader.feed_data(long_line[start:start + 100])
            await asyncio.sleep(0)  # one piece per turn of the loop, as a pipe delivers them
        reader.feed_data(b'{"next":true}\n')
        reader.feed_eof()

    feeding = asyncio.create_task(feed())
    first = await read_line(reader)
    assert dropped_head_of(first, long_line)  # type: ignore[arg-type]
    assert await read_line(reader) == b'{"next":true}\n'
    await feeding
