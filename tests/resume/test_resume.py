"""Resumable sessions (issue 4), in process: each rule of the issue is one test.

A "process" is an app built by ``create_app``; a "restart" is a new app with empty memory and the
same authenticator, which is all another process or machine would share. Requests go over real
HTTP (``aiohttp_client``), so handlers interleave the way they do in the daemon.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient
from multidict import CIMultiDictProxy
from pytest_aiohttp import AiohttpClient

from satgate_mcp.app import create_app
from satgate_mcp.auth.base import Authenticator, AuthResult, NoAuthenticator, StaticTokenAuthenticator
from satgate_mcp.auth.header import MacaroonAuthenticator
from satgate_mcp.auth.macaroons import add_caveats, mint_token
from satgate_mcp.events import SESSION_CLOSE, SESSION_CONNECT, RecordingPublisher
from satgate_mcp.keys import METRICS, POOL, REGISTRY, RESUMES_SESSIONS
from satgate_mcp.session_ids import make_session_id, session_id_matches_token
from satgate_mcp.sessions import SessionRegistry
from satgate_mcp.settings import Settings
from satgate_mcp.stores.memory import MemoryRevocationStore
from tests.answers import decode_answer
from tests.fakes import AllowAllPolicy, FakeClock, FakePool, until

ROOT_KEY = "resume-tests-root-key-0123456789abcdef"
OTHER_ROOT_KEY = "another-deployment-root-key-0123456789"
OAUTH_URL = "https://gateway.example/.well-known/oauth-protected-resource"
STATIC_TOKEN = "static-secret"
LATEST = "2025-11-25"
IDLE_TTL = 600.0
#: The DELETE/resume race runs this many times (the issue asks for at least 150).
RACE_ITERATIONS = 160
#: ...each time with the second request started 0 .. RACE_LAGS-1 event-loop turns after the first.
RACE_LAGS = 20

#: DESIGN.md section 3.
VECTOR_TOKEN = "tok-alice"
VECTOR_RANDOM = "0123456789abcdef0123456789abcdef"
VECTOR_ID = "mcp-0123456789abcdef0123456789abcdef-78c81bb6184cc699239551fa7c0422ad"


@dataclass(frozen=True)
class Answer:
    status: int
    headers: CIMultiDictProxy[str]
    body: Any

    @property
    def error(self) -> str | None:
        """``data.error`` of a JSON-RPC error body."""
        if isinstance(self.body, dict) and isinstance(self.body.get("error"), dict):
            data = self.body["error"].get("data") or {}
            return data.get("error") if isinstance(data, dict) else None
        return None


@dataclass
class Gateway:
    """One gateway process: its HTTP client, its registry and the events it published."""

    app: web.Application
    client: TestClient[web.Request, web.Application]
    publisher: RecordingPublisher

    @property
    def registry(self) -> SessionRegistry:
        return self.app[REGISTRY]

    def connects(self, session_id: str | None = None) -> list[dict[str, Any]]:
        return [e for e in self.publisher.named(SESSION_CONNECT) if session_id in (None, e["session_id"])]

    def resumed_metric(self) -> float:
        return self.app[METRICS].registry.get_sample_value("satgate_sessions_resumed_total") or 0.0

    async def send(self, method: str, token: str | None, session_id: str | None = None,
                   *, version: str | None = LATEST, body: Any = None) -> Answer:
        headers = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        if session_id is not None:
            headers["Mcp-Session-Id"] = session_id
        if version is not None:
            headers["MCP-Protocol-Version"] = version
        data = None if body is None else json.dumps(body)
        async with self.client.request(method, "/mcp", headers=headers, data=data) as resp:
            text = await resp.text()
            return Answer(resp.status, resp.headers, decode_answer(resp.content_type, text))

    async def initialize(self, token: str, version: str = LATEST) -> str:
        body = {"jsonrpc": "2.0", "id": 0, "method": "initialize",
                "params": {"protocolVersion": version, "capabilities": {},
                           "clientInfo": {"name": "resume-tests", "version": "1"}}}
        answer = await self.send("POST", token, body=body, version=None)
        assert answer.status == 200, answer.body
        return answer.headers["Mcp-Session-Id"]

    async def call(self, token: str | None, session_id: str, text: str = "hi", *,
                   version: str | None = LATEST, request_id: int = 1) -> Answer:
        body = {"jsonrpc": "2.0", "id": request_id, "method": "tools/call",
                "params": {"name": "echo", "arguments": {"text": text}}}
        return await self.send("POST", token, session_id, version=version, body=body)

    async def delete(self, token: str, session_id: str) -> Answer:
        return await self.send("DELETE", token, session_id)


StartGateway = Callable[..., Awaitable[Gateway]]


def echoed(answer: Answer, text: str = "hi") -> bool:
    return answer.status == 200 and answer.body["result"]["content"][0]["text"] == text


def assert_served(answer: Answer, session_id: str, text: str = "hi") -> None:
    assert answer.status == 200, answer.body
    assert answer.headers["Mcp-Session-Id"] == session_id
    assert echoed(answer, text)


def assert_unknown_id(answer: Answer) -> None:
    """Exactly the answer an unknown id gets, and no session id of any kind on it."""
    assert answer.status == 404, answer.body
    assert answer.error == "session_not_found"
    assert "Mcp-Session-Id" not in answer.headers


def assert_nothing_created(gw: Gateway) -> None:
    assert len(gw.registry) == 0
    assert gw.connects() == []
    assert gw.registry.tombstone_count == 0


# --- fixtures ------------------------------------------------------------------------------------


@pytest.fixture
def wall() -> FakeClock:
    """The authenticator's wall clock (token expiry)."""
    return FakeClock(1_700_000_000.0)


