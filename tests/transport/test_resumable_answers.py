"""Answers as streams, and their resumption with ``Last-Event-ID`` (2025-11-25, SEP-1699).

A session that accepts ``text/event-stream`` gets every answer on a stream; on 2025-11-25 the
stream opens with a priming event (an id, a ``retry``), every event has an id, and a client that
lost the stream mid-call reconnects with ``GET /mcp`` + ``Last-Event-ID`` to get what it missed
and then the answer. Only the session a stream belongs to can resume it.
"""

from __future__ import annotations

import asyncio
import json

import pytest
import pytest_asyncio
from aiohttp import ClientResponse, web
from aiohttp.test_utils import TestClient
from pydantic import SecretStr
from pytest_aiohttp import AiohttpClient

from satgate_mcp import jsonrpc
from satgate_mcp.app import create_app
from satgate_mcp.jsonrpc import JsonObj
from satgate_mcp.settings import Settings
from satgate_mcp.transport import session_endpoint
from satgate_mcp.transport.replay import (
    DELIVERED_RETAIN_SECONDS,
    MAX_EVENTS,
    RETAIN_SECONDS,
    RETRY_MS,
    ReplayBook,
    parse_event_id,
)
from satgate_mcp.upstream.wire import SseDecoder, SseEvent
from tests.fakes import AllowAllPolicy, FakeClock, FakePool

TOKEN = "resume-stream-token-0123456789abcdef"
BOTH = "application/json, text/event-stream"
SSE = "text/event-stream"
WAIT = 5.0


class Client:
    def __init__(self, http: TestClient[web.Request, web.Application], pool: FakePool) -> None:
        self.http = http
        self.pool = pool

    def headers(self, session: str | None, version: str, accept: str = BOTH) -> dict[str, str]:
        sent = {"Accept": accept, "Authorization": f"Bearer {TOKEN}", "MCP-Protocol-Version": version,
                "Content-Type": "application/json"}
        if session is not None:
            sent["Mcp-Session-Id"] = session
        return sent

    async def initialize(self, version: str = "2025-11-25") -> str:
        body = jsonrpc.request_message(1, "initialize", {"protocolVersion": version, "capabilities": {},
                                                         "clientInfo": {"name": "t", "version": "1"}})
        resp = await self.http.post("/mcp", data=json.dumps(body), headers=self.headers(None, version))
        assert resp.status == 200
        return resp.headers["Mcp-Session-Id"]

    async def post(self, session: str, message: JsonObj, version: str = "2025-11-25",
                   accept: str = BOTH) -> ClientResponse:
        return await self.http.post("/mcp", data=json.dumps(message), headers=self.headers(session, version, accept))

    async def resume(self, session: str, last_event_id: str) -> ClientResponse:
        headers = self.headers(session, "2025-11-25", SSE)
        headers["Last-Event-ID"] = last_event_id
        return await self.http.get("/mcp", headers=headers)


def call_tool(request_id: int, name: str) -> JsonObj:
    return jsonrpc.request_message(request_id, "tools/call", {"name": name, "arguments": {"text": "hi"}})


def decode(body: bytes) -> list[SseEvent]:
    return SseDecoder().feed(body + b"\n\n")


async def read_events(resp: ClientResponse, count: int) -> list[SseEvent]:
    """The first ``count`` events (a priming event counts: it carries an id), without reading to the end."""
    decoder, found = SseDecoder(), list[SseEvent]()
    while len(found) < count:
        chunk = await asyncio.wait_for(resp.content.readany(), WAIT)
        assert chunk, f"the stream ended after {found}"
        found += decoder.feed(chunk)
    return found


@pytest_asyncio.fixture
async def gw(aiohttp_client: AiohttpClient) -> Client:
    pool = FakePool()
    app = create_app(Settings(auth_mode="config", static_token=SecretStr(TOKEN)), pool=pool, policy=AllowAllPolicy())
    return Client(await aiohttp_client(app), pool)


# --- the answer stream -------------------------------------------------------------------------------


async def test_a_quiet_call_answers_on_a_stream_that_opens_with_a_priming_event_and_a_retry(gw: Client) -> None:
    session = await gw.initialize()
    resp = await gw.post(session, call_tool(5, "echo"))
    assert resp.status == 200
    assert resp.content_type == SSE
    assert resp.headers["X-Accel-Buffering"] == "no"
    body = await resp.read()
    assert f"retry: {RETRY_MS}\n".encode() in body.split(b"\n\n")[0]
    priming, answer = decode(body)
    assert priming.data == ""  # an id and nothing else: what a resumption starts from
    stream = parse_event_id(priming.id)
    assert stream is not None
    assert stream[1] == 0
    assert json.loads(answer.data)["id"] == 5
    assert parse_event_id(answer.id) == (stream[0], 1)


