"""Header auth mode (issue 3) over real HTTP: macaroon bearers decide who may open, use and keep a session.

The gateway is the real app (``create_app``) with the real ``MacaroonAuthenticator`` built from settings by
``authenticator_from_settings``; only the upstream pool and the policy are in-process fakes. The
authenticator's wall clock is a ``FakeClock`` (token expiry); the revocation-latency tests move the
revocation store's clock by hand against a real revocation file.

Every refusal is checked for what it must not do as well: create a session, forward a call, or repeat
the bearer in the answer, in a log line or in an event.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, MutableMapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiohttp import ClientResponse, web
from aiohttp.test_utils import TestClient
from multidict import CIMultiDictProxy
from pydantic import SecretStr, ValidationError
from pymacaroons import Macaroon
from pytest_aiohttp import AiohttpClient
from structlog.testing import capture_logs

from satgate_mcp import events, jsonrpc
from satgate_mcp.app import create_app
from satgate_mcp.auth.factory import authenticator_from_settings
from satgate_mcp.auth.header import MacaroonAuthenticator
from satgate_mcp.auth.macaroons import SIGNATURE_MISMATCH, add_caveats, mint_token
from satgate_mcp.auth.revocation import RevocationStore
from satgate_mcp.config_problems import format_errors
from satgate_mcp.events import FanoutPublisher, LogPublisher, RecordingPublisher
from satgate_mcp.jsonrpc import JsonObj
from satgate_mcp.keys import REGISTRY
from satgate_mcp.sessions import SessionRegistry
from satgate_mcp.settings import Settings
from satgate_mcp.stores.files import FileRevocationStore
from tests.answers import decode_answer
from tests.fakes import AllowAllPolicy, FakeClock, FakePool

REPO = Path(__file__).resolve().parents[2]
KEY = "header-mode-http-tests-root-key-0123456789"
OTHER_KEY = "another-deployments-root-key-0123456789ab"
#: The authenticator's wall clock at the start of every test; tokens are minted at this instant.
NOW = 1_700_000_000.0
OAUTH_URL = "https://gw.example.com/.well-known/oauth-protected-resource/mcp"
AUTH_SERVERS = ["https://auth.example.com", "https://login.example.org/tenant-1"]
TOOLS = ["echo", "db_read", "db_write", "search", "secret_tool"]
SSE_ACCEPT = "application/json, text/event-stream"
#: The issue's promise: a revocation reaches a live session within this many seconds.
REVOCATION_LATENCY = 1.0
#: Time that passes between two calls while a file-backed revocation is on its way.
POLL_PAUSE = 0.02
CLI_TIMEOUT = 20.0
#: Bound on waiting for something the gateway sends on its own (an SSE event).
WAIT = 5.0


# --- tokens --------------------------------------------------------------------------------------


def mint(token_id: str = "agent-1", *, key: str = KEY, ttl: float | None = None, now: float = NOW,
         tools: list[str] | None = None, parent_id: str | None = None, ancestors: tuple[str, ...] = ()) -> str:
    return mint_token(key, token_id, ttl=ttl, now=now, tools=tools, parent_id=parent_id, ancestors=ancestors)


def _decode(token: str) -> bytearray:
    return bytearray(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))


def _encode(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")


def tampered_signature(token: str) -> str:
    raw = _decode(token)
    raw[-1] ^= 0x80  # a v2 macaroon ends with its 32-byte signature
    return _encode(bytes(raw))


def tampered_identifier(token: str) -> str:
    """The signature kept, the identity re-pointed: what a holder who wants another id's budget would try."""
    raw = bytes(_decode(token))
    assert raw.count(b'"token_id":"agent-1"') == 1
    return _encode(raw.replace(b'"token_id":"agent-1"', b'"token_id":"agent-9"'))


def with_unknown_caveat(token: str) -> str:
    """Any holder can append a first-party caveat; one this gateway does not know must fail closed."""
    mac = Macaroon.deserialize(token)
    mac.add_first_party_caveat("admin = true")
    return str(mac.serialize())


# --- the gateway under test ----------------------------------------------------------------------


@dataclass(frozen=True)
class Answer:
    status: int
    headers: CIMultiDictProxy[str]
    text: str

    @property
    def body(self) -> Any:
        return decode_answer(self.headers.get("Content-Type", "").partition(";")[0], self.text)

    @property
    def error(self) -> str | None:
        """``error.data.error`` of a JSON-RPC error body."""
        body = self.body
        if isinstance(body, dict) and isinstance(body.get("error"), dict):
            data = body["error"].get("data")
            return data.get("error") if isinstance(data, dict) else None
        return None