@pytest.fixture
def clock() -> FakeClock:
    """The registries' clock (idle TTL, tombstones)."""
    return FakeClock(1000.0)


@pytest.fixture
def revocations() -> MemoryRevocationStore:
    return MemoryRevocationStore()


@pytest.fixture
def authenticator(revocations: MemoryRevocationStore, wall: FakeClock) -> MacaroonAuthenticator:
    """Shared by every "process" of a test, as one root key and revocation store are in a deployment."""
    return MacaroonAuthenticator(ROOT_KEY, revocations, clock=wall)


@pytest.fixture
def token(wall: FakeClock) -> str:
    return mint_token(ROOT_KEY, "agent-1", tenant="acme", now=wall.now)


@pytest.fixture
def start_gateway(aiohttp_client: AiohttpClient, authenticator: MacaroonAuthenticator,
                  clock: FakeClock) -> StartGateway:
    async def start(*, auth: Authenticator | None = None, **overrides: Any) -> Gateway:
        values: dict[str, Any] = {"auth_mode": "header", "root_key": ROOT_KEY, "session_idle_ttl": IDLE_TTL}
        values.update(overrides)
        publisher = RecordingPublisher()
        app = create_app(Settings(**values), authenticator=auth or authenticator, pool=FakePool(),
                         policy=AllowAllPolicy(), publisher=publisher, clock=clock)
        return Gateway(app, await aiohttp_client(app), publisher)

    return start


async def opened_then_restarted(start_gateway: StartGateway, token: str, **overrides: Any) -> tuple[str, Gateway]:
    """A session opened and used on one process, then that process gone and a fresh one in its place."""
    first = await start_gateway(**overrides)
    session_id = await first.initialize(token)
    assert_served(await first.call(token, session_id), session_id)
    await first.client.close()
    return session_id, await start_gateway(**overrides)


# --- the id and its tag --------------------------------------------------------------------------


def test_session_id_is_bound_to_its_token_as_in_the_design_vector() -> None:
    assert make_session_id(VECTOR_TOKEN, VECTOR_RANDOM) == VECTOR_ID
    assert session_id_matches_token(VECTOR_ID, VECTOR_TOKEN)


@pytest.mark.parametrize(("session_id", "token"), [
    pytest.param(VECTOR_ID, "tok-bob", id="another-token"),
    pytest.param(VECTOR_ID, "tok-alice ", id="token-with-trailing-space"),
    pytest.param(VECTOR_ID[:-1] + "c", VECTOR_TOKEN, id="tag-changed"),
    pytest.param(VECTOR_ID.replace("0123", "1123", 1), VECTOR_TOKEN, id="random-part-changed"),
    pytest.param(VECTOR_ID.upper().replace("MCP-", "mcp-"), VECTOR_TOKEN, id="uppercase-hex"),
    pytest.param(VECTOR_ID[:-2], VECTOR_TOKEN, id="tag-truncated"),
    pytest.param(VECTOR_ID + "00", VECTOR_TOKEN, id="tag-extended"),
    pytest.param(f"mcp-{VECTOR_RANDOM}", VECTOR_TOKEN, id="untagged"),
    pytest.param("mcp-abc", VECTOR_TOKEN, id="short-legacy-id"),
    pytest.param(str(uuid.UUID(int=7)), VECTOR_TOKEN, id="uuid"),
    pytest.param("", VECTOR_TOKEN, id="empty"),
])
def test_session_id_does_not_match_any_other_token_or_shape(session_id: str, token: str) -> None:
    assert not session_id_matches_token(session_id, token)


