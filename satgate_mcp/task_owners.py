"""Who created each relayed task, kept where the gateway keeps its state (the state database, Redis).

2025-11-25's ``tasks/list`` names tasks by the upstream's ids alone; the gateway shows each caller the tasks it
created (task_relay.py). A process remembers the tasks it relayed itself; this record lets a restarted process,
or another machine on the same Redis, tell whose an upstream's task is too. It holds no secret (a token id and
a session id, as the sealed task id binds them) and expires with the task (its ``ttl``, bounded).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from satgate_mcp.jsonrpc import JsonObj
from satgate_mcp.task_ids import TaskRef

#: (token id, session id): who created a task, as its sealed id binds it.
Owner = tuple[str, str]
#: How long an owner is kept when the upstream gave its task no ``ttl``, and the most it is kept whatever it gave.
DEFAULT_TTL_SECONDS = 86_400.0
MAX_TTL_SECONDS = 7 * 86_400.0


class TaskOwnerStore(Protocol):
    """The owners of tasks, shared by the processes on one state folder or one Redis."""

    async def note(self, ref: TaskRef, owner: Owner, ttl: float) -> None:
        """``owner`` created ``ref``: kept ``ttl`` seconds."""

    async def owners(self, refs: Sequence[TaskRef]) -> dict[TaskRef, Owner]:
        """The known, unexpired owners of ``refs`` (a ref nobody noted is left out)."""
        ...


def owner_ttl(reply: JsonObj) -> float:
    """How long a created task's owner is kept: its ``ttl`` (2025-11-25 ``task.ttl``, 2026 ``ttlMs``, in ms),
    bounded; a day when it gave none."""
    result = reply.get("result")
    result = result if isinstance(result, dict) else {}
    task: JsonObj = result["task"] if isinstance(result.get("task"), dict) else result
    ttl = task.get("ttl", task.get("ttlMs"))
    if isinstance(ttl, bool) or not isinstance(ttl, int | float) or ttl <= 0:
        return DEFAULT_TTL_SECONDS
    return min(float(ttl) / 1000.0, MAX_TTL_SECONDS)