@dataclass
class Gateway:
    client: TestClient[web.Request, web.Application]
    auth: MacaroonAuthenticator
    pool: FakePool
    recorded: RecordingPublisher
    #: Structured log lines captured while the test ran (``structlog.testing.capture_logs``).
    logs: list[MutableMapping[str, Any]] = field(default_factory=list)

    @property
    def registry(self) -> SessionRegistry:
        app = self.client.app
        assert app is not None
        return app[REGISTRY]

    async def revoke(self, token_id: str) -> None:
        await self.auth.revocations.revoke(token_id)

    async def post(self, body: JsonObj, *, token: str | None = None, session: str | None = None,
                   path: str = "/mcp", headers: dict[str, str] | None = None) -> Answer:
        sent = {"Content-Type": "application/json", "Accept": SSE_ACCEPT}
        if token is not None:
            sent["Authorization"] = f"Bearer {token}"
        if session is not None:
            sent["Mcp-Session-Id"] = session
        sent.update(headers or {})
        async with self.client.post(path, data=json.dumps(body), headers=sent) as resp:
            return Answer(resp.status, resp.headers, await resp.text())

    async def initialize(self, token: str) -> str:
        answer = await self.post(init_request(), token=token)
        assert answer.status == 200, answer.text
        return answer.headers["Mcp-Session-Id"]

    def forwarded(self) -> list[str]:
        """Names of the tools the pool was asked to run."""
        return [str((params or {}).get("name")) for _method, params in self.pool.calls]


StartGateway = Callable[..., Awaitable[Gateway]]


def init_request(request_id: int = 1, params: JsonObj | None = None) -> JsonObj:
    base: JsonObj = {"protocolVersion": "2025-06-18", "capabilities": {},
                     "clientInfo": {"name": "header-mode-tests", "version": "1"}}
    return jsonrpc.request_message(request_id, "initialize", {**base, **(params or {})})


def call_tool(request_id: int, name: str, meta: JsonObj | None = None) -> JsonObj:
    params: JsonObj = {"name": name, "arguments": {"text": f"{name}-{request_id}"}}
    if meta is not None:
        params["_meta"] = meta
    return jsonrpc.request_message(request_id, "tools/call", params)


@pytest.fixture
def wall() -> FakeClock:
    """The authenticator's clock: what token expiry is judged against."""
    return FakeClock(NOW)


@pytest.fixture
def captured_logs() -> Iterator[list[MutableMapping[str, Any]]]:
    with capture_logs() as logs:
        yield logs


@pytest.fixture
def start(aiohttp_client: AiohttpClient, wall: FakeClock,
          captured_logs: list[MutableMapping[str, Any]]) -> StartGateway:
    async def make(*, clock: Callable[[], float] | None = None, revocations: RevocationStore | None = None,
                   **overrides: Any) -> Gateway:
        settings = Settings(auth_mode="header", root_key=SecretStr(KEY), **overrides)
        auth = authenticator_from_settings(settings, clock=clock or wall, revocations=revocations)
        assert isinstance(auth, MacaroonAuthenticator)
        pool, recorded = FakePool(list(TOOLS)), RecordingPublisher()
        # Events also go to the log, as in the daemon, so the leak checks see them there too.
        publisher = FanoutPublisher([LogPublisher(), recorded])
        app = create_app(settings, authenticator=auth, pool=pool, policy=AllowAllPolicy(), publisher=publisher,
                         clock=FakeClock(1000.0))
        return Gateway(await aiohttp_client(app), auth, pool, recorded, captured_logs)

    return make


# --- what every refusal must (not) do --------------------------------------------------------------


def assert_refused(answer: Answer, status: int, error: str, *, request_id: int | None, oauth: bool) -> None:
    """A JSON-RPC error body with the request's id; a 401 challenges, pointing at the metadata in OAuth mode."""
    assert answer.status == status, answer.text
    assert answer.headers["Content-Type"].startswith("application/json")
    body = answer.body
    assert body["jsonrpc"] == "2.0"
    assert body["id"] == request_id
    assert isinstance(body["error"]["code"], int)
    assert body["error"]["message"]
    assert answer.error == error
    challenge = answer.headers.get("WWW-Authenticate")
    if status == 401:
        assert challenge is not None
        assert challenge.startswith("Bearer ")
        assert (f'resource_metadata="{OAUTH_URL}"' in challenge) == oauth
    else:
        assert challenge is None
    if error == "token_revoked":
        assert body["error"]["data"] == {"error": "token_revoked", "code": "TOKEN_REVOKED"}


