"""The ``resources`` and ``prompts`` caveats, and the rate limit on everything forwarded (issue 9, hole 10).

A token may name (read, subscribe, get, complete) and see (in listings) only the resources and prompts its
caveats allow; no caveat allows everything, as before. Every request the gateway forwards upstream
counts against the token's rate limit; what it answers itself (``tools/list``, ``ping``) does not.
"""

from __future__ import annotations

import pytest

from satgate_mcp import events, jsonrpc
from satgate_mcp.auth.base import Identity
from satgate_mcp.contracts import Policy, UnmeteredPolicy
from satgate_mcp.dispatch import Dispatcher
from satgate_mcp.events import RecordingPublisher
from satgate_mcp.jsonrpc import JsonObj
from satgate_mcp.metrics import Metrics
from satgate_mcp.policy.engine import CallPolicy
from satgate_mcp.settings import Settings
from satgate_mcp.upstream.base import ProgressCallback
from satgate_mcp.visibility import named_target, visible_listing
from tests.fakes import AllowAllPolicy, FakeClock, FakePool

SESSION = "mcp-session"
#: Allowed: docs and one exact file; the prompts whose names start with ``public_``.
SCOPED = Identity("scoped", resource_filters=(("file:///docs/*", "memo://a/readme"),),
                  prompt_filters=(("public_*",),))
UNSCOPED = Identity("unscoped")

LISTINGS: dict[str, JsonObj] = {
    "resources/list": {"resources": [{"uri": "file:///docs/a.md"}, {"uri": "file:///etc/passwd"},
                                     {"uri": "memo://a/readme"}, {"name": "no-uri"}]},
    "resources/templates/list": {"resourceTemplates": [{"uriTemplate": "file:///docs/{name}"},
                                                       {"uriTemplate": "file:///{path}"}]},
    "prompts/list": {"prompts": [{"name": "public_greet"}, {"name": "admin_reset"}], "nextCursor": "c2"},
}


class ResourcePool(FakePool):
    """Answers every forwarded method; listings from LISTINGS, anything else ``{"ok": true}``."""

    async def call(self, method: str, params: JsonObj | None, *, on_progress: ProgressCallback | None = None
                   ) -> JsonObj:
        if method == "tools/call":
            return await super().call(method, params, on_progress=on_progress)
        self.calls.append((method, params))
        return jsonrpc.result_response(None, LISTINGS.get(method, {"ok": True}))


def make(policy: Policy | None = None) -> tuple[Dispatcher, ResourcePool, Metrics]:
    pool, metrics = ResourcePool(), Metrics()
    policy = UnmeteredPolicy() if policy is None else policy
    return Dispatcher(pool, publisher=RecordingPublisher(), metrics=metrics, policy=policy), pool, metrics


async def handle(dispatcher: Dispatcher, method: str, params: JsonObj | None = None, *,
                 identity: Identity = SCOPED, request_id: int = 1) -> JsonObj:
    return await dispatcher.handle(jsonrpc.Request(request_id, method, params), identity=identity,
                                   session_id=SESSION)


def refusals(metrics: Metrics, reason: str) -> float:
    return metrics.registry.get_sample_value("satgate_refusals_total", {"reason": reason}) or 0.0


# --- what a request names ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "params", "target"),
    [
        pytest.param("resources/read", {"uri": "file:///x"}, ("resource", "file:///x"), id="read"),
        pytest.param("resources/subscribe", {"uri": "file:///x"}, ("resource", "file:///x"), id="subscribe"),
        pytest.param("resources/unsubscribe", {"uri": "file:///x"}, ("resource", "file:///x"), id="unsubscribe"),
        pytest.param("prompts/get", {"name": "p"}, ("prompt", "p"), id="prompt"),
        pytest.param("completion/complete", {"ref": {"type": "ref/prompt", "name": "p"}}, ("prompt", "p"),
                     id="complete-prompt"),
        pytest.param("completion/complete", {"ref": {"type": "ref/resource", "uri": "file:///{p}"}},
                     ("resource", "file:///{p}"), id="complete-template"),
        pytest.param("completion/complete", {"ref": {"type": "ref/other", "uri": "u"}}, ("resource", "u"),
                     id="complete-other-is-routed-as-a-resource"),
        pytest.param("completion/complete", {"ref": "nonsense"}, ("resource", ""), id="complete-bad-ref"),
        pytest.param("resources/read", {"uri": 5}, ("resource", ""), id="non-string-uri"),
        pytest.param("resources/read", None, ("resource", ""), id="no-params"),
        pytest.param("resources/list", {}, None, id="list"),
    ],
)
def test_named_target(method: str, params: JsonObj | None, target: tuple[str, str] | None) -> None:
    assert named_target(method, params) == target