@pytest.mark.parametrize("version", ["2025-03-26", "2025-06-18"])
async def test_older_revisions_get_streams_without_ids(gw: Client, version: str) -> None:
    session = await gw.initialize(version)
    resp = await gw.post(session, jsonrpc.request_message(3, "tools/list"), version=version)
    assert resp.content_type == SSE
    events = decode(await resp.read())
    assert [e.id for e in events] == [None]
    assert json.loads(events[0].data)["id"] == 3


async def test_a_client_that_reads_only_json_keeps_json(gw: Client) -> None:
    session = await gw.initialize()
    resp = await gw.post(session, jsonrpc.request_message(4, "ping"), accept="application/json")
    assert resp.content_type == "application/json"
    assert await resp.json() == jsonrpc.result_response(4, {})


async def test_attack_a_refused_call_keeps_a_plain_json_refusal_not_a_200_stream(gw: Client) -> None:
    session = await gw.initialize()
    resp = await gw.post(session, call_tool(6, "no_such_tool"))
    assert resp.content_type == "application/json"
    assert (await resp.json())["error"]["data"]["error"] == "unknown_tool"


# --- resumption ----------------------------------------------------------------------------------------


async def test_a_client_that_lost_its_stream_mid_call_resumes_it_and_gets_the_answer(gw: Client) -> None:
    session = await gw.initialize()
    call = await gw.post(session, call_tool(8, "block"))
    [priming] = await read_events(call, 1)
    assert priming.id is not None
    call.close()  # the connection breaks while the call runs
    gw.pool.release.set()

    resumed = await gw.resume(session, priming.id)

    assert resumed.status == 200
    assert resumed.content_type == SSE
    events = [e for e in decode(await resumed.read()) if e.data.strip()]  # the stream ends after the answer
    assert [json.loads(e.data)["id"] for e in events] == [8]
    assert "result" in json.loads(events[0].data)


async def test_attack_another_session_cannot_resume_a_stream_it_learned_the_id_of(gw: Client) -> None:
    owner, thief = await gw.initialize(), await gw.initialize()
    call = await gw.post(owner, call_tool(10, "block"))
    [priming] = await read_events(call, 1)
    assert priming.id is not None
    call.close()
    gw.pool.release.set()

    stolen = await gw.resume(thief, priming.id)

    # the thief's own session stream opens (priming event only); the owner's answer never appears on it
    assert stolen.status == 200
    first = await read_events(stolen, 1)
    stolen.close()
    assert all(not e.data.strip() for e in first)
    resumed = await gw.resume(owner, priming.id)
    assert [json.loads(e.data)["id"] for e in decode(await resumed.read()) if e.data.strip()] == [10]


@pytest.mark.parametrize("last_event_id", ["", "7", "junk", "0123456789abcdef-1", "-", "a-b", "x" * 100 + "-1"])
async def test_an_unknown_last_event_id_opens_the_sessions_own_stream(gw: Client, last_event_id: str) -> None:
    session = await gw.initialize()
    resp = await gw.resume(session, last_event_id)
    assert resp.status == 200
    [priming] = await read_events(resp, 1)
    resp.close()
    assert priming.id == "0"  # the session stream's own numbering


# --- the book, driven directly ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "parsed"),
    [
        ("abcd-0", ("abcd", 0)),
        ("0f-12", ("0f", 12)),
        ("a-b-12", None),
        ("ABCD-1", None),
        ("abcd", None),
        ("-3", None),
        ("abcd-", None),
        ("abcd--1", None),
        ("abcd-1e3", None),
        ("abcd-1234567890", None),
        ("abcd-\u00b2", None),  # a digit to str.isdigit, not to int()
        ("abcd-\u0661", None),
        (None, None),
        ("x" * 70 + "-1", None),
    ],
)
def test_event_ids_parse_strictly(value: str | None, parsed: tuple[str, int] | None) -> None:
    assert parse_event_id(value) == parsed


