"""The relay's decisions: what a client may be asked, which log messages it gets, who may answer."""

from __future__ import annotations

import asyncio

import pytest

from satgate_mcp import jsonrpc
from satgate_mcp.jsonrpc import JsonObj
from satgate_mcp.transport.relay import (
    ASK_ID_PREFIX,
    CallRelay,
    PendingAsks,
    ask_refusal,
    log_message_passes,
    most_verbose,
    required_capability,
)
from satgate_mcp.upstream.inbox import sole_session

FULL: dict[str, object] = {"sampling": {}, "elicitation": {"form": {}, "url": {}}, "roots": {}}


@pytest.mark.parametrize(
    ("method", "params", "streaming", "capabilities", "refused"),
    [
        pytest.param("sampling/createMessage", None, True, FULL, None, id="declared-sampling-relays"),
        pytest.param("sampling/createMessage", None, False, FULL, "text/event-stream", id="json-only-refused"),
        pytest.param("sampling/createMessage", None, True, {}, "'sampling'", id="undeclared-refused"),
        pytest.param("roots/list", None, True, None, None, id="resumed-unknown-relays"),
        pytest.param("elicitation/create", {"mode": "url"}, True, {"elicitation": {}}, "mode 'url'",
                     id="plain-elicitation-is-form-only"),
        pytest.param("elicitation/create", {}, True, {"elicitation": {}}, None, id="form-by-default"),
        pytest.param("elicitation/create", {"mode": "url"}, True, FULL, None, id="url-declared-relays"),
        pytest.param("elicitation/create", {"mode": "form"}, True, {"elicitation": {"url": {}}}, "mode 'form'",
                     id="url-only-client-refuses-form"),
        pytest.param("custom/ask", None, True, {}, None, id="unknown-method-relays-for-the-client-to-answer"),
    ],
)
def test_what_a_client_may_be_asked(method: str, params: JsonObj | None, streaming: bool,
                                    capabilities: dict[str, object] | None, refused: str | None) -> None:
    why = ask_refusal(method, params, streaming=streaming, capabilities=capabilities)
    if refused is None:
        assert why is None
    else:
        assert why is not None
        assert refused in why


@pytest.mark.parametrize(
    ("level", "wanted", "passes"),
    [
        pytest.param("debug", None, True, id="no-level-set-gets-everything"),
        pytest.param("warning", "warning", True, id="at-the-level"),
        pytest.param("error", "warning", True, id="above-the-level"),
        pytest.param("info", "warning", False, id="below-the-level"),
        pytest.param("bogus", "emergency", False, id="unknown-level-dropped-once-a-level-is-set"),
        pytest.param("bogus", None, True, id="unknown-level-with-none-set"),
    ],
)
def test_each_session_gets_messages_at_or_above_its_level(level: str, wanted: str | None, passes: bool) -> None:
    assert log_message_passes({"level": level, "data": "x"}, wanted) is passes


@pytest.mark.parametrize(
    ("levels", "upstream"),
    [
        pytest.param([], None, id="nobody-asked"),
        pytest.param(["error", "debug", "warning"], "debug", id="the-most-verbose-wins"),
        pytest.param(["notice"], "notice", id="one-session"),
    ],
)
def test_upstreams_get_the_most_verbose_level_asked_for(levels: list[str], upstream: str | None) -> None:
    assert most_verbose(levels) == upstream


@pytest.mark.parametrize(
    ("sessions", "owner"),
    [
        pytest.param(["a", "a"], "a", id="every-call-one-session"),
        pytest.param(["a", "b"], None, id="two-sessions-refused"),
        pytest.param([], None, id="no-call-in-flight"),
        pytest.param(["a", ""], None, id="a-call-without-a-session"),
    ],
)
def test_a_shared_pipe_attributes_only_when_every_call_is_one_sessions(sessions: list[str], owner: str | None) -> None:
    assert sole_session(sessions) == owner