def assert_never_repeated(token: str | None, gw: Gateway, *answers: Answer) -> None:
    """The bearer is a secret: not in a body, a header, a log line or an event."""
    if not token:
        return
    for answer in answers:
        assert token not in answer.text
        assert all(token not in value for value in answer.headers.values())
    assert gw.logs, "the log capture saw nothing: the leak check would prove nothing"
    for line in gw.logs:
        assert token not in repr(line), line
    for name, fields in gw.recorded.events:
        assert token not in repr(fields), name


def assert_nothing_created(gw: Gateway) -> None:
    assert len(gw.registry) == 0
    assert gw.registry.tombstone_count == 0
    assert gw.recorded.named(events.SESSION_CONNECT) == []


# --- initialize ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Presented:
    token: Callable[[], str | None]
    revoked: tuple[str, ...] = ()


@pytest.mark.parametrize("oauth", [pytest.param(False, id="plain"), pytest.param(True, id="oauth")])
@pytest.mark.parametrize(
    ("presented", "status", "error", "outcome"),
    [
        pytest.param(Presented(lambda: None), 401, "unauthorized", "missing", id="no-token"),
        pytest.param(Presented(lambda: "not-a-macaroon"), 401, "invalid_token", "invalid", id="garbage"),
        pytest.param(Presented(lambda: mint(key=OTHER_KEY)), 401, "invalid_token", "invalid", id="wrong-key"),
        pytest.param(Presented(lambda: tampered_signature(mint())), 401, "invalid_token", "invalid",
                     id="tampered-signature"),
        pytest.param(Presented(lambda: tampered_identifier(mint())), 401, "invalid_token", "invalid",
                     id="tampered-identifier"),
        pytest.param(Presented(lambda: with_unknown_caveat(mint())), 401, "invalid_token", "invalid",
                     id="unknown-caveat"),
        pytest.param(Presented(lambda: mint(ttl=60, now=NOW - 61)), 401, "token_expired", "expired",
                     id="expired"),
        pytest.param(Presented(lambda: add_caveats(mint(ttl=3600), ttl=60, now=NOW - 61)), 401, "token_expired",
                     "expired", id="narrowed-to-an-expiry-that-passed"),
        pytest.param(Presented(lambda: mint(), revoked=("agent-1",)), 403, "token_revoked", "revoked",
                     id="revoked"),
        pytest.param(Presented(lambda: mint("child-1", parent_id="lead", ancestors=("root",)), revoked=("root",)),
                     403, "token_revoked", "revoked", id="ancestor-revoked"),
    ],
)
async def test_initialize_with_a_token_that_does_not_pass_is_refused_and_creates_nothing(
    start: StartGateway, oauth: bool, presented: Presented, status: int, error: str, outcome: str
) -> None:
    gw = await start(**({"oauth_resource_metadata_url": OAUTH_URL} if oauth else {}))
    for token_id in presented.revoked:
        await gw.revoke(token_id)
    token = presented.token()
    if oauth and status == 403:
        status = 401  # OAuth clients fetch a new token on a 401 challenge; a 403 would stop them

    answer = await gw.post(init_request(request_id=7), token=token)

    assert_refused(answer, status, error, request_id=7, oauth=oauth)
    assert "Mcp-Session-Id" not in answer.headers
    assert_nothing_created(gw)
    (failure,) = gw.recorded.named(events.AUTH_FAILURE)
    assert failure["outcome"] == outcome
    # Only a token whose signature verified (revoked, expired) is named; a forged one claims nothing.
    verified = outcome in ("revoked", "expired")
    assert ("token_id" in failure) is verified
    assert_never_repeated(token, gw, answer)


@pytest.mark.parametrize(
    ("presented", "reason", "hinted"),
    [
        pytest.param(lambda: mint(key=OTHER_KEY), SIGNATURE_MISMATCH, True, id="minted-under-another-root-key"),
        pytest.param(lambda: tampered_signature(mint()), SIGNATURE_MISMATCH, True, id="tampered-signature"),
        pytest.param(lambda: "not-a-macaroon", "malformed token", False, id="garbage-gets-no-key-hint"),
    ],
)
async def test_a_signature_that_does_not_verify_is_logged_as_a_root_key_mismatch_and_told_nobody_else(
    start: StartGateway, presented: Callable[[], str], reason: str, hinted: bool
) -> None:
    """Issue 23: a bare ``invalid`` left an operator with two processes on different keys guessing."""
    gw = await start()
    token = presented()
    answer = await gw.post(init_request(request_id=7), token=token)
    baseline = await gw.post(init_request(request_id=7), token="not-a-macaroon")

    assert_refused(answer, 401, "invalid_token", request_id=7, oauth=False)
    # The client learns nothing new: the very answer any other invalid token gets.
    assert (answer.text, answer.headers["WWW-Authenticate"]) == (baseline.text, baseline.headers["WWW-Authenticate"])
    [line, _] = [e for e in gw.logs if e["event"] == events.AUTH_FAILURE]
    assert (line["outcome"], line["reason"]) == ("invalid", reason)
    assert "token_id" not in line  # an unverified identifier claims nothing
    if hinted:
        assert "does not verify under this gateway's SATGATE_ROOT_KEY" in line["hint"]
        assert "every gateway process" in line["hint"]
        assert KEY not in line["hint"]
        assert OTHER_KEY not in line["hint"]
    else:
        assert "hint" not in line
    assert_never_repeated(token, gw, answer)


