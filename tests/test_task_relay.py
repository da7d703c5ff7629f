"""The tasks methods through the dispatcher, without HTTP: a created task's id leaves sealed, comes back opened,
and nobody else's request for it ever reaches an upstream."""

from __future__ import annotations

from satgate_mcp import jsonrpc
from satgate_mcp.auth.base import Identity
from satgate_mcp.contracts import UnmeteredPolicy
from satgate_mcp.dispatch import Dispatcher
from satgate_mcp.errors import UpstreamUnavailable
from satgate_mcp.events import RecordingPublisher
from satgate_mcp.jsonrpc import JsonObj
from satgate_mcp.metrics import Metrics
from satgate_mcp.task_ids import TaskRef, derive_task_keys, seal_task_id
from satgate_mcp.task_relay import RESULT_WAIT_SECONDS, TaskOwners, TaskRelay
from satgate_mcp.upstream.base import ProgressCallback
from tests.fakes import FakePool

KEYS = derive_task_keys(["task-relay-test-key"])
ALICE, MALLORY = Identity(token_id="alice"), Identity(token_id="mallory")
SESSION = "mcp-session"


class TaskPool(FakePool):
    """An upstream ``fake`` that creates task ``up-1`` on every call and answers task methods about it."""

    def __init__(self) -> None:
        super().__init__()
        self.task_calls: list[tuple[str, str, JsonObj]] = []
        #: method -> the timeout the relay asked for it (None: the upstream's own).
        self.timeouts: dict[str, float | None] = {}

    async def call(self, method: str, params: JsonObj | None, *, on_progress: ProgressCallback | None = None
                   ) -> JsonObj:
        self.calls.append((method, params))
        return jsonrpc.result_response(None, {"resultType": "task", "taskId": "up-1", "status": "working"})

    async def task_request(self, upstream: str, method: str, params: JsonObj, *,
                           on_progress: ProgressCallback | None = None, timeout: float | None = None
                           ) -> JsonObj | None:
        self.task_calls.append((upstream, method, params))
        self.timeouts[method] = timeout
        if upstream != "fake":
            return None
        return jsonrpc.result_response(None, {"resultType": "complete", "taskId": params["taskId"],
                                              "status": "completed"})


def dispatcher(pool: TaskPool) -> Dispatcher:
    return Dispatcher(pool, publisher=RecordingPublisher(), metrics=Metrics(), policy=UnmeteredPolicy(),
                      task_keys=KEYS)


async def ask(d: Dispatcher, method: str, params: JsonObj, identity: Identity = ALICE,
              session_id: str = SESSION) -> JsonObj:
    return await d.handle(jsonrpc.Request(1, method, params), identity=identity, session_id=session_id)


async def test_created_task_id_is_sealed_and_opened_for_its_holder_only() -> None:
    pool = TaskPool()
    d = dispatcher(pool)
    created = await ask(d, "tools/call", {"name": "echo", "arguments": {}})
    sealed = created["result"]["taskId"]
    assert sealed.startswith("sgt1.")
    assert sealed != "up-1"

    got = await ask(d, "tasks/get", {"taskId": sealed})
    assert got["result"]["taskId"] == sealed  # the client sees its own id again
    assert pool.task_calls == [("fake", "tasks/get", {"taskId": "up-1"})]  # the upstream sees its own

    never = await ask(d, "tasks/get", {"taskId": "up-1"})  # the upstream's raw id: not one this gateway gave
    for identity, session in ((MALLORY, SESSION), (ALICE, "mcp-other-session")):
        for method in ("tasks/get", "tasks/cancel", "tasks/result", "tasks/update"):
            refused = await ask(d, method, {"taskId": sealed}, identity, session)
            assert refused["error"] == never["error"] == {
                "code": jsonrpc.INVALID_PARAMS, "message": "Unknown task", "data": {"error": "unknown_task"}}
    assert len(pool.task_calls) == 1  # no refused request reached the upstream


async def test_a_task_on_an_upstream_no_longer_configured_is_unknown() -> None:
    pool = TaskPool()
    other = Dispatcher(pool, publisher=RecordingPublisher(), metrics=Metrics(), policy=UnmeteredPolicy(),
                       task_keys=KEYS)
    gone = seal_task_id(KEYS, TaskRef("removed", "t"), token_id="alice", session_id=SESSION)
    refused = await ask(other, "tasks/get", {"taskId": gone})
    assert refused["error"]["message"] == "Unknown task"