async def test_initialize_issues_ids_tagged_for_the_opening_token(start_gateway: StartGateway, token: str) -> None:
    gw = await start_gateway()
    first, second = await gw.initialize(token), await gw.initialize(token)
    assert first != second
    for session_id in (first, second):
        assert session_id_matches_token(session_id, token)
        assert not session_id_matches_token(session_id, mint_token(ROOT_KEY, "agent-2"))


# --- resume after a restart ----------------------------------------------------------------------


async def test_same_token_resumes_its_session_after_restart(start_gateway: StartGateway, token: str) -> None:
    session_id, fresh = await opened_then_restarted(start_gateway, token)
    assert len(fresh.registry) == 0

    assert_served(await fresh.call(token, session_id, "after restart"), session_id, "after restart")
    assert_served(await fresh.call(token, session_id, "again", request_id=2), session_id, "again")

    assert fresh.connects() == [{"session_id": session_id, "token_id": "agent-1", "protocol_version": LATEST,
                                 "resumed": True}]
    assert len(fresh.registry) == 1
    assert fresh.resumed_metric() == 1


async def test_two_live_processes_both_serve_the_same_session(start_gateway: StartGateway, token: str) -> None:
    """Another machine behind the same load balancer: no shared memory, the same id works on both."""
    one, two = await start_gateway(), await start_gateway()
    session_id = await one.initialize(token)
    for i in range(3):
        assert_served(await two.call(token, session_id, f"two-{i}", request_id=2 * i), session_id, f"two-{i}")
        assert_served(await one.call(token, session_id, f"one-{i}", request_id=2 * i + 1), session_id, f"one-{i}")
    assert [e["resumed"] for e in one.connects()] == [False]
    assert [e["resumed"] for e in two.connects()] == [True]


async def test_resume_without_protocol_header_uses_2025_03_26(start_gateway: StartGateway, token: str) -> None:
    session_id, fresh = await opened_then_restarted(start_gateway, token)
    assert_served(await fresh.call(token, session_id, version=None), session_id)
    [event] = fresh.connects()
    assert event["protocol_version"] == "2025-03-26"
    assert event["resumed"] is True
    # 2025-03-26 is the one revision with batches, so the rebuilt session accepts them.
    batch = [{"jsonrpc": "2.0", "id": n, "method": "tools/call",
              "params": {"name": "echo", "arguments": {"text": f"b{n}"}}} for n in (7, 8)]
    answer = await fresh.send("POST", token, session_id, version=None, body=batch)
    assert answer.status == 200, answer.body
    assert [m["result"]["content"][0]["text"] for m in answer.body] == ["b7", "b8"]


@pytest.mark.parametrize("version", ["2025-03-26", "2025-06-18", "2025-11-25"])
async def test_resume_takes_the_protocol_from_the_header(start_gateway: StartGateway, token: str,
                                                         version: str) -> None:
    session_id, fresh = await opened_then_restarted(start_gateway, token)
    assert_served(await fresh.call(token, session_id, version=version), session_id)
    assert [e["protocol_version"] for e in fresh.connects()] == [version]


async def test_resume_with_an_unsupported_protocol_header_is_400_and_creates_nothing(
        start_gateway: StartGateway, token: str) -> None:
    session_id, fresh = await opened_then_restarted(start_gateway, token)
    answer = await fresh.call(token, session_id, version="2024-01-01")
    assert answer.status == 400
    assert answer.error == "unsupported_protocol_version"
    assert_nothing_created(fresh)
    assert_served(await fresh.call(token, session_id), session_id)


async def test_a_notification_alone_resumes_the_session(start_gateway: StartGateway, token: str) -> None:
    session_id, fresh = await opened_then_restarted(start_gateway, token)
    note = {"jsonrpc": "2.0", "method": "notifications/initialized"}
    answer = await fresh.send("POST", token, session_id, body=note)
    assert answer.status == 202
    assert answer.headers["Mcp-Session-Id"] == session_id
    assert [e["resumed"] for e in fresh.connects()] == [True]