async def test_initialize_with_a_valid_token_opens_a_session_with_its_identity(start: StartGateway) -> None:
    token = mint_token(KEY, "agent-1", budget_id="team-a", tenant="acme", tools=["echo"], now=NOW, ttl=600)
    gw = await start()
    answer = await gw.post(init_request(), token=token)
    assert answer.status == 200, answer.text
    session = gw.registry.get(answer.headers["Mcp-Session-Id"])
    assert session is not None
    assert (session.identity.token_id, session.identity.budget_id, session.identity.tenant) == (
        "agent-1", "team-a", "acme")
    [connect] = gw.recorded.named(events.SESSION_CONNECT)
    assert connect["token_id"] == "agent-1"
    assert_never_repeated(token, gw, answer)


@pytest.mark.parametrize(
    ("where", "path", "headers"),
    [
        pytest.param("query-token", "/mcp?token={token}", {}, id="query-token"),
        pytest.param("query-access-token", "/mcp?access_token={token}", {}, id="query-access_token"),
        pytest.param("meta-token", "/mcp", {}, id="params-_meta-token"),
        pytest.param("no-scheme", "/mcp", {"Authorization": "{token}"}, id="authorization-without-bearer"),
        pytest.param("other-scheme", "/mcp", {"Authorization": "Token {token}"}, id="authorization-token-scheme"),
        pytest.param("other-header", "/mcp", {"X-Api-Key": "{token}"}, id="another-header"),
        pytest.param("cookie", "/mcp", {"Cookie": "token={token}"}, id="cookie"),
    ],
)
async def test_the_bearer_is_read_only_from_the_authorization_bearer_header(
    start: StartGateway, where: str, path: str, headers: dict[str, str]
) -> None:
    token = mint()
    gw = await start()
    params: JsonObj = {"_meta": {"token": token}} if where == "meta-token" else {}
    answer = await gw.post(init_request(request_id=3, params=params), path=path.format(token=token),
                           headers={k: v.format(token=token) for k, v in headers.items()})
    assert_refused(answer, 401, "unauthorized", request_id=3, oauth=False)
    assert_nothing_created(gw)
    assert_never_repeated(token, gw, answer)


# --- a live session ------------------------------------------------------------------------------

async def present_after(change: str, gw: Gateway, wall: FakeClock, opener: str) -> tuple[str | None, str | None]:
    """What happens between opening a session and presenting a credential again.

    Apply ``change``; return (the bearer sent in the header, a token sent only in ``params._meta``)."""
    match change:
        case "nothing":
            return opener, None
        case "expired":
            wall.advance(3600)
            return opener, None
        case "revoked":
            await gw.revoke("agent-1")
            return opener, None
        case "parent-revoked":
            await gw.revoke("lead")
            return opener, None
        case "other-token":
            return mint("agent-2"), None
        case "narrowed-copy":
            return add_caveats(opener, tools=["echo"]), None
        case "no-token":
            return None, None
        case "token-only-in-meta":
            return None, opener
    raise AssertionError(change)