@pytest.mark.parametrize(
    ("uri", "allowed"),
    [
        pytest.param("file:///docs/a.md", True, id="prefix"),
        pytest.param("file:///docs/", True, id="the-prefix-itself"),
        pytest.param("memo://a/readme", True, id="exact"),
        pytest.param("memo://a/readme2", False, id="exact-is-not-a-prefix"),
        pytest.param("file:///etc/passwd", False, id="outside"),
        pytest.param("file:///doc", False, id="shorter-than-the-prefix"),
        pytest.param("", False, id="empty"),
    ],
)
def test_resource_filter(uri: str, allowed: bool) -> None:
    assert SCOPED.allows_resource(uri) is allowed
    assert UNSCOPED.allows_resource(uri)


def test_several_caveats_intersect() -> None:
    narrowed = Identity("n", resource_filters=(("file:///*",), ("file:///docs/*", "memo://*")),
                        prompt_filters=(("a*",), ("ab",)))
    assert narrowed.allows_resource("file:///docs/x")
    assert not narrowed.allows_resource("memo://x"), "the first caveat refuses it"
    assert narrowed.allows_prompt("ab")
    assert not narrowed.allows_prompt("ac")


# --- refusals ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "params", "error"),
    [
        pytest.param("resources/read", {"uri": "file:///etc/passwd"}, "resource_not_allowed", id="read"),
        pytest.param("resources/subscribe", {"uri": "file:///etc/passwd"}, "resource_not_allowed",
                     id="subscribe"),
        pytest.param("resources/unsubscribe", {"uri": "file:///etc/passwd"}, "resource_not_allowed",
                     id="unsubscribe"),
        pytest.param("prompts/get", {"name": "admin_reset"}, "prompt_not_allowed", id="prompt"),
        pytest.param("completion/complete", {"ref": {"type": "ref/prompt", "name": "admin_reset"},
                                             "argument": {"name": "a", "value": ""}}, "prompt_not_allowed",
                     id="complete-prompt"),
        pytest.param("completion/complete", {"ref": {"type": "ref/resource", "uri": "file:///{path}"},
                                             "argument": {"name": "path", "value": "et"}}, "resource_not_allowed",
                     id="complete-template"),
        pytest.param("resources/read", {"uri": 7}, "resource_not_allowed", id="non-string-uri"),
    ],
)
async def test_attack_token_without_resource_scope_reads_a_resource(method: str, params: JsonObj, error: str
                                                                    ) -> None:
    policy = AllowAllPolicy()
    pool, metrics, publisher = ResourcePool(), Metrics(), RecordingPublisher()
    dispatcher = Dispatcher(pool, publisher=publisher, metrics=metrics, policy=policy)
    reply = await handle(dispatcher, method, params, request_id=9)
    (event,) = publisher.named(events.NOT_ALLOWED)
    assert (event["token_id"], event["method"], f'{event["kind"]}_not_allowed') == (SCOPED.token_id, method, error)
    assert reply["id"] == 9
    assert reply["error"]["code"] == jsonrpc.TOOL_NOT_ALLOWED
    assert reply["error"]["data"]["error"] == error
    assert pool.calls == [], "nothing was forwarded"
    assert policy.settled == [], "a refusal is decided before admission"
    assert refusals(metrics, error) == 1


@pytest.mark.parametrize(
    ("method", "params"),
    [
        pytest.param("resources/read", {"uri": "file:///docs/a.md"}, id="read"),
        pytest.param("resources/subscribe", {"uri": "memo://a/readme"}, id="subscribe"),
        pytest.param("prompts/get", {"name": "public_greet"}, id="prompt"),
        pytest.param("completion/complete", {"ref": {"type": "ref/prompt", "name": "public_x"}}, id="complete"),
        pytest.param("completion/complete", {"ref": {"type": "ref/resource", "uri": "file:///docs/{n}"}},
                     id="complete-template"),
    ],
)
async def test_what_the_caveats_allow_is_forwarded(method: str, params: JsonObj) -> None:
    dispatcher, pool, _ = make(AllowAllPolicy())
    reply = await handle(dispatcher, method, params)
    assert reply["result"] == {"ok": True}
    assert pool.calls == [(method, params)]