async def test_the_book_keeps_a_delivered_end_briefly_and_an_undelivered_one_longer() -> None:
    clock = FakeClock()
    book = ReplayBook(clock=clock)
    delivered, missed = book.open("s1"), book.open("s1")
    for log in (delivered, missed):
        log.add(1, b"id: x-1\ndata: {}\n\n")
    book.close(delivered, delivered=True)
    book.close(missed, delivered=False)
    assert book.find("s1", f"{delivered.stream_id}-0") == (delivered, 0)  # written is not yet read
    assert book.find("s2", f"{missed.stream_id}-0") is None
    clock.advance(DELIVERED_RETAIN_SECONDS + 1)
    assert book.find("s1", f"{delivered.stream_id}-0") is None
    assert book.find("s1", f"{missed.stream_id}-0") == (missed, 0)
    clock.advance(RETAIN_SECONDS)
    assert book.find("s1", f"{missed.stream_id}-0") is None
    assert len(book) == 0


async def test_the_book_holds_a_bounded_number_of_bytes_dropping_delivered_streams_first(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from satgate_mcp.transport import replay

    monkeypatch.setattr(replay, "MAX_RETAINED_BYTES", 100)
    book = ReplayBook(clock=FakeClock())
    missed, delivered, big = book.open("s"), book.open("s"), book.open("s")
    for log, size in ((missed, 40), (delivered, 40), (big, 40)):
        log.add(1, b"x" * size)
    book.close(missed, delivered=False)
    book.close(delivered, delivered=True)
    book.close(big, delivered=False)  # 120 bytes kept: over the bound
    assert book.find("s", f"{delivered.stream_id}-0") is None
    assert book.find("s", f"{missed.stream_id}-0") == (missed, 0)
    assert book.find("s", f"{big.stream_id}-0") == (big, 0)


async def test_a_log_gives_what_came_after_a_cursor_then_says_when_it_ended() -> None:
    log = ReplayBook().open("s1")
    for n in (1, 2, 3):
        log.add(n, f"data: {n}\n\n".encode())
    fresh, ended, more = log.since(1)
    assert [n for n, _ in fresh] == [2, 3]
    assert not ended
    assert not more.is_set()
    log.end()
    assert more.is_set()
    assert log.since(3)[:2] == ([], True)


async def test_a_cursor_older_than_what_is_kept_cannot_be_resumed() -> None:
    book = ReplayBook()
    log = book.open("s1")
    for n in range(1, MAX_EVENTS + 3):
        log.add(n, b"data: {}\n\n")
    assert book.find("s1", f"{log.stream_id}-0") is None
    assert book.find("s1", f"{log.stream_id}-2") == (log, 2)


# --- polling: a quiet stream closed mid-call (SATGATE_SSE_POLL_SECONDS) ----------------------------------


async def polling_gateway(aiohttp_client: AiohttpClient, poll: float) -> Client:
    pool = FakePool()
    settings = Settings(auth_mode="config", static_token=SecretStr(TOKEN), sse_poll_seconds=poll)
    return Client(await aiohttp_client(create_app(settings, pool=pool, policy=AllowAllPolicy())), pool)


async def test_a_quiet_stream_is_closed_mid_call_and_the_client_polls_for_the_answer(
        aiohttp_client: AiohttpClient) -> None:
    gw = await polling_gateway(aiohttp_client, 0.05)
    session = await gw.initialize()
    call = await gw.post(session, call_tool(11, "block"))
    first = decode(await asyncio.wait_for(call.read(), WAIT))  # the stream ends while the call still runs
    assert [e.data for e in first if e.data.strip()] == []
    last_id = first[-1].id
    assert last_id is not None
    gw.pool.release.set()

    resumed = await gw.resume(session, last_id)

    assert [json.loads(e.data)["id"] for e in decode(await resumed.read()) if e.data.strip()] == [11]


async def test_without_event_ids_a_stream_is_never_closed_for_polling(
        aiohttp_client: AiohttpClient, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(session_endpoint, "KEEPALIVE_SECONDS", 0.05)  # a keep-alive every poll period: the test's clock
    gw = await polling_gateway(aiohttp_client, 0.05)
    session = await gw.initialize("2025-06-18")
    call = await gw.post(session, call_tool(12, "block"), version="2025-06-18")
    assert call.content_type == SSE  # open (a keep-alive or the answer will follow), not closed for a poll
    for _ in range(3):  # several poll periods pass with nothing to say, and the stream stays open
        assert await asyncio.wait_for(call.content.readuntil(b"\n\n"), WAIT) == b": keepalive\n\n"
    gw.pool.release.set()
    assert [json.loads(e.data)["id"] for e in decode(await call.read()) if e.data.strip()] == [12]