@pytest.mark.parametrize(
    ("oauth", "change", "status", "error", "opener_works_after"),
    [
        pytest.param(False, "nothing", 200, None, True, id="same-token"),
        pytest.param(False, "expired", 401, "token_expired", False, id="expired-since"),
        pytest.param(False, "revoked", 403, "token_revoked", False, id="revoked-since"),
        pytest.param(False, "parent-revoked", 403, "token_revoked", False, id="parent-revoked-since"),
        pytest.param(False, "other-token", 403, "session_token_mismatch", True, id="another-valid-token"),
        pytest.param(False, "narrowed-copy", 403, "session_token_mismatch", True, id="narrowed-copy-of-its-token"),
        pytest.param(False, "no-token", 401, "unauthorized", True, id="no-token"),
        pytest.param(False, "token-only-in-meta", 401, "unauthorized", True, id="token-only-in-meta"),
        pytest.param(True, "nothing", 200, None, True, id="oauth-same-token"),
        pytest.param(True, "expired", 401, "token_expired", False, id="oauth-expired-since"),
        pytest.param(True, "revoked", 401, "token_revoked", False, id="oauth-revoked-since"),
        pytest.param(True, "other-token", 404, "session_not_found", True, id="oauth-another-valid-token"),
        pytest.param(True, "no-token", 401, "unauthorized", True, id="oauth-no-token"),
    ],
)
async def test_a_live_session_answers_only_to_the_still_valid_token_that_opened_it(
    start: StartGateway, wall: FakeClock, oauth: bool, change: str, status: int, error: str | None,
    opener_works_after: bool,
) -> None:
    gw = await start(**({"oauth_resource_metadata_url": OAUTH_URL} if oauth else {}))
    opener = mint("agent-1", ttl=1800, parent_id="lead")
    session = await gw.initialize(opener)
    bearer, meta_token = await present_after(change, gw, wall, opener)

    answer = await gw.post(call_tool(2, "echo", {"token": meta_token} if meta_token else None),
                           token=bearer, session=session)

    if error is None:
        assert answer.status == 200, answer.text
        assert answer.body["result"]["content"] == [{"type": "text", "text": "echo-2"}]
        assert answer.headers["Mcp-Session-Id"] == session
        assert gw.forwarded() == ["echo"]
    else:
        assert_refused(answer, status, error, request_id=2, oauth=oauth)
        assert "Mcp-Session-Id" not in answer.headers
        assert gw.forwarded() == [], "a refused request never reaches the upstream"
    assert gw.registry.get(session) is not None, "a refusal does not end the session for its owner"
    assert len(gw.recorded.named(events.SESSION_CONNECT)) == 1
    after = await gw.post(call_tool(3, "echo"), token=opener, session=session)
    assert (after.status == 200) == opener_works_after, after.text
    assert_never_repeated(opener, gw, answer, after)
    if bearer is not None:
        assert_never_repeated(bearer, gw, answer)


@pytest.mark.parametrize(
    ("change", "status", "error"),
    [
        pytest.param("other-token", 403, "session_token_mismatch", id="another-valid-token"),
        pytest.param("narrowed-copy", 403, "session_token_mismatch", id="narrowed-copy-of-its-token"),
        pytest.param("revoked", 403, "token_revoked", id="revoked-since"),
        pytest.param("expired", 401, "token_expired", id="expired-since"),
        pytest.param("no-token", 401, "unauthorized", id="no-token"),
    ],
)
async def test_only_the_still_valid_opener_can_end_a_session(
    start: StartGateway, wall: FakeClock, change: str, status: int, error: str
) -> None:
    gw = await start()
    opener = mint("agent-1", ttl=1800, parent_id="lead")
    session = await gw.initialize(opener)
    bearer, _ = await present_after(change, gw, wall, opener)
    headers = {"Mcp-Session-Id": session, **({"Authorization": f"Bearer {bearer}"} if bearer else {})}
    async with gw.client.delete("/mcp", headers=headers) as resp:
        answer = Answer(resp.status, resp.headers, await resp.text())
    assert_refused(answer, status, error, request_id=None, oauth=False)
    assert gw.registry.get(session) is not None
    assert gw.recorded.named(events.SESSION_CLOSE) == []


async def test_the_opener_ends_its_session(start: StartGateway) -> None:
    gw = await start()
    opener = mint()
    session = await gw.initialize(opener)
    async with gw.client.delete("/mcp", headers={"Mcp-Session-Id": session,
                                                 "Authorization": f"Bearer {opener}"}) as resp:
        assert resp.status == 200
    assert gw.registry.get(session) is None


# --- the legacy HTTP+SSE transport verifies the same way --------------------------------------------


async def open_legacy_stream(gw: Gateway, token: str | None) -> tuple[ClientResponse, str | None]:
    """GET /sse; on success also the session id from the stream's ``endpoint`` event."""
    headers = {"Accept": "text/event-stream", **({"Authorization": f"Bearer {token}"} if token else {})}
    resp = await gw.client.get("/sse", headers=headers)
    if resp.status != 200:
        return resp, None
    async with asyncio.timeout(WAIT):
        while not (line := (await resp.content.readline()).decode()).startswith("data: "):
            assert line, "the stream ended before its endpoint event"
    return resp, line.strip().rsplit("sessionId=", 1)[1]


