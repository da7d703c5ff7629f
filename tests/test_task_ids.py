"""Sealed task ids (task_ids.py): who may open one, and the one answer for everyone else."""

from __future__ import annotations

import base64

import pytest

from satgate_mcp import jsonrpc
from satgate_mcp.jsonrpc import JsonObj
from satgate_mcp.task_ids import (
    MISSING_CAPABILITY,
    TaskRef,
    created_task_id,
    derive_task_keys,
    listed_tasks,
    missing_tasks_capability,
    notice_with_task_id,
    notified_task_id,
    open_task_id,
    seal_task_id,
    undeclared_modern_client,
    unknown_task,
    with_task_id,
)

KEYS = derive_task_keys(["secret-one"])
ROTATED = derive_task_keys(["secret-two", "secret-one"])
OTHER = derive_task_keys(["someone-else"])
REF = TaskRef("github", "task-123")
SEALED = seal_task_id(KEYS, REF, token_id="tok-a", session_id="mcp-s1")
RELATED = "io.modelcontextprotocol/related-task"


@pytest.mark.parametrize(("keys", "task_id", "token_id", "session_id", "expected"), [
    (KEYS, SEALED, "tok-a", "mcp-s1", REF),  # its holder
    (ROTATED, SEALED, "tok-a", "mcp-s1", REF),  # after a key rotation: old keys still open
    (KEYS, SEALED, "tok-b", "mcp-s1", None),  # another token
    (KEYS, SEALED, "tok-a", "mcp-s2", None),  # the same token, another 2025 session
    (OTHER, SEALED, "tok-a", "mcp-s1", None),  # another gateway's keys
    (KEYS, "task-123", "tok-a", "mcp-s1", None),  # an upstream's raw id
    (KEYS, SEALED + "x", "tok-a", "mcp-s1", None),  # tampered mac
    (KEYS, SEALED.replace("sgt1.", "sgt1.e"), "tok-a", "mcp-s1", None),  # tampered payload
    (KEYS, "sgt1.!!!.???", "tok-a", "mcp-s1", None),  # not base64
    (KEYS, "sgt1." + "a" * 5000, "tok-a", "mcp-s1", None),  # too long
    (KEYS, 42, "tok-a", "mcp-s1", None),  # not a string
    (KEYS, None, "tok-a", "mcp-s1", None),
])
def test_open_task_id(keys: list[bytes], task_id: object, token_id: str, session_id: str,
                      expected: TaskRef | None) -> None:
    assert open_task_id(keys, task_id, token_id=token_id, session_id=session_id) == expected


def test_sealed_id_names_no_token() -> None:
    """The holder is a digest: the id a client sees never carries the token id itself."""
    payload = SEALED.removeprefix("sgt1.").split(".")[0]
    decoded = base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)).decode()
    assert "tok-a" not in decoded
    assert "github" in decoded
    assert "task-123" in decoded


def test_unknown_task_is_one_answer() -> None:
    """Forged, foreign and never-made ids get the same error: nothing tells them apart."""
    answers = {(e.code, e.message, str(e.data)) for e in (unknown_task("x"), unknown_task(SEALED), unknown_task(None))}
    assert answers == {(jsonrpc.INVALID_PARAMS, "Unknown task", "{'error': 'unknown_task'}")}


@pytest.mark.parametrize(("era", "declared", "undeclared"), [
    (None, None, False),  # no relay: nothing to judge by
    ("2025", None, False),  # a 2025 session's request: the upstream judges it
    ("2026", None, True),
    ("2026", {"io.modelcontextprotocol/clientCapabilities": {}}, True),
    ("2026", {"io.modelcontextprotocol/clientCapabilities": {"extensions": {}}}, True),
    ("2026", {"io.modelcontextprotocol/clientCapabilities": {"extensions": {"io.modelcontextprotocol/tasks": {}}}},
     False),
])
def test_undeclared_modern_client(era: str | None, declared: JsonObj | None, undeclared: bool) -> None:
    assert undeclared_modern_client(era, declared) is undeclared


def test_missing_capability_shape() -> None:
    error = missing_tasks_capability()
    assert error.code == MISSING_CAPABILITY == -32021
    assert error.data == {"requiredCapabilities": {"extensions": {"io.modelcontextprotocol/tasks": {}}}}


@pytest.mark.parametrize(("reply", "found"), [
    ({"result": {"resultType": "task", "taskId": "t1", "status": "working"}}, "t1"),  # 2026-07-28
    ({"result": {"task": {"taskId": "t2", "status": "working"}}}, "t2"),  # 2025-11-25
    ({"result": {"content": [], "resultType": "complete"}}, None),
    ({"result": {"resultType": "task"}}, None),
    ({"error": {"code": -32021, "message": "m"}}, None),
])
def test_created_task_id(reply: JsonObj, found: str | None) -> None:
    assert created_task_id(reply) == found


@pytest.mark.parametrize(("reply", "expected"), [
    ({"result": {"resultType": "task", "taskId": "t1"}}, {"result": {"resultType": "task", "taskId": "S"}}),
    ({"result": {"task": {"taskId": "t2", "status": "working"}}},
     {"result": {"task": {"taskId": "S", "status": "working"}}}),
    ({"result": {"resultType": "complete"}}, {"result": {"resultType": "complete"}}),
    ({"error": {"code": 1, "message": "m"}}, {"error": {"code": 1, "message": "m"}}),
    # 2025-11-25's tasks/result: the call's result names its task in _meta; so may an error's data
    ({"result": {"content": [], "_meta": {RELATED: {"taskId": "t3"}, "other": 1}}},
     {"result": {"content": [], "_meta": {RELATED: {"taskId": "S"}, "other": 1}}}),
    ({"error": {"code": -32603, "message": "m", "data": {RELATED: {"taskId": "t4"}}}},
     {"error": {"code": -32603, "message": "m", "data": {RELATED: {"taskId": "S"}}}}),
    ({"error": {"code": -32603, "message": "m", "data": {"_meta": {RELATED: {"taskId": "t5"}}}}},
     {"error": {"code": -32603, "message": "m", "data": {"_meta": {RELATED: {"taskId": "S"}}}}}),
    ({"result": {"content": [], "_meta": {RELATED: "garbled"}}},
     {"result": {"content": [], "_meta": {RELATED: "garbled"}}}),
])
def test_with_task_id(reply: JsonObj, expected: JsonObj) -> None:
    assert with_task_id(reply, "S") == expected


@pytest.mark.parametrize(("params", "found"), [
    ({"taskId": "t1", "status": "completed"}, "t1"),
    ({"taskId": 7}, None),
    ({}, None),
    (None, None),
])
def test_notified_task_id(params: JsonObj | None, found: str | None) -> None:
    assert notified_task_id(params) == found


def test_a_status_notice_names_the_sealed_id_everywhere() -> None:
    params = {"taskId": "t1", "status": "working", "_meta": {RELATED: {"taskId": "t1"}}}
    assert notice_with_task_id(params, "S") == {"taskId": "S", "status": "working", "_meta": {RELATED: {"taskId": "S"}}}


@pytest.mark.parametrize(("result", "kept"), [
    ({"tasks": [{"taskId": "a"}, {"taskId": 3}, "x", {"status": "working"}]}, [{"taskId": "a"}]),
    ({"tasks": "nope"}, []),
    ({}, []),
])
def test_listed_tasks_keeps_those_with_an_id(result: JsonObj, kept: list[JsonObj]) -> None:
    assert listed_tasks(result) == kept