async def test_idle_expired_session_is_resumed_by_its_token_like_on_any_other_process(
        start_gateway: StartGateway, token: str, clock: FakeClock) -> None:
    gw = await start_gateway()
    session_id = await gw.initialize(token)
    clock.advance(IDLE_TTL)
    assert_served(await gw.call(token, session_id), session_id)
    closes = [e for e in gw.publisher.named(SESSION_CLOSE) if e["session_id"] == session_id]
    assert [e["reason"] for e in closes] == ["idle_timeout"]
    assert [e["resumed"] for e in gw.connects(session_id)] == [False, True]


# --- whose token ---------------------------------------------------------------------------------


@pytest.mark.parametrize("make_other", [
    pytest.param(lambda owner: mint_token(ROOT_KEY, "agent-2", tenant="acme"), id="same-tenant"),
    pytest.param(lambda owner: mint_token(ROOT_KEY, "agent-3", tenant="globex"), id="another-tenant"),
    pytest.param(lambda owner: mint_token(ROOT_KEY, "agent-1", tenant="acme", now=1), id="same-id-minted-again"),
    pytest.param(lambda owner: add_caveats(owner, tools=["echo"]), id="owner-token-narrowed"),
])
async def test_another_token_gets_404_and_creates_nothing_then_owner_resumes(
        start_gateway: StartGateway, token: str, make_other: Callable[[str], str]) -> None:
    other = make_other(token)
    assert other != token
    session_id, fresh = await opened_then_restarted(start_gateway, token)

    for attempt in range(2):
        assert_unknown_id(await fresh.call(other, session_id, request_id=attempt))
    assert_nothing_created(fresh)
    assert fresh.resumed_metric() == 0

    assert_served(await fresh.call(token, session_id), session_id)
    assert [e["token_id"] for e in fresh.connects()] == ["agent-1"]
    # from now on it is a live session, with the live session's answer to a foreign token
    mismatch = await fresh.call(other, session_id)
    assert mismatch.status == 403
    assert mismatch.error == "session_token_mismatch"
    assert len(fresh.registry) == 1


@pytest.mark.parametrize("session_id", [
    pytest.param("mcp-abc", id="short-legacy-id"),
    pytest.param(str(uuid.UUID(int=42)), id="uuid"),
    pytest.param("mcp-" + "ab" * 16, id="random-part-without-tag"),
    pytest.param(make_session_id("some-other-token"), id="tagged-for-another-token"),
])
async def test_untagged_or_foreign_ids_are_not_resumed(start_gateway: StartGateway, token: str,
                                                        session_id: str) -> None:
    gw = await start_gateway()
    assert_unknown_id(await gw.call(token, session_id))
    assert_nothing_created(gw)


# --- refused credentials -------------------------------------------------------------------------


@dataclass(frozen=True)
class Refused:
    status: int
    error: str
    challenge: bool


REVOKED_403 = Refused(403, "token_revoked", challenge=False)


@pytest.mark.parametrize(("oauth", "credential", "expected"), [
    pytest.param(False, "revoked", REVOKED_403, id="revoked"),
    pytest.param(False, "missing", Refused(401, "unauthorized", challenge=False), id="missing"),
    pytest.param(False, "garbage", Refused(401, "invalid_token", challenge=False), id="garbage"),
    pytest.param(False, "wrong-key", Refused(401, "invalid_token", challenge=False), id="wrong-key-with-matching-tag"),
    pytest.param(True, "revoked", Refused(401, "token_revoked", challenge=True), id="oauth-revoked"),
    pytest.param(True, "missing", Refused(401, "unauthorized", challenge=True), id="oauth-missing"),
    pytest.param(True, "garbage", Refused(401, "invalid_token", challenge=True), id="oauth-garbage"),
])
async def test_refused_credentials_create_nothing(start_gateway: StartGateway, token: str,
                                                  revocations: MemoryRevocationStore,
                                                  oauth: bool, credential: str, expected: Refused) -> None:
    overrides = {"oauth_resource_metadata_url": OAUTH_URL} if oauth else {}
    session_id, fresh = await opened_then_restarted(start_gateway, token, **overrides)
    presented: str | None = {"revoked": token, "missing": None, "garbage": "not-a-macaroon",
                             "wrong-key": mint_token(OTHER_ROOT_KEY, "agent-1")}[credential]
    if credential == "revoked":
        await revocations.revoke("agent-1")
    if credential == "wrong-key":
        assert presented is not None
        session_id = make_session_id(presented)  # the tag matches: only the signature is wrong

    answer = await fresh.call(presented, session_id)

    assert answer.status == expected.status, answer.body
    assert answer.error == expected.error
    if credential == "revoked":
        assert answer.body["error"]["data"]["code"] == "TOKEN_REVOKED"
    challenge = answer.headers.get("WWW-Authenticate", "")
    assert challenge.startswith("Bearer") == (expected.status == 401)
    assert (f'resource_metadata="{OAUTH_URL}"' in challenge) == expected.challenge
    assert "Mcp-Session-Id" not in answer.headers
    assert_nothing_created(fresh)