@pytest.mark.parametrize(
    ("presented", "status", "error"),
    [
        pytest.param(Presented(lambda: None), 401, "unauthorized", id="no-token"),
        pytest.param(Presented(lambda: tampered_signature(mint())), 401, "invalid_token", id="tampered-signature"),
        pytest.param(Presented(lambda: mint(ttl=60, now=NOW - 61)), 401, "token_expired", id="expired"),
        pytest.param(Presented(lambda: mint(), revoked=("agent-1",)), 403, "token_revoked", id="revoked"),
    ],
)
async def test_legacy_sse_stream_refuses_what_mcp_refuses(
    start: StartGateway, presented: Presented, status: int, error: str
) -> None:
    gw = await start()
    for token_id in presented.revoked:
        await gw.revoke(token_id)
    token = presented.token()
    resp, _ = await open_legacy_stream(gw, token)
    answer = Answer(resp.status, resp.headers, await resp.text())
    assert_refused(answer, status, error, request_id=None, oauth=False)
    assert_nothing_created(gw)
    assert_never_repeated(token, gw, answer)


async def test_legacy_message_answers_only_to_the_still_valid_opener(start: StartGateway) -> None:
    gw = await start()
    opener = mint("agent-1", parent_id="lead")
    resp, session = await open_legacy_stream(gw, opener)
    assert session is not None
    try:
        async def post(token: str) -> Answer:
            async with gw.client.post(f"/message?sessionId={session}", data=json.dumps(call_tool(1, "echo")),
                                      headers={"Content-Type": "application/json",
                                               "Authorization": f"Bearer {token}"}) as reply:
                return Answer(reply.status, reply.headers, await reply.text())

        assert_refused(await post(mint("agent-2")), 403, "session_token_mismatch", request_id=None, oauth=False)
        assert (await post(opener)).status == 202
        async with asyncio.timeout(WAIT):
            while not (line := (await resp.content.readline()).decode()).startswith("data: "):
                assert line, "the stream ended before the reply"
        assert json.loads(line[len("data: "):])["result"]["content"] == [{"type": "text", "text": "echo-1"}]
        await gw.revoke("lead")
        assert_refused(await post(opener), 403, "token_revoked", request_id=None, oauth=False)
    finally:
        resp.close()


# --- revocation reaches a live session within one second -------------------------------------------


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SATGATE_")}
    env.update(SATGATE_STATE_DIR="memory", **extra)
    return env


async def revoke_by_cli(path: Path, token_id: str) -> None:
    """``satgate-mcp token revoke ID`` as an operator runs it, next to the live daemon."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "satgate_mcp", "token", "revoke", token_id, cwd=REPO,
        env=clean_env(SATGATE_REVOCATION_FILE=str(path)),
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        out, err = await asyncio.wait_for(proc.communicate(), CLI_TIMEOUT)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    assert proc.returncode == 0, err.decode()
    assert out.decode().strip() == f"revoked {token_id}"


def append_line(path: Path, token_id: str) -> None:
    """What an operator's own tooling (or a config-management run) does: a plain append."""
    with path.open("a", encoding="utf-8") as fh:
        fh.write(f"{token_id}  # leaked in a paste\n")


@pytest.mark.parametrize(
    ("session_token_id", "revoked_id", "how"),
    [
        pytest.param("agent-1", "agent-1", "append", id="own-id-appended"),
        pytest.param("agent-1", "agent-1", "cli", id="own-id-by-token-revoke"),
        pytest.param("child-1", "lead", "append", id="parent-id-appended"),
        pytest.param("child-1", "root", "cli", id="grandparent-id-by-token-revoke"),
    ],
)
@pytest.mark.process
async def test_a_revocation_written_to_the_file_refuses_a_live_session_within_one_second(
    start: StartGateway, tmp_path: Path, session_token_id: str, revoked_id: str, how: str
) -> None:
    path = tmp_path / "revoked"
    path.write_text("# one revoked token id per line\nsomebody-else\n")
    store_clock = FakeClock()  # the daemon's store on a clock the test moves: the file is real, time is not
    gw = await start(revocations=FileRevocationStore(path, clock=store_clock))
    if session_token_id == "child-1":
        token = mint_token(KEY, "child-1", parent_id="lead", ancestors=("root",))
    else:
        token = mint_token(KEY, session_token_id)
    session = await gw.initialize(token)
    for request_id in range(3):  # warm the verification cache: it must not hide what follows
        answer = await gw.post(call_tool(request_id, "echo"), token=token, session=session)
        assert answer.status == 200, answer.text

    if how == "cli":
        await revoke_by_cli(path, revoked_id)
    else:
        await asyncio.to_thread(append_line, path, revoked_id)
    appended_at = store_clock()
    assert revoked_id in path.read_text().split()
    forwarded_before = len(gw.pool.calls)

    request_id = 100
    while True:
        request_id += 1
        answer = await gw.post(call_tool(request_id, "echo"), token=token, session=session)
        answered_at = store_clock()
        if answer.status != 200:
            break
        assert answered_at - appended_at < REVOCATION_LATENCY, "still served a second after the revocation"
        store_clock.advance(POLL_PAUSE)

    assert answered_at - appended_at < REVOCATION_LATENCY
    assert_refused(answer, 403, "token_revoked", request_id=request_id, oauth=False)
    assert len(gw.pool.calls) - forwarded_before == request_id - 101, "the refused call was not forwarded"
    assert_never_repeated(token, gw, answer)