class ListingPool(TaskPool):
    """Upstreams that list their tasks (2025-11-25): ``fake`` in two pages, ``other`` in one, ``down`` is down."""

    def __init__(self) -> None:
        super().__init__()
        self.tasks_listed_by = ["fake", "down", "other"]
        self.created = 0

    async def call(self, method: str, params: JsonObj | None, *, on_progress: ProgressCallback | None = None
                   ) -> JsonObj:
        self.created += 1
        return jsonrpc.result_response(None, {"task": {"taskId": f"up-{self.created}", "status": "working"}})

    async def task_request(self, upstream: str, method: str, params: JsonObj, *,
                           on_progress: ProgressCallback | None = None, timeout: float | None = None
                           ) -> JsonObj | None:
        self.task_calls.append((upstream, method, params))
        if upstream == "down":
            raise UpstreamUnavailable("down", {"upstream": "down"})
        if upstream == "other":
            return jsonrpc.result_response(None, {"tasks": [{"taskId": "up-1", "status": "working"}]})
        if params.get("cursor") is None:
            return jsonrpc.result_response(None, {"tasks": [{"taskId": "up-1"}, {"taskId": "up-2"}],
                                                  "nextCursor": "page-2"})
        return jsonrpc.result_response(None, {"tasks": [{"taskId": "up-3"}, {"taskId": "never-relayed"}]})


def task_ids(reply: JsonObj) -> list[str]:
    return [t["taskId"] for t in reply["result"]["tasks"]]


async def test_tasks_list_shows_each_creator_its_own_tasks_only() -> None:
    """The upstream lists every task of the gateway's session; a caller sees those it created, sealed, and no
    task the gateway never relayed (``never-relayed``), nor one of the same id on another upstream (``other``)."""
    pool = ListingPool()
    d = dispatcher(pool)
    mine = [(await ask(d, "tools/call", {"name": "echo"}))["result"]["task"]["taskId"] for _ in range(2)]
    theirs = (await ask(d, "tools/call", {"name": "echo"}, MALLORY))["result"]["task"]["taskId"]
    assert task_ids(await ask(d, "tasks/list", {})) == mine  # up-1, up-2 (up-1 of "other" is not Alice's)
    assert task_ids(await ask(d, "tasks/list", {}, MALLORY)) == [theirs]
    assert task_ids(await ask(d, "tasks/list", {}, ALICE, "mcp-other-session")) == []
    assert ("fake", "tasks/list", {"cursor": "page-2"}) in pool.task_calls  # the upstream's pages are followed


async def test_tasks_list_is_refused_where_nothing_lists_tasks() -> None:
    d = dispatcher(TaskPool())  # no upstream offers tasks.list
    assert (await ask(d, "tasks/list", {}))["error"]["code"] == jsonrpc.METHOD_NOT_FOUND
    listing = dispatcher(ListingPool())
    assert (await ask(listing, "tasks/list", {"cursor": "forged"}))["error"]["code"] == jsonrpc.INVALID_PARAMS


async def test_a_status_notice_is_for_the_creator_alone() -> None:
    relay = TaskRelay(TaskPool(), UnmeteredPolicy(), KEYS)
    reply = await relay.sealed(jsonrpc.result_response(None, {"task": {"taskId": "up-9"}}), "fake", token_id="alice",
                         session_id=SESSION)
    sealed = reply["result"]["task"]["taskId"]
    found = relay.notice("fake", "notifications/tasks/status", {"taskId": "up-9", "status": "completed"})
    assert found == (SESSION, jsonrpc.notification_message("notifications/tasks/status",
                                                           {"taskId": sealed, "status": "completed"}))
    assert relay.notice("other", "notifications/tasks/status", {"taskId": "up-9"}) is None  # same id elsewhere
    assert relay.notice("fake", "notifications/tasks/status", {"taskId": "up-unknown"}) is None
    assert relay.notice("fake", "notifications/tasks/status", {"status": "completed"}) is None


def test_task_owners_forget_the_oldest_past_their_cap() -> None:
    owners = TaskOwners(cap=2)
    for n in range(3):
        owners.note(TaskRef("fake", f"t{n}"), ("alice", SESSION))
    assert owners.owner(TaskRef("fake", "t0")) is None
    assert owners.owner(TaskRef("fake", "t2")) == ("alice", SESSION)
    assert len(owners) == 2


def test_2025_tasks_capability_is_said_at_the_handshake_only() -> None:
    """2026-07-28 has the extension instead: ``server/discover`` leaves 2025-11-25's ``tasks`` out."""

    class Offering(TaskPool):
        def capabilities(self) -> JsonObj:
            return {"tools": {}, "tasks": {"list": {}}, "extensions": {"io.modelcontextprotocol/tasks": {}}}

    d = dispatcher(Offering())
    assert d.initialize_result("2025-11-25")["capabilities"]["tasks"] == {"list": {}}
    discovered = d.discover_result(["2026-07-28"])["capabilities"]
    assert "tasks" not in discovered
    assert discovered["extensions"] == {"io.modelcontextprotocol/tasks": {}}


async def test_a_2025_task_result_waits_longer_than_a_call() -> None:
    """``tasks/result`` waits for the task to end: the upstream's call timeout does not cut it; the others keep it."""
    pool = TaskPool()
    d = dispatcher(pool)
    sealed = (await ask(d, "tools/call", {"name": "echo"}))["result"]["taskId"]
    for method in ("tasks/result", "tasks/get", "tasks/cancel"):
        await ask(d, method, {"taskId": sealed})
    assert pool.timeouts == {"tasks/result": RESULT_WAIT_SECONDS, "tasks/get": None, "tasks/cancel": None}