async def test_expired_token_is_refused_while_an_unexpired_one_resumes(
        start_gateway: StartGateway, wall: FakeClock) -> None:
    short = mint_token(ROOT_KEY, "short-lived", ttl=60, now=wall.now)
    long = mint_token(ROOT_KEY, "long-lived", ttl=3600, now=wall.now)
    first = await start_gateway()
    short_id, long_id = await first.initialize(short), await first.initialize(long)
    await first.client.close()
    wall.advance(120)
    fresh = await start_gateway()

    expired = await fresh.call(short, short_id)
    assert expired.status == 401
    assert expired.error == "token_expired"
    assert_nothing_created(fresh)

    assert_served(await fresh.call(long, long_id), long_id)
    assert [e["session_id"] for e in fresh.connects()] == [long_id]


# --- DELETE, GET ---------------------------------------------------------------------------------


async def test_deleted_session_stays_ended_on_same_process_but_resumes_for_its_token_on_a_new_process(
        start_gateway: StartGateway, token: str, clock: FakeClock) -> None:
    gw = await start_gateway()
    session_id = await gw.initialize(token)
    deleted = await gw.delete(token, session_id)
    assert deleted.status == 200

    for step in range(3):
        assert_unknown_id(await gw.call(token, session_id, request_id=step))
        assert_unknown_id(await gw.call(token, session_id, version=None, request_id=step))
        clock.advance(IDLE_TTL / 4)
        gw.registry.sweep()
    assert_unknown_id(await gw.delete(token, session_id))
    assert gw.connects(session_id) == gw.connects()[:1]  # only the initialize
    assert len(gw.registry) == 0

    fresh = await start_gateway()
    assert_served(await fresh.call(token, session_id), session_id)
    assert [e["resumed"] for e in fresh.connects(session_id)] == [True]


async def test_delete_of_an_unknown_id_is_404_and_does_not_stop_a_later_resume(
        start_gateway: StartGateway, token: str) -> None:
    session_id, fresh = await opened_then_restarted(start_gateway, token)
    assert_unknown_id(await fresh.delete(token, session_id))
    assert_nothing_created(fresh)
    assert_served(await fresh.call(token, session_id), session_id)


async def test_get_after_a_restart_opens_a_new_stream_on_the_resumed_session(start_gateway: StartGateway,
                                                                             token: str) -> None:
    first = await start_gateway()
    session_id = await first.initialize(token)
    await first.client.close()

    fresh = await start_gateway()
    headers = {"Accept": "text/event-stream", "Authorization": f"Bearer {token}", "Mcp-Session-Id": session_id,
               "MCP-Protocol-Version": LATEST}
    async with fresh.client.get("/mcp", headers=headers) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        assert resp.headers["Mcp-Session-Id"] == session_id
        assert (await resp.content.readline()).startswith(b"id: 0")  # the priming event: nothing is replayed
    assert [e["resumed"] for e in fresh.connects()] == [True]
    assert_served(await fresh.call(token, session_id), session_id)


# --- capacity ------------------------------------------------------------------------------------


async def test_resume_respects_the_session_cap(start_gateway: StartGateway, token: str, clock: FakeClock) -> None:
    session_id, fresh = await opened_then_restarted(start_gateway, token, session_cap=1)
    occupant = await fresh.initialize(mint_token(ROOT_KEY, "agent-2"))

    full = await fresh.call(token, session_id)
    assert full.status == 503
    assert full.error == "session_cap_reached"
    assert int(full.headers["Retry-After"]) >= 1
    assert "Mcp-Session-Id" not in full.headers
    assert fresh.connects(session_id) == []
    assert len(fresh.registry) == 1
    assert fresh.registry.get(occupant) is not None

    clock.advance(IDLE_TTL)  # the occupant goes idle, so the sweep makes room
    assert_served(await fresh.call(token, session_id), session_id)
    assert [e["resumed"] for e in fresh.connects(session_id)] == [True]


