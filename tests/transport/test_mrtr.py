"""Multi round-trip requests (2026-07-28) in front of a 2025 upstream: the rules of the sealed state, and the
rounds over real HTTP, with the attacks a holder of someone else's ``requestState`` would try.

The gateway is the real app in header mode (macaroon tokens); the upstream is a fake whose ``ask`` tool puts
``elicitation/create`` to its client through the call's relay, as a 2025 server does mid-call.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient
from pydantic import SecretStr
from pytest_aiohttp import AiohttpClient

from satgate_mcp import jsonrpc
from satgate_mcp.app import create_app
from satgate_mcp.auth.macaroons import mint_token
from satgate_mcp.jsonrpc import JsonObj
from satgate_mcp.settings import Settings
from satgate_mcp.transport import mrtr
from satgate_mcp.transport.mrtr import StateRefused, derive_keys, request_digest, seal, unseal
from satgate_mcp.upstream.base import ProgressCallback, Relay, Resume
from tests.fakes import AllowAllPolicy, FakePool

KEY = "mrtr-tests-root-key-0123456789abcdefghijkl"
VERSION = "2026-07-28"
ELICIT: JsonObj = {"mode": "form", "message": "Your name?",
                   "requestedSchema": {"type": "object", "properties": {"name": {"type": "string"}}}}


# --- the sealed state: pure rules -----------------------------------------------------------------------


KEYS = derive_keys(["first-secret", "second-secret"])
DIGEST = request_digest("tools/call", {"name": "ask", "arguments": {"q": 1}})


def sealed(**overrides: Any) -> str:
    fields: dict[str, Any] = {"flow": "f1", "holder": "h-alice", "digest": DIGEST, "expires": 1000.0, **overrides}
    return seal(KEYS, **fields)


def test_a_state_opens_for_its_holder_and_request_before_it_expires() -> None:
    assert unseal(KEYS, sealed(), holder="h-alice", digest=DIGEST, now=999.0) == "f1"


def test_the_digest_ignores_the_retry_fields_but_not_the_request() -> None:
    retry = {"name": "ask", "arguments": {"q": 1}, "inputResponses": {"x": {}}, "requestState": "s",
             "_meta": {"io.modelcontextprotocol/protocolVersion": VERSION}}
    assert request_digest("tools/call", retry) == DIGEST
    assert request_digest("tools/call", {"name": "ask", "arguments": {"q": 2}}) != DIGEST
    assert request_digest("prompts/get", {"name": "ask", "arguments": {"q": 1}}) != DIGEST


@pytest.mark.parametrize(
    ("state", "holder", "digest", "now", "why"),
    [
        pytest.param(sealed(), "h-mallory", DIGEST, 999.0, "another token", id="another-token"),
        pytest.param(sealed(), "h-alice", request_digest("tools/call", {"name": "ask"}), 999.0,
                     "another request", id="other-params"),
        pytest.param(sealed(), "h-alice", DIGEST, 1000.5, "expired", id="expired"),
        pytest.param(seal(derive_keys(["another-deployment"]), flow="f1", holder="h-alice", digest=DIGEST,
                          expires=1000.0), "h-alice", DIGEST, 999.0, "does not verify", id="foreign-key"),
        pytest.param("garbage", "h-alice", DIGEST, 999.0, "not one this gateway issued", id="garbage"),
        pytest.param(12, "h-alice", DIGEST, 999.0, "not one this gateway issued", id="not-a-string"),
        pytest.param("x" * 5000, "h-alice", DIGEST, 999.0, "not one this gateway issued", id="oversized"),
    ],
)
def test_attack_a_state_for_someone_else_another_request_or_too_late_is_refused(
        state: object, holder: str, digest: str, now: float, why: str) -> None:
    with pytest.raises(StateRefused, match=why):
        unseal(KEYS, state, holder=holder, digest=digest, now=now)


def test_attack_a_tampered_state_is_refused() -> None:
    payload, mac = sealed().split(".")
    raw = bytearray(mrtr._unb64(payload))
    raw[raw.index(b"f1")] = ord("g")  # re-point it at another flow, keep the MAC
    with pytest.raises(StateRefused, match="does not verify"):
        unseal(KEYS, f"{mrtr._b64(bytes(raw))}.{mac}", holder="h-alice", digest=DIGEST, now=999.0)


def test_keys_rotate_the_first_seals_every_one_opens() -> None:
    old_state = seal(derive_keys(["second-secret"]), flow="f1", holder="h-alice", digest=DIGEST, expires=1000.0)
    assert unseal(KEYS, old_state, holder="h-alice", digest=DIGEST, now=999.0) == "f1"
    with pytest.raises(StateRefused):
        unseal(derive_keys(["second-secret"]), sealed(), holder="h-alice", digest=DIGEST, now=999.0)



# --- a modern upstream's own state, carried inside the gateway's ------------------------------------------


def carried(**overrides: Any) -> str:
    fields: dict[str, Any] = {"upstream": "m", "state": "theirs", "holder": "h-alice", "digest": DIGEST,
                              "expires": 1000.0, **overrides}
    return mrtr.seal_carried(KEYS, **fields)


def test_a_carried_state_opens_to_its_upstream_and_the_upstreams_state() -> None:
    fields = mrtr.open_state(KEYS, carried(), holder="h-alice", digest=DIGEST, now=999.0)
    resume = mrtr.carried_resume(fields, {"ask": {"action": "accept"}})
    assert resume == Resume("m", "theirs", {"ask": {"action": "accept"}})
    assert mrtr.carried_resume(mrtr.open_state(KEYS, sealed(), holder="h-alice", digest=DIGEST, now=1.0), {}) is None
    with pytest.raises(StateRefused, match="does not name a waiting call"):
        unseal(KEYS, carried(), holder="h-alice", digest=DIGEST, now=999.0)


@pytest.mark.parametrize(("holder", "digest", "now", "why"), [
    pytest.param("h-mallory", DIGEST, 999.0, "another token", id="another-token"),
    pytest.param("h-alice", request_digest("tools/call", {"name": "other"}), 999.0, "another request",
                 id="another-request"),
    pytest.param("h-alice", DIGEST, 1000.5, "expired", id="expired"),
])
def test_attack_a_carried_state_for_someone_else_another_request_or_too_late_is_refused(
        holder: str, digest: str, now: float, why: str) -> None:
    with pytest.raises(StateRefused, match=why):
        mrtr.open_state(KEYS, carried(), holder=holder, digest=digest, now=now)


def test_attack_a_carried_state_pointed_at_another_upstream_does_not_verify() -> None:
    payload, mac = carried().split(".")
    other_payload = carried(upstream="n").split(".")[0]
    with pytest.raises(StateRefused, match="does not verify"):
        mrtr.open_state(KEYS, f"{other_payload}.{mac}", holder="h-alice", digest=DIGEST, now=1.0)
    assert payload != other_payload


@pytest.mark.parametrize(("method", "params", "capabilities", "asked"), [
    pytest.param("elicitation/create", None, {"elicitation": {}}, True, id="declared"),
    pytest.param("sampling/createMessage", None, {"elicitation": {}}, False, id="sampling-undeclared"),
    pytest.param("elicitation/create", None, {}, False, id="nothing-declared"),
    pytest.param("elicitation/create", {"mode": "url", "url": "https://x"}, {"elicitation": {}}, False,
                 id="url-mode-undeclared"),
    pytest.param("elicitation/create", {"mode": "url", "url": "https://x"}, {"elicitation": {"url": {}}}, True,
                 id="url-mode-declared"),
])
async def test_an_input_the_client_did_not_declare_is_refused_back_to_the_upstream(
        method: str, params: JsonObj | None, capabilities: JsonObj, asked: bool) -> None:
    """The upstream hears the refusal the client itself would give and decides what the call becomes."""
    async def emit(message: JsonObj) -> bool:
        return True

    flow = mrtr.Flow("h", "d", capabilities, None, emit)
    relay = mrtr.ModernRelay(flow, "s")
    if not asked:
        refused = await relay.ask(method, params, 5.0)
        assert refused["error"]["data"]["error"] == "not_relayed"
        return
    answering = asyncio.ensure_future(relay.ask(method, params, 5.0))
    [ask] = (await flow.next_outcome()).asks
    assert flow.answer({ask.key: {"action": "decline"}}) == []
    assert (await answering)["result"] == {"action": "decline"}


def test_a_carried_result_keeps_the_upstreams_requests_and_takes_the_gateways_state() -> None:
    assert mrtr.carried_result({"resultType": "input_required", "requestState": "theirs"}, "ours") == {
        "resultType": "input_required", "requestState": "ours"}

# --- rounds over HTTP ---------------------------------------------------------------------------------


class AskingPool(FakePool):
    """``ask`` puts an elicitation to its client and answers with what came back (or the refusal)."""

    def __init__(self) -> None:
        super().__init__(["ask", "echo"])
        self.answers: list[JsonObj] = []

    async def call(self, method: str, params: JsonObj | None, *, on_progress: ProgressCallback | None = None
                   ) -> JsonObj:
        if method == "tools/call" and (params or {}).get("name") == "ask" and isinstance(on_progress, Relay):
            self.calls.append((method, params))
            reply = await on_progress.ask("elicitation/create", ELICIT, 30.0)
            self.answers.append(reply)
            text = json.dumps(reply.get("result") or reply.get("error"))
            return jsonrpc.result_response(0, {"content": [{"type": "text", "text": text}], "isError": False})
        return await super().call(method, params, on_progress=on_progress)


@dataclass
class Gateway:
    http: TestClient[web.Request, web.Application]
    pool: AskingPool

    async def call(self, token: str, params: JsonObj, *, request_id: int = 1,
                   capabilities: JsonObj | None = None) -> tuple[int, JsonObj]:
        meta = {"io.modelcontextprotocol/protocolVersion": VERSION,
                "io.modelcontextprotocol/clientCapabilities": {"elicitation": {}} if capabilities is None
                else capabilities}
        body = jsonrpc.request_message(request_id, "tools/call", {**params, "_meta": meta})
        resp = await self.http.post("/mcp", data=json.dumps(body), headers={
            "Content-Type": "application/json", "Accept": "application/json", "Authorization": f"Bearer {token}",
            "MCP-Protocol-Version": VERSION, "Mcp-Method": "tools/call", "Mcp-Name": str(params["name"])})
        answer: JsonObj = await resp.json()
        assert answer["id"] == request_id
        return resp.status, answer


StartGateway = Callable[[], Awaitable[Gateway]]
ALICE, MALLORY = mint_token(KEY, "alice"), mint_token(KEY, "mallory")
ASK: JsonObj = {"name": "ask", "arguments": {"q": "name"}}


@pytest.fixture
def start(aiohttp_client: AiohttpClient) -> StartGateway:
    async def make() -> Gateway:
        settings = Settings(auth_mode="header", root_key=SecretStr(KEY), state_dir="memory")
        pool = AskingPool()
        return Gateway(await aiohttp_client(create_app(settings, pool=pool, policy=AllowAllPolicy())), pool)

    return make


async def first_round(gw: Gateway) -> tuple[str, str]:
    """(input request key, requestState) of a fresh ``ask`` call by alice."""
    status, answer = await gw.call(ALICE, ASK)
    assert status == 200
    result = answer["result"]
    assert result["resultType"] == "input_required"
    [(key, request)] = result["inputRequests"].items()
    assert request == {"method": "elicitation/create", "params": ELICIT}
    assert "ttlMs" not in result  # an interim result is never cacheable
    return key, result["requestState"]


async def test_the_upstreams_question_becomes_input_required_and_the_retry_completes_the_call(
        start: StartGateway) -> None:
    gw = await start()
    key, state = await first_round(gw)
    answer = {"action": "accept", "content": {"name": "Alice"}}
    status, final = await gw.call(ALICE, {**ASK, "inputResponses": {key: answer}, "requestState": state},
                                  request_id=2)
    assert status == 200
    assert final["result"]["resultType"] == "complete"
    assert json.loads(final["result"]["content"][0]["text"]) == answer
    assert len([c for c in gw.pool.calls if c[0] == "tools/call"]) == 1  # one upstream call for both rounds


async def test_the_same_request_sent_again_while_it_waits_gets_its_question_again(start: StartGateway) -> None:
    """A client whose answer was lost sends the request again (same id, same params): it is asked again, the call
    is not started twice, and the question is answered once whichever state comes back."""
    gw = await start()

    def upstream_calls() -> int:
        return len([c for c in gw.pool.calls if c[0] == "tools/call"])

    key, state = await first_round(gw)
    status, again = await gw.call(ALICE, ASK)
    assert status == 200
    assert list(again["result"]["inputRequests"]) == [key]
    # The state names the same flow: sealed within the same millisecond it is even the same text (so no "differs").
    assert upstream_calls() == 1  # the waiting call was asked again, not started again
    status, _ = await gw.call(ALICE, ASK, request_id=9)  # another id is another call
    assert upstream_calls() == 2
    status, _ = await gw.call(MALLORY, ASK)  # another token's request is its own call
    assert upstream_calls() == 3
    answer = {"action": "accept", "content": {"name": "Alice"}}
    status, final = await gw.call(ALICE, {**ASK, "inputResponses": {key: answer},
                                          "requestState": again["result"]["requestState"]}, request_id=2)
    assert (status, final["result"]["resultType"]) == (200, "complete")
    assert json.loads(final["result"]["content"][0]["text"]) == answer
    status, late = await gw.call(ALICE, {**ASK, "inputResponses": {key: answer}, "requestState": state},
                                 request_id=3)
    assert status == 400  # the first state named the same call, which is over now
    assert "issue the call again" in late["error"]["message"]


async def test_attack_another_token_cannot_continue_alices_flow(start: StartGateway) -> None:
    gw = await start()
    key, state = await first_round(gw)
    status, refused = await gw.call(MALLORY, {**ASK, "inputResponses": {key: {"action": "decline"}},
                                              "requestState": state}, request_id=3)
    assert status == 400
    assert refused["error"]["code"] == jsonrpc.INVALID_PARAMS
    assert "another token" in refused["error"]["message"]
    assert gw.pool.answers == []  # nothing reached the upstream
    status, final = await gw.call(ALICE, {**ASK, "inputResponses": {key: {"action": "decline"}},
                                          "requestState": state}, request_id=4)
    assert (status, final["result"]["resultType"]) == (200, "complete")  # alice's flow is intact


async def test_attack_a_state_cannot_be_replayed_on_another_request(start: StartGateway) -> None:
    gw = await start()
    key, state = await first_round(gw)
    other = {"name": "ask", "arguments": {"q": "password"}}
    status, refused = await gw.call(ALICE, {**other, "inputResponses": {key: {"action": "accept"}},
                                            "requestState": state}, request_id=5)
    assert status == 400
    assert "another request" in refused["error"]["message"]


async def test_a_retry_missing_an_answer_is_asked_again(start: StartGateway) -> None:
    gw = await start()
    key, state = await first_round(gw)
    status, again = await gw.call(ALICE, {**ASK, "inputResponses": {"unrelated": {}}, "requestState": state},
                                  request_id=6)
    assert status == 200
    assert list(again["result"]["inputRequests"]) == [key]


async def test_a_retry_that_reaches_a_process_without_the_waiting_call_is_told_to_issue_it_again(
        start: StartGateway) -> None:
    first = await start()
    key, state = await first_round(first)
    restarted = await start()  # same root key, empty memory: the state verifies, the call is not here
    status, refused = await restarted.call(ALICE, {**ASK, "inputResponses": {key: {"action": "accept"}},
                                                   "requestState": state}, request_id=7)
    assert status == 400
    assert "issue the call again" in refused["error"]["message"]


async def test_a_client_that_did_not_declare_the_capability_lets_the_upstream_decide(start: StartGateway) -> None:
    """Not -32021 in the upstream's place: the upstream hears the refusal and answers as it chooses."""
    gw = await start()
    status, answered = await gw.call(ALICE, ASK, capabilities={})
    assert status == 200
    assert gw.pool.answers[-1]["error"]["data"]["error"] == "not_relayed"
    assert "not_relayed" in answered["result"]["content"][0]["text"]


async def test_input_fields_on_a_method_without_rounds_are_refused(start: StartGateway) -> None:
    gw = await start()
    body = jsonrpc.request_message(8, "tools/list", {"requestState": "x", "_meta": {
        "io.modelcontextprotocol/protocolVersion": VERSION, "io.modelcontextprotocol/clientCapabilities": {}}})
    resp = await gw.http.post("/mcp", data=json.dumps(body), headers={
        "Content-Type": "application/json", "Accept": "application/json", "Authorization": f"Bearer {ALICE}",
        "MCP-Protocol-Version": VERSION, "Mcp-Method": "tools/list"})
    assert resp.status == 400
    assert (await resp.json())["error"]["code"] == jsonrpc.INVALID_PARAMS