async def test_attack_another_session_cannot_answer_a_question_put_to_someone_else() -> None:
    asks = PendingAsks()
    ask_id, answer = asks.open("session-a")
    assert ask_id.startswith(ASK_ID_PREFIX)
    assert len(ask_id) > len(ASK_ID_PREFIX) + 20  # unguessable

    forged = jsonrpc.Response(ask_id, {"action": "accept", "content": {"pin": "0000"}}, None)
    assert not asks.answer("session-b", forged)
    assert not answer.done()
    assert asks.answer("session-a", jsonrpc.Response(ask_id, {"action": "decline"}, None))
    assert (await answer)["result"] == {"action": "decline"}


async def test_a_question_nobody_answers_in_time_is_refused_upstream() -> None:
    sent: list[JsonObj] = []

    async def emit(message: JsonObj) -> bool:
        sent.append(message)
        return True

    asks = PendingAsks()
    relay = CallRelay(session_key="s", emit=emit, asks=asks, streaming=True, capabilities=lambda: None,
                      log_level=lambda: None)
    reply = await relay.ask("roots/list", None, 0.0)
    assert reply["error"]["data"] == {"error": "not_relayed"}
    assert "did not answer" in reply["error"]["message"]
    assert [m["method"] for m in sent] == ["roots/list"]
    assert len(asks) == 0


async def test_a_question_to_a_client_that_left_is_refused_at_once() -> None:
    async def gone(message: JsonObj) -> bool:
        return False

    relay = CallRelay(session_key="s", emit=gone, asks=PendingAsks(), streaming=True, capabilities=lambda: None,
                      log_level=lambda: None)
    reply = await asyncio.wait_for(relay.ask("sampling/createMessage", None, 60.0), 5.0)
    assert "has left" in reply["error"]["message"]


async def test_an_upstream_that_withdraws_its_question_gets_no_answer_and_the_client_is_told() -> None:
    from satgate_mcp.upstream.inbox import Inbox

    to_upstream: list[JsonObj] = []
    to_client: list[JsonObj] = []
    asked = asyncio.Event()

    async def reply(message: JsonObj) -> None:
        to_upstream.append(message)

    async def emit(message: JsonObj) -> bool:
        to_client.append(message)
        asked.set()
        return True

    asks = PendingAsks()
    relay = CallRelay(session_key="s1", emit=emit, asks=asks, streaming=True, capabilities=lambda: None,
                      log_level=lambda: None)
    inbox = Inbox("up", reply)
    _, route = inbox.open_route({}, relay)
    inbox.handle(jsonrpc.Request(41, "elicitation/create", {"message": "name?"}), route)
    await asyncio.wait_for(asked.wait(), 5)
    [question] = to_client
    inbox.handle(jsonrpc.Notification("notifications/cancelled", {"requestId": 41}), route)
    await inbox.aclose()

    assert to_client[1:] == [jsonrpc.notification_message(
        "notifications/cancelled", {"requestId": question["id"], "reason": "the upstream cancelled its request"})]
    assert to_upstream == []  # a cancelled request is never answered
    assert len(asks) == 0


@pytest.mark.parametrize(("method", "params", "declared", "required"), [
    pytest.param("elicitation/create", None, {"elicitation": {}}, None, id="form-declared"),
    pytest.param("elicitation/create", None, {}, {"elicitation": {}}, id="elicitation-undeclared"),
    pytest.param("elicitation/create", {"mode": "url"}, {"elicitation": {}}, {"elicitation": {"url": {}}},
                 id="url-mode-not-declared"),
    pytest.param("elicitation/create", {"mode": "url"}, {}, {"elicitation": {"url": {}}}, id="url-no-elicitation"),
    pytest.param("elicitation/create", {"mode": "url"}, {"elicitation": {"url": {}}}, None, id="url-declared"),
    pytest.param("sampling/createMessage", None, {"elicitation": {}}, {"sampling": {}}, id="sampling-undeclared"),
    pytest.param("roots/list", None, {"roots": {"listChanged": True}}, None, id="roots-declared"),
    pytest.param("roots/list", None, None, None, id="unknown-capabilities-relay"),
    pytest.param("ping", None, {}, None, id="needs-nothing"),
])
def test_the_capability_a_request_needs_is_named_in_client_capabilities_shape(
        method: str, params: JsonObj | None, declared: dict[str, object] | None, required: JsonObj | None) -> None:
    assert required_capability(method, params, declared) == required