async def test_concurrent_requests_with_the_same_unknown_id_share_one_session(
        start_gateway: StartGateway, token: str) -> None:
    session_id, fresh = await opened_then_restarted(start_gateway, token)
    answers = await asyncio.gather(*(fresh.call(token, session_id, f"c{n}", request_id=n) for n in range(20)))
    for n, answer in enumerate(answers):
        assert_served(answer, session_id, f"c{n}")
    assert len(fresh.connects()) == 1
    assert len(fresh.registry) == 1
    assert fresh.resumed_metric() == 1


# --- only in header mode -------------------------------------------------------------------------


@pytest.mark.parametrize(("make_auth", "bearer", "resumes"), [
    pytest.param(lambda: NoAuthenticator(), "anything", False, id="none"),
    pytest.param(lambda: StaticTokenAuthenticator(STATIC_TOKEN), STATIC_TOKEN, False, id="config"),
    pytest.param(None, None, True, id="header"),
])
async def test_resume_only_in_header_mode(start_gateway: StartGateway, token: str,
                                          make_auth: Callable[[], Authenticator] | None, bearer: str | None,
                                          resumes: bool) -> None:
    auth = make_auth() if make_auth is not None else None
    bearer = bearer or token
    overrides: dict[str, Any] = {"auth_mode": auth.mode, "static_token": STATIC_TOKEN} if auth is not None else {}
    first = await start_gateway(auth=auth, **overrides)
    session_id = await first.initialize(bearer)
    await first.client.close()
    fresh = await start_gateway(auth=auth, **overrides)

    assert fresh.app[RESUMES_SESSIONS] is resumes
    answer = await fresh.call(bearer, session_id)
    if resumes:
        assert_served(answer, session_id)
    else:
        assert_unknown_id(answer)
        assert_nothing_created(fresh)


# --- tombstones ----------------------------------------------------------------------------------


async def test_full_tombstone_map_refuses_the_deleted_ids_and_nothing_else(
        start_gateway: StartGateway, token: str, clock: FakeClock) -> None:
    gw = await start_gateway(session_cap=2)
    deleted = [await gw.initialize(token) for _ in range(2)]
    for session_id in deleted:
        assert (await gw.delete(token, session_id)).status == 200
    assert gw.registry.tombstone_count == 2
    from_elsewhere = make_session_id(token)  # issued by another process, never seen here

    for session_id in deleted:
        assert_unknown_id(await gw.call(token, session_id))
    assert_served(await gw.call(token, from_elsewhere), from_elsewhere)

    clock.advance(IDLE_TTL)
    assert_served(await gw.call(token, deleted[0]), deleted[0])
    assert gw.registry.tombstone_count == 0


async def test_delete_that_finds_the_tombstone_map_full_blocks_its_own_tokens_resumes_for_its_ttl(
        start_gateway: StartGateway, token: str, clock: FakeClock) -> None:
    gw = await start_gateway(session_cap=1)
    first = await gw.initialize(token)
    assert (await gw.delete(token, first)).status == 200  # recorded: the map (cap 1) is now full
    clock.advance(IDLE_TTL / 2)
    unrecorded = await gw.initialize(token)
    assert (await gw.delete(token, unrecorded)).status == 200  # map full: cannot be recorded
    from_elsewhere = make_session_id(token)
    other = mint_token(ROOT_KEY, "agent-2")
    others_session = make_session_id(other)

    clock.advance(IDLE_TTL / 2 + 1)  # the first tombstone has expired; the map has room again
    gw.registry.sweep()
    assert gw.registry.tombstone_count == 0
    for session_id in (unrecorded, from_elsewhere):
        assert_unknown_id(await gw.call(token, session_id))
    assert_served(await gw.call(other, others_session), others_session)  # another token is not affected
    assert (await gw.delete(other, others_session)).status == 200  # and its delete is recorded

    clock.advance(IDLE_TTL / 2)  # now the unrecorded id's own TTL is over too
    assert_served(await gw.call(token, unrecorded), unrecorded)


