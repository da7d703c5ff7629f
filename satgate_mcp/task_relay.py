"""Tasks relayed (the extension ``io.modelcontextprotocol/tasks``, and 2025-11-25's tasks): task ids sealed out,
opened on the way back.

A task-augmented ``tools/call`` runs through the policy like any call (charged once, there); its
``CreateTaskResult`` leaves with the upstream's task id replaced by a sealed one (task_ids.py). ``tasks/get``,
``tasks/update``, ``tasks/cancel`` (and 2025-11-25's ``tasks/result``) open that id, go to the upstream it
names with the upstream's own id, and come back with the sealed id again. They pass the policy's rate limit
but are never charged: the call was paid for when the task was created.

What the upstream says of a task on its own (its status notifications) and 2025-11-25's ``tasks/list`` name
tasks by the upstream's id alone: so the creator of each task relayed is kept, by this process (``TaskOwners``)
and where the gateway keeps its state (task_owners.py: the state database, Redis), and a notification reaches
its creator only, a listing shows each caller its own tasks only. A task whose creator nobody kept is shown to
nobody.
"""

from __future__ import annotations

import secrets
from collections import OrderedDict
from collections.abc import Callable, Sequence

import structlog

from satgate_mcp import jsonrpc
from satgate_mcp.auth.base import Identity
from satgate_mcp.contracts import Policy, Pool, method_not_found
from satgate_mcp.errors import UpstreamUnavailable
from satgate_mcp.jsonrpc import JsonObj
from satgate_mcp.paging import LIST_PAGE_SIZE, decode_cursor, page
from satgate_mcp.stores.errors import STORE_ERRORS
from satgate_mcp.task_ids import (
    TaskRef,
    created_task_id,
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
from satgate_mcp.task_owners import Owner, TaskOwnerStore, owner_ttl
from satgate_mcp.upstream.base import ProgressCallback, declared_meta
from satgate_mcp.upstream.eras import client_era

log = structlog.get_logger("satgate_mcp.tasks")

#: Tasks whose creator one process remembers; the oldest are forgotten first (shown to nobody after that).
MAX_OWNED_TASKS = 10_000
#: Pages of one upstream's 2025-11-25 ``tasks/list`` read for one client's ``tasks/list``.
MAX_LIST_PAGES = 20
#: How long 2025-11-25's ``tasks/result`` (which waits for the task to end) may wait: a task is long work, so the
#: upstream's call timeout, which bounds every other request, does not bound this one.
RESULT_WAIT_SECONDS = 3600.0


class TaskOwners:
    """Who created each task this process relayed, newest kept (bounded): what a status notification is routed by,
    at once and in order, without asking a store."""

    def __init__(self, cap: int = MAX_OWNED_TASKS) -> None:
        self._cap = cap
        self._owners: OrderedDict[TaskRef, Owner] = OrderedDict()

    def __len__(self) -> int:
        return len(self._owners)

    def note(self, ref: TaskRef, owner: Owner) -> None:
        self._owners[ref] = owner
        self._owners.move_to_end(ref)
        while len(self._owners) > self._cap:
            self._owners.popitem(last=False)

    def owner(self, ref: TaskRef) -> Owner | None:
        return self._owners.get(ref)


class TaskRelay:
    def __init__(self, pool: Pool, policy: Policy, keys: Sequence[bytes], store: TaskOwnerStore | None = None
                 ) -> None:
        """``store``: where owners outlive this process (the state database, Redis); None: this process's own."""
        self._pool = pool
        self._policy = policy
        self._keys = list(keys) or [secrets.token_bytes(32)]  # no configured key: ids this process alone opens
        self.owners = TaskOwners()
        self._store = store
        #: Listen stream key -> the tasks it follows (2026-07-28: the filter's ``taskIds``).
        self._watching: dict[str, frozenset[TaskRef]] = {}
        #: Upstream -> the task ids it was last told clients follow there.
        self._told: dict[str, frozenset[str]] = {}

    def _seal(self, ref: TaskRef, owner: Owner) -> str:
        return seal_task_id(self._keys, ref, token_id=owner[0], session_id=owner[1])

    async def sealed(self, reply: JsonObj, upstream: str, *, token_id: str, session_id: str) -> JsonObj:
        """A ``tools/call`` reply as the client sees it: a created task's id sealed (and its creator remembered);
        anything else as it was."""
        task_id = created_task_id(reply)
        if task_id is None:
            return reply
        ref, owner = TaskRef(upstream, task_id), (token_id, session_id)
        self.owners.note(ref, owner)
        if self._store is not None:
            try:
                await self._store.note(ref, owner, owner_ttl(reply))
            except STORE_ERRORS as exc:  # the task exists: its creator has it; only other processes cannot list it
                log.warning("task_owner_not_stored", upstream=upstream, error=type(exc).__name__)
        return with_task_id(reply, self._seal(ref, owner))

    def notice(self, upstream: str, method: str, params: JsonObj | None) -> tuple[str, JsonObj] | None:
        """(the creator's session id, the notification as the creator sees it) for a task status notification of
        a task this process relayed; None for any other task (nobody is told)."""
        task_id = notified_task_id(params)
        ref = None if task_id is None else TaskRef(upstream, task_id)
        owner = None if ref is None else self.owners.owner(ref)
        if ref is None or owner is None or params is None:
            return None
        return owner[1], jsonrpc.notification_message(method, notice_with_task_id(params, self._seal(ref, owner)))

    def listened(self, task_ids: Sequence[str], *, token_id: str, session_id: str) -> dict[TaskRef, str]:
        """The tasks a listen request names that are this caller's (ref -> the id the caller knows it by); any
        other id is left out of what the stream honours, as an unknown one is."""
        opened = {task_id: open_task_id(self._keys, task_id, token_id=token_id, session_id=session_id)
                  for task_id in task_ids}
        return {ref: task_id for task_id, ref in opened.items() if ref is not None}

    async def watch(self, key: str, refs: frozenset[TaskRef]) -> None:
        """Listen stream ``key`` follows ``refs`` (empty: no longer follows any); each upstream whose followed ids
        changed is told its new set."""
        before = self._watching.pop(key, frozenset())
        if refs:
            self._watching[key] = refs
        for upstream in sorted({ref.upstream for ref in before ^ refs}):
            ids = frozenset(r.task_id for held in self._watching.values() for r in held if r.upstream == upstream)
            if ids != self._told.get(upstream, frozenset()):
                self._told[upstream] = ids
                await self._pool.watch_tasks(upstream, ids)

    async def list_tasks(self, params: JsonObj | None, *, identity: Identity, session_id: str,
                         request_id: jsonrpc.RequestId, on_progress: ProgressCallback | None,
                         admitted: Callable[[], None]) -> JsonObj:
        """2025-11-25's ``tasks/list``: the caller's own tasks on every upstream that lists tasks, in our pages.

        Gone at 2026-07-28 (-32601, as for an upstream that lists none)."""
        listers = [] if client_era(on_progress) == "2026" else self._pool.task_listers()
        if not listers:
            raise method_not_found("tasks/list")
        cursor = (params or {}).get("cursor")
        decode_cursor(cursor)  # a cursor we never gave fails before any upstream work
        admission = await self._policy.admit(identity, method="tasks/list", tool=None, session_id=session_id,
                                             request_id=request_id, params=params)
        admitted()
        owner = (identity.token_id, session_id)
        try:
            mine = [task for name in listers for task in await self._owned(name, owner, on_progress)]
        finally:
            await self._policy.settle(admission, ran=True)
        items, next_cursor = page(mine, cursor, LIST_PAGE_SIZE)
        return jsonrpc.result_response(None, {"tasks": items, **({"nextCursor": next_cursor} if next_cursor else {})})

    async def _owned(self, upstream: str, owner: Owner, on_progress: ProgressCallback | None) -> list[JsonObj]:
        """One upstream's tasks that ``owner`` created, with sealed ids; an upstream that is down lists none."""
        found: list[JsonObj] = []
        cursor: object = None
        for _ in range(MAX_LIST_PAGES):
            try:
                reply = await self._pool.task_request(upstream, "tasks/list", {"cursor": cursor} if cursor else {},
                                                      on_progress=on_progress)
            except UpstreamUnavailable:
                break
            result = (reply or {}).get("result")
            if not isinstance(result, dict):
                break
            tasks = [(TaskRef(upstream, task["taskId"]), task) for task in listed_tasks(result)]
            owners = await self._owners_of([ref for ref, _ in tasks])
            found += [{**task, "taskId": self._seal(ref, owner)} for ref, task in tasks if owners.get(ref) == owner]
            cursor = result.get("nextCursor")
            if not isinstance(cursor, str) or not cursor:
                break
        return found

    async def _owners_of(self, refs: list[TaskRef]) -> dict[TaskRef, Owner]:
        """Who created each task: this process's memory, then the shared store (down: as unknown, shown to nobody)."""
        known = {ref: owner for ref in refs if (owner := self.owners.owner(ref)) is not None}
        missing = [ref for ref in refs if ref not in known]
        if missing and self._store is not None:
            try:
                known.update(await self._store.owners(missing))
            except STORE_ERRORS as exc:
                log.warning("task_owners_unreadable", error=type(exc).__name__)
        return known

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
                                                  on_progress=on_progress,
                                                  timeout=RESULT_WAIT_SECONDS if method == "tasks/result" else None)
        finally:
            await self._policy.settle(admission, ran=True)
        if reply is None:  # the upstream is no longer configured: its tasks are gone with it
            raise unknown_task(client_id)
        return with_task_id(reply, client_id)