async def test_a_token_with_an_unrelated_id_keeps_working_after_a_revocation(
    start: StartGateway, tmp_path: Path
) -> None:
    path = tmp_path / "revoked"
    # Re-read on every lookup, so the call below is judged against the file as it is now.
    gw = await start(revocations=FileRevocationStore(path, check_interval=0.0), clock=time.time)
    token = mint_token(KEY, "agent-1", parent_id="lead")
    session = await gw.initialize(token)
    for similar in ("agent-10", "agent", "lead-2", "AGENT-1"):  # neither prefixes, substrings nor case count
        append_line(path, similar)
    answer = await gw.post(call_tool(1, "echo"), token=token, session=session)
    assert answer.status == 200, answer.text
    append_line(path, "lead")
    answer = await gw.post(call_tool(2, "echo"), token=token, session=session)
    assert_refused(answer, 403, "token_revoked", request_id=2, oauth=False)


# --- the tools caveat ----------------------------------------------------------------------------


def narrowed(tools: list[str], narrower: list[str]) -> Callable[[], str]:
    return lambda: add_caveats(mint(tools=tools), tools=narrower)


@pytest.mark.parametrize(
    ("token", "visible"),
    [
        pytest.param(lambda: mint(), TOOLS, id="no-tools-caveat-sees-all"),
        pytest.param(lambda: mint(tools=["*"]), TOOLS, id="star"),
        pytest.param(lambda: mint(tools=["echo", "db_*"]), ["echo", "db_read", "db_write"], id="names-and-prefix"),
        pytest.param(lambda: mint(tools=["search"]), ["search"], id="one-name"),
        pytest.param(lambda: mint(tools=["ech"]), [], id="a-name-is-not-a-prefix"),
        pytest.param(lambda: mint(tools=[]), [], id="empty-tools-caveat-sees-none"),
        pytest.param(narrowed(["echo", "db_*"], ["db_read", "search"]), ["db_read"], id="holder-narrowed-intersects"),
        pytest.param(narrowed(["db_*"], ["*"]), ["db_read", "db_write"], id="holder-cannot-widen-with-star"),
    ],
)
async def test_tools_caveat_filters_tools_list_and_refuses_calls_outside_it_without_forwarding(
    start: StartGateway, token: Callable[[], str], visible: list[str]
) -> None:
    bearer = token()
    gw = await start()
    session = await gw.initialize(bearer)

    listed = await gw.post(jsonrpc.request_message(1, "tools/list"), token=bearer, session=session)
    assert listed.status == 200, listed.text
    assert [t["name"] for t in listed.body["result"]["tools"]] == visible

    for request_id, name in enumerate(TOOLS, start=10):
        answer = await gw.post(call_tool(request_id, name), token=bearer, session=session)
        assert answer.status == 200, answer.text
        body = answer.body
        assert body["id"] == request_id
        if name in visible:
            assert body["result"]["content"] == [{"type": "text", "text": f"{name}-{request_id}"}]
        else:
            assert body["error"]["code"] == jsonrpc.TOOL_NOT_ALLOWED == -32001
            assert body["error"]["data"]["error"] == "tool_not_allowed"
            assert body["error"]["data"]["tool"] == name
    assert gw.forwarded() == visible, "a tool outside the caveat is never forwarded"


# --- OAuth protected resource metadata (RFC 9728) ------------------------------------------------


@pytest.mark.parametrize(
    "metadata_url",
    [
        pytest.param(OAUTH_URL, id="path-inserted-url"),
        pytest.param("https://gw.example.com/.well-known/oauth-protected-resource", id="root-url"),
    ],
)
@pytest.mark.parametrize(
    "path",
    [
        pytest.param("/.well-known/oauth-protected-resource", id="root"),
        pytest.param("/.well-known/oauth-protected-resource/mcp", id="path-inserted"),
    ],
)
async def test_protected_resource_metadata_is_served_without_a_token(
    start: StartGateway, metadata_url: str, path: str
) -> None:
    gw = await start(oauth_resource_metadata_url=metadata_url,
                     oauth_authorization_servers=",".join(AUTH_SERVERS))
    async with gw.client.get(path) as resp:
        assert resp.status == 200
        assert resp.content_type == "application/json"
        document = await resp.json()
    assert {k: document[k] for k in ("resource", "authorization_servers", "bearer_methods_supported")} == {
        "resource": "https://gw.example.com/mcp",
        "authorization_servers": AUTH_SERVERS,
        "bearer_methods_supported": ["header"],
    }