async def test_deleted_tombstone_is_never_evicted_under_capacity_pressure(
        start_gateway: StartGateway, token: str, clock: FakeClock) -> None:
    gw = await start_gateway(session_cap=2)
    deleted = await gw.initialize(token)
    assert (await gw.delete(token, deleted)).status == 200

    clock.advance(IDLE_TTL - 10)
    occupants = [await gw.initialize(token) for _ in range(2)]
    assert (await gw.send("POST", token, body={"jsonrpc": "2.0", "id": 0, "method": "initialize",
                                                "params": {"protocolVersion": LATEST}})).status == 503
    assert (await gw.call(token, make_session_id(token))).status == 503  # a resume under pressure
    gw.registry.sweep()
    assert gw.registry.tombstone_count == 1
    assert_unknown_id(await gw.call(token, deleted))

    # more deletes press on the tombstone map: the deleted id stays refused
    for occupant in occupants:
        assert (await gw.delete(token, occupant)).status == 200
    clock.advance(9)
    gw.registry.sweep()
    assert_unknown_id(await gw.call(token, deleted))
    assert gw.connects(deleted) == gw.connects()[:1]


# --- per-token quotas (issue 9, hole 4) -----------------------------------------------------------


async def test_attack_one_token_filling_the_session_cap_no_longer_denies_another_tenant(
        start_gateway: StartGateway, token: str) -> None:
    gw = await start_gateway(session_cap=20, sessions_per_token=5)
    for _ in range(20):
        await gw.initialize(token)
    assert gw.registry.held_by("agent-1") == 5
    other = mint_token(ROOT_KEY, "agent-2")
    session_id = await gw.initialize(other)
    assert_served(await gw.call(other, session_id), session_id)


async def test_attack_cap_times_initialize_and_delete_no_longer_refuses_another_tokens_resume(
        start_gateway: StartGateway, token: str) -> None:
    other = mint_token(ROOT_KEY, "agent-2")
    session_id, gw = await opened_then_restarted(start_gateway, other, session_cap=8, sessions_per_token=3)
    for _ in range(2 * 8):
        assert (await gw.delete(token, await gw.initialize(token))).status == 200
    assert_served(await gw.call(other, session_id), session_id)


async def test_an_evicted_session_is_resumed_by_its_owner_like_after_a_restart(
        start_gateway: StartGateway, token: str) -> None:
    gw = await start_gateway(sessions_per_token=2)
    oldest = await gw.initialize(token)
    await gw.initialize(token)
    await gw.initialize(token)  # evicts the least recently used idle one: ``oldest``
    assert gw.registry.get(oldest) is None
    assert any(e["session_id"] == oldest and e["reason"] == "evicted" for e in gw.publisher.named(SESSION_CLOSE))
    assert_served(await gw.call(token, oldest), oldest)
    assert [e["resumed"] for e in gw.connects(oldest)] == [False, True]


