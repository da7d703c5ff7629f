"""The tasks extension relayed (``io.modelcontextprotocol/tasks``): task ids sealed out, opened on the way back.

A task-augmented ``tools/call`` runs through the policy like any call (charged once, there); its
``CreateTaskResult`` leaves with the upstream's task id replaced by a sealed one (task_ids.py). ``tasks/get``,
``tasks/update``, ``tasks/cancel`` (and 2025-11-25's ``tasks/result``) open that id, go to the upstream it
names with the upstream's own id, and come back with the sealed id again. They pass the policy's rate limit
but are never charged: the call was paid for when the task was created.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Sequence

from satgate_mcp import jsonrpc
from satgate_mcp.auth.base import Identity
from satgate_mcp.contracts import Policy, Pool
from satgate_mcp.jsonrpc import JsonObj
from satgate_mcp.task_ids import (
    TaskRef,
    created_task_id,
    missing_tasks_capability,
    open_task_id,
    seal_task_id,
    undeclared_modern_client,
    unknown_task,
    with_task_id,
)
from satgate_mcp.upstream.base import ProgressCallback, declared_meta
from satgate_mcp.upstream.eras import client_era


class TaskRelay:
    def __init__(self, pool: Pool, policy: Policy, keys: Sequence[bytes]) -> None:
        self._pool = pool
        self._policy = policy
        self._keys = list(keys) or [secrets.token_bytes(32)]  # no configured key: ids this process alone opens

    def sealed(self, reply: JsonObj, upstream: str, *, token_id: str, session_id: str) -> JsonObj:
        """A ``tools/call`` reply as the client sees it: a created task's id sealed; anything else as it was."""
        task_id = created_task_id(reply)
        if task_id is None:
            return reply
        return with_task_id(reply, seal_task_id(self._keys, TaskRef(upstream, task_id), token_id=token_id,
                                                session_id=session_id))

    def opened(self, params: JsonObj | None, *, token_id: str, session_id: str,
               on_progress: ProgressCallback | None = None) -> TaskRef:
        """The task a request names, or the refusal: -32021 for a 2026 client without the extension, else the
        unknown-task error for any id this caller cannot use (never made, forged, another caller's)."""
        if undeclared_modern_client(client_era(on_progress), declared_meta(on_progress)):
            raise missing_tasks_capability()
        task_id = (params or {}).get("taskId")
        ref = open_task_id(self._keys, task_id, token_id=token_id, session_id=session_id)
        if ref is None:
            raise unknown_task(task_id)
        return ref

    async def relay(self, method: str, params: JsonObj | None, *, identity: Identity, session_id: str,
                    request_id: jsonrpc.RequestId, on_progress: ProgressCallback | None,
                    admitted: Callable[[], None]) -> JsonObj:
        """One task method, to the upstream that holds the task, under the rate limit (never charged)."""
        ref = self.opened(params, token_id=identity.token_id, session_id=session_id, on_progress=on_progress)
        client_id = str((params or {}).get("taskId"))
        admission = await self._policy.admit(identity, method=method, tool=None, session_id=session_id,
                                             request_id=request_id, params=params)
        admitted()
        try:
            reply = await self._pool.task_request(ref.upstream, method, {**(params or {}), "taskId": ref.task_id},
                                                  on_progress=on_progress)
        finally:
            await self._policy.settle(admission, ran=True)
        if reply is None:  # the upstream is no longer configured: its tasks are gone with it
            raise unknown_task(client_id)
        return with_task_id(reply, client_id)