@pytest.mark.parametrize("path", ["/.well-known/oauth-protected-resource",
                                  "/.well-known/oauth-protected-resource/mcp"])
async def test_no_metadata_document_without_a_metadata_url(start: StartGateway, path: str) -> None:
    gw = await start()
    async with gw.client.get(path) as resp:
        assert resp.status == 404


async def test_without_a_metadata_url_a_401_has_no_resource_metadata(start: StartGateway) -> None:
    gw = await start()
    answer = await gw.post(init_request())
    assert_refused(answer, 401, "unauthorized", request_id=1, oauth=False)
    assert "resource_metadata" not in answer.headers["WWW-Authenticate"]


# --- start-up refusals ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("values", "variable", "secret"),
    [
        pytest.param({"oauth_resource_metadata_url": "http://not-https"}, "SATGATE_OAUTH_RESOURCE_METADATA_URL",
                     None, id="metadata-url-not-https"),
        pytest.param({"oauth_resource_metadata_url": "/.well-known/oauth-protected-resource"},
                     "SATGATE_OAUTH_RESOURCE_METADATA_URL", None, id="metadata-url-relative"),
        pytest.param({"auth_mode": "header"}, "SATGATE_ROOT_KEY", None, id="header-mode-without-root-key"),
        pytest.param({"auth_mode": "header", "root_key": "short-key-31-chars-long-0123456"}, "SATGATE_ROOT_KEY",
                     "short-key-31-chars-long-0123456", id="header-mode-short-root-key"),
    ],
)
def test_settings_refuse_to_start_with_one_line_naming_the_variable(
    values: dict[str, str], variable: str, secret: str | None
) -> None:
    with pytest.raises(ValidationError) as exc:
        Settings(**values)  # type: ignore[arg-type]
    lines = format_errors(exc.value).splitlines()
    assert len(lines) == 1, lines
    assert variable in lines[0]
    if secret is not None:
        assert secret not in lines[0]


def test_a_root_key_of_exactly_the_minimum_length_is_accepted() -> None:
    settings = Settings(auth_mode="header", root_key=SecretStr("k" * 32))
    assert isinstance(authenticator_from_settings(settings), MacaroonAuthenticator)


@pytest.fixture
async def silent_redis() -> AsyncIterator[str]:
    """A Redis that accepts connections and never answers: a paused server, or one behind a dead link."""
    held: list[asyncio.StreamWriter] = []

    async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)
        await reader.read()  # until the client gives up

    server = await asyncio.start_server(hold, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        for writer in held:
            writer.close()
        server.close()
        await server.wait_closed()


async def test_attack_a_paused_store_turns_no_valid_token_into_a_401(start: StartGateway, silent_redis: str) -> None:
    """A store fault is the gateway's: 503 + Retry-After within SATGATE_REDIS_TIMEOUT, never a 401 that makes
    OAuth clients throw their token away, never a hang."""
    gw = await start(redis_url=silent_redis, redis_timeout=0.2)
    answer = await asyncio.wait_for(gw.post(init_request(request_id=3), token=mint_token(KEY, "agent-1", now=NOW)),
                                    timeout=5)
    assert answer.status == 503, answer.text
    assert answer.headers["Retry-After"] == "1"
    assert "WWW-Authenticate" not in answer.headers
    body = json.loads(answer.text)
    assert (body["id"], body["error"]["data"]["error"]) == (3, "store_unavailable")
    assert "Mcp-Session-Id" not in answer.headers
    (failure,) = gw.recorded.named(events.AUTH_FAILURE)
    assert (failure["outcome"], failure["token_id"]) == ("unavailable", "agent-1")


async def test_fail_mode_open_serves_verified_tokens_through_a_store_fault(start: StartGateway, silent_redis: str
                                                                            ) -> None:
    gw = await start(redis_url=silent_redis, redis_timeout=0.2, store_fail_mode="open")
    assert (await gw.post(init_request(), token=mint_token(KEY, "agent-1", now=NOW))).status == 200
    forged = mint_token("f" * 40, "agent-1", now=NOW)
    assert (await gw.post(init_request(), token=forged)).status == 401