async def test_a_token_with_every_session_busy_gets_503_with_retry_after(
        start_gateway: StartGateway, token: str) -> None:
    gw = await start_gateway(sessions_per_token=2)
    pool = gw.app[POOL]
    assert isinstance(pool, FakePool)
    busy = [await gw.initialize(token) for _ in range(2)]
    calls = [asyncio.create_task(gw.send("POST", token, sid, body={
        "jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "block", "arguments": {}}}))
        for sid in busy]
    await until(lambda: all((s := gw.registry.get(sid)) is not None and s.inflight for sid in busy))
    refused = await gw.send("POST", token, body={"jsonrpc": "2.0", "id": 0, "method": "initialize",
                                                  "params": {"protocolVersion": LATEST}}, version=None)
    assert refused.status == 503
    assert refused.error == "session_quota_reached"
    assert int(refused.headers["Retry-After"]) >= 1
    other = mint_token(ROOT_KEY, "agent-2")
    await gw.initialize(other)
    pool.release.set()
    for call in calls:
        assert (await call).status == 200


# --- DELETE racing a resume ----------------------------------------------------------------------


def close_then_connect(gw: Gateway, session_id: str) -> bool:
    """True if the registry ever connected this id again after deleting it (event order is its history)."""
    deleted = False
    for name, fields in gw.publisher.events:
        if fields.get("session_id") != session_id:
            continue
        if name == SESSION_CLOSE and fields.get("reason") == "deleted":
            deleted = True
        elif name == SESSION_CONNECT and deleted:
            return True
    return False


async def after_turns(turns: int, request: Awaitable[Answer]) -> Answer:
    """Start ``request`` a given number of event-loop turns late, so the race meets the other request at
    a different point of its handling each iteration (deterministic: the lag comes from the iteration)."""
    for _ in range(turns):
        await asyncio.sleep(0)
    return await request


@dataclass(frozen=True)
class RaceCase:
    live: bool
    delete_first: bool


def race_cases() -> list[pytest.ParameterSet]:
    return [pytest.param(RaceCase(live, delete_first),
                         id=f"{'live' if live else 'after-restart'}-{'delete' if delete_first else 'post'}-first")
            for live in (True, False) for delete_first in (True, False)]


@pytest.mark.parametrize("case", race_cases())
async def test_delete_racing_a_resume_never_revives_the_id(start_gateway: StartGateway, token: str,
                                                           case: RaceCase) -> None:
    gw = await start_gateway()
    for i in range(RACE_ITERATIONS // 4):
        session_id = await gw.initialize(token) if case.live else make_session_id(token)
        delete = gw.delete(token, session_id)
        post = gw.call(token, session_id, f"race-{i}", request_id=i)
        lag = i % RACE_LAGS
        if case.delete_first:
            deleted, posted = await asyncio.gather(delete, after_turns(lag, post))
        else:
            posted, deleted = await asyncio.gather(post, after_turns(lag, delete))

        assert deleted.status in (200, 404)
        assert posted.status in (200, 404), posted.body
        if deleted.status == 404:  # only possible when the DELETE ran before the resume created it
            assert not case.live
            assert_served(posted, session_id, f"race-{i}")
            deleted = await gw.delete(token, session_id)
        assert deleted.status == 200
        assert_unknown_id(await gw.call(token, session_id, request_id=i))
        assert_unknown_id(await gw.call(token, session_id, version=None, request_id=i))
        assert gw.registry.get(session_id) is None
        assert not close_then_connect(gw, session_id)
    assert len(gw.registry) == 0


class GatedAuthenticator:
    """Holds one authentication at a gate, so a test can run another request at exactly that point."""

    mode = "header"

    def __init__(self, inner: Authenticator) -> None:
        self._inner = inner
        self._armed = False
        self.held = asyncio.Event()
        self.release = asyncio.Event()

    def arm(self) -> None:
        self._armed = True

    async def authenticate(self, authorization: str | None) -> AuthResult:
        if self._armed:
            self._armed = False
            self.held.set()
            await self.release.wait()
        return await self._inner.authenticate(authorization)


async def held_at_auth(gate: GatedAuthenticator, request: Awaitable[Answer]) -> asyncio.Future[Answer]:
    gate.arm()
    task = asyncio.ensure_future(request)
    await asyncio.wait_for(gate.held.wait(), 5)
    return task


@pytest.mark.parametrize("live", [pytest.param(True, id="live"), pytest.param(False, id="after-restart")])
async def test_delete_completing_while_a_resume_is_past_auth_wins(
        start_gateway: StartGateway, authenticator: MacaroonAuthenticator, token: str, live: bool) -> None:
    """The tombstone check runs after the await, with the insert: the POST sees the finished DELETE."""
    gate = GatedAuthenticator(authenticator)
    gw = await start_gateway(auth=gate)
    if live:
        session_id = await gw.initialize(token)
    else:  # issued elsewhere, resumed here
        session_id = make_session_id(token)
        assert_served(await gw.call(token, session_id), session_id)

    post = await held_at_auth(gate, gw.call(token, session_id, "held"))
    assert (await gw.delete(token, session_id)).status == 200
    gate.release.set()
    assert_unknown_id(await asyncio.wait_for(post, 5))
    assert not close_then_connect(gw, session_id)


async def test_resume_completing_while_a_delete_is_past_auth_is_then_ended(
        start_gateway: StartGateway, authenticator: MacaroonAuthenticator, token: str) -> None:
    gate = GatedAuthenticator(authenticator)
    gw = await start_gateway(auth=gate)
    session_id = make_session_id(token)

    delete = await held_at_auth(gate, gw.delete(token, session_id))
    assert_served(await gw.call(token, session_id), session_id)
    gate.release.set()
    assert (await asyncio.wait_for(delete, 5)).status == 200
    assert_unknown_id(await gw.call(token, session_id))
    assert not close_then_connect(gw, session_id)