@pytest.mark.parametrize("method", ["resources/read", "prompts/get", "completion/complete"])
async def test_a_token_without_resources_or_prompts_caveats_may_name_anything(method: str) -> None:
    dispatcher, pool, _ = make()
    params: JsonObj = {"uri": "file:///etc/passwd", "name": "admin_reset",
                       "ref": {"type": "ref/prompt", "name": "admin_reset"}}
    assert "result" in await handle(dispatcher, method, params, identity=UNSCOPED)
    assert len(pool.calls) == 1


# --- listings ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "visible"),
    [
        pytest.param("resources/list", {"resources": [{"uri": "file:///docs/a.md"}, {"uri": "memo://a/readme"}]},
                     id="resources"),
        pytest.param("resources/templates/list", {"resourceTemplates": [{"uriTemplate": "file:///docs/{name}"}]},
                     id="templates"),
        pytest.param("prompts/list", {"prompts": [{"name": "public_greet"}], "nextCursor": "c2"}, id="prompts"),
    ],
)
async def test_attack_token_without_resource_scope_lists_hidden_resources(method: str, visible: JsonObj) -> None:
    dispatcher, _, _ = make()
    assert (await handle(dispatcher, method))["result"] == visible
    assert (await handle(dispatcher, method, identity=UNSCOPED))["result"] == LISTINGS[method]


def test_visible_listing_leaves_odd_replies_alone() -> None:
    for reply in ({"jsonrpc": "2.0", "id": 1, "error": {"code": -1, "message": "x"}},
                  {"jsonrpc": "2.0", "id": 1, "result": {"resources": "not a list"}}):
        assert visible_listing(SCOPED, "resources/list", reply) == reply


# --- the rate limit covers what is forwarded ---------------------------------------------------------------


def rate_limited_policy(clock: FakeClock) -> CallPolicy:
    return CallPolicy.from_settings(Settings(rate_limit="3/m", rate_burst=3), publisher=RecordingPublisher(),
                                    metrics=Metrics(), clock=clock)


@pytest.mark.parametrize(
    ("method", "params", "upstream_calls"),
    [
        pytest.param("resources/read", {"uri": "file:///docs/a.md"}, 3, id="read"),
        pytest.param("resources/list", None, 3, id="resources-list"),
        pytest.param("resources/templates/list", None, 3, id="templates-list"),
        # the session holds the subscription after the first: repeats are answered here, but still counted
        pytest.param("resources/subscribe", {"uri": "file:///docs/a.md"}, 1, id="subscribe"),
        pytest.param("prompts/list", None, 3, id="prompts-list"),
        pytest.param("prompts/get", {"name": "public_greet"}, 3, id="prompt"),
        pytest.param("completion/complete", {"ref": {"type": "ref/prompt", "name": "public_greet"}}, 3,
                     id="complete"),
    ],
)
async def test_attack_resources_read_floods_bypass_rate_limit(method: str, params: JsonObj | None,
                                                              upstream_calls: int) -> None:
    dispatcher, pool, _ = make(rate_limited_policy(FakeClock()))
    for request_id in range(3):
        assert "result" in await handle(dispatcher, method, params, request_id=request_id)
    flood = await handle(dispatcher, method, params, request_id=99)
    assert flood["error"]["code"] == jsonrpc.RATE_LIMITED
    assert flood["error"]["data"]["error"] == "rate_limited"
    assert len(pool.calls) == upstream_calls, "the refused request never reached the upstream"
    refused_tool = await handle(dispatcher, "tools/call", {"name": "echo"}, request_id=100)
    assert refused_tool["error"]["code"] == jsonrpc.RATE_LIMITED, "tools and resources share the token's bucket"


async def test_what_the_gateway_answers_itself_does_not_count() -> None:
    dispatcher, pool, _ = make(rate_limited_policy(FakeClock()))
    for request_id in range(10):
        assert "result" in await handle(dispatcher, "tools/list", request_id=request_id)
        assert "result" in await handle(dispatcher, "ping", request_id=request_id)
    for request_id in range(3):
        assert "result" in await handle(dispatcher, "resources/read", {"uri": "file:///docs/a"},
                                        request_id=request_id)
    assert pool.calls == [("resources/read", {"uri": "file:///docs/a"})] * 3
