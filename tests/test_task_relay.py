"""The tasks methods through the dispatcher, without HTTP: a created task's id leaves sealed, comes back opened,
and nobody else's request for it ever reaches an upstream."""

from __future__ import annotations

from satgate_mcp import jsonrpc
from satgate_mcp.auth.base import Identity
from satgate_mcp.contracts import UnmeteredPolicy
from satgate_mcp.dispatch import Dispatcher
from satgate_mcp.events import RecordingPublisher
from satgate_mcp.jsonrpc import JsonObj
from satgate_mcp.metrics import Metrics
from satgate_mcp.task_ids import TaskRef, derive_task_keys, seal_task_id
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

    async def call(self, method: str, params: JsonObj | None, *, on_progress: ProgressCallback | None = None
                   ) -> JsonObj:
        self.calls.append((method, params))
        return jsonrpc.result_response(None, {"resultType": "task", "taskId": "up-1", "status": "working"})

    async def task_request(self, upstream: str, method: str, params: JsonObj, *,
                           on_progress: ProgressCallback | None = None) -> JsonObj | None:
        self.task_calls.append((upstream, method, params))
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
